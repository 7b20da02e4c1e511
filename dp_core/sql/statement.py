"""A whole DP SQL statement: its DP SELECTs, their budget shares, and the outer query over them.

    WITH a AS (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5) dept, COUNT(*) AS n ...),
         b AS (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5) dept, AVG(age) AS m ...)
    SELECT a.dept, n, m FROM a JOIN b USING (dept) WHERE n > 10 ORDER BY n DESC

Each DP SELECT is compiled on its own (`compile.Compiler`) and spends its own share; the statement's
total (the sum, basic composition) is known before anything runs, and is what a ledger charges.
Everything outside the DP SELECTs is post-processing of their released tables, joined if need be
with public tables: it must not read a protected table (nor a CTE over one). CTEs are classified:
`released` (they hold DP results: outer query only), `protected` (rows of a protected table: DP
SELECTs only) and `public`.

Budget: a DP SELECT with OPTIONS (epsilon = e) spends e; the request's epsilon is shared equally
by the DP SELECTs that give none (for one DP SELECT: all of it). The same for delta (without a
request delta, each DP SELECT without its own spends the default 1e-6).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from ..errors import InvalidQueryError, UnsupportedError
from ..input_checks import check_delta, check_epsilon
from ..no_value_errors import never_failing
from ..sql_scopes import table_reads
from .compile import CompiledQuery, Compiler
from .ownership import OwnershipChecker, TableInfo, _arg, check_column_list, check_functions
from .sample import PLACEHOLDER as SAMPLE_FUNCTION
from .sample import sample_fraction
from .syntax import ParsedStatement, mark_of, parse_statement, quote

RELEASED_PREFIX = "__dp_release_"
#: the table functions an outer query may read: they generate rows and read nothing
GENERATORS = (exp.GenerateSeries,)


@dataclass(frozen=True)
class CompiledStatement:
    """The DP SELECTs of a statement (in order of appearance) and the outer query over them."""

    parts: tuple[CompiledQuery, ...]
    outer: exp.Expression | None  # None: the statement is one DP SELECT, released as is
    public_tables: tuple[str, ...]  # catalog names the outer query reads
    options_epsilon: bool = False  # some DP SELECT fixes its own epsilon in OPTIONS (not the request's)
    #: the outer query as written (`outer` is it under TRY): DuckDB names its unnamed columns
    outer_written: exp.Expression | None = None

    @property
    def epsilon(self) -> float:
        """The statement's total epsilon (basic composition over its DP SELECTs)."""
        return float(sum(p.query.epsilon for p in self.parts))

    @property
    def delta(self) -> float:
        return float(sum(p.query.delta for p in self.parts))

    @property
    def public_reads(self) -> tuple[str, ...]:
        """Every public table the statement reads (outer query, joins and subqueries of its DP
        SELECTs, public groups): shown as public, never charged, in reports."""
        names = set(self.public_tables)
        for p in self.parts:
            names |= set(p.public_tables) | set(p.public_groups_tables) | set(p.output_tables)
        return tuple(sorted(names))

    def tables_read(self, catalog_units: dict[str, str | None]) -> tuple[tuple[str, str | None], ...]:
        """(name, privacy unit or None) of every table read: the protected ones first (charged),
        then the public ones (never charged). catalog_units: name -> unit."""
        protected = sorted({t for p in self.parts for t in p.protected_tables})
        return tuple((n, catalog_units.get(n)) for n in protected) + tuple((n, None) for n in self.public_reads)

    @property
    def simple(self) -> bool:
        return self.outer is None

    def outer_sql(self) -> str | None:
        return None if self.outer is None else self.outer.sql("duckdb")

    def budget_lines(self) -> list[str]:
        """The budget as it will be spent, per DP SELECT: shown before anything runs."""
        lines = [f"DP SELECT {i + 1}: epsilon {p.query.epsilon:.6g}, delta {p.query.delta:.3g}"
                 for i, p in enumerate(self.parts)]
        return lines + [f"total: epsilon {self.epsilon:.6g}, delta {self.delta:.3g}"]


def released_name(n: int) -> str:
    return f"{RELEASED_PREFIX}{n}"


def _share(clauses, key: str, request, default=None) -> dict[int, float | None]:
    """Each DP SELECT's value of `key`: its OPTIONS value, else an equal share of what the
    request's value leaves after the OPTIONS values."""
    fixed = {n: c.options[key] for n, c in clauses.items() if c.options.get(key) is not None}
    lacking = [n for n in clauses if n not in fixed]
    out: dict[int, float | None] = dict(fixed)
    if not lacking:
        return out
    if request is None:  # no request value: each DP SELECT without its own takes the default
        return {**out, **{n: default for n in lacking}}
    # the request's value is checked as the engine checks a query's (dp.Query, a request file): one message
    total = check_epsilon(request) if key == "epsilon" else check_delta(request)
    left = float(total) - sum(fixed.values())
    if fixed and left <= (0 if key == "epsilon" else -1e-300):
        raise InvalidQueryError(
            f"the request's {key} ({total:g}) is the statement's total, but OPTIONS already spend "
            f"{sum(fixed.values()):g}: nothing is left for the DP SELECT(s) without their own {key}"
        )
    for n in lacking:
        out[n] = left / len(lacking) if len(clauses) > 1 else float(total)
    return out


def _tables(node: exp.Expression):
    return [t for t in node.find_all(exp.Table) if isinstance(t.this, exp.Identifier)]


def _reads_any(node: exp.Expression, names: set[str]) -> bool:
    return any(not t.args.get("db") and t.name.lower() in names for t in _tables(node))


def compile_statement(sql: str, catalog: dict[str, TableInfo], *, epsilon=None, delta=None,
                      max_partitions_contributed=None, **options) -> CompiledStatement:
    """Parse the statement, check every DP SELECT's FROM and the outer query, compile each DP
    SELECT with its budget share."""
    parsed: ParsedStatement = parse_statement(sql)
    tree = parsed.tree
    refuse_engine_names(tree)
    checker = OwnershipChecker(catalog)
    marked = sorted((s for s in tree.find_all(exp.Select) if mark_of(s) is not None), key=mark_of)
    for s in marked:
        parent = s.parent
        while parent is not None and not isinstance(parent, exp.CTE):  # a CTE is a scope of its own
            if isinstance(parent, exp.Select) and mark_of(parent) is not None:
                raise InvalidQueryError(
                    "a DP SELECT inside another DP SELECT: the inner one's results cannot be the outer one's rows "
                    "(each row must belong to one unit); put the DP SELECTs side by side in an outer query"
                )
            parent = parent.parent

    with_clause = _arg(tree, "with")
    kept: list[exp.CTE] = []  # protected and public CTEs: visible inside DP SELECTs
    kinds: dict[str, str] = {}
    if with_clause is not None:
        if with_clause.args.get("recursive"):
            raise InvalidQueryError("WITH RECURSIVE is not allowed (a recursive CTE can mix units' rows)")
        for cte in with_clause.expressions:
            name = cte.alias
            if not name:
                raise InvalidQueryError(f"a CTE needs a name: {quote(cte)[:60]!r}")
            if name.lower() in kinds:
                raise InvalidQueryError(f"the CTE name {name!r} is used twice")
            body = cte.this
            if any(mark_of(s) is not None for s in body.find_all(exp.Select)) or _reads_any(body, checker.released):
                checker.released.add(name.lower())
                kinds[name.lower()] = "released"
                continue
            rel = checker.query(body, f"CTE {name!r}")
            rel = check_column_list(cte, rel, f"CTE {name!r}")
            checker.ctes[name.lower()] = rel
            kinds[name.lower()] = "protected" if rel.unit is not None else "public"
            kept.append(cte)

    eps = _share(parsed.clauses, "epsilon", epsilon)
    fixed_epsilon = any(c.options.get("epsilon") is not None for c in parsed.clauses.values())
    dlt = _share(parsed.clauses, "delta", delta, default=1e-6)
    parts = []
    for s in marked:
        n = mark_of(s)
        parts.append(Compiler(checker).compile(
            s, parsed.clauses[n], kept, epsilon=eps[n], delta=dlt[n],
            max_partitions_contributed=max_partitions_contributed, own_with=s is not tree, **options))

    refuse_samples_left([part.source for part in parts])
    if len(parts) > 1:  # each DP SELECT's delta was checked; the statement's guarantee is their sum
        total = float(sum(p.query.delta for p in parts))
        check_delta(total, "the statement's total delta (summed over its DP SELECTs)")
    if any(s is tree for s in marked) and parts[0].plain:
        return CompiledStatement(tuple(parts), None, (), options_epsilon=fixed_epsilon)
    written, public = _outer_query(tree, catalog, kinds)
    # post-processing cannot fail on a released (noisy) value either (no_value_errors.py): a cast that
    # failed exactly when the noise pushed a count past 127 made a refunded failure a free noisy sample
    return CompiledStatement(tuple(parts), never_failing(written), public, options_epsilon=fixed_epsilon,
                             outer_written=written)


def refuse_engine_names(tree: exp.Expression) -> None:
    """The names the engine gives its own parts are not the user's to use: its released tables
    (`__dp_release_<n>`, which the outer query reads in place of each DP SELECT) as a table or CTE
    name, and its sample function (`__rowsample_keep`, sample.py) as a call. Each would otherwise read
    an internal table or call an internal function under a confusing error, or none."""
    for node in tree.walk():
        if isinstance(node, exp.Table) and not node.args.get("db"):
            name = node.name
        elif isinstance(node, exp.CTE):
            name = node.alias
        else:
            name = None
        if name and name.lower().startswith(RELEASED_PREFIX):
            raise InvalidQueryError(f"the table name {name!r} is reserved: names starting with {RELEASED_PREFIX!r} "
                                    "are the engine's released tables; rename the table or CTE")
        if isinstance(node, exp.Anonymous) and str(node.name).lower() == SAMPLE_FUNCTION:
            raise InvalidQueryError(f"{quote(node)[:60]!r}: {SAMPLE_FUNCTION} is the engine's own sample function; "
                                    "sample rows with TABLESAMPLE BERNOULLI (p PERCENT) after a table in a FROM")


def refuse_samples_left(sources: list[exp.Expression]) -> None:
    """A safety net: the ownership checker rewrites every sample of a DP SELECT's rows into the seeded
    per-unit sample (sample.py) or refuses it; a TABLESAMPLE still in a compiled source would be the
    engine's own row sampling, outside the accounting, so the statement is refused instead of run."""
    for i, source in enumerate(sources):
        if source.find(exp.TableSample) is not None:
            raise UnsupportedError(f"DP SELECT {i + 1}: TABLESAMPLE is supported after a table or a subquery in a FROM "
                                   "clause only")


def _cte_kinds_read(outer: exp.Expression, kinds: dict[str, str]) -> dict[int, str]:
    """id of each table node of the outer query that reads a CTE where it is written
    (sql_scopes.table_reads) -> that CTE's kind: the statement's own (released, public, protected)
    for a CTE of its top WITH clause, `local` for one of a nested WITH (its body is checked here like
    the rest of the outer query). A name read where its CTE is not yet defined is absent: a table."""
    top = _arg(outer, "with")
    top_ctes = {id(c) for c in top.expressions} if isinstance(top, exp.With) else set()
    return {id(t): kinds.get(cte.alias.lower(), "local") if id(cte) in top_ctes else "local"
            for t, cte in table_reads(outer) if cte is not None}


def _outer_query(tree: exp.Expression, catalog: dict[str, TableInfo], kinds: dict[str, str]):
    """The statement with each DP SELECT replaced by a read of its released table; checked to read
    no protected table and no CTE over one."""
    outer = tree.copy()
    for s in [s for s in outer.find_all(exp.Select) if mark_of(s) is not None]:
        read = exp.select("*").from_(exp.to_table(released_name(mark_of(s))))
        if s is outer:
            outer = read
        else:
            s.replace(read)
    ctes_seen = _cte_kinds_read(outer, kinds)  # before the protected CTEs leave the WITH clause
    with_clause = _arg(outer, "with")
    if with_clause is not None:
        keep = [c for c in with_clause.expressions if kinds.get(c.alias.lower()) != "protected"]
        if keep:
            with_clause.set("expressions", keep)
        else:
            with_clause.pop()
    check_functions(outer, "the outer query")
    for node in list(outer.find_all(exp.TableSample)):
        # post-processing (released tables) or public rows, run once: DuckDB's own per-row sample,
        # under the same rules as inside a DP SELECT (sample.py)
        fraction = sample_fraction(node, "the outer query")
        if fraction >= 1:
            node.pop()
        else:  # DuckDB reads the percentage bare: `BERNOULLI ((10) PERCENT)` is its syntax error
            node.set("method", exp.var("BERNOULLI"))
            node.set("percent", node.args["percent"].unnest())
    for node in outer.find_all(exp.Table):
        if not isinstance(node.this, exp.Identifier) and not isinstance(node.this, GENERATORS):
            # read_csv('people.csv'), read_parquet, query('...'), glob: rows of no registered table, read
            # unchecked (a protected table registered by its file path would be released as it is)
            raise InvalidQueryError(
                f"the outer query: {quote(node)[:80]!r} cannot be used in FROM: a table function reads rows of no "
                "registered table (a file, a path or other SQL), which could hold a protected table's rows; read "
                "registered tables by name (RANGE, GENERATE_SERIES and UNNEST are allowed)")
    lowered = {k.lower(): v for k, v in catalog.items()}
    public = set()
    for t in _tables(outer):
        name = t.name.lower()
        kind = ctes_seen.get(id(t))  # the CTE this name reads where it is written (None: a table)
        if not t.args.get("db") and (name.startswith(RELEASED_PREFIX) or kind in ("released", "public", "local")):
            continue
        if not t.args.get("db") and kind == "protected":
            raise InvalidQueryError(
                f"not a DP query: the CTE {t.name!r} holds rows of a protected table and is read outside a DP SELECT "
                "(a plain read would release them): read it only in the FROM of SELECT WITH DIFFERENTIAL_PRIVACY"
            )
        parts = [p.name for p in (t.args.get("catalog"), t.args.get("db"), t.this) if p is not None]
        info = lowered.get(".".join(parts).lower()) or lowered.get(name)
        if info is None and not t.args.get("db") and name in kinds:
            raise InvalidQueryError(
                f"the outer query: {t.name!r} is read in its own CTE or in a CTE before it, where the CTE is not yet "
                "defined: DuckDB reads a table or a file of that name there (a CTE named after a protected table's "
                "file released its raw rows); not allowed (define a CTE before the queries that read it)")
        if info is None:
            known = ", ".join(sorted(i.name for i in catalog.values()))
            raise InvalidQueryError(f"unknown table {t.name!r} (registered: {known or 'none'})")
        if info.unit is not None:
            raise InvalidQueryError(
                f"not a DP query: {t.name!r} is a protected table (privacy unit {info.unit!r}) read outside a DP "
                "SELECT; a plain read would release its rows. Read it with SELECT WITH DIFFERENTIAL_PRIVACY "
                "OPTIONS (...) or SELECT WITH ANONYMIZATION (ANON_COUNT, ANON_SUM, ...)"
            )
        public.add(info.name)
        if t.args.get("db"):  # the engine registers tables by their catalog name
            t.set("db", None)
            t.set("catalog", None)
            t.set("this", exp.to_identifier(info.name, quoted=True))
    for node in outer.walk():
        if isinstance(node, exp.Anonymous) and str(node.name).upper().startswith(("ANON_", "__DP_")):
            raise InvalidQueryError(
                f"{quote(node)[:60]!r}: a DP aggregate outside a DP SELECT list; write SELECT WITH "
                "DIFFERENTIAL_PRIVACY ... before it"
            )
    return outer, tuple(sorted(public))


__all__ = ["CompiledStatement", "UnsupportedError", "compile_statement", "released_name"]
