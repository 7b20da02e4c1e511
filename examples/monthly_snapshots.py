"""Twelve synthetic monthly snapshots for the periodic-publication demo (controller guide,
"A year of monthly releases"): one CSV per month, each month its own people (disjoint ids, so the
series budget is per snapshot under parallel composition), the same columns every month. With
--same-people, one population of ROWS people of whom each month a different 40% visit (the same
people recur month after month: a series_cap series, and its running total of distinct visitors).

    python examples/monthly_snapshots.py OUT_DIR [--months 12] [--rows 3000] [--same-people]

Columns: person_id, region (North/South/East/West), age (18-90), visits (0-20 per month). The
number of visits drifts up over the year, so the series page shows a trend. Synthetic data only:
numpy's generator is fine here (no noise of a release is drawn from it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

REGIONS = ("North", "South", "East", "West")


def snapshot_frame(month: int, rows: int, seed: int = 2026) -> pd.DataFrame:
    """One month's people (ids month*1_000_000 + i: no one is in two months)."""
    rng = np.random.default_rng(seed + month)
    trend = 1.0 + 0.04 * month
    return pd.DataFrame({
        "person_id": month * 1_000_000 + np.arange(rows, dtype=np.int64),
        "region": rng.choice(REGIONS, size=rows, p=[0.4, 0.3, 0.2, 0.1]),
        "age": rng.integers(18, 91, size=rows),
        "visits": np.minimum(rng.poisson(3.0 * trend, size=rows), 20),
    })


def members_frame(month: int, population: int, seed: int = 2026) -> pd.DataFrame:
    """One month's visitors among the same `population` people (ids 0..population-1): each visits
    with probability 0.4 (a little more each month), so people recur and new ones keep appearing."""
    rng = np.random.default_rng(seed + 100 + month)
    people = np.flatnonzero(rng.random(population) < 0.4 + 0.005 * month)
    home = np.random.default_rng(seed).choice(REGIONS, size=population, p=[0.4, 0.3, 0.2, 0.1])  # fixed per person
    return pd.DataFrame({
        "person_id": people.astype(np.int64),
        "region": home[people],
        "age": 18 + people % 73,
        "visits": np.minimum(rng.poisson(3.0 * (1.0 + 0.04 * month), size=people.size), 20),
    })


def write_snapshots(directory: Path, year: int = 2026, months: int = 12, rows: int = 3000,
                    same_people: bool = False) -> list[tuple[str, Path]]:
    """Write `months` monthly CSVs into `directory`; returns (label, path) pairs, label YYYY-MM.
    same_people: the months' visitors among one population of `rows` people (`members_frame`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for month in range(1, months + 1):
        label = f"{year}-{month:02d}"
        path = directory / f"visits-{label}.csv"
        (members_frame(month, rows) if same_people else snapshot_frame(month, rows)).to_csv(path, index=False)
        out.append((label, path))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--months", type=int, default=12)
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--same-people", action="store_true", help="one population, people recurring every month")
    args = parser.parse_args()
    for label, path in write_snapshots(args.out_dir, months=args.months, rows=args.rows, same_people=args.same_people):
        print(label, path)
