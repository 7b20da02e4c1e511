"""Spark backend benchmark (issue 15): `python bench/engine.py --backend spark [--rows N]`.

On the engine benchmark's workload (bench/workload.py: by default 10M rows, 1M units, 10K
partitions, C_u 4), each measurement runs in its own process (its own JVM), timed whole (start to
exit) and inside, with the peak memory of the process tree (Python plus the JVM it starts, sampled
from /proc every 0.1 s):
  (s0) Spark's own plain bounding SQL, no DP: per-unit partial, row_number() over rand() to keep
       C_u partitions per unit, clamp, GROUP BY part (the baseline the target is measured against);
  (sf) Spark's own GROUP BY uid, part (count and sum, consumed inside Spark): the floor of
       user-level DP on Spark (issue 41);
  (s1) the whole DP release on Spark: DP COUNT + SUM, private partitions, epsilon 1, delta 1e-6;
  (d1) the same release on DuckDB.
Prints the times, memory and the ratios s1/s0 (target <= 1.3), s1/sf and s1 whole (target <= 25 s).
Spark runs in local[2] with spark.sql.shuffle.partitions = 8 and the driver's default memory.
With DPRELEASE_BENCH_ONE_PROCESS=1 (the suite's smoke run, tests/test_benchmarks.py) the four run
one after another in ONE process and one SparkSession: one JVM start instead of three, so each
"whole" is that shared process's and the ratios mean nothing; it checks the script end to end.

`--backend spark-cluster` (issue 38) measures on a standalone cluster started for the run from the
pyspark wheel (tools/spark_cluster.py: a master and 2 workers x 1 core, executors of EXECUTOR_MEMORY):
  (c0) Spark's plain bounding SQL on the cluster; (c1) the DP release on the cluster (a spark://
  driver); (l1) the same release in local[2]; each with the driver's peak (this process tree: the
  Python process and its driver JVM; the executors are the workers' children, not in it) and the
  largest executor's peak (each executor JVM, a worker daemon's child), both sampled from /proc
  every 0.1 s: no run asks the driver's UI, whose REST API a loaded machine left unanswered.
Each also prints its Spark stages (wall, tasks' CPU, rows read and shuffled, spill), read from the
driver's event log after it ends (bench/spark_stages.py); `--measure c1,c0` chooses the runs and their
order. Prints c1/c0 for the query, whole and the tasks' CPU seconds (target <= 1.3; the CPU ratio is
the one other users' load barely moves) and the driver's peak (target < 1 GB). A failed measurement
names the file holding its child's whole log, and the cluster's folder (its daemons' and executors'
logs) is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from process_tree import children_rss, tree_rss
from spark_cluster import start_cluster
from spark_stages import completed_stages, event_log_conf, stage_lines

ROOT = Path(__file__).resolve().parents[1]
CU, ROW_BOUND, SUM_BOUND, EPSILON, DELTA = 4, 10, 1000, 1.0, 1e-6
SHUFFLE_PARTITIONS = 8
EXECUTOR_MEMORY = "1g"
EVENT_LOG_ENV = "DPRELEASE_BENCH_EVENT_LOG"  # where a measurement's driver writes its event log
ONE_PROCESS_ENV = "DPRELEASE_BENCH_ONE_PROCESS"  # "1": --backend spark's runs share one process (a smoke run)
MODES = ("spark-plain", "spark-floor", "spark", "duckdb")  # --backend spark's measurements, in order


def measure(mode: str, path: Path, master: str = "local[2]", executor_parents: tuple[int, ...] = (),
            stages: bool = False) -> dict:
    """Run one measurement in a fresh process: whole wall time, in-process time, peak tree memory;
    with `executor_parents` (the cluster's worker daemons) also the largest executor's peak, read
    from /proc like the driver's; with `stages`, each Spark stage's figures from the driver's event
    log (spark_stages). The child's whole log is kept in a file when it fails. `mode` may name
    several modes joined by "," (one process runs them in turn): the result is then
    {mode: its figures}, each with the shared process's whole time and peak."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    events = Path(tempfile.mkdtemp(prefix="dprelease-bench-events-")) if stages else None
    if events:
        env[EVENT_LOG_ENV] = str(events)
    start = time.perf_counter()
    handle, log_name = tempfile.mkstemp(prefix=f"dprelease-bench-{mode}-", suffix=".log")
    log = Path(log_name)
    with os.fdopen(handle, "w") as errors:
        proc = subprocess.Popen([sys.executable, __file__, "--child", mode, str(path), master],
                                stdout=subprocess.PIPE, stderr=errors, env=env, text=True)
    peak = executors_peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak, executors_peak
        while not done.is_set():
            peak = max(peak, tree_rss(proc.pid))
            executors_peak = max([executors_peak, *(rss for w in executor_parents for rss in children_rss(w))])
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    whole = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        said = [line.strip() for line in log.read_text(errors="replace").splitlines()
                if "Error" in line or "Exception" in line]
        raise SystemExit(f"{mode} failed (exit {proc.returncode}): {said[-1] if said else 'no error line in its log'}; "
                         f"its whole log: {log}")
    log.unlink()
    modes = mode.split(",")
    inner = [json.loads(line) for line in out.strip().splitlines()[-len(modes):]]  # one line per mode, in turn
    extra = {"executors_peak_gb": executors_peak / 1024**3} if executor_parents else {}
    if events:
        extra["stages"] = completed_stages(events)
        shutil.rmtree(events)
    figures = {m: {"whole": whole, "peak_gb": peak / 1024**3, **line, **extra} for m, line in zip(modes, inner)}
    return figures if len(modes) > 1 else figures[mode]


def session(master: str = "local[2]"):
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("dprelease-bench")
               .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
               .config("spark.ui.showConsoleProgress", "false"))
    if master.startswith("spark://"):  # executors of EXECUTOR_MEMORY, all registered before the first query
        builder = (builder.config("spark.driver.host", "127.0.0.1").config("spark.executor.memory", EXECUTOR_MEMORY)
                   .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
                   .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "600s"))
    # no UI: nothing in the run asks the driver's REST API (it did, for the executors' peaks, with a
    # 60 s limit, and a 100M-row run at load 19 failed with a bare TimeoutError); the parent reads /proc
    builder = builder.config("spark.ui.enabled", "false")
    if os.environ.get(EVENT_LOG_ENV):  # the parent reads each stage's figures from it afterwards
        for key, value in event_log_conf(Path(os.environ[EVENT_LOG_ENV])).items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def child(modes: str, path: str, master: str = "local[2]") -> None:
    """The measurements `modes` names ("," between several), in turn in this process, the Spark
    ones in one SparkSession started once; prints a JSON line for each."""
    t0 = time.perf_counter()
    import dp_core  # noqa: F401  (its import counts in the startup, as it always did)

    spark = started = None
    for mode in modes.split(","):
        if mode != "duckdb" and spark is None:
            spark = session(master)
            started = time.perf_counter() - t0
        print(json.dumps(child_run(mode, path, spark, started)), flush=True)
    if spark is not None:
        spark.stop()


def child_run(mode: str, path: str, spark, started: float | None) -> dict:
    """One measurement in the child, on `spark` (None for duckdb): its figures."""
    import dp_core as dp

    query = dp.Query([dp.count(upper=ROW_BOUND), dp.sum_("val", 0, SUM_BOUND)], privacy_unit="uid",
                     group_by=("part",), epsilon=EPSILON, delta=DELTA, max_partitions_contributed=CU)
    if mode == "duckdb":
        start = time.perf_counter()
        result = dp.execute(query, path)
        return {"run": time.perf_counter() - start, "released": len(result.table)}
    if mode in ("spark-plain", "spark-floor"):
        spark.read.parquet(path).createOrReplaceTempView("src")
        sql = f"""
            WITH p AS (SELECT uid, part, count(*) AS c, sum(val) AS s FROM src GROUP BY uid, part),
                 r AS (SELECT *, rand() AS r FROM p),
                 b AS (SELECT *, row_number() OVER (PARTITION BY uid ORDER BY r) AS rn FROM r)
            SELECT part, count(*) AS units, sum(least(c, {ROW_BOUND})) AS c, sum(least(greatest(s, 0), {SUM_BOUND})) AS s
            FROM b WHERE rn <= {CU} GROUP BY part"""
        if mode == "spark-floor":
            sql = "SELECT count(*), sum(c), sum(s) FROM (SELECT uid, part, count(*) AS c, sum(val) AS s FROM src GROUP BY uid, part)"
        start = time.perf_counter()
        rows = spark.sql(sql).toArrow()
        return {"run": time.perf_counter() - start, "startup": started, "partitions": rows.num_rows}
    start = time.perf_counter()
    result = dp.execute(query, path, backend="spark", spark=spark)
    return {"run": time.perf_counter() - start, "startup": started, "released": len(result.table)}


def run(path: Path) -> None:
    """The three measurements, interleaved once, and their ratios, each with the machine's load
    average (1 min) before and after it (other users share the cores: compare ratios of one run)."""
    res = {}
    if os.environ.get(ONE_PROCESS_ENV) == "1":
        before = os.getloadavg()[0]
        res = measure(",".join(MODES), path)
        print(f"{', '.join(MODES)} in one process ({ONE_PROCESS_ENV}=1: a smoke run, the figures are not "
              f"comparable): load average {before:.2f} before, {os.getloadavg()[0]:.2f} after", flush=True)
    for mode in () if res else MODES:
        before = os.getloadavg()[0]
        res[mode] = measure(mode, path)
        print(f"{mode}: load average {before:.2f} before, {os.getloadavg()[0]:.2f} after", flush=True)
    plain, floor, spark, duck = res["spark-plain"], res["spark-floor"], res["spark"], res["duckdb"]
    print(f"(s0) Spark plain bounding SQL   whole {plain['whole']:6.1f} s  (query {plain['run']:6.1f} s, "
          f"startup {plain['startup']:4.1f} s)  peak {plain['peak_gb']:.2f} GB")
    print(f"(sf) Spark GROUP BY uid, part    whole {floor['whole']:6.1f} s  (query {floor['run']:6.1f} s, "
          f"startup {floor['startup']:4.1f} s)  peak {floor['peak_gb']:.2f} GB")
    print(f"(s1) dprelease on Spark         whole {spark['whole']:6.1f} s  (release {spark['run']:6.1f} s, "
          f"startup {spark['startup']:4.1f} s)  peak {spark['peak_gb']:.2f} GB  released {spark['released']:,}")
    print(f"(d1) dprelease on DuckDB        whole {duck['whole']:6.1f} s  (release {duck['run']:6.1f} s)  "
          f"peak {duck['peak_gb']:.2f} GB  released {duck['released']:,}")
    print(f"ratios: s1/s0 whole {spark['whole'] / plain['whole']:.2f}, query {spark['run'] / plain['run']:.2f} "
          f"(target <= 1.3); s1/sf whole {spark['whole'] / floor['whole']:.2f}, query {spark['run'] / floor['run']:.2f}; "
          f"s1/d1 whole {spark['whole'] / duck['whole']:.2f}; s1 whole {spark['whole']:.1f} s "
          "(target <= 25 s)")


CLUSTER_LABELS = {"c0": "Spark plain bounding SQL, cluster", "c1": "dprelease on the cluster (spark://)",
                  "l1": "dprelease on Spark local[2]"}


CLUSTER_RUNS = {"c0": ("spark-plain", True), "c1": ("spark", True), "l1": ("spark", False)}  # mode, on the cluster


def run_cluster(path: Path, runs: tuple[str, ...] = ("c0", "c1", "l1")) -> None:
    """On a standalone cluster started for the run (2 workers x 1 core): the plain bounding SQL and
    the release on it, and the release in local[2] (`runs`: which, in that order; a name twice is
    measured twice), with their memory and stages; each printed as soon as it is measured (a later
    failure keeps the earlier figures), then the ratios of each measurement's last run."""
    root = Path(tempfile.mkdtemp(prefix="dprelease-bench-cluster-"))
    cluster = start_cluster(root, workers=2, cores=1, memory=EXECUTOR_MEMORY)
    try:
        res = {}
        workers = tuple(worker.pid for worker in cluster.workers)  # each executor is a worker's child JVM
        for name in runs:
            mode, on_cluster = CLUSTER_RUNS[name]
            master = cluster.master_url if on_cluster else "local[2]"
            before = os.getloadavg()[0]
            res[name] = out = measure(mode, path, master, workers if on_cluster else (), stages=True)
            executors_gb = f"  executors' peak {out['executors_peak_gb']:.2f} GB" if "executors_peak_gb" in out else ""
            cpu = sum(stage["cpu_ns"] for stage in out["stages"]) / 1e9
            out["cpu"] = cpu
            print(f"({name}) {CLUSTER_LABELS[name]:36s} whole {out['whole']:6.1f} s  (query {out['run']:6.1f} s, "
                  f"tasks' CPU {cpu:6.1f} s)  driver peak {out['peak_gb']:.2f} GB{executors_gb}; "
                  f"load average {before:.2f} before, {os.getloadavg()[0]:.2f} after", flush=True)
            print("\n".join(stage_lines(out["stages"])), flush=True)
    except BaseException:
        print(f"the cluster's logs (master, workers, executors' stderr) are kept in {root}", file=sys.stderr)
        raise
    finally:
        cluster.stop()
    shutil.rmtree(root)
    if "c0" in res and "c1" in res:
        c0, c1 = res["c0"], res["c1"]
        print(f"ratios: c1/c0 whole {c1['whole'] / c0['whole']:.2f}, query {c1['run'] / c0['run']:.2f}, tasks' CPU "
              f"{c1['cpu'] / c0['cpu']:.2f} (target <= 1.3); c1 driver peak {c1['peak_gb']:.2f} GB (target < 1 GB)")


if __name__ == "__main__" and len(sys.argv) in (4, 5) and sys.argv[1] == "--child":
    child(*sys.argv[2:])
