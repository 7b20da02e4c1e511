"""A command's temporary Prefect server (DPRELEASE_PREFECT_SERVER=temporary,
cli/temporary_prefect_server.py) never outlives its command: a
command killed with kill -9 takes its server with it, and the next command removes the private
database it left. Real processes, a real server, a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from patience import PATIENCE_S

ROOT = Path(__file__).resolve().parents[1]

#: a command that starts its temporary server as `dprelease release` does, then waits to be killed
COMMAND = textwrap.dedent("""
    import os, sys, time
    from dprelease.cli import prefect_server
    prefect_server.start()
    prefect_server.wait_ready()
    server = prefect_server._server
    print(server.process.pid, server.database.parent, server.api_url, flush=True)
    time.sleep(600)
""")


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie (killed, not yet reaped by init) is gone too
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_kill_9_of_the_command_takes_its_server_and_the_next_command_removes_its_database():
    import httpx

    from dprelease.cli import temporary_prefect_server as prefect_server

    prefect_server.template_database()  # built once per Prefect home (shared with other tests)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PYTHONPATH=str(ROOT), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="ERROR",
               DPRELEASE_PREFECT_SERVER="temporary")
    command = subprocess.Popen([sys.executable, "-c", COMMAND], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        server_pid, scratch, api_url = command.stdout.readline().split()
        assert httpx.get(f"{api_url}/health", timeout=PATIENCE_S).status_code == 200  # a real server answered
        scratch = Path(scratch)
        assert scratch.parent == Path(tempfile.gettempdir()) and (scratch / "prefect.db").exists()
        command.send_signal(signal.SIGKILL)
        command.wait(PATIENCE_S)
        assert _gone(int(server_pid), PATIENCE_S), "the server outlived its command"
        assert scratch.exists()  # nobody cleaned up: the command had no chance
        removed = prefect_server.sweep_leftovers()  # what the next command does first
        assert scratch in removed and not scratch.exists()
    finally:
        if command.poll() is None:
            command.kill()


def test_the_sweep_leaves_the_database_of_a_live_command(tmp_path, monkeypatch):
    from dprelease.cli import temporary_prefect_server as prefect_server

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live = tmp_path / f"{prefect_server.SCRATCH_PREFIX}live"
    dead = tmp_path / f"{prefect_server.SCRATCH_PREFIX}dead"
    foreign = tmp_path / f"{prefect_server.SCRATCH_PREFIX}foreign"  # no owner file: not ours to remove
    for d in (live, dead, foreign):
        d.mkdir()
    (live / prefect_server.OWNER_FILE).write_text(str(os.getpid()))
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    (dead / prefect_server.OWNER_FILE).write_text(finished.stdout.strip())
    assert prefect_server.sweep_leftovers() == [dead]
    assert live.exists() and foreign.exists() and not dead.exists()


def test_a_server_on_a_copy_of_the_template_starts_without_migrating_and_serves_flows(tmp_path):
    """The template is this Prefect version's, migrated to its head and holding every block type,
    so a server on a copy skips both at its start (cli/temporary_prefect_server.TemporaryServer.prepared):
    it answers, lists the block types, and records a flow run."""
    import shutil

    import prefect
    from prefect import Flow
    from prefect.client.orchestration import SyncPrefectClient

    from dprelease.cli import temporary_prefect_server as prefect_server

    template = prefect_server.template_database()
    assert template.name == f"dprelease-empty-prefect-{prefect.__version__}.db"
    server = prefect_server.TemporaryServer(tmp_path / "prefect.db")
    assert server.prepared
    shutil.copyfile(template, server.database)
    server.spawn()
    try:
        server.wait_ready(timeout_s=PATIENCE_S)
        environ = Path(f"/proc/{server.process.pid}/environ")
        if environ.exists():  # Linux: the server was told to skip both (the launcher became uvicorn in place)
            told = dict(v.split("=", 1) for v in environ.read_bytes().decode().split("\0") if "=" in v)
            assert told["PREFECT_SERVER_DATABASE_MIGRATE_ON_START"] == "false"
            assert told["PREFECT_SERVER_REGISTER_BLOCKS_ON_START"] == "false"
        # Prefect's own client, as a command uses it: it retries what a busy server answers 503
        with SyncPrefectClient(server.api_url, auth_string=server.auth) as client:
            assert {"local-file-system", "secret"} <= {k.slug for k in client.read_block_types()}
            flow_id = client.create_flow_from_name("template-check")
            made = client.create_flow_run(Flow(fn=lambda: None, name="template-check"), name="a run")
            assert made.flow_id == flow_id and client.read_flow_run(made.id).name == "a run"
    finally:
        server.kill()


def test_a_new_home_copies_the_installations_template_instead_of_building_one_built_again_whole(tmp_path):
    """Building the template (a Prefect server migrating a new database and registering the block
    types) was most of the first release's extra time in a new PREFECT_HOME (issue 41). The first
    home of an installation builds it and offers it to the installation; a second new home then copies
    that one (byte for byte: a build of its own would differ, its ids and times being new), as does
    the check a command makes before starting its server (existing_template). Whether the copy serves
    Prefect is checked by test_a_server_on_a_copy_of_the_template_starts_without_migrating_and_serves_flows,
    whose template is such a copy.

    Built again: Prefect remembers a block registration per database path (PREFECT_HOME/memo_store.toml):
    a template built again under the same name (deleted, or a new build of its Prefect version) would
    have registered none, and its copies' servers skip the registration. The builder forgets that: the
    first home builds its template twice in one process (the second after deleting it and the
    installation's copy), and both hold every block type; the second home copies the second."""
    import hashlib
    import sqlite3

    import prefect

    first_home = textwrap.dedent("""
        import sqlite3
        from dprelease.cli import temporary_prefect_server as prefect_server
        print(prefect_server.existing_template())
        counts = []
        for build in range(2):
            template = prefect_server.template_database()
            counts.append(sqlite3.connect(template).execute("SELECT count(*) FROM block_type").fetchone()[0])
            assert prefect_server.installation_template().exists()  # offered to the installation
            if build == 0:  # the next call builds it again (the installation's copy too)
                template.unlink()
                prefect_server.installation_template().unlink()
        print(template, *counts)
    """)
    second_home = textwrap.dedent("""
        from dprelease.cli import temporary_prefect_server as prefect_server
        print(prefect_server.existing_template())
        print(prefect_server.template_database())
    """)
    installation = tmp_path / "installation" / f"dprelease-empty-prefect-{prefect.__version__}.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(ROOT), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               DPRELEASE_PREFECT_TEMPLATE_DIR=str(installation.parent))
    said, digests = [], []
    for home, code in (("first-home", first_home), ("second-home", second_home)):
        done = subprocess.run([sys.executable, "-c", code], env={**env, "PREFECT_HOME": str(tmp_path / home)}, cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        said.append(done.stdout.split())
        digests.append(hashlib.sha256(Path(said[-1][1]).read_bytes()).hexdigest())
        if home == "first-home":  # nothing to copy yet: built, then offered to the installation
            assert said[0][0] == "None" and installation.exists()
            first, second = map(int, said[0][2:])
            assert first > 20 and second == first, (first, second)  # built again: every block type again
    second_existing, second_home_template = said[1]
    assert second_existing == second_home_template == str(tmp_path / "second-home" / installation.name)
    assert digests[1] == digests[0] == hashlib.sha256(installation.read_bytes()).hexdigest()  # copied, not built again
    assert sqlite3.connect(second_existing).execute("SELECT count(*) FROM block_type").fetchone()[0] > 20
