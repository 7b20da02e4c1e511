"""Per aggregate: its per-unit partial (SQL), its noisy components with their sensitivities,
and how the released value and its confidence interval are built from them.

dp-engine.md, table "aggregate / per-unit partial / per-partition sensitivity":
  COUNT(*, U), COUNT(col, U)  rows of the unit, clamped to [0, U]           D = U
  COUNT(DISTINCT unit)        1                                             D = 1
  SUM(col, L, U)              sum of the unit's values, clamped to [L, U]   D = max(|L|, |U|)
  AVG/VAR/STDDEV(col, L, U)   mean of the unit's values, clamped; centred at mid = (L+U)/2:
                              N (D = 1), S = sum(v - mid) (D = half), Q = sum((v-mid)^2) (D = half^2)
  QUANTILE(col, q, L, U)      one of the unit's values, chosen at random    exponential mechanism
The VAR form is centred (Li et al., "Differential Privacy: From Theory to Practice", Alg. 2.4);
the seed's Table 4.2 instead averages col^2 over [0, max(L^2, U^2)], which has a larger sensitivity.

Values that are not numbers (a query may compute them: 1e308 * x, ln(0), 0 * inf): an infinite
per-unit value is clamped to L or U like any other; a NaN in a float column is missing, skipped as
NULL is, and so is a per-unit value that comes out NaN (+inf and -inf among one unit's rows). Both
rules read one unit's own rows only, so the sensitivities above hold for any input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .input_checks import nan_as_null
from .intervals import sum_halfwidth, sum_sd
from .query import Aggregate
from .sql_text import ident, literal

#: per-unit values of real components are quantised to 2^(floor(log2 M) - QUANTUM_BITS), M the
#: largest |value|: a per-unit value is at most 2^33 quanta, so sums of up to 2^29 units fit BIGINT.
QUANTUM_BITS = 32
#: the widest bound an integer statistic is summed at exactly (quantum 1): a unit's value is then at
#: most 2^33 too, so sums of up to 2^29 units fit BIGINT; an integer SUM with wider bounds is quantised
#: as a real one is (its quantum a power of two >= 2), where it overflowed BIGINT (until 2026-11-25:
#: 3,000 units of 2^53 each failed with a conversion error)
EXACT_INTEGER_MAX = 2.0 ** (QUANTUM_BITS + 1)


@dataclass(frozen=True)
class Component:
    """One noisy sum an aggregate needs, computed in SQL as an exact integer number of quanta.

    Summing integers makes the sum independent of the engine's summation order (float sums are
    not: their sensitivity can exceed the bound; Casacuberta et al., CCS 2022). sensitivity_quanta
    is the largest |quantised per-unit value|, hence one unit's largest effect on the sum.
    """

    key: str
    column: str
    quantum: float  # 1 for integer statistics; a power of two for real ones
    sensitivity_quanta: int

    @property
    def sensitivity(self) -> float:
        return self.sensitivity_quanta * self.quantum


def _quantum(lo: float, hi: float) -> float:
    m = max(abs(lo), abs(hi))
    return math.ldexp(1.0, math.floor(math.log2(m)) - QUANTUM_BITS) if m > 0 else 1.0


def _quantise_py(x: float, quantum: float) -> int:
    """Python twin of the SQL quantisation floor(x / quantum + 1/2) (same IEEE operations)."""
    return int(math.floor(x * (1.0 / quantum) + 0.5))


def _real_component(key: str, column: str, expr: str, lo: float, hi: float) -> tuple[Component, str]:
    """A real-valued per-unit value in [lo, hi] (computed by `expr`), summed as integer quanta."""
    quantum = _quantum(lo, hi)
    sens = max(abs(_quantise_py(lo, quantum)), abs(_quantise_py(hi, quantum)))
    sql = f"CAST(coalesce(sum(CAST(floor(CAST({expr} AS DOUBLE) * {literal(1.0 / quantum)} + 0.5) AS BIGINT)), 0) AS BIGINT)"
    return Component(key, column, quantum, sens), sql


def _integer_sum(expr: str) -> str:
    return f"CAST(coalesce(sum({expr}), 0) AS BIGINT)"


@dataclass(frozen=True)
class AggregatePlan:
    """SQL pieces for one aggregate (partial over a unit's rows, per-partition sums, clamping loss)."""

    agg: Aggregate
    partials: dict[str, str]  # alias -> SQL over the unit's raw rows in the partition
    finals: dict[str, str]  # alias -> SQL aggregate over bounded per-unit rows
    components: tuple[Component, ...]
    clamp_columns: tuple[str, str] | None  # (clamped count alias, clamped total alias)
    unit_value: str | None = None  # SQL of one unit's bounded value in a partition (for PRIs)
    histogram_bin: tuple[str, str] | None = None  # quantiles: (per-unit value column, its bin's SQL)
    index: int = 0


def _is_integer_bound(x: float | None) -> bool:
    return x is not None and float(x).is_integer()


class SQL(str):
    """A bound given as SQL (a per-partition column), not as a number."""


def _sql(x) -> str:
    return x if isinstance(x, SQL) else literal(x)


def _clamp_sql(expr: str, lower, upper) -> str:
    """Clamp to [lower, upper], keeping NULL (DuckDB's least/greatest skip NULL arguments, so a
    unit with no value would otherwise count as `lower`)."""
    return f"CASE WHEN {expr} IS NULL THEN NULL ELSE least(greatest({expr}, {_sql(lower)}), {_sql(upper)}) END"


def _clamp_loss(prefix: str, expr: str, lower: float | None, upper: float) -> dict[str, str]:
    """How many per-unit values fell outside the bounds, and by how much in total."""
    lo_cond = f"{expr} < {_sql(lower)} OR " if lower is not None else ""
    lo_excess = f"greatest({_sql(lower)} - {expr}, 0) + " if lower is not None else ""
    return {
        f"{prefix}_nclamped": f"count(*) FILTER (WHERE {lo_cond}{expr} > {_sql(upper)})",
        f"{prefix}_clamped": f"coalesce(sum({lo_excess}greatest({expr} - {_sql(upper)}, 0)), 0)",
    }


def plan_aggregate(index: int, agg: Aggregate, integer_columns: set[str], seed_sql: str, bins: int,
                   partition_bounds: list[tuple[float, float]] | None = None,
                   row_draw: str = "random()", float_columns: set[str] = frozenset()) -> AggregatePlan:
    """Build the SQL pieces for aggregate number `index` (aliases are `_a{index}_...`).

    partition_bounds: the (L, U) of every partition when bounds differ per partition; the SQL
    then clamps with the columns `_a{index}_lo`, `_a{index}_hi`, quanta are sized for the widest
    bounds, and `component_sensitivity` gives each partition's own sensitivity.
    float_columns: the input's float columns, whose NaN (row or per-unit value) is missing."""
    p = f"_a{index}"
    kind = agg.kind
    if partition_bounds is not None:
        return _plan_with_partition_bounds(index, agg, integer_columns, partition_bounds, float_columns)
    real = agg.column in float_columns
    col = nan_as_null(ident(agg.column)) if real else ident(agg.column) if agg.column else None
    per_unit = nan_as_null if real else (lambda sql: sql)  # a unit's sum or mean of +inf and -inf is NaN
    if kind == "count_units":
        return AggregatePlan(agg, {}, {f"{p}_n": "count(*)"}, (Component("count", f"{p}_n", 1.0, 1),), None, "1")
    if kind == "count":
        src = f"count({col})" if agg.column else "count(*)"
        v = ident(f"{p}_raw")
        finals = {f"{p}_sum": _integer_sum(f"least({v}, {literal(agg.upper)})")}
        finals.update(_clamp_loss(p, v, None, agg.upper))
        comp = Component("count", f"{p}_sum", 1.0, int(agg.upper))
        return AggregatePlan(agg, {f"{p}_raw": src}, finals, (comp,), (f"{p}_nclamped", f"{p}_clamped"),
                             f"least({v}, {literal(agg.upper)})")
    v = ident(f"{p}_raw")
    lo, hi = float(agg.lower), float(agg.upper)
    if kind == "sum":
        clamped = _clamp_sql(v, agg.lower, agg.upper)
        if (agg.column in integer_columns and _is_integer_bound(agg.lower) and _is_integer_bound(agg.upper)
                and max(abs(lo), abs(hi)) <= EXACT_INTEGER_MAX):
            comp, total = Component("sum", f"{p}_sum", 1.0, int(max(abs(lo), abs(hi)))), _integer_sum(clamped)
        else:
            comp, total = _real_component("sum", f"{p}_sum", clamped, lo, hi)
        finals = {f"{p}_sum": total}
        finals.update(_clamp_loss(p, v, agg.lower, agg.upper))
        partial = {f"{p}_raw": per_unit(f"sum({col})")}
        return AggregatePlan(agg, partial, finals, (comp,), (f"{p}_nclamped", f"{p}_clamped"),
                             clamped)
    if kind in ("avg", "var", "stddev"):
        mid = (lo + hi) / 2.0
        centred = f"({_clamp_sql(v, lo, hi)} - {literal(mid)})"
        c_lo, c_hi = lo - mid, hi - mid  # the same IEEE operations as the SQL: exact extremes
        s_comp, s_sql = _real_component("S", f"{p}_S", centred, c_lo, c_hi)
        finals = {f"{p}_N": f"count({v})", f"{p}_S": s_sql}
        comps = [Component("N", f"{p}_N", 1.0, 1), s_comp]
        if kind != "avg":
            q_comp, q_sql = _real_component("Q", f"{p}_Q", f"{centred} * {centred}", 0.0, max(c_lo * c_lo, c_hi * c_hi))
            finals[f"{p}_Q"] = q_sql
            comps.append(q_comp)
        finals.update(_clamp_loss(p, v, lo, hi))
        partial = {f"{p}_raw": per_unit(f"avg({col})")}
        return AggregatePlan(agg, partial, finals, tuple(comps), (f"{p}_nclamped", f"{p}_clamped"),
                             _clamp_sql(v, lo, hi))
    if kind == "quantile":
        # one of the unit's non-null values, each row equally likely (a per-row random key; which
        # value a unit contributes depends on its own rows only, so privacy does not rest on it)
        # (row_draw: SQL of a uniform draw per row; Spark wants it drawn in a projection before the GROUP BY)
        partial = {f"{p}_raw": f"arg_min({col}, {row_draw}) FILTER (WHERE {col} IS NOT NULL)"}
        scaled = f"({_clamp_sql(v, lo, hi)} - {literal(lo)}) * {literal(bins / (hi - lo))}"
        bin_sql = f"least(CAST(floor({scaled}) AS INTEGER), {bins - 1})"
        finals = {f"{p}_hist": f"histogram({bin_sql}) FILTER (WHERE {v} IS NOT NULL)"}
        finals.update(_clamp_loss(p, v, lo, hi))
        return AggregatePlan(agg, partial, finals, (), (f"{p}_nclamped", f"{p}_clamped"),
                             histogram_bin=(v, bin_sql), index=index)
    raise AssertionError(kind)


def avg_noise_weights(n: np.ndarray, s: np.ndarray, n_scale: float, s_scale: float) -> np.ndarray:
    """First-order weights of the noises of S and N in AVG = S / N + mid (delta method, plug-in):
    d(S/N)/dS = 1/N, d(S/N)/dN = -S/N^2; so the error is about X_S / N - S X_N / N^2."""
    n = np.asarray(n, dtype=np.float64)
    return np.stack([np.full_like(n, s_scale) / n, np.abs(s) * n_scale / n**2], axis=1)


def stddev_noise_sd(variance: np.ndarray, variance_sd: np.ndarray) -> np.ndarray:
    """Noise sd of a released standard deviation sqrt(V) from its variance's sd s: the first-order
    s / (2 sqrt(V)) (d sqrt(v) = dv / (2 sqrt(v))), capped by sqrt(s), which holds at any V: for
    a, b >= 0, |sqrt(a) - sqrt(b)| <= sqrt(|a - b|), so E[(sqrt(V') - sqrt(V))^2] <= E|V' - V| <= s.
    At V = 0 (a noisy variance clipped to 0) the first-order term is infinite and the cap is the sd."""
    variance, variance_sd = np.broadcast_arrays(np.asarray(variance, dtype=np.float64),
                                                np.asarray(variance_sd, dtype=np.float64))
    cap = np.sqrt(variance_sd)
    with np.errstate(divide="ignore", invalid="ignore"):
        first_order = variance_sd / (2.0 * np.sqrt(variance))
    return np.where(variance > 0, np.minimum(first_order, cap), cap)


def finish(agg: Aggregate, noisy: dict, noise: str, alpha: float) -> tuple[np.ndarray, ...]:
    """Released value, confidence interval (low, high) and noise sd per partition, from the noisy
    components (ratios: first-order sd, like their intervals).

    noisy: component key -> NoisyStatistic. Intervals are intersected with what the true value
    can be (counts >= 0; a mean, variance or standard deviation within its bounds).
    """
    if agg.kind in ("count", "count_units", "sum"):
        s = noisy["count" if agg.kind != "sum" else "sum"]
        value, h = s.values, s.halfwidth
        lo, hi = value - h, value + h
        floor = 0.0 if agg.kind != "sum" or agg.lower >= 0 else None
        ceil = 0.0 if agg.kind == "sum" and agg.upper <= 0 else None
        lo_cap = -np.inf if floor is None else floor
        hi_cap = np.inf if ceil is None else ceil
        sd = np.full(value.shape, s.sd)
        return np.clip(value, lo_cap, hi_cap), np.clip(lo, lo_cap, hi_cap), np.clip(hi, lo_cap, hi_cap), sd
    lower, upper = float(agg.lower), float(agg.upper)
    mid, half = (lower + upper) / 2.0, (upper - lower) / 2.0
    n_stat, s_stat = noisy["N"], noisy["S"]
    n = np.maximum(n_stat.values, 1.0)
    s = s_stat.values
    mean_c = s / n  # centred mean
    too_few = n_stat.values - n_stat.halfwidth < 1.0  # linearisation meaningless: no information
    if agg.kind == "avg":
        raw = mean_c + mid
        weights = avg_noise_weights(n, s, n_stat.scale, s_stat.scale)
        h = sum_halfwidth(noise, weights, alpha)
        lo = np.where(too_few, lower, np.clip(raw - h, lower, upper))
        hi = np.where(too_few, upper, np.clip(raw + h, lower, upper))
        return np.clip(raw, lower, upper), lo, hi, sum_sd(noise, weights)
    q_stat = noisy["Q"]
    q = q_stat.values
    raw = q / n - mean_c**2
    variance = np.clip(raw, 0.0, half * half)
    d_q = 1.0 / n
    d_s = 2.0 * np.abs(s) / n**2
    d_n = np.abs(-q / n**2 + 2.0 * s**2 / n**3)
    weights = np.stack([d_q * q_stat.scale, d_s * s_stat.scale, d_n * n_stat.scale], axis=1)
    h = sum_halfwidth(noise, weights, alpha)
    lo = np.where(too_few, 0.0, np.clip(raw - h, 0.0, half * half))
    hi = np.where(too_few, half * half, np.clip(raw + h, 0.0, half * half))
    sd = sum_sd(noise, weights)
    if agg.kind == "stddev":
        return np.sqrt(variance), np.sqrt(lo), np.sqrt(hi), stddev_noise_sd(variance, sd)
    return variance, lo, hi, sd



def _plan_with_partition_bounds(index: int, agg: Aggregate, integer_columns: set[str], bounds: list[tuple[float, float]],
                                float_columns: set[str] = frozenset()) -> AggregatePlan:
    """As `plan_aggregate`, with each partition's bounds read from its `_a{i}_lo/_hi` columns."""
    p = f"_a{index}"
    v = ident(f"{p}_raw")
    lo_sql, hi_sql = SQL(ident(f"{p}_lo")), SQL(ident(f"{p}_hi"))
    # no partition got bounds (Query.bounds_fallback): none is released; the plan still needs a width
    widest = max((max(abs(lo), abs(hi)) for lo, hi in bounds), default=1.0)
    proxy = replace(agg, lower=None if agg.kind == "count" else -widest,
                    upper=max(math.ceil(widest), 1) if agg.kind == "count" else widest)
    # the one per-unit partial SQL
    partial = plan_aggregate(index, proxy, integer_columns, "", 2, float_columns=float_columns).partials
    if agg.kind in ("count", "sum"):
        clamped = f"least({v}, {hi_sql})" if agg.kind == "count" else _clamp_sql(v, lo_sql, hi_sql)
        integer = all(float(x).is_integer() for b in bounds for x in b) and (
            agg.kind == "count" or (agg.column in integer_columns and widest <= EXACT_INTEGER_MAX))
        key = "count" if agg.kind == "count" else "sum"
        if integer:
            comp, total = Component(key, f"{p}_sum", 1.0, int(widest)), _integer_sum(clamped)
        else:
            comp, total = _real_component(key, f"{p}_sum", clamped, -widest, widest)
        finals = {f"{p}_sum": total}
        finals.update(_clamp_loss(p, v, None if agg.kind == "count" else lo_sql, hi_sql))
        return AggregatePlan(agg, partial, finals, (comp,), (f"{p}_nclamped", f"{p}_clamped"), clamped)
    mid = SQL(f"(({lo_sql}) + ({hi_sql})) / 2.0")  # each partition's own middle
    centred = f"({_clamp_sql(v, lo_sql, hi_sql)} - {mid})"
    half = max(((hi - lo) / 2.0 for lo, hi in bounds), default=0.5)
    s_comp, s_sql = _real_component("S", f"{p}_S", centred, -half, half)
    finals = {f"{p}_N": f"count({v})", f"{p}_S": s_sql}
    comps = [Component("N", f"{p}_N", 1.0, 1), s_comp]
    if agg.kind != "avg":
        q_comp, q_sql = _real_component("Q", f"{p}_Q", f"{centred} * {centred}", 0.0, half * half)
        finals[f"{p}_Q"] = q_sql
        comps.append(q_comp)
    finals.update(_clamp_loss(p, v, lo_sql, hi_sql))
    return AggregatePlan(agg, partial, finals, tuple(comps), (f"{p}_nclamped", f"{p}_clamped"),
                         _clamp_sql(v, lo_sql, hi_sql))


def component_sensitivity(agg: Aggregate, component: Component) -> int:
    """One partition's sensitivity in quanta for its own bounds (agg.lower, agg.upper) with the
    plan's quantum: partitions with narrow bounds get noise for their bounds, not the widest."""
    lo, hi = float(agg.lower or 0.0), float(agg.upper)
    if component.key == "N":
        return 1
    if component.key in ("count", "sum"):
        if component.quantum == 1.0:
            return int(max(abs(lo), abs(hi)))
        return max(abs(_quantise_py(lo, component.quantum)), abs(_quantise_py(hi, component.quantum)))
    mid = (lo + hi) / 2.0
    c_lo, c_hi = lo - mid, hi - mid  # the same IEEE operations as the SQL
    if component.key == "S":
        return max(abs(_quantise_py(c_lo, component.quantum)), abs(_quantise_py(c_hi, component.quantum)))
    return _quantise_py(max(c_lo * c_lo, c_hi * c_hi), component.quantum)
