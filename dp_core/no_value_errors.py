"""Row-level expressions that cannot fail on a value of the data: a DP SELECT's source, a row filter.

Why. DuckDB stops a whole query when one row's value does not fit an expression: a cast that does
not parse (`CAST(note AS INTEGER)` over 'x'), an overflow (`age::TINYINT * 100`), a date, a regular
expression or a JSON text that does not parse. Whether the query fails then depends on one person's
row, and an analyst can aim it: `CAST(CASE WHEN name = 'Alice' AND salary > 1e5 THEN 'x' ELSE '1' END
AS INTEGER)` fails exactly when Alice earns more. The failure's words carry no value
(dp_core.engine_errors), but the failure itself is a raw-derived fact that reaches the analyst
without an approval and without noise (the platform shows the release Failed and refunds it),
one bit per request, as often as asked. No delta covers it: it is certain, not rare.

What. Every row-level expression the analyst wrote in the source (select items of the DP SELECT's
FROM subqueries and CTEs, WHERE, join conditions, GROUP BY keys, HAVING over per-unit groups,
aggregate arguments) is evaluated under DuckDB's TRY: a value that does not fit becomes NULL, as
TRY_CAST does, so the row is filtered out, lands in the NULL group or is skipped by the aggregate.
Each row's result is still a function of that row alone, so the per-unit bounds and every
sensitivity are unchanged; a query with no failing value computes exactly what it did before.
Post-processing too (a DP SELECT's expressions over its aggregates, its HAVING, the outer query over
the released tables): a cast of a noisy count that fails when the noise pushes it past 127 made the
failure (refunded, seen by the analyst) a free noisy sample, as often as asked.

TRY cannot hold an aggregate, a subquery, a window or a volatile function (DuckDB's binder refuses
them): such an expression is not wrapped whole; its parts are, down to the pieces TRY can hold.
An aggregate that overflows itself cannot be held either: a SUM or AVG inside a per-unit subquery
is refused by its argument's type when that type can overflow (refuse_overflowing_sums, from the
binding over empty stand-ins: HUGEINT, DECIMAL over 18 digits, INTERVAL). The Spark backend,
which has no TRY, replaces each guard by its content in never-failing Spark forms
(spark_no_value_errors.py)."""

from __future__ import annotations

from sqlglot import exp

from .errors import InvalidQueryError

#: the nodes that compute a value from their arguments, and so may fail on one
COMPUTING = (exp.Func, exp.Binary, exp.Unary, exp.Predicate, exp.Bracket, exp.Dot)
#: boolean connectives, which cannot fail themselves: their operands are guarded, not the whole
CONNECTIVES = (exp.And, exp.Or, exp.Not)
#: what TRY may not hold (DuckDB's binder: aggregates, subqueries, windows, volatile functions, UNNEST), and
#: the calls sqlglot does not know, which the checks let through only as the engine's own (a DP aggregate,
#: the sample placeholder that sql/sample.render replaces by its decision)
NOT_IN_TRY = (exp.AggFunc, exp.Query, exp.Subquery, exp.Exists, exp.Window, exp.Rand, exp.Randn, exp.Uuid,
              exp.Unnest, exp.Explode, exp.Try, exp.Star, exp.Anonymous)
#: a clause of a SELECT whose expressions are evaluated row by row (or per group, for HAVING)
ROW_CLAUSES = ("where", "having")


def quote_start(select: exp.Expression) -> str:
    """The start of a SELECT as written, to name it in a refusal."""
    text = select.sql("duckdb")
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _may_hold(node: exp.Expression) -> bool:
    """TRY(node) binds: nothing inside it is one of NOT_IN_TRY."""
    return node.find(*NOT_IN_TRY) is None


def guarded(node: exp.Expression) -> exp.Expression:
    """`node` with its largest computing parts that TRY may hold wrapped in TRY; columns and
    literals as they are; a query inside it is left to its own SELECTs (never_failing)."""
    if isinstance(node, (exp.Query, exp.Subquery)):
        return node
    if isinstance(node, exp.Window):  # TRY cannot hold the window's function: its arguments, keys and order
        _guard_inside(node.this)
        for key in ("partition_by", "order"):
            if node.args.get(key) is not None:
                node.set(key, guarded(node.args[key]) if isinstance(node.args[key], exp.Expression)
                         else [guarded(v) for v in node.args[key]])
        return node
    if isinstance(node, CONNECTIVES):  # TRY(a) AND TRY(b): each conjunct stays a filter DuckDB can push down
        _guard_inside(node)
        return node
    if isinstance(node, COMPUTING) and not isinstance(node, exp.Paren) and _may_hold(node):
        return exp.Try(this=node)
    _guard_inside(node)
    return node


def unguarded(tree: exp.Expression) -> exp.Expression:
    """`tree` without the TRY guards `never_failing` adds, as it was written (to quote it in a refusal)."""
    return tree.transform(lambda node: node.this if isinstance(node, exp.Try) else node)


def guarded_join_condition(node: exp.Expression) -> exp.Expression:
    """A join's ON guarded as `guarded` does, except that each AND-ed equality stays an equality of
    two sides, each guarded on its own: TRY(a.k = b.k) whole is no join key, and DuckDB then joined
    by a nested loop over every pair of rows (22 s for 200,000 x 200,000 rows against 0.01 s by
    hash). The comparison itself converts a side only when the two types differ: refused by
    refuse_converting_join_keys."""
    if isinstance(node, exp.Paren):
        node.set("this", guarded_join_condition(node.this))
        return node
    if isinstance(node, exp.And):
        node.set("this", guarded_join_condition(node.this))
        node.set("expression", guarded_join_condition(node.expression))
        return node
    if isinstance(node, exp.EQ):
        node.set("this", guarded(node.this))
        node.set("expression", guarded(node.expression))
        return node
    return guarded(node)


def _guard_inside(node: exp.Expression) -> None:
    """`node`'s arguments guarded in place, `node` itself left as it is."""
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            node.set(key, guarded(value))
        elif isinstance(value, list):
            node.set(key, [guarded(v) if isinstance(v, exp.Expression) else v for v in value])


def _guard_select(select: exp.Select) -> None:
    """One SELECT's row-level expressions guarded in place (its list, WHERE, HAVING, GROUP BY keys and
    join conditions); the same rule everywhere, so a GROUP BY key still matches its select item."""
    items = []
    for item in select.expressions:
        if isinstance(item, exp.Alias):
            item.set("this", guarded(item.this))
            items.append(item)
        elif isinstance(item, COMPUTING) and _may_hold(item):
            # an unnamed computed item keeps the name DuckDB gives it (its SQL text): TRY would rename it
            items.append(exp.alias_(guarded(item.copy()), item.sql("duckdb"), quoted=True))
        else:
            items.append(guarded(item))
    select.set("expressions", items)
    for clause in ROW_CLAUSES:
        holder = select.args.get(clause)
        if holder is not None:
            holder.set("this", guarded(holder.this))
    group = select.args.get("group")
    if group is not None:
        group.set("expressions", [guarded(e) for e in group.expressions])
    order = select.args.get("order")
    if order is not None:  # ORDER BY of an outer query (over protected rows a subquery has none)
        for ordered in order.expressions:
            ordered.set("this", guarded(ordered.this))
    for join in select.args.get("joins") or []:
        if join.args.get("on") is not None:
            join.set("on", guarded_join_condition(join.args["on"]))


#: a SELECT's parts the split below does not carry to its outer SELECT (it leaves such a SELECT as it is)
UNSPLIT = ("qualify", "windows", "kind", "into", "locks", "sample", "prewhere",
           "connect", "match", "laterals", "cluster", "distribute", "sort", "settings", "format", "exclude")


def _aggregates_in(node: exp.Expression) -> list[exp.AggFunc]:
    """The outermost aggregate calls of `node` (not those of a subquery's or a window's)."""
    found = []
    for inner in node.walk(prune=lambda n: isinstance(n, (exp.AggFunc, exp.Query, exp.Subquery, exp.Window))):
        if isinstance(inner, exp.AggFunc):
            found.append(inner)
    return found


def _computes_over_aggregates(select: exp.Select) -> bool:
    """Some item or HAVING computes with an aggregate's result (`CAST(MAX(x) AS INT)`, `SUM(x) > 5`):
    TRY cannot hold that computation where the aggregate is, so the SELECT is split (below)."""
    parts = [*select.expressions, *([select.args["having"].this] if select.args.get("having") else [])]
    for part in parts:
        top = part.this if isinstance(part, exp.Alias) else part
        for node in top.walk(prune=lambda n: isinstance(n, (exp.AggFunc, exp.Query, exp.Subquery, exp.Window))):
            if isinstance(node, COMPUTING) and not isinstance(node, (exp.AggFunc, exp.Paren)) and _aggregates_in(node):
                return True
    return False


def _split(select: exp.Select) -> exp.Select | None:
    """An aggregating SELECT that computes with its aggregates' results, as two: the inner one
    computes its GROUP BY keys and aggregates (`__dp_key<j>`, `__dp_agg<i>`), the outer one the items
    and HAVING over them, under TRY, with the same output names:

        SELECT uid, CAST(MAX(x) AS INT) AS m FROM t GROUP BY uid HAVING SUM(y) > 5
        -> SELECT __dp_key0 AS uid, TRY(CAST(__dp_agg0 AS INT)) AS m
           FROM (SELECT uid AS __dp_key0, MAX(x) AS __dp_agg0, SUM(y) AS __dp_agg1 FROM t GROUP BY uid)
           WHERE TRY(__dp_agg1 > 5)

    The same rows and values when nothing fails. None when the SELECT holds what the split does not
    carry (ORDER BY, a window, GROUP BY ROLLUP, ...; never_failing then refuses it). `select` becomes
    the inner SELECT; the outer one takes its place in the tree and is returned."""
    group = select.args.get("group")
    if any(select.args.get(k) for k in UNSPLIT) or (group is not None and any(
            v for k, v in group.args.items() if k != "expressions")):
        return None
    items = list(select.expressions)
    if any(isinstance(i, exp.Star) or (isinstance(i, exp.Column) and isinstance(i.this, exp.Star)) for i in items):
        return None
    keys = []
    for key in (group.expressions if group is not None else []):
        if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.this) <= len(items):  # GROUP BY 2
            key = items[int(key.this) - 1]
            key = key.this if isinstance(key, exp.Alias) else key
        if (isinstance(key, exp.Column) and not key.table and
                any(isinstance(i, exp.Alias) and i.alias.lower() == key.name.lower() for i in items)):
            return None  # a key that may name a select item: which one DuckDB reads is its binder's choice
        keys.append(key.copy())
    key_sql = [k.sql("duckdb") for k in keys]
    key_names = {k.name.lower(): j for j, k in enumerate(keys) if isinstance(k, exp.Column)}
    aggregates: list[exp.Expression] = []
    agg_sql: list[str] = []

    def over_inner(node: exp.Expression) -> exp.Expression:
        """`node` (a copy of an item or of HAVING) reading the inner SELECT's columns."""
        for agg in _aggregates_in(node):
            text = agg.sql("duckdb")
            if text not in agg_sql:
                agg_sql.append(text)
                aggregates.append(agg.copy())
            column = exp.column(f"__dp_agg{agg_sql.index(text)}")
            if agg is node:
                return column
            agg.replace(column)

        def as_key(n: exp.Expression) -> exp.Expression:
            if n.sql("duckdb") in key_sql:
                return exp.column(f"__dp_key{key_sql.index(n.sql('duckdb'))}")
            if isinstance(n, exp.Column) and not n.name.startswith("__dp_") and n.name.lower() in key_names:
                return exp.column(f"__dp_key{key_names[n.name.lower()]}")
            return n
        return node.transform(as_key, copy=False)

    outer_items = []
    for item in items:
        inner = item.this if isinstance(item, exp.Alias) else item
        name = item.args["alias"].copy() if isinstance(item, exp.Alias) else exp.to_identifier(
            inner.name if isinstance(inner, exp.Column) else inner.sql("duckdb"), quoted=True)
        outer_items.append(exp.Alias(this=over_inner(inner.copy()), alias=name))
    having = select.args.get("having")
    condition = over_inner(having.this.copy()) if having is not None else None
    order = select.args.get("order")  # an outer query's ORDER BY: over the items' names, keys, aggregates
    order = order.copy() if order is not None else None
    names = {i.alias_or_name.lower() for i in outer_items}
    for ordered in order.expressions if order is not None else []:
        if not (isinstance(ordered.this, exp.Column) and not ordered.this.table and ordered.name.lower() in names):
            ordered.set("this", over_inner(ordered.this))
    for part in [*outer_items, *([condition] if condition is not None else []),
                 *(order.expressions if order is not None else [])]:
        if any(not c.name.startswith("__dp_") and not (isinstance(part, exp.Ordered) and c.name.lower() in names)
               for c in part.find_all(exp.Column) if not c.find_ancestor(exp.Query, exp.Subquery)):
            return None  # a column that is neither a key nor inside an aggregate
    outer = exp.Select(expressions=outer_items, distinct=select.args.get("distinct"))
    if condition is not None:
        outer.set("where", exp.Where(this=condition))
    for arg in ("limit", "offset"):  # an outer query's LIMIT and OFFSET: after the ORDER BY, as before
        if select.args.get(arg) is not None:
            outer.set(arg, select.args[arg])
            select.set(arg, None)
    if order is not None:
        outer.set("order", order)
        select.set("order", None)
    with_clause = select.args.get("with_") or select.args.get("with")
    select.set("expressions", [exp.alias_(k, f"__dp_key{j}") for j, k in enumerate(keys)]
               + [exp.alias_(a, f"__dp_agg{i}") for i, a in enumerate(aggregates)])
    for arg in ("having", "distinct", "with_", "with"):
        if arg in select.args:
            select.set(arg, None)
    if group is not None:
        group.set("expressions", [k.copy() for k in keys])
    select.replace(outer)
    outer.set("from_" if "from_" in exp.Select.arg_types else "from",
              exp.From(this=exp.Subquery(this=select, alias=exp.TableAlias(this=exp.to_identifier("__dp_grouped")))))
    if with_clause is not None:
        outer.set("with_" if "with_" in exp.Select.arg_types else "with", with_clause)
    return outer


def never_failing(source: exp.Expression) -> exp.Expression:
    """A copy of a DP SELECT's source whose row-level expressions turn a value they cannot compute
    into NULL instead of failing the query (the module's docstring says why)."""
    source = source.copy()
    for select in list(source.find_all(exp.Select)):
        if _computes_over_aggregates(select):
            outer = _split(select)
            if outer is None:
                raise InvalidQueryError(
                    f"{quote_start(select)}: a SELECT that computes with its aggregates' results (a cast, arithmetic "
                    "or a comparison over MAX(...), SUM(...)) must group by columns or expressions (no window, ROLLUP, "
                    "QUALIFY, or key named by a select alias) so that the computation cannot fail on a value; compute "
                    "it in a SELECT around this one instead")
            _guard_select(outer)
            source = outer if select is source else source
        _guard_select(select)
    for operation in source.find_all(exp.Union, exp.Intersect, exp.Except):  # `... UNION ... ORDER BY <expr>`
        if operation.args.get("order") is not None:
            for ordered in operation.args["order"].expressions:
                ordered.set("this", guarded(ordered.this))
    return source


#: aggregates that only pick, count or collect their rows' values: they compute nothing that overflows
PICKING = (exp.Count, exp.Min, exp.Max, exp.AnyValue, exp.First, exp.Last, exp.ArrayAgg, exp.GroupConcat,
           exp.ArgMax, exp.ArgMin, exp.LogicalAnd, exp.LogicalOr, exp.ApproxDistinct)
#: argument types that an aggregate's own arithmetic can overflow on: DuckDB adds integers of up to
#: 64 bits and decimals of up to 18 digits in HUGEINT (2^63 rows could not overflow it), floats in
#: DOUBLE (inf), but HUGEINT, UHUGEINT and wider decimals in their own type, and an INTERVAL's months
#: in 32 bits (AVG), or converts them (MEDIAN of months)
OVERFLOWING_TYPES = ("HUGEINT", "UHUGEINT", "INTERVAL")


def _can_overflow(kind: str) -> bool:
    upper = kind.upper()
    if upper.startswith("DECIMAL(") and upper.endswith(")"):
        return int(upper[len("DECIMAL("):].split(",")[0]) > 18
    return upper in OVERFLOWING_TYPES


def _described(select: exp.Select, expressions: list, source: exp.Expression, describe, dropped: tuple,
               from_: exp.Expression | None = None, joins: list | None = None) -> list | None:
    """[(name, type)] of `expressions` evaluated in `select`'s FROM and joins (or in `from_` and
    `joins` given instead), its `dropped` clauses, ORDER BY, LIMIT, DISTINCT and QUALIFY left out,
    bound over empty stand-ins by `describe`; None when DuckDB cannot bind that probe alone (the
    statement's own binding, check_executable, then says why)."""
    probe = select.copy()
    probe.set("expressions", [e.copy() for e in expressions])
    if from_ is not None:
        probe.set("from_" if "from_" in exp.Select.arg_types else "from", exp.From(this=from_.copy()))
    if joins is not None:
        probe.set("joins", [j.copy() for j in joins])
    for arg in (*dropped, "distinct", "order", "limit", "qualify"):
        if arg in probe.args:
            probe.set(arg, None)
    with_clause = source.args.get("with_") or source.args.get("with")
    if with_clause is not None and select is not source and not (probe.args.get("with_") or probe.args.get("with")):
        probe.set("with_" if "with_" in exp.Select.arg_types else "with", with_clause.copy())
    try:
        return describe(probe.sql("duckdb"))
    except Exception:  # noqa: BLE001 - DuckDB's binder, catalog and parser errors
        return None


def _types_of(select: exp.Select, expressions: list, source: exp.Expression, describe, dropped: tuple) -> list | None:
    """The types of `expressions` in `select`'s FROM (_described), in order; None when not bound."""
    described = _described(select, [exp.alias_(e.copy(), f"__dp_probe{i}") for i, e in enumerate(expressions)],
                           source, describe, dropped)
    return None if described is None else [kind for _, kind in described]


def refuse_overflowing_sums(source: exp.Expression, describe) -> None:
    """An aggregate inside a per-unit subquery of `source` (never_failing's output) that computes with
    its argument (SUM, AVG, MEDIAN, ...: not MIN, MAX, COUNT) over a type it can overflow on (HUGEINT,
    UHUGEINT, DECIMAL over 18 digits, INTERVAL) is refused by that type: TRY cannot hold an aggregate,
    so it would fail the whole release on one person's values (two of her rows near 10^38).
    `describe(sql)` -> [(column, type)] binds a query over the tables' empty stand-ins (no row is
    read); a probe DuckDB cannot bind alone is left to the query's own binding."""
    for select in source.find_all(exp.Select):
        calls = [a for part in select.expressions for a in _aggregates_in(part)
                 if not isinstance(a, PICKING) and isinstance(a.this, exp.Expression) and not isinstance(a.this, exp.Star)]
        if not calls:
            continue
        types = _types_of(select, [c.this for c in calls], source, describe, ("group", "having"))
        if types is None:
            continue
        for call, kind in zip(calls, types):
            if _can_overflow(kind):
                written = unguarded(call)  # as the analyst wrote it
                name = call.sql_name() if hasattr(call, "sql_name") else call.key.upper()
                raise InvalidQueryError(
                    f"{quote_start(written)}: {name} over {kind} values inside a subquery can overflow on one "
                    f"person's values, which would fail the release on them: compute it over DOUBLE "
                    f"({name}(CAST(... AS DOUBLE))), or over BIGINT if the values fit")


#: type families within which DuckDB's comparison converts without failing: integers widen to a
#: wider integer (UBIGINT with a signed one to HUGEINT), any number to DOUBLE
INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT")
FLOATS = ("FLOAT", "DOUBLE")


def _compares_without_converting(left: str, right: str) -> bool:
    """Comparing a `left` with a `right` cannot fail on a value: the same type, an untyped NULL
    column, two integers, or a float with a number (DuckDB compares them as DOUBLE)."""
    left, right = left.upper().strip('"'), right.upper().strip('"')
    numbers = INTEGERS + FLOATS
    return (left == right or "NULL" in (left, right) or (left in INTEGERS and right in INTEGERS)
            or (left in FLOATS and (right in numbers or right.startswith("DECIMAL")))
            or (right in FLOATS and (left in numbers or left.startswith("DECIMAL"))))


def _outside_guards(node: exp.Expression, top: exp.Expression) -> bool:
    """`node`, inside `top`, is under no TRY and in no subquery of `top`."""
    while node is not top and node is not None:
        node = node.parent
        if isinstance(node, (exp.Try, exp.Query, exp.Subquery)):
            return False
    return True


def _refuse_converting_named_columns(select: exp.Select, n: int, source: exp.Expression, describe) -> None:
    """The n-th join of `select`, when it is USING (...) or NATURAL: each column it equates, by
    name, must compare without converting (DuckDB casts a VARCHAR to the other side's BIGINT row by
    row there too, outside any TRY)."""
    join = select.args["joins"][n]
    using = join.args.get("using")
    if not using and (join.args.get("method") or "").upper() != "NATURAL":
        return
    clauses, star = ("where", "group", "having"), [exp.Star()]
    left = _described(select, star, source, describe, clauses, joins=select.args["joins"][:n])
    right = _described(select, star, source, describe, clauses, from_=join.this, joins=[])
    # each name's first column (reversed: the first written last wins); {} when not bound alone
    left, right = ({name.lower(): kind for name, kind in reversed(found or [])} for found in (left, right))
    names = [u.name.lower() for u in using] if using else [c for c in right if c in left]
    for name in names:
        if name in left and name in right and not _compares_without_converting(left[name], right[name]):
            raise InvalidQueryError(
                f"{quote_start(unguarded(join.copy()))}: a join's USING/NATURAL compares column {name} as a "
                f"{left[name]} with a {right[name]}, which DuckDB converts row by row and which fails the release "
                f"on one person's value that does not convert; join ON with one side cast yourself "
                f"(ON CAST(... AS {right[name]}) = ...: a value that does not convert is then NULL)")


def refuse_converting_join_keys(source: exp.Expression, describe) -> None:
    """A join's equality (ON ... a = b ...) between two types DuckDB converts row by row to compare
    (a VARCHAR with a BIGINT: the text is cast, and fails on 'x') is refused by the two types, before
    any row is read: the comparison stays outside TRY so that it stays a hash join's key
    (guarded_join_condition). `describe(sql)` as for refuse_overflowing_sums."""
    for select in source.find_all(exp.Select):
        for n, join in enumerate(select.args.get("joins") or []):
            _refuse_converting_named_columns(select, n, source, describe)
            condition = join.args.get("on")
            equalities = [e for e in (condition.find_all(exp.EQ) if condition is not None else [])
                          if _outside_guards(e, condition)]
            if not equalities:
                continue
            sides = [side for e in equalities for side in (e.this, e.expression)]
            types = _types_of(select, sides, source, describe, ("where", "group", "having"))
            if types is None:
                continue
            for i, equality in enumerate(equalities):
                left, right = types[2 * i], types[2 * i + 1]
                if not _compares_without_converting(left, right):
                    written = unguarded(equality.copy())
                    raise InvalidQueryError(
                        f"{quote_start(written)}: a join's ON compares a {left} with a {right}, which DuckDB converts row "
                        f"by row and which fails the release on one person's value that does not convert; cast one "
                        f"side yourself (CAST(... AS {right}): a value that does not convert is then NULL)")


__all__ = ["guarded", "guarded_join_condition", "never_failing", "refuse_converting_join_keys",
           "refuse_overflowing_sums", "unguarded"]
