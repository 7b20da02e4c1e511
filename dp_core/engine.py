"""Execute a typed query: check, bound in SQL, select partitions, add noise, seal the result.

The path (architecture.md): query -> checks -> budget split -> bounding SQL in the backend ->
per-partition exact sums -> selection -> noise -> result. Only per-partition aggregates come back
from the data engine; raw rows never do. Any error is raised before noise is drawn.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from .accounting import BudgetPlan, plan_budget
from .aggregates import AggregatePlan, component_sensitivity, finish
from .backend import INTEGER_TYPES, NUMERIC_TYPES
from .bounding import INPUT_NAME, BoundingPlan, build_plan, public_keys_sql, unit_rows_sql
from .bounds import FALLBACK_NOTE, BoundsError, InferredBounds, histograms_sql, infer_bounds
from .engine_backend import Backend, open_backend
from .errors import InvalidDataError, InvalidQueryError
from .input_checks import FLOAT_TYPES
from .partition_selection import SELECTION_NOTES, STRATEGIES, Selection
from .pool_certificate import certify
from .quantiles import exponential_quantile_of_maps
from .query import COUNT_BOUND_MAX, Aggregate, Query
from .release import MechanismRecord, NoisyStatistic, add_noise
from .result import CI_NOTE, ClampingLoss, ControllerOnly, DPResult
from .row_filter import compile_filter
from .selection_advice import selection_advice
from .selection_mad import TWO_ROUND_SELECTIONS, mad_rows
from .shared_partials import SharedPartials
from .sql_text import ident

NUMERIC_KINDS = ("sum", "avg", "var", "stddev", "quantile")
#: the DuckDB types that hold 'infinity' (DATE, the TIMESTAMP family): never a released key (check_values)
INFINITE_DATE_TYPES = ("DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS")


def execute(query: Query, data: Any, *, threads: int | None = None, bounding_seed: int | None = None,
            backend: str | None = None, spark: Any = None, portable_hash: bool = False) -> DPResult:
    """Run `query` on `data` (DataFrame, Arrow table, CSV/Parquet path or DuckDB relation; with
    backend="spark": a Spark DataFrame, a table name or a Parquet/CSV path, on `spark` or the
    active SparkSession). portable_hash: bound contributions with the hash every engine computes
    alike (bounding.portable_hash_sql), so that DuckDB and Spark keep the same rows for one seed.

    bounding_seed: the key of the hash that picks each unit's C_u partitions; fresh from the
    CSPRNG by default. Fixing it is for tests (neighbouring datasets bounded alike); privacy does not
    rest on it, and it never seeds the noise.
    """
    query.validate()
    budget = plan_budget(query)
    stats = exact_statistics(query, data, threads=threads, bounding_seed=bounding_seed, budget=budget,
                             backend=backend, spark=spark, portable_hash=portable_hash)
    return release(stats.query, stats.plan, budget, stats.rows, stats.bounds)


@dataclass(frozen=True)
class ExactStatistics:
    """What the data engine returns for a query: per-partition exact sums and, on request, each
    unit's bounded contributions. Not DP: input to the noise step and to controller-only PRIs."""

    query: Query  # with every bound set (inferred ones filled in)
    plan: BoundingPlan
    rows: pd.DataFrame
    bounds: tuple[InferredBounds, ...] = ()  # DP: the bounds that were inferred, and their histograms
    partition_bounds: dict | None = None  # aggregate index -> DataFrame(keys, lo, hi) (per-partition scope)
    units: pd.DataFrame | None = None  # unit, keys, _u{i}: bounded value per aggregate
    total_units: int | None = None  # distinct units in the whole input (before the row filter)


def exact_statistics(query: Query, data: Any, *, threads: int | None = None, bounding_seed: int | None = None,
                     with_units: bool = False, budget: BudgetPlan | None = None, backend: str | None = None,
                     spark: Any = None, portable_hash: bool = False) -> ExactStatistics:
    """Check the input against the query, infer missing bounds (APPROX_BOUNDS, with the budget's
    bounds shares), and run the bounding plan (one SQL statement) on the chosen backend
    (engine_backend.open_backend)."""
    query.validate()
    opened = open_backend(data, backend, spark=spark, threads=threads)
    needs_bounds = any(a.needs_bounds for a in query.aggregates)
    partials = SharedPartials(opened, enabled=needs_bounds or with_units)  # read by more than one statement
    try:
        schema = opened.schema()
        integer_columns = check_columns(query, schema)
        check_values(query, opened, schema)
        if query.public_partitions is not None:
            check_public_keys(query, opened, schema)
        seed = secrets.randbits(63) if bounding_seed is None else bounding_seed
        bounds: tuple[InferredBounds, ...] = ()
        per_partition: dict = {}
        if needs_bounds:
            budget = budget or plan_budget(query)
            if query.bounds_scope == "partition":
                query, bounds, per_partition = infer_partition_bounds(query, opened, schema, integer_columns, seed, budget,
                                                                      portable_hash, partials)
            else:
                query, bounds = infer_missing_bounds(query, opened, schema, integer_columns, seed, budget, portable_hash,
                                                     partials)
        plan = build_plan(query, integer_columns, seed=seed, key_types=schema, partition_bounds=per_partition,
                          dialect=opened.dialect, transpile=False, portable_hash=portable_hash)
        run = partials.reading(plan)  # the same plan, reading the partials already computed (if any)
        if budget is not None and budget.selection in TWO_ROUND_SELECTIONS and not with_units:  # + round 1, round 2's SQL
            rows = mad_rows(opened, query, run, budget.selection_budget)
        else:
            rows = opened.run(run.sql)
        if query.group_by:  # one order on every backend: the noise is drawn in row order
            rows = rows.sort_values(list(query.group_by), na_position="last", kind="stable").reset_index(drop=True)
        if not with_units:
            return ExactStatistics(query, plan, rows, bounds, partition_bounds=per_partition)
        units = opened.run(unit_rows_sql(run, query))
        total = int(opened.run(f"SELECT count(DISTINCT {ident(query.privacy_unit)}) AS n FROM {INPUT_NAME}")["n"].iloc[0])
        return ExactStatistics(query, plan, rows, bounds, per_partition, units, total)
    finally:
        try:
            partials.close()
        finally:
            opened.close()


def infer_missing_bounds(query: Query, backend: Backend, schema: dict[str, str], integer_columns: set[str],
                         seed: int, budget: BudgetPlan, portable_hash: bool = False,
                         partials: SharedPartials | None = None) -> tuple[Query, tuple[InferredBounds, ...]]:
    """APPROX_BOUNDS for every aggregate with a missing bound, over the same bounded per-unit
    values the release will use (same bounding seed), all histograms from one statement (and the
    partials kept for the release's plan, `partials`). Returns the query with the bounds set."""
    histograms = exact_bounds_histograms(query, backend, schema, integer_columns, seed, portable_hash, partials)
    found, aggregates = [], list(query.aggregates)
    for i, (counts, integer, signed) in histograms.items():
        agg = query.aggregates[i]
        hist = {(bool(r.neg), int(r.e)): int(r.n) for r in counts.itertuples()}
        inferred = infer_bounds(
            hist, label=agg.label, integer=integer, signed=signed, share=budget.bounds_shares[i],
            max_partitions=query.effective_max_partitions, failure=query.bounds_failure,
            need_lower=agg.kind != "count" and agg.lower is None, need_upper=agg.upper is None,
            fallback=query.bounds_fallback,
        )
        lower = agg.lower if inferred.lower is None else _whole(inferred.lower)
        upper = agg.upper if inferred.upper is None else _whole(inferred.upper)
        if upper is None:  # infer_bounds infers every bound the query left out
            raise BoundsError(f"automatic bounds for {agg.label!r}: the upper bound was neither given nor inferred")
        if agg.kind != "count" and lower is not None and lower >= upper and query.bounds_fallback:
            # the bounds came out empty: the whole range on the inferred side(s), as when no bin stands out
            edges = inferred.bin_edges
            lower = _whole(edges[0][0]) if inferred.lower is not None else lower
            upper = _whole(edges[-1][1]) if inferred.upper is not None else upper
            inferred = replace(inferred, lower=None if inferred.lower is None else float(lower),
                               upper=None if inferred.upper is None else float(upper),
                               record=replace(inferred.record, note=f"{inferred.record.note}; {FALLBACK_NOTE}"))
        if agg.kind == "count":
            upper = max(int(upper), 1)
            if query.bounds_fallback and FALLBACK_NOTE in inferred.record.note:
                upper = min(upper, COUNT_BOUND_MAX)  # a count's per-unit bound is at most 2^31 - 1
        elif lower is not None and upper is not None and lower >= upper:
            raise BoundsError(
                f"automatic bounds for {agg.label!r} came out empty ([{lower}, {upper}]): set the bounds by hand"
            )
        aggregates[i] = replace(agg, lower=lower, upper=upper)
        found.append(inferred)
    return replace(query, aggregates=tuple(aggregates)), tuple(found)


def infer_partition_bounds(query: Query, backend: Backend, schema: dict[str, str], integer_columns: set[str],
                           seed: int, budget: BudgetPlan, portable_hash: bool = False,
                           partials: SharedPartials | None = None,
                           ) -> tuple[Query, tuple[InferredBounds, ...], dict[int, pd.DataFrame]]:
    """APPROX_BOUNDS once per partition (usability.md step 5, the per-partition option). A unit
    adds at most C_u values over all partitions' histograms, so each bin's noise has scale
    C_u / e_b as for one histogram. A partition where no bin stands out gets no bounds and is not
    released. Returns the query (bounds set to the widest, for display), the inferred bounds and
    aggregate index -> DataFrame(keys, lo, hi)."""
    keys = query.group_by
    histograms = exact_bounds_histograms(query, backend, schema, integer_columns, seed, portable_hash, partials)
    found, tables, aggregates = [], {}, list(query.aggregates)
    for i, (counts, integer, signed) in histograms.items():
        agg = query.aggregates[i]
        records = []
        for key_values, group in counts.groupby(list(keys), dropna=False, sort=True):  # same noise order everywhere
            key_values = key_values if isinstance(key_values, tuple) else (key_values,)
            hist = {(bool(r.neg), int(r.e)): int(r.n) for r in group.itertuples()}
            partition = dict(zip(keys, key_values))
            try:
                inferred = infer_bounds(
                    hist, label=agg.label, integer=integer, signed=signed, share=budget.bounds_shares[i],
                    max_partitions=query.effective_max_partitions, failure=query.bounds_failure,
                    need_lower=agg.kind != "count" and agg.lower is None, need_upper=agg.upper is None)
            except BoundsError:
                continue  # no bounds: this partition is not released (with bounds_fallback too)
            lo = 0.0 if agg.kind == "count" else _chosen(inferred.lower, agg.lower, agg.label)
            hi = _chosen(inferred.upper, agg.upper, agg.label)  # a count's: 1 or more (bins from [0, 2))
            if lo >= hi:
                continue
            found.append(replace(inferred, partition=partition))
            records.append({**partition, "lo": float(lo), "hi": float(hi)})
        if not records and not query.bounds_fallback:
            raise BoundsError(
                f"automatic bounds for {agg.label!r}: no partition has a histogram bin above the noise; give "
                "more epsilon, use more data, or set the bounds by hand. Nothing was released"
            )
        if not records:  # bounds_fallback: no partition is released, as when each one alone has no bounds
            tables[i] = pd.DataFrame({**{k: pd.Series(dtype=object) for k in keys}, "lo": pd.Series(dtype=float),
                                      "hi": pd.Series(dtype=float)})
            aggregates[i] = replace(agg, lower=agg.lower if agg.kind != "count" else None,
                                    upper=agg.upper if agg.upper is not None else 1)
            continue
        table = pd.DataFrame(records)
        tables[i] = table
        aggregates[i] = replace(agg, lower=None if agg.kind == "count" else _whole(table["lo"].min()),
                                upper=_whole(table["hi"].max()))
    return replace(query, aggregates=tuple(aggregates)), tuple(found), tables


def exact_bounds_histograms(query: Query, backend: Backend, schema: dict[str, str], integer_columns: set[str],
                            seed: int, portable_hash: bool = False, partials: SharedPartials | None = None,
                            ) -> dict[int, tuple[pd.DataFrame, bool, bool]]:
    """The exact histograms APPROX_BOUNDS noises, for every aggregate with a missing bound, from one
    statement over the bounded rows the release will use: the plan with placeholder bounds (the
    partials and the kept rows do not depend on the bounds). Aggregate index -> (bin counts, whose
    values are integers, whose values can be negative); per partition (the keys first) under
    bounds_scope "partition" (never for a quantile: Query.validate)."""
    placeholder = replace(query, aggregates=tuple(
        replace(a, lower=0 if a.lower is None and a.kind != "count" else a.lower,
                upper=1 if a.upper is None else a.upper) if a.needs_bounds else a
        for a in query.aggregates))
    plan = build_plan(placeholder, integer_columns, seed=seed, key_types=schema, dialect=backend.dialect, transpile=False,
                      portable_hash=portable_hash)
    if partials is not None:
        plan = partials.reading(plan)
    wanted = {}
    for i, agg in enumerate(query.aggregates):
        if agg.needs_bounds:
            column_type = schema[agg.column].upper() if agg.column else "BIGINT"  # check_columns: it exists
            wanted[i] = (agg.kind == "count" or (agg.kind in ("sum", "quantile") and column_type in INTEGER_TYPES),
                         agg.kind != "count" and not column_type.startswith("U"))
    keys = query.group_by if query.bounds_scope == "partition" else ()
    counts = backend.run(histograms_sql(plan.with_clause, [(i, f"_a{i}_raw", integer) for i, (integer, _) in wanted.items()],
                                        keys))
    return {i: (counts[counts["_agg"] == i].drop(columns="_agg"), integer, signed) for i, (integer, signed) in wanted.items()}


def _chosen(inferred: float | None, given: float | None, label: str) -> float:
    """A bound after APPROX_BOUNDS: the inferred one, else the one the query gave (infer_bounds
    infers exactly the missing ones, so one of the two is set)."""
    bound = given if inferred is None else inferred
    if bound is None:
        raise BoundsError(f"automatic bounds for {label!r}: a bound was neither given nor inferred")
    return bound


def _whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() and abs(x) < 2**62 else x


#: DuckDB key types no released table holds: nested values (pandas orders partitions by comparing
#: keys, and two lists or structs do not compare: the release failed once the data held two distinct
#: ones; Spark names a list ARRAY<...>) and the types DuckDB does not convert to NumPy
UNRELEASABLE_KEY_TYPES = ("STRUCT", "MAP", "UNION", "ARRAY", "TIME WITH TIME ZONE", "TIMETZ", "UHUGEINT", "VARINT", "BIGNUM")


def refuse_unreleasable_key(key: str, kind: str) -> None:
    """A group-by key of a type no partition can be keyed by is refused by its type (never by its
    values: whether the release fails must not depend on the rows)."""
    upper = kind.upper()
    if upper.endswith("]") or upper.startswith(UNRELEASABLE_KEY_TYPES):
        raise InvalidDataError(
            f"group-by key column {key!r} has type {kind}: a partition is keyed by plain values (text, numbers, "
            f"dates, times); group by a plain value made of it instead (e.g. CAST({key} AS VARCHAR))")


def check_columns(query: Query, schema: dict[str, str]) -> set[str]:
    """Every named column exists and numeric aggregates read numeric columns.

    Returns the integer-typed columns (their sums are exact integers, noised on the integer grid).
    """
    available = ", ".join(schema)
    needed = [("privacy unit", query.privacy_unit)] + [("group-by key", k) for k in query.group_by]
    needed += [(f"aggregate {a.label!r}", a.column) for a in query.aggregates if a.column]
    if query.where is not None:
        needed += [("row filter", c) for c in sorted(compile_filter(query.where)[1])]
    for role, col in needed:
        if col not in schema:
            raise InvalidDataError(f"{role} column {col!r} is not in the input (columns: {available})")
    for k in query.group_by:
        refuse_unreleasable_key(k, schema[k])
    for a in query.aggregates:
        if a.kind in NUMERIC_KINDS and a.column is not None and not schema[a.column].upper().startswith(NUMERIC_TYPES + ("DECIMAL",)):
            raise InvalidDataError(
                f"aggregate {a.label!r} needs a numeric column, but {a.column!r} has type {schema[a.column]}"
            )
    return {c for c, t in schema.items() if t.upper() in INTEGER_TYPES}


def check_public_keys(query: Query, backend: Backend, schema: dict[str, str]) -> None:
    """Each public key converts to its column's type and no two keys become the same partition."""
    keys = public_keys_sql(query, schema)
    cols = ", ".join(ident(k) for k in query.group_by)
    try:
        row = backend.run(f"SELECT count(*) AS n, count(DISTINCT ({cols},)) AS d FROM {keys}").iloc[0]
    except InvalidDataError as err:
        raise InvalidQueryError(f"public partition keys do not fit the group-by columns' types: {err}") from None
    if row["n"] != row["d"]:
        raise InvalidQueryError(
            f"public_partitions lists {int(row['n'] - row['d'])} key(s) twice once converted to the "
            f"columns' types ({', '.join(schema[k] for k in query.group_by)}): each partition must appear once"
        )


def check_values(query: Query, backend: Backend, schema: dict[str, str]) -> None:
    """The whole-input rules (docs/engine.md, "Data rules") on an input the caller handed over:
    refused when empty, with a null unit id, or with an infinite value in a float column an
    aggregate reads (a NaN is missing, skipped like NULL: dp_core.input_checks). An input a query
    derived from the data (backend.derived: a DP SELECT's FROM/WHERE) is never checked: what
    such a refusal says would depend on the rows the requester selected, outside the mechanism;
    the plan handles those rows instead (null unit: dropped; infinite: clamped; NaN: missing)."""
    if backend.derived:
        return
    floats = sorted({a.column for a in query.aggregates if a.kind in NUMERIC_KINDS and a.column is not None
                     and schema[a.column].upper() in FLOAT_TYPES})
    # DuckDB's DATE and TIMESTAMP hold 'infinity', which no released key can be (pandas cannot hold
    # it): refused for the whole input, not only when a row filter keeps that row (Spark has none)
    dates = sorted({k for k in query.group_by if schema[k].upper() in INFINITE_DATE_TYPES}) \
        if backend.dialect == "duckdb" else []
    if not floats and not dates and rules_hold_by_statistics(getattr(backend, "source", None), query.privacy_unit):
        return
    check_rows(backend.run, INPUT_NAME, query.privacy_unit, floats, dates=dates)


def rules_hold_by_statistics(source: object, unit: str) -> bool:
    """True when the input's own exact statistics prove the whole-input rules hold, so no scan is
    needed: an input offering `column_statistics()` (the escrow's Parquet footer: per column its
    row and NULL counts) with rows, and a unit column that holds no NULL and cannot hold a NaN.
    Anything else (no statistics, a float unit, a rule that fails) goes to the scan, which also
    words the refusal."""
    read = getattr(source, "column_statistics", None)
    stats = read() if callable(read) else None
    column = stats.get(unit) if stats else None
    return column is not None and column.kind != "float" and column.rows > 0 and column.nulls == 0


def check_rows(run: Callable[[str], pd.DataFrame], relation: str, unit: str, floats: Sequence[str] = (),
               label: str | None = None, dates: Sequence[str] = ()) -> None:
    """One scan of a whole input `relation` (SQL name) through `run`: not empty, no null unit id,
    no infinite value in `floats` nor in the DuckDB date or timestamp group keys `dates`. label: how
    the message names the input (None: "the input")."""
    unit_sql = ident(unit)
    checks = ["count(*) AS n", f"count(*) - count({unit_sql}) AS null_units"]
    checks += [f"count(*) FILTER (WHERE abs({ident(c)}) = CAST('Infinity' AS DOUBLE)) AS bad{i}"
               for i, c in enumerate(floats)]
    checks += [f"count(*) FILTER (WHERE NOT isfinite({ident(c)})) AS inf{i}" for i, c in enumerate(dates)]
    row = run(f"SELECT {', '.join(checks)} FROM {relation}").iloc[0]
    if row["n"] == 0:
        raise InvalidDataError(f"{label or 'the input'} has no rows: nothing can be released")
    lead = f"{label}: " if label else ""
    if row["null_units"]:
        raise InvalidDataError(
            f"{lead}{int(row['null_units'])} row(s) have no privacy unit id (column {unit!r} is "
            "null): every row must belong to a unit; fix or drop those rows"
        )
    infinite = [(f"bad{i}", lambda n, c=c: f"column {c!r} has {n} infinite value(s): drop those rows or make them "
                 "missing (an empty cell, NULL or NaN, which aggregates skip) before a DP aggregate reads it")
                for i, c in enumerate(floats)]
    infinite += [(f"inf{i}", lambda n, c=c: f"group-by column {c!r} has {n} infinite date(s) or timestamp(s) "
                  "('infinity'): no partition can be keyed by one; drop those rows or make them missing (NULL) before "
                  "grouping by it") for i, c in enumerate(dates)]
    for column, message in infinite:
        if int(row[column]):
            raise InvalidDataError(lead + message(int(row[column])))


def release(query: Query, plan: BoundingPlan, budget: BudgetPlan, rows: pd.DataFrame,
            bounds: tuple[InferredBounds, ...] = ()) -> DPResult:
    """Select partitions and add noise to the exact per-partition sums; seal everything in a result."""
    cu = query.effective_max_partitions
    alpha = 1.0 - query.confidence
    n_units = rows["_n_units"].to_numpy(dtype=np.int64)
    per_partition = [i for i in range(len(query.aggregates)) if f"_a{i}_lo" in rows.columns]
    budget = certify(query, plan, budget, frozenset(per_partition))  # before any noise is drawn
    selection: Selection | None = None
    if budget.selection:
        selection = STRATEGIES[budget.selection](n_units, budget.selection_budget, cu, query.confidence,
                                                 rows=rows, query=query)
        keep = selection.keep
    else:
        keep = np.ones(len(rows), dtype=bool)
    for i in per_partition:  # partitions whose bounds could not be inferred are not released
        keep = keep & rows[f"_a{i}_lo"].notna().to_numpy()
    kept = rows.loc[keep].reset_index(drop=True)
    query = _bounds_of_released_partitions(query, kept, per_partition)

    table = kept[list(query.group_by)].copy()
    records = [b.record for b in bounds]
    records += [selection.noisy_units.record] if selection and selection.noisy_units else []
    records += list(selection.records) if selection else []
    for i, (agg, aplan) in enumerate(zip(query.aggregates, plan.aggregates)):
        label = agg.label
        if agg.kind == "quantile":
            if agg.q is None or agg.lower is None or agg.upper is None:  # validate() and the bounds step set them
                raise BoundsError(f"the quantile {label!r} has no q or bounds at the noise step")
            value, record = exponential_quantile_of_maps(
                list(kept[f"_a{i}_hist"]), query.quantile_bins, agg.q, float(agg.lower), float(agg.upper),
                target=label, share=budget.component_shares[(i, "quantile")], max_partitions=cu,
            )
            lo = hi = sd = np.full(len(kept), np.nan)
            records.append(record)
        elif i in per_partition:
            value, lo, hi, sd, group_records = _release_by_partition_bounds(i, agg, aplan, kept, budget, query)
            records += group_records
        else:
            if i in budget.reused:  # only the Laplace threshold's noisy unit counts are reused (accounting)
                if selection is None or selection.noisy_units is None:
                    raise RuntimeError(f"{label!r} reuses the selection's noisy counts, but the selection drew none")
                noisy = {"count": _subset(selection.noisy_units, keep)}
            else:
                noisy = {
                    c.key: add_noise(
                        kept[c.column].to_numpy(dtype=np.int64), target=f"{label}.{c.key}", quantum=c.quantum,
                        sensitivity_quanta=c.sensitivity_quanta, max_partitions=cu,
                        share=budget.component_shares[(i, c.key)], noise=query.noise, confidence=query.confidence,
                    )
                    for c in aplan.components
                }
                records += [s.record for s in noisy.values()]
            value, lo, hi, sd = finish(agg, noisy, query.noise, alpha)
        table[label] = value
        table[f"{label}_ci_low"] = lo
        table[f"{label}_ci_high"] = hi
        table[f"{label}_noise_sd"] = sd
    if query.group_by:
        table = table.sort_values(list(query.group_by), na_position="last", kind="stable").reset_index(drop=True)

    return DPResult(
        table=table,
        query=query,
        epsilon_spent=budget.epsilon,
        delta_spent=budget.delta,
        budget=budget.shares,
        mechanisms=tuple(records),
        partition_selection=_describe_selection(query, selection),
        notes=_notes(query, budget) + selection_advice(query, budget, table, selection),
        controller_only=_controller_view(query, plan, rows, keep),
        inferred_bounds=_released_bounds(bounds, kept, query.group_by),
    )


def _bounds_of_released_partitions(query: Query, kept: pd.DataFrame, per_partition: list[int]) -> Query:
    """The query as released: a statistic bounded per partition states the widest bounds of its released
    partitions (the bounds published beside them), never those of a partition left out: one person's
    partition, dropped by the selection, would show that they exist and their value's range. None when
    no partition is released."""
    aggregates = list(query.aggregates)
    for i in per_partition:
        lows, highs = kept[f"_a{i}_lo"], kept[f"_a{i}_hi"]
        lower = None if aggregates[i].kind == "count" or kept.empty else _whole(lows.min())
        aggregates[i] = replace(aggregates[i], lower=lower, upper=None if kept.empty else _whole(highs.max()))
    return replace(query, aggregates=tuple(aggregates))


def _release_by_partition_bounds(i: int, agg: Aggregate, aplan: AggregatePlan, kept: pd.DataFrame, budget: BudgetPlan,
                                 query: Query) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[MechanismRecord]]:
    """Noise per group of partitions sharing the same inferred bounds: each group's noise is
    calibrated to its own sensitivity (the point of per-partition bounds)."""
    n = len(kept)
    value, lo, hi, sd = (np.full(n, np.nan) for _ in range(4))
    records = []
    groups = kept.groupby([f"_a{i}_lo", f"_a{i}_hi"], sort=True).indices
    for (g_lo, g_hi), idx in groups.items():
        agg_g = replace(agg, lower=None if agg.kind == "count" else _whole(g_lo), upper=_whole(g_hi))
        noisy = {
            c.key: add_noise(
                kept[c.column].to_numpy(dtype=np.int64)[idx], target=f"{agg.label}.{c.key} [{g_lo:g}, {g_hi:g}]",
                quantum=c.quantum, sensitivity_quanta=component_sensitivity(agg_g, c),
                max_partitions=query.effective_max_partitions, share=budget.component_shares[(i, c.key)],
                noise=query.noise, confidence=query.confidence,
            )
            for c in aplan.components
        }
        records += [s.record for s in noisy.values()]
        value[idx], lo[idx], hi[idx], sd[idx] = finish(agg_g, noisy, query.noise, 1.0 - query.confidence)
    return value, lo, hi, sd, records


def _released_bounds(bounds: tuple[InferredBounds, ...], kept: pd.DataFrame,
                     keys: tuple[str, ...]) -> tuple[InferredBounds, ...]:
    """Inferred bounds to publish: dataset-wide ones, and per-partition ones of released partitions."""
    released = {tuple(_key(v) for v in row) for row in kept[list(keys)].itertuples(index=False)} if keys else set()
    return tuple(b for b in bounds
                 if b.partition is None or tuple(_key(b.partition[k]) for k in keys) in released)


def _key(v: object) -> str | None:
    return None if v is None or (isinstance(v, float) and v != v) else str(v)


def _subset(stat: NoisyStatistic, keep: np.ndarray) -> NoisyStatistic:
    """The selection's noisy counts restricted to the kept partitions (same record, same scale)."""
    return type(stat)(stat.values[keep], stat.halfwidth, stat.scale, stat.sd, stat.record)


def _describe_selection(query: Query, selection: Selection | None) -> str:
    if selection is not None:
        return f"{selection.strategy}: {selection.description}"
    if query.public_partitions is not None:
        return (f"public partitions ({len(query.public_partitions)} keys from public data: the request's list or a "
                "PUBLIC_GROUPS table; no selection)")
    return "none (no GROUP BY: one partition, always released)"


def _notes(query: Query, budget: BudgetPlan) -> tuple[str, ...]:
    notes = [CI_NOTE]
    if budget.reused:
        notes.append(
            "COUNT(DISTINCT unit) is the partition selection's noisy count, released as is (no extra budget); "
            "only counts above the threshold are released, so near the threshold they lean high."
        )
    if budget.gaussian_pool:
        eps_g, delta_g, rho_g = budget.pool_figures()
        how = ("on the Gaussians' exact privacy curve, privacy loss distributions; the discrete noise sampled is "
               "certified exactly" if budget.pool_accountant == "pld" else "Canonne-Kamath-Steinke conversion")
        notes.append(
            f"Gaussian aggregates are accounted together: their pooled ({eps_g:.6g}, {delta_g:.3g}) "
            f"is rho = {rho_g:.6g} ({how}), split between them; an aggregate's listed "
            "epsilon and delta are its slice of the pool, not a guarantee of its own."
        )
    if budget.selection in SELECTION_NOTES:
        notes.append(SELECTION_NOTES[budget.selection](budget))
    if any(a.kind in ("avg", "var", "stddev") for a in query.aggregates):
        notes.append("AVG/VAR/STDDEV intervals are first-order (delta method on the noisy sums); [L, U] when the noisy count is too small.")
    notes.append(f"Accountant: {budget.accountant}.")
    if query.part_weights:  # a split chosen by need (split.py): the shares are not the equal split's
        notes.append("Budget split by the given part weights: " + ", ".join(
            f"{s.part} {s.epsilon / budget.epsilon:.1%}" for s in budget.shares) + " of epsilon.")
    return tuple(notes)


def _controller_view(query: Query, plan: BoundingPlan, rows: pd.DataFrame, keep: np.ndarray) -> ControllerOnly:
    """Partition, clamping and bounding loss, and the exact values: raw-data numbers, not DP."""
    pairs = int(rows["_n_units"].sum())
    clamping = {}
    exact = rows[list(query.group_by) + ["_n_units"]].rename(columns={"_n_units": "units"})
    for i, (agg, aplan) in enumerate(zip(query.aggregates, plan.aggregates)):
        if aplan.clamp_columns:
            n_col, t_col = aplan.clamp_columns
            clamping[agg.label] = ClampingLoss(pairs, int(rows[n_col].sum()), float(rows[t_col].sum()))
        exact[agg.label] = _exact_value(agg, aplan, rows, i)
    exact["released"] = keep
    nonempty = int((rows["_n_units"] > 0).sum())
    released = int((keep & (rows["_n_units"].to_numpy() > 0)).sum())
    dropped_pairs = int(rows["_dropped_pairs"].iloc[0]) if len(rows) else 0
    return ControllerOnly(nonempty, released, clamping, pairs + dropped_pairs, dropped_pairs, exact)


def _exact_value(agg: Aggregate, aplan: AggregatePlan, rows: pd.DataFrame, i: int) -> np.ndarray:
    """The non-private value of the bounded statistic (what the noise protects)."""
    if agg.kind == "quantile":
        return np.full(len(rows), np.nan)
    c = {comp.key: rows[comp.column].to_numpy(dtype=np.float64) * comp.quantum for comp in aplan.components}
    if agg.kind in ("count", "count_units", "sum"):
        return c["count" if agg.kind != "sum" else "sum"]
    if f"_a{i}_lo" in rows.columns:  # per-partition bounds: each partition's own middle
        mid = (rows[f"_a{i}_lo"].to_numpy(dtype=np.float64) + rows[f"_a{i}_hi"].to_numpy(dtype=np.float64)) / 2.0
    elif agg.lower is None or agg.upper is None:  # the bounds step sets every bound before the plan runs
        raise BoundsError(f"{agg.label!r} has no bounds at the exact-value step")
    else:
        mid = (float(agg.lower) + float(agg.upper)) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_c = c["S"] / c["N"]
        if agg.kind == "avg":
            return mean_c + mid
        variance = c["Q"] / c["N"] - mean_c**2
        return np.sqrt(variance) if agg.kind == "stddev" else variance
