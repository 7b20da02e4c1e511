"""A fresh dprelease home (DPRELEASE_HOME, initialised) inside a temporary Prefect API, for a test
module's fixture; the environment is restored afterwards."""

from __future__ import annotations

import os
from contextlib import contextmanager


@contextmanager
def fresh_home_with_prefect(home):
    """Yield the Settings of a new home at `home`, with a Prefect test harness running."""
    saved = {k: os.environ.get(k) for k in ("DPRELEASE_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED")}
    os.environ["DPRELEASE_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    try:
        from prefect_harness import prefect_harness

        from dprelease import admin
        from dprelease.settings import Settings

        settings = Settings.from_env()
        admin.init(settings)
        with prefect_harness():
            yield settings
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
