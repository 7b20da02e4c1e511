"""MaxAdaptiveDegree's second round on the open data engine (derivations: selection_weighted.py;
the damped form: selection_damped.py).

Round 1 (weighted Gaussian on the plan's `_w1`) decides which partitions are released at once;
round 2's weights depend on that public outcome, so they are computed by one more SQL statement
on the same connection, before it closes. The bounded rows (`_bounded`) are materialised once in
an in-memory temporary table (DuckDB runs with no temp directory: nothing reaches the disk) and
both the plan's per-partition sums and round 2 read them, so the contribution bounding runs once.
Inputs given as a DuckDB relation (no connection of our own) re-run the plan instead: the same
hash seed keeps the same rows. No loop over units or partitions in Python.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

import numpy as np
import pandas as pd

from .accounting import Share
from .bounding import DIALECT_PIECES, _same_key, cut_from_bounded_cte, public_keys_sql
from .selection_damped import damped_weights, first_round, undamped_weights
from .selection_weighted import weight_sql
from .sql_text import ident

#: the selections drawn in two rounds, round 1 while the plan's connection is open
TWO_ROUND_SELECTIONS = ("mad", "mad_damped")



def round_two_sql(with_clause: str, query, released_keys: list[tuple], key_types: dict | None,
                  dialect: str = "duckdb", damped_keys: list[tuple] = ()) -> str:
    """Round 2's weights per partition, its keys as columns, the released (and, for `mad_damped`,
    the damped) partitions given by their key values (plain values: the tests and the audit harness
    name them so). The same statement as the release's (`round_two_by_number_sql`), the numbers
    looked up from the keys."""
    def numbers(chosen: list[tuple]) -> str:
        if not chosen:
            return "-1"
        given = public_keys_sql(replace(query, public_partitions=tuple(chosen)), key_types)
        return f"SELECT _ids._pid FROM _ids JOIN {given} ON {_same_key('_pk', '_ids', tuple(query.group_by))}"

    damped = numbers(list(damped_keys)) if query.selection == "mad_damped" else None
    return _round_two(with_clause, query, numbers(list(released_keys)), dialect, keyed=True, damped=damped)


def numbered_sql(with_clause: str, body: str, query) -> str:
    """The plan's per-partition rows, each with its partition's number `_pid` (its rank in the
    order of the keys, computed by the engine on the keys' own values: the same number for the same
    partition in every statement over the same plan)."""
    order = ", ".join(ident(k) for k in query.group_by)
    return f"{with_clause}\nSELECT row_number() OVER (ORDER BY {order}) AS _pid, _b.* FROM ({body}) AS _b"


def round_two_by_number_sql(with_clause: str, query, released: list[int], dialect: str = "duckdb",
                            damped: list[int] = ()) -> str:
    """Round 2's weighted histogram per partition number `_pid` (numbered_sql): each unit's kept
    partitions not released in round 1, with weight q_r, r the number of such partitions of the unit;
    one statement over the same plan. The released partitions are named by their numbers: keys never
    leave the engine (a key read back through pandas and written into SQL again, an INTERVAL, a LIST,
    a HUGEINT beyond a double's integers, a NULL beside a NaN, failed to convert or matched another
    partition, after round 1 had decided, until 2026-11-25)."""
    def listed(numbers) -> str:
        return ", ".join(str(int(i)) for i in numbers) or "-1"

    damped_list = listed(damped) if query.selection == "mad_damped" else None
    return _round_two(with_clause, query, listed(released), dialect, keyed=False, damped=damped_list)


def _round_two(with_clause: str, query, released: str, dialect: str, keyed: bool, damped: str | None = None) -> str:
    """The round-2 statement; `released`: the released partitions' numbers (a list or a subquery);
    keyed: the output names each partition by its keys, else by its number. `damped` (mad_damped
    only, the damped partitions' numbers): a unit with a undamped and b damped partitions left
    (m = 4a + b) weighs F_m and G_m in them (selection_damped.py); else q_r in each of its r."""
    unit = ident(query.privacy_unit)
    keys = tuple(query.group_by)
    order = ", ".join(ident(k) for k in keys)
    out = ", ".join(f"_ids.{ident(k)}" for k in keys) if keyed else "_pid"
    at = DIALECT_PIECES[dialect]["at"]
    cu = query.effective_max_partitions
    if damped is None:
        mark, degree, weight = "", "count(*) AS _r", weight_sql("_r", cu, at)
    else:
        mark = f", CASE WHEN _ids._pid IN ({damped}) THEN 1 ELSE 0 END AS _dm"
        degree = "4 * count(*) - 3 * sum(_dm) AS _r"
        weight = (f"CASE WHEN _dm = 1 THEN {weight_sql('_r', cu, at, damped_weights(cu))} "
                  f"ELSE {weight_sql('_r', cu, at, undamped_weights(cu))} END")
    return (
        f"{with_clause},\n_ids AS (SELECT {order}, row_number() OVER (ORDER BY {order}) AS _pid FROM _final),\n"
        f"_left AS (SELECT _bounded.{unit} AS {unit}, _ids._pid AS _pid{mark} FROM _bounded JOIN _ids ON "
        f"{_same_key('_ids', '_bounded', keys)} WHERE _ids._pid NOT IN ({released})),\n"
        f"_ldeg AS (SELECT {unit}, {degree} FROM _left GROUP BY {unit})\n"
        f"SELECT {out}, CAST(sum({weight}) AS BIGINT) AS _w2 "
        f"FROM _left JOIN _ldeg USING ({unit})" + (" JOIN _ids USING (_pid)" if keyed else "") + f" GROUP BY {out}"
    )


def mad_rows(backend, query, plan, share: Share) -> pd.DataFrame:
    """The plan's per-partition rows plus round 1 of MAD or damped MAD (`_mad_r1`, noise drawn here,
    once) and round-2 weights (`_w2`; 0 for partitions released in round 1)."""
    if getattr(backend, "connection", None) is None or not plan.ctes:  # Spark, or a DuckDB relation
        rows = backend.run(numbered_sql(plan.with_clause, plan.body, query))
        return mad_second_round(backend, query, plan, rows, share, plan.with_clause)
    at = next(i for i, cte in enumerate(plan.ctes) if cte.startswith("_bounded AS ("))
    name = f"_mad_bounded_{secrets.token_hex(6)}"
    backend.keep(name, f"WITH {', '.join(plan.ctes[: at + 1])} SELECT * FROM _bounded")
    try:
        cut = cut_from_bounded_cte(query.effective_max_partitions)
        with_clause = "WITH " + ",\n".join([f"_bounded AS (SELECT * FROM {name})", cut, *plan.ctes[at + 1 :]])
        rows = backend.run(numbered_sql(with_clause, plan.body, query))
        return mad_second_round(backend, query, plan, rows, share, with_clause)
    finally:
        backend.drop(name)


def mad_second_round(backend, query, plan, rows: pd.DataFrame, share: Share, with_clause: str) -> pd.DataFrame:
    """Run MAD's first round on `rows` and the round-2 SQL over `with_clause` (ending in `_bounded`)."""
    keys = list(query.group_by)  # one order on every backend: round 1's noise is drawn in row order
    rows = rows.sort_values(keys, na_position="last", kind="stable").reset_index(drop=True)
    r1, damped = first_round(rows["_w1"].to_numpy(dtype=np.int64), query.selection, share,
                             query.effective_max_partitions, query.epsilon)
    out = rows.copy()
    out["_mad_r1"] = r1
    if not r1.any() and not damped.any():
        out["_w2"] = out["_w1"].to_numpy(dtype=np.int64)  # nothing released or damped: every unit keeps all (F_4t = q_t)
        return out.drop(columns="_pid")
    # by number: the keys stay in the engine (round_two_by_number_sql)
    released, damped_numbers = rows.loc[r1, "_pid"].tolist(), rows.loc[damped, "_pid"].tolist()
    w2 = backend.run(round_two_by_number_sql(with_clause, query, released, backend.dialect, damped_numbers))
    merged = out.merge(w2, on="_pid", how="left", sort=False)
    if len(merged) != len(out):  # one row per partition number; a mismatch would be a plan bug
        raise RuntimeError("MAD round 2: partition numbers did not match the plan's rows")
    merged["_w2"] = merged["_w2"].fillna(0).to_numpy(dtype=np.int64)
    return merged.drop(columns="_pid")
