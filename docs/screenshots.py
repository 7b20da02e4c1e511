"""Retake the controller guide's screenshots of the Prefect UI (docs/img/prefect-*.png).

    PYTHONPATH=. python docs/screenshots.py             # needs chromium; about a minute

Everything is local and temporary: a fresh home with Adult, a controller key, `prefect server start`
on a free port with the dp-release deployment of prefect.yaml, and the machine's headless Chromium
(Playwright) on the UI that server opens (its /ui-settings say which: Prefect 3.8.8's V2 UI). It fills in
the run form as a controller would (epsilon from the risk model, as the demo asks), submits it,
runs the release until it pauses, and photographs: the form with the epsilon choice, the paused run,
the Resume form with the waiting message, and the summary artifact. The release is then rejected
(refunded) and everything removed.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
IMG = ROOT / "docs" / "img"

#: the demo's choice of epsilon (cli/demo.py), as the form's Risk model fields
RISK_FIELDS = {"Trust": ("level", "low"), "Sensitivity": ("level", "high"), "Max Risk": ("number in [0, 1]", 0.2),
               "Max Noise": 10, "N": 16, "M": 2, "Confidence": 0.9}


def open_resume_dialog(page) -> None:
    """The paused run's Resume form: a Resume button, or the item of the run's menu (top right)."""
    from prefect_console import by_text

    if by_text(page, "Resume", "button").count():
        by_text(page, "Resume", "button").click()
        return
    page.locator("button[aria-haspopup=menu]").filter(visible=True).first.click()  # the run's menu
    page.locator("[role=menuitem]").first.wait_for(state="attached")
    print("menu:", page.locator("[role=menuitem]").all_inner_texts())
    by_text(page, "Resume", "[role=menuitem]").click()


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="dprelease-screenshots-"))
    os.environ["DPRELEASE_HOME"] = str(work / "home")
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from playwright.sync_api import sync_playwright
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings
    from prefect_console import (
        by_text,
        deploy_release_flow,
        drain_prefect_workers,
        open_page,
        start_prefect_server,
        stop_process_group,
        submit_and_run,
        ui_base,
        wait_for_text,
    )
    from system_chromium import LAUNCH_ARGS, new_context

    from dprelease import admin, decisions
    from dprelease.cli.deciding import decide
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.flows.release import summary_artifact_key
    from dprelease.settings import Settings

    settings = Settings.from_env()
    admin.init(settings)
    admin.register_dataset(settings, "adult", ROOT / "examples" / "data" / "adult.csv.gz", "person_id",
                           epsilon_cap=10, add_row_id=True)
    decisions.create_controller(settings, "alice", work / "alice.pem")
    proc, url = start_prefect_server(work)
    IMG.mkdir(parents=True, exist_ok=True)
    try:
        with temporary_settings(updates={PREFECT_API_URL: f"{url}/api", PREFECT_UI_URL: url}), \
                sync_playwright() as playwright:
            browser = playwright.chromium.launch(**LAUNCH_ARGS)
            context = new_context(browser, 1280, 900)
            deployment_id = deploy_release_flow()

            def photograph_form(page) -> None:
                page.evaluate("[...document.querySelectorAll('label')].find(l => l.innerText.trim() === 'epsilon')"
                              ".scrollIntoView({block: 'start'})")
                page.evaluate("window.scrollBy(0, -120)")
                time.sleep(0.5)
                page.screenshot(path=IMG / "prefect-release-form.png")

            run, thread, box = submit_and_run(context, url, deployment_id, "Age and working hours by education",
                                              "Risk model", RISK_FIELDS, before_submit=photograph_form)
            wait_until_paused(str(run.id), timeout=300)
            page = open_page(context, f"{ui_base(url)}/runs/flow-run/{run.id}")
            wait_for_text(page, "Paused")
            by_text(page, "Details", "button").click()
            time.sleep(4)  # the run's graph draws last
            page.screenshot(path=IMG / "prefect-paused-run.png")
            open_resume_dialog(page)
            wait_for_text(page, "An approval is waiting")
            time.sleep(1)
            page.screenshot(path=IMG / "prefect-resume-form.png")
            page.close()
            release_id = str(run.id)
            page = open_page(context, f"{ui_base(url)}/artifacts/key/{summary_artifact_key(release_id)}")
            wait_for_text(page, "controller summary")  # the key's timeline: open its latest version
            page.locator('a[href*="/artifacts/artifact/"]').first.click()  # the summary artifact
            wait_for_text(page, "Release ")
            time.sleep(2)
            page.screenshot(path=IMG / "prefect-summary-artifact.png")
            page.close()
            decide(settings, release_id, "reject", work / "alice.pem", "screenshots only")
            thread.join(120)
            drain_prefect_workers()
            print(f"release {release_id}: {box.get('result') or box.get('error')}")
            browser.close()
    finally:
        stop_process_group(proc)
    for name in ("prefect-release-form", "prefect-paused-run", "prefect-resume-form", "prefect-summary-artifact"):
        print(f"wrote {IMG / (name + '.png')}")


if __name__ == "__main__":
    main()
