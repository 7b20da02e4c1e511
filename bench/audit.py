"""Long run of the empirical DP audit (issue 18): every mechanism path and every broken variant of
tests/audit/, with more runs than CI (default 500,000 releases per neighbour, 1e6 per mechanism).

Prints one Markdown table row per audit (claimed epsilon, the lower bound at 99% and at 1 - 1e-7,
the runs, the event found, the verdict), ready for docs/privacy.md, and exits non-zero when a real
path is violated or a broken variant is missed. Progress goes to stderr.
Run: python bench/audit.py [--runs 500000] [--only SUBSTRING] [--part all|sound|broken]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

AUDIT_DIR = Path(__file__).resolve().parents[1] / "tests" / "audit"
sys.path.insert(0, str(AUDIT_DIR))

import cases
import pytest
import test_audit


def run_broken(variant: str, runs: int):
    inject, case_name = test_audit.BROKEN[variant]
    with pytest.MonkeyPatch.context() as monkeypatch:
        inject(monkeypatch)
        return cases.audit(cases.cases()[case_name], runs), case_name


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=500_000, help="releases per neighbouring dataset")
    ap.add_argument("--only", default="", help="run only audits whose name contains this")
    ap.add_argument("--part", choices=("all", "sound", "broken"), default="all",
                    help="the real paths, the broken variants, or both (two processes can share the work)")
    args = ap.parse_args()
    bad = 0
    print("| audit | claimed eps (delta) | lower bound, 99% | at 1 - 1e-7 | runs per neighbour | verdict | event |")
    print("|---|---|---|---|---|---|---|")
    start = time.perf_counter()
    for name, case in cases.cases().items():
        if args.only not in name or args.part == "broken":
            continue
        t = time.perf_counter()
        r = cases.audit(case, args.runs)
        verdict = "VIOLATED" if r.violated else "pass"
        bad += r.violated
        print(f"| {name} | {r.claimed_epsilon:.4g} ({r.delta:.2g}) | {r.lower_bound_99:.3f} | {r.lower_bound_gate:.3f} | "
              f"{r.runs:,} | {verdict} | {r.event} |", flush=True)
        print(f"  {name}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    for variant in test_audit.BROKEN:
        if args.only not in variant or args.part == "sound":
            continue
        t = time.perf_counter()
        r, case_name = run_broken(variant, args.runs)
        verdict = "caught" if r.violated else "MISSED"
        bad += not r.violated
        print(f"| broken: {variant} (on {case_name}) | {r.claimed_epsilon:.4g} ({r.delta:.2g}) | {r.lower_bound_99:.3f} | "
              f"{r.lower_bound_gate:.3f} | {r.runs:,} | {verdict} | {r.event} |", flush=True)
        print(f"  {variant}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    print(f"total {time.perf_counter() - start:.0f} s", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
