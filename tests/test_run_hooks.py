"""The flows' run hooks are called the ways Prefect calls them: its engine passes (flow, flow_run, state)
by position, its runner by keyword (runner/_hook_runner.py: flow=, flow_run=, state=) when it runs a
worker run's cancellation hooks itself, after the run's process is gone. A release cancelled in the UI
while it waits on a worker is refunded and failed at once by that hook (a real `prefect server start`,
a process pool, a real `prefect worker start`), not left reserved for the next sweep."""

from __future__ import annotations

import inspect
import os
import time

import pandas as pd
from patience import PATIENCE_S
from prefect_worker import start_worker, stop_worker

POOL = "cancelling-releases"
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


def test_a_release_cancelled_in_the_ui_while_it_waits_on_a_worker_is_refunded_at_once(tmp_path, monkeypatch):
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelling
    from prefect_console import drain_prefect_workers, start_prefect_server, stop_process_group

    from dprelease import admin
    from dprelease.flows.release import STOPPED_REASON, release_flow
    from dprelease.settings import Settings
    from dprelease.store import Store

    (tmp_path / "server").mkdir()
    server, url = start_prefect_server(tmp_path / "server")
    worker = None
    try:
        with temporary_settings(updates={PREFECT_API_URL: f"{url}/api"}):
            monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))  # this process's and the worker's
            settings = Settings.from_env()
            admin.init(settings)
            source = tmp_path / "people.csv"
            pd.DataFrame({"uid": range(300), "town": [f"town-{i % 3}" for i in range(300)]}).to_csv(source, index=False)
            admin.register_dataset(settings, "people", source, "uid", epsilon_cap=10, delta_cap=1e-4)
            with get_client(sync_client=True) as client:
                client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
                deployment = client.create_deployment(
                    flow_id=client.create_flow_from_name(release_flow.name), name="dp-release",
                    entrypoint="dprelease.flows.release.release_flow", work_pool_name=POOL,
                    parameter_openapi_schema=release_flow.parameters.model_dump())
                run = client.create_flow_run_from_deployment(
                    deployment, parameters={"dataset": "people", "sql": SQL, "epsilon": {"epsilon": 1.0},
                                            "approval_timeout": int(PATIENCE_S)})
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
            env.update(PREFECT_API_URL=f"{url}/api", PREFECT_HOME=str(tmp_path / "worker-home"),
                       PREFECT_LOGGING_LEVEL="WARNING", PREFECT_WORKER_QUERY_SECONDS="1")
            log = tmp_path / "worker.log"
            worker = start_worker(POOL, ["--limit", "1"], tmp_path, env, log)
            store = Store(settings.store_url)
            release_id = str(run.id)

            def status() -> str | None:
                return next((r.status for r in store.list_releases() if r.id == release_id), None)

            deadline = time.monotonic() + PATIENCE_S  # a bound only a hung run reaches
            while status() != "awaiting_approval":
                assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
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
        if worker is not None and worker.poll() is None:
            worker.kill()
        stop_process_group(server)
