"""Prefect workers on two hosts with no shared local disk (issue 38, item 3): a real PostgreSQL
store, a moto S3 server holding the escrow and the release archive (DPRELEASE_ESCROW_URL,
DPRELEASE_ARCHIVE_URL), a real `prefect server start`, a process work pool and two `prefect worker
start` processes, each in its own working directory with its own DPRELEASE_HOME. The workers get
the escrow key and the platform's signing key; no controller key is on a worker. This test process
is the controller's host: it submits runs through the Prefect API and signs decisions as
`dprelease approve` does.

- 20 releases submitted at once against a cap that admits 12: exactly 12 published (in the bucket,
  signed), 8 refused before reserving, the ledger exact, every decision recorded once.
- A worker killed (SIGKILL, with its run) after the controller approved and the budget was
  committed: its home deleted, `dprelease recover` run from the other host's home finishes the
  publication from the shared archive, committing the budget once.
"""

from __future__ import annotations

import contextvars
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from patience import PATIENCE_S
from pg_schema import drop_schema, fresh_schema
from prefect_worker import start_worker, stop_worker

pytest.importorskip("s3fs")
pytest.importorskip("moto")

PG_ENV = "DPRELEASE_TEST_PG_URL"
POOL = "two-hosts"
HOSTS = ("host-a", "host-b")
RELEASES, CAP = 20, 12  # epsilon 1 each: the cap admits 12
SQL = "SELECT WITH ANONYMIZATION town, ANON_COUNT(*, 1) AS people FROM {table} GROUP BY town"
CLI = str(Path(sys.executable).with_name("dprelease"))
OVERRIDE = "synthetic test data: nobody is at risk"  # epsilon 1 is above the default tolerable risk
#: runs each worker takes at once: 2 x 5 engine processes are more than 2 cores run at once already
WORKER_LIMIT = 5

pytestmark = [pytest.mark.skipif(not os.environ.get(PG_ENV), reason=f"needs PostgreSQL: set {PG_ENV} (.ci/run does)"),
              pytest.mark.xdist_group("two_hosts"),  # one worker sets the hosts up once (--dist loadgroup)
              pytest.mark.runs_first,  # a long module: among the first handed out, beside the rest (conftest.py)
              pytest.mark.slow]  # 3 min and 4.6 CPU-minutes at load 7 on 2 cores (2026-11-29): 21 flow-run processes


def _people(n: int) -> pd.DataFrame:
    return pd.DataFrame({"uid": range(n), "town": [f"town-{i % 3}" for i in range(n)]})


def _prefect_database(name: str, drop: bool = False) -> str:
    """A database of the test PostgreSQL for the Prefect server (created, or dropped), and its URL for
    Prefect's asyncpg driver: the server of a deployment with workers on several hosts keeps its
    state in PostgreSQL (on SQLite, 10 runs at once made it answer 503 to a resume)."""
    from sqlalchemy import create_engine, make_url, text

    url = make_url(os.environ[PG_ENV])
    engine = create_engine(url, isolation_level="AUTOCOMMIT")  # CREATE/DROP DATABASE: outside a transaction
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)' if drop else f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return url.set(drivername="postgresql+asyncpg", database=name).render_as_string(hide_password=False)


class Worker:
    """One host: its home, its working directory, its environment and its `prefect worker` process."""

    def __init__(self, name: str, root: Path, common: dict, admin_keys: Path):
        self.name, self.home, self.cwd = name, root / name / "home", root / name / "work"
        self.cwd.mkdir(parents=True)
        keys = self.home / "keys"
        keys.mkdir(parents=True, mode=0o700)
        for key in ("signing_ed25519.pem", "signing_ed25519.pub.pem"):  # the platform's signing key, no other
            shutil.copy2(admin_keys / key, keys / key)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DPRELEASE_", "PREFECT_", "AWS_"))}
        self.env.update(common, DPRELEASE_HOME=str(self.home), PREFECT_HOME=str(self.home / "prefect"),
                        PREFECT_LOGGING_LEVEL="WARNING", PREFECT_WORKER_QUERY_SECONDS="2")  # default 10
        self.log = root / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = start_worker(POOL, ["--name", self.name, "--limit", str(WORKER_LIMIT)], self.cwd, self.env, self.log)

    def stop(self) -> list[str]:
        """Stop the worker as an operator does (docs/deployment.md: SIGTERM, which stops its runs
        too), then kill any run of this host still there (each runs in a process group of its own:
        a run left paused by a failed test must not outlive the module); returns what did not stop
        as documented."""
        problems = [problem] if self.proc is not None and (problem := stop_worker(self.proc)) else []
        for pid in self.runs():
            problems.append(f"{self.name}: run process {pid} outlived its stopped worker")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return problems

    def runs(self) -> list[int]:
        """The processes of this host: those whose DPRELEASE_HOME is its home."""
        mine = f"DPRELEASE_HOME={self.home}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and mine in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def kill(self, run_pid: int) -> None:
        """The host dies: every process of it at once, its worker, the flow run it started (its own
        process group) and the run's watchdog (a session of its own): all stopped first, so that no
        watchdog sees its run die and settles the release, then killed."""
        everyone = [pid for pid in self.runs() if pid != os.getpid()]
        assert run_pid in everyone and self.proc.pid in everyone, everyone
        for pid in everyone:
            os.kill(pid, signal.SIGSTOP)
        os.killpg(os.getpgid(run_pid), signal.SIGKILL)
        os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in everyone:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(PATIENCE_S)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """The whole deployment; yields (controller settings, deployment id, workers, common env)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_console import start_prefect_server, stop_process_group
    from s3_server import moto_server

    from dprelease import admin, decisions
    from dprelease.reporting import signing
    from dprelease.settings import Settings

    root = tmp_path_factory.mktemp("two-hosts")
    schema, store_url = fresh_schema("two_hosts_")
    saved = dict(os.environ)
    workers: list[Worker] = []
    server = None
    try:
        with moto_server() as aws:
            import fsspec

            os.environ.update(aws)
            fsspec.filesystem("s3", skip_instance_cache=True).mkdir("dprelease")
            (root / "prefect-server").mkdir()
            server, url = start_prefect_server(root / "prefect-server", _prefect_database(schema))
            common = {**aws, "DPRELEASE_STORE_URL": store_url, "DPRELEASE_ESCROW_URL": "s3://dprelease/escrow",
                      "DPRELEASE_ARCHIVE_URL": "s3://dprelease/archive", "PREFECT_API_URL": f"{url}/api"}
            # the controller's (and administrator's) host: this process
            os.environ.update(common, DPRELEASE_HOME=str(root / "controller"))
            settings = Settings.from_env()
            admin.init(settings)
            source = root / "people.csv"
            _people(300).to_csv(source, index=False)
            admin.register_dataset(settings, "people", source, "uid", epsilon_cap=CAP, delta_cap=1e-4)
            admin.register_dataset(settings, "kept", source, "uid", epsilon_cap=2, delta_cap=1e-4)
            source.unlink()  # the data lives only in the bucket now (sealed)
            signing.generate_keypair(root / "alice.pem", root / "alice.pub.pem")
            decisions.register_controller(settings, "alice", root / "alice.pub.pem")
            common["DPRELEASE_ESCROW_KEY"] = settings.escrow_key_file.read_text().strip()
            with temporary_settings(updates={PREFECT_API_URL: f"{url}/api"}):
                deployment_id = _deploy()
                workers = [Worker(name, root, common, settings.key_dir) for name in HOSTS]
                for worker in workers:
                    worker.start()
                yield settings, deployment_id, workers, root / "alice.pem"
    finally:
        problems = [problem for worker in workers for problem in worker.stop()]
        if server is not None:
            stop_process_group(server)
        os.environ.clear()
        os.environ.update(saved)
        drop_schema(schema)
        _prefect_database(schema, drop=True)
    assert not problems, problems  # after the cleanup, and only when the module itself ended well


def _deploy() -> str:
    """The process work pool and the dp-release deployment on it (the flow is imported by module
    path, from the installed package: the workers share no folder with anyone)."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from dprelease.flows.release import release_flow

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
        return str(client.create_deployment(
            flow_id=client.create_flow_from_name(release_flow.name), name="dp-release",
            entrypoint="dprelease.flows.release.release_flow", work_pool_name=POOL,
            parameter_openapi_schema=release_flow.parameters.model_dump()))


def _submit(deployment_id: str, table: str, job_env: dict | None = None):
    from prefect import get_client

    params = {"dataset": table, "sql": SQL.format(table=table), "epsilon": {"epsilon": 1.0},
              "approval_timeout": int(PATIENCE_S)}
    with get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(
            deployment_id, parameters=params, job_variables={"env": job_env} if job_env else None)


def _read_runs(client, run_ids) -> list:
    """These flow runs, in one request (not one per run: 20 reads a second kept the server busy)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    return client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(run_ids))))


def _all_ended(runs: list) -> bool:
    return all(run.state is not None and run.state.is_final() for run in runs)


def _final_states(run_ids: list) -> dict:
    """Each run's final state name, once every run has one (a bound only a hung run reaches)."""
    from prefect import get_client

    deadline = time.monotonic() + PATIENCE_S
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = _read_runs(client, run_ids)
            if len(runs) == len(run_ids) and _all_ended(runs):
                return {str(run.id): run.state.name for run in runs}
            time.sleep(2.0)
    raise AssertionError("the runs did not end")


def _answer_every_pause(settings, run_ids: set, key: Path, answered: dict) -> None:
    """Approve each release of these runs once, as `dprelease approve` does, until every run ended."""
    from prefect import get_client

    from dprelease.cli.deciding import decide
    from dprelease.store import Store

    store = Store(settings.store_url)
    deadline = time.monotonic() + PATIENCE_S
    with ThreadPoolExecutor(4) as pool, get_client(sync_client=True) as client:
        pending = {}
        while time.monotonic() < deadline:
            for rel in store.list_releases(status="awaiting_approval"):
                if rel.flow_run_id in {str(run_id) for run_id in run_ids} and rel.id not in answered:
                    answered[rel.id] = 1
                    # each in a copy of this thread's context: its Prefect settings name the test's server
                    pending[rel.id] = pool.submit(contextvars.copy_context().run, decide, settings, rel.id, "approve",
                                                  key, "two hosts", OVERRIDE, timeout=PATIENCE_S)
            for future in pending.values():
                if future.done():
                    future.result()  # the run recorded the decision; a refused one raises here
            if _all_ended(_read_runs(client, run_ids)):
                break
            time.sleep(2.0)
        for future in pending.values():
            future.result()


def test_twenty_releases_on_two_hosts_publish_exactly_what_the_cap_admits(hosts):
    from dprelease import decisions
    from dprelease.reporting import signing
    from dprelease.store import Store

    settings, deployment_id, workers, key = hosts
    started = time.monotonic()
    runs = [_submit(deployment_id, "people") for _ in range(RELEASES)]  # at once, through the API
    run_ids = {run.id for run in runs}
    answered: dict = {}
    _answer_every_pause(settings, run_ids, key, answered)
    states = _final_states(list(run_ids))
    print(f"{RELEASES} releases on two workers: {time.monotonic() - started:.0f} s")

    store = Store(settings.store_url)
    releases = [r for r in store.list_releases(dataset="people") if r.flow_run_id in {str(i) for i in run_ids}]
    published = [r for r in releases if r.status == "published"]
    assert len(releases) == RELEASES and len(published) == CAP, [(r.id, r.status) for r in releases]
    assert sorted(states.values()).count("Completed") == CAP, states
    refused = [r for r in releases if r.status != "published"]
    assert all(r.status == "failed" and "budget" in (r.decision_comment or "") for r in refused), refused
    budget = store.budget("people")
    assert (budget["epsilon_committed"], budget["epsilon_reserved"]) == (CAP, 0), budget
    entries = store.ledger_entries("people")
    assert sorted(e.status for e in entries) == ["committed"] * CAP, entries
    assert set(answered) == {r.id for r in published}  # each asked once, each answered once
    for rel in published:
        assert [d["decision"] for d in decisions.recorded(settings, rel.id)] == ["approve"]
    # both hosts ran releases; the publications are in the bucket, signed, with no local copy needed
    hosts_used = {_ran_on(r, workers) for r in published}
    assert hosts_used == set(HOSTS), hosts_used
    fs = _bucket()
    for rel in published:
        assert fs.exists(f"dprelease/archive/published/{rel.id}/{signing.MANIFEST}"), rel.id
        assert fs.exists(f"dprelease/archive/archive/{rel.id}/sealed-result.fernet"), rel.id
    here = settings.publication_dir / published[0].id
    shutil.rmtree(here, ignore_errors=True)
    from dprelease import shared_archive

    shared_archive.pull(settings, here)
    assert signing.verify_directory(here, settings.public_key_file).ok


def _ran_on(release, workers: list[Worker]) -> str | None:
    """The host whose home holds the release's working copy of its archive."""
    for worker in workers:
        if (worker.home / "archive" / release.id / "sealed-result.fernet").exists():
            return worker.name
    return None


def _bucket():
    import fsspec

    return fsspec.filesystem("s3", skip_instance_cache=True)


def test_a_worker_killed_mid_publication_is_finished_by_recover_on_the_other_host(hosts, tmp_path):
    from dprelease.cli.deciding import decide
    from dprelease.reporting import signing
    from dprelease.store import Store

    settings, deployment_id, workers, key = hosts
    marker = tmp_path / "paused"
    run = _submit(deployment_id, "kept", {"DPRELEASE_TEST_PAUSE_AT": "during_publication",
                                          "DPRELEASE_TEST_PAUSE_MARKER": str(marker)})
    store = Store(settings.store_url)
    deadline = time.monotonic() + PATIENCE_S
    while not (rels := [r for r in store.list_releases(status="awaiting_approval") if r.flow_run_id == str(run.id)]):
        assert time.monotonic() < deadline, "the release never asked for a decision"
        time.sleep(1.0)
    (rel,) = rels
    decide(settings, rel.id, "approve", key, "two hosts", OVERRIDE, timeout=PATIENCE_S)
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline, "the run never reached its publication"
        time.sleep(0.5)
    run_pid = int(marker.read_text().split()[0])
    (dying,) = [w for w in workers if str(w.home) in Path(f"/proc/{run_pid}/environ").read_bytes().decode(errors="replace")]
    (other,) = [w for w in workers if w is not dying]
    assert store.ledger_entry(rel.id).status == "committed"  # approved, committed, not yet in place
    dying.kill(run_pid)
    shutil.rmtree(dying.home)  # the host is gone, and its disk with it

    done = subprocess.run([CLI, "recover"], cwd=other.cwd, env=other.env, capture_output=True, text=True,
                          timeout=PATIENCE_S)
    assert done.returncode == 0, done.stderr
    assert f"release {rel.id}" in done.stdout and "publication completed" in done.stdout, done.stdout
    final = store.get_release(rel.id)
    assert final.status == "published" and final.decision_by == "alice"
    assert [e.status for e in store.ledger_entries("kept")] == ["committed"]
    assert store.budget("kept")["epsilon_committed"] == 1.0
    fs = _bucket()
    listed = fs.find(f"dprelease/archive/published/{rel.id}")
    assert any(p.endswith(signing.MANIFEST) for p in listed), listed
    assert not fs.find(f"dprelease/archive/published/.staging-{rel.id}")
    here = settings.publication_dir / rel.id
    from dprelease import shared_archive

    shared_archive.pull(settings, here)
    assert signing.verify_directory(here, settings.public_key_file).ok
