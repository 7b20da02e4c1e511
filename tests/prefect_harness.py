"""Prefect's own `prefect_test_harness`, started on a copy of the migrated empty Prefect database the
CLI keeps (cli/temporary_prefect_server.py) instead of an empty file: its server then finds every
migration applied and answers in about 3 s instead of 7 (14 under the suite's load). Ten harnesses
start in a suite run; everything else is Prefect's harness, unchanged."""

from __future__ import annotations

import shutil
import types
from contextlib import contextmanager
from pathlib import Path

from patience import PATIENCE_S

#: the file prefect_test_harness (Prefect 3.8) names as its database, inside the folder it makes
HARNESS_DATABASE = "prefect-test.db"


class _PatientHttpx(types.ModuleType):
    """httpx, but for a Client made without a timeout, which waits PATIENCE_S for an answer."""

    def __init__(self, httpx) -> None:
        super().__init__("httpx")
        self._httpx = httpx

    def __getattr__(self, name):
        return getattr(self._httpx, name)

    def Client(self, *args, **kwargs):  # noqa: N802 - httpx's name
        return self._httpx.Client(*args, **{"timeout": PATIENCE_S, **kwargs})


@contextmanager
def prefect_harness():
    """`prefect_test_harness()` on a migrated database; fails loudly if Prefect's harness stops
    naming its database as this module expects (then it would silently migrate again)."""
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL
    from prefect.testing import utilities

    from dprelease.cli import temporary_prefect_server

    template = temporary_prefect_server.template_database()
    made_folders: list[Path] = []
    real_mkdtemp = utilities.mkdtemp

    def mkdtemp_holding_the_template(*args, **kwargs) -> str:
        folder = real_mkdtemp(*args, **kwargs)
        shutil.copyfile(template, Path(folder) / HARNESS_DATABASE)
        made_folders.append(Path(folder))
        return folder

    from prefect.server.api import server as server_module

    real_httpx = server_module.httpx
    utilities.mkdtemp = mkdtemp_holding_the_template
    server_module.httpx = _PatientHttpx(real_httpx)  # the start's health check (module docstring)
    try:
        with utilities.prefect_test_harness(server_startup_timeout=PATIENCE_S):
            utilities.mkdtemp = real_mkdtemp
            server_module.httpx = real_httpx
            used = str(PREFECT_SERVER_DATABASE_CONNECTION_URL.value())
            assert len(made_folders) == 1 and used.endswith(str(made_folders[0] / HARNESS_DATABASE)), (
                f"prefect_test_harness no longer uses {HARNESS_DATABASE} in the folder it makes ({used}): "
                "update tests/prefect_harness.py")
            yield
    finally:
        utilities.mkdtemp = real_mkdtemp
        server_module.httpx = real_httpx
