"""Find-epsilon-from-PRI benchmark (issue 3): the seed's five queries on a 1,000,000-row
Adult-derived table, `data` mode, p = 50, the 37-value grid.

The table is built as the seed did: Adult rows replicated (31 copies) with small noise on numeric
attributes so that copies differ (the seed: "replicated and added random noise"). In the same run,
a faithful re-implementation of the seed's algorithm (memoised q(x_-i) per distinct record, the
query re-run with pandas on x without that record; one process here, the seed used 6) is timed,
capped at --cap seconds per query; when the cap is hit, the time to finish is extrapolated from
the rate so far and marked as such. Targets: every query under 1 s; at least 1000x the seed's
algorithm on Q5.  Run: python bench/pri.py [--cap 600]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dp_core as dp
from dp_core import pri

COPIES = 31
P = 50.0


def adult_1m() -> pd.DataFrame:
    base = pd.read_csv(ROOT / "examples" / "data" / "adult.csv.gz")
    rng = np.random.default_rng(2024)  # benchmark data only
    df = pd.concat([base] * COPIES, ignore_index=True)
    n = len(df)
    first = np.arange(n) < len(base)  # the first copy stays the original data
    df["age"] = np.where(first, df["age"], np.clip(df["age"] + rng.integers(-2, 3, n), 17, 90))
    df["hours_per_week"] = np.where(first, df["hours_per_week"], np.clip(df["hours_per_week"] + rng.integers(-1, 2, n), 1, 99))
    df["fnlwgt"] = np.where(first, df["fnlwgt"], np.round(df["fnlwgt"] * (1 + rng.normal(0, 0.01, n))).astype(np.int64))
    df.insert(0, "person_id", np.arange(n))
    return df


# the seed's queries: our typed form, and a pandas function for the seed's re-implementation
QUERIES = {
    "Q1": (dict(aggregates=[dp.count()], where="income = '>50K' AND education_num = 13 AND age = 25"),
           ["income", "education_num", "age"],
           lambda d: float(((d.income == ">50K") & (d.education_num == 13) & (d.age == 25)).sum())),
    "Q2": (dict(aggregates=[dp.count()], group_by=("marital_status",),
                where="race = 'Asian-Pac-Islander' AND age BETWEEN 30 AND 40"),
           ["race", "age", "marital_status"],
           None),
    "Q3": (dict(aggregates=[dp.count()], where="native_country <> 'United-States' AND sex = 'Female'"),
           ["native_country", "sex"],
           lambda d: float(((d.native_country != "United-States") & (d.sex == "Female")).sum())),
    "Q4": (dict(aggregates=[dp.avg("hours_per_week", 1, 99)], where="workclass IN ('Federal-gov', 'Local-gov', 'State-gov')"),
           ["workclass", "hours_per_week"],
           lambda d: float(d.hours_per_week[d.workclass.isin(["Federal-gov", "Local-gov", "State-gov"])].mean())),
    "Q5": (dict(aggregates=[dp.sum_("fnlwgt", 0, 1_500_000)], where="capital_gain > 0 AND income = '<=50K' AND occupation = 'Sales'"),
           ["capital_gain", "income", "occupation", "fnlwgt"],
           lambda d: float(d.fnlwgt[(d.capital_gain > 0) & (d.income == "<=50K") & (d.occupation == "Sales")].sum())),
}
Q2_GROUPS = ["Divorced", "Married-AF-spouse", "Married-civ-spouse", "Married-spouse-absent", "Never-married",
             "Separated", "Widowed"]


def q2(d: pd.DataFrame) -> np.ndarray:
    m = (d.race == "Asian-Pac-Islander") & d.age.between(30, 40)
    return d.marital_status[m].value_counts().reindex(Q2_GROUPS, fill_value=0).to_numpy(dtype=float)


def seed_algorithm(df: pd.DataFrame, attrs: list[str], query, cap: float) -> tuple[float, bool, int]:
    """Phase 1 of the seed's Algorithm 1 (the dominant cost): memoised q(x_-i) per distinct
    projected record. Returns (seconds, capped, distinct records); extrapolated when capped."""
    start = time.perf_counter()
    keys = df[attrs].drop_duplicates()
    memo = {}
    index_of = df.groupby(attrs, sort=False).head(1).index  # one row per distinct record
    done = 0
    for row_index in index_of:
        memo[row_index] = query(df.drop(index=row_index))
        done += 1
        if time.perf_counter() - start > cap:
            rate = (time.perf_counter() - start) / done
            return rate * len(keys), True, len(keys)
    return time.perf_counter() - start, False, len(keys)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cap", type=float, default=600.0, help="seconds per query for the seed's algorithm")
    ap.add_argument("--skip-seed", action="store_true")
    args = ap.parse_args()
    df = adult_1m()
    print(f"table: {len(df):,} rows (Adult x {COPIES}, numeric attributes jittered); p = {P:g}, {len(pri.DEFAULT_GRID)} candidates")
    print(f"{'query':5} {'dprelease':>10} {'epsilon':>8} {'seed algorithm':>22} {'distinct':>9} {'ratio':>9}")
    for name, (spec, attrs, fn) in QUERIES.items():
        query = dp.Query(privacy_unit="person_id", epsilon=1.0, **spec)
        start = time.perf_counter()
        choice = pri.choose_epsilon_data(query, df, P, ranges_for_all=False)
        ours = time.perf_counter() - start
        if args.skip_seed:
            print(f"{name:5} {ours:9.3f}s {choice.epsilon:8g}")
            continue
        seed_s, capped, distinct = seed_algorithm(df, attrs, fn or q2, args.cap)
        mark = " (extrapolated)" if capped else ""
        print(f"{name:5} {ours:9.3f}s {choice.epsilon:8g} {seed_s:9.1f}s{mark:>13} {distinct:9,} {seed_s / ours:8.0f}x", flush=True)


if __name__ == "__main__":
    main()
