"""Demo: a differentially private release on the UCI Adult census extract (32,561 people).

Each row is one person, so the privacy unit is a row id (`person_id`). The release: per education
level, the number of people, their average age, median age and total capital gain, at epsilon 1.
Run with `make demo`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import dp_core as dp

DATA = Path(__file__).parent / "data" / "adult.csv.gz"


def load_adult() -> pd.DataFrame:
    """The Adult extract with a `person_id` column added (one row per person)."""
    df = pd.read_csv(DATA)
    df.insert(0, "person_id", range(len(df)))
    return df


def main() -> None:
    adult = load_adult()
    query = dp.Query(
        aggregates=[
            dp.count(upper=1, name="people"),
            dp.avg("age", 17, 90, name="avg_age"),
            dp.median("age", 17, 90, name="median_age"),
            dp.sum_("capital_gain", 0, 20_000, name="capital_gain"),
        ],
        privacy_unit="person_id",
        group_by=("education",),
        epsilon=1.0,
        delta=1e-6,
    )
    result = dp.execute(query, adult)
    pd.set_option("display.width", 200)
    pd.set_option("display.float_format", lambda x: f"{x:,.1f}")
    print(f"Adult ({len(adult):,} people): DP release by education level\n")
    print(result)
    print("\nHow it was protected:")
    print(result.explain())
    loss = result.controller_only
    print(
        "\nController only (computed from raw data, not DP; never shown to analysts): "
        f"{loss.partitions_dropped} of {loss.partitions_nonempty} education levels dropped by "
        f"partition selection; capital gain clamped for {loss.clamping['capital_gain'].clamped} people."
    )


if __name__ == "__main__":
    main()
