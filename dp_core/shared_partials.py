"""The per-(unit, partition) partials computed once per release, read by each of its statements.

A release whose bounds are inferred (APPROX_BOUNDS) or whose PRIs are computed runs several
statements over the same bounded rows: the bounds' histograms, the plan itself, each unit's
values. Each would otherwise repeat the aggregation per (unit, partition), the costliest step of
the plan (docs/engine.md, "Where a release's time goes"). On a DuckDB connection of the engine's
own, the plan's `_partial` is computed once into an in-memory temporary table (the connection has
no temp directory: nothing reaches the disk) and every later plan reads that table instead.

The rows are the same: `_partial` depends on the input, the filter, the unit, the keys, the
aggregates' columns and the bounding seed, never on the bounds, so the placeholder plan of
APPROX_BOUNDS and the release's plan share it; a plan whose `_src` (the filter, the public
partitions) or `_partial` differs from the ones kept runs as written. The CTEs' text is all that is
compared, so one SharedPartials serves one release on a backend whose input (`dp_input`, a view of
DP SQL's define_input too) stays as it is while the table lives. A quantile's per-unit value
(one of the unit's rows, drawn at random in `_partial`) is then drawn once for the bounds and the
histogram alike. On Spark the partials are a temporary view cached in the executors' memory only
(an evicted partition is recomputed, never written out). A DuckDB relation (no connection of the
engine's own) runs each statement in full.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from .bounding import BoundingPlan

SOURCE_CTE, PARTIAL_CTE = "_src AS (", "_partial AS ("


class SharedPartials:
    """Keeps one plan's `_partial` in a temporary table for the plans after it (`reading`)."""

    def __init__(self, backend, enabled: bool = True):
        self.backend = backend if enabled and getattr(backend, "can_keep", False) else None
        self.table: str | None = None
        self.kept_ctes: tuple[str, str] | None = None  # the `_src` and `_partial` CTEs the table holds

    def reading(self, plan: BoundingPlan) -> BoundingPlan:
        """`plan` with its `_src` and `_partial` CTEs replaced by a scan of the kept table (made
        from this plan on the first call); `plan` itself when its `_src` or `_partial` is not the
        kept one or nothing can be kept."""
        if self.backend is None or len(plan.ctes) < 2:
            return plan
        source, partial = plan.ctes[:2]
        later = plan.ctes[2:]
        if (not source.startswith(SOURCE_CTE) or not partial.startswith(PARTIAL_CTE)
                or any("_src" in cte for cte in later) or "_src" in plan.body):
            return plan
        if self.table is None:
            self.table = f"_partial_{secrets.token_hex(6)}"
            self.backend.keep(self.table, f"WITH {source}, {partial} SELECT * FROM _partial")
            self.kept_ctes = (source, partial)
        elif (source, partial) != self.kept_ctes:  # `_partial`'s text alone does not say which rows it reads
            return plan
        # DuckDB: NOT MATERIALIZED, so that the readers scan the table itself (it would copy a CTE
        # read twice); Spark inlines every CTE and reads the cached view
        hint = "NOT MATERIALIZED " if self.backend.dialect == "duckdb" else ""
        ctes = (f"_partial AS {hint}(SELECT * FROM {self.table})", *later)
        return replace(plan, with_clause="WITH " + ",\n".join(ctes), ctes=ctes)

    def close(self) -> None:
        """Drop the table (a connection of the engine's own closes with the release anyway; a
        Spark session outlives it)."""
        if self.table is not None:
            self.backend.drop(self.table)
            self.table = None
