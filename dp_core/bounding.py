"""The contribution-bounding SQL plan (dp-engine.md, "The two-stage rewrite", steps 2-5).

One SQL statement, run inside the data engine, turns raw rows into per-partition exact sums:

  partial  GROUP BY (unit, keys): each unit's partial per aggregate, and a keyed hash of
           (unit, keys, secret seed) that orders a unit's partitions at random;
  cut      for units in more than C_u partitions: the C_u-th smallest hash (the cutoff);
  bounded  the partial rows whose hash is at most their unit's cutoff: at most C_u per unit
           (DuckDB: an anti join that drops the rows above the cutoff);
  final    GROUP BY keys over bounded rows: distinct units, clamped sums, clamping loss.

Why a keyed hash and a cutoff: the random key must be drawn once per (unit, partition) row on
every engine and every reference (random() in a CTE may be re-drawn), and the per-unit cutoff
(one aggregate and an anti join) was faster on DuckDB than the window forms (docs/engine.md,
issue 41). The choice is data-independent per unit, so it is unbiased; its privacy does not
rest on the seed.
With public partitions, rows outside the listed keys are dropped first (they must not use up a
unit's C_u) and every listed key is returned, empty or not.

Rows with a NULL unit id are dropped first too: they belong to no unit, so they add nothing to any
unit's contribution and removing a unit leaves them out either way. A whole input with such rows
is refused before this (engine.check_values); the rule is for rows a query derived (a DP SELECT over
a public table with privacy_unit_column), where a refusal would depend on the selected rows.
So are rows whose DATE or TIMESTAMP group key no released table can hold (DuckDB: 'infinity', or a
date beyond the +-292,000 years of pandas' microseconds): reading the candidate partitions failed on
such a key, before any selection, so a key computed from one person's row (`CASE WHEN name = 'Alice'
AND ... THEN DATE 'infinity' ...`) made the release fail or not (until 2026-11-29). A whole input
with an infinite date key is refused before this (engine.check_values), as for NULL units. On Spark
the DATE keys a released table can hold are Python's dates, years 1 to 9999 (Spark's own range is
wider: `date_add(d, 3000000)` of one person's row failed the release with "year 10233 is out of
range" until 2026-11-30).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot

from .aggregates import AggregatePlan, plan_aggregate
from .errors import UnsupportedError
from .input_checks import FLOAT_TYPES
from .query import Query
from .row_filter import compile_filter
from .selection_weighted import WEIGHTED_SELECTIONS, weight_sql
from .sql_text import ident, literal

INPUT_NAME = "dp_input"
SEED_SQL_TYPE = {"duckdb": "UBIGINT", "spark": "BIGINT"}


@dataclass(frozen=True)
class BoundingPlan:
    """The SQL of one query's bounding stage and the aggregate pieces it computes."""

    with_clause: str  # the CTEs, ending with `_bounded` (per-unit rows after bounding) and `_final`
    body: str
    aggregates: tuple[AggregatePlan, ...]
    keys: tuple[str, ...]
    ctes: tuple[str, ...] = ()  # the CTEs of `with_clause` one by one (DuckDB dialect only)
    unit_rows: str = "_bounded"  # the CTE of the bounded rows with their bounds (per-partition bounds: `_bounded_pb`)

    @property
    def sql(self) -> str:
        return f"{self.with_clause}\n{self.body}"


def public_keys_sql(query: Query, key_types: dict[str, str] | None = None) -> str:
    """The public partition keys as a VALUES table, each value cast to its column's type (so that
    1 and '1' cannot stand for the same partition twice)."""
    types = [(key_types or {}).get(k) for k in query.group_by]

    def value(v, t):
        return f"CAST({literal(v)} AS {t})" if t and v is not None else literal(v)

    rows = ", ".join("(" + ", ".join(value(v, t) for v, t in zip(key, types)) + ")" for key in query.public_partitions)
    cols = ", ".join(ident(k) for k in query.group_by)
    if not rows:  # no public key: a table of the key columns without rows (VALUES needs one)
        nulls = ", ".join(f"CAST(NULL AS {t})" if t else "NULL" for t in types)
        return f"(SELECT {nulls} WHERE FALSE) AS _pk({cols})"
    return f"(VALUES {rows}) AS _pk({cols})"


def _bounds_values(frame, keys: tuple[str, ...], key_types: dict[str, str] | None) -> str:
    """Per-partition bounds as a VALUES table (keys cast to their columns' types, lo, hi)."""
    types = [(key_types or {}).get(k) for k in keys]

    def value(v, t):
        return f"CAST({literal(v)} AS {t})" if t and v is not None else literal(v)

    rows = []
    for rec in frame.to_dict("records"):
        cells = [value(_plain(rec[k]), t) for k, t in zip(keys, types)]
        cells += [literal(float(rec["lo"])), literal(float(rec["hi"]))]
        rows.append("(" + ", ".join(cells) + ")")
    cols = ", ".join([*(ident(k) for k in keys), "lo", "hi"])
    if not rows:  # no partition got bounds (Query.bounds_fallback): none is released
        nulls = ", ".join([*(f"CAST(NULL AS {t})" if t else "NULL" for t in types), "CAST(NULL AS DOUBLE)",
                           "CAST(NULL AS DOUBLE)"])
        return f"(SELECT {nulls} WHERE FALSE) AS _v({cols})"
    return f"(VALUES {', '.join(rows)}) AS _v({cols})"


def _plain(v):
    """A Python value for a key from a DataFrame (NaN as NULL)."""
    if v is None or (isinstance(v, float) and v != v):
        return None
    return v.item() if hasattr(v, "item") else v


def _same_key(left: str, right: str, keys: tuple[str, ...]) -> str:
    return " AND ".join(f"{left}.{ident(k)} IS NOT DISTINCT FROM {right}.{ident(k)}" for k in keys)


#: the engine-specific pieces of the plan: a keyed 64-bit hash (the hash of (unit, keys), xor the
#: seed, hashed again: DuckDB's hash(unit, keys, seed) alone orders a unit's keys far from
#: uniformly across seeds), the sorted list of a group's n smallest values, duplicates kept
#: (DuckDB: the group's list, then its n smallest by list_aggregate: 0.27 s against 0.34 s on L
#: for the aggregate min(x, n), which keeps a heap per group; Spark: sort the collected list) and its
#: i-th element (Spark: try_element_at, because Spark evaluates the index before HAVING drops the
#: short lists)
DIALECT_PIECES = {
    "duckdb": {"hash": "hash(xor(hash({cols}), {seed}))", "smallest": "list_aggregate(list({col}), 'min', {n})",
               "at": "list_extract({arr}, {i})"},
    "spark": {"hash": "xxhash64(xor(xxhash64({cols}), {seed}))", "smallest": "array_sort(collect_list({col}))",
              "at": "try_element_at({arr}, {i})"},
}


#: the DATE range of Python's datetime.date, in which a key read back from Spark can be held
PYTHON_DATES = "DATE '0001-01-01' AND DATE '9999-12-31'"

#: the 60-bit prefix of an MD5 digest as a BIGINT, per dialect: the same number on every engine
PORTABLE_DIGEST = {"duckdb": "CAST(('0x' || substr(md5({text}), 1, 15)) AS BIGINT)",
                   "spark": "CAST(conv(substr(md5({text}), 1, 15), 16, 10) AS BIGINT)"}


def portable_hash_sql(dialect: str, columns: list[str], seed_sql: str) -> str:
    """A keyed hash every engine computes alike (for plans that must match across engines: the
    same bounding seed then keeps the same rows on DuckDB and Spark). The text hashed is the seed
    and each column as `length:value` (NULL as `-`), joined by `|`: no two rows share a text.
    Integer, text and date keys print alike on both engines; MD5 costs more than the native
    hashes (bench/engine.py), so it is chosen with `portable_hash=True`, not by default."""
    parts = [f"CAST({seed_sql} AS VARCHAR)"]
    parts += [f"coalesce(CAST(length(CAST({c} AS VARCHAR)) AS VARCHAR) || ':' || CAST({c} AS VARCHAR), '-')"
              for c in columns]
    return PORTABLE_DIGEST[dialect].format(text=" || '|' || ".join(parts))


def build_plan(
    query: Query, integer_columns: set[str], seed: int, source: str = INPUT_NAME, dialect: str = "duckdb",
    key_types: dict[str, str] | None = None, partition_bounds: dict | None = None, transpile: bool = True,
    portable_hash: bool = False,
) -> BoundingPlan:
    """The SQL for `query` over the relation `source` with the per-release hash `seed`.

    Written in DuckDB's dialect with the engine-specific pieces of `dialect`, then transpiled by
    sqlglot (`BoundingPlan.sql` is in `dialect`; with transpile=False it stays in DuckDB's syntax
    for a backend that transpiles what it runs, as the Spark backend does, so that the engine can
    append its own statements to `with_clause`). partition_bounds: aggregate index ->
    DataFrame of (group keys, lo, hi): that aggregate clamps each partition to its own bounds.
    key_types: column -> type of the input (its schema): the keys' types for the VALUES tables,
    and which value columns are floats (NaN there is missing: aggregates.plan_aggregate).
    """
    if dialect not in DIALECT_PIECES:
        raise UnsupportedError(f"no SQL dialect {dialect!r}: choose one of {sorted(DIALECT_PIECES)}")
    pieces = DIALECT_PIECES[dialect]
    unit = ident(query.privacy_unit)
    keys = query.group_by
    key_cols = [ident(k) for k in keys]
    cu = query.effective_max_partitions
    seed_sql = f"CAST({int(seed)} AS {SEED_SQL_TYPE[dialect]})"
    partition_bounds = partition_bounds or {}
    # Spark refuses a random() inside an aggregate: each row's draw for the quantiles is a column of _src
    row_draw = dialect != "duckdb" and any(a.kind == "quantile" for a in query.aggregates)
    float_columns = {c for c, t in (key_types or {}).items() if str(t).upper() in FLOAT_TYPES}
    plans = tuple(
        plan_aggregate(i, agg, integer_columns, seed_sql, query.quantile_bins,
                       list(zip(partition_bounds[i]["lo"], partition_bounds[i]["hi"])) if i in partition_bounds else None,
                       row_draw="_row_draw" if row_draw else "random()", float_columns=float_columns)
        for i, agg in enumerate(query.aggregates)
    )

    conditions = [f"{unit} IS NOT NULL"]  # a row of no unit: dropped (module docstring)
    if dialect == "duckdb":  # a date or timestamp key no released table can hold: dropped (module docstring)
        for k in keys:
            kind = str((key_types or {}).get(k, "")).upper()
            if kind == "DATE":
                conditions.append(f"({ident(k)} IS NULL OR (isfinite({ident(k)}) AND "
                                  f"TRY_CAST({ident(k)} AS TIMESTAMP) IS NOT NULL))")
            elif kind.startswith("TIMESTAMP"):
                conditions.append(f"({ident(k)} IS NULL OR isfinite({ident(k)}))")
    elif dialect == "spark":  # a date key Python's dates cannot hold: dropped (module docstring)
        for k in keys:
            if str((key_types or {}).get(k, "")).upper() == "DATE":
                conditions.append(f"({ident(k)} IS NULL OR {ident(k)} BETWEEN {PYTHON_DATES})")
    if query.where is not None:
        conditions.append(f"({compile_filter(query.where)[0]})")
    if query.public_partitions is not None:
        conditions.append(f"EXISTS (SELECT 1 FROM {public_keys_sql(query, key_types)} WHERE {_same_key('_pk', '_s', keys)})")
    src = f"SELECT *{', random() AS _row_draw' if row_draw else ''} FROM {source} AS _s WHERE {' AND '.join(conditions)}"

    partial_cols = [unit, *key_cols]
    for plan in plans:
        partial_cols += [f"{sql} AS {ident(alias)}" for alias, sql in plan.partials.items()]
    group_cols = ", ".join([unit, *key_cols])
    needs_bounding = bool(keys)
    if needs_bounding:
        rank = (portable_hash_sql(dialect, [unit, *key_cols], seed_sql) if portable_hash
                else pieces["hash"].format(cols=group_cols, seed=seed_sql))
        partial_cols.append(f"{rank} AS _rk")
    ctes = [f"_src AS ({src})", f"_partial AS (SELECT {', '.join(partial_cols)} FROM _src GROUP BY {group_cols})"]
    weighted = needs_bounding and query.private_partitions and query.selection in WEIGHTED_SELECTIONS
    window = needs_bounding and dialect != "duckdb"  # Spark: one pass over `_partial` (window_bounding_ctes)
    if window:
        ctes += window_bounding_ctes(unit, cu, weighted)
        dropped = "coalesce(sum(_final._dropped_part) OVER (), 0)"
    elif weighted:  # the same cutoff, over every unit, keeping each unit's degree for its weights
        ctes += weighted_bounding_ctes(unit, cu, pieces)
        dropped = "(SELECT coalesce(sum(_over), 0) FROM _cut)"
    elif needs_bounding:
        ctes += cutoff_bounding_ctes(unit, cu, pieces)
        dropped = "(SELECT coalesce(sum(_over), 0) FROM _cut)"
    else:
        ctes.append("_bounded AS (SELECT * FROM _partial)")
        dropped = "0"

    finals = ["count(*) AS _n_units"]
    histograms = [] if dialect == "duckdb" else [plan for plan in plans if plan.histogram_bin]
    for plan in plans:
        finals += [f"{sql} AS {ident(alias)}" for alias, sql in plan.finals.items()
                   if not (plan in histograms and alias.endswith("_hist"))]
    if weighted:  # the weighted histogram of the Gaussian selections (selection_weighted.py)
        finals.append(f"CAST(sum({weight_sql('_t', cu, pieces['at'])}) AS BIGINT) AS _w1")
    if window:  # each unit's dropped pairs, carried by its first row (summed over partitions in the body)
        finals.append(f"CAST(sum(CASE WHEN _pos = 1 AND _deg > {cu} THEN _deg - {cu} ELSE 0 END) AS BIGINT) AS _dropped_part")
    source_rows = "_bounded"
    if partition_bounds:  # each row gets its partition's bounds (NULL: none were inferred)
        joins, extra = [], []
        for i, frame in sorted(partition_bounds.items()):
            ctes.append(f"_pb{i} AS (SELECT * FROM {_bounds_values(frame, keys, key_types)})")
            joins.append(f"LEFT JOIN _pb{i} ON {_same_key(f'_pb{i}', '_bounded', keys)}")
            extra += [f"_pb{i}.lo AS {ident(f'_a{i}_lo')}", f"_pb{i}.hi AS {ident(f'_a{i}_hi')}"]
            finals += [f"any_value({ident(f'_a{i}_lo')}) AS {ident(f'_a{i}_lo')}",
                       f"any_value({ident(f'_a{i}_hi')}) AS {ident(f'_a{i}_hi')}"]
        ctes.append(f"_bounded_pb AS (SELECT _bounded.*, {', '.join(extra)} FROM _bounded {' '.join(joins)})")
        source_rows = "_bounded_pb"
    select_keys = ", ".join(key_cols)
    final = f"SELECT {select_keys + ', ' if keys else ''}{', '.join(finals)} FROM {source_rows}"
    if keys:
        final += f" GROUP BY {select_keys}"
    if histograms:  # engines without DuckDB's histogram(): bin counts per partition, joined on
        ctes += histogram_ctes(histograms, source_rows, keys)
        ctes.append(f"_final_sums AS ({final})")
        joins = " ".join(f"LEFT JOIN _h{plan.index} ON {_same_key(f'_h{plan.index}', '_final_sums', keys) or 'TRUE'}"
                         for plan in histograms)
        hist_cols = ", ".join(f"_h{plan.index}._hist AS {ident(f'_a{plan.index}_hist')}" for plan in histograms)
        ctes.append(f"_final AS (SELECT _final_sums.*, {hist_cols} FROM _final_sums {joins})")
    else:
        ctes.append(f"_final AS ({final})")

    if query.public_partitions is not None:
        out_cols = [f"_pk.{c}" for c in key_cols]
        for alias, default in _final_defaults(plans):
            out_cols.append(f"coalesce(_final.{ident(alias)}, {default}) AS {ident(alias)}" if default else f"_final.{ident(alias)}")
        body = f"SELECT {', '.join(out_cols)}, {dropped} AS _dropped_pairs FROM {public_keys_sql(query, key_types)} LEFT JOIN _final ON {_same_key('_pk', '_final', keys)}"
    elif window:  # every column of _final but the per-partition carrier of the dropped pairs
        shown = [*key_cols, *(f.rsplit(" AS ", 1)[1] for f in finals if not f.endswith(" AS _dropped_part")),
                 *(ident(f"_a{plan.index}_hist") for plan in histograms)]
        body = f"SELECT {', '.join(shown)}, {dropped} AS _dropped_pairs FROM _final"
    else:
        body = f"SELECT *, {dropped} AS _dropped_pairs FROM _final"
    with_clause = "WITH " + ",\n".join(ctes)
    if dialect != "duckdb" and transpile:
        with_clause, body = (render(part, dialect) for part in (with_clause + " SELECT 1", body))
        with_clause = with_clause[: -len(" SELECT 1")]
        return BoundingPlan(with_clause, body, plans, keys, (), source_rows)
    return BoundingPlan(with_clause, body, plans, keys, tuple(ctes), source_rows)


def histogram_ctes(plans, source_rows: str, keys: tuple[str, ...]) -> list[str]:
    """Per partition, the {bin: count} map of each quantile's bins (what DuckDB's histogram()
    gives in one aggregate): count per (keys, bin), then one map per partition. Partition-sized
    intermediate (at most bins rows per partition)."""
    key_cols = ", ".join(ident(k) for k in keys)
    lead = f"{key_cols}, " if keys else ""
    ctes = []
    for plan in plans:
        value, bin_sql = plan.histogram_bin
        group = f" GROUP BY {key_cols}" if keys else ""
        ctes.append(
            f"_hb{plan.index} AS (SELECT {lead}{bin_sql} AS _b, count(*) AS _c FROM {source_rows} "
            f"WHERE {value} IS NOT NULL GROUP BY {lead}{bin_sql})")
        ctes.append(f"_h{plan.index} AS (SELECT {lead}map_from_entries(collect_list(struct(_b, _c))) AS _hist "
                    f"FROM _hb{plan.index}{group})")
    return ctes


def cutoff_bounding_ctes(unit: str, cu: int, pieces: dict) -> list[str]:
    """DuckDB's bounding CTEs. `_cut`: per unit in more than C_u partitions, its C_u-th smallest
    hash `_cutoff`, whether the (C_u+1)-th equals it `_tie`, and its dropped pairs `_over`.
    `_bounded`: the rows of `_partial` that no `_cut` row drops, a row being dropped iff its hash
    is above its unit's cutoff, or equal to it with `_tie` (a 64-bit collision: the tied rows all
    go, so a unit never keeps more than C_u). So a row is kept iff at most C_u of its unit's rows
    have a hash <= its own, the rule of window_bounding_ctes. The anti join with scalar columns
    costs less than a LEFT JOIN carrying `_cut`'s list and filtering after it, and much less than
    NOT EXISTS, which DuckDB 2.0 does not plan as an anti join (docs/engine.md, issue 41)."""
    at = pieces["at"]
    cutoff, after = at.format(arr="_m", i=cu), at.format(arr="_m", i=cu + 1)
    return [
        (f"_cut AS (SELECT {unit}, {cutoff} AS _cutoff, {after} = {cutoff} AS _tie, _over FROM "
         f"(SELECT {unit}, {pieces['smallest'].format(col='_rk', n=cu + 1)} AS _m, count(*) - {cu} AS _over "
         f"FROM _partial GROUP BY {unit} HAVING count(*) > {cu}))"),
        (f"_bounded AS (SELECT _partial.* FROM _partial ANTI JOIN _cut ON _cut.{unit} = _partial.{unit} "
         "AND (_partial._rk > _cut._cutoff OR (_partial._rk = _cut._cutoff AND _cut._tie)))"),
    ]


def window_bounding_ctes(unit: str, cu: int, weighted: bool) -> list[str]:
    """The bounding CTEs for engines that do not materialise a CTE read twice (Spark inlines
    `_partial` into each reader: the cutoff's GROUP BY unit, its join back and the dropped-pairs
    subquery each recomputed the per-(unit, partition) aggregate from the input). Here one window
    pass over `_partial`, partitioned by unit and ordered by the hash (one shuffle), keeps the same
    rows: a row is kept iff at most C_u of its unit's rows have a hash <= its own (`_le`), which is
    the cutoff rule exactly (below the C_u-th smallest hash: `_le` < C_u; equal to it: kept unless
    the (C_u+1)-th ties with it; above it: `_le` > C_u). `_deg` is the unit's partitions before
    bounding; its first row (`_pos` 1) carries the unit's dropped pairs `_deg` - C_u (the final
    aggregate sums them: the DuckDB plan's `_cut` total, understated only when more than C_u of a
    unit's hashes tie at its smallest, a 64-bit collision; a controller-only diagnostic). The
    Gaussian selections' `_t` and `_deg_c` are as in weighted_bounding_ctes."""
    order = f"PARTITION BY {unit} ORDER BY _rk"
    weights = f", least(_deg, {cu}) AS _t, _deg AS _deg_c" if weighted else ""
    return [
        (f"_ranked AS (SELECT _partial.*, count(*) OVER ({order} RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) "
         f"AS _le, count(*) OVER ({order} ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS _deg, "
         f"row_number() OVER ({order}) AS _pos FROM _partial)"),
        f"_bounded AS (SELECT *{weights} FROM _ranked WHERE _le <= {cu})",
    ]


def weighted_bounding_ctes(unit: str, cu: int, pieces: dict) -> list[str]:
    """The bounding CTEs of the Gaussian selections: the same hash cutoff and tie rule as the
    default plan, with the per-unit aggregate over every unit (not only those over C_u) so that
    each kept row carries its unit's degree `_t` = min(partitions, C_u) >= the rows it keeps (a
    unit that loses rows to a hash tie weighs less than 1 in L2, never more), and `_deg_c`, its
    partitions before bounding (so that `_cut` can be re-derived from `_bounded` alone)."""
    at = pieces["at"]
    cutoff, after = at.format(arr="_deg._m", i=cu), at.format(arr="_deg._m", i=cu + 1)
    return [
        (f"_deg AS (SELECT {unit}, {pieces['smallest'].format(col='_rk', n=cu + 1)} AS _m, count(*) AS _c "
         f"FROM _partial GROUP BY {unit})"),
        f"_cut AS (SELECT {unit}, _m, _c - {cu} AS _over FROM _deg WHERE _c > {cu})",
        (f"_bounded AS (SELECT _partial.*, least(_deg._c, {cu}) AS _t, _deg._c AS _deg_c FROM _partial JOIN _deg USING ({unit}) "
         f"WHERE _deg._c <= {cu} OR _partial._rk < {cutoff} OR (_partial._rk = {cutoff} AND {after} <> {cutoff}))"),
    ]


def cut_from_bounded_cte(cu: int) -> str:
    """`_cut` (the bounding loss, one `_over` total) re-derived from the Gaussian selections'
    `_bounded` alone, for a plan that reads `_bounded` from a materialised table: a unit with
    `_deg_c` > C_u partitions keeps C_u rows, each carrying `_deg_c`, so its rows add up to
    C_u (`_deg_c` - C_u) / C_u = its dropped pairs without grouping by unit again. On a 64-bit
    hash tie at the cutoff the unit keeps fewer rows and the loss is understated by that unit's
    share: a controller-only diagnostic, never an input to noise or selection."""
    return (f"_cut AS (SELECT CAST(round(sum((_deg_c - {cu}) / {cu})) AS BIGINT) AS _over FROM _bounded "
            f"WHERE _deg_c > {cu})")


def _final_defaults(plans: tuple[AggregatePlan, ...]):
    """Each final column with its value for an empty public partition (0; NULL for histograms)."""
    yield "_n_units", "0"
    for plan in plans:
        for alias in plan.finals:
            yield alias, None if alias.endswith("_hist") else "0"


def render(sql: str, dialect: str) -> str:
    """SQL text in another engine's dialect (sqlglot transpiles from DuckDB's)."""
    return sqlglot.transpile(sql, read="duckdb", write=dialect)[0]


def unit_rows_sql(plan: BoundingPlan, query: Query) -> str:
    """Each unit's bounded value per partition and aggregate (NULL when it has none), after
    bounding: the contributions from which PRIs are computed. Controller-only."""
    cols = [ident(query.privacy_unit), *[ident(k) for k in query.group_by]]
    cols += [f"CAST({a.unit_value} AS DOUBLE) AS _u{i}" for i, a in enumerate(plan.aggregates) if a.unit_value]
    return f"{plan.with_clause}\nSELECT {', '.join(cols)} FROM {plan.unit_rows}"
