"""Synthetic benchmark workload: 10M rows, 1M units, 10k partitions (Zipf-like popularity).

Benchmark data only: it uses numpy's seeded PRNG on purpose (reproducible inputs); privacy noise
never comes from here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = 10_000_000
UNITS = 1_000_000
PARTITIONS = 10_000
ZIPF_EXPONENT = 1.1
SEED = 20261121


def workload_path(rows: int = ROWS, units: int = UNITS, partitions: int = PARTITIONS) -> Path:
    """Where the Parquet file for these sizes lives (under /tmp, made once)."""
    base = Path(os.environ.get("DPRELEASE_BENCH_DIR", "/tmp/dprelease-bench"))
    return base / f"workload_{rows}_{units}_{partitions}.parquet"


def make_workload(rows: int = ROWS, units: int = UNITS, partitions: int = PARTITIONS) -> Path:
    """Write (once) a Parquet table `uid, part, val`: each unit in 1-8 partitions drawn with
    Zipf-like popularity, its rows spread over them, `val` an integer in [0, 200]."""
    path = workload_path(rows, units, partitions)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    weights = 1.0 / np.arange(1, partitions + 1) ** ZIPF_EXPONENT
    weights /= weights.sum()
    per_unit = rng.integers(1, 9, size=units)  # 1..8 partitions per unit
    pair_unit = np.repeat(np.arange(units, dtype=np.int64), per_unit)
    pair_part = rng.choice(partitions, size=pair_unit.size, p=weights).astype(np.int32)
    # every (unit, partition) pair gets one row; the remaining rows go to random pairs
    extra = rng.integers(0, pair_unit.size, size=max(rows - pair_unit.size, 0))
    row_pair = np.concatenate([np.arange(pair_unit.size), extra])[:rows]
    table = pa.table(
        {
            "uid": pair_unit[row_pair],
            "part": pair_part[row_pair],
            "val": rng.integers(0, 201, size=row_pair.size).astype(np.int64),
        }
    )
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=1_000_000)
    tmp.rename(path)
    return path
