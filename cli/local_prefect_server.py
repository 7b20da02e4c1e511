"""The local Prefect server of a PREFECT_HOME: started by the first command that needs one, reused
by the commands after it, stopped when nobody has used it for a while.

Without PREFECT_API_URL a command needs a Prefect API of its own. Booting a server is the largest
fixed cost of a release on one machine (2.6 s of Prefect's imports and start, on a 2-core machine
beside the command's own work), so the server outlives the command that started it, as the
shared server of `dprelease server` does, and later commands only attach to it (milliseconds).
`DPRELEASE_PREFECT_SERVER=temporary` brings back a server per command (cli/temporary_prefect_server.py).

How it stays correct with several commands and faults:

- **who uses it**: every command attached to the server holds a shared `flock` on
  `<PREFECT_HOME>/dprelease-local-server.users` for its whole life; the kernel drops it when the
  command ends, by kill -9 too. The server polls that lock: while it cannot take it exclusively
  someone uses it; once nobody has for `DPRELEASE_LOCAL_SERVER_IDLE_S` seconds (default 1800) it
  takes the lock exclusively and shuts down holding it, so no command attaches to a server that is
  stopping (an attaching command waits for the exit, then starts a new one).
- **one server per home and Prefect version**: finding or starting it happens under an exclusive
  `flock` (`...start.lock`); its state (pid, port, credentials) is a file of this home, readable
  by its owner only; a recorded server is reused only if that process still runs and answers with
  this Prefect version and these credentials (a stale file, a reused pid or port is replaced).
- **nobody else drives it**: it listens on 127.0.0.1 with Prefect's basic authentication and a
  random secret kept in the state file, so another local user cannot read or change its runs.
- **its own database**: `dprelease-local-prefect-<version>.db` in the home, first a copy of the
  migrated template (cli/temporary_prefect_server.template_database), so it starts without migrating; the
  runs it holds stay for the UI and `prefect` commands (not Prefect's default database, which a
  `prefect server start` of the user's could open at the same time).
- **detached**: its own session, its output in `dprelease-local-server.log`, so that it never holds
  a terminal's or a CI job's pipes, nor dies with the terminal's Ctrl-C.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .temporary_prefect_server import free_port, server_environment, template_database

MODE_ENV = "DPRELEASE_PREFECT_SERVER"  # "local" (the default) or "temporary"
IDLE_ENV = "DPRELEASE_LOCAL_SERVER_IDLE_S"
DEFAULT_IDLE_S = 1800.0
POLL_S = 1.0  # how often the server looks whether anyone uses it
STOP_GRACE_S = 20.0  # a clean stop that takes longer than this is cut short
MAX_STARTS = 5  # servers started in a row that died before answering (a port taken meanwhile, ...)
START_TIMEOUT_S = 300.0


def wanted() -> bool:
    """Commands of this process use the home's local server (not one of their own)."""
    mode = os.environ.get(MODE_ENV, "local").strip().lower() or "local"
    if mode not in ("local", "temporary"):
        raise ValueError(f"{MODE_ENV}={mode!r} is not a server mode: use 'local' (one server per PREFECT_HOME, "
                         "kept between commands) or 'temporary' (one per command)")
    return mode == "local"


def idle_seconds() -> float:
    raw = os.environ.get(IDLE_ENV, "")
    try:
        value = float(raw) if raw.strip() else DEFAULT_IDLE_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{IDLE_ENV}={raw!r} is not a number of seconds above 0: give e.g. 1800 (30 minutes)")
    return value


@dataclass
class ServerRecord:
    """What the state file says about the running server."""

    pid: int
    port: int
    auth: str  # Prefect's basic-auth string, "user:secret"
    version: str  # Prefect's version
    started: float  # the process's start, as the kernel counts it (a reused pid starts later)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"


@dataclass
class LocalServer:
    """This command's attachment to the home's local server."""

    home: Path
    record: ServerRecord | None = None
    process: subprocess.Popen | None = None  # set when this command started it
    ready: bool = False
    _users: object = None  # the open lock file whose shared lock says this command uses the server

    # --- where things are ------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.home / f"dprelease-local-server-{_prefect_version()}.json"

    @property
    def users_lock(self) -> Path:
        return self.home / "dprelease-local-server.users"

    @property
    def start_lock(self) -> Path:
        return self.home / "dprelease-local-server.start.lock"

    @property
    def database(self) -> Path:
        return self.home / f"dprelease-local-prefect-{_prefect_version()}.db"

    @property
    def log_file(self) -> Path:
        return self.home / "dprelease-local-server.log"

    # --- a command's side ------------------------------------------------------------------------
    def attach(self, may_start: bool = True) -> bool:
        """Take the users' lock, then find the running server or (may_start) start one. Returns at
        once: a server started here boots while the command goes on (`wait_ready`). False when no
        server runs and none may be started."""
        self.home.mkdir(parents=True, exist_ok=True)
        if self._users is None:
            self._users = open(self.users_lock, "a")  # noqa: SIM115 - held until the command ends
            fcntl.flock(self._users, fcntl.LOCK_SH)  # waits while a server that found itself idle stops
        with _locked(self.start_lock):
            record = self._read_state()
            if _runs(record):
                self.record = record
                return True
            if not may_start:
                return False
            self._start()
        return True

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until the server answers as this home's (starting another if it died while booting)."""
        deadline = time.monotonic() + timeout_s
        starts = 0
        while time.monotonic() < deadline:
            if _answers(self.record):
                self.ready = True
                return
            if not _runs(self.record) or (self.process is not None and self.process.poll() is not None):
                starts += 1
                if starts > MAX_STARTS:
                    raise RuntimeError(f"the local Prefect server stopped before it was ready {MAX_STARTS} times; "
                                       f"see {self.log_file}, or set PREFECT_API_URL to a running server")
                self.process = None
                with _locked(self.start_lock):
                    record = self._read_state()
                    if record is not None and record != self.record and _runs(record):
                        self.record = record  # another command started the next one
                    else:
                        self._start()
                continue
            time.sleep(0.05)
        raise RuntimeError(f"the local Prefect server did not answer within {timeout_s:.0f} s (see {self.log_file}); "
                           "set PREFECT_API_URL to a running server, or try again when the machine is less busy")

    def detach(self) -> None:
        """Stop using the server (also done by the kernel when the command ends)."""
        if self._users is not None:
            self._users.close()
            self._users = None

    def _start(self) -> None:
        """Spawn the server (under the start lock) and record it."""
        if not self.database.exists():
            partial = self.database.with_suffix(".partial")
            shutil.copyfile(template_database(), partial)
            partial.replace(self.database)
        port = free_port()
        auth = f"dprelease:{secrets.token_urlsafe(24)}"
        env = server_environment(self.database, prepared=True, auth=auth)
        env[IDLE_ENV] = str(idle_seconds())
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cli.local_prefect_server", str(self.home), str(port)],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                cwd=self.home)
        self.record = ServerRecord(pid=self.process.pid, port=port, auth=auth, version=_prefect_version(),
                                   started=_start_time(self.process.pid))
        _write_private(self.state_file, json.dumps(asdict(self.record)))

    def _read_state(self) -> ServerRecord | None:
        try:
            record = ServerRecord(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        return record if record.version == _prefect_version() else None


def stop_running(home: Path) -> str:
    """End the home's local server now, unless a command uses it (what `dprelease server --stop` does)."""
    server = LocalServer(home)
    if not server.state_file.exists():
        return "no local Prefect server runs for this PREFECT_HOME"
    with open(server.users_lock, "a") as users:
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError("the local Prefect server is in use by a running command; stop it when that "
                               "command has ended") from None
        with _locked(server.start_lock):
            record = server._read_state()
            server.state_file.unlink(missing_ok=True)
        if record is None or not _runs(record):
            return "no local Prefect server runs for this PREFECT_HOME (a stale record was removed)"
        os.kill(record.pid, signal.SIGTERM)
        _wait_gone(record, STOP_GRACE_S + 5)
    return f"stopped the local Prefect server (process {record.pid}, port {record.port})"


# --- the server's side -------------------------------------------------------------------------
def serve(home: Path, port: int) -> None:
    """Run Prefect's API on 127.0.0.1:port until nobody has used it for the idle time."""
    import uvicorn

    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=port,
                            log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    threading.Thread(target=_stop_when_idle, args=(server, LocalServer(home), idle_seconds()),
                     name="idle-watch", daemon=True).start()
    server.run()


def _stop_when_idle(server, local: LocalServer, idle_s: float) -> None:
    """Ask uvicorn to stop once the users' lock has been free for idle_s; hold it while stopping."""
    last_used = time.monotonic()
    users = open(local.users_lock, "a")  # noqa: SIM115 - kept until the process ends
    while True:
        time.sleep(POLL_S)
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            last_used = time.monotonic()
            continue
        if time.monotonic() - last_used < idle_s:
            fcntl.flock(users, fcntl.LOCK_UN)
            continue
        with _locked(local.start_lock):  # the record goes first: nobody finds a server that is stopping
            record = local._read_state()
            if record is not None and record.pid == os.getpid():
                local.state_file.unlink(missing_ok=True)
        server.should_exit = True
        time.sleep(STOP_GRACE_S)
        os._exit(0)  # a stop that hangs must not keep the users' lock forever


# --- helpers ------------------------------------------------------------------------------------
class _locked:
    """An exclusive flock on a file for the duration of a with-block."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.file = open(self.path, "a")  # noqa: SIM115
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


def _prefect_version() -> str:
    from importlib.metadata import version

    return version("prefect")


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds the server's secret), replacing it at once."""
    partial = path.with_suffix(".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    partial.replace(path)


def _start_time(pid: int) -> float:
    """When the kernel started the process (clock ticks since boot; 0 where /proc is missing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    return float(stat.rsplit(")", 1)[1].split()[19])


def _runs(record: ServerRecord | None) -> bool:
    """The recorded process is still the one that was started (not a reused pid, not a zombie)."""
    if record is None:
        return False
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process took the pid
        return False
    try:
        state = Path(f"/proc/{record.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True  # no /proc: the answer of the server decides (_answers)
    return state != "Z" and _start_time(record.pid) == record.started


def _answers(record: ServerRecord | None) -> bool:
    """The server answers with this Prefect version to these credentials."""
    if record is None:
        return False
    import httpx

    try:
        response = httpx.get(f"{record.api_url}/admin/version", auth=tuple(record.auth.split(":", 1)), timeout=5)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and response.json() == record.version


def _wait_gone(record: ServerRecord, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _runs(record) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _runs(record):
        os.kill(record.pid, signal.SIGKILL)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]))
