"""Choosing epsilon on Adult, the two ways (run: .venv/bin/python examples/choose_epsilon.py).

1. From the privacy risk indicator: "how many people who are not US-born women are there?" with
   p = 50, public mode (data-free choice, then a fresh release).
2. From trust, sensitivity and tolerable risk: the seed's worked example (one count that gets the
   whole epsilon), then the same tolerance for a whole plan (selection and three aggregates).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from adult_release import load_adult

import dp_core as dp
from dp_core import pri, risk


def main() -> None:
    adult = load_adult()
    query = dp.Query([dp.count(upper=1, name="women_born_abroad")], privacy_unit="person_id", epsilon=1.0,
                     where="native_country <> 'United-States' AND sex = 'Female'")
    result = pri.release_with_pri(query, adult, p=50)
    choice = result.epsilon_choice
    print(f"PRI, {choice.mode} mode, p = {choice.p:g}: epsilon = {choice.epsilon:g}")
    print(f"  guarantee: {choice.guarantee}")
    print(f"  released: {result.readable_table().to_string(index=False)}")
    print("  controller only, PRI range of one probe per candidate (min / median / max):")
    for r in result.controller_only.pri_ranges[:8]:
        print(f"    epsilon {r.epsilon:<6g} {r.minimum:10.3f} {r.median:10.3f} {r.maximum:10.3f}  {'passes' if r.passed else ''}")

    c = risk.choose_epsilon(trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=4, m=2)
    print(f"\nRisk model: epsilon = {c.epsilon:.3g} (noise needs >= {c.epsilon_noise:.3g}, risk allows <= {c.epsilon_risk:.3g})")
    print(f"  {c.summary}")

    plan = dp.Query([dp.count(name="people"), dp.avg("age", 17, 90, name="average_age"),
                     dp.avg("hours_per_week", 1, 99, name="weekly_hours")], privacy_unit="person_id", epsilon=1.0,
                    group_by=("education",))
    c = risk.choose_epsilon_for_plan(plan, trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=16, m=2,
                                     integer_columns={"age", "hours_per_week"})
    print(f"\nRisk model for the plan: epsilon = {c.epsilon:.3g} (noise needs >= {c.epsilon_noise:.3g}, "
          f"risk allows <= {c.epsilon_risk:.3g})")
    print(f"  {c.summary}")
    result = dp.execute(dataclasses.replace(plan, epsilon=c.epsilon, confidence=c.confidence), adult)
    print(result)


if __name__ == "__main__":
    main()
