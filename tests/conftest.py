"""Shared fixtures: the shipped Adult extract (not ../shared: the project must run without it)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
from spark_session import quick_jvms

#: --dist loadgroup keeps each xdist_group on one worker (tests/xdist_groups.py: pytest 9.2 broke xdist's way)
pytest_plugins = ["xdist_groups"]

ADULT = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"

# the commands the tests start without PREFECT_API_URL share their PREFECT_HOME's local Prefect server
# (cli/local_prefect_server.py); each such server ends a minute after its last command, not 30 min
os.environ.setdefault("DPRELEASE_LOCAL_SERVER_IDLE_S", "60")
# the Spark JVMs the tests start (the suite's session, the processes' drivers, a cluster's daemons)
# start with C1 only and one GC thread: half the CPU of each start-up (tests/spark_session.py)
quick_jvms()


@pytest.fixture(scope="session")
def adult() -> pd.DataFrame:
    df = pd.read_csv(ADULT)
    df.insert(0, "person_id", range(len(df)))
    return df


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for every Spark test (startup takes ~10 s): few shuffle
    partitions, no UI, quiet logs. Skipped, with the reason, where Java or pyspark is missing."""
    from spark_session import local_spark_session

    session = local_spark_session()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """pytest-playwright's browser is the machine's Chromium (tests/system_chromium.py)."""
    from system_chromium import LAUNCH_ARGS

    return {**browser_type_launch_args, **LAUNCH_ARGS}


@pytest.fixture(scope="module")
def browser(browser_type_launch_args):
    """The machine's Chromium for one test module, under a Playwright started for that module and
    stopped after it (pytest-playwright's own `browser` lives for the whole session: its sync API
    keeps an event loop running in the worker's main thread, and Prefect's calls made there by the
    modules that follow then returned coroutines instead of results)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(**browser_type_launch_args)
        yield launched
        launched.close()


def pytest_collection_modifyitems(items):
    """Tests marked `runs_first` (minutes of real processes each) go to the front, so that under
    xdist they run beside the rest of the suite rather than alone at its end: the scheduler hands
    out the groups (tests/xdist_groups.py) in this order (pyproject: --no-loadscope-reorder; xdist's
    own order, by number of tests, would start the two-host and wheel groups after a dozen larger modules)."""
    items.sort(key=lambda item: item.get_closest_marker("runs_first") is None)  # stable: order kept otherwise
