"""Running totals over groups chosen at the series' start (dp_core.continual_selection): the budget
split is the engine's own accounting and adds up to the horizon's (epsilon, delta); a group of one
unit is chosen with at most the selection's delta share, computed exactly and independently of the
selection modules (as tests/test_selection_delta.py does), through the path the platform takes."""

from __future__ import annotations

from decimal import localcontext
from fractions import Fraction

import pandas as pd
import pytest
from test_selection_delta import PRECISION, any_of, dec, laplace_tail

import dp_core as dp
from dp_core.accounting import plan_budget, rho_from_eps_delta_tight
from dp_core.continual_selection import choose_groups, first_period_groups, horizon_budget
from dp_core.errors import DPError
from dp_core.noise import laplace_parameters

GRID = [(eps, delta, share, cu) for eps in (0.5, 1.0, 4.0) for delta in (1e-9, 1e-6) for share in (0.1, 0.5)
        for cu in (1, 3)]


@pytest.mark.parametrize("eps, delta, share, cu", GRID[::3])
def test_the_horizon_budget_is_the_engines_split_and_adds_up_to_the_declared_one(eps, delta, share, cu):
    """The selection gets the share f of epsilon and delta, the tree the rest as rho (tight zCDP
    conversion); together exactly the declared (epsilon, delta), charged once. The same numbers as
    the engine's plan for a Laplace-threshold selection of weight f / (1 - f) beside one Gaussian
    aggregate under the zCDP pool accountant."""
    budget = horizon_budget(eps, delta, share)
    assert (budget.selection.epsilon, budget.selection.delta) == pytest.approx((share * eps, share * delta), rel=1e-12)
    assert budget.selection.epsilon + budget.tree_epsilon == pytest.approx(eps, rel=1e-12)
    assert budget.selection.delta + budget.tree_delta == pytest.approx(delta, rel=1e-12)
    assert budget.rho == rho_from_eps_delta_tight(budget.tree_epsilon, budget.tree_delta)
    query = dp.Query([dp.count()], privacy_unit="u", group_by=("g",), epsilon=eps, delta=delta,
                     max_partitions_contributed=cu, selection="laplace-threshold",
                     selection_weight=share / (1 - share), noise="gaussian")
    engine = plan_budget(query, accountant="zcdp")
    assert engine.selection_share.epsilon == pytest.approx(budget.selection.epsilon, rel=1e-12)
    assert engine.selection_share.delta == pytest.approx(budget.selection.delta, rel=1e-12)
    assert engine.aggregate_shares[0].rho == pytest.approx(budget.rho, rel=1e-8)
    public = horizon_budget(eps, delta)  # public groups: the whole budget is the tree's
    assert public.selection is None and public.rho == rho_from_eps_delta_tight(eps, delta)
    with pytest.raises(DPError, match="share"):
        horizon_budget(eps, delta, 1.0)


def first_period(cu: int) -> pd.DataFrame:
    """Three groups of 50 units, and one unit (id 10^6) alone in C_u + 2 groups of its own with many
    rows each (a unit counts in its first C_u groups, so C_u of them have one unit, the others none)."""
    rows = [(1000 * g + u, f"big{g}") for g in range(3) for u in range(50)]
    rows += [(10**6, f"solo{j}") for j in range(cu + 2) for _ in range(5)]
    return pd.DataFrame(rows, columns=["pid", "club"])


@pytest.mark.parametrize("eps, delta, share, cu", GRID)
def test_a_group_of_one_unit_is_chosen_with_at_most_the_selections_delta_share(eps, delta, share, cu):
    """Through the platform's path (horizon_budget, then choose_groups on the first period's rows):
    the unit alone in its C_u groups counts 1 in each, and any of them is chosen with chance at
    most f delta at the path's threshold, computed from the discrete Laplace law the sampler draws
    (decimal arithmetic, 100 digits); one step lower it would exceed it (the smallest threshold)."""
    budget = horizon_budget(eps, delta, share)
    data = first_period(cu)
    labels, counts = first_period_groups(data, unit="pid", group_by="club", max_groups=cu)
    solo = dict(zip(labels, counts))
    assert [solo[f"solo{j}"] for j in range(cu + 2)] == [1] * cu + [0, 0]
    chosen = choose_groups(data, unit="pid", group_by="club", max_groups=cu, share=budget.selection)
    assert set(chosen.groups) <= set(labels) and chosen.groups == sorted(chosen.groups)
    assert (chosen.epsilon, chosen.delta, chosen.max_groups) == (budget.selection.epsilon, budget.selection.delta, cu)
    scale = laplace_parameters(Fraction(cu) / Fraction(chosen.epsilon)).scale  # the law the sampler draws
    assert scale >= Fraction(cu) / Fraction(eps * share)
    with localcontext() as ctx:
        ctx.prec = PRECISION
        # f delta from the declaration, not from the code under test (the share's float is that product rounded)
        allowed = dec(chosen.delta)
        assert abs(allowed - dec(share) * dec(delta)) <= allowed * dec(2.0**-52)
        at = any_of(laplace_tail(scale, chosen.threshold - 1), cu)  # count 1 + K >= T in any of C_u groups
        below = any_of(laplace_tail(scale, chosen.threshold - 2), cu)
        assert at <= allowed, (float(at), float(allowed))
        assert below > allowed, (float(below), float(allowed))


def test_the_first_period_counts_are_the_bounded_distinct_units():
    """Each unit once per group and in its first C_u groups (sorted order) only; no group column, refused."""
    data = pd.DataFrame([(1, "b"), (1, "a"), (1, "c"), (2, "c"), (2, "c"), (3, None)], columns=["pid", "club"])
    labels, counts = first_period_groups(data, unit="pid", group_by="club", max_groups=2)
    assert labels == ["a", "b", "c"] and counts.tolist() == [1, 1, 1]
    with pytest.raises(DPError, match="group column 'region'"):
        first_period_groups(data, unit="pid", group_by="region", max_groups=1)
    days = pd.DataFrame({"pid": [1, 2], "day": pd.to_datetime(["2026-01-01", "2026-01-02"])})
    with pytest.raises(DPError, match="text or numbers; the group column 'day' holds datetime values"):
        first_period_groups(days, unit="pid", group_by="day", max_groups=1)
    assert choose_groups(data.iloc[:0], unit="pid", group_by="club", max_groups=1,
                         share=horizon_budget(1.0, 1e-6, 0.25).selection).groups == []
