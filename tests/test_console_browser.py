"""The console in a real browser: Playwright driving the machine's Chromium with its virtual WebAuthn
authenticator (a passkey on the "device"). After the setup (the administrator's enrolment links, a
release started as the Prefect UI would), no terminal: enrol, sign in, see the paused run, approve
or reject with one passkey touch, find the report published and its decision verified; the analyst
submits a request and reads the published report."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from console_harness import console_server
from system_chromium import INSTALLED, NOT_INSTALLED, PATIENCE_MS
from test_console import paused_release, platform_env  # noqa: F401 - the module's home and Prefect API

pytestmark = pytest.mark.skipif(not INSTALLED, reason=NOT_INSTALLED)


@pytest.fixture(scope="module")
def console(platform_env):  # noqa: F811
    with console_server(platform_env) as origin:
        yield origin


def command(*args: str, origin: str) -> str:
    """`dprelease ...` in a subprocess (the administrator's setup), its output."""
    done = subprocess.run([sys.executable, "-m", "dprelease.cli.app", *args], capture_output=True, text=True,
                          env={**os.environ, "DPRELEASE_CONSOLE_URL": origin}, check=True)
    return done.stdout


def enrolment_link(name: str, role: str, origin: str) -> str:
    out = command(role, "add", name, "--passkey", origin=origin)
    return re.search(r"(http://\S+/enrol/\S+)", out).group(1)


def device(context, page):
    """A passkey authenticator on this browser: internal, resident keys, user verification (a touch)."""
    cdp = context.new_cdp_session(page)
    cdp.send("WebAuthn.enable", {"enableUI": False})
    cdp.send("WebAuthn.addVirtualAuthenticator", {"options": {
        "protocol": "ctap2", "transport": "internal", "hasResidentKey": True, "hasUserVerification": True,
        "isUserVerified": True, "automaticPresenceSimulation": True}})
    return cdp


def enrolled(browser, link: str):
    """A new browser profile whose person opened their link and registered a passkey: (context, page)."""
    context = browser.new_context()
    context.set_default_timeout(PATIENCE_MS)
    page = context.new_page()
    device(context, page)
    page.goto(link)
    page.get_by_role("button", name="Register my passkey").click()
    page.wait_for_url(re.compile(r"/(inbox|requests)$"))
    return context, page


def test_a_controller_enrols_signs_in_and_approves_in_the_browser(platform_env, console, browser):  # noqa: F811
    from dprelease import decisions

    context, page = enrolled(browser, enrolment_link("alice", "controller", console))
    # signing out and in again with the same passkey
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"/signin"))
    page.get_by_role("button", name="Sign in with your passkey").click()
    page.wait_for_url(re.compile(r"/inbox$"))
    rel, thread, box = paused_release(platform_env, title="Education by the console")
    # from the paused run to a published release: one page, two clicks, one passkey touch
    page.goto(f"{console}/inbox")
    page.get_by_role("link", name="Education by the console").click()  # click 1
    page.get_by_label("Reason").fill("numbers look right")
    page.get_by_role("button", name="Approve and publish").click()  # click 2, then the passkey
    page.locator("#state", has_text="Published").wait_for()
    assert "verifies with alice's registered passkey" in page.locator("ul.audit").inner_text()
    page.get_by_role("link", name="The published report (signed)").click()
    page.wait_for_url(re.compile(rf"/published/{rel.id}/index.html$"))
    thread.join(180)
    assert box["result"]["status"] == "published"
    entry = decisions.recorded(platform_env, rel.id)[-1]
    assert entry["signed_decision"].startswith("dpw1.") and entry["reason"] == "numbers look right"
    out = command("verify", str(platform_env.publication_dir / rel.id), "--key", str(platform_env.public_key_file),
                  origin=console)
    assert "decision: OK approve by alice" in out and "registered passkey" in out and "OK " in out
    context.close()


def test_a_controller_rejects_in_the_browser_and_the_budget_comes_back(platform_env, console, browser):  # noqa: F811
    from dprelease.store import Store

    context, page = enrolled(browser, enrolment_link("bea", "controller", console))
    rel, thread, box = paused_release(platform_env, title="Too fine to publish")
    page.goto(f"{console}/inbox")
    page.get_by_role("link", name="Too fine to publish").click()
    page.get_by_label("Reason").fill("groups too small")
    page.get_by_role("button", name="Reject").click()
    page.locator("#state", has_text="Rejected").wait_for()
    thread.join(180)
    assert box["result"]["status"] == "rejected"
    assert Store(platform_env.store_url).ledger_entry(rel.id).status == "refunded"
    page.goto(f"{console}/budget/adult")
    row = page.locator("tr", has_text="Too fine to publish")
    assert "Rejected" in row.inner_text() and "refunded" in row.inner_text()
    assert not (platform_env.publication_dir / rel.id).exists()
    context.close()


def test_an_analyst_submits_follows_and_reads_in_the_browser(platform_env, console, browser):  # noqa: F811
    from console_harness import Browser
    from console_harness import enrolment_link as link_for
    from test_release_flow import SQL

    context, page = enrolled(browser, enrolment_link("ana", "analyst", console))
    page.get_by_label("A release request").fill(
        f"dataset: adult\ntitle: Hours by education\nepsilon: 1.0\nsql: {SQL}\n")
    page.get_by_role("button", name="Submit").click()
    page.get_by_text("submitted to the controllers' inbox").wait_for()
    first_id = re.search(r"Request (\w+) submitted", page.get_by_role("status").inner_text()).group(1)
    assert "Submitted (waiting for a controller)" in page.locator("tr", has_text="Hours by education").inner_text()
    # a request that fails the command line's validation fails here with its one line
    page.get_by_label("A release request").fill("dataset: adult\nepsilon: -1\nsql: SELECT 1\n")
    page.get_by_role("button", name="Submit").click()
    assert "epsilon" in page.get_by_role("alert").inner_text()
    # nothing of the controller's: the pages refuse, and no decision button anywhere
    for path in ("/inbox", "/budget"):
        page.goto(f"{console}{path}")
        assert "for controllers" in page.get_by_role("alert").inner_text()
    # a controller runs ana's request (as from the Prefect UI): her request now says where its run stands
    rel, thread, box = paused_release(platform_env, title="Hours by education", requested_by="ana")
    page.goto(f"{console}/requests")
    row = page.locator("tr", has_text="Hours by education")
    assert row.count() == 1 and "Waiting for a decision" in row.inner_text()
    # a controller publishes it (over HTTP: the controller's browser is tested above)
    carl = Browser(console)
    assert carl.enrol(link_for(platform_env, "carl", "controller")).status_code == 200
    assert carl.decide(rel.id, "approve", "fine").status_code == 200
    thread.join(180)
    page.goto(f"{console}/requests")
    row = page.locator("tr", has_text="Hours by education")
    assert "Published" in row.inner_text()
    row.get_by_role("link", name="read").click()
    page.wait_for_url(re.compile(rf"/published/{rel.id}/index.html$"))
    page.goto(f"{console}/published")
    published_at = page.locator("tr", has_text="Hours by education").locator("td").first.inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", published_at), published_at  # as the inbox writes a time
    with page.expect_download() as download:
        page.locator("tr", has_text="Hours by education").get_by_role("link", name=re.compile(r"\.csv$")).first.click()
    assert download.value.suggested_filename.endswith(".csv")
    assert page.get_by_role("button", name=re.compile("Approve|Reject")).count() == 0
    # the request it ran from was run once: its epsilon cannot be rewritten (which listed it again, for a second run)
    used = carl.post(f"/dpp/{first_id}/use", {"trust": 0.3, "sensitivity": 0.5, "max_risk": 1, "max_noise": 50})
    assert used.status_code == 409 and used.json()["error"].startswith(f"nothing was written: request {first_id} was run")
    assert "Hours by education" not in carl.get("/inbox").text
    page_of_it = carl.get(f"/inbox/requests/{first_id}").text  # its page says so, and links the release
    assert '<p class="state" id="state">Published</p>' in page_of_it and f'href="/releases/{rel.id}"' in page_of_it
    assert "Run it to see its numbers" not in page_of_it
    # to ask again, she submits the same request again: a new request, listed as waiting on both sides
    page.goto(f"{console}/requests")
    page.get_by_label("A release request").fill(
        f"dataset: adult\ntitle: Hours by education\nepsilon: 1.0\nsql: {SQL}\n")
    page.get_by_role("button", name="Submit").click()
    again = re.search(r"Request (\w+) submitted", page.get_by_role("status").inner_text()).group(1)
    states = page.locator("tr", has_text="Hours by education").all_inner_texts()
    assert len(states) == 2 and "Submitted (waiting for a controller)" in states[0] and "Published" in states[1]
    assert f"/inbox/requests/{again}" in carl.get("/inbox").text
    context.close()
