"""The local Prefect server of a PREFECT_HOME: started by the first command that needs one, reused
by the commands after it, stopped when nobody has used it for a while.

Without PREFECT_API_URL a command needs a Prefect API of its own. Booting a server is the largest
fixed cost of a release on one machine (2.6 s of Prefect's imports and start, on a 2-core machine
beside the command's own work), so the server outlives the command that started it, as the
shared server of `dprelease server` does, and later commands only attach to it (milliseconds).
`DPRELEASE_PREFECT_SERVER=temporary` brings back a server per command (cli/temporary_prefect_server.py).

How it stays correct with several commands and faults:

- **who uses it**: every command attached to the server holds a shared `flock` on
  `<PREFECT_HOME>/dprelease-local-server-<version>.users` for its whole life; the kernel drops it
  when the command ends, by kill -9 too. The server polls that lock: while it cannot take it
  exclusively someone uses it; once nobody has for `DPRELEASE_LOCAL_SERVER_IDLE_S` seconds
  (default 1800) it takes the lock exclusively and shuts down holding it, so no command attaches to
  a server that is stopping (an attaching command waits for the exit, then starts a new one).
- **one server per home and Prefect version**: finding or starting it happens under an exclusive
  `flock` (`...start.lock`); its record (pid, port, secret, home) is a file of this home readable by
  its owner only, and a server whose record no longer names it (a new one was started, the record
  was removed or damaged, the home deleted or copied) stops by itself. A record is trusted only if
  it is well-formed, names this home, and its process still runs with the start time recorded (a
  reused pid is not it) and as this module; a process it names is never signalled otherwise. A
  command uses a server only if the record still names it once it has answered, and starts another
  only once the recorded one no longer runs (looked at again under the lock); a server stopping on
  a failure of its own removes its record first, so no command finds it on its way out.
- **nobody else drives it**: the command binds the listening socket on 127.0.0.1 (a port the
  kernel picks) and hands it to the server, so no other process can take the port first and pose
  as the server; every call but /health needs Prefect's basic authentication with a random secret
  kept in the record; the server's database and log are its owner's only (umask 077).
- **its own database**: `dprelease-local-prefect-<version>.db` in the home, first a copy of the
  migrated template (cli/temporary_prefect_server.template_database), so it starts without
  migrating; the runs it holds stay for the UI and `prefect` commands (not Prefect's default
  database, which a `prefect server start` of the user's could open at the same time).
- **detached**: its own session, its output in `dprelease-local-server.log`, so that it never holds
  a terminal's or a CI job's pipes, nor dies with the terminal's Ctrl-C.
"""

from __future__ import annotations

import fcntl
import functools
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .temporary_prefect_server import ServerUnavailable, listening_socket, server_environment, template_database

MODE_ENV = "DPRELEASE_PREFECT_SERVER"  # "local" (the default) or "temporary"
IDLE_ENV = "DPRELEASE_LOCAL_SERVER_IDLE_S"
DEFAULT_IDLE_S = 1800.0
POLL_S = 1.0  # how often the server looks whether anyone uses it and whether it is still the recorded one
STOP_GRACE_S = 20.0  # a clean stop that takes longer than this is cut short
MAX_STARTS = 5  # servers started in a row that died before answering
START_TIMEOUT_S = 300.0
SERVER_MODULE = "dprelease.cli.local_prefect_server"  # in the server's command line: how a record's process is recognised
_HAS_PROC = Path("/proc/self/stat").exists()


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
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{IDLE_ENV}={raw!r} is not a number of seconds above 0: give e.g. 1800 (30 minutes)")
    return value


def idle_words(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"


@dataclass(frozen=True)
class ServerRecord:
    """What the record file says about the running server."""

    pid: int
    port: int
    auth: str  # Prefect's basic-auth string, "user:secret"
    version: str  # Prefect's version
    started: float  # the process's start, as the kernel counts it (a reused pid starts later)
    home: str  # the resolved PREFECT_HOME it serves (a copied home's record is not its own)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @classmethod
    def parse(cls, text: str) -> ServerRecord | None:
        """The record, or None when it is not one (damaged, or from an older layout)."""
        try:
            fields = json.loads(text)
            record = cls(**fields)
        except (ValueError, TypeError):
            return None
        well_formed = (type(record.pid) is int and record.pid > 1 and type(record.port) is int
                       and 0 < record.port < 65536 and isinstance(record.auth, str) and ":" in record.auth
                       and isinstance(record.version, str) and isinstance(record.home, str)
                       and isinstance(record.started, int | float))
        return record if well_formed else None


@dataclass
class LocalServer:
    """This command's attachment to the home's local server."""

    home: Path
    record: ServerRecord | None = None
    process: subprocess.Popen | None = None  # set when this command started it
    ready: bool = False
    _users: object = None  # the open lock file whose shared lock says this command uses the server

    def __post_init__(self) -> None:
        self.home = Path(self.home).expanduser().resolve()  # a relative home would mean another in the server

    # --- where things are ------------------------------------------------------------------------
    def _named(self, what: str) -> Path:
        return self.home / f"dprelease-local-{what}".replace("<version>", _prefect_version())

    @property
    def state_file(self) -> Path:
        return self._named("server-<version>.json")

    @property
    def users_lock(self) -> Path:
        return self._named("server-<version>.users")

    @property
    def start_lock(self) -> Path:
        return self._named("server-<version>.start.lock")

    @property
    def database(self) -> Path:
        return self._named("prefect-<version>.db")

    @property
    def log_file(self) -> Path:
        return self._named("server.log")

    # --- a command's side ------------------------------------------------------------------------
    def attach(self, may_start: bool = True) -> bool:
        """Take the users' lock, then find the running server or (may_start) start one. Returns at
        once: a server started here boots while the command goes on (`wait_ready`). False when no
        server runs and none may be started."""
        if not self.home.exists():
            self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self._users is None:
            self._users = open(self.users_lock, "a")  # noqa: SIM115 - held until the command ends
            fcntl.flock(self._users, fcntl.LOCK_SH)  # waits while a server that found itself idle stops
        with _locked(self.start_lock):
            record = self.read_record()
            if record is not None and _runs(record):
                self.record = record
                return True
            if not may_start:
                return False
            self._start()
        return True

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until the server the home keeps answers as this home's. The record is read again
        after the answer: a server that answered but is no longer the recorded one (replaced, or
        stopping) is never reported. Another is started only once the recorded one has stopped."""
        deadline = time.monotonic() + timeout_s
        lost = 0
        while time.monotonic() < deadline:
            if self._kept():  # first: a dead server's port may be someone else's
                if _answers(self.record) and self._kept():
                    self.ready = True
                    return
                time.sleep(0.05)
                continue
            lost += 1
            if lost > MAX_STARTS:
                raise ServerUnavailable(f"the local Prefect server stopped before it was ready {MAX_STARTS} "
                                        f"times; see {self.log_file}, or set PREFECT_API_URL to a running server")
            with _locked(self.start_lock):
                record = self.read_record()
                if record is not None and _runs(record):  # it runs: never replaced while it does
                    if record != self.record:
                        self.process = None  # another command started the one the home keeps now
                    self.record = record
                else:
                    self.process = None
                    self._start()
        raise ServerUnavailable(f"the local Prefect server did not answer within {timeout_s:.0f} s (see "
                                f"{self.log_file}); `dprelease server --stop`, or try again when the machine is "
                                "less busy")

    def _kept(self) -> bool:
        """The server this command holds is the one the home's record names, and it runs."""
        alive = _runs(self.record) and (self.process is None or self.process.poll() is None)
        return alive and self.read_record() == self.record

    def detach(self) -> None:
        """Stop using the server (also done by the kernel when the command ends)."""
        if self._users is not None:
            self._users.close()
            self._users = None

    def abandon_if_unused(self) -> None:
        """At the end of a command that started a server it never used (refused before its flow):
        stop that server unless another command uses it, so that no refused command leaves one."""
        if self.process is None or self.ready:
            return
        self.detach()
        with open(self.users_lock, "a") as users:
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another command attached to it meanwhile: it is theirs now
            with _locked(self.start_lock):
                if self.read_record() == self.record:
                    self.state_file.unlink(missing_ok=True)
            self.process.kill()
            self.process.wait(10)

    def _start(self) -> None:
        """Spawn the server (under the start lock) and record it."""
        if not self.database.exists():
            fd, partial = tempfile.mkstemp(dir=self.home, prefix=".dprelease-local-prefect-", suffix=".partial")
            os.close(fd)  # created 0600: the copy keeps that mode
            shutil.copyfile(template_database(), partial)
            os.replace(partial, self.database)
        auth = f"dprelease:{secrets.token_urlsafe(24)}"
        env = server_environment(self.database, prepared=True, auth=auth)
        env.update({IDLE_ENV: str(idle_seconds()), "PREFECT_HOME": str(self.home)})
        sock = listening_socket()
        log = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", SERVER_MODULE, str(self.home), str(sock.fileno())], env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(sock.fileno(),), start_new_session=True,
                cwd=self.home)
            port = sock.getsockname()[1]
        finally:
            sock.close()  # the server holds it now
            os.close(log)
        self.record = ServerRecord(pid=self.process.pid, port=port, auth=auth, version=_prefect_version(),
                                   started=_start_time(self.process.pid), home=str(self.home))
        seen_by = time.monotonic() + START_TIMEOUT_S  # a bound only a process that never shows its command line meets
        while not _runs(self.record) and self.process.poll() is None and time.monotonic() < seen_by:
            time.sleep(0.001)  # its exec is still under way (see _runs): recorded now, it would look dead to the next
            # command, which would replace it
        _write_private(self.state_file, json.dumps(asdict(self.record)))

    def read_record(self) -> ServerRecord | None:
        """The record of this home's server, if there is a well-formed one for this home."""
        try:
            record = ServerRecord.parse(self.state_file.read_text())
        except OSError:
            return None
        if record is None or record.version != _prefect_version() or record.home != str(self.home):
            return None
        return record


def stop_running(home: Path) -> str:
    """End the home's local server now, unless a command uses it (what `dprelease server --stop` does)."""
    server = LocalServer(home)
    if not server.state_file.exists():
        return "no local Prefect server runs for this PREFECT_HOME"
    with open(server.users_lock, "a") as users:
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServerUnavailable("the local Prefect server is in use by a running command; stop it when that "
                                    "command has ended") from None
        with _locked(server.start_lock):
            record = server.read_record()
            if record is not None and _runs(record):
                os.kill(record.pid, signal.SIGTERM)  # first: a server whose record is gone also stops by itself
            server.state_file.unlink(missing_ok=True)
        if record is None or not _runs(record):
            return "no local Prefect server runs for this PREFECT_HOME (a stale record was removed)"
        _wait_gone(record, STOP_GRACE_S + 5)
    return f"stopped the local Prefect server (process {record.pid}, port {record.port})"


# --- the server's side -------------------------------------------------------------------------
def serve(home: Path, fd: int) -> None:
    """Run Prefect's API on the listening socket handed over until nobody has used it for the idle
    time, or until the home's record no longer names this process."""
    os.umask(0o077)  # the database, its journal and the log hold the runs: the owner's only
    import uvicorn

    local = LocalServer(home)
    users = open(local.users_lock, "a")  # noqa: SIM115 - kept until the process ends
    local.read_record()  # the record's name is the Prefect version (importlib.metadata): loaded here, see _watch
    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    threading.Thread(target=_watch, args=(server, local, users, idle_seconds()), name="idle-watch",
                     daemon=True).start()
    server.run(sockets=[socket.socket(fileno=fd)])


def _watch(server, local: LocalServer, users, idle_s: float) -> None:
    """The server's watchdog: any failure of its own (the home deleted under it) ends the process,
    never leaves a server nobody can stop. It imports nothing (serve loads what it needs first): it
    starts while the main thread imports Prefect's app, importlib.metadata among it, and an import
    racing another thread's can fail (CPython's module locks see a deadlock, or hand over a
    half-initialised module), which would stop a server that may just have answered a command."""
    try:
        _stop_when_idle_or_replaced(server, local, users, idle_s)
    except BaseException as err:  # noqa: BLE001 - a dead watchdog would keep the server forever
        print(f"dprelease: the local server's watchdog failed ({err!r}): stopping", file=sys.stderr, flush=True)
        try:
            _forget_record(local)  # no command finds (nor reports) a server that is stopping
        except OSError:
            pass  # the home is gone with its record
    server.should_exit = True
    time.sleep(STOP_GRACE_S)
    os._exit(0)  # a stop that hangs must not keep the users' lock forever


def _stop_when_idle_or_replaced(server, local: LocalServer, users, idle_s: float) -> None:
    """Return once the users' lock (the open file `users`) has been free for idle_s (then holding
    it, and the record removed), or once the record names another process or none (nothing to
    remove then)."""
    last_used = time.monotonic()
    while True:
        time.sleep(POLL_S)
        if server.started and (local.read_record() or _NO_RECORD).pid != os.getpid():
            return  # replaced or forgotten: a second server on the database must not stay
        if os.fstat(users.fileno()).st_ino != _inode(local.users_lock):  # the file was removed or replaced
            try:  # a command may still hold the old one
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(users, fcntl.LOCK_UN)
                users.close()
                users = open(local.users_lock, "a")  # noqa: SIM115 - the file new commands lock
            except BlockingIOError:
                last_used = time.monotonic()
                continue
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            last_used = time.monotonic()
            continue
        if time.monotonic() - last_used < idle_s:
            fcntl.flock(users, fcntl.LOCK_UN)
            continue
        _forget_record(local)  # the record goes first: nobody finds a server that is stopping
        return


def _forget_record(local: LocalServer) -> None:
    """Remove the home's record if it still names this process (under the start lock, which
    commands hold while they find or start the server)."""
    with _locked(local.start_lock):
        record = local.read_record()
        if record is not None and record.pid == os.getpid():
            local.state_file.unlink(missing_ok=True)


# --- helpers ------------------------------------------------------------------------------------
_NO_RECORD = ServerRecord(pid=-1, port=0, auth="", version="", started=0.0, home="")


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


@functools.cache
def _prefect_version() -> str:
    from importlib.metadata import version

    return version("prefect")


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds the server's secret), replacing it at once."""
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")  # 0600, new
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (None when the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _start_time(pid: int) -> float:
    """When the kernel started the process (clock ticks since boot; 0 where /proc is missing)."""
    fields = _proc_stat(pid) if _HAS_PROC else None
    return float(fields[19]) if fields else 0.0


def _runs(record: ServerRecord | None) -> bool:
    """The recorded process is still the one that was started: alive, not a zombie, the start time
    recorded, this module in its command line (a reused pid is not it). Not yet true when Popen has
    just returned: Popen returns once the child's exec has closed its copy of the error pipe, and
    the kernel sets the new command line only after that (until then /proc/<pid>/cmdline is empty:
    at first read after every one of 300 spawns, for a median 0.1 ms, up to 59 ms at load 10)."""
    if record is None or record.pid <= 1:
        return False
    if not _HAS_PROC:  # elsewhere than Linux: alive is all there is to know (the answer decides)
        try:
            os.kill(record.pid, 0)
        except OSError:
            return False
        return True
    fields = _proc_stat(record.pid)
    if fields is None or fields[0] == "Z" or float(fields[19]) != record.started:
        return False
    try:
        command = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return SERVER_MODULE.encode() in command


def _answers(record: ServerRecord | None) -> bool:
    """The server answers with this Prefect version to these credentials (a call waits in the
    socket's queue while the server boots)."""
    if record is None:
        return False
    import httpx

    try:
        response = httpx.get(f"{record.api_url}/admin/version", auth=tuple(record.auth.split(":", 1)), timeout=10)
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
