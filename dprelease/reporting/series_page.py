"""The series page: one dataset series' released statistics over time (public).

Built only from what was published: each period's signed release (its `results.json` rows, which
are the DP values and their intervals, and its manifest facts: epsilon, delta, when, by whom
approved). For each statistic an SVG line chart over the periods with the confidence interval as a
band (one line per group, the largest groups when there are many), the table of values with their
intervals, the epsilon of each period and the series' total under the composition the controller
chose (parallel over disjoint snapshots, or sequential under one series cap).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from markupsafe import Markup

from .charts import svg_text
from .pages import _PALETTE, environment

#: groups drawn per chart (the rest are in the table): more lines are unreadable
MAX_LINES = 8
_LINE_COLOURS = (_PALETTE["blue"], _PALETTE["red"], _PALETTE["green"], "#8e44ad", "#d35400", "#16a085",
                 "#7f8c8d", "#2c3e50")

COMPOSITION_TEXT = {
    "parallel": ("Each period's data holds different people (disjoint snapshots), so by parallel composition "
                 "the series as a whole is (ε, δ)-differentially private with the largest per-period ε and δ, "
                 "not their sum. Each period may spend at most ε = {cap}."),
    "sequential": ("The same people may appear in every period, so by sequential composition the series spends "
                   "the sum of the periods' ε and δ, under one series cap of ε = {cap}."),
}


@dataclass
class Period:
    """One published period of the series, as read back from its signed release."""

    snapshot: str
    release_id: str
    path: str  # relative link to the release's report
    epsilon: float
    delta: float
    published_at: str
    approved_by: str
    manifest_sha256: str
    rows: list[dict] = field(default_factory=list)  # the released table: group keys, value, _ci_low, _ci_high
    title: str = ""
    public: dict = field(default_factory=dict)  # the release's public view (results.json): group_by, aggregates


def _group_label(row: dict, keys: list[str]) -> str:
    return " / ".join(str(row.get(k)) for k in keys) if keys else "all"


def _series_values(periods: list[Period], keys: list[str], statistic: str) -> dict[str, list[tuple]]:
    """group -> one (value, low, high) per period (NaN where the group was not released that period)."""
    out: dict[str, list[tuple]] = {}
    for i, period in enumerate(periods):
        for row in period.rows:
            group = _group_label(row, keys)
            cells = out.setdefault(group, [(np.nan, np.nan, np.nan)] * len(periods))
            cells[i] = tuple(np.nan if row.get(c) is None else float(row[c])
                             for c in (statistic, f"{statistic}_ci_low", f"{statistic}_ci_high"))
    return out


def drawn_groups(values: dict[str, list[tuple]]) -> list[str]:
    """The groups a chart draws: the MAX_LINES largest by their mean released value."""
    def mean(group: str) -> float:
        finite = [v[0] for v in values[group] if np.isfinite(v[0])]
        return float(np.mean(finite)) if finite else -np.inf

    return sorted(values, key=lambda g: (-mean(g), g))[:MAX_LINES]


def series_chart_svg(statistic: str, labels: list[str], values: dict[str, list[tuple]],
                     groups: list[str] | None = None) -> str:
    """A statistic over the periods: a line per group, its confidence interval as a shaded band.
    `groups`: the groups to draw, in colour order (the same colour for a group in every chart)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 3.8))
    ax = fig.subplots()
    x = np.arange(len(labels))
    order = [g for g in (groups or drawn_groups(values)) if g in values]
    for colour, group in zip(_LINE_COLOURS, order):
        value, low, high = (np.asarray(c, dtype=float) for c in zip(*values[group]))
        band = np.isfinite(low) & np.isfinite(high)
        if band.any():
            ax.fill_between(x, np.where(band, low, np.nan), np.where(band, high, np.nan), color=colour, alpha=0.18,
                            linewidth=0)
        ax.plot(x, value, marker="o", markersize=3, color=colour, linewidth=1.5, label=group)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(statistic)
    ax.set_title(f"{statistic} per period (band: confidence interval)", fontsize=10)
    ax.grid(axis="y", color="#e5e8ef", linewidth=0.6)
    if len(order) > 1:
        ax.legend(fontsize=8, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return svg_text(fig)


STATISTIC_TEXT = {"COUNT": "Rows counted", "SUM": "Values summed",
                  "COUNT_DISTINCT": "Distinct people counted"}


def running_chart_svg(document: dict, group: str) -> str:
    """One group's running total: the period values, the totals to date with their band, and the
    naive sum's wider band around the same totals."""
    from matplotlib.figure import Figure

    rows = [r for r in document["rows"] if r["group"] == group]
    labels = [r["snapshot"] for r in rows]
    x = np.arange(len(rows))
    total = np.array([r["total"] for r in rows])
    fig = Figure(figsize=(8.5, 3.8))
    ax = fig.subplots()
    naive = np.array([r["naive_ci_halfwidth"] for r in rows])
    ax.fill_between(x, total - naive, total + naive, color=_PALETTE["red"], alpha=0.12, linewidth=0,
                    label="naive sum of monthly releases: its interval")
    ax.fill_between(x, [r["total_ci_low"] for r in rows], [r["total_ci_high"] for r in rows], color=_PALETTE["blue"],
                    alpha=0.3, linewidth=0, label="total to date: its interval")
    ax.plot(x, total, marker="o", markersize=3, color=_PALETTE["blue"], linewidth=1.5, label="total to date")
    ax.errorbar(x, [r["value"] for r in rows], yerr=[r["value"] - r["value_ci_low"] for r in rows], fmt="s",
                markersize=3, color=_PALETTE["green"], linewidth=1, label="period value (interval)")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_title(f"{document['name']}: {group}", fontsize=10)
    ax.grid(axis="y", color="#e5e8ef", linewidth=0.6)
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    return svg_text(fig)


def running_context(document: dict | None, budget: dict) -> dict | None:
    """What the page shows of the series' running total (public values only), or None."""
    if not document:
        return None
    from dp_core import display

    integer = document["statistic"] in ("COUNT", "COUNT_DISTINCT")
    bound = document["bound"]
    if document["statistic"] == "COUNT_DISTINCT":
        bound_text = "once, in the period they first appear"
    else:
        bound_text = (f"at most {display.value(bound['per_period'])} per period, in at most {bound['periods']} "
                      "period(s) of the horizon")
    bound_text += f", in at most {bound['max_groups']} group(s)"
    rows = [{"snapshot": r["snapshot"], "group": r["group"],
             "value_text": display.interval(r["value"], r["value_ci_low"], r["value_ci_high"], integer),
             "total_text": display.interval(r["total"], r["total_ci_low"], r["total_ci_high"], integer),
             "naive_text": display.halfwidth(r["naive_ci_halfwidth"], integer)} for r in document["rows"]]
    last = document["rows"][-1] if document["rows"] else None  # none when no group was chosen
    ratio = (f"{100 * last['total_ci_halfwidth'] / last['naive_ci_halfwidth']:.0f}%"
             if last and last["naive_ci_halfwidth"] > 0 else None)
    charts = [{"svg": Markup(running_chart_svg(document, group)),
               "caption": f"{group}: the totals to date with their interval (dark band), the naive sum's interval "
                          "around them (light band), and each period's value with its interval."}
              for group in document["groups"][:MAX_LINES]]
    return {**document, "rows": rows, "charts": charts, "ratio": ratio, "last_period": last["snapshot"] if last else None,
            "statistic_text": STATISTIC_TEXT[document["statistic"]], "bound_text": bound_text,
            "release_id": (budget.get("running_total") or {}).get("release_id", "")}


def render_series_page(name: str, title: str, periods: list[Period], keys: list[str], statistics: list[str],
                       budget: dict, refusals: list[dict], confidence: float | None, verify_hint: str,
                       running: dict | None = None) -> str:
    """The series page (self-contained HTML: inline CSS and SVG, no scripts); `running`: the
    series' released running total (dprelease.running_total), shown first."""
    labels = [p.snapshot for p in periods]
    charts, tables, groups = [], [], None
    for statistic in statistics:
        values = _series_values(periods, keys, statistic)
        groups = groups or drawn_groups(values)  # the first statistic's largest groups, in every chart
        charts.append({"name": statistic, "svg": Markup(series_chart_svg(statistic, labels, values, groups))})
        tables.append({"name": statistic, "rows": [
            {"snapshot": period.snapshot, "group": group, "value": values[group][i][0], "low": values[group][i][1],
             "high": values[group][i][2]}
            for i, period in enumerate(periods) for group in sorted(values) if np.isfinite(values[group][i][0])]})
    composition = budget["composition"]
    return environment().get_template("series.html").render(
        title=title, name=name, periods=periods, charts=charts, tables=tables, budget=budget, keys=keys,
        composition_text=COMPOSITION_TEXT[composition].format(cap=f"{budget['epsilon_cap']:g}"),
        refusals=refusals, confidence=confidence, verify_hint=verify_hint, running=running_context(running, budget))
