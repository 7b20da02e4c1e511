"""Row filters (WHERE): a selection before bounding keeps row ownership (seed Table 4.3).

The filter is SQL text, parsed with sqlglot and accepted only when it is a row-level predicate:
no subquery, aggregate, window function, unknown function or random(). It is re-rendered from the
parsed tree, so what runs is what was checked, under TRY: a row whose value it cannot compute (a cast
that does not parse) is filtered out instead of failing the release on one person's value
(no_value_errors.py).
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from .errors import InvalidQueryError
from .no_value_errors import guarded

_FORBIDDEN = {
    exp.Subquery: "a subquery",
    exp.Query: "a subquery",
    exp.AggFunc: "an aggregate function",
    exp.Window: "a window function",
    exp.Rand: "random()",
    exp.Anonymous: "an unknown function",
}
_PREDICATES = (exp.Predicate, exp.Connector, exp.Not, exp.Paren, exp.Boolean, exp.Between, exp.In)


def compile_filter(text: str, dialect: str = "duckdb") -> tuple[str, set[str]]:
    """The checked predicate as SQL in `dialect`, and the columns it reads."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidQueryError("the row filter must be a non-empty SQL condition, e.g. \"age >= 18\"")
    try:
        trees = sqlglot.parse(text, read="duckdb")
    except sqlglot.errors.ParseError as err:
        raise InvalidQueryError(f"the row filter {text!r} is not valid SQL: {str(err).splitlines()[0]}") from None
    if len(trees) != 1 or trees[0] is None:
        raise InvalidQueryError(f"the row filter {text!r} must be one condition, not several statements")
    tree = trees[0]
    for node in tree.walk():
        for kind, what in _FORBIDDEN.items():
            if isinstance(node, kind):
                raise InvalidQueryError(
                    f"the row filter may only test each row's own values; {node.sql('duckdb')!r} is {what}"
                )
    if not isinstance(tree, _PREDICATES):
        raise InvalidQueryError(f"the row filter {text!r} is not a condition (true or false per row)")
    return guarded(tree.copy()).sql(dialect=dialect), {c.name for c in tree.find_all(exp.Column)}
