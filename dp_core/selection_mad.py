"""MaxAdaptiveDegree's second round on the open data engine (derivations: selection_weighted.py).

Round 1 (weighted Gaussian on the plan's `_w1`) decides which partitions are released at once;
round 2's weights depend on that public outcome, so they are computed by one more SQL statement
over the same bounding plan (same hash seed: the same kept rows) on the same connection, before
the connection closes. No loop over units or partitions in Python.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from .accounting import Share
from .bounding import _plain, _same_key, public_keys_sql
from .selection_weighted import round_one, weight_sql
from .sql_text import ident


def round_two_sql(plan, query, released_keys: list[tuple], key_types: dict | None) -> str:
    """Round 2's weighted histogram: each unit's kept partitions not released in round 1, with
    weight q_r, r the number of such partitions of the unit. One statement over the same plan."""
    unit = ident(query.privacy_unit)
    keys = [ident(k) for k in query.group_by]
    cols = ", ".join(keys)
    released = public_keys_sql(replace(query, public_partitions=tuple(released_keys)), key_types)
    return (
        f"{plan.with_clause},\n_left AS (SELECT {unit}, {cols} FROM _bounded WHERE NOT EXISTS "
        f"(SELECT 1 FROM {released} WHERE {_same_key('_pk', '_bounded', tuple(query.group_by))})),\n"
        f"_ldeg AS (SELECT {unit}, count(*) AS _r FROM _left GROUP BY {unit})\n"
        f"SELECT {cols}, CAST(sum({weight_sql('_r', query.effective_max_partitions)}) AS BIGINT) AS _w2 "
        f"FROM _left JOIN _ldeg USING ({unit}) GROUP BY {cols}"
    )


def mad_second_round(backend, query, plan, rows: pd.DataFrame, share: Share, key_types: dict | None) -> pd.DataFrame:
    """Run MAD's first round (noise drawn here, once) and the round-2 SQL on the open backend.

    Returns `rows` with `_mad_r1` (released in round 1) and `_w2` (round-2 weight; 0 for partitions
    released in round 1 or left without units)."""
    r1 = round_one(rows, share, query.effective_max_partitions, query.epsilon)
    out = rows.copy()
    out["_mad_r1"] = r1
    if not r1.any():
        out["_w2"] = out["_w1"].to_numpy(dtype=np.int64)  # nothing released: every unit keeps all
        return out
    keys = list(query.group_by)
    released = [tuple(_plain(v) for v in row) for row in rows.loc[r1, keys].itertuples(index=False)]
    w2 = backend.run(round_two_sql(plan, query, released, key_types))
    merged = out.merge(w2, on=keys, how="left", sort=False)
    if len(merged) != len(out):  # keys are unique per partition; a mismatch would be a plan bug
        raise RuntimeError("MAD round 2: partition keys did not match the plan's rows")
    merged["_w2"] = merged["_w2"].fillna(0).to_numpy(dtype=np.int64)
    return merged

