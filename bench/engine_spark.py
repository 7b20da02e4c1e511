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
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from process_tree import tree_rss

ROOT = Path(__file__).resolve().parents[1]
CU, ROW_BOUND, SUM_BOUND, EPSILON, DELTA = 4, 10, 1000, 1.0, 1e-6
SHUFFLE_PARTITIONS = 8


def measure(mode: str, path: Path) -> dict:
    """Run one measurement in a fresh process: whole wall time, in-process time, peak tree memory."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", mode, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, text=True)
    peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    whole = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed (exit {proc.returncode})")
    inner = json.loads(out.strip().splitlines()[-1])
    return {"whole": whole, "peak_gb": peak / 1024**3, **inner}


def session():
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("dprelease-bench")
             .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def child(mode: str, path: str) -> None:
    """One measurement (runs in its own process); prints a JSON line."""
    t0 = time.perf_counter()
    import dp_core as dp

    query = dp.Query([dp.count(upper=ROW_BOUND), dp.sum_("val", 0, SUM_BOUND)], privacy_unit="uid",
                     group_by=("part",), epsilon=EPSILON, delta=DELTA, max_partitions_contributed=CU)
    if mode == "duckdb":
        start = time.perf_counter()
        result = dp.execute(query, path)
        print(json.dumps({"run": time.perf_counter() - start, "released": len(result.table)}))
        return
    spark = session()
    started = time.perf_counter() - t0
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
        print(json.dumps({"run": time.perf_counter() - start, "startup": started, "partitions": rows.num_rows}))
    else:
        start = time.perf_counter()
        result = dp.execute(query, path, backend="spark", spark=spark)
        print(json.dumps({"run": time.perf_counter() - start, "startup": started, "released": len(result.table)}))
    spark.stop()


def run(path: Path) -> None:
    """The three measurements, interleaved once, and their ratios, each with the machine's load
    average (1 min) before and after it (other users share the cores: compare ratios of one run)."""
    res = {}
    for mode in ("spark-plain", "spark-floor", "spark", "duckdb"):
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


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--child":
    child(sys.argv[2], sys.argv[3])
