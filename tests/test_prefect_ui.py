"""The release form in the Prefect UI, in a real browser against a real Prefect server: an on-demand
run submitted through the dp-release deployment's form, with every field set as a user could, waits
for a controller's decision (Paused, with the waiting message) -- also when a standing automatic
policy names the deployment, since only the runs of its schedule are approved automatically.

Playwright drives the machine's headless Chromium (tests/system_chromium.py); the run is executed as a worker
would (the engine, with the parameters the form sent).
"""

from __future__ import annotations

import os
import time

import pandas as pd
import pytest
from patience import PATIENCE_S
from prefect_console import (
    ROOT,
    by_text,
    deploy_release_flow,
    drain_prefect_workers,
    in_field,
    open_page,
    page_text,
    start_prefect_server,
    stop_process_group,
    submit_and_run,
    ui_base,
    wait_for_text,
)
from system_chromium import INSTALLED, NOT_INSTALLED, new_context

pytestmark = pytest.mark.skipif(not INSTALLED, reason=NOT_INSTALLED)


@pytest.fixture(scope="module")
def console(tmp_path_factory, browser):
    """A dprelease home with Adult and a registered controller, a real Prefect server with the
    dp-release deployment of prefect.yaml, and a profile of the headless Chromium (pytest-playwright's
    browser: tests/conftest.py)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from dprelease import admin, decisions
    from dprelease.settings import Settings

    work = tmp_path_factory.mktemp("ui")
    saved = os.environ.get("DPRELEASE_HOME")
    os.environ["DPRELEASE_HOME"] = str(work / "home")
    settings = Settings.from_env()
    admin.init(settings)
    sample = work / "adult-sample.csv"  # a few thousand rows keep the run short; the form is what is tested
    pd.read_csv(ROOT / "examples" / "data" / "adult.csv.gz", nrows=3000).to_csv(sample, index=False)
    admin.register_dataset(settings, "adult", sample, "person_id", epsilon_cap=10, add_row_id=True)
    decisions.create_controller(settings, "alice", work / "alice.pem")
    proc, url = start_prefect_server(work)
    try:
        with temporary_settings(updates={PREFECT_API_URL: f"{url}/api"}):
            deployment_id = deploy_release_flow()
            try:
                context = new_context(browser, 1280, 1100)
                try:
                    yield {"settings": settings, "url": url, "deployment_id": str(deployment_id), "context": context,
                           "key": work / "alice.pem"}
                finally:
                    context.close()
            finally:
                drain_prefect_workers()  # while the server is up
    finally:
        stop_process_group(proc)
        if saved is None:
            os.environ.pop("DPRELEASE_HOME", None)
        else:
            os.environ["DPRELEASE_HOME"] = saved


def assert_waiting(console, run, thread, box) -> None:
    """The run is Paused for a decision, with the waiting message, in the API and on its page;
    its budget is reserved and nothing is published."""
    from prefect import get_client

    from dprelease.cli.interactive import _pause_description
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.pipeline import Platform

    try:
        wait_until_paused(str(run.id), timeout=PATIENCE_S)
    except (RuntimeError, TimeoutError) as err:
        raise AssertionError(f"{err}: {box}") from None
    assert thread.is_alive()
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run.id).state
    assert state.is_paused() and state.name == "Paused"
    message = _pause_description(str(run.id))
    assert message.startswith("# An approval is waiting") and "/artifacts/key/release-" in message
    # its link leads to the UI the server opens (not to the other version at other paths)
    from dprelease.flows.release import UI_PREFIX

    assert ui_base(console["url"]) == console["url"] + UI_PREFIX and f"{UI_PREFIX}/artifacts/key/release-" in message
    store = Platform.open(console["settings"]).store
    assert store.get_release(str(run.id)).status == "awaiting_approval"
    assert store.ledger_entry(str(run.id)).status == "reserved"
    assert not (console["settings"].publication_dir / str(run.id)).exists()
    open_run_page(console, run).close()


def assert_form_offers_what_is_registered(page) -> None:
    """The form lists the registered datasets (public ones are never released alone), and its
    optional fields are plain fields: no str/None toggles, no `Property is type "None"`."""
    assert 'Property is type "None"' not in page_text(page)
    in_field(page, "dataset", "button[aria-haspopup=listbox]").click()
    shown = page.locator("[role=option]").filter(visible=True)
    shown.first.wait_for()
    options = [o.strip() for o in shown.all_inner_texts()]
    page.keyboard.press("Escape")
    assert options == ["adult"], options
    for label in ("sql", "requested_by", "query"):
        assert in_field(page, label, "button", "None").count() == 0, f"{label} still offers None"


def assert_profile_is_the_default(page) -> None:
    """The risk model's trust, sensitivity and tolerable risk start as `registered`, and the form
    says what that is for each registered dataset (adult: the defaults of `dataset register`)."""
    text = page_text(page)
    assert in_field(page, "Sensitivity", "button[aria-haspopup=listbox]").inner_text().strip() == "registered"
    for value in ("low", "medium", "0.2"):  # trust, sensitivity, max risk
        assert f"registered: the dataset's risk profile, adult: {value})" in text, text[:3000]


def open_run_page(console, run):
    page = open_page(console["context"], f"{ui_base(console['url'])}/runs/flow-run/{run.id}")
    wait_for_text(page, "Paused")
    return page


def show_artifact(page, key_prefix: str) -> None:
    """Open the run page's Artifacts tab and wait for the artifact key starting with `key_prefix`
    (a click before the page is ready may be lost: clicked again, every 15 s, until the tab shows
    it, for up to PATIENCE_S)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    shown = page.locator(f'a[href*="/artifacts/key/{key_prefix}"]').filter(visible=True).first
    deadline = time.monotonic() + PATIENCE_S
    while True:
        by_text(page, "Artifacts", "[role=tab]").click()
        try:
            shown.wait_for(timeout=15_000)
            return
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise AssertionError(f"the artifact {key_prefix}... is not shown; the page shows:\n"
                                     f"{page_text(page)[:2000]}") from None


def assert_resume_dialog_warns_once(console, run) -> None:
    """The Resume dialog says the risk is above the tolerable risk once, in words, never "low"."""
    import sys

    sys.path.insert(0, str(ROOT / "docs"))
    from screenshots import open_resume_dialog

    page = open_run_page(console, run)
    show_artifact(page, "risk-")  # the warning made before the reservation
    open_resume_dialog(page)
    wait_for_text(page, "An approval is waiting")
    dialog = page.locator("[role=dialog]").first.inner_text()
    page.close()
    assert dialog.count("above your tolerable risk") == 1, dialog
    assert "(above your tolerable 0.2)" in dialog and "low;" not in dialog
    assert "paste into Signed Decision" in dialog and "Signed Decision" in dialog.split("Reviewer")[-1]
    assert all(ord(ch) < 0x2190 or ch in "±–—→…" for ch in dialog), sorted({c for c in dialog if ord(c) >= 0x2190})


def assert_refusal_on_the_run_page(console, run) -> None:
    """A decision the form and the signature disagree on (form: approve; signed: reject) is
    refused, and the reason is on the run's page (its artifacts) by the time it is Paused again."""
    from dprelease import decisions
    from dprelease.flows.approvals import answer, wait_until_paused

    token = decisions.sign_for_release(console["settings"], str(run.id), "reject", console["key"], "mismatch")
    answer(str(run.id), "approve", "alice", signed_decision=token)
    wait_until_paused(str(run.id), timeout=PATIENCE_S)
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from dprelease.flows.release import refusal_artifact_key

    page = open_run_page(console, run)
    show_artifact(page, "refused-")  # listed on the run's page
    page.close()
    with get_client(sync_client=True) as client:
        (shown,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[refusal_artifact_key(str(run.id))])))
    page = open_page(console["context"], f"{ui_base(console['url'])}/artifacts/artifact/{shown.id}")
    wait_for_text(page, "Decision refused")
    wait_for_text(page, "the form says 'approve' but the signed decision says 'reject'")
    page.close()


def test_an_on_demand_run_from_the_form_waits_for_the_controller(console):
    started = time.monotonic()
    from prefect import get_client

    from dprelease.cli.deciding import decide
    from dprelease.pipeline import Platform

    settings = console["settings"]
    store = Platform.open(settings).store
    budget_before = store.budget("adult")
    first = submit_and_run(console["context"], console["url"], console["deployment_id"], "Education, from the form",
                           "Fixed value", {"Epsilon": 0.5}, before_submit=assert_form_offers_what_is_registered)
    assert first[0].parameters["epsilon"] == {"epsilon": 0.5}  # only the chosen method's fields
    assert first[0].parameters["dataset"] == "adult" and first[0].parameters["query"] == {}
    assert_waiting(console, *first)
    print(f"first run paused after {time.monotonic() - started:.1f} s")
    # epsilon 0.5 on the default profile: risk 0.26 above 0.2, said on the run's page before the reservation
    # and once in the Resume dialog; a refused decision is on the run's page at once
    assert_resume_dialog_warns_once(console, first[0])
    assert_refusal_on_the_run_page(console, first[0])
    # a standing automatic policy naming this very deployment: an on-demand run still waits
    store.add_policy("monthly", "adult", max_epsilon_per_release=5.0, approval="auto", deployment="dp-release")
    second = submit_and_run(console["context"], console["url"], console["deployment_id"], "Education, with a policy present", "Risk model", {
        "Trust": ("level", "low"), "Max Risk": ("number in [0, 1]", 0.2),
        "Max Noise": 10, "N": 16, "M": 2, "Confidence": 0.9}, before_submit=assert_profile_is_the_default)
    sent = second[0].parameters
    assert sent["epsilon"]["trust"] == "low" and sent["epsilon"]["n"] == 16 and "p" not in sent["epsilon"]
    assert sent["epsilon"]["sensitivity"] == "registered"  # left as the form starts: adult's profile, medium
    assert sent["requested_by"] == "mallory" and sent["title"] == "Education, with a policy present"
    assert_waiting(console, *second)
    print(f"second run paused after {time.monotonic() - started:.1f} s")
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(second[0].id).name == "Education, with a policy present"  # named after the title
    for run, thread, box in (first, second):
        decide(settings, str(run.id), "reject", console["key"], "a browser test")
        thread.join(PATIENCE_S)
        assert box.get("result", {}).get("status") == "rejected", box
    budget_after = store.budget("adult")
    assert budget_after["epsilon_committed"] == budget_before["epsilon_committed"]
    assert budget_after["epsilon_reserved"] == budget_before["epsilon_reserved"]
    assert not any(settings.publication_dir.glob(f"{first[0].id}*"))
