"""Every bad input is refused with the project's error type and a message that names it;
nothing is released."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core import DPError, InvalidDataError, InvalidQueryError

DF = pd.DataFrame({"uid": [1, 2, 3], "g": ["a", "b", "a"], "x": [1.0, 2.0, 3.0], "s": ["p", "q", "r"]})


def run(data=DF, **kw):
    base = dict(aggregates=[dp.sum_("x", 0, 10)], privacy_unit="uid", epsilon=1.0)
    base.update(kw)
    return dp.execute(dp.Query(**base), data)


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        ({"epsilon": 0.0}, InvalidQueryError, "epsilon"),
        ({"epsilon": -1.0}, InvalidQueryError, "epsilon"),
        ({"epsilon": math.inf}, InvalidQueryError, "epsilon"),
        ({"epsilon": math.nan}, InvalidQueryError, "epsilon"),
        ({"delta": 1.0}, InvalidQueryError, "delta"),
        ({"delta": -1e-9}, InvalidQueryError, "delta"),
        ({"delta": 0.0, "group_by": ("g",)}, InvalidQueryError, "delta = 0"),
        ({"delta": 0.0, "noise": "gaussian"}, InvalidQueryError, "Gaussian"),
        ({"aggregates": [dp.sum_("x", 5, 1)]}, InvalidQueryError, "L=5 exceeds upper bound U=1"),
        ({"aggregates": [dp.avg("x", 0, math.inf)]}, InvalidQueryError, "finite"),
        ({"max_partitions_contributed": 0}, InvalidQueryError, "max_partitions_contributed"),
        ({"max_partitions_contributed": 1.5}, InvalidQueryError, "max_partitions_contributed"),
        ({"aggregates": [dp.quantile("x", 1.5, 0, 10)]}, InvalidQueryError, "q must be in [0, 1]"),
        ({"aggregates": [dp.quantile("x", -0.1, 0, 10)]}, InvalidQueryError, "q must be in [0, 1]"),
        ({"aggregates": []}, InvalidQueryError, "no aggregates"),
        ({"aggregates": [dp.count(upper=0)]}, InvalidQueryError, "row bound"),
        ({"aggregates": [dp.Aggregate("sum", column="x")]}, dp.BoundsError, "set the bounds by hand"),  # 3 rows
        ({"aggregates": [dp.count(), dp.count()]}, InvalidQueryError, "unique"),
        ({"noise": "uniform"}, InvalidQueryError, "noise"),
        ({"confidence": 1.0}, InvalidQueryError, "confidence"),
        ({"group_by": ("uid",)}, InvalidQueryError, "privacy unit"),
        ({"public_partitions": ["a"]}, InvalidQueryError, "no group_by"),
        ({"group_by": ("g",), "public_partitions": [("a", 1)]}, InvalidQueryError, "1 value"),
        ({"privacy_unit": "nope"}, InvalidDataError, "privacy unit column 'nope'"),
        ({"group_by": ("zz",)}, InvalidDataError, "group-by key column 'zz'"),
        ({"aggregates": [dp.sum_("zz", 0, 1)]}, InvalidDataError, "column 'zz' is not in the input"),
        ({"aggregates": [dp.sum_("s", 0, 1)]}, InvalidDataError, "needs a numeric column"),
    ],
)
def test_bad_query_is_refused_with_a_named_reason(kwargs, error, words):
    with pytest.raises(error) as info:
        run(**kwargs)
    assert words in str(info.value)
    assert isinstance(info.value, DPError)


def test_null_unit_ids_are_refused():
    bad = DF.assign(uid=[1, None, 3])
    with pytest.raises(InvalidDataError, match=r"1 row\(s\) have no privacy unit id"):
        run(bad)


@pytest.mark.parametrize("value", [np.inf, -np.inf])
def test_infinite_values_are_refused(value):
    with pytest.raises(InvalidDataError, match="'x' has 1 infinite value"):
        run(DF.assign(x=[1.0, value, 3.0]))


def test_nan_is_missing_like_null_in_every_input_form(tmp_path):
    """NaN and NULL are both missing (skipped by SUM): a DataFrame, an Arrow table, a CSV with an
    empty cell or a literal NaN all give the same exact sum (1 + 3), never a clamped NaN."""
    import pyarrow as pa

    csv_empty, csv_nan = tmp_path / "empty.csv", tmp_path / "nan.csv"
    csv_empty.write_text("uid,g,x,s\n1,a,1.0,p\n2,b,,q\n3,a,3.0,r\n")
    csv_nan.write_text("uid,g,x,s\n1,a,1.0,p\n2,b,NaN,q\n3,a,3.0,r\n")
    with_nan = DF.assign(x=[1.0, np.nan, 3.0])
    inputs = [with_nan, DF.assign(x=pd.array([1.0, None, 3.0], dtype="Float64")), pa.table({**{c: DF[c] for c in DF}, "x": pa.array([1.0, np.nan, 3.0], from_pandas=False)}),
              csv_empty, csv_nan]
    for data in inputs:
        exact = run(data).controller_only.exact
        assert float(exact["sum_x"].iloc[0]) == 4.0, data


def test_nan_in_a_column_no_aggregate_reads_is_fine():
    assert len(run(DF.assign(y=[np.nan, 1.0, 2.0])).table) == 1


def test_empty_input_is_refused():
    with pytest.raises(InvalidDataError, match="no rows"):
        run(DF.iloc[:0])


def test_missing_file_and_unknown_format_and_type(tmp_path):
    with pytest.raises(InvalidDataError, match="not found"):
        run(tmp_path / "missing.csv")
    (tmp_path / "x.xlsx").write_text("x")
    with pytest.raises(InvalidDataError, match="give a .csv"):
        run(tmp_path / "x.xlsx")
    with pytest.raises(InvalidDataError, match="unsupported input type"):
        run([1, 2, 3])


@pytest.mark.parametrize("text", ['uid,x\n1,2\n"2,3\n', "uid,x\n1,2\n3,4,5,6\n7,8\n"])
def test_malformed_csv_is_refused(tmp_path, text):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InvalidDataError, match="cannot read .*bad.csv as CSV"):
        run(path)


def test_nullable_missing_values_are_not_errors():
    df = DF.assign(x=pd.array([1.0, None, 3.0], dtype="Float64"))
    assert len(run(df).table) == 1
