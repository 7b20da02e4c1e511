"""Running totals over groups chosen privately at the series' start (issue 42): the first period's
data picks the groups, once, by the engine's own partition selection; the horizon's tree then
totals exactly those groups for all T periods.

Declared without public groups, a running total by group spends a stated share f of the horizon's
(epsilon, delta) on choosing its groups from period 1's data, and the rest on the tree
(dp_core.continual). The groups are chosen once, at the first release, kept with the tree's sealed
node noise, and never chosen again: a group that first appears in a later period is not in the
totals. Choosing again each period would spend the selection's delta again each period (a group of
one unit would get T chances to appear).

The selection is the engine's discrete Laplace threshold (partition_selection.select_laplace_threshold,
the engine's choice for COUNT(DISTINCT unit)): each group's number of distinct units in period 1
plus discrete Laplace noise of scale C_u / eps_s is kept when it reaches the integer threshold T of
`partition_selection.discrete_laplace_threshold`, the smallest with which a unit alone in C_u groups
shows any of them with chance at most delta_s.

The per-unit bound, for both parts. A unit's own rows decide its groups, by the same rule in both
(dp_core.continual_bounding: its first C_u groups, by first period, then by the groups' sorted
order), so adding or removing one unit changes:

- the selection's distinct-unit counts of period 1 by 1 in at most C_u groups (L0 <= C_u,
  L_inf = 1): what the threshold's scale C_u / eps_s and its per-group delta
  d = 1 - (1 - delta_s)^(1/C_u) are calibrated to;
- the tree's nodes, over the chosen groups G, by Delta_2^2 = C_u sum_{h < m} (...) (continual.py's
  docstring): a unit keeps its first C_u groups of G, so the bound is the same whatever G is.

The budget (`horizon_budget`), with f the declared `selection_share`:

    selection: (eps_s, delta_s) = (f eps, f delta)                         (eps_s, delta_s)-DP
    tree:      rho = rho_from_eps_delta_tight((1 - f) eps, (1 - f) delta)   rho-zCDP, hence
                                                                            ((1 - f) eps, (1 - f) delta)-DP
    horizon:   (eps_s + (1 - f) eps, delta_s + (1 - f) delta) = (eps, delta)

by basic composition, which holds when the second mechanism is chosen from the first one's output
(here: the tree runs on the groups the selection released; for each G it is rho-zCDP with the same
sensitivity), as in Dwork and Roth, "The Algorithmic Foundations of Differential Privacy" (2014).
This is the engine's own accounting (accounting.plan_budget) of a query with a Laplace-threshold
selection of weight f / (1 - f) beside a Gaussian aggregate of weight 1 under the "zcdp" pool
accountant: epsilon and delta split in proportion to the weights, the Gaussian part converted once
to rho (Canonne, Kamath and Steinke 2020), basic composition with the selection. With public groups
(f = 0) the whole (epsilon, delta) goes to the tree, as before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .accounting import Share, rho_from_eps_delta_tight
from .continual_bounding import bounded_period_values
from .errors import DPError
from .partition_selection import select_laplace_threshold

#: the strategy that chooses a horizon's groups (the only one: its decision is one public threshold)
STRATEGY = "laplace-threshold"
#: the share of the horizon's (epsilon, delta) a declaration without public groups gives the selection
DEFAULT_SELECTION_SHARE = 0.25


@dataclass(frozen=True)
class HorizonBudget:
    """A horizon's (epsilon, delta) split between the group selection (None with public groups) and the tree."""

    epsilon: float
    delta: float
    selection: Share | None
    tree_epsilon: float
    tree_delta: float
    rho: float  # the tree's, for all T periods


def horizon_budget(epsilon: float, delta: float, selection_share: float | None = None) -> HorizonBudget:
    """Split (epsilon, delta) for a horizon (module docstring): the selection gets the share f of both,
    the tree the rest, converted once to rho by the tight zCDP conversion."""
    if selection_share is None:
        return HorizonBudget(epsilon, delta, None, epsilon, delta, rho_from_eps_delta_tight(epsilon, delta))
    if not 0 < selection_share < 1:
        raise DPError(f"the selection's share of the horizon's budget must be in (0, 1), got {selection_share!r}")
    share = Share("group selection at the series' start", epsilon * selection_share, delta * selection_share)
    tree_epsilon, tree_delta = epsilon - share.epsilon, delta - share.delta
    return HorizonBudget(epsilon, delta, share, tree_epsilon, tree_delta,
                         rho_from_eps_delta_tight(tree_epsilon, tree_delta))


@dataclass(frozen=True)
class GroupSelection:
    """The groups chosen for a horizon and the public facts of how: kept (sealed) with the tree's noise."""

    groups: list  # the released groups, in sorted order
    threshold: int  # T: a group is kept when its noisy count of distinct units reaches it
    epsilon: float
    delta: float
    max_groups: int
    strategy: str = STRATEGY

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GroupSelection:
        return cls(**data)

    @property
    def description(self) -> str:
        return (f"chosen once, on the first period's data, by the engine's partition selection: a group's number "
                f"of distinct people plus discrete Laplace noise (scale {self.max_groups / self.epsilon:.4g}) had to "
                f"reach {self.threshold}")


def first_period_groups(first_period: pd.DataFrame, *, unit: str, group_by: str, max_groups: int
                        ) -> tuple[list, np.ndarray]:
    """(every group of the first period in sorted order, its number of distinct units): each unit
    counted in its first C_u groups only (continual_bounding's rule), the selection's input."""
    if group_by not in first_period.columns:
        raise DPError(f"the group column {group_by!r} is not in the data")
    labels = sorted(pd.unique(first_period[group_by].dropna()).tolist(), key=lambda g: (type(g).__name__, g))
    odd = next((g for g in labels if not isinstance(g, (str, int, float))), None)
    if odd is not None:  # the chosen groups are kept (sealed, published) as text or numbers
        raise DPError(f"groups chosen from the data are text or numbers; the group column {group_by!r} holds "
                      f"{type(odd).__name__} values (group by a text column)")
    if not labels:
        return [], np.zeros(0, dtype=np.int64)
    counts = bounded_period_values(first_period.assign(_period=1), unit=unit, period="_period",
                                   statistic="COUNT_DISTINCT", periods=1, groups=labels, group_by=group_by,
                                   max_groups=max_groups, horizon=1)
    return labels, counts[0]


def choose_groups(first_period: pd.DataFrame, *, unit: str, group_by: str, max_groups: int,
                  share: Share | None) -> GroupSelection:
    """Choose a horizon's groups from its first period's rows by the engine's Laplace threshold
    (fresh CSPRNG noise): called once per horizon; its result is kept and reused, never redrawn."""
    if share is None:
        raise DPError("choosing groups needs the selection's share of the horizon's budget")
    labels, counts = first_period_groups(first_period, unit=unit, group_by=group_by, max_groups=max_groups)
    selection = select_laplace_threshold(counts, share, max_groups)
    return GroupSelection(groups=[g for g, k in zip(labels, selection.keep) if k], threshold=int(selection.threshold),
                          epsilon=share.epsilon, delta=share.delta, max_groups=max_groups)
