"""A release worker stops the way docs/deployment.md tells an operator: SIGTERM (`systemctl stop`)
ends a `prefect worker start` process by itself, with the run it was executing, even when the
process that started it ignores SIGINT (a background job of a non-interactive shell, as CI's
`.ci/run > log &`: Prefect 3.8.8's worker turns SIGTERM into SIGINT, see tests/prefect_worker.py).
A real `prefect server start`, a process work pool, a real worker process and real signals."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from patience import PATIENCE_S
from prefect_worker import start_worker, stop_worker

POOL = "stopping"
FLOW = '''
import os, time
from pathlib import Path
from prefect import flow

@flow
def waits(marker: str):
    Path(marker).write_text(str(os.getpid()))
    time.sleep(3600)  # a run still busy when its worker is stopped
'''


@pytest.fixture
def server(tmp_path):
    """A Prefect server, the API this process and the worker use, and the process pool."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_console import drain_prefect_workers, start_prefect_server, stop_process_group

    (tmp_path / "server").mkdir()
    proc, url = start_prefect_server(tmp_path / "server")
    try:
        with temporary_settings(updates={PREFECT_API_URL: f"{url}/api"}):
            with get_client(sync_client=True) as client:
                client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
            yield f"{url}/api"
            drain_prefect_workers()
    finally:
        stop_process_group(proc)


def _worker_env(tmp_path: Path, api: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_API_URL=api, PREFECT_HOME=str(tmp_path / "worker-home"), PREFECT_LOGGING_LEVEL="WARNING",
               PREFECT_WORKER_QUERY_SECONDS="1")
    return env


@pytest.mark.parametrize("sigint", [signal.SIG_IGN, signal.default_int_handler], ids=["SIGINT ignored", "SIGINT default"])
def test_a_worker_stops_on_sigterm_with_its_run_whatever_its_parent_did_with_sigint(server, tmp_path, sigint):
    from prefect import get_client

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "waiting_flow.py").write_text(FLOW)
    marker = tmp_path / "run-pid"
    with get_client(sync_client=True) as client:
        deployment = client.create_deployment(
            flow_id=client.create_flow_from_name("waits"), name="waits", entrypoint="waiting_flow.py:waits",
            work_pool_name=POOL, job_variables={"working_dir": str(tmp_path / "code")})
        client.create_flow_run_from_deployment(deployment, parameters={"marker": str(marker)})
    previous = signal.signal(signal.SIGINT, sigint)  # what the test process hands down, as its shell did
    try:
        worker = start_worker(POOL, ["--limit", "1"], tmp_path, _worker_env(tmp_path, server), tmp_path / "worker.log")
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + PATIENCE_S  # a bound only a hung worker reaches
        while not (marker.exists() and marker.read_text()):
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, "the worker never started the run"
            time.sleep(0.5)
        run_pid = int(marker.read_text())
        assert stop_worker(worker) is None, (tmp_path / "worker.log").read_text()
        assert not _alive(run_pid), "the stopped worker left its run running"
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(PATIENCE_S)
        if marker.exists() and marker.read_text() and _alive(int(marker.read_text())):
            os.killpg(int(marker.read_text()), signal.SIGKILL)  # its own session: its pid is its group


def _alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (Linux /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
