"""This command's temporary Prefect server, when no shared one is configured.

A command that runs a flow needs a Prefect API. With PREFECT_API_URL (a shared server: the setup
for several controllers) there is nothing to do. Without it the command runs its own server, the
way Prefect's ephemeral mode does, with three differences that make a release start and end faster
and never collide with another command:

- **a private database**: a copy of a migrated, empty Prefect database kept in PREFECT_HOME (built
  once per Prefect version, under a file lock), so that commands started at once never share a
  SQLite file (two servers on one file fail with "database is locked") and no command pays for the
  migrations or the block types' registration (the copy holds both: its server skips them);
- **started early, awaited late**: `start()` only spawns the server process and returns, so it
  boots on the other core while this command imports and plans; `wait_ready()` blocks only when the
  flow is about to run, and spends the wait importing what the flow will need (`warm`);
- **killed at the end**: the database is private and deleted when the command ends, so there is
  nothing to shut down gracefully (Prefect's own stop waits up to 5 s for it);
- **never outlives the command**: the server gets SIGKILL when the command dies, even by kill -9
  (Linux's parent-death signal, set by a two-line launcher before it becomes uvicorn), and the
  next command removes private databases whose command is gone.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 300
PREFECT_DB_ENV = "PREFECT_API_DATABASE_CONNECTION_URL"
_PORTS = range(8000, 9000)  # Prefect's own range for temporary servers
_PORT_IN_USE = 3  # uvicorn's exit code when its port was taken between our check and its bind
SCRATCH_PREFIX = "dprelease-prefect-"
OWNER_FILE = "owner.pid"
#: run as `python -c LAUNCHER OWNER_PID UVICORN_ARGS...`: ask the kernel to SIGKILL this process
#: when its parent dies (PR_SET_PDEATHSIG = 1; kept across exec), give up if the parent is already
#: gone, then become uvicorn. Elsewhere than Linux the sweep alone cleans up.
LAUNCHER = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except (AttributeError, OSError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
os.execv(sys.executable, [sys.executable, "-m", "uvicorn", *sys.argv[2:]])
"""


@dataclass
class TemporaryServer:
    """A server process of this command, on its private database."""

    database: Path
    process: subprocess.Popen | None = None
    port: int = 0
    ready: bool = False
    scratch: list[Path] = field(default_factory=list)  # directories removed when the command ends
    #: the database is a copy of this Prefect version's template, already migrated and holding every
    #: block type: the server skips both at its start (boot 3.0 -> 2.6 s, medians of 5 alternating)
    prepared: bool = True

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def spawn(self) -> None:
        """Start the server process on a free port (returns at once)."""
        from prefect.settings import get_current_settings

        self.port = _free_port()
        env = {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True),
               PREFECT_DB_ENV: f"sqlite+aiosqlite:///{self.database}",
               "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        # Prefect's current names (they win over the older PREFECT_API_* aliases, also when a profile sets them)
        on_start = "false" if self.prepared else "true"  # the template's builder always migrates and registers
        env.update(PREFECT_SERVER_DATABASE_MIGRATE_ON_START=on_start, PREFECT_SERVER_REGISTER_BLOCKS_ON_START=on_start)
        if not self.prepared:  # Prefect skips a registration it remembers (PREFECT_HOME/memo_store.toml) for the
            env["PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION"] = "false"  # same path: a rebuilt template had none
        env.pop("PREFECT_API_URL", None)
        import prefect

        self.process = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(os.getpid()), "--app-dir", str(prefect.__module_path__.parent),
             "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"],
            env=env, stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until the server answers /health (respawning on a port taken meanwhile)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code == _PORT_IN_USE:
                    self.spawn()
                    continue
                if code is not None:
                    raise RuntimeError(f"the temporary Prefect server exited with code {code} before it was "
                                       "ready; run the command with --debug, or set PREFECT_API_URL to a "
                                       "running server")
                try:
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        self.ready = True
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"the temporary Prefect server did not answer within {timeout_s:.0f} s; set "
                           "PREFECT_API_URL to a running server, or try again when the machine is less busy")

    def kill(self) -> None:
        """End the process at once (its database is private: nothing to shut down gracefully)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None
        for directory in self.scratch:
            shutil.rmtree(directory, ignore_errors=True)


_server: TemporaryServer | None = None


def _free_port() -> int:
    for _ in range(50):
        port = random.choice(_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in 8000-8999 for a temporary Prefect server; set PREFECT_API_URL to a "
                       "running server")


def _needs_own_server() -> bool:
    """No shared server configured, and no database of the user's for Prefect's ephemeral mode."""
    from prefect.settings import PREFECT_API_URL

    return not (PREFECT_API_URL.value() or os.environ.get(PREFECT_DB_ENV))


def template_database() -> Path:
    """The migrated, empty Prefect database of this PREFECT_HOME (built by the first command that
    needs it, under a file lock, so commands started at once build it once)."""
    template = _template_path()
    template.parent.mkdir(parents=True, exist_ok=True)
    with open(template.parent / ".dprelease-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            _build_template(template)
    return template


def _build_template(template: Path) -> None:
    """A server on a new database applies every migration before it answers; then it is stopped and
    the database made one self-contained file."""
    import sqlite3

    partial = template.with_suffix(".partial")
    for leftover in partial.parent.glob(partial.name + "*"):
        leftover.unlink()
    builder = TemporaryServer(partial, prepared=False)  # it migrates and registers the block types
    builder.spawn()
    try:
        builder.wait_ready()
    finally:
        if builder.process is not None:
            builder.process.terminate()  # a clean stop: this file is kept
            try:
                builder.process.wait(30)
            except subprocess.TimeoutExpired:
                builder.process.kill()
                builder.process.wait(10)
    with sqlite3.connect(partial) as db:  # fold the write-ahead log in
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode=DELETE")
        kinds = db.execute("SELECT count(*) FROM block_type").fetchone()[0]
    if not kinds:  # its copies' servers skip the registration: a template without block types is refused
        partial.unlink()
        raise RuntimeError("the Prefect server that built the template database registered no block types; run "
                           "the command with --debug, or set PREFECT_API_URL to a running server")
    partial.replace(template)  # other Prefect versions' templates stay: a PREFECT_HOME may serve two


def start() -> None:
    """Spawn this command's server if it needs one (returns at once; idempotent). When the template
    database does not exist yet, building it waits for `wait_ready`, so that a command refused for
    bad input never builds it."""
    global _server
    if _server is not None or not _needs_own_server():
        return
    sweep_leftovers()
    template = _existing_template()
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    (scratch / OWNER_FILE).write_text(str(os.getpid()))
    _server = TemporaryServer(scratch / "prefect.db", scratch=[scratch])
    atexit.register(stop)  # registered before Prefect's own exit handlers, so it runs after them
    if template is not None:
        shutil.copyfile(template, _server.database)
        _server.spawn()


def own_server_started() -> bool:
    """This command spawned a temporary server (and it is booting or up)."""
    return _server is not None and _server.process is not None


def _template_path() -> Path:
    """Where this PREFECT_HOME keeps the migrated, empty Prefect database."""
    from prefect.settings import PREFECT_HOME

    import prefect

    # one per Prefect version: its servers trust it to be migrated to that version's head
    return Path(PREFECT_HOME.value()).expanduser() / f"dprelease-empty-prefect-{prefect.__version__}.db"


def _existing_template() -> Path | None:
    template = _template_path()
    return template if template.exists() else None


def wait_ready(warm: Callable[[], None] | None = None) -> None:
    """Make sure the Prefect API answers: wait for this command's server (calling `warm` first while
    it boots), then point this process's Prefect client at it. Returns at once with a shared server."""
    start()
    if _server is None:  # a shared server: nothing to wait for (the caller warms up when it suits it)
        return
    if _server.ready:
        return
    if _server.process is None:  # the template had to be built first
        shutil.copyfile(template_database(), _server.database)
        _server.spawn()
    if warm is not None:
        warm()
    _server.wait_ready()
    from prefect.context import refresh_global_settings_context

    os.environ["PREFECT_API_URL"] = _server.api_url
    refresh_global_settings_context()


def sweep_leftovers() -> list[Path]:
    """Remove the private databases of commands that died without cleaning up (kill -9): their
    server died with them (parent-death signal); the directory says whose it was."""
    removed = []
    for scratch in Path(tempfile.gettempdir()).glob(SCRATCH_PREFIX + "*"):
        try:
            owner = int((scratch / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being set up
        if not _alive(owner):
            shutil.rmtree(scratch, ignore_errors=True)
            removed.append(scratch)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def stop() -> None:
    """Kill this command's server and remove its database (at exit, and before os._exit)."""
    if _server is not None:
        _server.kill()
