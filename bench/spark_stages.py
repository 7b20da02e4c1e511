"""Per-stage figures of a Spark application from its event log (spark.eventLog.enabled): each
completed stage's wall time, tasks, rows read and shuffled, its tasks' time and CPU time (the
CPU time barely moves with other users' load, which stretches every wall time), spill. Read from the file the driver
writes, after the run, so measuring asks nothing of the driver while it works (its UI's REST API
went unanswered on a loaded machine: bench/engine_spark.py)."""

from __future__ import annotations

import json
from pathlib import Path

#: Spark's task metrics (accumulables of a completed stage) -> the names printed here
METRICS = {"internal.metrics.input.recordsRead": "input_rows", "internal.metrics.input.bytesRead": "input_bytes",
           "internal.metrics.shuffle.read.recordsRead": "shuffle_read_rows",
           "internal.metrics.shuffle.write.recordsWritten": "shuffle_write_rows",
           "internal.metrics.shuffle.write.bytesWritten": "shuffle_write_bytes",
           "internal.metrics.executorRunTime": "task_time_ms", "internal.metrics.executorCpuTime": "cpu_ns",
           "internal.metrics.diskBytesSpilled": "spilled_bytes"}


def event_log_conf(folder: Path) -> dict[str, str]:
    """The session settings that make the driver write its event log, uncompressed, into `folder`."""
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": folder.as_uri(), "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false"}


def completed_stages(folder: Path) -> list[dict]:
    """Every completed stage of the applications logged in `folder`, in completion order: id,
    SQL execution id (one per statement), seconds from submission to completion, tasks, METRICS."""
    execution_of_stage: dict[int, int | None] = {}
    stages = []
    for log in sorted(p for p in folder.iterdir() if p.is_file()):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] == "SparkListenerJobStart":
                execution = (event.get("Properties") or {}).get("spark.sql.execution.id")
                for stage in event["Stage IDs"]:
                    execution_of_stage[stage] = None if execution is None else int(execution)
            elif event["Event"] == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                if "Completion Time" not in info or "Submission Time" not in info:
                    continue  # never run
                sums = {name: 0 for name in METRICS.values()}
                for acc in info.get("Accumulables", []):
                    if acc.get("Name") in METRICS:
                        sums[METRICS[acc["Name"]]] = int(acc["Value"])
                stages.append({"stage": info["Stage ID"], "execution": execution_of_stage.get(info["Stage ID"]),
                               "seconds": (info["Completion Time"] - info["Submission Time"]) / 1000,
                               "tasks": info["Number of Tasks"], **sums})
    return stages


def stage_lines(stages: list[dict]) -> list[str]:
    """One line per stage: what the benchmark prints and the 1-billion-row plan extrapolates."""
    return [f"    stage {s['stage']:3d} (statement {s['execution']}) {s['seconds']:7.1f} s  {s['tasks']:4d} tasks  "
            f"input {s['input_rows']:>13,} rows  shuffle read {s['shuffle_read_rows']:>12,} rows  "
            f"write {s['shuffle_write_rows']:>12,} rows ({s['shuffle_write_bytes'] / 1e6:8.1f} MB)  "
            f"task time {s['task_time_ms'] / 1000:7.1f} s  CPU {s['cpu_ns'] / 1e9:7.1f} s  "
            f"spilled {s['spilled_bytes'] / 1e6:.0f} MB" for s in stages]
