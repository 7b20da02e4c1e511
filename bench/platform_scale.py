"""Platform at scale (issue 14): register + release of the engine benchmark's workload through the CLI.

For each size (default 10M and 50M rows; bench/workload.py: 1M units, 10k Zipf-like partitions):
  1. `dprelease dataset register` of the workload file (Parquet, or CSV with --csv),
  2. `dprelease release <request> --approve-as bench` (DP COUNT + SUM by partition, C_u = 4,
     epsilon 1, delta 1e-6: the engine benchmark's query), the approval answered at once,
  3. the data checks alone (`pipeline.check_data` on the registered dataset),
  4. the engine alone (`dp_core.execute` on the plaintext file) in a fresh process, same query and
     DuckDB threads as the platform's (DPRELEASE_ENGINE_THREADS, default 1),
each a separate process tree; printed: wall time and peak memory of the whole process tree
(the sum of the RSS of the process and its descendants, sampled every 20 ms). A tiny run (10k rows)
measures the fixed costs (interpreter, imports, Prefect's temporary server, great-expectations)
in the same run, so the size-dependent overhead can be told apart from them.

The release is measured per size in up to three setups of the Prefect server: `local` (the
default of a lone controller: the PREFECT_HOME's local server, started by the first command, here
the 10k-row run's, and reused by the commands after it: cli/local_prefect_server.py), `temporary`
(DPRELEASE_PREFECT_SERVER=temporary: each command starts its own and it dies with it, included in
the peak: cli/temporary_prefect_server.py) and `shared` (PREFECT_API_URL: a server started once
before, the setup for several controllers). The memory of a local or shared server is printed
apart, since it serves every release.

Targets: 50M rows under 4 GB peak and under 60 s end to end; 10M rows under 1.5 GB; platform
overhead (all but the engine's compute) under 2x the engine's time at 10M rows.
Run: python bench/platform_scale.py [--rows 10000000 50000000] [--csv] [--prefect local temporary shared]
     [--repeat N] (N runs per size and server, the run of median overhead reported with the spread, and each target
     judged: this machine is shared, and one run moves by a second with its load)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import workload
from process_tree import tree_rss

REQUEST = {"dataset": "workload", "title": "platform scale benchmark", "epsilon": 1.0, "delta": 1e-6,
           "max_partitions_contributed": 4,
           "query": {"group_by": ["part"], "aggregates": [{"kind": "count", "upper": 10, "name": "rows"},
                                                          {"kind": "sum", "column": "val", "lower": 0,
                                                           "upper": 1000, "name": "total"}]}}
CHECKS = """
import json, time
from dprelease import pipeline
from dprelease.settings import Settings
platform = pipeline.Platform.open(Settings.from_env())
t0 = time.perf_counter()
report = pipeline.check_data(platform, "workload")
print(json.dumps({"checks_s": time.perf_counter() - t0, "success": report.success}))
"""
ENGINE = """
import json, sys, time
start = time.perf_counter()
import dp_core as dp
from dprelease.settings import Settings
query = dp.Query([dp.count(upper=10), dp.sum_("val", 0, 1000)], privacy_unit="uid", group_by=("part",),
                 epsilon=1.0, delta=1e-6, max_partitions_contributed=4)
t0 = time.perf_counter()
result = dp.execute(query, sys.argv[1], threads=Settings.from_env().threads_now())  # as the platform runs it
print(json.dumps({"compute_s": time.perf_counter() - t0, "released": len(result.table)}))
"""


def measure(cmd: list[str], env: dict) -> dict:
    """Run a command; its wall time, whole-tree peak RSS, exit code and output."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        print(f"FAILED ({proc.returncode}): {' '.join(cmd)}\n{out[-2000:]}\n{err[-4000:]}", file=sys.stderr)
    return {"wall_s": wall, "peak_gb": peak[0] / 1e9, "code": proc.returncode, "out": out}


def source_file(rows: int, csv: bool) -> Path:
    units = min(workload.UNITS, max(rows // 10, 1))
    partitions = min(workload.PARTITIONS, max(rows // 100, 10))
    path = workload.make_workload(rows, units, partitions)
    if not csv:
        return path
    target = path.with_suffix(".csv")
    if not target.exists():
        import duckdb

        tmp = target.with_suffix(".tmp.csv")
        duckdb.sql(f"COPY (SELECT * FROM read_parquet('{path}')) TO '{tmp}' (HEADER)")
        tmp.rename(target)
    return target


def shared_prefect_server(prefect_home: Path):
    """A Prefect server for the whole run (as a team runs one), on a copy of the migrated template."""
    import shutil

    os.environ.update(PREFECT_HOME=str(prefect_home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
                      PREFECT_LOGGING_LEVEL="WARNING")
    os.environ.pop("PREFECT_API_URL", None)
    sys.path.insert(0, str(ROOT))
    from dprelease.cli import temporary_prefect_server

    scratch = Path(tempfile.mkdtemp(prefix="dprelease-scale-shared-"))
    shutil.copyfile(temporary_prefect_server.template_database(), scratch / "prefect.db")
    server = temporary_prefect_server.TemporaryServer(scratch / "prefect.db", scratch=[scratch])
    server.spawn()
    server.wait_ready()
    return server


def local_server_rss(prefect_home: Path) -> float:
    """Resident memory of the home's local Prefect server (GB; 0 if none runs)."""
    state = next(prefect_home.glob("dprelease-local-server-*.json"), None)
    if state is None:
        return 0.0
    return tree_rss(json.loads(state.read_text())["pid"]) / 1e9


def run_size(rows: int, csv: bool, python: str, prefect_home: Path, mode: str, shared=None) -> dict:
    data = source_file(rows, csv)
    home = Path(tempfile.mkdtemp(prefix="dprelease-scale-"))
    env = dict(os.environ, DPRELEASE_HOME=str(home), PREFECT_HOME=str(prefect_home),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300",
               DPRELEASE_PROGRESS="log", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PREFECT_API_URL", None)
    env["DPRELEASE_PREFECT_SERVER"] = "temporary" if mode == "temporary" else "local"
    if shared is not None:  # a server of ours: its API asks for its secret
        env.update(PREFECT_API_URL=shared.api_url, PREFECT_API_AUTH_STRING=shared.auth)
    cli = [python, "-c", "from dprelease.cli.app import main; main()"]  # what the `dprelease` script runs
    subprocess.run(cli + ["init"], env=env, check=True, capture_output=True, cwd=ROOT)
    key = home / "controllers" / "bench.pem"  # decisions are signed by a registered controller
    subprocess.run(cli + ["controller", "add", "bench", "--private-key", str(key)], env=env, check=True,
                   capture_output=True, cwd=ROOT)
    env["DPRELEASE_CONTROLLER_KEY"] = str(key)
    request = home / "request.json"
    request.write_text(json.dumps(REQUEST))
    register = measure(cli + ["dataset", "register", "workload", str(data), "--unit", "uid", "--epsilon-cap", "10"], env)
    release = measure(cli + ["release", str(request), "--approve-as", "bench",
                             "--override-risk", "benchmark on synthetic data"], env)
    checks = measure([python, "-c", CHECKS], env)
    engine = measure([python, "-c", ENGINE, str(data)], env)
    engine_s = json.loads(engine["out"].strip().splitlines()[-1])["compute_s"] if engine["code"] == 0 else float("nan")
    shutil.rmtree(home, ignore_errors=True)  # its escrowed copy of the data: gigabytes at 50M rows
    return {"rows": rows, "file": data.name, "file_gb": data.stat().st_size / 1e9, "register": register,
            "release": release, "engine": engine, "engine_compute_s": engine_s, "checks": checks,
            "checks_s": json.loads(checks["out"].strip().splitlines()[-1])["checks_s"] if checks["code"] == 0
            else float("nan")}


#: issue 14's targets: rows -> (peak GB, end-to-end seconds or None, overhead in engine times or None)
TARGETS = {10_000_000: (1.5, None, 2.0), 50_000_000: (4.0, 60.0, None)}


def end_to_end(r: dict) -> float:
    return r["register"]["wall_s"] + r["release"]["wall_s"]


def overhead_ratio(r: dict) -> float:
    """All but the engine's compute, in engine times (each run against its own engine-alone run)."""
    return (end_to_end(r) - r["engine_compute_s"]) / r["engine_compute_s"]


def median_run(runs: list[dict]) -> dict:
    """The run whose overhead ratio is the median (the upper one of an even count)."""
    return sorted(runs, key=overhead_ratio)[len(runs) // 2]


def report(rows: int, runs: list[dict], fixed: float, mode: str) -> None:
    failed = [x for x in runs if x["register"]["code"] or x["release"]["code"] or x["engine"]["code"]]
    if failed:
        print(f"\n{rows:,} rows, Prefect: {mode}: {len(failed)} of {len(runs)} runs failed (register, release or "
              "engine alone exited non-zero); nothing is judged")
        for x in failed:
            for step in ("register", "release", "engine"):
                if x[step]["code"]:
                    print(f"  {step}: exit {x[step]['code']}: {x[step].get('err', '')[-300:]}")
        return
    r = median_run(runs)
    total = end_to_end(r)
    peak = max(max(x["register"]["peak_gb"], x["release"]["peak_gb"]) for x in runs)
    engine_s = r["engine_compute_s"]
    overhead = total - engine_s
    spread = ""
    if len(runs) > 1:
        ratios = sorted(map(overhead_ratio, runs))
        spread = (f" (the median of {len(runs)} runs; end to end {min(map(end_to_end, runs)):.1f}-"
                  f"{max(map(end_to_end, runs)):.1f} s, overhead {ratios[0]:.2f}-{ratios[-1]:.2f}x)")
    print(f"\n{rows:,} rows ({r['file']}, {r['file_gb']:.2f} GB), Prefect: {mode}{spread}")
    print(f"  register  {r['register']['wall_s']:7.1f} s   peak {r['register']['peak_gb']:.2f} GB")
    print(f"  release   {r['release']['wall_s']:7.1f} s   peak {r['release']['peak_gb']:.2f} GB")
    print(f"  data checks alone (decrypt, engine aggregates, great-expectations): {r['checks_s']:.1f} s "
          f"(process {r['checks']['wall_s']:.1f} s, peak {r['checks']['peak_gb']:.2f} GB)")
    print(f"  engine alone: compute {engine_s:.2f} s (process {r['engine']['wall_s']:.1f} s, "
          f"peak {r['engine']['peak_gb']:.2f} GB)")
    line = (f"  end to end {total:.1f} s, peak {peak:.2f} GB; platform overhead {overhead:.1f} s = "
            f"{overhead / engine_s:.1f}x the engine")
    if fixed:
        scaling = total - fixed - engine_s
        line += f"; beyond the fixed costs {scaling:.1f} s = {scaling / engine_s:.1f}x the engine"
    print(line)
    if rows in TARGETS:
        max_gb, max_s, max_overhead = TARGETS[rows]
        verdicts = [f"peak (highest of the runs) {peak:.2f} GB < {max_gb:g} GB: {'met' if peak < max_gb else 'NOT MET'}"]
        if max_s is not None:  # the median of the end-to-end times, not the median-overhead run's
            median_s = sorted(map(end_to_end, runs))[len(runs) // 2]
            verdicts.append(f"end to end {median_s:.1f} s < {max_s:g} s: {'met' if median_s < max_s else 'NOT MET'}")
        if max_overhead is not None:
            ratio = overhead / engine_s
            verdicts.append(f"overhead {ratio:.2f}x < {max_overhead:g}x: {'met' if ratio < max_overhead else 'NOT MET'}")
        print("  targets: " + "; ".join(verdicts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[10_000_000, 50_000_000])
    ap.add_argument("--csv", action="store_true", help="register a CSV copy of the workload instead of Parquet")
    ap.add_argument("--skip-fixed", action="store_true", help="skip the 10k-row run that measures fixed costs")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per size and server; the run of median overhead is reported (default 1)")
    ap.add_argument("--prefect", nargs="+", choices=["local", "temporary", "shared"],
                    default=["local", "temporary", "shared"],
                    help="the setups of the Prefect server to measure (default: all three)")
    args = ap.parse_args()
    python = sys.executable
    prefect_home = Path(tempfile.mkdtemp(prefix="dprelease-scale-prefect-"))  # one controller's, reused
    shared = None
    if "shared" in args.prefect:
        started = time.perf_counter()
        shared = shared_prefect_server(prefect_home)
        print(f"shared Prefect server: ready in {time.perf_counter() - started:.1f} s "
              f"(first start on this home builds the migrated template), "
              f"{tree_rss(shared.process.pid) / 1e9:.2f} GB resident")
    try:
        for mode in args.prefect:
            server = shared if mode == "shared" else None
            fixed = 0.0
            if not args.skip_fixed or mode == "local":  # in local mode, the run that starts the server
                tiny = run_size(10_000, args.csv, python, prefect_home, mode, server)
                fixed = tiny["register"]["wall_s"] + tiny["release"]["wall_s"]
                print(f"fixed costs (10k rows, Prefect: {mode}{', its first command starts it' if mode == 'local' else ''}"
                      f"): register {tiny['register']['wall_s']:.1f} s (peak {tiny['register']['peak_gb']:.2f} GB), "
                      f"release {tiny['release']['wall_s']:.1f} s (peak {tiny['release']['peak_gb']:.2f} GB): "
                      "interpreters, imports, Prefect, checks")
                if mode == "local":
                    again = run_size(10_000, args.csv, python, prefect_home, mode, server)
                    fixed = again["register"]["wall_s"] + again["release"]["wall_s"]
                    print(f"fixed costs (10k rows, Prefect: local, started before): register "
                          f"{again['register']['wall_s']:.1f} s, release {again['release']['wall_s']:.1f} s; "
                          f"the local server holds {local_server_rss(prefect_home):.2f} GB resident")
            for rows in args.rows:
                runs = [run_size(rows, args.csv, python, prefect_home, mode, server)
                        for _ in range(max(1, args.repeat))]
                report(rows, runs, fixed, mode)
    finally:
        if shared is not None:
            shared.kill()
        if "local" in args.prefect:
            sys.path.insert(0, str(ROOT))
            from dprelease.cli import local_prefect_server

            print(local_prefect_server.stop_running(prefect_home))


if __name__ == "__main__":
    main()
