"""Engine benchmark (issue 2): 10M rows, 1M units, 10k Zipf-like partitions, C_u = 4.

Times, in one run on the same rows (the Parquet file loaded as a DuckDB table), interleaved: REPEATS rounds,
each step once per round, medians of wall and CPU time (this machine is shared and noisy):
  (a) plain DuckDB GROUP BY part: count and sum;
  (f) DuckDB GROUP BY uid, part (count and sum, consumed inside DuckDB): the floor of user-level DP,
      which cannot avoid one aggregation per (unit, partition) (issue 41);
  (b) DuckDB bounding SQL without noise, written the straightforward way (per-unit partial,
      row_number() over random() to keep C_u = 4 partitions per unit, clamp, group);
  (p) the engine's own bounding plan (bounding.build_plan) without noise;
  (c) dprelease: DP COUNT + SUM, C_u = 4, private partitions, epsilon 1, delta 1e-6;
  (i) the same release with both bounds inferred (APPROX_BOUNDS), from the Parquet file: the engine
      keeps the per-(unit, partition) partials for its two statements (dp_core/shared_partials.py);
      (c') the fixed-bounds release from the same file for its ratio;
and prints c/f (target <= 1.5), p/f, i/c', c/b, peak memory, partitions released (with the expected number under each
selection strategy), and the secure sampler's samples per second. Targets: c/b <= 1.3,
peak memory <= 4 GB, >= 1M samples/s.  Run: `make bench` (or python bench/engine.py --rows N).

Selection comparison (issue 20, `--selections N`, default 5 seeds): the same DP COUNT + SUM
release with each partition selection (truncated geometric: today's default; weighted Gaussian;
MaxAdaptiveDegree; MAD damped, issue 39), N runs each, interleaved so that the machine's load hits all alike: the median
number of partitions released, the median COUNT confidence half-width of released partitions and
the median whole-release time, with ratios against truncated geometric from the same run.
Targets: MAD >= 1.4x truncated geometric (stretch 2x), COUNT CI no wider, time <= 1.3x; damped MAD
>= 2x (issue 39).

Utility (issue 39, `--utility`, bench/utility.py): groups and intervals per accountant, split and
selection on L and on Adult, the total epsilon for the demo's tolerances, beside PipelineDP.
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import statistics
import sys
import time
from pathlib import Path

import duckdb
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import workload

import dp_core as dp
from dp_core import noise
from dp_core.bounding import INPUT_NAME, build_plan
from dp_core.partition_selection import discrete_laplace_threshold, truncated_geometric_keep_probability

REPEATS = 5
CU, ROW_BOUND, SUM_BOUND, EPSILON, DELTA = 4, 10, 1000, 1.0, 1e-6


def interleaved(steps: dict, rounds: int) -> dict:
    """Each step run once per round, in turn: name -> [(wall s, CPU s of the process)]."""
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def best_time(fn, repeats=REPEATS):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=workload.ROWS)
    ap.add_argument("--units", type=int, default=workload.UNITS)
    ap.add_argument("--partitions", type=int, default=workload.PARTITIONS)
    ap.add_argument("--selections", type=int, default=5,
                    help="seeds per selection mechanism (0: skip the comparison; --utility: its seeds, at least 1)")
    ap.add_argument("--selections-only", action="store_true", help="run only the selection comparison")
    ap.add_argument("--utility", action="store_true", help="run only the utility benchmark (bench/utility.py): "
                    "groups and intervals per accountant, split and selection, on L and Adult, beside PipelineDP")
    ap.add_argument("--backend", choices=("duckdb", "spark", "spark-cluster"), default="duckdb",
                    help="spark: the release on Spark local[2] next to DuckDB and Spark's plain bounding SQL; "
                         "spark-cluster: on a standalone cluster of 2 workers x 1 core next to local[2]")
    ap.add_argument("--measure", default="c0,c1,l1",
                    help="spark-cluster: which measurements, in that order, comma-separated (c0: Spark's plain "
                         "bounding SQL on the cluster, c1: the release on it, l1: the release in local[2]; "
                         "c1,c0,c0,c1 interleaves twice)")
    args = ap.parse_args()
    unknown = set(args.measure.split(",")) - {"c0", "c1", "l1"}
    if unknown:
        ap.error(f"--measure: unknown measurement {', '.join(sorted(unknown))}: choose among c0, c1, l1")
    t0 = time.perf_counter()
    path = workload.make_workload(args.rows, args.units, args.partitions)
    print(f"workload: {path} ({args.rows:,} rows, {args.units:,} units, {args.partitions:,} partitions; "
          f"ready in {time.perf_counter() - t0:.1f} s)")
    if args.backend in ("spark", "spark-cluster"):
        import engine_spark

        if args.backend == "spark-cluster":
            engine_spark.run_cluster(path, tuple(args.measure.split(",")))
        else:
            engine_spark.run(path)
        return

    if args.utility:
        import pandas as pd
        import utility

        adult = pd.read_csv(Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz")
        adult.insert(0, "person_id", range(len(adult)))
        utility.run(path, adult, CU, ROW_BOUND, SUM_BOUND, EPSILON, DELTA, max(args.selections, 1))
        return
    if args.selections_only:
        compare_selections(path, args.selections)
        return
    query = dp.Query([dp.count(upper=ROW_BOUND), dp.sum_("val", 0, SUM_BOUND)], privacy_unit="uid",
                     group_by=("part",), epsilon=EPSILON, delta=DELTA, max_partitions_contributed=CU)
    inferred_query = dp.Query([dp.count(upper=None), dp.sum_("val", 0, None)], privacy_unit="uid", group_by=("part",),
                              epsilon=EPSILON, delta=DELTA, max_partitions_contributed=CU)
    con = duckdb.connect()
    con.execute(f"CREATE TABLE src AS SELECT * FROM read_parquet('{path}')")  # the same rows for every step
    bounding_sql = f"""
        WITH p AS (SELECT uid, part, count(*) AS c, sum(val) AS s, random() AS r FROM src GROUP BY uid, part),
             b AS (SELECT *, row_number() OVER (PARTITION BY uid ORDER BY r) AS rn FROM p)
        SELECT part, count(*) AS units, sum(least(c, {ROW_BOUND})) AS c, sum(least(greatest(s, 0), {SUM_BOUND})) AS s
        FROM b WHERE rn <= {CU} GROUP BY part"""
    engine_plan = build_plan(query, {"uid", "part", "val"}, seed=secrets.randbits(63)).sql.replace(INPUT_NAME, "src")
    steps = {  # name -> what runs; measured interleaved, REPEATS rounds (the machine's load hits all alike)
        "part": lambda: con.execute("SELECT part, count(*), sum(val) FROM src GROUP BY part").fetchall(),
        # the unavoidable aggregation per (unit, partition), its result consumed inside DuckDB
        "uid_part": lambda: con.execute("SELECT count(*), sum(c), sum(s) FROM (SELECT uid, part, count(*) AS c, "
                                        "sum(val) AS s FROM src GROUP BY uid, part)").fetchall(),
        "bounding": lambda: con.execute(bounding_sql).fetchall(),
        "plan": lambda: con.execute(engine_plan).fetchall(),
        "release": lambda: dp.execute(query, con.table("src")),
        # from the file: a DuckDB relation has no connection of the engine's own to keep partials on
        "release_file": lambda: dp.execute(query, str(path)),
        "inferred": lambda: dp.execute(inferred_query, str(path)),
    }
    load_before = os.getloadavg()[0]
    times = interleaved(steps, REPEATS)
    load_after = os.getloadavg()[0]
    result = steps["release"]()
    bounded = con.execute(bounding_sql).fetchall()
    con.close()
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    wall = {k: statistics.median(v[0] for v in runs) for k, runs in times.items()}
    cpu = {k: statistics.median(v[1] for v in runs) for k, runs in times.items()}
    t_a, t_b, t_c = wall["part"], wall["bounding"], wall["release"]

    n_units = np.array([row[1] for row in bounded], dtype=np.float64)
    sel_eps = EPSILON / 3  # the default split: selection, COUNT, SUM get a third each
    expect_tg = truncated_geometric_keep_probability(n_units, sel_eps, DELTA, CU).sum()
    threshold = discrete_laplace_threshold(sel_eps, DELTA, CU)
    q = np.exp(-sel_eps / CU)
    gap = threshold - n_units  # P(n + K >= T) for the discrete Laplace K
    p_lap = np.where(gap <= 0, 1 - q ** (1 - gap) / (1 + q), q ** np.maximum(gap, 0) / (1 + q))
    expect_lap = p_lap.sum()

    n = 10_000_000
    t_s, _ = best_time(lambda: noise.discrete_laplace(12.0, n))

    c = result.controller_only
    print(f"load average {load_before:.1f} before, {load_after:.1f} after; medians of {REPEATS} interleaved rounds "
          f"(wall s / CPU s of the process, all threads)")
    for key, label in (("part", "(a) DuckDB GROUP BY part, count+sum"),
                       ("uid_part", "(f) DuckDB GROUP BY uid, part (the floor)"),
                       ("bounding", "(b) DuckDB bounding SQL, row_number(), no noise"),
                       ("plan", "(p) the engine's bounding plan, no noise"),
                       ("release", "(c) dprelease DP COUNT+SUM, C_u=4"),
                       ("release_file", "(c') the same, from the Parquet file"),
                       ("inferred", "(i) the same, both bounds inferred, from the file")):
        print(f"{label:50s} {wall[key]:7.3f} s  cpu {cpu[key]:7.3f} s")
    print(f"ratio c/f = {wall['release'] / wall['uid_part']:.2f} wall, {cpu['release'] / cpu['uid_part']:.2f} cpu "
          f"(target <= 1.5)   p/f = {wall['plan'] / wall['uid_part']:.2f} wall, {cpu['plan'] / cpu['uid_part']:.2f} cpu")
    print(f"ratio c/b = {t_c / t_b:.2f} (target <= 1.3)   ratio c/a = {t_c / t_a:.1f}   ratio i/c' = "
          f"{wall['inferred'] / wall['release_file']:.2f} wall, {cpu['inferred'] / cpu['release_file']:.2f} cpu "
          "(bounds inferred against given)")
    print(f"peak memory (whole process) = {peak_gb:.2f} GB (target <= 4)")
    print(f"partitions released = {len(result.table):,} of {c.partitions_nonempty:,} non-empty "
          f"({result.partition_selection.split(':')[0]}); expected: truncated geometric {expect_tg:,.0f}, "
          f"Laplace threshold {expect_lap:,.0f} (T = {threshold})")
    print(f"secure sampler: {n / t_s / 1e6:.1f} M discrete Laplace samples/s (target >= 1)")
    if args.selections:
        compare_selections(path, args.selections)


SELECTIONS = ("truncated-geometric", "weighted_gaussian", "mad", "mad_damped")


def compare_selections(path, seeds: int) -> None:
    """Partitions released, COUNT CI half-width and release time per selection mechanism (medians
    over `seeds` runs, interleaved), with ratios against truncated geometric."""
    runs = {s: {"released": [], "ci": [], "time": []} for s in SELECTIONS}
    for seed in range(seeds):
        for sel in SELECTIONS:
            query = dp.Query([dp.count(upper=ROW_BOUND), dp.sum_("val", 0, SUM_BOUND)], privacy_unit="uid",
                             group_by=("part",), epsilon=EPSILON, delta=DELTA, max_partitions_contributed=CU,
                             selection=sel)
            start = time.perf_counter()
            result = dp.execute(query, path)
            runs[sel]["time"].append(time.perf_counter() - start)
            runs[sel]["released"].append(len(result.table))
            half = (result.table["count_ci_high"] - result.table["count"]).to_numpy()
            runs[sel]["ci"].append(float(np.median(half)) if half.size else float("nan"))
            print(f"  seed {seed} {sel:20s} released {len(result.table):6,d}  {runs[sel]['time'][-1]:6.2f} s", flush=True)
    med = {s: {k: float(np.median(v)) for k, v in r.items()} for s, r in runs.items()}
    base = med["truncated-geometric"]
    print(f"selection comparison ({seeds} seeds, eps {EPSILON}, delta {DELTA}, C_u {CU}; medians):")
    for sel in SELECTIONS:
        m = med[sel]
        print(f"  {sel:20s} released {m['released']:7,.0f} ({m['released'] / base['released']:.2f}x)  "
              f"COUNT CI half-width {m['ci']:.3g} ({m['ci'] / base['ci']:.2f}x)  "
              f"release {m['time']:6.2f} s ({m['time'] / base['time']:.2f}x)")
    mad = med["mad"]
    print(f"MAD / truncated geometric: {mad['released'] / base['released']:.2f}x partitions (target >= 1.4, stretch 2), "
          f"COUNT CI {mad['ci'] / base['ci']:.2f}x (target <= 1), time {mad['time'] / base['time']:.2f}x (target <= 1.3)")
    damped = med["mad_damped"]
    print(f"damped MAD / truncated geometric: {damped['released'] / base['released']:.2f}x partitions (issue 39 target "
          f">= 2.0), COUNT CI {damped['ci'] / base['ci']:.2f}x (target <= 1), time {damped['time'] / base['time']:.2f}x")


if __name__ == "__main__":
    main()
