"""Every bad input is refused with the project's error type and a message that names it;
nothing is released."""

from __future__ import annotations

import gzip
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
        ({"aggregates": [dp.median("x", 5, 5)]}, InvalidQueryError,
         "aggregate 'median_x': bounds must differ (L = U = 5 leaves nothing to learn)"),
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


@pytest.mark.parametrize("kwargs, message", [
    ({"aggregates": []}, "the query has no aggregates: add at least one (e.g. count())"),
    ({"privacy_unit": ""}, "privacy_unit must name the column that identifies each person/unit"),
    ({"privacy_unit": None}, "privacy_unit must name the column that identifies each person/unit"),
    ({"privacy_unit": 7}, "privacy_unit must name the column that identifies each person/unit"),
    ({"bounds_failure": 0.5}, "bounds_failure must be in (0, 0.5), got 0.5"),
    ({"bounds_failure": 0.0}, "bounds_failure must be in (0, 0.5), got 0.0"),
    ({"bounds_failure": math.nan}, "bounds_failure must be in (0, 0.5), got nan"),
])
def test_a_query_without_a_statistic_or_a_unit_is_refused_word_for_word(kwargs, message):
    """The two things every query needs, and a failure probability for bound inference that means
    something, refused in the whole sentence that says what to give."""
    with pytest.raises(InvalidQueryError) as info:
        run(**kwargs)
    assert str(info.value) == message


def test_public_partitions_without_a_group_by_are_refused_as_such():
    with pytest.raises(InvalidQueryError) as caught:
        run(public_partitions=["a"])
    assert str(caught.value) == "public_partitions given but the query has no group_by"


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


@pytest.mark.parametrize("text, words", [
    ('uid,x\n1,2\n"2,3\n', "line 3: a value opened with a double quote is never closed"),
    ("uid,x\n1,2\n3,4,5,6\n7,8\n", "line 3: 4 fields, but the header (line 1) has 2"),
])
def test_malformed_csv_is_refused(tmp_path, text, words):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InvalidDataError) as caught:
        run(path)
    # which file, which line, what is wrong, on one line
    assert str(caught.value).startswith(f"{path}, {words}"), str(caught.value)
    assert "\n" not in str(caught.value)


MISNAMED = [  # (file name, content, the advice the refusal ends with)
    ("d.csv.gz", b"uid,x\n1,2\n",
     "is named csv.gz but is not gzip-compressed: compress it with gzip, or rename it to d.csv"),
    ("d.csv", b"\x1f\x8b" + bytes(30), "is gzip-compressed but named .csv: rename it to d.csv.gz"),
    ("d.csv", b"PAR1" + bytes(30), "is a Parquet file but named .csv: rename it to d.parquet"),
    ("d.csv", b"PK\x03\x04" + bytes(30), "is a zip archive (or an Excel workbook) but named .csv: export or "
                                           "decompress it to a .csv, .csv.gz, .tsv, .tsv.gz or .parquet file"),
    ("d.csv.gz", gzip.compress(b"PAR1" + bytes(30), mtime=0), "holds a Parquet file inside the gzip, not CSV text"),
    ("d.parquet", b"uid,x\n1,2\n",
     "is named .parquet but is not a Parquet file: convert it, or rename it if it is CSV"),
    ("d.parquet", b"\x1f\x8b" + bytes(30), "is named .parquet but is not a Parquet file: it is gzip-compressed"),
]


@pytest.mark.parametrize("name, content, advice", MISNAMED)
def test_a_misnamed_file_is_refused_with_the_fix_that_fits_its_content(tmp_path, name, content, advice):
    """What the first bytes show decides the advice: the name the file should have, or how to convert it."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InvalidDataError) as caught:
        run(path)
    assert str(caught.value) == f"{path} {advice}"


def _x_twice(path) -> str:
    """The refusal of a file whose header names x at positions 2 and 3."""
    return (f"{path} has the column 'x' twice, at positions 2 and 3: rename or drop one (each column must have its "
            "own name)")


def test_a_csv_header_naming_a_column_twice_once_in_quotes_is_refused(tmp_path):
    """A header's quoted name is the same name: `uid,"x",x` names x twice (DuckDB would read one of
    them as x_1 and release from either), refused like any repeated column."""
    path = tmp_path / "d.csv"
    path.write_text('uid,"x",x\n1,2,3\n2,3,4\n')
    with pytest.raises(InvalidDataError) as caught:
        run(path)
    assert str(caught.value) == _x_twice(path)


def test_a_row_filter_is_one_condition_read_as_duckdb_sql():
    """The filter is DuckDB SQL (`^@` is DuckDB's starts-with, `//` its integer division), one
    condition only: a second statement is refused, not dropped; an empty filter says what is wanted."""
    import duckdb

    from dp_core.row_filter import compile_filter

    sql, columns = compile_filter("s ^@ 'q' OR uid // 2 = 0")
    assert columns == {"s", "uid"}
    frame = DF  # noqa: F841 - read by DuckDB below
    kept = duckdb.sql(f"SELECT uid FROM frame WHERE {sql} ORDER BY uid").fetchall()
    assert kept == [(1,), (2,)]  # uid 1: 1 // 2 = 0; uid 2: s = 'q'; uid 3: neither
    # printed back as DuckDB's SQL: xor() is not rewritten to `^`, which DuckDB reads as a power
    sql, _ = compile_filter("xor(uid, 1) = 0")
    assert duckdb.sql(f"SELECT uid FROM frame WHERE {sql}").fetchall() == [(1,)]
    # what a filter may not hold, said whole: the part refused and what it is
    for text, refusal in (("x > avg(x)", "'AVG(x)' is an aggregate function"),
                          ("uid IN (SELECT 1)", "'(SELECT 1)' is a subquery"),
                          ("my_udf(x)", "'MY_UDF(x)' is an unknown function")):
        with pytest.raises(InvalidQueryError) as caught:
            run(where=text)
        assert str(caught.value) == f"the row filter may only test each row's own values; {refusal}"
    with pytest.raises(InvalidQueryError) as caught:
        run(where="x + 1")
    assert str(caught.value) == "the row filter 'x + 1' is not a condition (true or false per row)"
    with pytest.raises(InvalidQueryError, match="must be one condition, not several statements"):
        run(where="x > 1; SELECT 1")
    for empty in ("", "  "):
        with pytest.raises(InvalidQueryError) as caught:
            run(where=empty)
        assert str(caught.value) == 'the row filter must be a non-empty SQL condition, e.g. "age >= 18"'


def test_the_engine_asked_for_is_the_one_that_runs():
    """A prepared DuckDB backend is used as is, and refused by name when Spark is asked for; an
    unknown engine is refused with the choices; backend="spark" never falls back to DuckDB (without
    an active SparkSession it says so); only a Spark DataFrame is Spark input, told by its module
    and its temporary-view method together."""
    from dp_core.backend import DuckDBBackend
    from dp_core.backend_spark import is_spark_input
    from dp_core.engine_backend import open_backend

    prepared = DuckDBBackend.for_input(DF)
    assert open_backend(prepared, "duckdb") is prepared and open_backend(prepared) is prepared
    with pytest.raises(InvalidQueryError) as caught:
        open_backend(prepared, "spark")
    assert str(caught.value) == "backend='spark' was asked for, but the input is a prepared duckdb backend"
    with pytest.raises(InvalidQueryError) as caught:
        dp.execute(dp.Query([dp.sum_("x", 0, 10)], privacy_unit="uid", epsilon=1.0), DF, backend="dask")
    assert str(caught.value) == "unknown backend 'dask': choose one of duckdb, spark"
    try:
        chosen = open_backend(DF, "spark")
    except InvalidDataError as err:
        assert "needs a SparkSession" in str(err)
    else:
        assert chosen.dialect == "spark"
        chosen.close()
    column_like = type("Column", (), {"__module__": "pyspark.sql.column"})()
    viewable = type("Frame", (), {"createOrReplaceTempView": lambda self, name: None})()
    assert not is_spark_input(column_like) and not is_spark_input(viewable)
    with pytest.raises(InvalidDataError, match="unsupported input type Frame"):
        run(viewable)


@pytest.mark.parametrize("threads", [1, 3])
def test_the_duckdb_an_input_is_opened_on_runs_the_threads_it_is_given(threads):
    """open_backend's threads reach DuckDB: the platform runs a release on one thread by default to bound
    its memory (one hash table per thread), whatever the machine's cores."""
    from dp_core.engine_backend import open_backend

    backend = open_backend(DF, threads=threads)
    try:
        assert backend.run("SELECT current_setting('threads') AS t")["t"].tolist() == [threads]
    finally:
        backend.close()


def test_a_stream_of_record_batches_is_read_like_its_frame():
    """An Arrow stream (the escrow's decrypted batches) is scanned once into memory and released
    from the same exact values as the frame it holds."""
    import pyarrow as pa

    q = dict(aggregates=[dp.sum_("x", 0, 10, name="s"), dp.count(upper=1, name="n")], group_by=("g",),
             public_partitions=["a", "b"])
    stream = pa.RecordBatchReader.from_batches(pa.Schema.from_pandas(DF, preserve_index=False),
                                               pa.Table.from_pandas(DF, preserve_index=False).to_batches(max_chunksize=2))
    from_stream = run(stream, **q).controller_only.exact
    pd.testing.assert_frame_equal(from_stream, run(DF, **q).controller_only.exact)


def test_a_pyarrow_dataset_is_read_like_its_table(tmp_path):
    """A pyarrow Dataset (here Parquet files partitioned by a column, opened with pyarrow.dataset) is
    a pyarrow input like a Table: scanned by each query, released from the same exact values as the
    frame it holds, though it offers no Arrow C stream of its own."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    q = dict(aggregates=[dp.sum_("x", 0, 10, name="s"), dp.count(upper=1, name="n")], group_by=("g",),
             public_partitions=["a", "b"])
    ds.write_dataset(pa.Table.from_pandas(DF, preserve_index=False), tmp_path / "parts", format="parquet",
                     partitioning=ds.partitioning(pa.schema([("s", pa.string())]), flavor="hive"))
    dataset = ds.dataset(tmp_path / "parts", format="parquet", partitioning="hive")
    assert not hasattr(dataset, "__arrow_c_stream__")
    from_dataset = run(dataset, **q).controller_only.exact
    pd.testing.assert_frame_equal(from_dataset, run(DF, **q).controller_only.exact)


@pytest.mark.parametrize("columns, message", [
    (["uid", "x", "x"], "the input has the column 'x' twice, at positions 2 and 3: rename or drop one (each column "
                        "must have its own name)"),
    (["uid", "x", "X"], "the input has the column 'X' twice ('x' and 'X' differ only in case, which SQL ignores), at "
                        "positions 2 and 3: rename or drop one (each column must have its own name)"),
])
def test_a_column_name_given_twice_is_refused_with_both_positions(columns, message):
    with pytest.raises(InvalidDataError) as caught:
        run(pd.DataFrame([[1, 2.0, 3.0]], columns=columns))
    assert str(caught.value) == message


def test_nullable_missing_values_are_not_errors():
    df = DF.assign(x=pd.array([1.0, None, 3.0], dtype="Float64"))
    assert len(run(df).table) == 1


def test_null_unit_ids_are_refused_with_the_whole_remedy():
    with pytest.raises(InvalidDataError) as caught:
        run(DF.assign(uid=[1, None, 3]))
    assert str(caught.value) == ("1 row(s) have no privacy unit id (column 'uid' is null): every row must belong to "
                                 "a unit; fix or drop those rows")


def test_a_column_given_twice_in_an_arrow_stream_is_refused_naming_the_stream():
    import pyarrow as pa

    schema = pa.schema([("uid", pa.int64()), ("x", pa.float64()), ("X", pa.float64())])
    batch = pa.record_batch([pa.array([1, 2]), pa.array([1.0, 2.0]), pa.array([3.0, 4.0])], schema=schema)
    with pytest.raises(InvalidDataError) as caught:
        run(pa.RecordBatchReader.from_batches(schema, [batch]))
    assert str(caught.value) == ("the input stream has the column 'X' twice ('x' and 'X' differ only in case, "
                                 "which SQL ignores), at positions 2 and 3: rename or drop one (each column must "
                                 "have its own name)")


def test_a_column_given_twice_in_a_pyarrow_dataset_is_refused_naming_the_input():
    """A pyarrow Dataset is checked like a table: its column names, once each in any case."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    table = pa.Table.from_arrays([pa.array([1, 2]), pa.array([1.0, 2.0]), pa.array([3.0, 4.0])],
                                 names=["uid", "x", "X"])
    with pytest.raises(InvalidDataError) as caught:
        run(ds.dataset(table))
    assert str(caught.value) == ("the input has the column 'X' twice ('x' and 'X' differ only in case, which SQL "
                                 "ignores), at positions 2 and 3: rename or drop one (each column must have its own "
                                 "name)")


@pytest.mark.parametrize("name", ["rows.csv", "rows.csv.gz"])
def test_a_csv_with_a_header_and_no_data_row_is_refused(tmp_path, name):
    path = tmp_path / name
    text = b"uid,x\n\n"
    path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    with pytest.raises(InvalidDataError) as caught:
        run(str(path))
    assert str(caught.value) == f"{path} has a header row but no data rows: nothing can be released"


@pytest.mark.parametrize("name", ["rows.csv", "rows.csv.gz"])
def test_the_file_rules_read_only_a_file_s_first_mebibyte(tmp_path, name):
    """The header and first-row rules read the first MiB of a file (decompressed, for gzip), not the
    whole file: a byte that is not UTF-8 further on is left to the engine's reader."""
    from dp_core.input_checks import HEAD_BYTES, check_file

    rows = b"uid,x\n" + b"".join(b"%d,1.5\n" % i for i in range(HEAD_BYTES // 6))
    text = rows + b"99,\xff\n"
    assert len(rows) > HEAD_BYTES
    path = tmp_path / name
    path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    assert check_file(path) == name.split(".", 1)[1]


def test_a_short_csv_that_ends_inside_a_multi_byte_character_is_refused_as_not_utf8(tmp_path):
    """A file shorter than the head the rules read has no read limit to excuse a cut character: a
    last UTF-8 sequence left unfinished (0xc3 with nothing after it) is refused, naming that byte."""
    from dp_core.input_checks import check_file

    path = tmp_path / "rows.csv"
    path.write_bytes(b"uid,city\n1,K\xc3")
    with pytest.raises(InvalidDataError) as caught:
        check_file(path)
    assert str(caught.value) == f"{path} is not UTF-8 text (byte 0xc3 at offset 12): save it as UTF-8 CSV"


def test_a_csv_with_a_malformed_quoted_field_is_refused_as_bad_data_naming_the_file(tmp_path):
    """A quoted field with text after its closing quote is not the engine's CSV dialect: the head
    check leaves it to the reader, whose refusal names the file (never the csv module's own error)."""
    path = tmp_path / "rows.csv"
    path.write_bytes(b'uid,x\n1,"a"b\n2,c\n')
    with pytest.raises(InvalidDataError) as caught:
        run(str(path), aggregates=[dp.count(upper=1)])
    assert str(caught.value) == (f'cannot read {path} as CSV with a header row: Invalid Input Error: Error when '
                                 f'sniffing file "{path}".')


@pytest.mark.parametrize("aggregate, message", [
    (dp.var("x", 5, 5), "aggregate 'var_x': bounds must differ (L = U = 5 leaves nothing to learn)"),
    (dp.sum_("x", 0, 0), "aggregate 'sum_x': bounds [0, 0] make every sum 0"),
    (dp.sum_("x", 0, 10, weight=True), "aggregate 'sum_x': weight must be a positive number, got True"),
    (dp.sum_("x", 0, True), "aggregate 'sum_x': the upper bound must be a finite number, got True"),
    (dp.sum_("x", 0, "10"), "aggregate 'sum_x': the upper bound must be a finite number, got '10'"),
])
def test_an_aggregate_s_impossible_arguments_are_refused_word_for_word(aggregate, message):
    with pytest.raises(InvalidQueryError) as caught:
        run(aggregates=[aggregate])
    assert str(caught.value) == message


@pytest.mark.parametrize("weight", [0, -1.0, math.nan, math.inf, True, "2"])
def test_a_selection_weight_that_is_not_a_positive_number_is_refused_word_for_word(weight):
    """The selection's budget weight must be a finite number above 0: anything else is refused in one
    sentence naming the parameter and the value given."""
    with pytest.raises(InvalidQueryError) as caught:
        run(group_by=("g",), delta=1e-6, selection_weight=weight)
    assert str(caught.value) == f"selection_weight must be > 0, got {weight!r}"


def test_an_infinite_public_partition_key_is_refused_naming_it():
    df = pd.DataFrame({"uid": np.arange(100), "k": np.arange(100) % 2 * 1.5})
    with pytest.raises(InvalidQueryError) as caught:
        run(df, aggregates=[dp.count(upper=1)], group_by=("k",), public_partitions=[0.0, math.inf])
    assert str(caught.value) == "non-finite number inf in a query"


def test_a_file_named_parquet_holding_gzip_is_refused_saying_what_it_is(tmp_path):
    import gzip

    path = tmp_path / "rows.parquet"
    path.write_bytes(gzip.compress(b"uid,x\n1,2\n"))
    with pytest.raises(InvalidDataError) as caught:
        run(str(path))
    assert str(caught.value) == f"{path} is named .parquet but is not a Parquet file: it is gzip-compressed"


def test_an_empty_file_is_refused_as_empty_and_a_one_byte_file_for_what_it_lacks(tmp_path):
    """A file of 0 bytes is refused as empty; one of a single byte is not empty, and is refused for
    its missing data row (the byte is its header)."""
    empty, one = tmp_path / "empty.csv", tmp_path / "one.csv"
    empty.write_bytes(b"")
    one.write_bytes(b"x")
    with pytest.raises(InvalidDataError) as caught:
        run(str(empty))
    assert str(caught.value) == f"{empty} is empty (0 bytes): give a file with a header row and at least one data row"
    with pytest.raises(InvalidDataError) as caught:
        run(str(one))
    assert str(caught.value) == f"{one} has a header row but no data rows: nothing can be released"


@pytest.mark.parametrize("content, reason", [
    (gzip.compress(b"uid,x\n1,2\n", mtime=0)[:12], "Compressed file ended before the end-of-stream marker was reached"),
    (b"\x1f\x8b" + bytes(30), "Unknown compression method"),
])
def test_a_gzip_file_that_does_not_decompress_is_refused_with_the_reason(tmp_path, content, reason):
    """A .csv.gz that starts as gzip but is cut short or corrupt is refused naming the file, the
    decompressor's reason and the fix, before any engine reads it."""
    path = tmp_path / "rows.csv.gz"
    path.write_bytes(content)
    with pytest.raises(InvalidDataError) as caught:
        run(str(path))
    assert str(caught.value) == f"{path} is not a valid gzip file ({reason}): compress it again"


@pytest.mark.parametrize("kind", ["avg", "var", "stddev"])
@pytest.mark.parametrize("scope", ["dataset", "partition"])
def test_a_variance_bound_whose_square_would_overflow_is_refused_naming_it(kind, scope):
    """An AVG, VAR or STDDEV bound beyond +-2^100 is refused in one sentence naming it, whether the other
    bound is given or inferred (a lower bound of 1e300 with the upper inferred failed with Python's
    OverflowError, 'cannot convert float infinity to integer', while planning; an AVG within +-1e300
    came out with a zero-wide interval and an infinite noise SD); 2^100 itself is released."""
    df = pd.DataFrame({"uid": np.arange(400), "g": ["a", "b"] * 200, "x": np.arange(400) % 50 * 1.0})
    refusal = ("aggregate 's': the {} bound of a mean, variance or standard deviation must be within +-2^100 "
               "(about 1.27e30: beyond, its squares overflow), got {!r}")
    for bounds, side, value in (((1e300, None), "lower", 1e300), ((0, 2.0**101), "upper", 2.0**101),
                                ((-1e160, 1e160), "lower", -1e160)):
        with pytest.raises(InvalidQueryError) as caught:
            run(df, aggregates=[dp.Aggregate(kind, column="x", lower=bounds[0], upper=bounds[1], name="s")],
                group_by=("g",), bounds_scope=scope)
        assert str(caught.value) == refusal.format(side, value)
    released = run(df, aggregates=[dp.Aggregate(kind, column="x", lower=-(2.0**100), upper=2.0**100, name="s")],
                   group_by=("g",), bounds_scope=scope, delta=1e-6)
    assert list(released.table.columns[:2]) == ["g", "s"]


@pytest.mark.parametrize("kind", ["sum", "avg", "quantile"])
@pytest.mark.parametrize("bounds,side,value", [
    ((1e-320, 2e-320), "lower", 1e-320), ((0, 1e-300), "upper", 1e-300), ((1e-300, 1e-299), "lower", 1e-300),
    ((-5, -(2.0**-101)), "upper", -(2.0**-101)), ((0, 1e300), "upper", 1e300), ((-(2.0**101), 0), "lower", -(2.0**101)),
])
def test_a_bound_whose_noise_grid_underflows_or_overflows_is_refused_naming_it(kind, bounds, side, value):
    """Every statistic's bound is 0 or between 2^-100 and 2^100 in size (the class of issue 35's tiny
    epsilon: a number out of range crashes instead of refusing): SUM bounds of 1e-320 ended in
    ZeroDivisionError, 1e-300 in 'cannot convert float NaN to integer', and a SUM within +-1e300 released an
    overflowed value. An AVG beyond 2^100 keeps its own reason (the test above); the sizes at the limits run."""
    df = pd.DataFrame({"uid": np.arange(400), "g": ["a", "b"] * 200, "x": np.arange(400) % 50 * 1e-3})
    with pytest.raises(InvalidQueryError) as caught:
        run(df, aggregates=[dp.Aggregate(kind, column="x", lower=bounds[0], upper=bounds[1], name="s",
                                         q=0.5 if kind == "quantile" else None)], group_by=("g",))
    words = (f"aggregate 's': the {side} bound must be 0 or between 2^-100 and 2^100 in size (about 7.9e-31 to "
             f"1.27e30: beyond, the noise's grid underflows or its values overflow), got {value!r}")
    if kind == "avg" and abs(value) > 1:
        words = f"aggregate 's': the {side} bound of a mean, variance or standard deviation must be within +-2^100"
    assert str(caught.value).startswith(words)
    for lower, upper in ((2.0**-100, 2.0**-99), (-(2.0**100), 2.0**100)):
        released = run(df, aggregates=[dp.Aggregate(kind, column="x", lower=lower, upper=upper, name="s",
                                                     q=0.5 if kind == "quantile" else None)], group_by=("g",))
        assert np.isfinite(released.table["s"].astype(float)).all()


@pytest.mark.parametrize("upper", [2**31, 2**62, 1e300])
def test_a_count_s_row_bound_beyond_2_31_is_refused(upper):
    """A count's per-unit row bound of 2^62 released the interval [0, -9.2e18] (64-bit overflow), 1e300
    ended in OverflowError: refused in one line, as OPTIONS' max_groups_contributed is; 2^31 - 1 runs."""
    with pytest.raises(InvalidQueryError) as caught:
        run(aggregates=[dp.count(upper=upper)])
    assert str(caught.value) == (f"aggregate 'count': the per-unit row bound must be a whole number from 1 to "
                                 f"2^31 - 1, got {upper!r}")
    released = run(aggregates=[dp.count(upper=2**31 - 1)])
    assert (released.table["count_ci_high"] >= released.table["count_ci_low"]).all()


def test_a_row_filter_that_is_not_sql_is_refused_with_the_parser_s_reason():
    """An unfinished condition: refused in one line quoting the filter and the parser's reason."""
    with pytest.raises(InvalidQueryError) as caught:
        run(where="x >")
    assert str(caught.value).startswith("the row filter 'x >' is not valid SQL: Required keyword: 'expression' "
                                        "missing"), str(caught.value)
    assert "\n" not in str(caught.value)


def test_public_partitions_listing_a_key_twice_are_refused_whole():
    with pytest.raises(InvalidQueryError) as caught:
        dp.execute(dp.Query([dp.count()], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                            public_partitions=["a", "a"]), pd.DataFrame({"uid": [1, 2], "g": ["a", "b"]}))
    assert str(caught.value) == "public_partitions lists a key twice"


@pytest.mark.parametrize("key", [{"a": 1}, ["a"], ("a", ("b",))])
def test_public_partitions_holding_a_container_are_refused_in_one_line(key):
    """A dict, a list or a nested tuple is no partition key: one refusal, not a TypeError."""
    group_by = ("g", "h") if isinstance(key, tuple) else ("g",)
    with pytest.raises(InvalidQueryError) as caught:
        dp.execute(dp.Query([dp.count()], privacy_unit="uid", group_by=group_by, epsilon=1.0,
                            public_partitions=[key]), pd.DataFrame({"uid": [1, 2], "g": ["a", "b"], "h": ["b", "c"]}))
    assert str(caught.value).startswith("public partition keys must be plain values (text, numbers, dates), got ")
    assert "\n" not in str(caught.value)


def test_public_partitions_of_numpy_values_are_plain_values():
    import numpy as np

    result = dp.execute(dp.Query([dp.count(upper=2)], privacy_unit="uid", group_by=("g",), epsilon=1.0,
                                 public_partitions=[np.int64(1), np.int64(2)]),
                        pd.DataFrame({"uid": [1, 2, 3], "g": [1, 2, 2]}))
    assert sorted(result.table["g"]) == [1, 2]


@pytest.mark.parametrize("where, kind", [
    ("CAST(name AS INTEGER) > 3", "Conversion Error"),  # DuckDB: Could not convert string 'x-secret-7' ...
    ("CAST(x AS TINYINT) > 3", "Conversion Error"),  # ... Type INT64 with value 1234567 can't be cast ...
    ("strptime(name, '%Y') IS NULL", "Invalid Input Error"),  # ... Could not parse string "x-secret-7" ...
])
def test_a_query_failing_on_a_value_of_the_data_never_quotes_it(where, kind):
    """DuckDB quotes the value an operation failed on; the engine's refusal names the failure and the
    remedy, never the value (it would reach the store, the logs and the Prefect UI in plain text). A DP
    SELECT and a row filter no longer fail on a value (tests/test_sql_value_errors.py), so the engine's
    statement is given the failing expression directly."""
    from dp_core.backend import INPUT_NAME, DuckDBBackend

    backend = DuckDBBackend.for_input(pd.DataFrame({"uid": [1, 2, 3], "name": ["x-secret-7"] * 3, "x": [1, 2, 1234567]}))
    with pytest.raises(dp.InvalidDataError) as caught:
        backend.run(f"SELECT count(*) AS n FROM {INPUT_NAME} WHERE {where}")
    assert str(caught.value) == (
        f"the data engine could not run the query: {kind}: a value of the data does not fit the query (not shown: "
        "it is the data's); check the query's casts, arithmetic and formats, or filter such rows out")


@pytest.mark.parametrize("failing", ["CAST(name AS INTEGER) > 3", "strptime(name, '%Y') IS NULL"])
def test_a_value_of_the_data_never_reaches_an_error_from_a_table_the_engine_keeps(failing):
    """The statements that keep rows in a temporary table (MAD's bounded rows, the partials read by
    APPROX_BOUNDS and the plan, or by the PRIs: DuckDBBackend.keep) fail in the words of every other
    statement. Row filters and DP SQL no longer fail on a value (tests/test_sql_value_errors.py), so
    the keep is given a failing statement over the input directly."""
    from dp_core.backend import INPUT_NAME, DuckDBBackend

    backend = DuckDBBackend.for_input(pd.DataFrame({"uid": [1, 2, 3], "name": ["x-secret-7"] * 3}))
    with pytest.raises(dp.InvalidDataError) as caught:
        backend.keep("_kept", f"SELECT uid FROM {INPUT_NAME} WHERE {failing}")
    assert "x-secret-7" not in str(caught.value)
    assert str(caught.value).startswith("the data engine could not run the query: ")


@pytest.mark.parametrize("threads", ["auto", "2", 0, -1, 2.5, True])
@pytest.mark.parametrize("entry", ["execute", "run_sql"])
def test_a_number_of_threads_that_is_not_one_is_one_line(threads, entry):
    """`threads` is a whole number from 1 or None: the platform's `auto` (passed on unresolved, as
    bench/platform_scale.py did), a text, 0, a negative or a fraction is refused in one line by
    the query API and the SQL front end alike (int() or DuckDB's own words until 2026-11-29)."""
    from dp_core.sql import Table, run_sql

    query = dp.Query([dp.count(upper=1)], privacy_unit="uid", group_by=("g",), epsilon=1.0, delta=1e-6)
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6, privacy_unit_column = uid) "
           "g, COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM t GROUP BY g")
    with pytest.raises(dp.InvalidQueryError) as caught:
        if entry == "execute":
            dp.execute(query, DF, threads=threads)
        else:
            run_sql(sql, {"t": Table(DF, "uid")}, threads=threads)
    assert str(caught.value) == (f"threads={threads!r} is not a number of DuckDB threads: give a whole number from 1, "
                                 "or None for every core DuckDB is given")


def test_a_whole_number_of_threads_or_none_is_taken():
    """The numbers the platform passes (Settings.threads_now: an int, or None for `all`) and numpy's integers."""
    query = dp.Query([dp.count(upper=1)], privacy_unit="uid", group_by=("g",), epsilon=1.0, delta=1e-6)
    for threads in (1, 2, np.int64(2), None):
        assert len(dp.execute(query, DF, threads=threads).table) >= 0


def test_an_engine_error_on_the_query_itself_keeps_the_engine_s_words():
    """Only the errors raised on a value of the data lose DuckDB's words: a mistake of the query (here a
    function DuckDB does not know, which the front end leaves to it) keeps them, since they name only the
    query's parts and say how to mend it."""
    from dp_core.backend import DuckDBBackend

    backend = DuckDBBackend.for_input(pd.DataFrame({"uid": [1, 2, 3]}))
    with pytest.raises(dp.InvalidDataError) as caught:
        backend.run("SELECT no_such_function(uid) FROM dp_input")
    message = str(caught.value)
    assert message.startswith("the data engine could not run the query: Catalog Error: Scalar Function with name "
                              "no_such_function does not exist!")
    assert "not shown" not in message


def test_numpy_numbers_are_bounds_like_the_python_numbers_they_hold():
    """A bound taken from a DataFrame (np.int64, np.float64) is the number it holds: the query is the
    one written with Python numbers, and runs alike; a NumPy boolean is still no bound."""
    frame = pd.DataFrame({"uid": range(40), "x": [i % 7 for i in range(40)]})
    written = dp.Query([dp.count(upper=3), dp.sum_("x", 0, 6)], privacy_unit="uid", epsilon=1.0)
    taken = dp.Query([dp.count(upper=np.int64(3)), dp.sum_("x", np.int64(0), np.int64(frame["x"].max()))],
                     privacy_unit="uid", epsilon=1.0)
    assert taken == written
    assert dp.execute(taken, frame).explain() == dp.execute(written, frame).explain()
    with pytest.raises(InvalidQueryError, match=r"the lower bound must be a finite number, got np.True_"):
        dp.execute(dp.Query([dp.sum_("x", np.bool_(True), 6)], privacy_unit="uid", epsilon=1.0), frame)


def test_a_tsv_is_read_by_its_tabs_when_its_head_is_checked(tmp_path):
    """The file rules read a .tsv's head split at tabs: a column given twice is refused naming both
    positions, as in a CSV; a comma inside a value is just text."""
    from dp_core.input_checks import check_file

    twice = tmp_path / "dup.tsv"
    twice.write_text("uid\tx\tx\n1\t2\t3\n")
    with pytest.raises(InvalidDataError) as caught:
        check_file(twice)
    assert str(caught.value) == _x_twice(twice)
    fine = tmp_path / "fine.tsv"
    fine.write_text("uid\tnote\n1\ta,b\n")
    check_file(fine)


def test_a_row_filter_s_refusal_quotes_the_part_as_duckdb_writes_it():
    """The quoted part of a refused row filter is DuckDB's spelling of what was written (RANDOM(), not
    the generic RAND())."""
    from dp_core.row_filter import compile_filter

    with pytest.raises(InvalidQueryError) as caught:
        compile_filter("random() < 0.5")
    assert str(caught.value) == "the row filter may only test each row's own values; 'RANDOM()' is random()"


def test_a_statistic_or_group_key_named_units_or_released_is_refused_naming_the_exact_table_s_column():
    """The controller's table of exact values has columns "units" (people per group), "released"
    (whether the group was released) and, in a SQL statement's, "dp_select" of its own: a statistic or group
    key of any of these names overwrote one (the controller's page showed "yes" as a count's exact value, or
    failed), so it is refused saying which column it would take and how to rename it."""
    meanings = {"units": "the number of privacy units in each group", "released": "whether each group was released",
                "dp_select": "the number of the DP SELECT each row comes from, in a SQL statement's table"}
    for name, meaning in meanings.items():
        words = (f"the output name {name!r} is taken: the controller's table of exact values has a column of its "
                 f"own by that name ({meaning}); rename it, e.g. {name}_")
        with pytest.raises(InvalidQueryError) as caught:
            run(aggregates=[dp.count(name=name)])
        assert str(caught.value) == words
        with pytest.raises(InvalidQueryError) as caught:
            run(DF.rename(columns={"g": name}), group_by=(name,))
        assert str(caught.value) == words
    assert set(run(aggregates=[dp.count(name="units_")]).controller_only.exact.columns) == {"units", "units_",
                                                                                             "released"}


def test_a_count_given_a_lower_bound_other_than_zero_is_refused_as_the_count_would_not_use_it():
    """A count clamps each person's rows in a group to [0, upper]: a lower bound of 3 was accepted and
    silently not applied (people with one row counted once, and the analyst's page showed 3 as the lower
    bound used), so any lower bound but 0 is refused; 0, or none, is the count's own."""
    for lower in (3, -1, 0.5, math.nan):
        with pytest.raises(InvalidQueryError) as caught:
            run(aggregates=[dp.Aggregate("count", lower=lower, upper=2, name="n")])
        assert str(caught.value) == ("aggregate 'n': a count takes no lower bound (each person's rows in a group are "
                                     f"counted from 0 up to the upper bound): leave it out, got {lower!r}")
    for lower in (0, 0.0, None):
        assert run(aggregates=[dp.Aggregate("count", lower=lower, upper=2, name="n")]).mechanisms[0].sensitivity == 2


def test_a_group_key_or_statistic_named_like_another_statistic_s_interval_column_is_refused_in_python_and_sql():
    """The released table gives each statistic `<name>_ci_low`, `_ci_high` and `_noise_sd` beside it: a
    group key named `n_ci_high` beside `COUNT(*) AS n` had its released keys overwritten by the count's
    interval bounds (974, 1009, ... for 0, 1, 2), without a word. Such a name is refused, in the same
    words through the Python API and the SQL front end."""
    from dp_core.sql import Table, run_sql

    words = ("the output name 'n_ci_high' is taken: the released table gives the statistic 'n' a column of that name "
             "(n_ci_low, n_ci_high, n_noise_sd); rename one of them")
    data = pd.DataFrame({"uid": range(30), "n_ci_high": [i % 3 for i in range(30)]})
    with pytest.raises(InvalidQueryError) as caught:
        run(data, aggregates=[dp.count(name="n")], group_by=("n_ci_high",))
    assert str(caught.value) == words
    with pytest.raises(InvalidQueryError) as caught:
        run_sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6) n_ci_high, COUNT(*) AS n "
                "FROM people GROUP BY n_ci_high", {"people": Table(data, privacy_unit="uid")})
    assert str(caught.value).endswith(words)
    with pytest.raises(InvalidQueryError, match="'n_noise_sd' is taken: the released table gives the statistic 'n'"):
        run(data, aggregates=[dp.count(name="n"), dp.count(name="n_noise_sd")])
    assert list(run(data, aggregates=[dp.count(name="n")]).table.columns) == ["n", "n_ci_low", "n_ci_high",
                                                                              "n_noise_sd"]


@pytest.mark.parametrize("kind", ["count", "count_units", "sum", "avg", "var", "stddev", "quantile"])
@pytest.mark.parametrize("field", ["column", "lower", "upper", "q", "name"])
def test_an_aggregate_built_directly_with_a_field_left_none_is_refused_or_valid_never_a_crash(kind, field):
    """`Aggregate` is public: built directly, any optional field may be None. validate() either accepts
    it (a bound left out is inferred) or refuses it naming the aggregate; it never fails on its own
    label (a quantile without q: float(None) was a TypeError before the refusal could be written)."""
    full = {"column": "age", "lower": 0.0, "upper": 10.0, "q": 0.5, "name": None}
    aggregate = dp.Aggregate(kind, **{**full, field: None})
    try:
        aggregate.validate()
        dp.Query([aggregate], privacy_unit="id", epsilon=1.0).validate()
    except InvalidQueryError as refused:
        assert "aggregate" in str(refused) or "quantile" in str(refused), str(refused)
