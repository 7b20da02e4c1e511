"""Accuracy preview: before any budget is reserved, how wide each statistic's interval is expected
to be at the chosen epsilon, from the plan and its public facts only (bounds, C_u, the budget
split, the noise). No data is read, so the preview itself spends nothing (as OpenDP's DP Wizard
offers before a release).

Derivation (dp_core.release.add_noise, dp_core.accounting.plan_budget): an aggregate component
with per-partition sensitivity D and budget share (eps_i, rho_i) gets Laplace noise of scale
b = C_u D / eps_i, or Gaussian noise of sigma = sqrt(C_u) D / sqrt(2 rho_i). The two-sided
interval at the query's confidence 1 - alpha has half-width `dp_core.intervals.sum_halfwidth`
(b ln(1/alpha) for one Laplace; z_(1-alpha/2) sigma for a Gaussian). Sensitivities: a COUNT of
rows clamped to [0, U] per unit has D = U; a count of units D = 1; a SUM of per-unit values in
[L, U] has D = max(|L|, |U|). An AVG = S / N has, to first order, error (e_S - avg e_N) / N: with
|avg| <= max(|L|, |U|) its half-width for a group of n units is at most that of the weighted sum
(b_S / n, max(|L|,|U|) b_N / n). VAR, STDDEV and quantiles depend on the data: not previewed.
The discrete noise the engine draws has the same scale on a fine grid (a difference far below the
half-width).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

import dp_core as dp
from dp_core.accounting import plan_budget
from dp_core.intervals import sum_halfwidth

GROUP_SIZES = (100, 1000)  # the group sizes an AVG preview is given for


def _scale(noise: str, share, sensitivity: float, cu: int) -> float:
    if noise == "gaussian" and share.rho is not None:
        return math.sqrt(cu) * sensitivity / math.sqrt(2.0 * share.rho)
    return cu * sensitivity / share.epsilon


def _halfwidth(noise: str, scales: list[float], alpha: float) -> float:
    return float(sum_halfwidth(noise if noise == "gaussian" else "laplace", np.array([scales]), alpha)[0])


def accuracy_preview(query: dp.Query, epsilon: float) -> list[dict]:
    """One row per aggregate: label, kind, expected half-width (or why there is none)."""
    q = replace(query, epsilon=epsilon)
    budget = plan_budget(q)
    cu, alpha = q.effective_max_partitions, 1.0 - q.confidence
    noise = getattr(q, "noise", "laplace")
    rows = []
    for i, agg in enumerate(q.aggregates):
        row = {"statistic": agg.label, "kind": agg.kind, "halfwidth": None, "note": ""}
        bound = None if agg.upper is None or (agg.kind != "count" and agg.lower is None) else \
            max(abs(agg.upper), abs(agg.lower or 0.0))
        if i in budget.reused:
            share = budget.selection_share
            row["halfwidth"] = _halfwidth("laplace", [cu * 1.0 / share.epsilon], alpha)
            row["note"] = "released from the partition selection's count"
        elif agg.kind == "count_units":
            row["halfwidth"] = _halfwidth(noise, [_scale(noise, budget.component_shares[(i, "count")], 1.0, cu)], alpha)
        elif agg.kind in ("count", "sum") and bound is None:
            row["note"] = "bounds inferred privately (APPROX_BOUNDS): known after the release"
        elif agg.kind in ("count", "sum"):
            row["halfwidth"] = _halfwidth(noise, [_scale(noise, budget.component_shares[(i, agg.kind)], bound, cu)],
                                          alpha)
        elif agg.kind == "avg" and bound is not None:
            b_n = _scale(noise, budget.component_shares[(i, "N")], 1.0, cu)
            b_s = _scale(noise, budget.component_shares[(i, "S")], bound, cu)
            row["by_group_size"] = {n: _halfwidth(noise, [b_s / n, bound * b_n / n], alpha) for n in GROUP_SIZES}
            row["note"] = "depends on the group's size n (at most, to first order)"
        else:
            row["note"] = "depends on the data: known after the release"
        rows.append(row)
    return rows


def preview_markdown(query: dp.Query, epsilon: float) -> str:
    """The preview as a short markdown section (the CLI and the Prefect UI show it)."""
    level = f"{query.confidence:.0%}"
    intro = (f"Expected {level} interval of each released value, from the plan's public facts only "
             "(bounds, groups per person, the budget split); no data was read.")
    lines = [f"## Accuracy preview at epsilon {epsilon:.4g} (before any budget is spent)", intro, "",
             "| statistic | expected interval | note |", "|---|---|---|"]
    for row in accuracy_preview(query, epsilon):
        if row["halfwidth"] is not None:
            shown = f"± {row['halfwidth']:.3g}"
        elif "by_group_size" in row:
            shown = "; ".join(f"± {h:.3g} for {n} people" for n, h in row["by_group_size"].items())
        else:
            shown = "—"
        lines.append(f"| {row['statistic']} | {shown} | {row['note']} |")
    return "\n".join(lines)
