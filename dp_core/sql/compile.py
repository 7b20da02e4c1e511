"""Compile an anonymized SELECT into the engine's typed query and an ownership-preserving source.

The source is one SQL statement (sqlglot tree, rendered in any dialect) whose rows each belong to
one unit: `SELECT unit, <group keys>, <aggregate inputs> FROM <checked FROM> WHERE <filter>`.
The engine then runs its bounding plan over it. The anonymized SELECT itself may hold only group
keys (as in GROUP BY) and DP aggregates; ORDER BY and LIMIT on its output are post-processing.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from .. import query as q
from ..errors import InvalidQueryError
from .ownership import OwnershipChecker, Scope, TableInfo, _arg, _is_dp_call, check_row_level, quote
from .syntax import parse_dp_sql

#: seed names -> (kind, quantile) ; BigQuery names are mapped in `_bigquery_call`
SEED_FUNCTIONS = {
    "ANON_COUNT": ("count", None), "ANON_SUM": ("sum", None), "ANON_AVG": ("avg", None),
    "ANON_VAR": ("var", None), "ANON_STDDEV": ("stddev", None), "ANON_NTILE": ("quantile", None),
    "ANON_MIN": ("quantile", 0.0), "ANON_MAX": ("quantile", 1.0), "ANON_MEDIAN": ("quantile", 0.5),
}
BIGQUERY_FUNCTIONS = {
    "__DP_COUNT": "count", "__DP_SUM": "sum", "__DP_AVG": "avg", "__DP_VAR_POP": "var",
    "__DP_STDDEV_POP": "stddev", "__DP_PERCENTILE_CONT": "quantile",
}


@dataclass(frozen=True)
class CompiledQuery:
    """What an anonymized SELECT means: the typed query, its source, its post-processing."""

    query: q.Query
    source: exp.Select  # rows each owned by one unit: unit, keys, aggregate inputs
    syntax: str
    order_by: tuple[tuple[str, bool], ...]  # (output column, descending)
    limit: int | None

    def source_sql(self, dialect: str = "duckdb") -> str:
        return self.source.sql(dialect=dialect)


def _number(node: exp.Expression, what: str) -> float:
    """A numeric literal (possibly negative)."""
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return -float(node.this.this)
    if isinstance(node, exp.Literal) and not node.is_string:
        return float(node.this)
    raise InvalidQueryError(f"{what} must be a number literal, got {quote(node)!r}")


def _whole(x: float | None) -> float | int | None:
    return int(x) if x is not None and float(x).is_integer() else x


class Compiler:
    """Turns one parsed anonymized SELECT into a CompiledQuery."""

    def __init__(self, catalog: dict[str, TableInfo]):
        self.checker = OwnershipChecker(catalog)
        self.values: dict[str, str] = {}  # source column name -> SQL of its expression
        self.source_items: list[exp.Expression] = []

    def _value_column(self, expr: exp.Expression, scope: Scope, where: str) -> str:
        """The source column that carries an aggregate's input (a row-level expression)."""
        check_row_level(expr, scope, where)
        key = quote(expr)
        for name, sql in self.values.items():
            if sql == key:
                return name
        base = expr.name if isinstance(expr, exp.Column) else f"expr{len(self.values)}"
        name, i = base, 1
        taken = {n.lower() for n in self.values} | {self.unit.lower()} | {k.lower() for k in self.key_names}
        while name.lower() in taken:
            i += 1
            name = f"{base}_{i}"
        self.values[name] = key
        self.source_items.append(exp.alias_(expr.copy(), name, quoted=True))
        return name

    # -- aggregates ------------------------------------------------------------------------
    def aggregate(self, call: exp.Anonymous, alias: str | None, scope: Scope, syntax: str) -> q.Aggregate:
        fname = call.name.upper()
        args = list(call.expressions)
        where = f"{quote(call)!r}"
        for a in args:
            for node in a.walk():
                if isinstance(node, exp.AggFunc) or _is_dp_call(node):
                    raise InvalidQueryError(f"{where}: an aggregate nested inside a DP aggregate is not allowed")
        if syntax == "anonymization":
            if fname not in SEED_FUNCTIONS:
                raise InvalidQueryError(f"unknown DP function {call.name}: use one of {', '.join(SEED_FUNCTIONS)}")
            kind, fixed_q = SEED_FUNCTIONS[fname]
            kwargs = {}
        else:
            if fname not in BIGQUERY_FUNCTIONS:
                raise InvalidQueryError(f"unknown DP function {fname[5:]}")
            kind, fixed_q = BIGQUERY_FUNCTIONS[fname], None
            kwargs = {a.this.name.lower(): a.expression for a in args if isinstance(a, exp.Kwarg)}
            args = [a for a in args if not isinstance(a, exp.Kwarg)]
            unknown = set(kwargs) - {"contribution_bounds_per_group"}
            if unknown:
                raise InvalidQueryError(f"{where}: unknown argument(s) {sorted(unknown)}: use contribution_bounds_per_group => (L, U)")
        lower = upper = qv = None
        column = None
        if kind == "count":
            if not args:
                raise InvalidQueryError(f"{where}: COUNT needs * or a column")
            target = args[0]
            if isinstance(target, exp.Distinct):
                cols = target.expressions
                if len(cols) != 1 or not isinstance(cols[0], exp.Column) or not scope.is_unit(cols[0]):
                    raise InvalidQueryError(
                        f"{where}: COUNT(DISTINCT {', '.join(quote(c) for c in cols)}) cannot be bounded: one unit "
                        "can add any number of distinct values. Only COUNT(DISTINCT <privacy unit>) is allowed"
                    )
                if len(args) > 1 or kwargs:
                    raise InvalidQueryError(f"{where}: COUNT(DISTINCT unit) takes no bounds (each unit counts once)")
                return q.Aggregate("count_units", name=alias)
            if not isinstance(target, exp.Star):
                column = self._value_column(target, scope, where)
            rest = args[1:]
            if syntax == "anonymization":
                if len(rest) > 1:
                    raise InvalidQueryError(f"{where}: ANON_COUNT takes (*, U) or (column, U)")
                upper = _number(rest[0], f"{where}: the bound U") if rest else None
            elif "contribution_bounds_per_group" in kwargs:
                lower, upper = self._bounds(kwargs["contribution_bounds_per_group"], where)
                if lower != 0:
                    raise InvalidQueryError(f"{where}: a COUNT's contribution bounds must start at 0, got ({lower:g}, {upper:g})")
                lower = None
            if upper is not None and not (upper >= 1 and float(upper).is_integer()):
                raise InvalidQueryError(f"{where}: a COUNT's bound must be a whole number >= 1, got {upper:g}")
            return q.Aggregate("count", column=column, upper=_whole(upper), name=alias)
        if not args:
            raise InvalidQueryError(f"{where}: needs a column")
        column = self._value_column(args[0], scope, where)
        rest = args[1:]
        if kind == "quantile" and fixed_q is None:
            if not rest:
                raise InvalidQueryError(f"{where}: needs the quantile q in [0, 1] after the column")
            qv = _number(rest[0], f"{where}: the quantile q")
            rest = rest[1:]
        if syntax == "anonymization":
            if len(rest) not in (0, 2):
                raise InvalidQueryError(f"{where}: give both bounds L, U or neither (automatic bounds)")
            if rest:
                lower, upper = _number(rest[0], f"{where}: L"), _number(rest[1], f"{where}: U")
        else:
            if rest:
                raise InvalidQueryError(f"{where}: bounds go in contribution_bounds_per_group => (L, U)")
            if "contribution_bounds_per_group" in kwargs:
                lower, upper = self._bounds(kwargs["contribution_bounds_per_group"], where)
        return q.Aggregate(kind, column=column, lower=_whole(lower), upper=_whole(upper),
                           q=fixed_q if fixed_q is not None else qv, name=alias)

    @staticmethod
    def _bounds(node: exp.Expression, where: str) -> tuple[float, float]:
        if not isinstance(node, (exp.Tuple, exp.Paren)):
            raise InvalidQueryError(f"{where}: contribution_bounds_per_group needs (L, U)")
        items = node.expressions if isinstance(node, exp.Tuple) else [node.this]
        if len(items) != 2:
            raise InvalidQueryError(f"{where}: contribution_bounds_per_group needs exactly two numbers (L, U)")
        return _number(items[0], f"{where}: L"), _number(items[1], f"{where}: U")

    # -- the anonymized SELECT -------------------------------------------------------------
    def compile(self, sql: str, *, epsilon=None, delta=None, max_partitions_contributed=None, **options) -> CompiledQuery:
        parsed = parse_dp_sql(sql)
        select = parsed.tree
        with_clause = parsed.with_clause
        if with_clause is not None:
            if with_clause.args.get("recursive"):
                raise InvalidQueryError("WITH RECURSIVE is not allowed")
            for cte in with_clause.expressions:
                rel = self.checker.check_select(cte.this, f"CTE {cte.alias!r}")
                self.checker.ctes[cte.alias.lower()] = rel
        if select.args.get("distinct"):
            raise InvalidQueryError("SELECT DISTINCT in the anonymized SELECT is not supported (its groups are the GROUP BY)")
        if select.args.get("having") is not None:
            raise InvalidQueryError(
                f"HAVING ({quote(select.args['having'])!r}) would filter on exact aggregates: not allowed; "
                "filter the released table instead"
            )
        scope = self.checker.from_scope(select, "the anonymized SELECT")
        units = {r.unit.lower() for r in scope.relations}
        self.unit = scope.relations[0].unit
        unit_option = parsed.options.get("privacy_unit_column")
        if unit_option is not None and unit_option.lower() not in units:
            raise InvalidQueryError(
                f"OPTIONS privacy_unit_column = {unit_option} does not match the registered privacy unit {self.unit!r}"
            )
        where = select.args.get("where")
        check_row_level(where, scope, "WHERE")
        for node in select.walk():
            if isinstance(node, exp.Window):
                raise InvalidQueryError(f"{quote(node)!r} is a window function: it mixes rows of different units")

        group = select.args.get("group")
        keys = list(group.expressions) if group is not None else []
        for k in keys:
            check_row_level(k, scope, "GROUP BY")
            if isinstance(k, exp.Column) and scope.is_unit(k):
                raise InvalidQueryError(f"GROUP BY {quote(k)}: grouping by the privacy unit would publish one row per unit")
        key_sql = [quote(k) for k in keys]
        key_names = [None] * len(keys)
        aggregates: list[q.Aggregate] = []
        self.key_names: list[str] = []
        pending = []
        for item in select.expressions:
            alias = item.alias if isinstance(item, exp.Alias) else None
            inner = item.this if isinstance(item, exp.Alias) else item
            if _is_dp_call(inner):
                pending.append((inner, alias))
                continue
            if quote(inner) in key_sql:
                i = key_sql.index(quote(inner))
                key_names[i] = alias or (inner.name if isinstance(inner, exp.Column) else f"key{i}")
                continue
            for node in inner.walk():
                if isinstance(node, exp.AggFunc):
                    raise InvalidQueryError(
                        f"{quote(item)!r} is not a DP aggregate: use "
                        + ("ANON_COUNT, ANON_SUM, ..." if parsed.syntax == "anonymization" else "COUNT, SUM, AVG, ... in the DP SELECT list")
                    )
                if isinstance(node, exp.Anonymous) and not _is_dp_call(node):
                    raise InvalidQueryError(f"unknown function {node.name!r} in {quote(item)!r}")
            raise InvalidQueryError(
                f"{quote(item)!r} is neither a GROUP BY key nor a DP aggregate: every output must be one or the other"
            )
        self.key_names = [n or (k.name if isinstance(k, exp.Column) else f"key{i}") for i, (n, k) in enumerate(zip(key_names, keys))]
        if len(set(n.lower() for n in self.key_names)) != len(self.key_names):
            raise InvalidQueryError(f"GROUP BY keys need distinct names: {self.key_names}")
        for call, alias in pending:
            aggregates.append(self.aggregate(call, alias, scope, parsed.syntax))
        if not aggregates:
            raise InvalidQueryError("the anonymized SELECT has no DP aggregate")

        unit_rel = next(r for r in scope.relations)
        unit_ref = exp.column(self.unit, table=None if self.unit.lower() in scope.merged else unit_rel.alias, quoted=True)
        items = [exp.alias_(unit_ref, self.unit, quoted=True)]
        items += [exp.alias_(k.copy(), n, quoted=True) for k, n in zip(keys, self.key_names)]
        items += self.source_items
        source = exp.select(*items).from_(_arg(select, "from").this.copy())
        for join in select.args.get("joins") or []:
            source = source.join(join.copy())
        if where is not None:
            source = source.where(where.this.copy())
        if with_clause is not None:
            source.set("with_" if "with_" in select.args else "with", with_clause.copy())

        order_by, limit = self._post_processing(select, [a.label for a in aggregates])
        eps = parsed.options.get("epsilon", epsilon)
        dlt = parsed.options.get("delta", delta)
        cu = parsed.options.get("max_groups_contributed", max_partitions_contributed)
        if "partition_selection" in parsed.options:
            options = {**options, "selection": parsed.options["partition_selection"]}
        if eps is None:
            raise InvalidQueryError("no epsilon: give it in OPTIONS (epsilon = ...) or with the request")
        query = q.Query(
            tuple(aggregates), privacy_unit=self.unit, epsilon=eps,
            delta=1e-6 if dlt is None else dlt, group_by=tuple(self.key_names),
            max_partitions_contributed=1 if cu is None else cu, **options,
        )
        query.validate()
        return CompiledQuery(query, source, parsed.syntax, order_by, limit)

    def _post_processing(self, select: exp.Select, labels: list[str]):
        outputs = {n.lower(): n for n in self.key_names + labels}
        order = []
        if select.args.get("order") is not None:
            for o in select.args["order"].expressions:
                target = o.this
                if not isinstance(target, exp.Column) or target.table or target.name.lower() not in outputs:
                    raise InvalidQueryError(f"ORDER BY {quote(o)}: order by output columns only ({', '.join(outputs.values())})")
                order.append((outputs[target.name.lower()], bool(o.args.get("desc"))))
        limit = None
        if select.args.get("limit") is not None:
            node = select.args["limit"].expression
            value = _number(node, "LIMIT")
            if value < 0 or not value.is_integer():
                raise InvalidQueryError(f"LIMIT must be a whole number >= 0, got {quote(node)}")
            limit = int(value)
        if select.args.get("offset") is not None:
            raise InvalidQueryError("OFFSET is not supported on a DP release")
        return tuple(order), limit


def compile_sql(sql: str, catalog: dict[str, TableInfo], **request) -> CompiledQuery:
    """Parse, check row ownership and compile an anonymized SELECT against registered tables."""
    return Compiler(catalog).compile(sql, **request)
