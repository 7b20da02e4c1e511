"""The local Prefect server of a PREFECT_HOME (cli/local_prefect_server.py), the default when no
PREFECT_API_URL is set: one server per home, shared by the commands that need it, stopped once
nobody has used it for its idle time; never two for a home, even when commands start at once; a
dead server or a stale record is replaced, never trusted; its API refuses calls without its
secret. Real processes, a real server, real SIGKILLs, and real releases through `dprelease`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from patience import PATIENCE_S

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("dprelease"))
DATA = ROOT / "examples" / "data" / "adult.csv.gz"

#: a command's use of the server, as `dprelease release` makes it: find or start, wait (unless
#: "spawned"), print what it found, then hold it for argv[2] seconds
ATTACH = textwrap.dedent("""
    import json, sys, time
    from dprelease.cli import prefect_server
    prefect_server.start()
    if sys.argv[1] != "spawned":
        prefect_server.wait_ready()
    local = prefect_server._local
    print(json.dumps({"pid": local.record.pid, "port": local.record.port, "auth": local.record.auth,
                      "started": local.process is not None}), flush=True)
    time.sleep(float(sys.argv[2]))
""")


@pytest.fixture
def prefect_home(tmp_path):
    """A fresh PREFECT_HOME holding the migrated template (copied: built once per machine's home);
    every local server left in it is killed at the end."""
    from dprelease.cli import temporary_prefect_server

    template = temporary_prefect_server.template_database()
    home = tmp_path / "prefect-home"
    home.mkdir()
    shutil.copyfile(template, home / template.name)
    yield home
    for state in home.glob("dprelease-local-server-*.json"):
        try:
            os.kill(json.loads(state.read_text())["pid"], signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


def _env(prefect_home: Path, idle_s: float, **more: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "DPRELEASE_PREFECT_SERVER")}
    env.update(PREFECT_HOME=str(prefect_home), PYTHONPATH=str(ROOT), DPRELEASE_LOCAL_SERVER_IDLE_S=str(idle_s),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="ERROR")
    env.update(more)
    return env


def _attach(env: dict, hold_s: float = 0, wait: str = "ready") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ATTACH, wait, str(hold_s)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _found(command: subprocess.Popen, timeout: float = PATIENCE_S) -> dict:
    """What the command found (its first line after the notice of a started server), or its stderr."""
    line = command.stdout.readline()
    if line.startswith("dprelease: started"):
        line = command.stdout.readline()
    if not line:
        command.wait(timeout)
        raise AssertionError(f"the command printed nothing (exit {command.returncode}):\n{command.stderr.read()}")
    return json.loads(line)


def _run(env: dict) -> dict:
    command = _attach(env)
    found = _found(command)
    assert command.wait(PATIENCE_S) == 0, command.stderr.read()
    return found


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True  # killed, not yet reaped
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.2)
    return False


def _answers(found: dict) -> bool:
    """The server answers an authenticated call (one made while it boots waits in its socket's
    queue until its app is up: at load that takes far more than an idle machine's few seconds)."""
    response = httpx.post(f"http://127.0.0.1:{found['port']}/api/flow_runs/filter", json={},
                          auth=tuple(found["auth"].split(":", 1)), timeout=PATIENCE_S)
    return response.status_code == 200


def test_commands_one_after_another_share_one_server_its_owner_s_only_until_its_home_is_deleted(prefect_home):
    """One server boot for four checks: a second command uses the first one's server; its API refuses
    calls without the server's secret; its files are its owner's only; deleting its home stops it."""
    env = _env(prefect_home, idle_s=PATIENCE_S)
    first = _run(env)
    second = _run(env)
    assert first["started"] and not second["started"]
    assert (second["pid"], second["port"]) == (first["pid"], first["port"])
    assert _answers(second)
    _refuses_calls_without_the_secret(prefect_home, second)
    _keeps_its_files_to_its_owner(prefect_home)
    shutil.rmtree(prefect_home)
    assert _gone(second["pid"], within_s=PATIENCE_S), "a server whose home was deleted kept running"


def test_commands_started_at_once_start_one_server_and_a_command_reports_only_the_one_the_home_keeps(prefect_home):
    """Four commands at once start one server; that server, its record damaged, is then the one a
    command holding it no longer reports."""
    env = _env(prefect_home, idle_s=PATIENCE_S)
    commands = [_attach(env) for _ in range(4)]
    found = [_found(c) for c in commands]
    for c in commands:
        assert c.wait(PATIENCE_S) == 0, c.stderr.read()
    assert sum(f["started"] for f in found) == 1, found
    assert len({f["pid"] for f in found}) == 1, found
    _reports_only_the_server_the_home_keeps(prefect_home, env, found[0])


def _reports_only_the_server_the_home_keeps(prefect_home: Path, env: dict, first: dict) -> None:
    """A command holding a server the home no longer keeps (its record now names another, started
    after the record was damaged) reports the home's server, never the one it found first, even
    while that one still runs (it stops once it sees the record; held stopped here, so it cannot)."""
    from dprelease.cli.local_prefect_server import LocalServer

    attached = LocalServer(prefect_home)
    assert attached.attach(may_start=False) and attached.record.pid == first["pid"]
    os.kill(first["pid"], signal.SIGSTOP)
    try:
        next(prefect_home.glob("dprelease-local-server-*.json")).write_text('{"pid": 1, "port":')
        second = _run(env)
        assert second["started"] and second["pid"] != first["pid"]
        attached.wait_ready()
        assert (attached.record.pid, attached.record.port) == (second["pid"], second["port"])
        assert attached.process is None  # not this command's: it never started one
    finally:
        attached.detach()
        os.kill(first["pid"], signal.SIGKILL)


#: a sitecustomize for the server's process: an audit hook writes the name of every module its
#: watchdog thread ("idle-watch") loads, and the pid of every process that installed the hook
RECORD_WATCHDOG_IMPORTS = textwrap.dedent("""
    import os, sys, threading
    _here = os.path.dirname(os.path.abspath(__file__))
    _imports = os.open(os.path.join(_here, "watchdog-imports.txt"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(os.open(os.path.join(_here, "hooked.txt"), os.O_WRONLY | os.O_APPEND | os.O_CREAT),
             f"{os.getpid()}\\n".encode())

    def _record(event, args):
        if event == "import" and threading.current_thread().name == "idle-watch":
            os.write(_imports, f"{args[0]}\\n".encode())  # os.write: the hook itself imports nothing

    sys.addaudithook(_record)
""")


def test_a_server_in_use_stays_and_stops_once_its_last_user_is_killed_and_its_watchdog_imports_nothing(
        prefect_home, tmp_path):
    """A server stays while a command holds it, however long past its idle time, and stops once its
    last user is killed; the next command starts another, which stops when idle after that command.

    The watchdog thread starts while the server's main thread imports Prefect's app. An import of
    its own there can fail (CPython's module locks see a deadlock between the two threads, or hand
    over a half-initialised module), and a failed watchdog stops the server, also one that has just
    answered a command (which then reports a server that is gone a moment later). Recorded by an
    audit hook in both servers through their whole lives: boot, use, idle stop."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(RECORD_WATCHDOG_IMPORTS)
    env = _env(prefect_home, idle_s=2, PYTHONPATH=f"{hook}{os.pathsep}{ROOT}")
    holder = _attach(env, hold_s=PATIENCE_S)
    found = _found(holder)
    time.sleep(8)  # four times the idle time, with a user attached all along
    assert _answers(found)
    holder.send_signal(signal.SIGKILL)  # the kernel drops its lock: the server sees nobody left
    holder.wait(PATIENCE_S)
    assert _gone(found["pid"], within_s=PATIENCE_S), "the server outlived its idle time"
    assert not list(prefect_home.glob("dprelease-local-server-*.json")), "a stopped server left its record"
    after = _run(env)
    assert after["started"] and after["pid"] != found["pid"]
    assert _gone(after["pid"], within_s=PATIENCE_S), "the server outlived its idle time"
    assert not list(prefect_home.glob("dprelease-local-server-*.json")), "the server did not stop as idle"
    hooked = (hook / "hooked.txt").read_text().split()
    assert str(found["pid"]) in hooked and str(after["pid"]) in hooked, "the hook was not in the servers"
    loaded = (hook / "watchdog-imports.txt").read_text().split()
    assert not loaded, f"the servers' watchdog threads loaded {loaded}"


def test_the_port_listens_before_the_server_has_booted_and_a_killed_command_leaves_it_to_the_next(prefect_home):
    """The command binds the socket and hands it over: the port is the server's from its spawn, with
    no moment when another process could take it (a call waits in the queue until the app is up).
    The command killed while its server boots leaves that server to the next command."""
    import socket

    env = _env(prefect_home, idle_s=PATIENCE_S)
    starter = _attach(env, hold_s=PATIENCE_S, wait="spawned")
    try:
        spawned = _found(starter)  # printed at once after the spawn, long before Prefect's imports end
        with socket.create_connection(("127.0.0.1", spawned["port"]), timeout=PATIENCE_S):
            pass  # refused if the server were still to bind its port
    finally:
        starter.send_signal(signal.SIGKILL)  # while its server boots
        starter.wait(PATIENCE_S)
    assert _answers(spawned)
    later = _run(env)
    assert not later["started"] and later["pid"] == spawned["pid"]
    assert _answers(later)


def test_a_killed_server_is_replaced_and_a_server_whose_record_names_another_stops_by_itself(prefect_home):
    """A killed server is replaced by the next command's. A second server on the same database (its
    record overwritten, damaged or removed) must not stay."""
    env = _env(prefect_home, idle_s=PATIENCE_S)
    first = _run(env)
    os.kill(first["pid"], signal.SIGKILL)
    assert _gone(first["pid"], within_s=PATIENCE_S)
    second = _run(env)
    assert second["started"] and second["pid"] != first["pid"]
    assert _answers(second)
    state = next(prefect_home.glob("dprelease-local-server-*.json"))
    state.write_text('{"pid": 1, "port":')  # damaged: the next command starts another server
    third = _run(env)
    assert third["started"] and third["pid"] != second["pid"]
    assert _gone(second["pid"], within_s=PATIENCE_S), "the server no record names kept running"
    assert _answers(third) and _record(prefect_home)["pid"] == third["pid"]


def test_a_record_naming_another_process_is_neither_trusted_nor_killed_and_server_stop_waits_for_users(prefect_home):
    """A stale record's pid, now another process's, is neither used nor signalled: a server is
    started instead, which `dprelease server --stop` then stops once no command holds it."""
    from importlib.metadata import version

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(" + str(PATIENCE_S) + ")"])
    try:
        record = {"pid": bystander.pid, "port": 8999, "auth": "dprelease:x", "version": version("prefect"),
                  "started": 1.0, "home": str(prefect_home.resolve())}  # a pid reused by another process
        (prefect_home / f"dprelease-local-server-{version('prefect')}.json").write_text(json.dumps(record))
        env = _env(prefect_home, idle_s=PATIENCE_S)
        found = _run(env)
        assert found["started"] and found["pid"] != bystander.pid
        assert _answers(found)
        assert bystander.poll() is None, "a process named by a stale record was signalled"
    finally:
        bystander.kill()
        bystander.wait()
    _server_stop_refuses_while_a_command_uses_it_then_stops_it(env, found)


def _refuses_calls_without_the_secret(prefect_home: Path, found: dict) -> None:
    """The server's API refuses calls without its secret (health is open, as for probes)."""
    state = next(prefect_home.glob("dprelease-local-server-*.json"))
    assert stat.S_IMODE(state.stat().st_mode) == 0o600  # the secret is its owner's only
    base = f"http://127.0.0.1:{found['port']}/api"
    assert httpx.get(f"{base}/health", timeout=PATIENCE_S).status_code == 200  # health is open, as for probes
    assert httpx.post(f"{base}/flow_runs/filter", json={}, timeout=PATIENCE_S).status_code == 401
    guess = httpx.post(f"{base}/flow_runs/filter", json={}, auth=("dprelease", "guess"), timeout=PATIENCE_S)
    assert guess.status_code == 401
    assert _answers(found)


def _server_stop_refuses_while_a_command_uses_it_then_stops_it(env: dict, running: dict) -> None:
    """`dprelease server --stop` refuses while a command holds the home's server, then stops it."""
    holder = _attach(env, hold_s=PATIENCE_S)
    found = _found(holder)
    assert found["pid"] == running["pid"]
    refused = subprocess.run([CLI, "server", "--stop"], env=env, capture_output=True, text=True, timeout=PATIENCE_S)
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith("error: the local Prefect server is in use by a running command")
    assert len(refused.stderr.strip().splitlines()) == 1 and _answers(found)
    holder.kill()
    holder.wait(PATIENCE_S)
    stopped = subprocess.run([CLI, "server", "--stop"], env=env, capture_output=True, text=True, timeout=PATIENCE_S)
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped the local Prefect server (process {found['pid']}" in stopped.stdout
    assert _gone(found["pid"], within_s=PATIENCE_S)
    again = subprocess.run([CLI, "server", "--stop"], env=env, capture_output=True, text=True, timeout=PATIENCE_S)
    assert again.returncode == 0 and "no local Prefect server runs" in again.stdout


def test_an_unknown_server_mode_is_refused_in_one_line(prefect_home, tmp_path):
    env = _env(prefect_home, idle_s=PATIENCE_S, DPRELEASE_PREFECT_SERVER="shared-please",
               DPRELEASE_HOME=str(tmp_path / "h"))
    (tmp_path / "request.yaml").write_text("dataset: adult\nepsilon: 1\nsql: SELECT 1\n")
    done = subprocess.run([CLI, "release", str(tmp_path / "request.yaml")], env=env, capture_output=True,
                          text=True, timeout=PATIENCE_S)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "DPRELEASE_PREFECT_SERVER='shared-please' is not a server mode" in lines[0], done.stderr
    assert not list(prefect_home.glob("dprelease-local-server-*.json"))


REQUEST = """dataset: adult
title: local server test
sql: |
  SELECT WITH ANONYMIZATION sex, ANON_COUNT(*, 1) AS people FROM adult GROUP BY sex
epsilon: 0.25
delta: 1.0e-7
"""


@pytest.mark.slow
def test_releases_share_the_local_server_and_another_terminal_answers_a_paused_one(prefect_home, tmp_path):
    """Two releases at once, then one decided with `dprelease approve` from another process: all on
    the one local server the first command started (and said so), the budget charged once each."""
    from dprelease import admin, decisions
    from dprelease.settings import Settings
    from dprelease.store import Store

    settings = Settings.from_env({"DPRELEASE_HOME": str(tmp_path / "home")})
    admin.init(settings)
    admin.register_dataset(settings, "adult", DATA, "person_id", epsilon_cap=10.0, add_row_id=True,
                           risk_profile={"max_risk": 0.5})
    keys = {}
    for name in ("ana", "bo"):
        keys[name] = tmp_path / f"{name}.pem"
        decisions.create_controller(settings, name, keys[name])
    (tmp_path / "request.yaml").write_text(REQUEST)
    env = _env(prefect_home, idle_s=PATIENCE_S, DPRELEASE_HOME=str(settings.home), PREFECT_LOGGING_LEVEL="WARNING")
    env = {k: v for k, v in env.items() if k != "DPRELEASE_CONTROLLER_KEY"}

    def release(name: str, *extra: str) -> subprocess.Popen:
        return subprocess.Popen([CLI, "release", str(tmp_path / "request.yaml"), *extra],
                                env={**env, "DPRELEASE_CONTROLLER_KEY": str(keys[name])}, cwd=tmp_path,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    together = [release(name, "--approve-as", name) for name in ("ana", "bo")]
    outputs = [c.communicate(timeout=PATIENCE_S) for c in together]
    for c, (out, err) in zip(together, outputs, strict=True):
        assert c.returncode == 0, out[-2000:] + err[-2000:]
        assert " published (signed): " in out, out[-2000:]
    notices = [out for out, _ in outputs if "started this PREFECT_HOME's local Prefect server" in out]
    assert len(notices) == 1, outputs  # on stdout: stderr is left to a refusal's one line
    server_pid = json.loads(next(prefect_home.glob("dprelease-local-server-*.json")).read_text())["pid"]

    paused = release("ana")  # no terminal: it waits for a decision from elsewhere
    store = Store(settings.store_url)
    deadline = time.monotonic() + PATIENCE_S
    while not (waiting := store.list_releases(status="awaiting_approval")) and time.monotonic() < deadline:
        assert paused.poll() is None, paused.communicate()
        time.sleep(0.3)
    assert waiting, "the release never paused for a decision"
    release_id = waiting[0].id
    approve = subprocess.run([CLI, "approve", release_id, "--key", str(keys["bo"]), "--reason", "checked"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=PATIENCE_S)
    assert approve.returncode == 0, approve.stdout + approve.stderr
    assert f"approve of release {release_id} accepted: published" in approve.stdout
    out, err = paused.communicate(timeout=PATIENCE_S)
    assert paused.returncode == 0 and " published (signed): " in out, out[-2000:] + err[-2000:]
    assert "started this PREFECT_HOME's local Prefect server" not in out + err
    record = json.loads(next(prefect_home.glob("dprelease-local-server-*.json")).read_text())
    assert record["pid"] == server_pid  # one server served all four commands
    assert store.get_release(release_id).decision_by == "bo"
    assert store.budget("adult")["epsilon_committed"] == pytest.approx(3 * 0.25)
    assert store.budget("adult")["epsilon_reserved"] == 0


def test_a_refusal_in_the_flow_of_the_command_that_started_the_server_is_one_line(prefect_home, tmp_path):
    """The notice of a started server goes to stdout: the refusal stays stderr's one line."""
    from dprelease import admin
    from dprelease.settings import Settings
    from dprelease.store import Store

    settings = Settings.from_env({"DPRELEASE_HOME": str(tmp_path / "home")})
    admin.init(settings)
    admin.register_dataset(settings, "adult", DATA, "person_id", epsilon_cap=10.0, add_row_id=True)
    Path(Store(settings.store_url).get_dataset("adult").blob_path).write_bytes(b"garbage")  # fails in the flow
    (tmp_path / "request.yaml").write_text(REQUEST)
    env = _env(prefect_home, idle_s=PATIENCE_S, DPRELEASE_HOME=str(settings.home))
    # no decision is asked for (--approve-as would need a controller's key): the flow fails at its data checks
    done = subprocess.run([CLI, "release", str(tmp_path / "request.yaml")], env=env,
                          cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=PATIENCE_S)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "started this PREFECT_HOME's local Prefect server" in done.stdout
    assert Store(settings.store_url).budget("adult")["epsilon_reserved"] == 0


def _record(prefect_home: Path) -> dict:
    return json.loads(next(prefect_home.glob("dprelease-local-server-*.json")).read_text())


def test_a_release_refused_before_its_flow_leaves_no_server(prefect_home, tmp_path):
    env = _env(prefect_home, idle_s=PATIENCE_S, DPRELEASE_HOME=str(tmp_path / "home"))
    assert subprocess.run([CLI, "init"], env=env, capture_output=True, timeout=PATIENCE_S).returncode == 0
    (tmp_path / "request.yaml").write_text(REQUEST.replace("dataset: adult", "dataset: nosuch"))
    done = subprocess.run([CLI, "release", str(tmp_path / "request.yaml")], env=env, capture_output=True, text=True,
                          timeout=PATIENCE_S)
    assert done.returncode == 2 and "unknown dataset 'nosuch'" in done.stderr, done.stderr
    assert not list(prefect_home.glob("dprelease-local-server-*.json"))
    servers = subprocess.run(["pgrep", "-f", f"local_prefect_server {prefect_home.resolve()} "], capture_output=True,
                             text=True)
    assert servers.stdout.strip() == "", "a refused release left its server running"


def test_a_relative_home_is_the_same_home_for_the_server(prefect_home):
    env = _env(prefect_home, idle_s=PATIENCE_S)
    env["PREFECT_HOME"] = prefect_home.name  # relative to the command's directory
    command = subprocess.Popen([sys.executable, "-c", ATTACH, "ready", "0"], env=env, cwd=prefect_home.parent,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found = _found(command)
    assert command.wait(PATIENCE_S) == 0, command.stderr.read()
    assert _record(prefect_home)["home"] == str(prefect_home.resolve())
    created = httpx.post(f"http://127.0.0.1:{found['port']}/api/flows/", json={"name": "relative-home"},
                         auth=tuple(found["auth"].split(":", 1)), timeout=PATIENCE_S)
    assert created.status_code in (200, 201), created.text  # its database is the migrated copy in that home
    assert not (prefect_home / prefect_home.name).exists()


def test_a_malformed_record_signals_nobody_and_a_failure_of_the_watchdog_stops_the_server(prefect_home):
    """A record naming pid 0 (every process of the group) or a pid that is no number is not a
    server's (pid -1, every process of the user, is refused by the same check: not run here, where
    a regression would signal the whole machine). The server the next command then starts stops,
    leaving no record, when its watchdog fails."""
    from importlib.metadata import version

    state = prefect_home / f"dprelease-local-server-{version('prefect')}.json"
    env = _env(prefect_home, idle_s=PATIENCE_S)
    for pid in (0, "123"):
        state.write_text(json.dumps({"pid": pid, "port": 8999, "auth": "dprelease:x", "version": version("prefect"),
                                     "started": 1.0, "home": str(prefect_home.resolve())}))
        stopped = subprocess.run([CLI, "server", "--stop"], env=env, capture_output=True, text=True, timeout=PATIENCE_S,
                                 start_new_session=True)
        assert stopped.returncode == 0, stopped.stderr  # not killed by its own SIGTERM
        assert "no local Prefect server runs" in stopped.stdout
    state.write_text(json.dumps({"pid": 0, "port": 8999, "auth": "dprelease:x", "version": version("prefect"),
                                 "started": 1.0, "home": str(prefect_home.resolve())}))
    found = _run(env)
    assert found["started"] and found["pid"] > 1
    _a_failure_of_its_watchdog_stops_it_leaving_no_record(prefect_home, found)


def _keeps_its_files_to_its_owner(prefect_home: Path) -> None:
    """After a call (the database and its journal are written), every file of the server in its
    home is its owner's only."""
    for name in ("dprelease-local-prefect-*.db*", "dprelease-local-server.log", "dprelease-local-server-*.json"):
        paths = list(prefect_home.glob(name))
        assert paths, f"no {name} in the home"
        for path in paths:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path.name} is readable by others"


#: a command that starts the home's server while it keeps the CPU its child runs on (real-time
#: priority on one CPU; the child gets the normal policy back): then, as the next command would,
#: it looks at once whether the recorded server runs
START_HOLDING_THE_CPU = textwrap.dedent("""
    import json, os, sys
    from dprelease.cli import local_prefect_server, prefect_server
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
    except PermissionError:
        print(json.dumps({"skip": "real-time scheduling is not permitted here"}))
        sys.exit(0)
    try:
        prefect_server.start()
        record = local_prefect_server.LocalServer(prefect_server._local.home).read_record()
        seen = local_prefect_server._runs(record)
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    print(json.dumps({"pid": record.pid, "started": prefect_server._local.process is not None, "runs": seen}))
""")


def test_a_started_server_is_recorded_once_it_is_seen_running(prefect_home):
    """Popen returns once the child's exec has closed its copy of the error pipe, before the kernel
    has set the new command line; a record written then names a process that looks not running
    (no module in /proc/<pid>/cmdline), and the next command replaced it while commands that had
    looked a moment later used it (two servers seen by four commands started at once, in CI). Here
    the starting command keeps the CPU, so the child cannot end its exec by chance before it."""
    env = _env(prefect_home, idle_s=PATIENCE_S)
    command = subprocess.run([sys.executable, "-c", START_HOLDING_THE_CPU], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=PATIENCE_S)
    assert command.returncode == 0, command.stderr
    found = json.loads(command.stdout.splitlines()[-1])
    if "skip" in found:
        pytest.skip(found["skip"])
    assert found["started"] and found["runs"], "the recorded server looked not running right after its start"


def _a_failure_of_its_watchdog_stops_it_leaving_no_record(prefect_home: Path, found: dict) -> None:
    """A server that stops on a failure of its watchdog (here: the users' lock file replaced by a
    directory it cannot open) is no longer the home's: no command finds it while it stops."""
    users = next(prefect_home.glob("dprelease-local-server-*.users"))
    users.unlink()
    users.mkdir()
    assert _gone(found["pid"], within_s=PATIENCE_S), "the server kept running without its watchdog"
    assert "watchdog failed" in (prefect_home / "dprelease-local-server.log").read_text()
    assert not list(prefect_home.glob("dprelease-local-server-*.json")), "a stopped server left its record"
