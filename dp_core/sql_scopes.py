"""Which CTE a table name reads where it is written, as DuckDB scopes a WITH clause.

A CTE is seen by the CTEs after it in its WITH clause and by the query the clause belongs to, not by
its own body nor by the CTEs before it: there the same name reads a table, or a file of that name
(DuckDB's replacement scans). The ownership check, the outer query's check and the Spark rendering
must all resolve a name this way, or a name they take for a CTE is read by the engine as a table:
until 2026-11-25 a CTE named after a protected table's file released that file's raw rows, and on
Spark a public CTE named like a protected table read the protected table.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp


def table_reads(node: exp.Expression, visible: dict[str, exp.CTE] | None = None) -> Iterator[tuple[exp.Table, exp.CTE | None]]:
    """Every unqualified table name in `node` (a plain identifier, no schema), with the CTE it reads
    where it is written (None: it reads a table). `visible`: CTEs already in scope, by lower-case name."""
    visible = dict(visible or {})
    with_clause = node.args.get("with_", node.args.get("with"))
    if isinstance(with_clause, exp.With):
        for cte in with_clause.expressions:
            yield from table_reads(cte.this, visible)
            visible[cte.alias.lower()] = cte
    if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier) and not node.args.get("db"):
        yield node, visible.get(node.name.lower())
    for child in node.iter_expressions():
        if child is not with_clause:
            yield from table_reads(child, visible)


__all__ = ["table_reads"]
