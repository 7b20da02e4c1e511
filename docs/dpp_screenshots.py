"""Retake the controller guide's screenshots of the DPP tool (docs/img/dpp-*.png), with the seed's
running example: counts of disease states (S, I, R, D) per village.

    PYTHONPATH=. python docs/dpp_screenshots.py     # needs chromium; about a minute

Everything is local and temporary: a fresh home with a made-up `residents` dataset (one row per
resident: village, disease state; example data, not a release), the console on a free port, the
machine's headless Chromium (Playwright) with a virtual passkey authenticator. An analyst submits the
request, a controller opens it in the tool, moves the sliders and uses the epsilon; the analyst's
form previews the accuracy. No Prefect server is needed: nothing is released here.
"""

from __future__ import annotations

import csv
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
IMG = ROOT / "docs" / "img"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SQL = ("SELECT WITH ANONYMIZATION village, state, ANON_COUNT(*, 1) AS residents FROM residents "
       "GROUP BY village, state")
#: the disease states of the seed's example and how common each is in the made-up villages
STATES = {"S": 0.70, "I": 0.08, "R": 0.20, "D": 0.02}


def villages_csv(path: Path, villages: int = 30, seed: int = 37) -> Path:
    """Made-up residents of `villages` villages of 100 to 2,000 people (example data only)."""
    pick = random.Random(seed)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["resident_id", "village", "state"])
        rid = 0
        for v in range(villages):
            for _ in range(pick.randint(100, 2000)):
                rid += 1
                out.writerow([rid, f"village-{v + 1:02d}", pick.choices(list(STATES), list(STATES.values()))[0]])
    return path


#: the machine's Chromium, headless, with no network of its own (no updates, no sync)
FLAGS = ("--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--disable-dev-shm-usage")


def controller_browser(playwright, device):
    """(browser, a page whose device holds a virtual passkey, for the controller)."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=list(FLAGS))
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.set_default_timeout(300_000)
    device(page.context, page)
    return browser, page


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="dprelease-dpp-shots-"))
    os.environ.update(DPRELEASE_HOME=str(home))
    from console_harness import Browser, console_server, enrolment_link
    from playwright.sync_api import sync_playwright
    from test_console_browser import device

    from dprelease import admin
    from dprelease.requests import inbox
    from dprelease.settings import Settings
    from dprelease.store import Store

    settings = Settings.from_env()
    admin.init(settings)
    admin.register_dataset(settings, "residents", villages_csv(home / "residents.csv"), "resident_id",
                           epsilon_cap=5, risk_profile={"sensitivity": "high", "trust": "low", "n": 4, "max_risk": 0.3})
    request = inbox.parse_text(f"dataset: residents\ntitle: Disease states per village\nepsilon: 1.0\nsql: {SQL}\n")
    request_id = inbox.submit_in_console(settings, Store(settings.store_url), request, "who-analyst").id
    with console_server(settings) as origin, sync_playwright() as playwright:
        browser, page = controller_browser(playwright, device)

        def shot(name: str, element: str | None = None) -> None:
            target = page.locator(element) if element else page
            target.screenshot(path=str(IMG / f"{name}.png"), **({} if element else {"full_page": True}))
            print("wrote", IMG / f"{name}.png")

        def settled() -> None:
            page.locator('#dpp[data-busy="false"]:not([data-updates="0"])').wait_for()

        page.goto(enrolment_link(settings, "carol", "controller").replace(settings.console_url, origin))
        page.get_by_role("button", name="Register my passkey").click()
        page.wait_for_url("**/inbox")
        page.get_by_role("link", name="choose epsilon", exact=True).click()
        settled()
        page.locator("#noise").focus()
        for _ in range(40):
            page.keyboard.press("ArrowRight")
        settled()
        page.wait_for_timeout(500)  # plotly's transitions end (a picture, not a test)
        shot("dpp-page")
        shot("dpp-choice", ".dpp-grid")
        shot("dpp-noise-risk", "#graph2d")
        shot("dpp-surface", "#graph3d")
        shot("dpp-accuracy", "#intervals")
        page.fill("#max_risk", "0.15")
        settled()
        shot("dpp-refused", ".dpp-grid")
        page.fill("#max_risk", "0.3")
        settled()
        page.get_by_role("button", name="Use this epsilon").click()
        page.locator("#used").wait_for()
        shot("dpp-used", ".chosen")
        # the analyst's form, in a browser of their own
        who = Browser(origin)
        who.enrol(enrolment_link(settings, "who-analyst", "analyst"))
        analyst = browser.new_context(viewport={"width": 1200, "height": 800})
        analyst.add_cookies([{"name": k, "value": v, "url": origin} for k, v in who.cookies.items()])
        page = analyst.new_page()
        page.goto(f"{origin}/requests")
        page.get_by_label("A release request").fill(f"dataset: residents\ntitle: States per village\n"
                                                    f"epsilon: 0.5\nsql: {SQL}\n")
        page.get_by_role("button", name="Preview the accuracy").click()
        page.locator("#preview-intervals").wait_for()
        shot("dpp-analyst-preview")
        browser.close()
        print("request", request_id, "now chooses its epsilon with the risk model")
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
