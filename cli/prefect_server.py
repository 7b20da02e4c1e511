"""The Prefect API a command's flow runs talk to: a shared one, the home's local one, or its own.

- **shared**: with PREFECT_API_URL (`dprelease server`, or a team's server; the setup for several
  controllers) or a database of the user's for Prefect's ephemeral mode, there is nothing to do;
- **local** (the default): the PREFECT_HOME's local server, started by the first command that
  needs one and reused by the next (cli/local_prefect_server.py): a release pays its boot once;
- **temporary** (DPRELEASE_PREFECT_SERVER=temporary): a server of the command's own, killed with it
  (cli/temporary_prefect_server.py).

`start()` finds or spawns the server and returns at once, so a server that boots does so beside the
command's own imports and planning; `wait_ready()` blocks only when the flow is about to run.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import local_prefect_server
from .temporary_prefect_server import (
    OWNER_FILE,
    PREFECT_DB_ENV,
    SCRATCH_PREFIX,
    ServerUnavailable,
    TemporaryServer,
    existing_template,
    prefect_home,
    sweep_leftovers,
    template_database,
)

_server: TemporaryServer | None = None  # this command's temporary server
_local: local_prefect_server.LocalServer | None = None  # this command's use of the home's local server


def _needs_own_server() -> bool:
    """No shared server configured, and no database of the user's for Prefect's ephemeral mode."""
    from prefect.settings import PREFECT_API_URL

    return not (PREFECT_API_URL.value() or os.environ.get(PREFECT_DB_ENV))


def check_mode() -> None:
    """Refuse an unknown DPRELEASE_PREFECT_SERVER in one line (ValueError) before the command checks
    anything else: a setting of the environment, said first, as every setting is (read from the
    environment alone: importing Prefect here would create PREFECT_HOME)."""
    local_prefect_server.wanted()


def start() -> None:
    """Find or spawn the server this command needs, if it needs one (returns at once; idempotent).
    When the template database does not exist yet, building it waits for `wait_ready`, so that a
    command refused for bad input never builds it."""
    global _server, _local
    if _server is not None or _local is not None or not _needs_own_server():
        return
    atexit.register(stop)  # registered before Prefect's own exit handlers, so it runs after them
    if local_prefect_server.wanted():
        _local = local_prefect_server.LocalServer(prefect_home())
        _local.attach(may_start=_local.database.exists() or existing_template() is not None)
        return
    sweep_leftovers()
    template = existing_template()
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    (scratch / OWNER_FILE).write_text(str(os.getpid()))
    _server = TemporaryServer(scratch / "prefect.db", scratch=[scratch])
    if template is not None:
        shutil.copyfile(template, _server.database)
        _server.spawn()


def attach_running(timeout_s: float = local_prefect_server.START_TIMEOUT_S) -> bool:
    """Point this process at the home's local server if one runs, never starting one: for the
    commands that answer or correct a run another command started. True when a Prefect API is set
    (shared, or the local server); False when runs live only in their commands' temporary servers.
    ServerUnavailable when the recorded server does not answer within timeout_s (by default as long
    as a start may take: a server busy with runs at load answers late, not never)."""
    global _local
    if not _needs_own_server():
        return True
    if not local_prefect_server.wanted():
        return False
    local = _local or local_prefect_server.LocalServer(prefect_home())
    if not local.attach(may_start=False):
        local.detach()
        return False
    _local = local
    local.wait_ready(timeout_s=timeout_s)
    _point_client_at(local.record.api_url, local.record.auth)
    return True


def attach_for_corrections(timeout_s: float = 10.0) -> None:
    """Best effort, for marking stopped runs Cancelled: the home's local server if it answers soon;
    the store has already been corrected, so a server that does not answer is only mentioned."""
    try:
        attach_running(timeout_s)
    except ServerUnavailable as err:
        print(f"dprelease: the runs stay as they were in Prefect: {err}", flush=True)


def own_server_started() -> bool:
    """This command spawned a server (a temporary one, or the home's local one): booting or up."""
    if _local is not None:
        return _local.process is not None
    return _server is not None and _server.process is not None


def wait_ready(warm: Callable[[], None] | None = None) -> None:
    """Make sure the Prefect API answers: wait for the server this command uses (calling `warm`
    first while one boots), then point this process's Prefect client at it. Returns at once with a
    shared server."""
    start()
    if _local is not None:
        if not _local.ready:
            if _local.record is None:  # the template had to be built first
                _local.attach(may_start=True)
            if warm is not None and _local.process is not None:  # it boots: warm up meanwhile
                warm()
            _local.wait_ready()
            _point_client_at(_local.record.api_url, _local.record.auth)
            if _local.process is not None:
                _announce(_local)
        return
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
    _point_client_at(_server.api_url, _server.auth)


def _announce(local: local_prefect_server.LocalServer) -> None:
    """Say that a process now runs beyond this command, for how long, and how to end it (on stdout,
    with the command's other news: stderr stays the one line of a refusal)."""
    idle = local_prefect_server.idle_words(local_prefect_server.idle_seconds())
    print(f"dprelease: started this PREFECT_HOME's local Prefect server on 127.0.0.1:{local.record.port} for the "
          f"next commands (it stops after {idle} unused; `dprelease server --stop` stops it now)", flush=True)


def _point_client_at(api_url: str, auth: str) -> None:
    """This process's Prefect client (and the flows it runs) talk to that server, with its secret."""
    from prefect.context import refresh_global_settings_context

    os.environ["PREFECT_API_URL"] = api_url
    os.environ["PREFECT_API_AUTH_STRING"] = auth
    refresh_global_settings_context()


def stop() -> None:
    """At exit, and before os._exit: kill this command's temporary server and remove its database;
    stop the local server this command started but never used (refused or interrupted before its
    flow) unless another command uses it. A local server in use is left to the next command."""
    if _server is not None:
        _server.kill()
    if _local is not None:
        _local.abandon_if_unused()
