"""Retake the controller guide's screenshots of the console (docs/img/console-*.png).

    PYTHONPATH=. python docs/console_screenshots.py     # needs chromium; a few minutes

Everything is local and temporary: a fresh home with Adult, a Prefect test server, the console on
a free port, and the machine's headless Chromium (Playwright) with a virtual passkey authenticator.
It enrols a controller and an analyst from their links, runs releases until they pause (one above
the tolerable risk), and photographs every page: sign-in, enrolment, the inbox, the decision page,
a published release with its verified decision, budgets, a dataset's history, the analyst's
requests, the published reports, and a refusal.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
IMG = ROOT / "docs" / "img"
SHOTS = ("console-signin", "console-enrol", "console-inbox", "console-decision", "console-published",
         "console-budgets", "console-history", "console-requests", "console-reports", "console-refused")


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="dprelease-console-shots-"))
    os.environ.update(DPRELEASE_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
                      PREFECT_LOGGING_LEVEL="WARNING")
    from console_harness import Browser, console_server, enrolment_link
    from playwright.sync_api import sync_playwright
    from prefect.testing.utilities import prefect_test_harness
    from system_chromium import LAUNCH_ARGS, new_context
    from test_console_browser import device
    from test_release_flow import SQL, start_release, wait_for_approval

    from dprelease import admin
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.pipeline import Platform
    from dprelease.settings import Settings

    settings = Settings.from_env()
    admin.init(settings)
    data = ROOT / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(settings, "adult", data, "person_id", epsilon_cap=10, add_row_id=True,
                           risk_profile={"max_risk": 0.5})
    admin.register_dataset(settings, "census", data, "person_id", epsilon_cap=5, add_row_id=True)
    store = Platform.open(settings).store

    def paused(**params):
        known = {r.id for r in store.list_releases()}
        thread, box = start_release(approval_timeout=900, **params)
        rel = wait_for_approval(store, known, thread=thread, box=box)
        wait_until_paused(rel.flow_run_id)
        return rel, thread

    with prefect_test_harness(server_startup_timeout=300), console_server(settings) as origin, \
            sync_playwright() as playwright:
        browser = playwright.chromium.launch(**LAUNCH_ARGS)
        context = new_context(browser, 1200, 800)
        page = context.new_page()
        device(context, page)

        def shot(name: str) -> None:
            page.screenshot(path=str(IMG / f"{name}.png"), full_page=True)
            print("wrote", IMG / f"{name}.png")

        page.goto(f"{origin}/signin")
        shot("console-signin")
        page.goto(enrolment_link(settings, "alice", "controller").replace(settings.console_url, origin))
        shot("console-enrol")
        page.get_by_role("button", name="Register my passkey").click()
        page.wait_for_url("**/inbox")
        # an analyst asks; two runs pause; one release was published earlier (by another controller)
        ana = Browser(origin)
        ana.enrol(enrolment_link(settings, "ana", "analyst"))
        ana.get("/requests")
        ana.post("/requests", form={"request": "dataset: adult\ntitle: Ages by sex\nepsilon: 0.5\nsql: SELECT WITH "
                                               "ANONYMIZATION sex, ANON_AVG(age, 17, 90) AS age FROM adult "
                                               "GROUP BY sex\n"})
        first, first_thread = paused(title="People by education", requested_by="ana")
        bob = Browser(origin)
        bob.enrol(enrolment_link(settings, "bob", "controller"))
        bob.decide(first.id, "approve", "checked the partition loss")
        first_thread.join(300)
        rejected, rejected_thread = paused(title="Hours by education (first try)")
        bob.decide(rejected.id, "reject", "too many groups dropped")
        rejected_thread.join(300)
        rel, thread = paused(title="Education, with average age", requested_by="ana")
        risky, risky_thread = paused(dataset="census", title="Census education",
                                     sql=SQL.replace("FROM adult", "FROM census"))
        page.goto(f"{origin}/inbox")
        shot("console-inbox")
        page.get_by_role("link", name="Census education").click()
        page.get_by_label("Reason").fill("aggregate table for the ministry")
        shot("console-decision")
        page.goto(f"{origin}/inbox")
        page.get_by_role("link", name="Education, with average age").click()
        page.get_by_label("Reason").fill("numbers look right")
        page.get_by_role("button", name="Approve and publish").click()
        page.locator("#state", has_text="Published").wait_for()
        shot("console-published")
        thread.join(300)
        page.goto(f"{origin}/budget")
        shot("console-budgets")
        page.goto(f"{origin}/budget/adult")
        shot("console-history")
        page.goto(f"{origin}/releases/{rel.id}")
        page.get_by_role("button", name="Approve and publish").count()
        # the analyst's pages, in a browser of their own
        analyst = new_context(browser, 1200, 800)
        analyst_page = analyst.new_page()
        analyst.add_cookies([{"name": k, "value": v, "url": origin} for k, v in ana.cookies.items()])
        page = analyst_page
        page.goto(f"{origin}/requests")
        shot("console-requests")
        page.goto(f"{origin}/published")
        shot("console-reports")
        page.goto(f"{origin}/inbox")
        shot("console-refused")
        bob.decide(risky.id, "reject", "done")
        risky_thread.join(300)
        browser.close()
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
