"""Prefect's own `prefect_test_harness`, started on a copy of the migrated empty Prefect database the
CLI keeps (cli/temporary_prefect_server.py) instead of an empty file: its server then finds every
migration applied and answers in about 3 s instead of 7 (14 under the suite's load). Ten harnesses
start in a suite run; everything else is Prefect's harness, unchanged."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

from patience import PATIENCE_S

#: the file prefect_test_harness (Prefect 3.8) names as its database, inside the folder it makes
HARNESS_DATABASE = "prefect-test.db"


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

    utilities.mkdtemp = mkdtemp_holding_the_template
    try:
        with utilities.prefect_test_harness(server_startup_timeout=PATIENCE_S):
            utilities.mkdtemp = real_mkdtemp
            used = str(PREFECT_SERVER_DATABASE_CONNECTION_URL.value())
            assert len(made_folders) == 1 and used.endswith(str(made_folders[0] / HARNESS_DATABASE)), (
                f"prefect_test_harness no longer uses {HARNESS_DATABASE} in the folder it makes ({used}): "
                "update tests/prefect_harness.py")
            yield
    finally:
        utilities.mkdtemp = real_mkdtemp
