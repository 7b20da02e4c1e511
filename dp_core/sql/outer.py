"""Run a compiled statement: each DP SELECT through the engine, then the outer query (pure
post-processing of the released tables, and public tables) in DuckDB.

Nothing but released (DP) tables and public tables reaches the outer query: its result is as
private as the DP SELECTs' (post-processing). The total spent is the sum over the DP SELECTs.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import sqlglot

from .. import display
from ..backend import DuckDBBackend
from ..engine import execute
from ..errors import InvalidQueryError
from ..no_value_errors import never_failing, refuse_converting_join_keys, refuse_overflowing_sums
from ..query import Query
from ..result import CI_NOTE, ClampingLoss, ControllerOnly, DPResult
from .compile import CompiledQuery, _ident
from .sample import render
from .statement import CompiledStatement, released_name


@dataclass(frozen=True)
class StatementResult(DPResult):
    """The result of a statement with an outer query or several DP SELECTs: `table` is the outer
    query's result; `parts` the DP result of each DP SELECT; epsilon and delta are the totals."""

    parts: tuple[DPResult, ...] = ()

    def readable_table(self) -> pd.DataFrame:
        """The outer query's table with each number written as the reports write it (a whole-number
        column, such as a released count, as integers); text, NULLs and flags as they are."""
        return self.table.map(_readable)

    def __str__(self) -> str:
        head = (f"DP release of {len(self.parts)} DP SELECT(s): epsilon={display.budget(self.epsilon_spent)}, "
                f"delta={display.budget(self.delta_spent)}, {len(self.table)} row(s) after post-processing")
        return f"{head}\n{self.readable_table().to_string(index=False)}\n{CI_NOTE}"

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["parts"] = [p.to_dict() for p in self.parts]
        return out


def _readable(v):
    """A cell of a statement's readable table: a number as `display.value` writes it."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return v
    return v if math.isnan(v) else display.value(v, integer=isinstance(v, (int, np.integer)))


def released_table(result: DPResult, part: CompiledQuery, with_ci: bool, data: dict | None = None,
                   sample_key: int | None = None) -> pd.DataFrame:
    """The DP SELECT's own output: its select list (expressions over the released values),
    ORDER BY and LIMIT. with_ci keeps each plain aggregate's interval columns beside it; a sampled
    public table in the list's subqueries is decided with the release's `sample_key` (sample.py)."""
    columns = []
    for name, sql in part.outputs:
        columns.append(f"{sql} AS {_ident(name)}")
        if with_ci and sql == _ident(name):
            for suffix in ("_ci_low", "_ci_high", "_noise_sd"):
                if f"{name}{suffix}" in result.table.columns:
                    columns.append(_ident(name + suffix))
    sql = f"SELECT {', '.join(columns)} FROM __released"
    if part.having:
        sql += f" WHERE {part.having}"
    if part.order_by:
        sql += " ORDER BY " + ", ".join(f"{_ident(c)} {'DESC' if d else 'ASC'}" for c, d in part.order_by)
    if part.limit is not None:
        sql += f" LIMIT {int(part.limit)}"
    public = {n: data[n] for n in part.output_tables if data and n in data}  # public subqueries of the list
    backend = DuckDBBackend.for_tables({"__released": result.table, **public})
    # the list and HAVING cannot fail on a released (noisy) value (no_value_errors.py): a refunded
    # failure would be a noisy sample the analyst saw for free
    sql = never_failing(sqlglot.parse_one(sql, read="duckdb")).sql("duckdb")
    try:
        return backend.run(render(sql, "duckdb", sample_key))
    finally:
        backend.close()


def run_statement(compiled: CompiledStatement, data: dict, *, threads: int | None = None,
                  part_backend=None, part_dialect: str = "duckdb") -> DPResult:
    """Execute every DP SELECT (each its own engine run), then the outer query over the results.
    part_backend: source SQL -> backend, for DP SELECTs run elsewhere (Spark, part_dialect="spark");
    `data` then holds the public tables only. The statement's TABLESAMPLE clauses are decided with
    one key for the whole release, fresh from the OS CSPRNG (sample.py: every scan, and the public
    groups' key list, read the same sampled rows)."""
    key = secrets.randbits(63)
    results = []
    for part in compiled.parts:
        query = with_public_groups(part, data, threads, sample_key=key)
        if part_backend is not None:
            backend = part_backend(render(part.source_sql("duckdb"), part_dialect, key))
        else:
            backend = DuckDBBackend.for_tables(data, threads=threads)
            backend.define_input(render(part.source_sql("duckdb"), "duckdb", key))
        results.append(execute(query, backend))  # closes the backend
    if compiled.simple:
        return postprocess(results[0], compiled.parts[0])
    only_part = len(compiled.parts) == 1 and compiled.outer_sql() == f"SELECT * FROM {released_name(0)}"
    frames = {released_name(i): released_table(r, p, with_ci=only_part, data=data, sample_key=key)
              for i, (r, p) in enumerate(zip(results, compiled.parts))}
    if only_part:
        table = frames[released_name(0)]
    else:
        backend = DuckDBBackend.for_tables({**{n: data[n] for n in compiled.public_tables}, **frames}, threads=threads)
        try:
            table = backend.run(render(compiled.outer_sql(), "duckdb", key))
            table.columns = written_names(backend, compiled, key, list(table.columns))
        except Exception as err:  # noqa: BLE001 - DuckDB's errors, reported as the query's
            raise InvalidQueryError(f"the outer query could not run on the DP results: {str(err).splitlines()[0]}") from None
        finally:
            backend.close()
    return combine(results, table)


def written_names(backend: DuckDBBackend, compiled: CompiledStatement, key: int, names: list[str]) -> list[str]:
    """The outer table's column names as DuckDB names the query as written (`(n * 2)`, not the names of
    its TRY-guarded form): bound over the released tables, no row read. `names` when they differ in number."""
    if compiled.outer_written is None:
        return names
    described = backend.run(f"DESCRIBE {render(compiled.outer_written.sql('duckdb'), 'duckdb', key)}")
    written = list(described["column_name"])
    return written if len(written) == len(names) else names


def part_schemas(compiled: CompiledStatement, data: dict) -> list[dict[str, str]]:
    """Each DP SELECT's input as the engine sees it when the part runs (run_statement): the columns
    and DuckDB types of its source relation (FROM, joins, WHERE, inner SELECTs) over `data`. Over
    empty stand-ins no row is read: the engine's column checks (engine.check_columns) can then be
    given before any data is. InvalidDataError when a source cannot be bound over these tables."""
    backend = DuckDBBackend.for_tables(data)
    try:
        schemas = []
        for part in compiled.parts:
            backend.define_input(render(part.source_sql("duckdb"), "duckdb", 0))  # a sample's stand-in key
            schemas.append(backend.schema())
        return schemas
    finally:
        backend.close()


def with_public_groups(part: CompiledQuery, data: dict, threads: int | None = None, sample_key: int | None = None) -> Query:
    """The part's query, with OPTIONS (group_selection_strategy = PUBLIC_GROUPS) resolved: its public
    partitions are the distinct key tuples of its public-groups subqueries, read from the public
    tables (no unit's rows: reading them spends nothing). No selection runs, and every listed group
    is released (public_groups.py states the budget)."""
    if part.public_groups_sql is None:
        return part.query
    backend = DuckDBBackend.for_tables({n: data[n] for n in part.public_groups_tables if n in data}, threads=threads)
    try:
        keys = backend.run(render(part.public_groups_sql, "duckdb", sample_key))
    except Exception as err:  # noqa: BLE001 - DuckDB's errors, reported as the query's
        raise InvalidQueryError(f"the public groups (PUBLIC_GROUPS) could not be read: {str(err).splitlines()[0]}") from None
    finally:
        backend.close()
    rows = [tuple(None if _missing(v) else v for v in row) for row in keys.to_dict("split")["data"]]
    if not rows:
        raise InvalidQueryError("the public groups subquery (PUBLIC_GROUPS) lists no group: nothing to release")
    return replace(part.query, public_partitions=tuple(rows))


def _missing(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def postprocess(result: DPResult, compiled: CompiledQuery) -> DPResult:
    """ORDER BY and LIMIT of a plain DP SELECT, applied to the released table."""
    table = result.table
    if compiled.order_by:
        table = table.sort_values([c for c, _ in compiled.order_by],
                                  ascending=[not desc for _, desc in compiled.order_by], kind="stable")
    if compiled.limit is not None:
        table = table.head(compiled.limit)
    return replace(result, table=table.reset_index(drop=True))


def combine(results: list[DPResult], table: pd.DataFrame) -> StatementResult:
    """One result for the statement: the outer table, the summed budget, every mechanism."""
    tag = (lambda i, s: f"DP SELECT {i + 1}: {s}") if len(results) > 1 else (lambda i, s: s)
    budget, mechanisms, notes, bounds = [], [], [], []
    clamping: dict[str, ClampingLoss] = {}
    exact = []
    for i, r in enumerate(results):
        budget += [replace(s, part=tag(i, s.part)) for s in r.budget]
        mechanisms += [replace(m, target=tag(i, m.target)) for m in r.mechanisms]
        notes += [n for n in r.notes if n not in notes]
        bounds += list(r.inferred_bounds)
        clamping.update({tag(i, k): v for k, v in r.controller_only.clamping.items()})
        exact.append(r.controller_only.exact.assign(dp_select=i + 1))
    co = [r.controller_only for r in results]
    controller = ControllerOnly(
        sum(c.partitions_nonempty for c in co), sum(c.partitions_released for c in co), clamping,
        sum(c.unit_partition_pairs for c in co), sum(c.pairs_dropped_by_bounding for c in co),
        pd.concat(exact, ignore_index=True) if exact else pd.DataFrame())
    first: Query = results[0].query if results else None
    query = replace(first, aggregates=(), group_by=(), epsilon=sum(r.epsilon_spent for r in results)) \
        if first is not None else Query((), privacy_unit="", epsilon=0.0)
    return StatementResult(
        table=table.reset_index(drop=True), query=query,
        epsilon_spent=float(sum(r.epsilon_spent for r in results)),
        delta_spent=float(sum(r.delta_spent for r in results)), budget=tuple(budget), mechanisms=tuple(mechanisms),
        partition_selection="; ".join(tag(i, r.partition_selection) for i, r in enumerate(results)) or "none",
        notes=tuple(notes) + ("The table is post-processing (outer query, expressions) of the DP SELECTs' released "
                              "tables: it has no intervals of its own.",),
        controller_only=controller, inferred_bounds=tuple(bounds), parts=tuple(results))


def check_executable(compiled: CompiledStatement, backend: DuckDBBackend, written: str = "") -> None:
    """Bind every DP SELECT's source and the outer query in DuckDB over empty stand-ins of the
    released tables (reads no rows): unknown columns, type errors and functions DuckDB cannot run
    are refused before any budget is spent. `written`: the statement as the analyst wrote it, quoted
    in each refusal (the checks before this one should have refused what DuckDB cannot bind; this
    is the last guard, so its words are a refusal of the query, not DuckDB's bare message)."""
    con = backend.connection
    statement = f" (the statement as written: {_one_line(written)!r})" if written else ""
    for i, part in enumerate(compiled.parts):
        try:
            described = con.execute(f"DESCRIBE SELECT * FROM ({render(part.source_sql('duckdb'), 'duckdb', 0)}) AS s").fetchall()
        except Exception as err:  # noqa: BLE001 - duckdb.Error and its binder/catalog/parser subclasses
            raise InvalidQueryError(
                f"DP SELECT {i + 1} is refused: the rows it reads cannot be computed ({_reason(err)}); check the tables, "
                f"columns and aliases its FROM, WHERE and GROUP BY name{statement}") from None
        def describe(sql: str) -> list[tuple[str, str]]:
            return [(row[0], row[1]) for row in con.execute(f"DESCRIBE {render(sql, 'duckdb', 0)}").fetchall()]
        refuse_overflowing_sums(part.source, describe)
        refuse_converting_join_keys(part.source, describe)
        if part.public_groups_sql is not None:
            try:
                con.execute(f"DESCRIBE {render(part.public_groups_sql, 'duckdb', 0)}")
            except Exception as err:  # noqa: BLE001 - DuckDB's errors
                raise InvalidQueryError(f"DP SELECT {i + 1}: its public groups (PUBLIC_GROUPS): {_first_line(err)}: the "
                                        f"query is refused{statement}") from None
        types = {row[0]: row[1] for row in described}
        columns = [f"CAST(NULL AS {types.get(k, 'VARCHAR')}) AS {_ident(k)}" for k in part.query.group_by]
        for agg in part.query.aggregates:  # every released number is a double, counts too (result.table)
            columns += [f"CAST(NULL AS DOUBLE) AS {_ident(agg.label + s)}"
                        for s in ("", "_ci_low", "_ci_high", "_noise_sd")]
        outputs = ", ".join(f"{sql} AS {_ident(name)}" for name, sql in part.outputs)
        try:
            con.execute(f"CREATE OR REPLACE TEMP TABLE __released AS SELECT {', '.join(columns)} LIMIT 0")
            having = f" WHERE {part.having}" if part.having else ""
            select = render(f"SELECT {outputs} FROM __released{having}", "duckdb", 0)  # a sample's stand-in key
            con.execute(f"CREATE OR REPLACE TEMP TABLE {released_name(i)} AS {select}")
        except Exception as err:  # noqa: BLE001 - DuckDB's errors
            raise InvalidQueryError(f"DP SELECT {i + 1}: its select list cannot be computed: {_first_line(err)}: the "
                                    f"query is refused{statement}") from None
    if compiled.outer is not None:
        try:
            con.execute(f"DESCRIBE {render(compiled.outer_sql(), 'duckdb', 0)}")
        except Exception as err:  # noqa: BLE001 - DuckDB's errors
            raise InvalidQueryError(f"the outer query: {_first_line(err)}: the query is refused{statement}") from None


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _reason(err: Exception) -> str:
    """DuckDB's reason without its error class (`Binder Error: `, `Catalog Error: `)."""
    line = _first_line(err)
    head, sep, rest = line.partition(" Error: ")
    return rest if sep and head.replace(" ", "").isalpha() else line


def _one_line(text: str) -> str:
    """The statement on one line: its line breaks and runs of spaces as one space each."""
    return " ".join(text.split())
