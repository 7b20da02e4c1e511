"""The benchmarks run in CI at a small size, so that they keep working between the full runs whose
figures the README reports (the figures themselves come from full runs, never from here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from patience import PATIENCE_S

ROOT = Path(__file__).resolve().parents[1]


def test_engine_benchmark_with_the_selection_comparison_runs_small():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "engine.py"), "--rows", "20000", "--units", "2000", "--partitions", "40",
         "--selections", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=PATIENCE_S, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "ratio c/b" in out and "peak memory" in out and "ratio i/c'" in out
    assert "selection comparison" in out and "MAD / truncated geometric" in out
    assert "damped MAD / truncated geometric" in out


def test_utility_benchmark_runs_small():
    """`bench/engine.py --utility` (issue 39): accountants, the demo's split, selections, levers, PipelineDP."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "engine.py"), "--rows", "20000", "--units", "2000", "--partitions", "40",
         "--selections", "1", "--utility"],
        cwd=ROOT, capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "Canonne-Kamath-Steinke" in out and "PLD (exact curve)" in out
    assert "total epsilon needed: equal split 1.611, need split 1.149" in out
    assert "PipelineDP (computed)" in out and "Selection levers on L" in out and "policy Gaussian" in out
    assert "damped MAD (built: selection='mad_damped')" in out and "privacy loss distributions" in out


def test_spark_benchmark_runs_small():
    """`bench/engine.py --backend spark` at a small size, its four measurements in one process and one
    JVM (DPRELEASE_BENCH_ONE_PROCESS: 15 s instead of 40-60 s for three JVMs); each still runs its own
    statement, read back by the parent, and every figure and ratio line is printed."""
    import shutil

    import pytest

    if shutil.which("java") is None:
        pytest.skip("the Spark benchmark needs a Java runtime (java not on PATH; CI installs openjdk-17-jre-headless)")
    pytest.importorskip("pyspark", reason="the Spark benchmark needs pyspark: pip install '.[spark]'")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "engine.py"), "--backend", "spark", "--rows", "20000", "--units", "2000",
         "--partitions", "40"], cwd=ROOT, capture_output=True, text=True, timeout=PATIENCE_S, check=False,
        env={**os.environ, "DPRELEASE_BENCH_ONE_PROCESS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "spark-plain, spark-floor, spark, duckdb in one process" in out
    assert "(s0) Spark plain bounding SQL" in out and "(s1) dprelease on Spark" in out and "(d1) dprelease on DuckDB" in out
    assert "ratios: s1/s0 whole" in out and "target <= 25 s" in out


#: a process holding `sys.argv[1]` MB resident, then starting one such child per further argument;
#: it prints "ready" once every one holds its memory and waits until its standard input closes
HOLDER = """
import subprocess, sys
held = bytearray(int(sys.argv[1]) * 2**20)  # zero-filled and written: resident
kids = [subprocess.Popen([sys.executable, __file__, mb], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for mb in sys.argv[2:]]
for kid in kids:
    kid.stdout.readline()
print("ready", flush=True)
sys.stdin.read()
for kid in kids:
    kid.stdin.close()
    kid.wait()
"""


def test_each_executor_is_measured_apart_from_its_worker(tmp_path):
    """The cluster benchmark's executors' peak (bench/process_tree.children_rss): each child of a
    process with its own descendants, the process itself left out, as a worker daemon and its
    executor JVMs are; the whole tree (tree_rss) still counts all three."""
    sys.path.insert(0, str(ROOT / "bench"))
    from process_tree import children_rss, tree_rss

    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    mb = 2**20
    parent = subprocess.Popen([sys.executable, str(script), "120", "20", "60"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        small, large = sorted(children_rss(parent.pid))
        assert 20 * mb <= small < 60 * mb <= large < 120 * mb  # each child alone, never with the parent's 120 MB
        assert tree_rss(parent.pid) >= (120 + 20 + 60) * mb
    finally:
        parent.stdin.close()
        parent.wait(timeout=PATIENCE_S)


def test_stage_figures_come_from_the_event_log_spark_writes(tmp_path):
    """bench/spark_stages.completed_stages: each completed stage with its statement (the SQL
    execution of the job that ran it), wall time and task metrics; a stage without a submission
    time (never run) is left out. Fields named as in Spark 4.3's event log."""
    sys.path.insert(0, str(ROOT / "bench"))
    from spark_stages import completed_stages, stage_lines

    events = [
        {"Event": "SparkListenerJobStart", "Job ID": 0, "Stage IDs": [3, 4],
         "Properties": {"spark.sql.execution.id": "2"}},
        {"Event": "SparkListenerStageCompleted", "Stage Info": {
            "Stage ID": 3, "Number of Tasks": 8, "Submission Time": 1_000, "Completion Time": 13_500,
            "Accumulables": [{"ID": 1, "Name": "internal.metrics.input.recordsRead", "Value": 100_000_000},
                             {"ID": 2, "Name": "internal.metrics.shuffle.write.recordsWritten", "Value": 41_900_000},
                             {"ID": 3, "Name": "internal.metrics.shuffle.write.bytesWritten", "Value": 700_000_000},
                             {"ID": 4, "Name": "internal.metrics.executorRunTime", "Value": 24_000},
                             {"ID": 5, "Name": "internal.metrics.executorCpuTime", "Value": 19_500_000_000}]}},
        {"Event": "SparkListenerStageCompleted", "Stage Info": {"Stage ID": 4, "Number of Tasks": 8}},
    ]
    (tmp_path / "app-1").write_text("".join(json.dumps(e) + "\n" for e in events))
    [stage] = completed_stages(tmp_path)
    assert stage == {"stage": 3, "execution": 2, "seconds": 12.5, "tasks": 8, "input_rows": 100_000_000,
                     "input_bytes": 0, "shuffle_read_rows": 0, "shuffle_write_rows": 41_900_000,
                     "shuffle_write_bytes": 700_000_000, "task_time_ms": 24_000, "cpu_ns": 19_500_000_000,
                     "spilled_bytes": 0}
    assert "write   41,900,000 rows (   700.0 MB)  task time    24.0 s  CPU    19.5 s" in stage_lines([stage])[0]
