"""great-expectations judging the checks' witness in a process of its own (dprelease.checks_judge):
the same verdicts as judging here, a judge that is gone is replaced by judging here, a command
that started one never loads great-expectations itself, and a process that runs releases one
after another keeps one judge for all of them (the `dprelease` program, one release, ends its own
once it has answered)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from patience import PATIENCE_S

from dprelease import checks, checks_judge

ROOT = Path(__file__).resolve().parents[1]


def _frames():
    good = pd.DataFrame({"uid": [1, 2, 3, 4], "x": [1.0, 2.0, 3.0, 4.0], "c": ["a", "b", "a", "b"]})
    bad = good.assign(uid=[1, None, 3, 4], x=[1.0, np.inf, 3.0, 4.0], c=["a", "b", "zz", "b"])
    renamed = good.rename(columns={"x": "y"})
    return good, [good, bad, renamed, good.assign(x=[1.0, 2.0, 3.0, 99.0])]


@pytest.fixture
def no_judge_left():
    yield
    checks_judge.discard()


#: the two ways a process uses its judge: the `dprelease` program (one release, then the process
#: ends) and a process that runs releases one after another (the app called from Python, a test session)
MODES = pytest.mark.parametrize("one_release", [True, False], ids=["one release per process", "one release after another"])


@pytest.fixture
def judge_mode(monkeypatch, one_release):
    """The judge's mode for this test: one release per process as in the `dprelease` program, or kept."""
    monkeypatch.setattr(checks_judge, "_kept_between_releases", not one_release, raising=False)
    return one_release


@MODES
def test_the_judge_process_gives_the_verdicts_of_judging_here(no_judge_left, judge_mode):
    """One release per process: a judge per witness, ended once it has answered. One release after
    another: the first judge judges every witness (great-expectations imported once) and stays; a
    child forked without exec neither uses nor holds it; killed, it is replaced by a new one."""
    good, frames = _frames()
    suite = checks.default_expectations(good, "uid")
    here = [checks.validate(frame, suite) for frame in frames]  # no judge yet: judged in this process
    judges = set()
    for frame, verdict in zip(frames, here, strict=True):
        checks_judge.start_ahead()
        judge = checks_judge._ahead
        there = checks.validate(frame, suite)
        assert judge.answered, "judged here, not by the judge process"
        if judge_mode:
            assert judge.process.returncode == 0 and not checks_judge.started()  # one judge, one witness
        else:
            assert judge.process.poll() is None and checks_judge._ahead is judge  # waits for the next one
        judges.add(judge.process.pid)
        assert there == verdict, (there.summary(), verdict.summary())
    assert len(judges) == (len(frames) if judge_mode else 1), judges
    assert [report.success for report in here] == [True, False, False, True]
    if not judge_mode:  # the kept judge (one import for all the checks below)
        _a_forked_child_neither_uses_nor_holds_the_judge(judge, frames[0], suite)
        _a_kept_judge_that_has_ended_is_replaced(judge, frames[1], suite)


def _a_forked_child_neither_uses_nor_holds_the_judge(judge, frame, suite) -> None:
    """A child forked without exec forgets the judge and closes its copies of the judge's pipes: the
    parent's judge still answers."""
    child = os.fork()
    if child == 0:
        os._exit(0 if not checks_judge.started() else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    assert checks.validate(frame, suite).success and checks_judge._ahead is judge


def _a_kept_judge_that_has_ended_is_replaced(judge, frame, suite) -> None:
    """Killed between two releases, the kept judge is not asked again: the next release starts one."""
    judge.process.kill()
    judge.process.wait(PATIENCE_S)
    checks_judge.start_ahead()
    replaced = checks_judge._ahead
    assert replaced is not judge
    report = checks.validate(frame, suite)
    assert replaced.answered and not report.success
    assert "FAIL expect_column_values_to_be_between [x]" in report.summary()


def test_a_judge_that_is_gone_is_replaced_by_judging_here(no_judge_left):
    good, frames = _frames()
    suite = checks.default_expectations(good, "uid")
    checks_judge.start_ahead()
    checks_judge._ahead.process.kill()  # killed before it got the witness
    report = checks.validate(frames[1], suite)
    assert not report.success and "FAIL expect_column_values_to_be_between [x]" in report.summary()
    assert checks.validate(good, suite).success


def test_a_command_with_a_judge_never_loads_great_expectations():
    """Its 300 MB stay out of the process that runs the engine (where a release's memory peaks)."""
    code = textwrap.dedent("""
        import sys
        import pandas as pd
        from dprelease import checks, checks_judge
        frame = pd.DataFrame({"uid": [1, 2, 3], "x": [1.0, 2.0, float("inf")]})
        checks_judge.start_ahead()
        suite = [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "uid"}},
                 {"type": "expect_column_values_to_be_between", "kwargs": {"column": "x", "min_value": -1e308,
                                                                           "max_value": 1e308}}]
        report = checks.validate(frame, suite)
        print(report.success, "great_expectations" in sys.modules, "scipy" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=PATIENCE_S,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False", "False"], done.stdout


@pytest.mark.parametrize("used", [False, True], ids=["never asked", "kept after an answer"])
def test_a_judge_ends_with_its_command(used):
    """Started and never used (a Spark release), or kept after an answer for a next release that
    never comes: it ends when the command does, killed or not."""
    code = textwrap.dedent(f"""
        import os
        import pandas as pd
        from dprelease import checks, checks_judge
        checks_judge.start_ahead()
        judge = checks_judge._ahead
        if {used}:
            frame = pd.DataFrame({{"uid": [1, 2]}})
            assert checks.validate(frame, checks.default_expectations(frame, "uid")).success and judge.answered
            assert checks_judge._ahead is judge and judge.process.poll() is None
        print(judge.process.pid, flush=True)
        os._exit(0)  # no exit handlers: the child sees its input close
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=PATIENCE_S,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    child = int(done.stdout.split()[0])
    import time

    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(
            f"/proc/{child}").exists() else "X"
        if state == "Z":  # ended, not yet reaped (its parent is gone)
            return
        time.sleep(0.2)
    pytest.fail(f"the judge process {child} outlived its command")


def test_every_escrowed_dataset_gets_a_judge_process_and_an_external_one_none():
    """An external dataset's Spark witness is judged beside its session; escrowed data of any
    size is judged by a process of its own."""
    assert not checks_judge.worth_a_process(None)
    assert checks_judge.worth_a_process(0)
    assert checks_judge.worth_a_process(1 << 40)


@MODES
def test_the_release_command_starts_a_judge_for_an_escrowed_dataset(tmp_path, monkeypatch, no_judge_left, judge_mode):
    """The release command's rule, through its own helper: a small escrowed dataset (500 rows) keeps
    the judge process started ahead; a request for a dataset that is not registered (the checks after
    it refuse the request in one line) or on Spark ends it at once in the `dprelease` program, and
    leaves it for the next release in a process that runs one after another."""
    from dprelease import admin
    from dprelease.cli import app as cli_app
    from dprelease.requests import parse_request
    from dprelease.settings import Settings

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    settings = Settings.from_env()
    admin.init(settings)
    data = tmp_path / "d.csv"
    pd.DataFrame({"uid": range(500), "x": [1.0] * 500}).to_csv(data, index=False)
    admin.register_dataset(settings, "d", data, "uid", epsilon_cap=1.0)
    for dataset, backend, judged in (("d", "auto", True), ("unknown", "auto", False), ("d", "spark", False)):
        request = parse_request({"dataset": dataset, "epsilon": 0.5, "query": {"aggregates": [{"kind": "count"}]},
                                 "backend": backend})
        checks_judge.start_ahead()  # as the command does, before it reads the request
        started = checks_judge._ahead
        cli_app._keep_checks_judge(request)
        assert checks_judge.started() is (judged or not judge_mode), (dataset, backend)
        if not judged and judge_mode:  # ended at once, not left to run beside the release
            assert started.process.poll() is not None, (dataset, backend)
        if not judge_mode:
            assert checks_judge._ahead is started and started.process.poll() is None, (dataset, backend)
            continue
        checks_judge.discard()


def test_a_deferred_module_loads_only_when_used_and_then_works():
    """The judge process defers scipy.stats (great-expectations imports it for one expectation the
    checks never run at scale): not loaded by the import, loaded whole on first use."""
    import subprocess
    import sys

    code = ("import sys\nfrom dprelease.checks_judge import defer_module, load_framework\n"
            "defer_module('scipy.stats')\nload_framework()\n"
            "print('loaded' if 'scipy.stats._stats_py' in sys.modules else 'deferred')\n"
            "from scipy import stats\nprint(round(float(stats.entropy([0.5, 0.5], [0.9, 0.1])), 6))\n"
            "import scipy.stats as again\nprint(again is stats or again.entropy is stats.entropy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["deferred", "0.510826", "True"], out  # KL = ln(5/9)/2 + ln(5)/2 = 0.5108


def test_a_judge_yields_the_cpu_to_what_its_command_waits_for_first(no_judge_left):
    """A command booting its own Prefect server lowers its judge's priority (the flow waits for the
    server before it needs the judge); the judge still answers."""
    checks_judge.start_ahead()
    judge = checks_judge._ahead
    checks_judge.yield_cpu()
    assert os.getpriority(os.PRIO_PROCESS, judge.process.pid) == os.getpriority(os.PRIO_PROCESS, 0) + 5
    good, _ = _frames()
    assert checks.validate(good, checks.default_expectations(good, "uid")).success
    assert judge.answered


def test_a_process_prefect_started_for_a_flow_run_judges_escrowed_rows_in_a_judge_process(tmp_path):
    """A worker's flow-run process (`python -m prefect.engine`, here its __main__ named so before
    anything runs) judges an escrowed dataset's witness in a judge process, as a release command
    does: great-expectations never loads in it, and its verdict (the infinite value fails the
    checks) is the run's; the Python API in someone's own process (this test session) still judges
    in that process."""
    assert not checks_judge.runs_one_flow_run()
    code = textwrap.dedent("""
        import importlib.util, sys
        sys.modules["__main__"].__spec__ = importlib.util.find_spec("prefect.engine")  # as Prefect starts a run
        import pandas as pd
        from dprelease import admin, checks_judge, pipeline
        from dprelease.settings import Settings
        settings = Settings.from_env()
        admin.init(settings)
        data = settings.home / "d.csv"
        pd.DataFrame({"uid": range(500), "x": [1.0] * 499 + [float("inf")]}).to_csv(data, index=False)
        admin.register_dataset(settings, "d", data, "uid", epsilon_cap=1.0)
        report = pipeline.check_data(pipeline.Platform.open(settings), "d")
        judge = checks_judge._ahead
        print(checks_judge.runs_one_flow_run(), report.success, judge is not None and judge.answered,
              "great_expectations" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=PATIENCE_S,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), DPRELEASE_HOME=str(tmp_path / "home")))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False", "True", "False"], done.stdout
