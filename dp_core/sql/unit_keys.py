"""Which columns and expressions spell the privacy unit, so that grouping by the unit is refused
however it is written (BigQuery's rule: a DP SELECT may not GROUP BY its privacy unit column).

A grouping key is the unit when, once parentheses and casts are taken off, it is a column that
holds the unit's value on every row:
- a unit column itself (by name, qualified, quoted, in another case, by its select-list alias or its
  GROUP BY position);
- a copy of it made in a subquery or CTE (`uid AS x`, `(uid) AS x`, `CAST(uid AS VARCHAR) AS x`,
  also through a `*` over such rows);
- a column equated to one of those by an AND-ed term of a join condition (`ON p.uid = ids.id`), a
  USING / NATURAL join, or the WHERE clause (`WHERE p.uid = ids.id`): a public list of unit ids
  joined on the unit, with or without PUBLIC_GROUPS.
A key merely computed from the unit (`uid % 10`) is not the unit: partition selection releases only
the groups enough units share. With PUBLIC_GROUPS there is no selection, so a public-groups join
whose condition reads the unit at all is refused too (refuse_unit_join).

Keys are (relation alias, column), both lower case; a USING-merged column is ("", column).
"""

from __future__ import annotations

from sqlglot import exp

from ..errors import DPError, InvalidQueryError
from .syntax import quote

#: meta key of a public-groups subquery (public_groups.prepare): its join may not read the unit
PUBLIC_GROUPS = "dp_public_groups"


def unit_key_refusal(written: str, how: str = "") -> InvalidQueryError:
    """The one refusal of a grouping key that is the privacy unit, whatever its spelling; `how`: how the
    key written is the unit (a position, an alias, a copy, a join), said with the remedy."""
    if not how:
        return InvalidQueryError(f"GROUP BY {written}: grouping by the privacy unit would publish one row per unit")
    return InvalidQueryError(f"GROUP BY {written}: grouping by the privacy unit would publish one row per unit ({how}); "
                             "group by other columns")


def bare(expr: exp.Expression) -> exp.Expression:
    """The expression without the parentheses, aliases and casts around it: `CAST((uid) AS TEXT)` is uid."""
    while isinstance(expr, (exp.Paren, exp.Alias, exp.Cast)):
        expr = expr.this
    return expr


def column_equalities(condition: exp.Expression | None) -> list[tuple[exp.Column, exp.Column]]:
    """The pairs of columns an AND-ed term `a = b` of `condition` equates (parentheses and casts off)."""
    if condition is None:
        return []
    while isinstance(condition, exp.Paren):
        condition = condition.this
    if isinstance(condition, exp.And):
        return column_equalities(condition.this) + column_equalities(condition.expression)
    if isinstance(condition, exp.EQ):
        a, b = bare(condition.this), bare(condition.expression)
        if isinstance(a, exp.Column) and isinstance(b, exp.Column):
            return [(a, b)]
    return []


Key = tuple[str, str]


def closure(seeds: set[Key], equalities: list[tuple[Key, Key]]) -> set[Key]:
    """Every key equal to a seed through the equalities (each equality read both ways)."""
    found = set(seeds)
    changed = True
    while changed:
        changed = False
        for a, b in equalities:
            if (a in found) != (b in found):
                found |= {a, b}
                changed = True
    return found


def reads_column(expr: exp.Expression | None, test) -> exp.Column | None:
    """The first column of `expr` for which `test(column)` holds (subqueries are not entered), or None."""
    if expr is None:
        return None
    for node in expr.walk(prune=lambda n: n is not expr and isinstance(n, (exp.Subquery, exp.Query))):
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star) and test(node):
            return node
    return None


def refuse_unit_join(join: exp.Join, scope, written: str) -> None:
    """A public-groups join (just checked into `scope`; `written`: its text as the analyst wrote it)
    whose condition reads the privacy unit, or a copy of it (`ON people.uid = g.id`, `ON people.uid + 0
    = g.id`, USING (uid)): the public list is one of unit ids, and each group it lists would be one
    unit's rows, released with no selection.
    Grouping by the unit is refused in every DP SELECT; here it is refused at the join, however the
    key is computed from it (until 2026-11-29 such a join released one noisy row per person)."""
    units = scope.unit_columns()

    def reads_unit(col: exp.Column) -> bool:
        try:
            return scope.is_unit(col) or scope.key_of(col) in units
        except DPError:
            return False

    used = reads_column(join.args.get("on"), reads_unit)
    names = [u.name for u in join.args.get("using") or []]
    if (join.args.get("method") or "").upper() == "NATURAL":
        names += [c for c in scope.relations[-1].columns if any(r.has(c) for r in scope.relations[:-1])]
    used = used or next((exp.column(n) for n in names if reads_unit(exp.column(n))), None)
    if used is not None:
        raise InvalidQueryError(
            f"OPTIONS group_selection_strategy = PUBLIC_GROUPS: {written[:80]!r} joins the public groups on the "
            f"privacy unit ({quote(used)}): its groups would be keyed by unit ids, each listed one released with no "
            "selection, and grouping by the privacy unit is not allowed (by any expression of it in a PUBLIC_GROUPS "
            "join); join the public groups on other columns")


__all__ = ["PUBLIC_GROUPS", "bare", "closure", "column_equalities", "reads_column", "refuse_unit_join",
           "unit_key_refusal"]
