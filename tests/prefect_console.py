"""The Prefect console as a user meets it, for the browser test and the guide's screenshots
(docs/screenshots.py): a real `prefect server start` with its UI, the dp-release deployment of
prefect.yaml, the run form filled in as a user does, and the run it creates executed as a worker
would (the engine, with the parameters the form sent)."""

from __future__ import annotations

import contextvars
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml
from patience import PATIENCE_S

#: how long a Submit that sent no request to create the run waits before it is clicked again
SUBMIT_UNANSWERED_S = 30.0
SUBMIT_REQUEST = re.compile(r"create_flow_run|schemas/validate")

ROOT = Path(__file__).resolve().parents[1]
SQL = "SELECT WITH ANONYMIZATION education, ANON_COUNT(*, 1) AS people FROM adult GROUP BY education"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prefect_server(workdir: Path, database_url: str | None = None) -> tuple[subprocess.Popen, str]:
    """`prefect server start` (UI included) on a free port, on a copy of the migrated empty Prefect
    database the CLI keeps (cli/temporary_prefect_server.py), so that no migration runs here, or on
    `database_url` (an empty PostgreSQL database, migrated as the server starts, as a deployment's
    server is). Returns (process, UI url)."""
    import httpx

    from dprelease.cli import temporary_prefect_server as prefect_server

    if database_url is None:
        db = workdir / "prefect.db"
        shutil.copyfile(prefect_server.template_database(), db)
        database_url = f"sqlite+aiosqlite:///{db}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(workdir / "prefect-home"), PREFECT_API_DATABASE_CONNECTION_URL=database_url,
               PREFECT_UI_API_URL=f"{url}/api", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                             str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/api/health", timeout=PATIENCE_S).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    stop_process_group(proc)
    raise RuntimeError("the Prefect server did not start")


def ui_base(url: str) -> str:
    """The address of the UI this server opens (Prefect 3.8.8: the V2 UI, under /v2), from its
    own /ui-settings: the browser test and the screenshots see what a controller opening the
    server sees, whatever version that is."""
    import httpx

    settings = httpx.get(f"{url}/ui-settings", timeout=PATIENCE_S).json()
    base = settings.get(f"{settings['default_ui']}_base_url") or "/"
    return url + base.rstrip("/")


def drain_prefect_workers() -> None:
    """Send the logs and events this process still holds to the server while it is up (as
    prefect_test_harness does): a worker left holding them for a stopped server would make the
    next harness in this process wait for it forever."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            result = APILogWorker.instance().drain()
            if inspect.isawaitable(result):
                await result
        except RuntimeError:  # never started
            pass
        result = EventsWorker.drain_all()
        if inspect.isawaitable(result):
            await result

    run_coro_as_sync(drain())


def stop_process_group(proc: subprocess.Popen) -> None:
    """Stop the server this test started and every process of its group (by the group's id): the
    uvicorn that `prefect server start` runs outlived its parent once (2026-11-30: found idle an
    hour later, its parent gone, when only a living parent's group was stopped)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:  # the whole group has already ended
        proc.wait(PATIENCE_S)
        return
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is still there
    except ProcessLookupError:
        pass
    proc.wait(PATIENCE_S)


def deploy_release_flow() -> str:
    """Register the dp-release deployment of prefect.yaml as `prefect deploy` does (its parameter
    schema is the flow's), then offer the registered datasets in its form as `dprelease
    refresh-form` does; returns its id. Needs PREFECT_API_URL set to the server."""
    from prefect import get_client

    from dprelease.flows.release import release_flow

    spec = next(d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"] if d["name"] == "dp-release")
    from dprelease.flows import release_form
    from dprelease.settings import Settings

    with get_client(sync_client=True) as client:
        deployment_id = str(client.create_deployment(
            flow_id=client.create_flow_from_name(release_flow.name), name=spec["name"], entrypoint=spec["entrypoint"],
            parameters=spec["parameters"], parameter_openapi_schema=release_flow.parameters.model_dump(),
            enforce_parameter_schema=True))
    release_form.refresh(Settings.from_env())  # as `dprelease refresh-form` after `prefect deploy`
    return deployment_id


def exactly(text: str) -> re.Pattern:
    """An element's whole text is `text` (spaces around it aside)."""
    return re.compile(rf"^\s*{re.escape(text)}\s*$")


def by_text(page, text: str, tag: str):
    """The last visible `tag` element (a button, a tab, an option) whose text is `text`."""
    return page.locator(tag).filter(visible=True).filter(has_text=exactly(text)).last


def in_field(page, label: str, selector: str = "input, textarea", text: str | None = None):
    """The first visible `selector` element (or the first whose text is `text`: a toggle such as
    "str", a method of a choice) in the form field labelled `label`: a Prefect schema-form
    property, the closest `.group` around its label (optional ones read "label (Optional)")."""
    name = re.compile(rf"^\s*{re.escape(label)}(\s*\(Optional\))?\s*$")
    field = page.locator("label").filter(visible=True).filter(has_text=name).last.locator(
        "xpath=ancestor::*[contains(concat(' ', normalize-space(@class), ' '), ' group ')][1]")
    found = field.locator(selector).filter(visible=True)
    return (found if text is None else found.filter(has_text=exactly(text))).first


def wait_for_text(page, text: str) -> None:
    """Wait until the page shows `text`; if it never does, say what it shows instead."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("text => document.body && document.body.innerText.includes(text)", arg=text)
    except PlaywrightTimeout:
        raise AssertionError(f"the page never showed {text!r}; it shows:\n{page_text(page)[:2000]}") from None


def page_text(page) -> str:
    return page.evaluate("document.body ? document.body.innerText : ''") or ""


def form_state(page) -> str:
    """What a form that did not submit shows: its address, the values its fields hold (innerText has
    none of them), the lines that read like a validation message, and the submit button's state (seen
    once in CI: Submit clicked under load, no run created in 15 min, and the page's first 1,500
    characters, all it said then, held none of these)."""
    values = page.evaluate("[...document.querySelectorAll('input, textarea')].map(e => (e.name || e.id || e.type) + '=' + e.value)")
    text = page_text(page)
    messages = [line for line in text.splitlines()
                if re.search(r"(?i)\b(must|required|invalid|error|not valid|expected)\b", line)]
    submit = page.evaluate("[...document.querySelectorAll('button')].filter(b => b.innerText.trim() === 'Submit')"
                           ".map(b => 'disabled' + '=' + b.disabled)")
    return (f"the page is {page.url}; its fields hold {values}; its messages: {messages}; Submit: {submit}; "
            f"its text ends:\n{text[-1500:]}")


def type_into(field, text: str) -> None:
    """Click a field, as a user does, and replace what it holds by `text`."""
    field.click()
    field.fill(text)


def fill_release_form(page, title: str, method: str, fields: dict) -> None:
    """Every field of the run form, as a user sets it: text typed, toggles and lists clicked."""
    wait_for_text(page, "approval_timeout")
    choose(page, "dataset", "adult")  # a list of the registered datasets (dprelease.flows.release_form)
    type_into(in_field(page, "sql"), SQL)
    type_into(in_field(page, "title"), title)
    in_field(page, "epsilon", "button", method).click()
    for label, value in fields.items():
        if isinstance(value, tuple):  # (toggle, value): a level from the list, or a number
            in_field(page, label, "button", value[0]).click()
            if value[0] == "level":
                choose(page, label, value[1])
            else:
                type_into(in_field(page, label), str(value[1]))
        else:
            type_into(in_field(page, label), str(value))
    type_into(in_field(page, "delta"), "0.000001")
    type_into(in_field(page, "max_partitions_contributed"), "1")
    type_into(in_field(page, "requested_by"), "mallory")
    type_into(in_field(page, "approval_timeout"), "300")


def choose(page, label: str, option: str) -> None:
    """Pick `option` from the list of the form field labelled `label` (an enum: a select)."""
    in_field(page, label, "button[aria-haspopup=listbox]").click()
    by_text(page, option, "[role=option]").click()
    page.wait_for_function("![...document.querySelectorAll('[role=option]')].some(e => e.offsetParent)")


def open_page(context, url: str):
    """A new tab of the browser profile `context` on `url`."""
    page = context.new_page()
    page.goto(url)
    return page


def submit_and_run(context, url: str, deployment_id: str, title: str, method: str, fields: dict, before_submit=None):
    """Submit the form in a tab of the browser profile `context`, then execute the run it created as a worker would (the
    engine, with the parameters the form sent). Returns (flow run, thread, box)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId
    from prefect.flow_engine import run_flow

    from dprelease.flows.release import outcome, release_flow

    page = open_page(context, f"{ui_base(url)}/deployments/deployment/{deployment_id}/run")
    fill_release_form(page, title, method, fields)
    if before_submit is not None:
        before_submit(page)
    api_calls: list[str] = []  # what the page asked the server, with the answers (form_state's companion)
    submitted: list[str] = []  # the requests a Submit sends: the parameters' validation, the run's creation
    page.on("request", lambda r: submitted.append(r.url) if SUBMIT_REQUEST.search(r.url) else None)
    page.on("response", lambda r: api_calls.append(f"{r.request.method} {r.url.split('/api/')[-1]} {r.status}")
            if "/api/" in r.url else None)
    with get_client(sync_client=True) as client:
        flt = FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id]))
        before = {r.id for r in client.read_flow_runs(flow_run_filter=flt)}
        by_text(page, "Submit", "button").click()
        clicked, deadline = time.monotonic(), time.monotonic() + PATIENCE_S
        while not (created := [r for r in client.read_flow_runs(flow_run_filter=flt) if r.id not in before]):
            assert time.monotonic() < deadline, f"the form created no run; {form_state(page)}; its calls: {api_calls}"
            if time.monotonic() - clicked > SUBMIT_UNANSWERED_S and not submitted:
                # seen in CI and once here (2026-11-30, load 2): a Submit that sent nothing, the form
                # filled and valid, the button enabled; a person clicks again, and so does the test
                # (no request went out, so no second run can come of it)
                by_text(page, "Submit", "button").click()
                clicked = time.monotonic()
            time.sleep(0.3)
    run = created[0]
    box: dict = {}

    def work():
        try:
            box["result"] = outcome(run_flow(release_flow, flow_run=run, parameters=run.parameters,
                                             return_type="state"))
        except BaseException as err:  # noqa: BLE001 - the test reads it
            box["error"] = err

    thread = threading.Thread(target=contextvars.copy_context().run, args=(work,), daemon=True)
    thread.start()
    page.close()
    return run, thread, box
