"""The neighbour audit of running totals over T = 8 periods (dp_core.continual), through the
engine's own noise and the real bounding (dp_core.continual_bounding).

D1: 40 units, each in 1-4 of the 8 periods; D2 adds ONE unit present in every period with many
rows. The running total is COUNT with B = 1 in k = 1 period per unit. What an analyst sees after
the horizon is every period's release (its period values and all its prefix totals, 72 numbers),
so one run of the audit is the 8 releases concatenated. RUNS runs per neighbour are vectorised as
RUNS independent groups of one tree (TreeNoise(groups=RUNS)). The claim: rho-zCDP for the whole
horizon, as (epsilon, delta) by the conversion the ledger uses. The broken variants (injected here
by monkeypatch, never in the product) must be caught by the same audit at the same sample size:
a node's noise redrawn each period, and the unit counted in every period instead of k = 1.
"""

from __future__ import annotations

import harness
import numpy as np
import pandas as pd
import pytest

import dp_core.continual as continual
from dp_core import continual_bounding
from dp_core.accounting import zcdp_delta

#: the released counts are whole numbers, kept as float32 (exact) to halve the memory; the harness's
#: fill of -1e300 for an absent value becomes -inf in float32 (still below everything)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

RUNS = 100_000
HORIZON = 8
RHO = 0.3
DELTA = 1e-2
BOUND = continual.ContributionBound(per_period=1, periods=1)


def claimed_epsilon(rho: float = RHO, delta: float = DELTA) -> float:
    """The smallest epsilon (to 1e-4) whose delta from rho-zCDP (CKS conversion) is within DELTA."""
    lo, hi = 0.0, 10.0
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if zcdp_delta(rho, mid) <= delta else (mid, hi)
    return hi


def neighbours() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = [(u, p) for u in range(40) for p in range(1, HORIZON + 1) if (u * 7 + p * 3) % 8 < 1 + u % 4]
    d1 = pd.DataFrame(rows, columns=["uid", "period"])
    star = pd.DataFrame([(999, p) for p in range(1, HORIZON + 1) for _ in range(5)], columns=["uid", "period"])
    return d1, pd.concat([d1, star], ignore_index=True)


def horizon_output(data: pd.DataFrame, runs: int) -> np.ndarray:
    """(runs, 72): every period's published values and prefix totals, for `runs` independent trees."""
    cal = continual.calibrate_tree(horizon=HORIZON, bound=BOUND, rho=RHO, confidence=0.95)
    exact = continual_bounding.bounded_period_values(data, unit="uid", period="period", statistic="COUNT",
                                                     periods=BOUND.periods, per_period=1, horizon=HORIZON)
    tiled = np.repeat(exact, runs, axis=1)
    noise = continual.TreeNoise(groups=runs)
    parts = []
    for t in range(1, HORIZON + 1):
        released = continual.release_period(cal, noise, tiled[:t])
        parts += [released.values.astype(np.float32), released.totals.astype(np.float32)]  # whole counts: exact
    return np.vstack(parts).T


def audit(name: str) -> harness.AuditResult:
    d1, d2 = neighbours()
    return harness.estimate(name, horizon_output(d1, RUNS), horizon_output(d2, RUNS), claimed_epsilon(), DELTA)


def test_running_totals_pass_the_audit():
    result = audit("running total, T = 8")
    print(result.line())
    assert not result.violated, result.line()


def redraw_every_period(self, calibration, period):
    """Broken: each period's release draws the noise of every node it uses again."""
    self.nodes.clear()
    for t in range(1, period + 1):
        for node in continual.nodes_completed_at(t, calibration.horizon):
            self.nodes[node] = continual.discrete_gaussian(None, self.groups,
                                                           variance=calibration.node_variance_parameter)
    return []


def ignore_the_periods_bound(data, **kwargs):
    """Broken: a unit counts in every period it appears in, not in the k declared."""
    return ORIGINAL_BOUNDING(data, **{**kwargs, "periods": HORIZON})


ORIGINAL_BOUNDING = continual_bounding.bounded_period_values


@pytest.mark.parametrize("broken", [redraw_every_period, ignore_the_periods_bound])
def test_broken_running_totals_are_caught(monkeypatch, broken):
    if broken is redraw_every_period:
        monkeypatch.setattr(continual.TreeNoise, "extend", redraw_every_period)
    else:
        monkeypatch.setattr(continual_bounding, "bounded_period_values", ignore_the_periods_bound)
    result = audit(f"running total, broken: {broken.__name__}")
    print(result.line())
    assert result.violated, result.line()
