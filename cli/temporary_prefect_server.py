"""A command's temporary Prefect server (DPRELEASE_PREFECT_SERVER=temporary), and what every server
of ours starts from: the migrated template database, the environment, a free port.

Such a server lives as long as its command, the way Prefect's ephemeral mode does, with three
differences that make a release start and end faster and never collide with another command:

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

import fcntl
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 300
PREFECT_DB_ENV = "PREFECT_API_DATABASE_CONNECTION_URL"
SCRATCH_PREFIX = "dprelease-prefect-"
TEMPLATE_DIR_ENV = "DPRELEASE_PREFECT_TEMPLATE_DIR"  # the installation's templates elsewhere than sys.prefix/share/dprelease
OWNER_FILE = "owner.pid"
#: run as `python -c LAUNCHER OWNER_PID SOCKET_FD`: ask the kernel to SIGKILL this process when its
#: parent dies (PR_SET_PDEATHSIG = 1), give up if the parent is already gone, then serve Prefect's
#: API on the listening socket the parent bound and handed over (no port is ever free for another
#: process to take between a choice and a bind). Elsewhere than Linux the sweep alone cleans up.
LAUNCHER = """
import ctypes, os, signal, socket, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except (AttributeError, OSError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
import uvicorn
config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, log_level="error", lifespan="on")
uvicorn.Server(config).run(sockets=[socket.socket(fileno=int(sys.argv[2]))])
"""


class ServerUnavailable(RuntimeError):
    """A Prefect server of ours did not start or does not answer (one line at the command line)."""


def listening_socket() -> socket.socket:
    """A socket listening on 127.0.0.1, on a port the kernel chose: handed to the server process,
    so that no other local process can take the port first and pose as the server (it would
    receive the server's secret with the first call)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


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
    #: Prefect's basic authentication (user:secret): no other local user drives this command's runs
    auth: str = field(default_factory=lambda: f"dprelease:{secrets.token_urlsafe(24)}")

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def spawn(self) -> None:
        """Start the server process on a socket bound here (returns at once)."""
        sock = listening_socket()
        try:
            self.port = sock.getsockname()[1]
            self.process = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, str(os.getpid()), str(sock.fileno())], pass_fds=(sock.fileno(),),
                env=server_environment(self.database, self.prepared, self.auth), stdin=subprocess.DEVNULL)
        finally:
            sock.close()  # the server holds it now

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until the server answers /health (its socket listens from the start: a call waits
        in its queue until the app is up)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=10) as client:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    raise ServerUnavailable(f"the temporary Prefect server exited with code {code} before it was "
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
        raise ServerUnavailable(f"the temporary Prefect server did not answer within {timeout_s:.0f} s; set "
                                "PREFECT_API_URL to a running server, or try again when the machine is less busy")

    def kill(self) -> None:
        """End the process at once (its database is private: nothing to shut down gracefully)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None
        for directory in self.scratch:
            shutil.rmtree(directory, ignore_errors=True)




def server_environment(database: Path, prepared: bool, auth: str | None = None) -> dict[str, str]:
    """The environment of a server of ours: this command's Prefect settings, its own SQLite
    database, no UI, Prefect's ephemeral mode (no background services); `prepared`: the database
    is a template's copy (migrated, block types registered), so the start skips both; `auth`:
    Prefect's basic authentication for every API call but /health."""
    from prefect.settings import get_current_settings

    env = {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True),
           PREFECT_DB_ENV: f"sqlite+aiosqlite:///{database}",
           "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # nothing about the releases leaves the machine
    # Prefect's current names (they win over the older PREFECT_API_* aliases, also when a profile sets them)
    on_start = "false" if prepared else "true"  # the template's builder always migrates and registers
    env.update(PREFECT_SERVER_DATABASE_MIGRATE_ON_START=on_start, PREFECT_SERVER_REGISTER_BLOCKS_ON_START=on_start)
    if not prepared:  # Prefect skips a registration it remembers (PREFECT_HOME/memo_store.toml) for the
        env["PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION"] = "false"  # same path: a rebuilt template had none
    for name in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "PREFECT_SERVER_API_AUTH_STRING"):
        env.pop(name, None)
    if auth is not None:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth
    return env


def template_database() -> Path:
    """The migrated, empty Prefect database of this PREFECT_HOME: a copy of the installation's
    (installation_template), or, where the installation has none yet, built by the first command
    that needs it (under a file lock, so commands started at once build it once) and then offered to
    the installation, so that every later new home copies it instead of migrating again (issue 41:
    the build was 12 of the first release's 15 extra seconds)."""
    template = _template_path()
    template.parent.mkdir(parents=True, exist_ok=True)
    with open(template.parent / ".dprelease-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists() and not _copy_installation_template(template):
            _build_template(template)
            _offer_to_installation(template)
    return template


def installation_template() -> Path:
    """Where this installation (its Python environment, `sys.prefix`) keeps the migrated, empty
    database of its Prefect version, shared by every PREFECT_HOME it serves;
    DPRELEASE_PREFECT_TEMPLATE_DIR names another folder."""
    import prefect

    folder = os.environ.get(TEMPLATE_DIR_ENV, "").strip() or str(Path(sys.prefix) / "share" / "dprelease")
    return Path(folder).expanduser() / f"dprelease-empty-prefect-{prefect.__version__}.db"


def _copy_installation_template(template: Path) -> bool:
    """Copy the installation's template into this home (whole or not at all); False when there is none."""
    source = installation_template()
    if not source.exists():
        return False
    partial = template.with_suffix(".copy.partial")
    shutil.copyfile(source, partial)
    partial.replace(template)
    return True


def _offer_to_installation(template: Path) -> None:
    """Best effort: a copy of a freshly built template for the installation's later homes (an
    installation folder this user cannot write, e.g. a system Python's, keeps none: each home then
    builds its own, as before)."""
    target = installation_template()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
        os.close(fd)
        shutil.copyfile(template, partial)
        os.chmod(partial, 0o644)  # an empty database: nothing private; other users of the installation copy it
        os.replace(partial, target)  # whole or not at all; two homes offering at once both offer a good one
    except OSError:
        return


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
        raise ServerUnavailable("the Prefect server that built the template database registered no block types; "
                                "run the command with --debug, or set PREFECT_API_URL to a running server")
    partial.replace(template)  # other Prefect versions' templates stay: a PREFECT_HOME may serve two


def prefect_home() -> Path:
    from prefect.settings import PREFECT_HOME

    return Path(PREFECT_HOME.value()).expanduser()


def _template_path() -> Path:
    """Where this PREFECT_HOME keeps the migrated, empty Prefect database."""
    import prefect

    # one per Prefect version: its servers trust it to be migrated to that version's head
    return prefect_home() / f"dprelease-empty-prefect-{prefect.__version__}.db"


def existing_template() -> Path | None:
    """This home's template, or the installation's (copied in, at once), or None: one must be built."""
    template = _template_path()
    if template.exists() or installation_template().exists():
        return template_database()
    return None


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
