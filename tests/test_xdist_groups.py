"""`--dist loadgroup` keeps an `xdist_group` on one worker, and a module whose tests share a module
fixture (tests/xdist_groups.py): the Spark tests' one SparkSession, the Spark cluster, the wheel's
venv, the two-host deployment, a module's Prefect harness, console server or browser must be set up
once, not once per worker their tests were spread over."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from patience import PATIENCE_S

TESTS = Path(__file__).resolve().parent

#: a module of six grouped tests sharing a module fixture (it records each set-up's worker) and
#: modules of ungrouped tests: with the groups ignored, xdist hands each test to the next free worker
GROUPED = """
import os, pytest
{mark}

@pytest.fixture(scope="module")
def shared():
    with open({record!r}, "a") as f:
        f.write("setup {group} " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_grouped(shared, i, request):
    with open({record!r}, "a") as f:
        f.write("ran {group} " + os.environ["PYTEST_XDIST_WORKER"] + " " + request.node.nodeid + "\\n")
"""
UNGROUPED = """
import pytest

@pytest.mark.parametrize("i", range(10))
def test_other(i):
    pass
"""


def test_a_group_or_a_module_sharing_a_module_fixture_runs_on_one_worker_and_sets_it_up_once(tmp_path):
    record = tmp_path / "record"
    for group in ("spark", "harness"):  # a group named by a mark, and a module left to its module fixture
        mark = f"pytestmark = pytest.mark.xdist_group({group!r})" if group == "spark" else ""
        (tmp_path / f"test_a_{group}.py").write_text(GROUPED.format(group=group, mark=mark, record=str(record)))
    for name in ("b", "c"):
        (tmp_path / f"test_{name}.py").write_text(UNGROUPED)
    # two workers, and no plugin but xdist's and ours (each worker starts faster)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "xdist.plugin", "-p", "xdist_groups", "-n", "2",
                           "--dist", "loadgroup", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=PATIENCE_S,
                          env={**os.environ, "PYTHONPATH": str(TESTS), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = record.read_text().splitlines()
    # the group xdist schedules by, whatever the timing: each grouped test's id ends with it
    ids = {"spark": [], "harness": []}
    for line in lines:
        if line.startswith("ran"):
            ids[line.split()[1]].append(line.split()[3])
    assert all(i.endswith("@spark") for i in ids["spark"]), ids
    assert all(i.endswith("@test_a_harness.py") for i in ids["harness"]), ids
    setups = [tuple(line.split()[1:]) for line in lines if line.startswith("setup")]
    assert sorted(group for group, _ in setups) == ["harness", "spark"], lines  # each group's module fixture once
    ran = [tuple(line.split()[1:3]) for line in lines if line.startswith("ran")]
    assert len(ran) == 12 and set(ran) == set(setups), lines  # each test on the worker that set its group up


def test_the_suite_loads_the_plugin(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("xdist_groups")
