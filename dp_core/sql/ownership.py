"""Row ownership (seed Table 4.3): every row of every relation inside the FROM clause must derive
from the rows of one privacy unit only, and carry that unit.

    table             rows of registered tables carry their unit column
    projection        allowed; the unit is carried through (added when the analyst omits it)
    selection         WHERE allowed: a row-level condition (no subquery, aggregate or window)
    aggregation       allowed only when it groups by the unit
    join              allowed only with equality of the units: USING (unit) or a.unit = b.unit as
                      one of the AND-ed terms of ON; inner or left joins only
    everything else   rejected: a join without unit equality, cross and comma joins, right and
                      full joins, aggregates without the unit, window functions, UNION and other
                      set operations, LIMIT / ORDER BY inside, subqueries in conditions

`check_relation` returns the rewritten relation (with the unit carried) and what it holds.
Every refusal quotes the offending clause and says why it would break the guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from ..errors import InvalidQueryError


@dataclass(frozen=True)
class TableInfo:
    """A registered table: its columns and its privacy-unit column."""

    name: str
    columns: tuple[str, ...]
    unit: str


@dataclass
class Relation:
    """A relation in a FROM clause: how to reference it, its columns, its unit column."""

    alias: str
    columns: dict[str, str]  # lower-case name -> name
    unit: str

    def has(self, column: str) -> bool:
        return column.lower() in self.columns


@dataclass
class Scope:
    """The relations a SELECT can see, and the columns merged by USING joins."""

    relations: list[Relation] = field(default_factory=list)
    merged: dict[str, str] = field(default_factory=dict)  # USING columns: lower name -> name

    def resolve(self, col: exp.Column) -> tuple[Relation | None, str]:
        """The relation a column reference belongs to (None for a USING-merged column)."""
        name = col.name
        if col.table:
            rel = next((r for r in self.relations if r.alias.lower() == col.table.lower()), None)
            if rel is None:
                raise InvalidQueryError(f"unknown table or alias {col.table!r} in {col.sql('duckdb')!r}")
            if not rel.has(name):
                raise InvalidQueryError(f"unknown column {name!r} in {rel.alias!r} (columns: {', '.join(rel.columns.values())})")
            return rel, rel.columns[name.lower()]
        if name.lower() in self.merged:
            return None, self.merged[name.lower()]
        owners = [r for r in self.relations if r.has(name)]
        if not owners:
            known = sorted({c for r in self.relations for c in r.columns.values()})
            raise InvalidQueryError(f"unknown column {name!r} (available: {', '.join(known)})")
        if len(owners) > 1:
            raise InvalidQueryError(f"column {name!r} is ambiguous: qualify it with one of {[r.alias for r in owners]}")
        return owners[0], owners[0].columns[name.lower()]

    def is_unit(self, col: exp.Column) -> bool:
        rel, name = self.resolve(col)
        if rel is None:
            return any(r.unit.lower() == name.lower() for r in self.relations)
        return rel.unit.lower() == name.lower()


def _arg(node: exp.Expression, name: str):
    """sqlglot names some args with a trailing underscore (from_, with_): accept both."""
    return node.args.get(name + "_", node.args.get(name))


def quote(sql: exp.Expression) -> str:
    return sql.sql("duckdb")


def check_row_level(expr: exp.Expression | None, scope: Scope, where: str) -> None:
    """A row-level expression: columns of the scope, no subquery, aggregate or window function."""
    if expr is None:
        return
    for node in expr.walk():
        if isinstance(node, (exp.Subquery, exp.Select)) or isinstance(node, exp.Exists):
            raise InvalidQueryError(
                f"{where}: {quote(node)!r} is a subquery; it can read other units' rows, so a row "
                "would no longer depend on its own unit only"
            )
        if isinstance(node, exp.Window):
            raise InvalidQueryError(f"{where}: {quote(node)!r} is a window function: it mixes rows of different units")
        if isinstance(node, exp.AggFunc) or _is_dp_call(node):
            raise InvalidQueryError(f"{where}: {quote(node)!r} is an aggregate, which is not allowed here")
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            scope.resolve(node)


def _is_dp_call(node: exp.Expression) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.upper().startswith(("ANON_", "__DP_"))


class OwnershipChecker:
    """Checks FROM clauses against the catalog of registered tables and CTEs."""

    def __init__(self, catalog: dict[str, TableInfo]):
        self.catalog = {k.lower(): v for k, v in catalog.items()}
        self.ctes: dict[str, Relation] = {}

    # -- FROM items ------------------------------------------------------------------------
    def from_scope(self, select: exp.Select, where: str) -> Scope:
        """The scope of a SELECT's FROM and JOINs, checking each join's unit equality."""
        source = _arg(select, "from")
        if source is None:
            raise InvalidQueryError(f"{where}: a FROM clause is needed (the rows must come from a registered table)")
        scope = Scope()
        scope.relations.append(self.relation(source.this, where))
        for join in select.args.get("joins") or []:
            self.join(join, scope, where)
        return scope

    def relation(self, node: exp.Expression, where: str) -> Relation:
        if isinstance(node, exp.Table):
            if node.args.get("db") or node.args.get("catalog"):
                raise InvalidQueryError(f"{where}: qualified table names ({quote(node)!r}) are not supported")
            name = node.name
            alias = node.alias_or_name
            if name.lower() in self.ctes:
                rel = self.ctes[name.lower()]
                return Relation(alias, dict(rel.columns), rel.unit)
            info = self.catalog.get(name.lower())
            if info is None:
                known = ", ".join(t.name for t in self.catalog.values())
                raise InvalidQueryError(f"unknown table {name!r} (registered: {known or 'none'})")
            return Relation(alias, {c.lower(): c for c in info.columns}, info.unit)
        if isinstance(node, exp.Subquery):
            inner = node.this
            if not isinstance(inner, exp.Select):
                raise InvalidQueryError(
                    f"{where}: {quote(inner)[:80]!r} is a set operation (UNION, INTERSECT, EXCEPT): it mixes "
                    "rows of different units without a unit column"
                )
            rel = self.check_select(inner, f"subquery {quote(inner)[:60]!r}")
            alias = node.alias_or_name or f"_sub{id(node) % 10_000}"
            if not node.alias:
                node.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
            return Relation(alias, rel.columns, rel.unit)
        raise InvalidQueryError(f"{where}: {quote(node)!r} cannot be used in FROM (use a table, a CTE or a subquery)")

    def join(self, join: exp.Join, scope: Scope, where: str) -> None:
        right = self.relation(join.this, where)
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        text = quote(join)
        if kind == "CROSS" or (not join.args.get("on") and not join.args.get("using")):
            raise InvalidQueryError(
                f"{where}: {text!r} is a cross or comma join: it pairs rows of different units. Join on the "
                "unit: USING (unit) or ON a.unit = b.unit"
            )
        if side in ("RIGHT", "FULL") or kind in ("SEMI", "ANTI", "OUTER") and side not in ("", "LEFT"):
            raise InvalidQueryError(f"{where}: {text!r}: only inner and left joins keep every row with its unit")
        using = join.args.get("using")
        if using:
            names = [u.name.lower() for u in using]
            if right.unit.lower() not in names or any(r.unit.lower() != right.unit.lower() for r in scope.relations):
                raise InvalidQueryError(
                    f"{where}: {text!r} does not join on the unit: USING must include the unit column of both "
                    f"sides ({', '.join(sorted({r.unit for r in scope.relations} | {right.unit}))})"
                )
            for u in using:
                if not right.has(u.name) or not any(r.has(u.name) for r in scope.relations):
                    raise InvalidQueryError(f"{where}: USING column {u.name!r} is not in both joined relations")
                scope.merged[u.name.lower()] = u.name
        else:
            inner = Scope(scope.relations + [right], dict(scope.merged))
            check_row_level(join.args["on"], inner, where)
            terms = list(join.args["on"].flatten()) if isinstance(join.args["on"], exp.And) else [join.args["on"]]
            if not any(self._unit_equality(t, inner, right) for t in terms):
                raise InvalidQueryError(
                    f"{where}: {text!r} does not join on the unit: ON must include {right.alias}.{right.unit} = "
                    "<other side>.<its unit> as one of its AND-ed terms; without it rows of different units "
                    "would be paired"
                )
        scope.relations.append(right)

    @staticmethod
    def _unit_equality(term: exp.Expression, scope: Scope, right: Relation) -> bool:
        if not isinstance(term, exp.EQ):
            return False
        a, b = term.this, term.expression
        if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
            return False
        (ra, _), (rb, _) = scope.resolve(a), scope.resolve(b)
        if not (scope.is_unit(a) and scope.is_unit(b)):
            return False
        return (ra is right) != (rb is right)  # one side is the new relation, the other already joined

    # -- SELECT inside FROM ----------------------------------------------------------------
    def check_select(self, select: exp.Select, where: str) -> Relation:
        """A SELECT inside FROM (or a CTE): checked, and rewritten to carry the unit."""
        for clause in ("order", "limit", "offset"):
            if select.args.get(clause) is not None:
                raise InvalidQueryError(
                    f"{where}: {clause.upper()} inside a subquery keeps rows depending on other units' rows"
                )
        if _arg(select, "with") is not None:
            raise InvalidQueryError(f"{where}: a WITH clause inside a subquery is not supported; put it at the top")
        scope = self.from_scope(select, where)
        check_row_level(select.args.get("where"), scope, f"{where} WHERE")
        for node in select.walk():
            if isinstance(node, exp.Window):
                raise InvalidQueryError(f"{where}: {quote(node)!r} is a window function: it mixes rows of different units")
            if _is_dp_call(node):
                raise InvalidQueryError(f"{where}: {quote(node)!r}: DP aggregates belong to the anonymized SELECT only")
        group = select.args.get("group")
        aggregated = group is not None or any(isinstance(n, exp.AggFunc) for e in select.expressions for n in e.walk())
        if aggregated:
            keys = group.expressions if group is not None else []
            if not any(isinstance(k, exp.Column) and scope.is_unit(k) for k in keys):
                raise InvalidQueryError(
                    f"{where}: an aggregation must group by the unit ({', '.join(sorted({r.unit for r in scope.relations}))}); "
                    "otherwise one row would mix several units"
                )
            for k in keys:
                check_row_level(k, scope, f"{where} GROUP BY")
            self._check_aggregate_args(select, scope, where)
            having = select.args.get("having")
            if having is not None:
                for node in having.walk():
                    if isinstance(node, (exp.Subquery, exp.Select, exp.Window)):
                        raise InvalidQueryError(f"{where} HAVING: {quote(node)!r} is not allowed")
        return self._project(select, scope, where)

    @staticmethod
    def _check_aggregate_args(select: exp.Select, scope: Scope, where: str) -> None:
        for e in select.expressions:
            for node in e.walk():
                if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
                    scope.resolve(node)
                if isinstance(node, (exp.Subquery, exp.Select)):
                    raise InvalidQueryError(f"{where}: {quote(node)!r} is a subquery in the SELECT list: it can read other units' rows")

    @staticmethod
    def _project(select: exp.Select, scope: Scope, where: str) -> Relation:
        """Output columns of the SELECT; the unit is appended when the analyst did not select it."""
        columns: dict[str, str] = {}
        unit_out = None
        for e in select.expressions:
            if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
                rels = scope.relations
                if isinstance(e, exp.Column) and e.table:
                    rels = [r for r in scope.relations if r.alias.lower() == e.table.lower()]
                    if not rels:
                        raise InvalidQueryError(f"{where}: unknown table {e.table!r} in {quote(e)!r}")
                for r in rels:
                    columns.update(r.columns)
                    if unit_out is None:
                        unit_out = r.unit
                columns.update(scope.merged)
                continue
            inner = e.this if isinstance(e, exp.Alias) else e
            if not isinstance(inner, exp.Column):
                for node in inner.walk():
                    if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
                        scope.resolve(node)
            name = e.alias_or_name
            if not name:
                raise InvalidQueryError(f"{where}: give the expression {quote(e)!r} a name (AS ...)")
            columns[name.lower()] = name
            if isinstance(inner, exp.Column) and scope.is_unit(inner) and unit_out is None:
                unit_out = name
        if unit_out is None:  # carry the unit automatically
            unit_rel = scope.relations[0]
            unit_col = exp.column(unit_rel.unit, table=unit_rel.alias if unit_rel.unit.lower() not in scope.merged else None, quoted=True)
            select.select(exp.alias_(unit_col, unit_rel.unit, quoted=True), copy=False)
            if select.args.get("group") is not None and not any(
                isinstance(k, exp.Column) and scope.is_unit(k) for k in select.args["group"].expressions
            ):
                raise AssertionError("grouped selects were checked to group by the unit")
            columns[unit_rel.unit.lower()] = unit_rel.unit
            unit_out = unit_rel.unit
        return Relation("", columns, unit_out)
