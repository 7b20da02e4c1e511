"""Release-flow benchmark (issue 5): the whole flow on Adult, validate -> signed report, with the
approval answered at once, excluding server start; and the share spent in Prefect overhead versus
the platform's own steps (dp_core and the pipeline, timed inside the tasks). Target: under 15 s.

Run: python bench/flow.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SQL = ("SELECT WITH ANONYMIZATION education, ANON_COUNT(*, 1) AS people, ANON_AVG(age, 17, 90) AS avg_age, "
       "ANON_AVG(hours_per_week, 1, 99) AS hours FROM adult GROUP BY education")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="dprelease-bench-"))
    os.environ["DPRELEASE_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
    from prefect.testing.utilities import prefect_test_harness

    from dprelease import admin, decisions, pipeline
    from dprelease.cli.deciding import decide
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.flows.release import release_flow
    from dprelease.settings import Settings

    settings = Settings.from_env()
    admin.init(settings)
    admin.register_dataset(settings, "adult", ROOT / "examples" / "data" / "adult.csv.gz", "person_id",
                           epsilon_cap=100, add_row_id=True, risk_profile={"max_risk": 0.5})
    key = settings.key_dir / "controllers" / "bench.pem"
    decisions.create_controller(settings, "bench", key)
    timings = {}
    originals = {}
    for name in ("check_data", "plan", "choose_epsilon", "reserve", "compute_sealed", "controller_summary",
                 "write_controller_report", "publish", "save_summary"):
        originals[name] = getattr(pipeline, name)

        def timed(*a, __name=name, **k):
            start = time.perf_counter()
            try:
                return originals[__name](*a, **k)
            finally:
                timings[__name] = timings.get(__name, 0.0) + time.perf_counter() - start

        setattr(pipeline, name, timed)
    t0 = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=120):
        print(f"server start (excluded): {time.perf_counter() - t0:.1f} s")
        platform = pipeline.Platform.open(settings)
        totals = []
        for run in range(args.runs):
            timings.clear()
            known = {r.id for r in platform.store.list_releases()}
            box = {}
            start = time.perf_counter()
            thread = threading.Thread(target=lambda: box.update(r=release_flow(
                dataset="adult", sql=SQL, epsilon=1.0, approval_timeout=120)))
            thread.start()
            waiting_since = None
            while thread.is_alive():
                rel = next((r for r in platform.store.list_releases(status="awaiting_approval") if r.id not in known), None)
                if rel is not None:
                    waiting_since = time.perf_counter()
                    wait_until_paused(rel.flow_run_id)
                    decide(settings, rel.id, "approve", key, "bench")
                    waited = time.perf_counter() - waiting_since
                    break
                time.sleep(0.05)
            thread.join()
            total = time.perf_counter() - start
            own = sum(timings.values())
            totals.append(total)
            print(f"run {run + 1}: {total:5.2f} s total, of which platform steps {own:5.2f} s "
                  f"({own / total:.0%}), pause/resume round trip {waited:4.2f} s, Prefect and the rest "
                  f"{total - own - waited:4.2f} s ({(total - own - waited) / total:.0%}); status {box['r']['status']}")
            print("        steps: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(timings.items(), key=lambda kv: -kv[1])))
    print(f"best of {args.runs}: {min(totals):.2f} s (target < 15 s)")


if __name__ == "__main__":
    main()
