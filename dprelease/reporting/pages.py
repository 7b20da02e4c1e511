"""HTML pages: self-contained release reports (jinja2 templates in the top-level `templates/`, inline CSS and SVG).

Three audiences (platform.md, "People and what each may see"):

- `render_analyst_report`: the public view of one release. Built only from what is differentially
  private or derived from public parameters (`DPResult.table`, `budget`, `mechanisms`, the query,
  `inferred_bounds`, `epsilon_choice.public_summary()`). It never reads `result.controller_only`
  (invariant 4): the analyst template is rendered from `_public_context`, which does not touch it.
- `render_controller_report`: the same page plus a section computed from raw data (partition loss,
  clamping loss, bounding loss, exact against released values, PRI ranges): NOT differentially
  private, for the trusted controller only.
- `render_index`: the publication index (one row per published release).

Reports load nothing from the network: CSS is inline, charts are inline SVG (`svg_chart`; the PRI
ranges chart, matplotlib).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from dp_core import display
from dp_core import risk as risk_model
from dp_core.bounds import FALLBACK_NOTE

from . import charts
from .svg_chart import Chart


def _templates_dir() -> Path:
    """The report templates: the repository's top-level templates/ (the design card's place) in a
    checkout; the wheel installs them inside this package (pyproject.toml's package-dir)."""
    here = Path(__file__).resolve()
    places = (here.parent / "templates", here.parents[2] / "templates")
    for place in places:
        if place.is_dir():
            return place
    raise ImportError(f"the report templates are missing (neither {places[0]} nor {places[1]}): reinstall dprelease")


TEMPLATES = _templates_dir()

#: the yes/no attribute of the plain-words explanation (n = 2 possible values, one output)
EXPLAIN_N = 2

#: ctx.epsilon_mode in plain words (public: how the number was arrived at, not any data about it)
EPSILON_MODES = {
    "fixed": "fixed in the request",
    "pri": "chosen by the platform with the privacy risk indicator test (a fresh draw at the chosen epsilon)",
    "risk": "chosen from the data owner's trust in the recipient, the data's sensitivity and the tolerable risk",
}

MISSING_GROUPS_NOTE = (
    "Some groups may be missing from this table: groups are released only when enough people are "
    "in them, and that choice is itself made with noise (partition selection). A missing group may "
    "be small or may not exist; its absence says nothing reliable about any one person."
)

_METADATA = {"Creator": None, "Date": None, "Format": None, "Type": None}
_PALETTE = {"blue": "#2d6cdf", "grey": "#b0b7c3", "red": "#c0392b", "green": "#4c9a6a", "dark": "#333333"}


@dataclass
class ReleaseContext:
    """Facts about a release that are not in the DPResult: who asked, who approved, when, how."""

    release_id: str
    dataset: str
    dataset_fingerprint: str
    privacy_unit: str
    request_text: str  # the SQL or the release spec, as submitted
    requested_by: str | None
    approved_by: str | None
    decided_at: str | None
    created_at: str
    epsilon_mode: str  # "fixed" | "pri" | "risk"
    epsilon_explanation: str  # plain words: how epsilon was chosen
    risk_summary: str | None = None  # one sentence (risk mode), public parameters only
    charts: dict[str, str] = field(default_factory=dict)  # name -> SVG text (controller report)
    verify_hint: str = "dprelease verify <release directory>"
    signer_fingerprint: str = ""  # the publisher's key fingerprint (readers pin the key they got out of band)
    risk_warning: str = ""  # controller report: the risk is above the tolerable risk (words, shown in red)
    title: str = ""  # the request's title: the report's heading
    utility: dict | None = None  # utility signal (name, description, params, f_dp, f_raw, status)
    promise: object | None = None  # dp_core.risk.PlanRiskChoice when the risk model chose epsilon (public)


# --------------------------------------------------------------------------------------------
# jinja2 environment and formatting


@lru_cache(maxsize=1)
def environment() -> Environment:
    """The templates' environment: autoescape on for HTML, undefined variables are errors."""
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = fmt_number
    env.filters["pct"] = fmt_percent
    env.filters["budget"] = display.budget
    return env


def fmt_number(x) -> str:
    """A number for a table cell: integers in full, others with up to 4 decimals; '—' for none."""
    if x is None:
        return "—"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v):
        return "—"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if v.is_integer() and abs(v) < 1e15:
        return f"{v:.0f}"
    if abs(v) >= 1e15 or abs(v) < 1e-4:
        return f"{v:.6g}"
    return f"{v:.4f}".rstrip("0").rstrip(".")


def fmt_percent(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{100 * float(x):.{digits}f}%"


def _cell(x) -> str:
    """A group key or text cell; a missing one (NULL: None, NaN, pandas' NA of a nullable integer or
    boolean column, NaT of a date) as '—'."""
    if x is None or x is pd.NA or x is pd.NaT or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, (float, np.floating, int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return fmt_number(x)
    return str(x)


# --------------------------------------------------------------------------------------------
# SVG charts (inline)


def _edge_label(x: float) -> str:
    if x == 0:
        return "0"
    k = math.log2(abs(x))
    if k.is_integer() and abs(x) >= 1024:
        return f"{'-' if x < 0 else ''}2^{int(k)}"
    return f"{x:g}"


def bounds_histogram_svg(b, lower: float | None = None, upper: float | None = None) -> str:
    """The DP log-histogram behind inferred bounds: noisy count per bin, the threshold, the bounds.

    Public: the noisy counts are DP. Shows the bins around those above the threshold (the others
    hold noise only). lower/upper: the bounds used where `b` inferred only one (the other was given:
    b's is None)."""
    lower = b.lower if lower is None else lower
    upper = b.upper if upper is None else upper
    counts = np.asarray(b.noisy_counts, dtype=float)
    edges = list(b.bin_edges)
    idx = np.flatnonzero(counts >= b.threshold)
    inside = [i for i, (lo, hi) in enumerate(edges) if hi > lower and lo < upper]
    marks = list(idx) + inside[:1] + inside[-1:]
    if not marks:
        marks = [int(np.argmax(counts))]
    first = max(min(marks) - 3, 0)
    last = min(max(marks) + 3, len(edges) - 1)
    sel = range(first, last + 1)
    y = counts[first:last + 1]
    colours = [_PALETTE["blue"] if counts[i] >= b.threshold else _PALETTE["grey"] for i in sel]
    chart = Chart(f"Noisy histogram of {b.aggregate} per person (bins double in width); "
                  f"bounds chosen: [{lower:g}, {upper:g}]", y_label="noisy count of people",
                  categories=[f"[{_edge_label(edges[i][0])}, {_edge_label(edges[i][1])})" for i in sel],
                  symlog_threshold=10.0)
    chart.bars(y, _PALETTE["blue"], colours=colours)
    chart.hline(b.threshold, _PALETTE["red"], f"threshold {b.threshold:g}")
    return chart.svg()


def exact_vs_released_svg(name: str, groups: list[str], exact: list[float], released: list[float],
                          low: list[float], high: list[float]) -> str:
    """Controller only: per group, the exact value beside the released one (with its interval)."""
    chart = Chart(f"{name}: exact against released value per group", y_label=name, categories=list(groups),
                  width=max(600.0, min(45.0 * len(groups) + 200, 1400.0)), height=380.0)
    chart.bars(exact, _PALETTE["grey"], "exact (raw data, not DP)")
    chart.bars(released, _PALETTE["blue"], "released (DP) with interval", low=low, high=high)
    return chart.svg()


# --------------------------------------------------------------------------------------------
# view models


def guessing_percent(epsilon: float, n: int = EXPLAIN_N) -> float:
    """The posterior guessing bound q = 1 / (1 + (n - 1) exp(-eps)), in percent."""
    return 100.0 * risk_model.guessing_bound(epsilon, n)


_ACRONYM = re.compile(r"\bPRI(s?)\b")


def _spell_out(text: str) -> str:
    """Public text with the acronym written out: the analyst page names no controller-side measure."""
    return _ACRONYM.sub(lambda m: "privacy risk indicator" + m.group(1), text)


def _group_labels(table: pd.DataFrame, keys) -> list[str]:
    """Each row's group label ("a, b"; "all" without keys), read column by column: a release of
    thousands of groups is rendered at the end of every release, and a pandas Series per row
    (iterrows) took most of the time."""
    if not keys:
        return ["all"] * len(table)
    return [", ".join(_cell(v) for v in values) for values in zip(*(table[k].tolist() for k in keys))]


def _column(table: pd.DataFrame, name: str) -> list:
    """A column's values as Python objects (NaN for a column the table does not have)."""
    return table[name].tolist() if name in table.columns else [np.nan] * len(table)


def _bounds_rows(result) -> list[dict]:
    inferred = {b.aggregate: b for b in result.inferred_bounds}
    rows = []
    for a in result.query.aggregates:
        b = inferred.get(a.label)
        lower, upper = a.lower, a.upper
        source = "given"
        if b is not None:
            lower = b.lower if a.lower is None else a.lower
            upper = b.upper if a.upper is None else a.upper
            source = ("inferred privately (APPROX_BOUNDS); estimated share of values outside: "
                      f"{fmt_percent(b.outside_share)}")
            if FALLBACK_NOTE in b.record.note:
                source = f"inferred privately (APPROX_BOUNDS), but {FALLBACK_NOTE}"
        if a.kind == "count":
            meaning = "rows per person and group counted at most"
            lower = 0 if lower is None else lower
        elif a.kind == "count_units":
            meaning = "each person counts once per group"
            lower, upper = None, None
            source = "none needed"
        elif a.kind == "quantile":
            meaning = f"{a.q:g}-quantile searched within"
        else:
            meaning = "each person's value limited to"
        rows.append({"name": a.label, "kind": a.kind, "column": a.column or "—", "lower": lower,
                     "upper": upper, "meaning": meaning, "source": source})
    return rows


def _results(result) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """The readable table (value [low, high], as the summary shows it: `DPResult.readable_table`)
    and the numeric one (value, low, high, noise sd)."""
    keys = list(result.query.group_by)
    readable = result.readable_table()
    r_head = list(readable.columns)
    r_rows = [[_cell(v) for v in row] for row in readable.itertuples(index=False, name=None)]
    table = result.table
    n_head = list(keys)
    cols = list(keys)
    for a in result.query.aggregates:
        name = a.label
        for suffix, title in (("", name), ("_ci_low", f"{name} low"), ("_ci_high", f"{name} high"),
                              ("_noise_sd", f"{name} noise sd")):
            if f"{name}{suffix}" in table.columns:
                cols.append(f"{name}{suffix}")
                n_head.append(title)
    n_rows = [[_cell(v) if c in keys else fmt_number(v) for c, v in zip(cols, row)]
              for row in table[cols].itertuples(index=False, name=None)]
    return r_head, r_rows, n_head, n_rows


def promise_rows(result, choice) -> list[dict]:
    """Per statistic: the interval promised when epsilon was chosen (data-free) and the widest one
    the released table shows ((high - low) / 2 over the groups; clipping at a bound only narrows
    it). Public: the promise comes from public parameters, the intervals are DP."""
    if choice is None:
        return []
    rows = []
    for s in choice.promise:
        tol = choice.tolerances.get(s.name)
        if s.halfwidth is None:
            promised = f"no interval promised ({s.note})"
        else:
            group = f" for a group of {s.reference_count:g} people" if s.reference_count else ""
            asked = f"; tolerance asked ±{tol:g}" if tol is not None else ""
            promised = f"{s.halfwidth_text()} at {s.confidence:.0%}{group}{asked}"
        low, high = f"{s.name}_ci_low", f"{s.name}_ci_high"
        delivered = "no interval"
        if low in result.table.columns and len(result.table):
            half = ((result.table[high] - result.table[low]) / 2.0).dropna()
            if len(half):
                smaller = f"; groups under {s.reference_count:g} people are wider" if s.reference_count else ""
                delivered = (f"{display.halfwidth(float(half.max()), display.is_integer_kind(s.kind))} at "
                             f"{result.query.confidence:.0%} "
                             f"(the widest of {len(half)} group(s){smaller})")
        rows.append({"name": s.name, "promised": promised, "delivered": delivered, "headline": tol is not None})
    return rows


#: what the columns of the mechanism table mean (shown under it in the analyst report)
MECHANISM_GLOSSARY = (
    ("Mechanism", "how the noise is drawn: Laplace or Gaussian noise on a fine grid, or a threshold that keeps "
                  "only groups with enough people"),
    ("Sensitivity per group", "how much one person can change one group's value, after the bounds below"),
    ("Groups per person", "how many groups one person may appear in (the rest of their rows are left out)"),
    ("Sensitivity", "how much one person can change all released values together: what the noise must hide"),
    ("Noise scale", "the spread of the noise: the Laplace scale b, or the Gaussian σ, in the statistic's units; "
                    "larger means more privacy and less accuracy"),
    ("epsilon, delta", "this statistic's share of the release's privacy budget (the shares add up to the total)"),
)


def released_values_svg(name: str, groups: list[str], released: list[float], low: list[float],
                        high: list[float], limit: int = 30) -> str:
    """Public: the released value of each group with its interval (the largest `limit` groups)."""
    order = np.argsort(np.nan_to_num(np.asarray(released, dtype=float), nan=-np.inf))[::-1][:limit]
    groups = [groups[i] for i in order]
    rel = np.asarray(released, dtype=float)[order]
    lo, hi = np.asarray(low, dtype=float)[order], np.asarray(high, dtype=float)[order]
    chart = Chart(f"{name}: released value and interval per group", y_label=name, categories=groups,
                  width=max(600.0, min(40.0 * len(groups) + 200, 1400.0)), height=360.0)
    chart.bars(rel, _PALETTE["blue"], low=lo, high=hi)
    return chart.svg()


def _released_charts(result) -> list[dict]:
    """One chart per aggregate of a grouped release (public numbers only)."""
    keys = list(result.query.group_by)
    t = result.table
    if not keys or t.empty:
        return []
    groups = _group_labels(t, keys)
    return [{"name": a.label, "svg": Markup(released_values_svg(
        a.label, groups, t[a.label].tolist(), t[f"{a.label}_ci_low"].tolist(), t[f"{a.label}_ci_high"].tolist()))}
        for a in result.query.aggregates if f"{a.label}_ci_low" in t.columns]


def _public_context(result, ctx: ReleaseContext) -> dict:
    """Everything the analyst report shows. Reads no field of `result.controller_only`."""
    eps = float(result.epsilon_spent)
    q_pct = guessing_percent(eps)
    r_head, r_rows, n_head, n_rows = _results(result)
    choice = result.epsilon_choice.public_summary() if result.epsilon_choice is not None else None
    if choice is not None:
        choice = {"epsilon": choice.get("epsilon"), "mode": choice.get("mode"), "p": choice.get("p"),
                  "rule": choice.get("rule"), "guarantee": _spell_out(choice.get("guarantee") or ""),
                  "candidates": ", ".join(f"{c:g}" for c in choice.get("candidates", [])),
                  "beta": choice.get("beta")}
    bounds = _bounds_rows(result)
    used = {row["name"]: (row["lower"], row["upper"]) for row in bounds}  # a given side included
    histograms = [{"aggregate": b.aggregate, "lower": used[b.aggregate][0], "upper": used[b.aggregate][1],
                   "threshold": b.threshold, "outside_share": b.outside_share,
                   "svg": Markup(bounds_histogram_svg(b, *used[b.aggregate]))}
                  for b in result.inferred_bounds]
    return {
        "ctx": ctx,
        "title": ctx.title or f"Release {ctx.release_id}",
        "released_charts": _released_charts(result),
        "glossary": MECHANISM_GLOSSARY,
        "epsilon": eps,
        "delta": float(result.delta_spent),
        "confidence": result.query.confidence,
        "group_by": list(result.query.group_by),
        "tables": result.tables_summary() if getattr(result, "tables_read", ()) else [],  # SQL: public ones marked
        "max_partitions": result.query.max_partitions_contributed,
        "noise": result.query.noise,
        "partition_selection": result.partition_selection,
        "missing_groups_note": MISSING_GROUPS_NOTE if result.query.private_partitions else None,
        "budget": [{"part": s.part, "epsilon": s.epsilon, "delta": s.delta, "rho": s.rho} for s in result.budget],
        "mechanisms": [m.to_dict() for m in result.mechanisms],
        "bounds": bounds,
        "histograms": histograms,
        "readable_head": r_head,
        "readable_rows": r_rows,
        "numeric_head": n_head,
        "numeric_rows": n_rows,
        "n_groups": len(result.table),
        "notes": list(result.notes),
        "choice": choice,
        "epsilon_mode": EPSILON_MODES.get(ctx.epsilon_mode, ctx.epsilon_mode),
        "guess": {"n": EXPLAIN_N, "prior": 100.0 / EXPLAIN_N, "posterior": q_pct, "odds": math.exp(eps)},
        "controller": None,
        "promise": promise_rows(result, ctx.promise),
    }


def _controller_context(result, ctx: ReleaseContext) -> dict:
    """The controller-only numbers (raw data, NOT differentially private)."""
    co = result.controller_only
    keys = list(result.query.group_by)
    labels = [a.label for a in result.query.aggregates]
    clamping = []
    for name, c in co.clamping.items():
        clamping.append({"name": name, "n_values": c.values, "clamped": c.clamped,
                         "share": (c.clamped / c.values) if c.values else 0.0, "total_shift": c.total_shift})

    exact = co.exact
    if "released" in exact.columns:
        exact = exact[exact["released"].astype(bool)]
    table = result.table
    if keys:
        joined = table.merge(exact, on=keys, how="left", suffixes=("", "__exact"))
    else:
        joined = pd.concat([table.reset_index(drop=True), exact.reset_index(drop=True).add_suffix("__exact")], axis=1)
    unit_col = next((c for c in ("units__exact", "units") if c in joined.columns), None)
    head = list(keys) + (["units (exact)"] if unit_col is not None else [])
    for name in labels:
        head += [f"{name} exact", f"{name} released", "difference"]
    rows = [[_exact_cell(_cell(v)) for v in values] for values in zip(*(joined[k].tolist() for k in keys))] \
        if keys else [[] for _ in range(len(joined))]
    if unit_col is not None:
        for cells, units in zip(rows, joined[unit_col].tolist()):
            cells.append(_exact_cell(fmt_number(units)))
    outside = {"marked": 0, "with_interval": 0}
    for name in labels:
        for cells, ex, rel, low, high in zip(rows, _column(joined, f"{name}__exact"), _column(joined, name),
                                             _column(joined, f"{name}_ci_low"), _column(joined, f"{name}_ci_high")):
            diff = float(rel) - float(ex) if ex is not None and rel is not None else np.nan
            mark = outside_interval(ex, low, high)
            if mark is not None:
                outside["with_interval"] += 1
                outside["marked"] += mark
            cells += [_exact_cell(fmt_number(ex), bool(mark)), _exact_cell(fmt_number(rel)),
                      _exact_cell(fmt_number(diff))]

    # the raw-vs-private chart: the aggregate with the most clamped values, else the first with exact values
    chart = None
    candidates = sorted(labels, key=lambda n: -(co.clamping[n].clamped if n in co.clamping else 0))
    for name in candidates:
        col = f"{name}__exact"
        if col not in joined.columns or not np.isfinite(pd.to_numeric(joined[col], errors="coerce")).any():
            continue
        part = joined[np.isfinite(pd.to_numeric(joined[col], errors="coerce"))]
        limit = 40
        part = part.reindex(part[col].abs().sort_values(ascending=False).index)[:limit]
        groups = _group_labels(part, keys)
        svg = exact_vs_released_svg(
            name, groups, part[col].astype(float).tolist(), part[name].astype(float).tolist(),
            part.get(f"{name}_ci_low", pd.Series(np.nan, index=part.index)).astype(float).tolist(),
            part.get(f"{name}_ci_high", pd.Series(np.nan, index=part.index)).astype(float).tolist(),
        )
        clamped = co.clamping[name].clamped if name in co.clamping else 0
        chart = {"name": name, "svg": Markup(svg), "clamped": clamped, "shown": len(part), "total": len(joined)}
        break

    pri_svg = None
    pri_rows = [{"epsilon": r.epsilon, "minimum": r.minimum, "median": r.median, "maximum": r.maximum,
                 "passed": r.passed} for r in co.pri_ranges]
    if co.pri_ranges and result.epsilon_choice is not None:
        pri_svg = Markup(charts.pri_ranges_svg(co.pri_ranges, result.epsilon_choice.p, result.epsilon_choice.epsilon))
    return {
        "partitions_nonempty": co.partitions_nonempty,
        "partitions_released": co.partitions_released,
        "partitions_dropped": co.partitions_dropped,
        "partition_loss": co.partition_loss,
        "unit_partition_pairs": co.unit_partition_pairs,
        "pairs_dropped_by_bounding": co.pairs_dropped_by_bounding,
        "bounding_share": (co.pairs_dropped_by_bounding / co.unit_partition_pairs) if co.unit_partition_pairs else 0.0,
        "clamping": clamping,
        "exact_head": head,
        "exact_rows": rows,
        "outside": {**outside, "expected": 1.0 - result.query.confidence},
        "chart": chart,
        "pri_rows": pri_rows,
        "pri_svg": pri_svg,
        "extra_charts": [{"name": k, "svg": Markup(v)} for k, v in ctx.charts.items()],
    }


def outside_interval(exact, low, high) -> bool | None:
    """Whether an exact value lies outside the released value's interval [low, high]; None when
    either is not a number (no interval: a quantile; a missing exact value)."""
    try:
        x, lo, hi = float(exact), float(low), float(high)
    except (TypeError, ValueError):
        return None
    if math.isnan(x) or math.isnan(lo) or math.isnan(hi):
        return None
    return not lo <= x <= hi


def _exact_cell(text: str, outside: bool = False) -> dict:
    """A cell of the controller's exact-against-released table: its text, and whether it is an
    exact value outside the released value's interval (marked on the page)."""
    return {"text": text, "outside": outside}


# --------------------------------------------------------------------------------------------
# public API


def render_analyst_report(result, ctx: ReleaseContext) -> str:
    """The analyst report: public numbers only (DP or from public parameters)."""
    return environment().get_template("analyst.html").render(**_public_context(result, ctx))


def render_controller_report(result, ctx: ReleaseContext) -> str:
    """The controller report: the analyst report plus raw-data numbers (NOT DP, controller only)."""
    data = _public_context(result, ctx)
    data["controller"] = _controller_context(result, ctx)
    data["title"] = f"{ctx.title or 'Release ' + ctx.release_id} — controller report"
    return environment().get_template("controller.html").render(**data)


_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def render_index(entries: list[dict], series: list[dict] | None = None) -> str:
    """The publication index: one row per published release, in the order given.

    Each entry: release_id, dataset, title, epsilon, delta, published_at, path (a relative link to
    the release's analyst report; absolute paths and URLs are refused: the directory must stay
    self-contained)."""
    rows = []
    for e in entries:
        path = str(e["path"])
        if _SCHEME.match(path) or path.startswith(("/", "\\")):
            raise ValueError(f"index entry {e.get('release_id')!r}: path must be relative, got {path!r}")
        rows.append({"release_id": str(e["release_id"]), "dataset": str(e["dataset"]), "title": str(e["title"]),
                     "epsilon": e["epsilon"], "delta": e["delta"], "published_at": str(e["published_at"]),
                     "path": path})
    for s in series or []:  # the series pages: relative links too
        if _SCHEME.match(s["path"]) or s["path"].startswith(("/", "\\")):
            raise ValueError(f"series {s.get('name')!r}: path must be relative, got {s['path']!r}")
    return environment().get_template("index.html").render(title="Published releases", entries=rows,
                                                           series=series or [])
