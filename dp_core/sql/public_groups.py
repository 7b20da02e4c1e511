"""OPTIONS (group_selection_strategy = PUBLIC_GROUPS): the groups of a DP SELECT come from public data.

    SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (group_selection_strategy = PUBLIC_GROUPS)
           dept, COUNT(*) AS n
    FROM people RIGHT OUTER JOIN (SELECT DISTINCT dept FROM depts) USING (dept)
    GROUP BY dept

BigQuery's rule (the reference's documentation of `group_selection_strategy`): the GROUP BY columns
are columns of a *public-groups subquery*, `SELECT DISTINCT ...` (or a GROUP BY of all its columns)
over public tables only, outer-joined so that its rows are kept (RIGHT JOIN with it on the right,
LEFT JOIN with it first). Every group it lists is released, also those no unit has rows in (their
values are pure noise), and no other group: no selection threshold is needed, because which
groups appear depends on public data only.

Here it maps onto the engine's public partitions (`Query.public_partitions`):
- the source joins the protected rows with the public-groups subquery as an INNER join (the rows
  the outer join would add for empty groups have no unit and hold nothing to aggregate; the empty
  groups come back as public partitions);
- `public_groups_sql` selects the distinct key tuples from the public-groups subqueries alone
  (several such subqueries: every combination of their keys); it reads public tables only, so it
  is run at execution time, before the engine, without spending anything;
- budget: with public partitions the engine spends no epsilon on selection: the DP SELECT's whole
  epsilon goes to its aggregates (accounting.plan_budget), and delta only to Gaussian noise. The
  ledger is charged the DP SELECT's (epsilon, delta) share as for any DP SELECT (a delta no
  mechanism uses is charged too: conservative). The release names the selection "public groups
  (N keys read from public tables ...; no selection)".
"""

from __future__ import annotations

from sqlglot import exp

from ..errors import DPError, InvalidQueryError
from . import unit_keys
from .ownership import OwnershipChecker, Scope, _arg
from .syntax import quote

STRATEGY = "public-groups"
RULE = ("OPTIONS group_selection_strategy = PUBLIC_GROUPS needs each GROUP BY column to be a column of a "
        "public-groups subquery: (SELECT DISTINCT cols FROM <public table>) outer-joined to the protected rows "
        "(RIGHT JOIN (SELECT DISTINCT ...) or (SELECT DISTINCT ...) LEFT JOIN ...)")


def _is_distinct_query(node: exp.Expression) -> bool:
    """SELECT DISTINCT, or a GROUP BY without aggregates (its rows are distinct too)."""
    if not isinstance(node, exp.Select):
        return False
    if node.args.get("distinct") is not None:
        return True
    group = node.args.get("group")
    if group is None or any(isinstance(n, exp.AggFunc) for e in node.expressions for n in e.walk()):
        return False
    selected = {quote(e.this if isinstance(e, exp.Alias) else e) for e in node.expressions}
    # names a GROUP BY column may match, without regard to case as SQL does: aliases, unqualified columns
    names = {e.alias.lower() for e in node.expressions if isinstance(e, exp.Alias)}
    names |= {e.name.lower() for e in node.expressions if isinstance(e, exp.Column) and not e.table and e.name}
    return all(quote(k) in selected or (isinstance(k, exp.Column) and k.name.lower() in names)
               for k in group.expressions)  # GROUP BY a, b with a dropped from the list: rows repeat


def _public_groups_relation(node: exp.Expression, checker: OwnershipChecker) -> bool:
    """A subquery in FROM that lists public groups: distinct rows of public tables only."""
    if not isinstance(node, exp.Subquery) or not _is_distinct_query(node.this):
        return False
    try:
        rel = checker.query(node.this.copy(), "public groups")
    except DPError:
        return False  # not a public query: the ordinary checks report it
    return rel.unit is None


def _make_inner(join: exp.Join) -> None:
    join.set("side", None)
    if (join.args.get("kind") or "").upper() == "OUTER":
        join.set("kind", None)


def _nested(select: exp.Select, checker: OwnershipChecker) -> list[exp.Subquery]:
    """`FROM (SELECT uid, string AS s FROM t RIGHT JOIN (SELECT DISTINCT ...) USING (string))`: the
    public-groups join one subquery down, under a projection of plain columns only (the reference
    refuses anything else between the join and the aggregation). Each group subquery gets
    `renamed`: output name -> the inner column it selects."""
    source = _arg(select, "from")
    inner = source.this.this if isinstance(source.this, exp.Subquery) else None
    if select.args.get("joins") or not isinstance(inner, exp.Select):
        return []
    groups = prepare(inner, checker)
    if not groups:
        return []
    extra = [k for k in ("where", "group", "having", "order", "limit", "offset", "distinct", "qualify")
             if inner.args.get(k) is not None] + (["TABLESAMPLE"] if source.this.args.get("sample") else [])
    plain = all(isinstance(e.this if isinstance(e, exp.Alias) else e, exp.Column) for e in inner.expressions)
    if extra or not plain or (isinstance(inner.args.get("from"), exp.From) and inner.args["from"].this.args.get("sample")):
        raise InvalidQueryError(
            "OPTIONS group_selection_strategy = PUBLIC_GROUPS does not allow operations between the public groups "
            f"join and the aggregation ({', '.join(extra) or 'a computed column'} in {quote(inner)[:60]!r}): "
            "select plain columns there, or join the public groups in the DP SELECT itself")
    renamed = {}
    for e in inner.expressions:
        column = e.this if isinstance(e, exp.Alias) else e
        renamed[e.alias_or_name.lower()] = column
    for g in groups:
        g.meta["renamed"] = renamed
    return groups


def prepare(select: exp.Select, checker: OwnershipChecker) -> list[exp.Subquery]:
    """Find the public-groups subqueries of a DP SELECT's FROM (a copy, changed in place): their
    outer joins become inner joins, each gets an alias. Returns them in FROM order."""
    source = _arg(select, "from")
    if source is None:
        return []
    joins = select.args.get("joins") or []
    items = [source.this] + [j.this for j in joins]
    groups = []
    positions = [at for at, node in enumerate(items) if _public_groups_relation(node, checker)]
    if not positions:
        return _nested(select, checker)
    if positions:
        # the reference's rule: nothing between the public-groups join and the aggregation (a filter
        # or another join there could suppress public groups in its rewriting)
        after = max(positions[0], 1)
        others = [items[at] for at in range(after + (positions[0] == 0), len(items)) if at not in positions]
        if others:
            raise InvalidQueryError(
                f"OPTIONS group_selection_strategy = PUBLIC_GROUPS does not allow JOIN operations between the public "
                f"groups join and the aggregation ({quote(others[0])[:60]!r}): join it inside a subquery of the "
                "protected side instead")
        if select.args.get("where") is not None:
            raise InvalidQueryError(
                "OPTIONS group_selection_strategy = PUBLIC_GROUPS does not allow WHERE between the public groups join "
                "and the aggregation: filter the protected rows inside a subquery instead")
    for at in positions:
        node = items[at]
        # its join, as written, may not read the unit (unit_keys.refuse_unit_join)
        node.meta[unit_keys.PUBLIC_GROUPS] = quote(joins[at - 1] if at > 0 else joins[0]) if joins else ""
        if not node.alias:
            node.set("alias", exp.TableAlias(this=exp.to_identifier(f"__public_groups_{at}")))
        groups.append(node)
        if at > 0 and (joins[at - 1].args.get("side") or "").upper() == "RIGHT":
            _make_inner(joins[at - 1])  # the public groups come back as public partitions
        elif at == 0 and joins and (joins[0].args.get("side") or "").upper() == "LEFT":
            _make_inner(joins[0])
    return groups


def group_keys_sql(keys: list[exp.Expression], key_names: list[str], groups: list[exp.Subquery], scope: Scope,
                   with_items: list[exp.Expression], checker: OwnershipChecker) -> tuple[str | None, tuple[str, ...]]:
    """The SQL (DuckDB) of the distinct public key tuples, and the public tables it reads; each
    GROUP BY key must be a column of a public-groups subquery. (None, ()) when the DP SELECT has no
    GROUP BY (one partition: nothing to list)."""
    if not keys:
        return None, ()
    if not groups:
        raise InvalidQueryError(f"{RULE}; this DP SELECT joins none")
    aliases = {g.alias.lower(): g for g in groups}
    columns, used = [], []
    for key, name in zip(keys, key_names):
        if not isinstance(key, exp.Column):
            raise InvalidQueryError(f"GROUP BY {quote(key)}: {RULE}; an expression is not such a column")
        rel, column = scope.resolve(key)
        owner = None
        renamed = groups[0].meta.get("renamed")
        if renamed is not None:  # one subquery down: its output column names the group subquery's column
            inner = renamed.get(column.lower())
            owner = inner is not None and next(
                (g for g in groups if (not inner.table or inner.table.lower() == g.alias.lower())
                 and inner.name.lower() in {e.alias_or_name.lower() for e in g.this.expressions}), None)
            if not owner:
                raise InvalidQueryError(f"GROUP BY {quote(key)}: {RULE}; {quote(key)!r} comes from another relation")
            column = inner.name
        elif rel is not None and rel.alias.lower() in aliases:
            owner = aliases[rel.alias.lower()]
        elif rel is None:  # a USING column: the public-groups side of the join holds it
            owner = next((g for g in groups if any(r.alias.lower() == g.alias.lower() and r.has(column)
                                                   for r in scope.relations)), None)
        if owner is None:
            raise InvalidQueryError(f"GROUP BY {quote(key)}: {RULE}; {quote(key)!r} comes from another relation")
        columns.append(exp.alias_(exp.column(column, table=owner.alias, quoted=True), name, quoted=True))
        if owner not in used:
            used.append(owner)
    query = exp.select(*columns).from_(used[0].copy())
    for extra in used[1:]:
        query = query.join(extra.copy(), join_type="cross")
    query = query.distinct()
    if with_items:
        query.set("with_" if "with_" in exp.Select.arg_types else "with",
                  exp.With(expressions=[w.copy() for w in with_items]))
    return query.sql("duckdb"), checker.public_tables_in(query)


__all__ = ["RULE", "STRATEGY", "group_keys_sql", "prepare"]
