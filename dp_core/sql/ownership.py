"""Row ownership (seed Table 4.3): every row of every relation inside a DP SELECT's FROM clause
must derive from the rows of one privacy unit only, and carry that unit.

    table             rows of a protected table carry its unit column; a public table (no unit)
                      holds no one's rows
    projection        allowed; the unit is carried through (added when the analyst omits it)
    selection         WHERE allowed: a row-level condition; subqueries only over public tables,
                      uncorrelated (IN, EXISTS, scalar)
    aggregation       of protected rows: allowed only when it groups by the unit
    join              protected with public: any condition (each row keeps its unit); an outer
                      join must preserve the protected side only (LEFT: left protected, ...);
                      protected with protected: only on equality of the units (USING (unit),
                      NATURAL with the unit in common, or a.unit = b.unit as an AND-ed term of ON)
    set operation     UNION / INTERSECT / EXCEPT [ALL | DISTINCT] of protected rows with the unit
                      at the same position in every branch (each row keeps its unit)
    everything else   refused: a join of two protected tables without unit equality, aggregates
                      without the unit, window functions and LIMIT / ORDER BY over protected rows,
                      subqueries reading protected tables in conditions or SELECT lists; over
                      protected rows, what renames or pairs columns unseen by these checks (a
                      column list after a name, v(a, b); * EXCLUDE / REPLACE / RENAME; COLUMNS(...);
                      UNION BY NAME; an output name given twice; UNNEST of a STRUCT as a select
                      item; LATERAL VIEW) and DISTINCT ON (one row per value, of whichever unit);
                      subqueries of any clause (GROUP BY, HAVING, ORDER BY, LIMIT, ...) reading
                      protected tables, over public rows too

`check_select` returns the relation (with the unit carried) and what it holds. Every refusal
quotes the offending clause and says why it would break the guarantee.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace

import sqlglot
from sqlglot import exp

from ..errors import InvalidQueryError, UnsupportedError
from ..sql_scopes import table_reads
from . import sample as row_sample
from . import unit_keys
from .syntax import quote


@dataclass(frozen=True)
class TableInfo:
    """A registered table: its columns and its privacy-unit column (None: a public table)."""

    name: str
    columns: tuple[str, ...]
    unit: str | None


@dataclass
class Relation:
    """A relation in a FROM clause: how to reference it, its columns (in order), its unit column."""

    alias: str
    columns: dict[str, str]  # lower-case name -> name, in output order
    unit: str | None
    copies: frozenset[str] = frozenset()  # other columns holding the unit (SELECT uid AS x, uid AS y)
    composite: frozenset[str] = frozenset()  # columns holding a STRUCT or an ARRAY (cannot be a unit)
    #: public rows whose output columns DuckDB names or counts otherwise than `columns` says (a name
    #: twice, an unnamed expression, * EXCLUDE, COLUMNS(...), UNNEST of a STRUCT, BY NAME): fine as
    #: public rows, but a * over them beside protected rows would put unknown names beside the unit
    opaque: bool = False
    #: public rows some of whose output names the check cannot tell (* EXCLUDE / RENAME, COLUMNS(...), a *
    #: chosen by a pattern, an UNNEST as a whole item): a sample, which reads its rows' columns by name, is refused
    names_unknown: bool = False
    #: the names `_col<n>` the check gave unnamed select items over public rows, which DuckDB names by
    #: their text instead (written in only where the rows are sampled): a reference to one is refused
    unnamed: frozenset[str] = frozenset()
    #: columns holding the unit's value under another spelling, `(uid) AS x`, `CAST(uid AS TEXT) AS x`, a
    #: column equated to the unit by a join (unit_keys.py): grouping by one is grouping by the unit
    unit_spellings: frozenset[str] = frozenset()

    def has(self, column: str) -> bool:
        return column.lower() in self.columns

    def is_unit(self, name: str) -> bool:
        return self.unit is not None and (self.unit.lower() == name.lower() or name.lower() in self.copies)


def _unknown_column(name: str, known: list[str]) -> str:
    """An unknown column and its likely fix: the known column closest to it when there is one (a typo:
    difflib's ratio of at least 0.75, case aside, e.g. one letter dropped, added, changed or swapped in
    a name of five letters or more), else the other way a column is unknown here: a subquery that
    refers to the query around it."""
    available = f"(available: {', '.join(known) or 'none'})"
    by_lower = {c.lower(): c for c in known}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
    if close:
        return f"unknown column {name!r}: did you mean {by_lower[close[0]]!r}? {available}"
    return f"unknown column {name!r} {available}; a subquery may not refer to the columns of the query around it"


@dataclass
class Scope:
    """The relations a SELECT can see, the columns merged by USING joins, and the expression of
    the unit of each joined row (None while only public relations are joined)."""

    relations: list[Relation] = field(default_factory=list)
    merged: dict[str, str] = field(default_factory=dict)  # USING columns: lower name -> name
    unit_expr: exp.Expression | None = None
    unit_name: str | None = None
    #: relations whose unit column equals the joined row's unit on every row (inner-joined on the
    #: unit, or the kept side of an outer join); the other side of an outer join may hold NULL
    unit_aliases: set[str] = field(default_factory=set)
    #: pairs of column keys (unit_keys.py) that a join condition, USING, NATURAL or WHERE equates
    equalities: list[tuple[tuple[str, str], tuple[str, str]]] = field(default_factory=list)

    @property
    def protected(self) -> bool:
        return self.unit_expr is not None

    def key_of(self, col: exp.Column) -> tuple[str, str]:
        """(relation alias, column), lower case; ("", column) for a USING-merged column."""
        rel, name = self.resolve(col)
        return ("" if rel is None else rel.alias.lower(), name.lower())

    def note_equalities(self, condition: exp.Expression | None) -> None:
        """Record the columns the AND-ed `a = b` terms of a join condition or a WHERE equate."""
        for a, b in unit_keys.column_equalities(condition):
            try:
                self.equalities.append((self.key_of(a), self.key_of(b)))
            except InvalidQueryError:  # an unknown or ambiguous name: the checks of the condition report it
                continue

    def unit_columns(self) -> set[tuple[str, str]]:
        """Every column that holds the unit's value on its rows: unit columns, their copies and other
        spellings, the column OPTIONS (privacy_unit_column) names, and what the equalities tie to them."""
        seeds = {(r.alias.lower(), c) for r in self.relations for c in r.columns
                 if r.is_unit(c) or c in r.unit_spellings}
        named = self.unit_expr
        if isinstance(named, exp.Column):
            seeds.add((named.table.lower(), named.name.lower()))
        seeds |= {("", c) for c in self.merged if any(r.is_unit(c) or c in r.unit_spellings for r in self.relations)}
        return unit_keys.closure(seeds, self.equalities)

    def spells_unit(self, expr: exp.Expression) -> bool:
        """The expression is the unit's value itself, once parentheses, aliases and casts are off."""
        col = unit_keys.bare(expr)
        if not isinstance(col, exp.Column) or isinstance(col.this, exp.Star) or not self.relations:
            return False
        return self.is_unit(col) or self.key_of(col) in self.unit_columns()

    def resolve(self, col: exp.Column) -> tuple[Relation | None, str]:
        """The relation a column reference belongs to (None for a USING-merged column)."""
        name = col.name
        if col.table:
            rel = next((r for r in self.relations if r.alias.lower() == col.table.lower()), None)
            if rel is None:
                raise InvalidQueryError(f"unknown table or alias {col.table!r} in {quote(col)!r} (a subquery may not "
                                        "refer to the columns of the query around it)")
            if not rel.has(name):
                raise InvalidQueryError(f"unknown column {name!r} in {rel.alias!r} (columns: {', '.join(rel.columns.values())})")
            _refuse_unnamed(rel, name)
            return rel, rel.columns[name.lower()]
        if name.lower() in self.merged:
            return None, self.merged[name.lower()]
        owners = [r for r in self.relations if r.has(name)]
        if not owners:
            known = sorted({c for r in self.relations for c in r.columns.values()})
            raise InvalidQueryError(_unknown_column(name, known))
        if len(owners) > 1:
            raise InvalidQueryError(f"column {name!r} is ambiguous: qualify it with one of {[r.alias for r in owners]}")
        _refuse_unnamed(owners[0], name)
        return owners[0], owners[0].columns[name.lower()]

    def carries_unit(self, col: exp.Column) -> bool:
        """The column is the unit of every joined row (not only a unit column of some relation)."""
        rel, name = self.resolve(col)
        if rel is None:  # a USING column: the kept side's value, both sides' after a FULL join
            return self.is_unit(col) and not isinstance(self.unit_expr, exp.Coalesce)
        return rel.is_unit(name) and rel.alias.lower() in self.unit_aliases

    def is_unit(self, col: exp.Column) -> bool:
        """A unit column of a joined relation, or the column OPTIONS (privacy_unit_column = ...) names
        over public relations (the scope's unit expression itself)."""
        rel, name = self.resolve(col)
        if rel is None:
            return any(r.is_unit(name) for r in self.relations)
        named = self.unit_expr
        return rel.is_unit(name) or (isinstance(named, exp.Column) and named.name.lower() == name.lower()
                                     and named.table.lower() == rel.alias.lower())


def _refuse_unnamed(rel: Relation, name: str) -> None:
    if name.lower() in rel.unnamed:
        raise InvalidQueryError(f"column {name!r} of {rel.alias or 'a subquery'!r} is an unnamed expression (the check "
                                "lists it by its place), which DuckDB names by its text: name it with AS in that "
                                "subquery and use that name")


def _arg(node: exp.Expression, name: str):
    """sqlglot names some args with a trailing underscore (from_, with_): accept both."""
    return node.args.get(name + "_", node.args.get(name))


def is_dp_call(node: exp.Expression) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.name).upper().startswith(("ANON_", "__DP_"))


def is_subquery(node: exp.Expression) -> bool:
    return isinstance(node, (exp.Subquery, exp.Exists, exp.Query))


SET_OPERATIONS = (exp.Union, exp.Intersect, exp.Except)
#: meta key of an unnamed select item over public rows: the name `_col<n>` the checker gave it
CHECKER_NAME = "dp_checker_name"

_KNOWN_FUNCTIONS: set[str] | None = None


def known_function(name: str) -> bool:
    """A function sqlglot knows in the DuckDB or the BigQuery dialect (an unknown one is refused)."""
    global _KNOWN_FUNCTIONS
    if _KNOWN_FUNCTIONS is None:
        from sqlglot.dialects.bigquery import BigQuery
        from sqlglot.dialects.duckdb import DuckDB

        _KNOWN_FUNCTIONS = {n.upper() for n in DuckDB.Parser.FUNCTIONS} | {n.upper() for n in BigQuery.Parser.FUNCTIONS}
        _KNOWN_FUNCTIONS |= {n.upper() for n in sqlglot.parser.Parser.FUNCTIONS}
    return str(name).upper() in _KNOWN_FUNCTIONS


def check_functions(expr: exp.Expression | None, where: str) -> None:
    """Refuse calls of functions that neither dialect knows (no DuckDB or BigQuery function)."""
    if expr is None:
        return
    for node in expr.walk():
        if (isinstance(node, exp.Anonymous) and not is_dp_call(node) and not known_function(node.name)
                and str(node.name).lower() != row_sample.PLACEHOLDER):
            raise InvalidQueryError(f"{where}: unknown function {str(node.name)!r} in {quote(node)[:80]!r}")


def outside_cte_reads(node: exp.Expression, names) -> list[exp.Table]:
    """The unqualified reads in `node` of the CTE names `names` (lower case) where no WITH inside `node`
    defines them (sql_scopes.table_reads: DuckDB reads a table or a file of that name there)."""
    return [t for t, cte in table_reads(node) if cte is None and t.name.lower() in names]


def _and_terms(condition: exp.Expression) -> list[exp.Expression]:
    """The AND-ed terms of a condition, through parentheses: (a AND (b AND c)) -> [a, b, c]."""
    while isinstance(condition, exp.Paren):
        condition = condition.this
    if isinstance(condition, exp.And):
        return _and_terms(condition.this) + _and_terms(condition.expression)
    return [condition]


#: what a parenthesized query may hold and still be a FROM item without the parentheses around it
STANDS_IN_FROM = ("this", "alias", "joins", "sample")


def _flatten_parenthesized_join(node: exp.Expression) -> tuple[exp.Expression, list[exp.Join]]:
    """A parenthesized join first in FROM, `(a JOIN b ON ...) JOIN c`, read as `a JOIN b ON ... JOIN c`
    (the same rows: the leftmost join is evaluated first either way). Returns the first relation
    and the joins inside the parentheses, in order (the first relation a copy without them); any
    other node is returned as it is. The joins may hang on the first relation itself (a table or
    an aliased subquery) or on a parenthesized subquery around it, at any depth. Parentheses around
    a query with clauses of its own, `((WITH d AS (...) (SELECT ...) LIMIT 5) JOIN c)`, are kept: without
    them its WITH and LIMIT would be left in the FROM, where the check did not read the WITH and the
    engine cannot parse either (until 2026-11-25)."""
    joins = list(node.args.get("joins") or [])
    if joins:
        base = node.copy()
        base.set("joins", None)
        inner, inner_joins = _flatten_parenthesized_join(base)
        return inner, inner_joins + joins
    child = node.this
    if (isinstance(node, exp.Subquery) and not node.alias and node.args.get("sample") is None
            and (isinstance(child, exp.Table) or (isinstance(child, exp.Subquery)
                                                  and all(k in STANDS_IN_FROM for k, v in child.args.items() if v)))):
        return _flatten_parenthesized_join(child)
    return node, []


def _nested_join(node: exp.Expression) -> bool:
    """The relation holds a join of its own (`(b JOIN c ON ...)`, possibly in more parentheses)."""
    while True:
        if node.args.get("joins"):
            return True
        if not (isinstance(node, exp.Subquery) and isinstance(node.this, (exp.Table, exp.Subquery))):
            return False
        node = node.this


#: clauses sqlglot may hang on a FROM item or a parenthesized query itself, outside the SELECT it
#: wraps: `((SELECT * FROM t) LIMIT 3)`, `t PIVOT (...)`, time travel; over protected rows each one
#: keeps or mixes rows depending on other units' rows (or reads other rows than the registered table)
#: and is not checked by the SELECT's rules, so it is refused
OUTSIDE_CLAUSES = ("limit", "offset", "order", "where", "group", "having", "qualify", "windows", "prewhere",
                   "distribute", "sort", "cluster", "pivots", "laterals", "match", "connect", "settings", "version",
                   "system_time", "when", "changes", "rows_from", "partition", "locks", "for_")


def check_outside_clauses(node: exp.Expression, rel: Relation, where: str) -> None:
    """Refuse clauses attached to a FROM item or a parenthesized query over protected rows
    (OUTSIDE_CLAUSES); public rows may have them (public data)."""
    found = [k for k in OUTSIDE_CLAUSES if node.args.get(k)]
    if found and rel.unit is not None:
        shown = {"pivots": "PIVOT", "laterals": "LATERAL", "system_time": "FOR SYSTEM_TIME", "for_": "FOR",
                 "version": "a table version", "windows": "WINDOW"}
        names = ", ".join(shown.get(k, k.upper()) for k in found)
        raise InvalidQueryError(f"{where}: {quote(node)[:80]!r}: {names} applied to protected rows outside their "
                                "SELECT keeps or mixes rows depending on other units' rows: not allowed (write the "
                                "query without it, or put it inside a SELECT where the rules check it)")


#: the clauses of a SELECT over protected rows that check_select reads (each checked or refused there)
CHECKED_SELECT_CLAUSES = ("expressions", "from", "joins", "where", "group", "having", "with", "distinct", "laterals",
                          "pivots", "connect", "match", "windows", "kind", "hint", "order", "limit", "offset", "qualify")
#: where a query's rows are read as rows (not as one value): a STRUCT per row there is one column
ROW_SOURCES = (exp.From, exp.Join, exp.CTE, exp.In, exp.Union, exp.Intersect, exp.Except, exp.Lateral)


def refuse_struct_rows(select: exp.Select, where: str) -> None:
    """`SELECT AS STRUCT` read as rows (in FROM, a CTE, a set operation, IN): DuckDB computes it as one
    STRUCT column, not the columns the check lists, so the unit and the names it reads are not there
    (a raw binder error until 2026-11-29). As one value (a scalar subquery in a SELECT list) it is allowed."""
    if str(select.args.get("kind") or "").upper() != "STRUCT":
        return
    node = select.parent
    while isinstance(node, exp.Subquery):
        node = node.parent
    if isinstance(node, ROW_SOURCES):
        raise InvalidQueryError(f"{where}: SELECT AS STRUCT read as rows is one STRUCT column per row, not the columns "
                                "it lists: not allowed here (select the columns without AS STRUCT, or use it as one "
                                "value in a SELECT list)")


#: the * modifiers the check follows itself (refused over protected rows, opaque over public ones)
STAR_MODIFIERS = ("except", "except_", "replace", "rename")


def star_pattern(item: exp.Expression) -> exp.Expression | None:
    """A * in a select item whose columns DuckDB chooses by a pattern or expands inside an expression
    (`* ILIKE 'u%'`, `* LIKE`, `* NOT LIKE`, `* GLOB`, `* SIMILAR TO`, `t.* LIKE ...`), or None. The
    check cannot tell which columns it yields nor under which names; COUNT(*) is a count, not a *."""
    for node in item.walk(prune=lambda n: is_subquery(n)):
        if not isinstance(node, exp.Star):
            continue
        holder = node.parent if isinstance(node.parent, exp.Column) else node
        whole = holder is item or (isinstance(item, exp.Alias) and holder is item.this)
        modified = any(value for key, value in node.args.items() if key not in STAR_MODIFIERS)
        if modified or not (whole or isinstance(holder.parent, exp.Count)):
            return holder.parent if not whole and holder.parent is not None else holder
    return None


def write_checker_names(query: exp.Expression) -> set[str]:
    """Name each unnamed select item over public rows `_col<n>`, as the check listed it (CHECKER_NAME),
    in rows a sample reads by name: DuckDB would name it by its text, `(dept + 1)`. A set operation's
    columns are named by its first branch. Returns the names written (lower case)."""
    written: set[str] = set()
    first = query
    while isinstance(first, exp.Subquery) or (isinstance(first, SET_OPERATIONS) and not first.args.get("by_name")):
        first = first.this
    if isinstance(first, exp.Select):
        for e in first.expressions:
            if CHECKER_NAME in e.meta and not isinstance(e, exp.Alias):
                e.replace(exp.alias_(e.copy(), e.meta[CHECKER_NAME], quoted=True))
                written.add(e.meta[CHECKER_NAME].lower())
    return written


def check_column_list(node: exp.Expression, rel: Relation, where: str) -> Relation:
    """Refuse a column list after the name of protected rows (`AS v(a, b)`, `WITH v(a, b) AS (...)`): it
    renames their columns by position, which the checks here do not follow (they would take another
    column for the privacy unit); public rows may have one, and their relation is returned renamed
    as DuckDB renames it (the first columns, by position)."""
    alias = node.args.get("alias")
    if isinstance(alias, exp.TableAlias) and alias.columns and rel.unit is not None:
        raise InvalidQueryError(f"{where}: the column list of {quote(alias)!r} renames columns of protected rows by "
                                "position, which the ownership check does not follow: not allowed (name the columns in "
                                "the SELECT list with AS instead)")
    if isinstance(alias, exp.TableAlias) and alias.columns:
        names = [c.name for c in alias.columns] + list(rel.columns.values())[len(alias.columns):]
        columns = {n.lower(): n for n in names}
        return replace(rel, columns=columns, composite=frozenset(),
                       opaque=rel.opaque or len(columns) != len(names) or len(alias.columns) > len(rel.columns),
                       unnamed=frozenset(n.lower() for n in names[len(alias.columns):]) & rel.unnamed)
    return rel


class OwnershipChecker:
    """Checks FROM clauses against the catalog of registered tables and CTEs."""

    def __init__(self, catalog: dict[str, TableInfo]):
        self.catalog = {k.lower(): v for k, v in catalog.items()}
        self.ctes: dict[str, Relation] = {}
        self.released: set[str] = set()  # CTEs that hold DP results (not readable inside a DP SELECT)
        self.samples = 0  # TABLESAMPLE clauses rewritten so far (each its own sample: sample.py)

    # -- conditions ------------------------------------------------------------------------
    def check_condition(self, expr: exp.Expression | None, scope: Scope, where: str) -> None:
        """A row-level condition or expression: columns of the scope; no aggregate or window;
        subqueries only over public tables and uncorrelated."""
        if expr is None:
            return
        check_functions(expr, where)
        for node in expr.walk(prune=lambda n: n is not expr and is_subquery(n)):
            if node is not expr and is_subquery(node):
                self.public_subquery(node, where)
                continue
            if isinstance(node, exp.Window):
                raise InvalidQueryError(f"{where}: {quote(node)!r} is a window function: it mixes rows of different units")
            if isinstance(node, exp.AggFunc) or is_dp_call(node):
                raise InvalidQueryError(f"{where}: {quote(node)!r} is an aggregate, which is not allowed here")
            if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
                scope.resolve(node)

    def clause_subqueries(self, node: exp.Expression, checked: tuple[str, ...], where: str) -> None:
        """The subqueries in the clauses of `node` other than `checked` (GROUP BY, HAVING, ORDER BY, LIMIT,
        QUALIFY, ... of a SELECT, a set operation or a parenthesized query): public tables only,
        uncorrelated, as in a condition; over public rows too, whose rows they would otherwise decide
        (`(SELECT k FROM pub GROUP BY k HAVING k IN (SELECT cost FROM t WHERE uid = 3))` listed one
        unit's raw values as public rows, until 2026-11-25)."""
        for key, value in node.args.items():
            if key.rstrip("_") in checked or not value:
                continue
            for part in value if isinstance(value, list) else [value]:
                if not isinstance(part, exp.Expression):
                    continue
                for sub in part.walk(prune=lambda n: n is not part and is_subquery(n)):
                    if is_subquery(sub):
                        self.public_subquery(sub, f"{where} {key.upper().rstrip('_')}")

    def public_subquery(self, node: exp.Expression, where: str) -> Relation:
        """A subquery in a condition: it must read public tables only (no unit), uncorrelated."""
        query = node.this if isinstance(node, (exp.Subquery, exp.Exists)) else node
        if not isinstance(query, exp.Query):
            raise InvalidQueryError(f"{where}: {quote(node)[:80]!r} is not a query")
        text = quote(query)  # as written: the check below rewrites it (names, the unit it carries)
        rel = self.query(query, f"{where}: subquery {text[:60]!r}")
        if rel.unit is not None:
            raise InvalidQueryError(
                f"{where}: the subquery {text[:80]!r} reads a protected table: a condition may read "
                "public tables only (rows of other units would decide which rows count)"
            )
        return rel

    # -- FROM items ------------------------------------------------------------------------
    def from_scope(self, select: exp.Select, where: str) -> Scope:
        """The scope of a SELECT's FROM and JOINs, checking each join."""
        source = _arg(select, "from")
        scope = Scope()
        if source is None:
            return scope
        base, nested_joins = _flatten_parenthesized_join(source.this)
        if nested_joins:  # rewritten in place, so that what is checked is what runs
            source.set("this", base)
            select.set("joins", nested_joins + list(select.args.get("joins") or []))
        first = self.relation(source.this, where)
        scope.relations.append(first)
        if first.unit is not None:
            scope.unit_expr = exp.column(first.columns.get(first.unit.lower(), first.unit), table=first.alias, quoted=True)
            scope.unit_name = first.unit
            scope.unit_aliases = {first.alias.lower()}
        for at, join in enumerate(list(select.args.get("joins") or [])):
            self.join(join, scope, where)
            mark = unit_keys.PUBLIC_GROUPS
            written = join.this.meta.get(mark) or (at == 0 and source.this.meta.get(mark))
            if written:  # the join of a public-groups subquery (public_groups.prepare)
                unit_keys.refuse_unit_join(join, scope, written)
        return scope

    def public_tables_in(self, tree: exp.Expression) -> tuple[str, ...]:
        """The registered public tables (no unit) a checked query reads, by their catalog names."""
        return tuple(sorted(i.name for i in self.tables_in(tree) if i.unit is None))

    def tables_in(self, tree: exp.Expression) -> list[TableInfo]:
        """The registered tables a checked query reads (CTE names are not tables)."""
        found = {}
        for node in tree.find_all(exp.Table):
            if isinstance(node.this, exp.Identifier):
                info = self.table_info(node)
                if info is not None and (node.args.get("db") or node.name.lower() not in self.ctes):
                    found[info.name] = info
        return list(found.values())

    def table_info(self, node: exp.Table) -> TableInfo | None:
        parts = [p for p in (node.args.get("catalog"), node.args.get("db"), node.this) if p is not None]
        full = ".".join(p.name for p in parts).lower()
        return self.catalog.get(full) or self.catalog.get(node.name.lower())

    def relation(self, node: exp.Expression, where: str) -> Relation:
        """The relation of one FROM item; a TABLESAMPLE on it becomes its per-row sample (sample.py)."""
        if _nested_join(node):  # its joins would be read without being checked
            raise UnsupportedError(
                f"{where}: {quote(node)[:80]!r}: a parenthesized join after another relation, a JOIN (b JOIN c ON ...), "
                "is not supported: write the joins one after another (a JOIN b ON ... JOIN c ON ...)")
        rel = self._relation(node, where)
        check_outside_clauses(node, rel, where)
        self.clause_subqueries(node, ("this", "alias", "joins", "sample", "with"), where)
        named = check_column_list(node, rel, where)
        if node.args.get("sample") is not None and self._sample(node, rel, where):  # inside a column list: the rows' own names
            named = replace(named, unnamed=frozenset())  # written in by the sample (write_checker_names)
        return named

    def _sample(self, node: exp.Expression, rel: Relation, where: str) -> bool:
        """Rewrite `node TABLESAMPLE BERNOULLI / SYSTEM (p PERCENT)` in place as the subquery of its
        per-row sample (the same alias, column list and columns); refuse the other samples. `rel`:
        the rows' columns under their own names (a column list renames them after the sample).
        Returns whether it was rewritten (not at 100 PERCENT): its unnamed items then carry the
        check's names."""
        fraction = row_sample.sample_fraction(node.args["sample"], where)
        if rel.names_unknown:
            raise UnsupportedError(
                f"{where}: {quote(node)[:80]!r}: TABLESAMPLE reads each row's columns by name, and DuckDB names some "
                "of these (* EXCLUDE / RENAME, COLUMNS(...), * LIKE / ILIKE / GLOB, an UNNEST as a whole item) "
                "otherwise than the check can tell: not supported (select the columns by name, with AS, in that "
                "subquery)")
        node.set("sample", None)
        if fraction >= 1:
            return False  # 100 PERCENT: every row
        if node.parent is None:  # a copy: the rewrite would be lost (not expected: the FROM is flattened in place)
            raise UnsupportedError(f"{where}: TABLESAMPLE is not supported here: sample the table in a subquery, "
                                   "(SELECT * FROM t TABLESAMPLE BERNOULLI (p PERCENT))")
        written = write_checker_names(node.this) if isinstance(node, exp.Subquery) else set()
        if rel.unnamed - written:  # a CTE's or a BY NAME branch's: their text is not rewritten here
            raise UnsupportedError(
                f"{where}: {quote(node)[:80]!r}: TABLESAMPLE reads each row's columns by name, and "
                f"{', '.join(sorted(rel.unnamed - written))} is an unnamed expression, which DuckDB names by its "
                "text: not supported (name it with AS where it is computed)")
        self.samples += 1
        columns = list(rel.columns.values())
        if isinstance(node, exp.Table):
            inner = node.copy()
            inner.set("alias", None)
            listed = node.args.get("alias").columns if isinstance(node.args.get("alias"), exp.TableAlias) else []
            node.replace(exp.Subquery(this=row_sample.sampled_select(inner, columns, fraction, self.samples),
                                      alias=exp.TableAlias(this=exp.to_identifier(rel.alias),
                                                           columns=[c.copy() for c in listed])))
        else:
            node.set("this", row_sample.sampled_select(node.this, columns, fraction, self.samples))
        return True

    def _relation(self, node: exp.Expression, where: str) -> Relation:
        if isinstance(node, exp.Table):
            name = node.name
            alias = node.alias_or_name
            if not isinstance(node.this, exp.Identifier):
                raise InvalidQueryError(f"{where}: {quote(node)[:80]!r} cannot be used in FROM (use a table, a CTE or a subquery)")
            if not node.args.get("db") and name.lower() in self.released:
                raise InvalidQueryError(
                    f"{where}: {name!r} holds DP results; a DP SELECT reads rows of protected or public tables, "
                    "not other DP results (use them in the outer query instead)"
                )
            if not node.args.get("db") and name.lower() in self.ctes:
                rel = self.ctes[name.lower()]
                return replace(rel, alias=alias, columns=dict(rel.columns))  # the CTE under this name
            info = self.table_info(node)
            if info is None:
                known = ", ".join(sorted(t.name for t in self.catalog.values()))
                raise InvalidQueryError(f"unknown table {name!r} (registered: {known or 'none'})")
            if node.args.get("db"):  # the engine registers tables by their catalog name (as the outer query reads them)
                node.set("db", None)
                node.set("catalog", None)
                node.set("this", exp.to_identifier(info.name, quoted=True))
                if not node.alias:  # `people.dept` keeps naming its columns
                    node.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
            return Relation(alias, {c.lower(): c for c in info.columns}, info.unit)
        if isinstance(node, exp.Subquery):
            inner = node.this
            if not isinstance(inner, exp.Query):
                raise InvalidQueryError(f"{where}: {quote(node)[:80]!r} cannot be used in FROM")
            rel = self.query(inner, f"subquery {quote(inner)[:60]!r}")
            alias = node.alias_or_name or f"_sub{len(self.ctes)}_{id(node) % 10_000}"
            if not node.alias:
                node.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
            return replace(rel, alias=alias)
        raise InvalidQueryError(f"{where}: {quote(node)[:80]!r} cannot be used in FROM (use a table, a CTE or a subquery)")

    def join(self, join: exp.Join, scope: Scope, where: str) -> None:
        text = quote(join)  # as written: checking the joined relation rewrites it (a sample, the unit it carries)
        right = self.relation(join.this, where)
        if right.alias.lower() in {r.alias.lower() for r in scope.relations}:
            raise InvalidQueryError(
                f"{where}: {text!r}: the name {right.alias!r} is given to two relations of one FROM clause, so a column "
                "qualified by it could be either one's: not allowed (give each table or subquery its own alias with AS)")
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        natural = (join.args.get("method") or "").upper() == "NATURAL"
        on, using = join.args.get("on"), join.args.get("using")
        if kind in ("SEMI", "ANTI", "ASOF", "POSITIONAL") or (join.args.get("method") or "").upper() not in ("", "NATURAL"):
            raise InvalidQueryError(f"{where}: {text!r}: {kind or join.args.get('method')} joins are not supported")
        inner = Scope(scope.relations + [right], dict(scope.merged))
        if on is not None:
            self.check_condition(on, inner, f"{where} ON")
            inner.note_equalities(on)
            scope.equalities += inner.equalities
        using_names = [u.name.lower() for u in using] if using else []
        for u in using or []:
            if not right.has(u.name) or not any(r.has(u.name) for r in scope.relations):
                raise InvalidQueryError(f"{where}: USING column {u.name!r} is not in both joined relations")
        left_protected, right_protected = scope.protected, right.unit is not None
        if natural:
            using_names = [c for c in right.columns if any(r.has(c) for r in scope.relations)]
        if left_protected and right_protected:
            cross = kind == "CROSS" or (on is None and not using_names)
            if cross:
                raise InvalidQueryError(
                    f"{where}: {text!r} is a cross or comma join of two protected tables: it pairs rows of different "
                    "units. Join on the unit: USING (unit) or ON a.unit = b.unit"
                )
            if using_names:
                units = {r.unit.lower() for r in scope.relations if r.unit} | {right.unit.lower()}
                ok = len(units) == 1 and right.unit.lower() in using_names
                if not ok:
                    raise InvalidQueryError(
                        f"{where}: {text!r} does not join on the unit: {'NATURAL' if natural else 'USING'} must "
                        f"include the unit column of both sides ({', '.join(sorted(units))})"
                    )
            else:
                terms = _and_terms(on)
                if not any(self._unit_equality(t, inner, right) for t in terms):
                    raise InvalidQueryError(
                        f"{where}: {text!r} does not join on the unit: ON must include {right.alias}.{right.unit} = "
                        "<other side>.<its unit> (both sides unit columns) as one of its AND-ed terms; without it "
                        "rows of different units would be paired"
                    )
            right_unit = exp.column(right.columns.get(right.unit.lower(), right.unit), table=right.alias, quoted=True)
            if side == "RIGHT":
                scope.unit_expr = right_unit
                scope.unit_aliases = {right.alias.lower()}
            elif side == "FULL":
                scope.unit_expr = exp.Coalesce(this=scope.unit_expr, expressions=[right_unit])
                scope.unit_aliases = set()
            elif side != "LEFT":
                scope.unit_aliases.add(right.alias.lower())
        elif left_protected or right_protected:
            # a protected table with a public one: any condition, but an outer join must keep only
            # protected rows (rows it would keep from the public side have no unit)
            if side == "FULL":
                raise InvalidQueryError(f"{where}: {text!r}: both tables in a FULL OUTER join must contain user data "
                                        "(protected tables); the public side's rows would have no unit")
            if side == "LEFT" and not left_protected:
                raise InvalidQueryError(f"{where}: {text!r}: the left table in a LEFT OUTER join must contain user data "
                                        "(a protected table); swap the sides or use an inner join")
            if side == "RIGHT" and not right_protected:
                raise InvalidQueryError(f"{where}: {text!r}: the right table in a RIGHT OUTER join must contain user "
                                        "data (a protected table); swap the sides or use an inner join")
            if right_protected:  # public rows joined to protected ones: the protected side's unit
                scope.unit_expr = exp.column(right.columns.get(right.unit.lower(), right.unit), table=right.alias,
                                             quoted=True)
                scope.unit_name = right.unit
                scope.unit_aliases = {right.alias.lower()}
        for name in using_names:
            original = right.columns.get(name, name)
            scope.merged[name] = original
            scope.equalities += [(("", name.lower()), (r.alias.lower(), name.lower()))
                                 for r in scope.relations + [right] if r.has(name)]
        scope.relations.append(right)

    @staticmethod
    def _unit_equality(term: exp.Expression, scope: Scope, right: Relation) -> bool:
        """`a.unit = b.unit`: both sides unit columns, one of them of the relation joined now."""
        if not isinstance(term, exp.EQ):
            return False
        a, b = term.this, term.expression
        if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
            return False
        (ra, _), (rb, _) = scope.resolve(a), scope.resolve(b)
        if not (scope.is_unit(a) and scope.is_unit(b)):
            return False
        return (ra is right) != (rb is right)  # one side is the new relation, the other already joined

    # -- queries inside FROM ---------------------------------------------------------------
    def query(self, node: exp.Query, where: str) -> Relation:
        """A query inside FROM, a CTE or a condition: a SELECT or a set operation (with its own
        WITH clause, whose CTEs it alone sees)."""
        if _arg(node, "with") is not None:
            saved = self.enter_with(_arg(node, "with"), where)
            try:
                return self._query(node, where)
            finally:
                self.ctes = saved
        return self._query(node, where)

    def enter_with(self, with_clause: exp.With, where: str) -> dict[str, Relation]:
        """Check the CTEs of a WITH clause inside the statement (each body in turn, seeing the ones
        before it) and make them visible; returns the CTEs visible before, to restore after."""
        if with_clause.args.get("recursive"):
            raise InvalidQueryError(f"{where}: WITH RECURSIVE is not allowed here (a recursive CTE can mix units' rows)")
        saved = dict(self.ctes)
        for cte in with_clause.expressions:
            if not cte.alias:
                raise InvalidQueryError(f"{where}: a CTE needs a name: {quote(cte)[:60]!r}")
            rel = self.query(cte.this, f"{where}: CTE {cte.alias!r}")
            rel = check_column_list(cte, rel, f"{where}: CTE {cte.alias!r}")
            self.ctes[cte.alias.lower()] = rel
        return saved

    def _query(self, node: exp.Query, where: str) -> Relation:
        if isinstance(node, exp.Select):
            return self.check_select(node, where)
        if isinstance(node, exp.Subquery):
            rel = self.query(node.this, where)
            check_outside_clauses(node, rel, where)
            self.clause_subqueries(node, ("this", "alias", "joins", "sample", "with"), where)
            return check_column_list(node, rel, where)
        if isinstance(node, SET_OPERATIONS):
            return self.set_operation(node, where)
        raise InvalidQueryError(f"{where}: {quote(node)[:80]!r} is not supported here")

    def set_operation(self, node: exp.Expression, where: str) -> Relation:
        """UNION / INTERSECT / EXCEPT: all branches public, or all protected with the unit at the
        same position (so each output row still carries its unit)."""
        name = type(node).__name__.upper()
        left = self.query(node.this, f"{where} ({name} branch)")
        right = self.query(node.expression, f"{where} ({name} branch)")
        self.clause_subqueries(node, ("this", "expression", "with"), where)
        if (left.unit is None) != (right.unit is None):
            raise InvalidQueryError(
                f"{where}: {name} mixes rows of a protected table with rows of a public one: the public rows "
                "would have no privacy unit"
            )
        if node.args.get("by_name") and left.unit is not None:
            raise InvalidQueryError(f"{where}: {name} BY NAME over protected rows pairs the branches' columns by "
                                    "name, which the ownership check does not follow (it pairs them by position): not "
                                    "allowed (select the same columns in the same order in every branch, without BY "
                                    "NAME)")
        if len(left.columns) != len(right.columns):
            raise InvalidQueryError(f"{where}: the branches of {name} have {len(left.columns)} and {len(right.columns)} columns")
        if left.unit is not None:
            at_left = list(left.columns).index(left.unit.lower())
            at_right = list(right.columns).index(right.unit.lower())
            if at_left != at_right:
                raise InvalidQueryError(
                    f"{where}: {name} pairs the privacy unit of one branch with another column of the other "
                    "(select the unit at the same position in every branch, or leave it out of all of them)"
                )
            for clause in ("order", "limit", "offset"):
                if node.args.get(clause) is not None:
                    raise InvalidQueryError(f"{where}: {clause.upper()} over protected rows keeps rows depending on other units' rows")
        spelled = set()  # a column holding the unit's value in either branch holds it in some rows of the result
        if left.unit is not None:
            for a, b in zip(left.columns, right.columns):
                if a in left.copies | left.unit_spellings or b in right.copies | right.unit_spellings:
                    spelled.add(a)
        return Relation("", dict(left.columns), left.unit,
                        opaque=left.opaque or right.opaque or bool(node.args.get("by_name")),
                        names_unknown=left.names_unknown, unnamed=left.unnamed,  # BY NAME: the first branch's names lead
                        unit_spellings=frozenset(spelled - {(left.unit or "").lower()}))

    def check_select(self, select: exp.Select, where: str) -> Relation:
        """A SELECT inside FROM (or a CTE or a condition): checked, and rewritten to carry the unit."""
        if _arg(select, "from") is None:  # SELECT "a", "b": without FROM there is no column to name, so
            for col in list(select.find_all(exp.Column)):  # a quoted name is BigQuery's string
                if (not col.table and isinstance(col.this, exp.Identifier) and col.this.args.get("quoted")
                        and col.find_ancestor(exp.Select) is select):  # not one of a nested subquery
                    col.replace(exp.Literal.string(col.name))
        scope = self.from_scope(select, where)
        if select.args.get("laterals"):
            raise InvalidQueryError(
                f"{where}: {quote(select.args['laterals'][0])[:80]!r}: LATERAL VIEW adds columns and rows that the "
                "ownership check does not see (its expressions could read any table, and name columns like the "
                "privacy unit): not allowed (unnest a list in the SELECT list instead: CAST(UNNEST(x) AS <type>) AS name)")
        self.check_condition(select.args.get("where"), scope, f"{where} WHERE")
        if select.args.get("where") is not None:
            scope.note_equalities(select.args["where"].this)
        refuse_struct_rows(select, where)
        for e in select.expressions:
            check_functions(e, where)
            for node in e.walk(prune=lambda n: is_subquery(n)):
                if is_dp_call(node):
                    raise InvalidQueryError(f"{where}: {quote(node)!r}: DP aggregates belong to a DP SELECT list only")
                if is_subquery(node) and node is not e:
                    self.public_subquery(node, f"{where} SELECT list")
        if not scope.protected:
            self.clause_subqueries(select, ("from", "joins", "with", "where", "expressions"), where)
            return self._project(select, scope, where)
        for clause in ("order", "limit", "offset", "qualify"):
            if select.args.get(clause) is not None:
                raise InvalidQueryError(
                    f"{where}: {clause.upper()} inside a subquery over protected rows keeps rows depending on other "
                    "units' rows" + (": not allowed (filter rows with WHERE instead)" if clause == "qualify" else "")
                )
        distinct = select.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:  # one row per value, of any unit
            raise InvalidQueryError(f"{where}: DISTINCT ON inside a subquery over protected rows keeps rows depending "
                                    "on other units' rows")
        for clause in ("pivots", "connect", "match"):
            if select.args.get(clause):
                raise InvalidQueryError(f"{where}: {clause.upper().rstrip('S')} over protected rows mixes rows of "
                                        "different units: not allowed")
        for node in select.walk(prune=lambda n: n is not select and is_subquery(n)):
            if isinstance(node, exp.Window):
                raise InvalidQueryError(f"{where}: {quote(node)!r} is a window function: it mixes rows of different units")
        unknown = [k for k, v in select.args.items() if v and k.rstrip("_") not in CHECKED_SELECT_CLAUSES]
        if unknown:  # a clause these rules do not read could keep or mix rows unseen
            raise InvalidQueryError(f"{where}: {unknown[0].upper().rstrip('_')} over protected rows is not supported "
                                    "(the ownership check does not read it): write the query without it")
        group = select.args.get("group")
        aggregated = group is not None or any(isinstance(n, exp.AggFunc) for e in select.expressions
                                              for n in e.walk(prune=lambda n: is_subquery(n)))
        if aggregated:
            keys = group.expressions if group is not None else []
            if group is not None and any(group.args.get(k) for k in ("all", "rollup", "cube", "grouping_sets", "totals")):
                raise InvalidQueryError(f"{where}: {quote(group)[:60]!r} over protected rows groups by what the "
                                        "ownership check does not read: group by the unit and named columns only")
            unit_key = next((k for k in keys if isinstance(k, exp.Column) and self._groups_by_unit(k, scope)), None)
            if unit_key is None:
                other = next((k for k in keys if isinstance(k, exp.Column) and scope.is_unit(k)), None)
                raise InvalidQueryError(
                    f"{where}: an aggregation over protected rows must group by the unit ({scope.unit_name}); "
                    "otherwise one row would mix several units"
                    + ("" if other is None else f" ({quote(other)} is the unit of a side of an outer join that may "
                       "hold no row: its NULL group would mix the other side's units; group by the kept side's unit)"))
            scope.unit_expr = unit_key.copy()  # the unit the grouped rows carry (what _project adds when omitted)
            self._refuse_ungrouped(select, keys, scope, where)
            for k in keys:
                self.check_condition(k, scope, f"{where} GROUP BY")
            having = select.args.get("having")
            if having is not None:
                for node in having.walk():
                    if is_subquery(node) and node is not having:
                        raise InvalidQueryError(f"{where} HAVING: {quote(node)!r} is not allowed")
        self.clause_subqueries(select, ("from", "joins", "with", "where", "expressions", "group", "having"), where)
        return self._project(select, scope, where)

    @staticmethod
    def _refuse_ungrouped(select: exp.Select, keys: list[exp.Expression], scope: Scope, where: str) -> None:
        """A column of an aggregating SELECT's list or HAVING outside every aggregate must be one of its
        GROUP BY keys (as DuckDB requires: `SELECT p.uid ... GROUP BY v.uid` was DuckDB's raw binder error
        until 2026-11-29); refused here in the rule's words."""
        grouped = {quote(k) for k in keys}
        resolved = set()
        for k in keys:
            if isinstance(k, exp.Column):
                rel, name = scope.resolve(k)
                resolved.add((rel.alias.lower() if rel is not None else "", name.lower()))
        having = select.args.get("having")
        for part in [*select.expressions, *([having.this] if having is not None else [])]:
            inner = part.this if isinstance(part, exp.Alias) else part
            # not entered: subqueries, aggregates, keys, and calls sqlglot does not know (DuckDB's own aggregates
            # among them: DuckDB judges those, and the last guard words its refusal)
            outside = (lambda n: is_subquery(n) or isinstance(n, (exp.AggFunc, exp.Anonymous)) or quote(n) in grouped)
            for node in inner.walk(prune=outside):
                if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star) or quote(node) in grouped:
                    continue
                rel, name = scope.resolve(node)
                merged = {n for a, n in resolved if rel is None or a == ""}  # USING columns: either side's by name
                if (rel.alias.lower() if rel is not None else "", name.lower()) not in resolved and \
                        name.lower() not in merged:
                    raise InvalidQueryError(
                        f"{where}: {quote(node)!r} is neither grouped nor aggregated in an aggregation over protected "
                        f"rows (GROUP BY {', '.join(quote(k) for k in keys)}): group by it or aggregate it")

    @staticmethod
    def _groups_by_unit(key: exp.Column, scope: Scope) -> bool:
        """The key holds the unit of every grouped row: a unit column on the kept side of the joins, or
        the USING-merged unit column (after a FULL join, the COALESCE of both sides)."""
        return scope.carries_unit(key) or (scope.resolve(key)[0] is None and scope.is_unit(key))

    @staticmethod
    def _project(select: exp.Select, scope: Scope, where: str) -> Relation:
        """Output columns of the SELECT; the unit is appended when the analyst did not select it.

        Over protected rows the names here must be DuckDB's own, since the query around reads the
        unit by its name (DuckDB takes the first column of a name) and a set operation pairs columns
        by position: a name given twice, an unnamed expression (DuckDB names `(p.uid)` uid) and an
        UNNEST of a STRUCT (one column per field) would each let another column pass for the unit.
        Unnamed expressions are named here `_col<n>` (written into the query, so that DuckDB uses the
        same name); the other two are refused. Over public rows they are allowed and the relation is
        marked opaque (a * over it beside protected rows is refused)."""
        columns: dict[str, str] = {}
        names: list[str] = []  # every output column, in order, as DuckDB lists them (duplicates too)
        unit_out = None
        copies: set[str] = set()
        composite: set[str] = set()
        opaque = names_unknown = False
        unnamed: set[str] = set()  # names given here to unnamed items over public rows (or by a * over such)
        real: set[str] = set()  # the names of the other columns
        spellings: set[str] = set()  # output columns holding the unit's value otherwise than as the unit
        unit_columns = scope.unit_columns() if scope.protected else set()
        for e in select.expressions:
            star = e if isinstance(e, exp.Star) else e.this if isinstance(e, exp.Column) else None
            if isinstance(star, exp.Star) and any(star.args.get(k) for k in STAR_MODIFIERS):
                if scope.protected:  # column sets DuckDB names by itself: another column could become the unit's
                    raise InvalidQueryError(f"{where}: {quote(e)[:80]!r}: * EXCLUDE, REPLACE or RENAME over protected "
                                            "rows changes which column holds what, which the ownership check does not "
                                            "follow: not allowed (select the columns by name instead)")
                opaque = True
                names_unknown = names_unknown or any(star.args.get(k) for k in ("except", "except_", "rename"))
            pattern = next((n for n in e.walk(prune=lambda n: is_subquery(n)) if isinstance(n, exp.Columns)), None)
            pattern = pattern if pattern is not None else star_pattern(e)
            if pattern is not None:
                if scope.protected:
                    what = "COLUMNS(...)" if isinstance(pattern, exp.Columns) else "a * chosen by a pattern (LIKE, ILIKE, GLOB, SIMILAR TO)"
                    raise InvalidQueryError(f"{where}: {quote(pattern)[:80]!r}: {what} over protected rows "
                                            "selects and names columns by pattern, which the ownership check does not "
                                            "follow: not allowed (select the columns by name instead)")
                opaque = names_unknown = True
            if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
                rels = scope.relations
                qualified = isinstance(e, exp.Column) and bool(e.table)
                if qualified:
                    rels = [r for r in scope.relations if r.alias.lower() == e.table.lower()]
                    if not rels:
                        raise InvalidQueryError(f"{where}: unknown table {e.table!r} in {quote(e)!r}")
                if not rels:
                    raise InvalidQueryError(f"{where}: SELECT * needs a FROM clause")
                seen_merged: set[str] = set()
                for r in rels:
                    if r.opaque and scope.protected:
                        raise InvalidQueryError(
                            f"{where}: {quote(e)!r} reads every column of {r.alias or 'a subquery'!r}, whose columns "
                            "DuckDB names otherwise than they are written (a name twice, an unnamed expression, "
                            "* EXCLUDE / REPLACE / RENAME, COLUMNS(...), UNNEST, BY NAME): beside protected rows one "
                            "of them could pass for the privacy unit; not allowed (select its columns by name, or "
                            "name them with AS in that subquery)")
                    opaque = opaque or r.opaque
                    names_unknown = names_unknown or r.names_unknown
                    for low, name in r.columns.items():
                        if not qualified and low in scope.merged:
                            if low in seen_merged:
                                continue  # USING columns appear once in an unqualified *
                            seen_merged.add(low)
                        names.append(name)
                        columns.setdefault(low, name)
                        (unnamed if low in r.unnamed else real).add(low)
                        if (r.alias.lower(), low) in unit_columns:
                            spellings.add(low)
                    if unit_out is None and r.unit is not None and scope.protected and (
                            scope.unit_name is None or r.is_unit(scope.unit_name)):
                        unit_out = r.unit
                continue
            inner = e.this if isinstance(e, exp.Alias) else e
            for node in inner.walk(prune=lambda n: is_subquery(n)):
                if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
                    scope.resolve(node)
            root = inner
            while isinstance(root, exp.Paren):
                root = root.this
            if quote(root).upper().startswith("UNNEST("):  # of a STRUCT: one column per field, named by it
                if scope.protected:
                    raise InvalidQueryError(
                        f"{where}: {quote(e)[:80]!r}: UNNEST as a whole select item over protected rows expands a "
                        "STRUCT into one column per field, named by the struct, which the ownership check does not "
                        "follow (a field could pass for the privacy unit): not allowed (unnest a list inside an "
                        "expression, e.g. CAST(UNNEST(x) AS <type>) AS name)")
                opaque = names_unknown = True
            invented = False
            if isinstance(e, (exp.Alias, exp.Column)):
                name = e.alias_or_name
            else:  # DuckDB names it by its text or by a column inside it: the checker's name is written in
                name = f"_col{len(names)}"
                if scope.protected:
                    e.replace(exp.alias_(e.copy(), name, quoted=True))
                else:
                    e.meta[CHECKER_NAME] = name  # written in only where its rows are sampled (write_checker_names)
                    unnamed.add(name.lower())
                    invented = opaque = True
            if not invented:
                real.add(name.lower())
            names.append(name)
            columns.setdefault(name.lower(), name)
            if isinstance(inner, (exp.Struct, exp.Array)) or (
                    isinstance(inner, exp.Subquery) and isinstance(inner.this, exp.Select)
                    and str(inner.this.args.get("kind") or "").upper() in ("STRUCT", "ARRAY")):
                composite.add(name.lower())
            if scope.protected and isinstance(inner, exp.Column) and scope.carries_unit(inner):
                if unit_out is None:
                    unit_out = name
                else:
                    copies.add(name.lower())
            elif scope.protected and scope.spells_unit(inner):
                spellings.add(name.lower())
        if len(columns) != len(names):
            twice = sorted({n for n in names if [m.lower() for m in names].count(n.lower()) > 1})
            if scope.protected:
                raise InvalidQueryError(
                    f"{where}: the output column name(s) {', '.join(twice)} are given twice over protected rows: "
                    "DuckDB reads such a name as its first column and renames the others, which the ownership "
                    "check does not follow (another column could pass for the privacy unit): not allowed (give "
                    "each output column its own name with AS)")
            opaque = True
        if scope.protected and unit_out is None:  # carry the unit automatically
            unit_name = scope.unit_name or "unit"
            if unit_name.lower() in columns:
                raise InvalidQueryError(
                    f"{where}: the output column {unit_name!r} is not the privacy unit {unit_name!r}: rename it, or "
                    "select the unit itself"
                )
            select.select(exp.alias_(scope.unit_expr.copy(), unit_name, quoted=True), copy=False)
            columns[unit_name.lower()] = unit_name
            unit_out = unit_name
        return Relation("", columns, unit_out if scope.protected else None, frozenset(copies - {(unit_out or "").lower()}),
                        frozenset(composite), opaque and not scope.protected, names_unknown and not scope.protected,
                        frozenset(unnamed - real),  # a real column of the name is the one DuckDB reads
                        frozenset(spellings - copies - {(unit_out or "").lower()}))
