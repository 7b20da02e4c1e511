"""Each period's exact value for a running total, with every unit bounded over the whole horizon.

The tree's sensitivity (dp_core.continual) assumes that one unit contributes at most B to one
period's value of one group, in at most k periods and at most C_u groups. This module makes that
true of the data, in DuckDB, from each unit's own rows only (so adding or removing a unit changes
nothing but its own contributions):

- groups: rows outside the public groups are dropped; a unit keeps its first C_u groups, ordered by
  the first period it appears in each, then by the group;
- COUNT and SUM: a unit counts in the first k periods it appears in (later periods are dropped);
  its contribution to a (period, group) is min(rows, B) for COUNT and its values' sum clamped to
  [-B, B] (then rounded to the quantum, `sum_quantum`: at most ceil(B / quantum) quanta) for SUM;
- COUNT(DISTINCT unit): a unit counts 1, in the period it first appears in the group, so the
  running total is the number of distinct units to date and k = 1, B = 1 by construction.

The result is recomputed from all periods 1..t at each period: deterministic, so a period released
again gets the same exact values (and the sealed noise makes the same release).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

from .aggregates import _quantum
from .errors import DPError

STATISTICS = ("COUNT", "SUM", "COUNT_DISTINCT")


def sum_quantum(per_period: float, integer_values: bool) -> float:
    """The quantum a running SUM rounds each unit's clamped period sum to, by the engine's rule
    (aggregates.py): 1 for an integer column with an integer bound B, else the power of two
    2^(floor(log2 B) - 32), so that rounding moves a unit's value by at most 2^-33 B (a quantum of
    1 would round a value of 0.4 to 0, and every value when B < 0.5)."""
    if integer_values and float(per_period).is_integer():
        return 1.0
    return _quantum(-float(per_period), float(per_period))


def _ident(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def bounded_period_values(data: pd.DataFrame, *, unit: str, period: str, statistic: str, periods: int,
                          groups: list | None = None, group_by: str | None = None, value: str | None = None,
                          per_period: float = 1.0, max_groups: int = 1, quantum: float = 1.0,
                          horizon: int | None = None) -> np.ndarray:
    """(t, len(groups)) int64: each period's bounded exact value per public group, in quanta.

    `data` holds the rows of periods 1..t, `period` the 1-based period of each row (t = the
    largest, or `horizon`'s periods when given). Without `group_by` there is one group, the total."""
    statistic = statistic.upper()
    if statistic not in STATISTICS:
        raise DPError(f"a running total is one of {', '.join(STATISTICS)}, got {statistic!r}")
    if statistic == "SUM" and value is None:
        raise DPError("a running SUM needs the value column")
    if (group_by is None) != (groups is None):
        raise DPError("a running total by group needs both the group column and its public groups")
    labels = list(groups) if groups is not None else [None]
    t = int(data[period].max()) if horizon is None and len(data) else int(horizon or 0)
    out = np.zeros((t, len(labels)), dtype=np.int64)
    if not len(data) or t == 0:
        return out
    frame = pd.DataFrame({"u": data[unit], "p": data[period].astype("int64"),
                          "g": data[group_by] if group_by else 0,
                          "v": data[value] if value else 0})
    public = pd.DataFrame({"g": labels if group_by else [0], "i": range(len(labels))})
    b = float(per_period)
    if statistic == "COUNT_DISTINCT":
        per_unit = "SELECT u, min(p) AS p, i, 1 AS c FROM kept GROUP BY u, i"
        period_rank = "TRUE"
    else:
        contribution = (f"least(count(*), {int(b)})" if statistic == "COUNT"
                        else f"CAST(round(greatest(least(sum(v), {b!r}), {-b!r}) / {float(quantum)!r}) AS BIGINT)")
        per_unit = f"SELECT u, p, i, {contribution} AS c FROM kept GROUP BY u, p, i"
        period_rank = f"pr <= {int(periods)}"
    sql = f"""
        WITH rows AS (SELECT f.u, f.p, public.i, f.v FROM frame f JOIN public ON f.g = public.g
                      WHERE f.u IS NOT NULL AND f.p BETWEEN 1 AND {t}),
             unit_periods AS (SELECT u, p, dense_rank() OVER (PARTITION BY u ORDER BY p) AS pr
                              FROM (SELECT DISTINCT u, p FROM rows)),
             unit_groups AS (SELECT u, i, row_number() OVER (PARTITION BY u ORDER BY first, i) AS gr
                             FROM (SELECT u, i, min(p) AS first FROM rows GROUP BY u, i)),
             kept AS (SELECT rows.* FROM rows JOIN unit_periods USING (u, p) JOIN unit_groups USING (u, i)
                      WHERE {period_rank} AND gr <= {int(max_groups)}),
             per_unit AS ({per_unit})
        SELECT p, i, CAST(sum(c) AS BIGINT) AS total FROM per_unit GROUP BY p, i"""
    con = duckdb.connect()
    try:
        con.register("frame", frame)
        con.register("public", public)
        rows = con.execute(sql).fetchall()
    finally:
        con.close()
    for p, i, total in rows:
        out[p - 1, i] = total
    return out
