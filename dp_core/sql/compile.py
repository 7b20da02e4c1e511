"""Compile one DP SELECT into the engine's typed query and an ownership-preserving source.

The source is one SQL statement (sqlglot tree, rendered in any dialect) whose rows each belong to
one unit: `SELECT unit, <group keys>, <aggregate inputs> FROM <checked FROM> WHERE <filter>`.
The engine then runs its bounding plan over it. The DP SELECT list holds group keys, DP aggregates
and expressions over them (`ROUND(AVG(x), 1)`, `COUNT(*) + 1`, ratios): those are evaluated on the
released table (post-processing), like ORDER BY and LIMIT.

Aggregate signatures follow BigQuery's reference: COUNT / SUM / AVG take
`contribution_bounds_per_group => (L, U)`, VAR_POP / STDDEV_POP / PERCENTILE_CONT take
`contribution_bounds_per_row => (L, U)` (here: the bounds of each unit's value, as the engine
clamps it), COUNT's bounds are whole numbers (INT64); WITH ANONYMIZATION takes
`CLAMPED BETWEEN L AND U` (and the seed's positional bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlglot import exp

from .. import query as q
from ..errors import InvalidQueryError, UnsupportedError
from ..no_value_errors import never_failing
from . import public_groups
from .ownership import OwnershipChecker, Scope, _arg, check_functions, is_dp_call, is_subquery, outside_cte_reads
from .syntax import DPClause, mark_of, number_literal, quote
from .unit_keys import bare, unit_key_refusal

#: seed names -> (kind, quantile)
SEED_FUNCTIONS = {
    "ANON_COUNT": ("count", None), "ANON_SUM": ("sum", None), "ANON_AVG": ("avg", None),
    "ANON_VAR": ("var", None), "ANON_STDDEV": ("stddev", None), "ANON_NTILE": ("quantile", None),
    "ANON_MIN": ("quantile", 0.0), "ANON_MAX": ("quantile", 1.0), "ANON_MEDIAN": ("quantile", 0.5),
    "ANON_VAR_POP": ("var", None), "ANON_STDDEV_POP": ("stddev", None), "ANON_PERCENTILE_CONT": ("quantile", None),
}
BIGQUERY_FUNCTIONS = {
    "__DP_COUNT": "count", "__DP_SUM": "sum", "__DP_AVG": "avg", "__DP_VAR_POP": "var",
    "__DP_STDDEV_POP": "stddev", "__DP_PERCENTILE_CONT": "quantile",
}
#: the named bounds argument of each BigQuery function
BOUNDS_ARGUMENT = {"count": "contribution_bounds_per_group", "sum": "contribution_bounds_per_group",
                   "avg": "contribution_bounds_per_group", "var": "contribution_bounds_per_row",
                   "stddev": "contribution_bounds_per_row", "quantile": "contribution_bounds_per_row"}
UNSUPPORTED_FUNCTIONS = ("__DP_APPROX_QUANTILES", "__DP_APPROX_COUNT_DISTINCT", "ANON_QUANTILES")
#: APPROX_QUANTILES(x, n, ...) / ANON_QUANTILES(x, n ...): the n + 1 quantiles 0, 1/n, ..., 1 as an array,
#: each one a PERCENTILE_CONT aggregate with its own share of the budget (so n is capped)
MAX_QUANTILES = 100
#: BigQuery's report formats (`report_format => "JSON"`, legacy `WITH REPORT(FORMAT = JSON)`). Accepted
#: and checked; they do not change the release: every released value already comes with its
#: confidence interval and mechanism in the report and results.json (docs/sql.md, "Report formats")
REPORT_FORMATS = ("JSON", "PROTO")
REPORT_ARGUMENTS = {"report_format", "__report_format", "__report_bad"}


def _check_report_format(kwargs: dict, where: str, syntax: str) -> None:
    """The report-format argument of the syntax in use, with one of REPORT_FORMATS as its value."""
    if "__report_bad" in kwargs:
        what = kwargs["__report_bad"].name
        raise InvalidQueryError(
            f"{where}: WITH REPORT needs its format, WITH REPORT(FORMAT = JSON) or (FORMAT = PROTO)"
            + ("" if what == "nothing" else f"; unknown report option {what!r}"))
    if syntax == "anonymization" and "report_format" in kwargs:
        raise InvalidQueryError(f"{where}: report_format => ... belongs to WITH DIFFERENTIAL_PRIVACY; with "
                                "ANONYMIZATION write WITH REPORT(FORMAT = JSON)")
    if syntax != "anonymization" and "__report_format" in kwargs:
        raise InvalidQueryError(f"{where}: WITH REPORT belongs to WITH ANONYMIZATION; with DIFFERENTIAL_PRIVACY "
                                'write report_format => "JSON"')
    node = kwargs.get("report_format", kwargs.get("__report_format"))
    if node is None:
        return
    value = None
    if isinstance(node, exp.Literal) and node.is_string:
        value = node.name
    elif isinstance(node, exp.Column) and not node.table and node.this.args.get("quoted"):
        value = node.name  # BigQuery's "JSON" is a string; the DuckDB dialect reads it as a quoted name
    if value is None or value.upper() not in REPORT_FORMATS:
        raise InvalidQueryError(f"{where}: the report format must be \"JSON\" or \"PROTO\", got {quote(node)}")


@dataclass(frozen=True)
class CompiledQuery:
    """What a DP SELECT means: the typed query, its source, its post-processing."""

    query: q.Query
    source: exp.Select  # rows each owned by one unit: unit, keys, aggregate inputs
    syntax: str
    order_by: tuple[tuple[str, bool], ...]  # (output column, descending)
    limit: int | None
    outputs: tuple[tuple[str, str], ...] = ()  # (name, DuckDB SQL over the released table), in order
    plain: bool = True  # the select list is keys and DP aggregates only (the released table as is)
    having: str | None = None  # HAVING: a filter on the released values (DuckDB SQL), post-processing
    #: PUBLIC_GROUPS: DuckDB SQL listing the public key tuples (public tables only), run before the
    #: engine to fill query.public_partitions (public_groups.py)
    public_groups_sql: str | None = None
    public_groups_tables: tuple[str, ...] = ()  # the public tables public_groups_sql reads
    public_tables: tuple[str, ...] = ()  # public tables this DP SELECT reads (joins, subqueries, groups)
    output_tables: tuple[str, ...] = ()  # public tables its select list reads (computed beside the released values)
    protected_tables: tuple[str, ...] = ()  # the protected tables its rows come from (what is charged)

    def source_sql(self, dialect: str = "duckdb") -> str:
        return self.source.sql(dialect=dialect)


def _whole(x: float | None) -> float | int | None:
    return int(x) if x is not None and float(x).is_integer() and abs(x) < 2**62 else x


def _inner(item: exp.Expression) -> exp.Expression:
    return item.this if isinstance(item, exp.Alias) else item


class Compiler:
    """Turns one DP SELECT (a node of the statement) into a CompiledQuery."""

    def __init__(self, checker: OwnershipChecker):
        self.checker = checker
        self.values: dict[str, str] = {}  # source column name -> SQL of its expression
        self.source_items: list[exp.Expression] = []
        self.key_names: list[str] = []
        self.unit = ""
        self.output_tables: set[str] = set()  # public tables read by subqueries of the select list

    def _value_column(self, expr: exp.Expression, scope: Scope, where: str) -> str:
        """The source column that carries an aggregate's input (a row-level expression)."""
        if isinstance(expr, exp.Star) or (isinstance(expr, exp.Column) and isinstance(expr.this, exp.Star)):
            raise InvalidQueryError(f"{where}: * is not a value: only COUNT takes *")
        for node in expr.walk():
            if is_subquery(node):
                raise InvalidQueryError(f"{where}: {quote(node)[:60]!r}: a subquery cannot be an aggregate's input")
        self.checker.check_condition(expr, scope, where)
        key = quote(expr)
        for name, sql in self.values.items():
            if sql == key:
                return name
        base = expr.name if isinstance(expr, exp.Column) and expr.name else f"expr{len(self.values)}"
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
        fname = str(call.name).upper()
        shown = fname.removeprefix("__DP_")
        args = list(call.expressions)
        where = f"{shown}(...)"
        if fname in UNSUPPORTED_FUNCTIONS:
            raise UnsupportedError(f"{shown} is not offered by this engine: use PERCENTILE_CONT / COUNT")
        for a in args:
            for node in a.walk():
                if isinstance(node, exp.AggFunc) or (is_dp_call(node) and node is not call):
                    raise InvalidQueryError(f"{where}: an aggregate nested inside a DP aggregate is not allowed")
        kwargs = {}
        for a in args:
            if isinstance(a, exp.Kwarg):
                key = a.this.name.lower()
                if key in kwargs:
                    raise InvalidQueryError(f"{where}: argument {key!r} is given twice")
                kwargs[key] = a.expression
        args = [a for a in args if not isinstance(a, exp.Kwarg)]
        if fname in SEED_FUNCTIONS:
            if syntax != "anonymization":
                raise InvalidQueryError(f"{shown} belongs to SELECT WITH ANONYMIZATION; with DIFFERENTIAL_PRIVACY use "
                                        "COUNT, SUM, AVG, VAR_POP, STDDEV_POP, PERCENTILE_CONT")
            kind, fixed_q = SEED_FUNCTIONS[fname]
            seed = fname not in ("ANON_VAR_POP", "ANON_STDDEV_POP", "ANON_PERCENTILE_CONT")
        elif fname in BIGQUERY_FUNCTIONS:
            if syntax == "anonymization":
                raise InvalidQueryError(f"{shown} is not a DP function of SELECT WITH ANONYMIZATION: use ANON_{shown}"
                                        " (or SELECT WITH DIFFERENTIAL_PRIVACY)")
            kind, fixed_q, seed = BIGQUERY_FUNCTIONS[fname], None, False
        else:
            raise InvalidQueryError(f"unknown DP function {shown}: use one of "
                                    + ", ".join(SEED_FUNCTIONS if syntax == "anonymization" else
                                                [n[5:] for n in BIGQUERY_FUNCTIONS]))
        _check_report_format(kwargs, where, syntax)
        allowed_kwargs = ({"__clamp_lo", "__clamp_hi"} if syntax == "anonymization"
                          else {BOUNDS_ARGUMENT[kind]}) | REPORT_ARGUMENTS
        unknown = set(kwargs) - allowed_kwargs
        if unknown:
            if syntax == "anonymization":
                raise InvalidQueryError(f"{where}: named arguments {sorted(unknown)} belong to WITH DIFFERENTIAL_PRIVACY; "
                                        "with ANONYMIZATION write CLAMPED BETWEEN L AND U")
            if unknown & {"__clamp_lo", "__clamp_hi"}:
                raise InvalidQueryError(f"{where}: CLAMPED BETWEEN belongs to WITH ANONYMIZATION; write "
                                        f"{BOUNDS_ARGUMENT[kind]} => (L, U)")
            raise InvalidQueryError(f"{where}: unknown argument(s) {sorted(unknown)}: {shown} takes "
                                    f"{BOUNDS_ARGUMENT[kind]} => (L, U)")
        bounds = None
        if "__clamp_lo" in kwargs:
            bounds = (kwargs["__clamp_lo"], kwargs.get("__clamp_hi"))
            if bounds[1] is None:
                raise InvalidQueryError(f"{where}: CLAMPED BETWEEN needs L AND U")
        elif syntax != "anonymization" and BOUNDS_ARGUMENT[kind] in kwargs:
            bounds = self._bound_pair(kwargs[BOUNDS_ARGUMENT[kind]], where)
        if not args:
            raise InvalidQueryError(f"{where}: needs {'* or ' if kind == 'count' else ''}a column")
        target, rest = args[0], args[1:]
        integer_bounds = kind == "count"
        lower = upper = qv = None
        column = None
        if isinstance(target, exp.Distinct):
            cols = target.expressions
            if kind != "count":
                raise InvalidQueryError(f"{where}: DISTINCT is not allowed in DP aggregates")
            if len(cols) != 1 or not isinstance(cols[0], exp.Column) or not scope.is_unit(cols[0]):
                raise InvalidQueryError(
                    f"{where}: COUNT(DISTINCT {', '.join(quote(c) for c in cols)}) cannot be bounded: one unit "
                    "can add any number of distinct values. Only COUNT(DISTINCT <privacy unit>) is allowed"
                )
            if rest or bounds is not None:
                raise InvalidQueryError(f"{where}: COUNT(DISTINCT unit) takes no bounds (each unit counts once)")
            return q.Aggregate("count_units", name=alias)
        if kind == "count":
            if not isinstance(target, exp.Star):
                column = self._value_column(target, scope, where)
        else:
            column = self._value_column(target, scope, where)
            if kind == "quantile" and fixed_q is None:
                if not rest:
                    raise InvalidQueryError(f"{where}: needs the percentile in [0, 1] after the column")
                qv = number_literal(rest[0], f"{where}: the percentile")
                if not 0 <= qv <= 1:
                    raise InvalidQueryError(f"{where}: the percentile must be in [0, 1], got {qv:g}")
                rest = rest[1:]
        if seed and rest:  # the seed's positional bounds: ANON_COUNT(*, U), ANON_SUM(x, L, U)
            if bounds is not None:
                raise InvalidQueryError(f"{where}: give the bounds once (CLAMPED BETWEEN or positional)")
            if kind == "count":
                if len(rest) != 1:
                    raise InvalidQueryError(f"{where}: ANON_COUNT takes (*, U) or (column, U)")
                bounds = (exp.Literal.number(0), rest[0])
            elif len(rest) != 2:
                raise InvalidQueryError(f"{where}: give both bounds L, U or neither (automatic bounds)")
            else:
                bounds = (rest[0], rest[1])
            if kind == "count":  # the seed's U may be written 5 or 5.0; a fraction is refused below
                integer_bounds = False
            rest = []
        if rest:
            n = 2 if kind == "quantile" else 1
            raise InvalidQueryError(
                f"{where}: takes {n} positional argument(s), got {n + len(rest)}: bounds go in "
                + ("CLAMPED BETWEEN L AND U" if syntax == "anonymization" else f"{BOUNDS_ARGUMENT[kind]} => (L, U)")
            )
        if bounds is not None:
            lower = number_literal(bounds[0], f"{where}: the lower bound", integer=integer_bounds)
            upper = number_literal(bounds[1], f"{where}: the upper bound", integer=integer_bounds)
            if lower > upper:
                raise InvalidQueryError(f"{where}: lower bound {lower:g} exceeds upper bound {upper:g} (give (L, U) with L <= U)")
        if kind == "count":
            if bounds is not None and not (lower <= 0 and upper >= 1):
                # BigQuery clamps each unit's count in a group to [L, U]; with L > 0 or U < 1 that is
                # not the engine's count (bounded by U alone: a lower bound <= 0 changes nothing,
                # a count is never negative), but exactly a SUM of the row indicator clamped to
                # [L, U] per unit and group: same values, same sensitivity max(|L|, |U|) per group
                if not float(upper).is_integer() or not float(lower).is_integer():
                    raise InvalidQueryError(f"{where}: a COUNT's bounds must be whole numbers, got ({lower:g}, {upper:g})")
                if lower == upper == 0:
                    raise InvalidQueryError(f"{where}: contribution bounds (0, 0) let no unit count: give U >= 1")
                one = exp.Literal.number(1)
                indicator = one if isinstance(target, exp.Star) else exp.If(
                    this=exp.Not(this=exp.Is(this=target.copy(), expression=exp.Null())), true=one,
                    false=exp.Literal.number(0))
                return q.Aggregate("sum", column=self._value_column(indicator, scope, where), lower=_whole(lower),
                                   upper=_whole(upper), name=alias)
            if bounds is not None and not float(upper).is_integer():
                raise InvalidQueryError(f"{where}: a COUNT's bound must be a whole number >= 1, got {upper:g}")
            return q.Aggregate("count", column=column, upper=_whole(upper), name=alias)
        return q.Aggregate(kind, column=column, lower=_whole(lower), upper=_whole(upper),
                           q=fixed_q if fixed_q is not None else qv, name=alias)

    @staticmethod
    def _bound_pair(node: exp.Expression, where: str) -> tuple[exp.Expression, exp.Expression]:
        if isinstance(node, (exp.Tuple, exp.Struct)):  # (L, U), STRUCT(L, U), STRUCT(L AS lo, U AS hi)
            items = [i.expression if isinstance(i, exp.PropertyEQ) else i.this if isinstance(i, exp.Alias) else i
                     for i in node.expressions]
        else:
            raise InvalidQueryError(f"{where}: contribution bounds need a pair (L, U)")
        if len(items) != 2:
            raise InvalidQueryError(f"{where}: contribution bounds need exactly two numbers (L, U)")
        return items[0], items[1]

    # -- the DP SELECT ---------------------------------------------------------------------
    def compile(self, select: exp.Select, clause: DPClause, with_items: list[exp.Expression], *, epsilon=None,
                delta=None, max_partitions_contributed=None, own_with: bool = True, **options) -> CompiledQuery:
        """own_with=False: the select's WITH clause is the statement's (already classified)."""
        select = select.copy()
        select.set("expressions", [e for e in select.expressions if mark_of_item(e) is None])
        if select.args.get("distinct"):
            raise InvalidQueryError("SELECT DISTINCT in a DP SELECT is not supported (its groups are the GROUP BY)")
        refuse_unread_clauses(select)
        refuse_patterns(select)
        for node in select.walk(prune=lambda n: n is not select and is_subquery(n)):
            if isinstance(node, exp.Window):
                raise InvalidQueryError(f"{quote(node)!r} is a window function: not allowed in a DP SELECT")
        if _arg(select, "from") is None:
            raise InvalidQueryError("a DP SELECT needs a FROM clause (the rows must come from a registered table)")
        where_label = "the DP SELECT"
        own_with = _arg(select, "with") if own_with else None
        if own_with is None:
            select.set("with_" if "with_" in exp.Select.arg_types else "with", None)
        else:  # (WITH t AS (...) SELECT WITH DIFFERENTIAL_PRIVACY ... FROM t): its own CTEs
            saved_ctes = self.checker.enter_with(own_with, where_label)
            with_items = [*with_items, *own_with.expressions]
            select.set("with_" if "with_" in exp.Select.arg_types else "with", None)
            try:
                return self._compile(select, clause, with_items, epsilon=epsilon, delta=delta,
                                     max_partitions_contributed=max_partitions_contributed, **options)
            finally:
                self.checker.ctes = saved_ctes
        return self._compile(select, clause, with_items, epsilon=epsilon, delta=delta,
                             max_partitions_contributed=max_partitions_contributed, **options)

    def _compile(self, select: exp.Select, clause: DPClause, with_items: list[exp.Expression], *, epsilon=None,
                 delta=None, max_partitions_contributed=None, **options) -> CompiledQuery:
        where_label = "the DP SELECT"
        strategy = clause.options.get("group_selection_strategy")
        groups = public_groups.prepare(select, self.checker) if strategy == public_groups.STRATEGY else None
        scope = self.checker.from_scope(select, where_label)
        unit_option = clause.options.get("privacy_unit_column")
        if unit_option is not None:
            col = exp.column(*reversed(unit_option.split(".", 1))) if "." in unit_option else exp.column(unit_option)
            if "." not in unit_option and scope.protected and any(r.is_unit(unit_option) for r in scope.relations):
                col = None  # the unit of a joined protected table (USING or ON unit equality)
            try:
                rel, name = scope.resolve(col) if col is not None else (None, unit_option)
            except InvalidQueryError as err:
                raise InvalidQueryError(f"OPTIONS privacy_unit_column = {unit_option}: {err}") from None
            if scope.protected:
                if col is not None and not scope.is_unit(col):
                    raise InvalidQueryError(
                        f"OPTIONS privacy_unit_column = {unit_option} does not match the registered privacy unit "
                        f"{scope.unit_name!r}"
                    )
            else:  # a public table: the analyst names the unit (BigQuery's privacy_unit_column)
                if rel is not None and name.lower() in rel.composite:
                    raise InvalidQueryError(f"OPTIONS privacy_unit_column = {unit_option}: a unit column must support "
                                            "grouping, but it holds a STRUCT or an ARRAY")
                scope.unit_expr = exp.column(name, table=rel.alias if rel is not None else None, quoted=True)
                scope.unit_name = name
        if not scope.protected:
            raise InvalidQueryError(
                "the DP SELECT reads no table with a privacy unit: register the table with its unit, or name it "
                "with OPTIONS (privacy_unit_column = ...)"
            )
        self.unit = scope.unit_name
        where = select.args.get("where")
        if where is not None:
            self.checker.check_condition(where.this, scope, "WHERE")
            scope.note_equalities(where.this)

        select.set("expressions", [_expand_quantiles(item, clause.syntax) for item in select.expressions])
        keys, _ = self._group_keys(select, scope)
        key_sql = [_key_text(k) for k in keys]
        self.key_names = [None] * len(keys)
        items = []  # (kind, name, payload) in select-list order
        calls: list[tuple[exp.Anonymous, str | None]] = []
        used_in: dict[int, str] = {}  # aggregate inside an expression -> the output (or clause) using it first
        for pos, item in enumerate(select.expressions):
            alias = item.alias if isinstance(item, exp.Alias) else None
            inner = _inner(item)
            if is_dp_call(inner):
                calls.append((inner, alias))
                items.append(("agg", alias, len(calls) - 1))
                continue
            if _key_text(inner) in key_sql:
                i = key_sql.index(_key_text(inner))
                name = alias or (inner.name if isinstance(inner, exp.Column) else None)
                if self.key_names[i] is None:
                    self.key_names[i] = name
                items.append(("key", name, i))
                continue
            first = len(calls)
            items.append(("expr", alias, self._post_expression(inner, item, keys, key_sql, calls, scope, clause.syntax)))
            used_in.update({i: alias or f"_col{pos}" for i in range(first, len(calls))})
        having = None
        if select.args.get("having") is not None:  # a filter on the released (noisy) values: post-processing
            cond = select.args["having"].this.copy()
            aliases = {e.alias.lower(): _inner(e) for e in select.expressions if isinstance(e, exp.Alias)}
            for col in list(cond.find_all(exp.Column)):
                if not col.table and col.name.lower() in aliases and _key_text(col) not in key_sql:
                    new = aliases[col.name.lower()].copy()
                    if col is cond:
                        cond = new
                    else:
                        col.replace(new)
            first = len(calls)
            having = self._post_expression(cond, select.args["having"], keys, key_sql, calls, scope, clause.syntax)
            used_in.update({i: "HAVING" for i in range(first, len(calls))})
        self.key_names = [n or (k.name if isinstance(k, exp.Column) and k.name else f"key{i}")
                          for i, (n, k) in enumerate(zip(self.key_names, keys))]
        if len({n.lower() for n in self.key_names}) != len(self.key_names):
            raise InvalidQueryError(f"GROUP BY keys need distinct names: {self.key_names}")
        aggregates = []
        taken = {n.lower() for n in self.key_names} | {a.lower() for _, a in calls if a}
        for i, (call, alias) in enumerate(calls):
            plain = any(kind == "agg" and p == i for kind, _, p in items)
            name = alias if plain else _inner_name(call, used_in.get(i), taken)
            aggregates.append(self.aggregate(call, name, scope, clause.syntax))
        if not aggregates:
            if not keys:
                raise InvalidQueryError("the DP SELECT has neither GROUP BY nor a DP aggregate: use one of them")
            # GROUP BY only: release the groups; the selection's noisy count of units (no extra budget)
            aggregates.append(q.Aggregate("count_units", name="__groups"))
        labels = [a.label for a in aggregates]
        plain = having is None and not any(a.name == "__groups" for a in aggregates) and all(kind != "expr" for kind, _, _ in items) and all(
            kind != "key" or name is None or name == self.key_names[p] for kind, name, p in items)
        out: list[tuple[str, str]] = []
        for pos, (kind, name, payload) in enumerate(items):
            if kind == "key":
                out.append((name or self.key_names[payload], _ident(self.key_names[payload])))
            elif kind == "agg":
                out.append((labels[payload], _ident(labels[payload])))
            else:
                out.append((name or f"_col{pos}", self._render(payload, labels)))
        names = [n.lower() for n, _ in out]
        if len(set(names)) != len(names):
            twice = sorted({n for n, _ in out if names.count(n.lower()) > 1})
            raise InvalidQueryError(f"the DP SELECT's output names must be unique: {', '.join(twice)} is given twice in "
                                    f"{[n for n, _ in out]}; give each output column its own name with AS")

        unit_ref = scope.unit_expr.copy()
        src_items = [exp.alias_(unit_ref, self.unit, quoted=True)]
        src_items += [exp.alias_(k.copy(), n, quoted=True) for k, n in zip(keys, self.key_names)]
        src_items += self.source_items
        source = exp.select(*src_items).from_(_arg(select, "from").this.copy())
        for join in select.args.get("joins") or []:
            source = source.join(join.copy())
        if where is not None:
            source = source.where(where.this.copy())
        if with_items:
            source.set("with_" if "with_" in exp.Select.arg_types else "with",
                       exp.With(expressions=[w.copy() for w in with_items]))

        source = never_failing(source)  # one person's value must not fail the query (dp_core/no_value_errors.py)
        order_by, limit = self._post_processing(select, [n for n, _ in out])
        given = {k: v for k, v in clause.options.items() if v is not None}  # NULL: the default
        eps = given.get("epsilon", epsilon)
        dlt = given.get("delta", delta)
        cu = given.get("max_groups_contributed", given.get("max_rows_contributed", max_partitions_contributed))
        if eps is None:
            raise InvalidQueryError("no epsilon: give it in OPTIONS (epsilon = ...) or with the request")
        groups_sql, groups_tables = None, ()
        if groups is not None:  # public partitions: listed at execution time (no selection, no selection budget)
            groups_sql, groups_tables = public_groups.group_keys_sql(keys, self.key_names, groups, scope, with_items,
                                                                     self.checker)
        elif strategy:
            options = {**options, "selection": strategy}
        if clause.options.get("partition_selection"):
            options = {**options, "selection": clause.options["partition_selection"]}
        query = q.Query(
            tuple(aggregates), privacy_unit=self.unit, epsilon=eps,
            delta=1e-6 if dlt is None else dlt, group_by=tuple(self.key_names),
            max_partitions_contributed=1 if cu is None else cu, **options,
        )
        if groups_sql is not None:
            replace(query, public_partitions=()).validate()  # what runs: the public keys, no selection
        else:
            query.validate()
        return CompiledQuery(query, source, clause.syntax, order_by, limit, tuple(out), plain,
                             None if having is None else self._render(having, labels), groups_sql, groups_tables,
                             self.checker.public_tables_in(source), tuple(sorted(self.output_tables)),
                             tuple(sorted(i.name for i in self.checker.tables_in(source) if i.unit is not None)))

    def _render(self, expr: exp.Expression, labels: list[str]) -> str:
        """DuckDB SQL of a post-processing expression over the released table's columns."""
        sql = expr.sql("duckdb")
        for i, label in enumerate(labels):
            sql = sql.replace(f'"__aggref{i}"', _ident(label))
        for i, key in enumerate(self.key_names):
            sql = sql.replace(f'"__keyref{i}"', _ident(key))
        return sql

    def _group_keys(self, select: exp.Select, scope: Scope):
        """GROUP BY keys as expressions: ordinals and select-list aliases resolved (BigQuery allows both)."""
        group = select.args.get("group")
        if group is None:
            return [], None
        for extra in ("rollup", "cube", "grouping_sets"):
            if group.args.get(extra):
                raise UnsupportedError(f"GROUP BY {extra.upper().replace('_', ' ')} is not supported in a DP SELECT")
        if group.args.get("all") is not None or group.args.get("totals"):
            raise UnsupportedError(f"{quote(group)}: not supported in a DP SELECT (DuckDB would choose the keys): name "
                                   "each GROUP BY key")
        aliases = {e.alias.lower(): e.this for e in select.expressions if isinstance(e, exp.Alias)}
        keys = []
        for k in group.expressions:
            written = quote(k)
            while isinstance(k, exp.Paren):  # GROUP BY (1) is a position too
                k = k.this
            if isinstance(k, exp.Literal) and not k.is_string:
                try:
                    pos = int(str(k.this))
                except ValueError:
                    raise InvalidQueryError(f"GROUP BY {quote(k)}: a position must be a whole number") from None
                if not 1 <= pos <= len(select.expressions):
                    raise InvalidQueryError(f"GROUP BY {pos}: there is no select-list item {pos}")
                k = _inner(select.expressions[pos - 1])
            elif isinstance(k, exp.Column) and not k.table and k.name.lower() in aliases:
                try:
                    scope.resolve(k)
                except InvalidQueryError:
                    k = aliases[k.name.lower()]
            for node in k.walk():
                if isinstance(node, exp.AggFunc) or is_dp_call(node):
                    raise InvalidQueryError(f"GROUP BY {quote(k)}: grouping by an aggregate is not allowed (group by "
                                            "row values, e.g. a column)")
                if isinstance(node, (exp.Columns, exp.Star)):  # one key in the plan, as many as it matches in DuckDB
                    raise InvalidQueryError(f"GROUP BY {quote(k)}: a key chosen by a pattern (COLUMNS(...), *) stands "
                                            "for every column it matches, which the DP SELECT does not follow: name "
                                            "each key column instead")
            self.checker.check_condition(k, scope, "GROUP BY")
            if scope.spells_unit(k):
                how = [] if quote(k) == written else [f"it stands for {quote(k)}"]
                if not isinstance(bare(k), exp.Column) or not scope.is_unit(bare(k)):
                    how.append(f"{'which' if how else quote(k)} holds the unit's value on every row")
                raise unit_key_refusal(written, ", ".join(how))
            keys.append(k)
        return keys, None

    def _post_expression(self, inner: exp.Expression, item: exp.Expression, keys, key_sql, calls, scope, syntax):
        """An expression over DP aggregates and GROUP BY keys, evaluated on the released table."""
        check_functions(inner, "the DP SELECT list")
        expr = inner.copy()
        outside = (lambda n: is_dp_call(n) or (n is not expr and is_subquery(n)))
        for node in list(expr.walk(prune=outside)):
            if node is not expr and is_subquery(node):
                # an uncorrelated subquery over public tables: a constant of public data, computed
                # beside the released values (public_subquery refuses protected or correlated ones)
                self.checker.public_subquery(node, f"the DP SELECT list: {quote(item)[:60]!r}")
                ctes = outside_cte_reads(node, set(self.checker.ctes) | self.checker.released)
                if ctes:  # computed beside the released values, where no CTE of the statement is defined
                    raise InvalidQueryError(
                        f"the DP SELECT list: {quote(item)[:60]!r}: the subquery reads the CTE {ctes[0].name!r}, but "
                        "it is computed beside the released values, where the statement's CTEs are not defined: "
                        "DuckDB would read a table or a file of that name instead (a CTE named after a protected "
                        "table's file released its raw rows): not allowed (read registered public tables in it, or "
                        "join the CTE in an outer query)")
                self.output_tables |= set(self.checker.public_tables_in(node))
                continue
            if isinstance(node, exp.Window):
                raise InvalidQueryError(f"{quote(node)!r} is a window function: not allowed in a DP SELECT")
        replaced = []
        for node in list(expr.walk(prune=outside)):
            if is_dp_call(node):
                same = [i for i, (c, _) in enumerate(calls) if quote(c) == quote(node)]
                if not same:  # the same DP aggregate twice is computed (and paid for) once
                    calls.append((node.copy(), None))
                at = same[0] if same else len(calls) - 1
                replaced.append((node, exp.column(f"__aggref{at}", quoted=True)))
            elif isinstance(node, exp.AggFunc):
                raise InvalidQueryError(
                    f"{quote(item)!r}: {quote(node)!r} is not a DP aggregate: use "
                    + ("ANON_COUNT, ANON_SUM, ..." if syntax == "anonymization" else "COUNT, SUM, AVG, ... of the DP clause")
                )
        for node, new in replaced:
            if node is expr:
                expr = new
            else:
                node.replace(new)
        for node in list(expr.walk(prune=outside)):
            sql = _key_text(node)
            if sql in key_sql and not isinstance(node, exp.Literal):
                i = key_sql.index(sql)
                new = exp.column(f"__keyref{i}", quoted=True)
                if node is expr:
                    expr = new
                else:
                    node.replace(new)
        for node in expr.walk(prune=outside):
            if isinstance(node, exp.Column) and not str(node.name).startswith(("__aggref", "__keyref")):
                raise InvalidQueryError(
                    f"{quote(item)!r} is neither a GROUP BY key nor a DP aggregate (nor an expression over them): "
                    f"{quote(node)!r} is a column of the rows, which a DP SELECT cannot release"
                )
        return expr

    def _post_processing(self, select: exp.Select, names: list[str]):
        outputs = {n.lower(): n for n in names}
        order = []
        if select.args.get("order") is not None:
            for o in select.args["order"].expressions:
                target = o.this
                if isinstance(target, exp.Literal) and not target.is_string and str(target.this).isdigit() \
                        and 1 <= int(target.this) <= len(names):
                    order.append((names[int(target.this) - 1], bool(o.args.get("desc"))))
                    continue
                if not isinstance(target, exp.Column) or target.table or target.name.lower() not in outputs:
                    raise InvalidQueryError(f"ORDER BY {quote(o)}: order by output columns only ({', '.join(names)})")
                order.append((outputs[target.name.lower()], bool(o.args.get("desc"))))
        limit = None
        if isinstance(select.args.get("limit"), exp.Fetch):
            raise UnsupportedError("FETCH FIRST in a DP SELECT is not supported: write LIMIT n")
        extra = [k for k, v in (select.args["limit"].args.items() if select.args.get("limit") is not None else ())
                 if v and k != "expression"]
        if extra:  # LIMIT p PERCENT, WITH TIES, LIMIT BY, LIMIT a, b
            raise UnsupportedError(f"{quote(select.args['limit'])} in a DP SELECT is not supported: write LIMIT n "
                                   "(a whole number of released rows)")
        if select.args.get("limit") is not None:
            node = select.args["limit"].expression
            value = number_literal(node, "LIMIT")
            if value < 0 or not value.is_integer():
                raise InvalidQueryError(f"LIMIT must be a whole number >= 0, got {quote(node)}")
            limit = int(value)
        if select.args.get("offset") is not None:
            raise UnsupportedError("OFFSET in a DP SELECT is not supported: use an outer query")
        return tuple(order), limit


#: the clauses of a DP SELECT the compiler reads (each compiled, post-processed or refused there)
DP_SELECT_CLAUSES = ("expressions", "from", "joins", "where", "group", "having", "order", "limit", "offset", "with",
                     "distinct", "hint")


def refuse_unread_clauses(select: exp.Select) -> None:
    """Any other clause of a DP SELECT is refused before anything runs: the compiler would leave it out,
    and it would change which groups or rows are released unseen (QUALIFY was ignored, and the groups
    it should drop released, until 2026-11-29)."""
    for key, value in select.args.items():
        if not value or key.rstrip("_") in DP_SELECT_CLAUSES:
            continue
        clause = key.rstrip("_").upper()
        if key == "qualify":
            raise UnsupportedError("QUALIFY in a DP SELECT is not supported: filter the released values with HAVING, "
                                   "or in an outer query (SELECT ... FROM (SELECT WITH DIFFERENTIAL_PRIVACY ...) WHERE ...)")
        clause = {"windows": "WINDOW", "laterals": "LATERAL VIEW", "kind": f"SELECT AS {value}"}.get(key, clause)
        raise UnsupportedError(f"{clause} in a DP SELECT is not supported (it would change what is released "
                               "unseen by the compiler): write the DP SELECT without it")


def refuse_patterns(select: exp.Select) -> None:
    """A * or COLUMNS(...) that DuckDB expands into columns by itself, in a DP SELECT's list, WHERE, HAVING
    or ORDER BY: the compiler reads each item as one key, aggregate or expression, so what DuckDB
    expands is not what is compiled (a raw binder error, or released columns nobody named, until
    2026-11-29). COUNT(*) is a count."""
    for item in select.expressions:
        stars = [n for n in item.walk(prune=lambda n: is_subquery(n)) if isinstance(n, exp.Star)]
        holders = [n.parent if isinstance(n.parent, exp.Column) else n for n in stars]
        if any(not isinstance(h.parent, exp.Func) for h in holders):  # COUNT(*) is a count; `*`, `* LIKE 'p'` are not
            raise InvalidQueryError(f"{quote(item)[:60]!r} in a DP SELECT list: a DP SELECT releases GROUP BY keys and DP "
                                    "aggregates, each named in its list: name them instead of *")
    for key in ("expressions", "where", "having", "order"):
        value = select.args.get(key)
        for part in value if isinstance(value, list) else [value] if value is not None else []:
            for node in part.walk(prune=lambda n: n is not part and is_subquery(n)):
                modified = isinstance(node, exp.Star) and any(node.args.values())
                if isinstance(node, exp.Columns) or modified:
                    raise InvalidQueryError(
                        f"{quote(node)[:60]!r} in a DP SELECT: a column pattern (COLUMNS(...), * EXCLUDE / REPLACE / "
                        "LIKE ...) stands for columns DuckDB chooses, which the DP SELECT does not follow: name each "
                        "column instead")


def _expand_quantiles(item: exp.Expression, syntax: str) -> exp.Expression:
    """Rewrite APPROX_QUANTILES(x, n, contribution_bounds_per_row => (L, U)) (DIFFERENTIAL_PRIVACY) and
    ANON_QUANTILES(x, n CLAMPED BETWEEN L AND U) (ANONYMIZATION) in place as the array of their n + 1
    quantiles [PERCENTILE_CONT(x, 0/n, ...), ..., PERCENTILE_CONT(x, n/n, ...)]: the reference's output
    (an ARRAY), computed by the engine's quantile aggregate, one budget share each."""
    for node in list(item.walk()):
        name = str(node.name).upper() if isinstance(node, exp.Anonymous) else ""
        if name not in ("__DP_APPROX_QUANTILES", "ANON_QUANTILES"):
            continue
        shown = name.removeprefix("__DP_")
        where = f"{shown}(...)"
        if (name == "ANON_QUANTILES") != (syntax == "anonymization"):
            raise InvalidQueryError(f"{where} belongs to SELECT WITH "
                                    f"{'ANONYMIZATION' if name == 'ANON_QUANTILES' else 'DIFFERENTIAL_PRIVACY'}")
        kwargs = {a.this.name.lower(): a.expression for a in node.expressions if isinstance(a, exp.Kwarg)}
        args = [a for a in node.expressions if not isinstance(a, exp.Kwarg)]
        _check_report_format(kwargs, where, syntax)
        if len(args) != 2:
            raise InvalidQueryError(f"{where}: takes the column and the number of quantiles n, got {len(args)} "
                                    "positional argument(s)")
        if isinstance(args[0], exp.Star):
            raise InvalidQueryError(f"{where}: * is not a value: only COUNT takes *")
        n = number_literal(args[1], f"{where}: the number of quantiles", integer=True)
        if not 1 <= n <= MAX_QUANTILES:
            raise InvalidQueryError(f"{where}: the number of quantiles must be in [1, {MAX_QUANTILES}], got {n:g}")
        bounds = [exp.Kwarg(this=exp.var(k), expression=v.copy()) for k, v in kwargs.items() if k in
                  (("__clamp_lo", "__clamp_hi") if syntax == "anonymization" else ("contribution_bounds_per_row",))]
        unknown = set(kwargs) - {"__clamp_lo", "__clamp_hi", "contribution_bounds_per_row"} - REPORT_ARGUMENTS
        if unknown:
            raise InvalidQueryError(f"{where}: unknown argument(s) {sorted(unknown)}: bounds go in "
                                    + ("CLAMPED BETWEEN L AND U" if syntax == "anonymization"
                                       else "contribution_bounds_per_row => (L, U)"))
        function = "ANON_PERCENTILE_CONT" if syntax == "anonymization" else "__DP_PERCENTILE_CONT"
        quantiles = [exp.Anonymous(this=function, expressions=[args[0].copy(), exp.Literal.number(round(i / n, 12)),
                                                               *[b.copy() for b in bounds]])
                     for i in range(int(n) + 1)]
        array = exp.Array(expressions=quantiles)
        if node is item:
            return array  # unaliased: named _col<position>, as BigQuery names it internally
        node.replace(array)
    return item


def _inner_name(call: exp.Anonymous, used_in: str | None, taken: set[str]) -> str:
    """The name of a DP aggregate used only inside an expression (or HAVING), as a person reads it in
    the budget, the mechanisms and the controller's clamping lines: where it is used and what was
    written, `a (AVG(age))`, `HAVING (COUNT(*))` (bounds left out); a number added if that is taken."""
    args = [a for a in call.expressions if not isinstance(a, exp.Kwarg)]
    function = str(call.name).upper().removeprefix("__DP_")
    shown = args[:2] if function in ("PERCENTILE_CONT", "ANON_PERCENTILE_CONT", "ANON_NTILE") else args[:1]
    written = f"{function}({', '.join(quote(a) for a in shown)})"
    base = f"{used_in} ({written})" if used_in else written
    name, n = base, 1
    while name.lower() in taken:
        n += 1
        name = f"{base} #{n}"
    taken.add(name.lower())
    return name


def _key_text(node: exp.Expression) -> str:
    """An expression's SQL with unquoted names lower-cased (GROUP BY STRING is the key `string`)."""
    copy = node.copy()
    for ident in copy.find_all(exp.Identifier):
        if not ident.args.get("quoted"):
            ident.set("this", ident.this.lower())
    return quote(copy)


def mark_of_item(item: exp.Expression) -> int | None:
    inner = _inner(item)
    if isinstance(inner, exp.Anonymous) and str(inner.name).lower().startswith("__dpmark_"):
        return 0
    return None


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


__all__ = ["CompiledQuery", "Compiler", "mark_of"]
