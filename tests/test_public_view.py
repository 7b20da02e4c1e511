"""Controller-only numbers (partition loss, clamping loss, bounding loss, exact values) never
appear in what an analyst receives: str, repr, to_dict, to_json, explain, the table."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

import dp_core as dp


def release():
    # distinctive raw numbers: 1000 values of 777.777 clamped to 500 (total shift 277777), and a
    # tiny partition "rare" that selection drops
    df = pd.DataFrame({
        "uid": np.arange(2003),
        "g": ["big"] * 1000 + ["other"] * 1000 + ["rare"] * 3,
        "x": [777.777] * 1000 + [123.457] * 1000 + [5.0] * 3,
    })
    q = dp.Query([dp.sum_("x", 0, 500, name="s"), dp.count(name="n")], privacy_unit="uid", group_by=("g",),
                 epsilon=1.0, delta=1e-6)
    return dp.execute(q, df)


def test_controller_field_is_filled():
    r = release()
    c = r.controller_only
    assert c.partitions_nonempty == 3 and c.partitions_dropped >= 1  # "rare" (3 units) cannot pass
    assert c.clamping["s"].clamped == 1000 and abs(c.clamping["s"].total_shift - 1000 * 277.777) < 1e-3
    assert "big" in set(c.exact["g"])


def test_no_public_serialiser_reaches_controller_only():
    r = release()
    c = r.controller_only
    outputs = [str(r), repr(r), r.to_json(), json.dumps(r.to_dict(), default=str), r.explain(), r.table.to_csv()]
    forbidden = ["controller", "partition_loss", "partition loss", "clamping loss", "clamped", "partitions_dropped",
                 "pairs_dropped", "total_shift", "nonempty", "rare", "277777"]
    assert str(int(c.clamping["s"].total_shift)).startswith("277777")
    for text in outputs:
        for word in forbidden:
            assert word not in text, (word, text[:200])
    assert "controller_only" not in r.to_dict()
    assert set(r.table.columns) == {"g"} | {f"{a}{suffix}" for a in ("s", "n")
                                            for suffix in ("", "_ci_low", "_ci_high", "_noise_sd")}


def test_released_values_are_not_the_exact_ones():
    r = release()
    exact = r.controller_only.exact.set_index("g")
    t = r.table.set_index("g")
    assert (t["s"] != exact.loc[t.index, "s"]).all()  # noise was added to every released value
