"""The flows' run hooks are called the ways Prefect calls them: its engine passes (flow, flow_run, state)
by position, its runner by keyword (runner/_hook_runner.py: flow=, flow_run=, state=) when it runs a
worker run's cancellation hooks itself, after the run's process is gone. A release cancelled in the UI
while it waits on a worker is refunded and failed at once by that hook, not left reserved for the next
sweep. A release whose run's process dies without any hook (kill -9 of the process a worker starts, a
worker stopped with SIGTERM) is settled at once by the run's watchdog (dprelease.flows.watchdog), not by
`dprelease recover`. One real `prefect server start` for the module, a process pool, real `prefect
worker start` and `python -m prefect.engine` processes, real signals."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from patience import PATIENCE_S
from pg_schema import fresh_schema
from prefect_worker import start_worker, stop_worker
from run_watchdog import wait_gone, watchdog_of

POOL = "release-runs"
SQL = "SELECT WITH ANONYMIZATION town, ANON_COUNT(*, 1) AS people FROM people GROUP BY town"


def test_every_run_hook_takes_its_arguments_by_position_and_by_prefects_names():
    from dprelease.flows.publication import publication_flow
    from dprelease.flows.release import release_flow
    from dprelease.flows.utility import utility_flow

    for flow in (release_flow, publication_flow, utility_flow):
        hooks = flow.on_completion_hooks + flow.on_failure_hooks + flow.on_cancellation_hooks + flow.on_crashed_hooks
        assert hooks, flow.name
        for hook in hooks:
            inspect.signature(hook).bind(flow=flow, flow_run=None, state=None)
            inspect.signature(hook).bind(flow, None, None)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """A home with a dataset, a Prefect server, the pool and the dp-release deployment; yields
    (settings, the deployment's id, the API url, the module's directory)."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_console import drain_prefect_workers, start_prefect_server, stop_process_group

    from dprelease import admin
    from dprelease.flows.release import release_flow
    from dprelease.settings import Settings

    root = tmp_path_factory.mktemp("run-hooks")
    (root / "server").mkdir()
    server, url = start_prefect_server(root / "server")
    try:
        with pytest.MonkeyPatch.context() as env, temporary_settings(updates={PREFECT_API_URL: f"{url}/api"}):
            env.setenv("DPRELEASE_HOME", str(root / "home"))  # this process's and the runs' home
            settings = Settings.from_env()
            admin.init(settings)
            source = root / "people.csv"
            pd.DataFrame({"uid": range(300), "town": [f"town-{i % 3}" for i in range(300)]}).to_csv(source, index=False)
            admin.register_dataset(settings, "people", source, "uid", epsilon_cap=10, delta_cap=1e-4)
            with get_client(sync_client=True) as client:
                client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
                deployment_id = client.create_deployment(
                    flow_id=client.create_flow_from_name(release_flow.name), name="dp-release",
                    entrypoint="dprelease.flows.release.release_flow", work_pool_name=POOL,
                    parameter_openapi_schema=release_flow.parameters.model_dump())
            yield settings, deployment_id, f"{url}/api", root
            drain_prefect_workers()  # while the server is up
    finally:
        stop_process_group(server)


def _submit(deployment):
    """A flow run of the deployment: a release of epsilon 1 that waits for a controller."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(
            deployment[1], parameters={"dataset": "people", "sql": SQL, "epsilon": {"epsilon": 1.0},
                                       "approval_timeout": int(PATIENCE_S)})


def _environment(api: str, prefect_home) -> dict:
    """The environment a worker and its runs have: this test's, with the module's Prefect API."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_API_URL=api, PREFECT_HOME=str(prefect_home), PREFECT_LOGGING_LEVEL="WARNING",
               PREFECT_WORKER_QUERY_SECONDS="1")
    return env


def _until_awaiting(store, release_id: str, process: subprocess.Popen, log) -> None:
    """Wait for the release to await its controller; fail at once if `process` ended first."""
    deadline = time.monotonic() + PATIENCE_S  # a bound only a hung run reaches
    while (release := next((r for r in store.list_releases() if r.id == release_id), None)) is None \
            or release.status != "awaiting_approval":
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.5)


def test_a_release_cancelled_in_the_ui_while_it_waits_on_a_worker_is_refunded_at_once(deployment, tmp_path):
    from prefect import get_client
    from prefect.states import Cancelling
    from prefect_console import drain_prefect_workers

    from dprelease.flows.release import STOPPED_REASON
    from dprelease.store import Store

    settings, _, api, _ = deployment
    run = _submit(deployment)
    log = tmp_path / "worker.log"
    worker = start_worker(POOL, ["--limit", "1"], tmp_path, _environment(api, tmp_path / "worker-home"), log)
    try:
        store = Store(settings.store_url)
        release_id = str(run.id)

        def status() -> str | None:
            return next((r.status for r in store.list_releases() if r.id == release_id), None)

        deadline = time.monotonic() + PATIENCE_S  # a bound only a hung run reaches
        _until_awaiting(store, release_id, worker, log)
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Cancelling(message="cancelled in the UI"), force=True)
            while not (state := client.read_flow_run(run.id).state).is_final():
                assert time.monotonic() < deadline, f"the run was never cancelled:\n{log.read_text()}"
                time.sleep(0.5)
        assert state.is_cancelled(), state
        while status() == "awaiting_approval":  # the runner's hook, after the run's process ended
            assert time.monotonic() < deadline, f"the release was never settled:\n{log.read_text()}"
            time.sleep(0.5)
        release = store.get_release(release_id)
        # the run's process heard the cancel's SIGTERM and refunded it; the runner's hook found it final
        assert (release.status, release.decision_comment) == ("failed", STOPPED_REASON)
        assert store.ledger_entry(release_id).status == "refunded"
        assert store.get_lease(release_id) is None, log.read_text()
        assert stop_worker(worker) is None, log.read_text()
        assert "error was encountered while running hook" not in log.read_text(), log.read_text()
        drain_prefect_workers()
    finally:
        _end(worker)


def _end(process: subprocess.Popen) -> None:
    """Kill a process this test started, if it still runs (a session of its own: its pid is its group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(PATIENCE_S)


def _assert_settled_by_its_watchdog(deployment, release_id: str, budget_before: dict) -> None:
    """The release of a run whose process died, once its watchdog ended: refunded and failed, the
    budget exactly as before the release, no lease, the Prefect run Crashed saying what happened; and
    `dprelease recover` then finds nothing to do."""
    from prefect import get_client

    from dprelease.flows.watchdog import DIED, DIED_REASON
    from dprelease.store import Store

    settings, _, api, _ = deployment
    store = Store(settings.store_url)
    release = store.get_release(release_id)
    assert (release.status, release.decision_comment) == ("failed", DIED_REASON)
    assert store.ledger_entry(release_id).status == "refunded"
    assert store.budget("people") == budget_before
    assert store.get_lease(release_id) is None
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(release_id).state
    assert state.is_crashed(), state
    assert state.message.startswith(DIED) and f"release {release_id} failed, epsilon 1 refunded" in state.message, \
        state.message
    done = subprocess.run([sys.executable, "-m", "dprelease.cli.app", "recover"], capture_output=True, text=True,
                          env={**os.environ, "PREFECT_API_URL": api}, timeout=PATIENCE_S)
    assert done.returncode == 0 and "0 release(s) recovered; 0 running" in done.stdout, done.stdout + done.stderr
    assert store.get_release(release_id).status == "failed" and store.budget("people") == budget_before


def _submitted(deployment):
    """The module's store, the dataset's budget before a new release, and that release's id (its
    flow run's, submitted)."""
    from dprelease.store import Store

    store = Store(deployment[0].store_url)
    return store, store.budget("people"), str(_submit(deployment).id)


def test_a_release_whose_run_process_is_killed_is_settled_at_once_by_its_watchdog(deployment, tmp_path):
    """kill -9 of the run's process group, the run started as a process worker starts it
    (`python -m prefect.engine`, a session of its own): no hook of the run runs, its watchdog does."""
    store, before, release_id = _submitted(deployment)
    api = deployment[2]
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        engine = subprocess.Popen([sys.executable, "-m", "prefect.engine"], cwd=tmp_path, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**_environment(api, tmp_path / "prefect-home"),
                                       "PREFECT__FLOW_RUN_ID": release_id})
    try:
        _until_awaiting(store, release_id, engine, log)
        assert store.ledger_entry(release_id).status == "reserved"
        watchdog = watchdog_of(engine.pid, release_id)
        os.killpg(engine.pid, signal.SIGKILL)
        engine.wait(PATIENCE_S)
        wait_gone(watchdog, "the watchdog of the killed run")
        _assert_settled_by_its_watchdog(deployment, release_id, before)
    finally:
        _end(engine)


def test_a_release_whose_worker_is_stopped_is_settled_at_once_by_its_watchdog(deployment, tmp_path):
    """A real `prefect worker start` stopped with SIGTERM (`systemctl stop`) while its release waits
    for a controller: the worker SIGKILLs the run's process before its SIGTERM (Prefect 3.8.8)."""
    store, before, release_id = _submitted(deployment)
    api = deployment[2]
    log = tmp_path / "worker.log"
    worker = start_worker(POOL, ["--limit", "1"], tmp_path, _environment(api, tmp_path / "worker-home"), log)
    try:
        _until_awaiting(store, release_id, worker, log)
        run_pid = store.get_lease(release_id).pid
        watchdog = watchdog_of(run_pid, release_id)
        assert stop_worker(worker) is None, log.read_text()
        wait_gone(run_pid, "the stopped worker's run")
        wait_gone(watchdog, "the watchdog of the stopped worker's run")
        _assert_settled_by_its_watchdog(deployment, release_id, before)
    finally:
        _end(worker)


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"])
def test_a_watchdog_leaves_a_suspended_run_and_a_release_another_process_took_over(deployment, store_kind,
                                                                                   monkeypatch):
    """Its run's end of the pipe closed without DONE, a watchdog settles nothing while Prefect shows the
    run suspended (its process exits by design: another resumes it), and never a release of the run
    whose lease another live process holds (a retry that took it over); once the run is no longer
    suspended, it settles the rest, and the sweep then finds nothing more to do. On the home's SQLite
    store and on PostgreSQL (the watchdog reads the store the run's environment names)."""
    from prefect import get_client
    from prefect.states import Running, Suspended

    from dprelease import pipeline, recovery
    from dprelease.flows import watchdog
    from dprelease.flows.watchdog import DIED_REASON
    from dprelease.settings import Settings

    if store_kind == "postgresql":
        monkeypatch.setenv("DPRELEASE_STORE_URL", fresh_schema("dprelease_watchdog_")[1])
    platform = pipeline.Platform.open(Settings.from_env())
    store = platform.store
    store.add_dataset("watched", privacy_unit="u", blob_path="/nowhere", fingerprint="0" * 64, file_format="csv",
                      schema={"u": "int"}, epsilon_cap=10.0, delta_cap=1e-5)
    before = store.budget("watched")
    run_key = str(_submit(deployment).id)
    with get_client(sync_client=True) as client:  # before any worker of this module could take it
        client.set_flow_run_state(run_key, Suspended(timeout_seconds=int(PATIENCE_S), pause_key="suspended"),
                                  force=True)
    taken = f"{run_key}@taken"  # a series run's further release, taken over by another process
    for release_id in (run_key, taken):
        store.add_release("watched", "{}", release_id=release_id, flow_run_id=run_key)
        store.reserve("watched", release_id, 0.5, 0.0)
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    store.take_lease(taken, recovery.this_host(), other.pid, recovery.process_started(other.pid), run_key)

    def watched_until_closed() -> None:  # this process is the run: it closes its end without DONE
        watchdog.watch(run_key, run_key)
        pid = watchdog_of(os.getpid(), run_key)
        watchdog.finish(run_key, ended=False)
        wait_gone(pid, "the watchdog")

    try:
        watched_until_closed()
        assert [store.ledger_entry(r).status for r in (run_key, taken)] == ["reserved", "reserved"]
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run_key, Running(), force=True)
        watched_until_closed()
        release = store.get_release(run_key)
        assert (release.status, release.decision_comment) == ("failed", DIED_REASON)
        assert store.ledger_entry(run_key).status == "refunded"
        assert (store.get_release(taken).status, store.ledger_entry(taken).status) == ("pending", "reserved")
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run_key).state
        assert state.is_crashed() and f"release {run_key} failed, epsilon 0.5 refunded" in state.message, state
        assert taken not in state.message
        assert recovery.sweep(platform) == []
    finally:
        other.stdin.close()
        other.wait(PATIENCE_S)
        recovery.stop(platform, taken, "the test is over")
    assert store.budget("watched") == before
