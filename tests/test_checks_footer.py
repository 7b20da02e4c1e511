"""Data checks answered by the escrow's Parquet footer (issue 14): when the footer's statistics give
every expectation's exact count, no row is decoded, and the verdict and every line of the report
are those of the full scan; whenever they cannot (a value out of range, a float column, set
membership), the rows are scanned as before."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dprelease import admin, checks, escrow
from dprelease.pipeline import Platform
from dprelease.settings import Settings


@pytest.fixture()
def home(tmp_path):
    settings = Settings(home=tmp_path / "home", store_url=f"sqlite:///{tmp_path / 'home' / 'store.db'}",
                        key_dir=tmp_path / "keys")
    admin.init(settings)
    return settings


def _register(settings: Settings, tmp_path, name: str, table: pa.Table, monkeypatch, row_group: int = 1_000):
    """Register `table` (row groups of `row_group` rows at rest) and return its rows and a batch count."""
    monkeypatch.setattr(escrow.blobs, "BATCH_ROWS", row_group)
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path)
    admin.register_dataset(settings, name, path, "uid", epsilon_cap=5.0)
    ds = Platform.open(settings).store.get_dataset(name)
    decoded: list[int] = []
    rows = escrow.EscrowRows(ds.blob_path, Platform.open(settings).escrow_key(), ds.fingerprint, ds.file_format,
                             on_rows=decoded.append)
    return rows, decoded, ds


def _integers(rows: int = 5_000) -> pa.Table:
    uid = np.arange(rows) // 3
    val = pa.array([None if i % 997 == 0 else int(i % 50) - 7 for i in range(rows)], type=pa.int64())
    return pa.table({"uid": pa.array(uid, type=pa.int64()), "part": pa.array(uid % 13, type=pa.int32()), "val": val})


def _suites(columns: list[str]) -> dict[str, list[dict]]:
    between = "expect_column_values_to_be_between"
    return {
        "passes": [{"type": "expect_table_columns_to_match_set", "kwargs": {"column_set": columns, "exact_match": True}},
                   {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "uid"}},
                   {"type": between, "kwargs": {"column": "val", "min_value": -7, "max_value": 42}},
                   {"type": between, "kwargs": {"column": "part", "min_value": 0}}],
        "nulls fail": [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "val"}}],
        "columns fail": [{"type": "expect_table_columns_to_match_set",
                          "kwargs": {"column_set": ["uid", "val"], "exact_match": True}}],
    }


def test_the_footer_answers_null_counts_and_integer_ranges_without_decoding_a_row(home, tmp_path, monkeypatch):
    table = _integers()
    rows, decoded, _ds = _register(home, tmp_path, "ints", table, monkeypatch)
    for name, suite in _suites(table.column_names).items():
        decoded.clear()
        footer = checks.validate(rows, suite)
        assert decoded == [], f"{name}: the footer answers this suite, yet {sum(decoded)} rows were decoded"
        scanned = checks.validate(table, suite)  # the same rows, in memory: the engine's scan
        assert footer == scanned, name
    assert checks.validate(rows, _suites(table.column_names)["passes"]).success
    report = checks.validate(rows, _suites(table.column_names)["nulls fail"])
    assert not report.success and ": 6 unexpected value(s)" in report.lines[0]  # rows 0, 997, ... 4985


def test_the_statistics_are_summed_over_row_groups_including_all_null_ones(home, tmp_path, monkeypatch):
    val = pa.array([None] * 1_000 + list(range(1_000)) + [None] * 500 + [-3] + [None] * 499, type=pa.int64())
    table = pa.table({"uid": pa.array(np.arange(3_000), type=pa.int64()), "val": val})
    rows, _decoded, _ds = _register(home, tmp_path, "groups", table, monkeypatch)
    stats = rows.column_statistics()
    assert stats["val"] == escrow.blobs.ColumnStatistics(-3, 999, 1_999, "integer", 3_000)
    assert stats["uid"] == escrow.blobs.ColumnStatistics(0, 2_999, 0, "integer", 3_000)


@pytest.mark.parametrize("case", ["out of range", "float column", "set membership"])
def test_what_the_footer_cannot_count_exactly_is_scanned(home, tmp_path, monkeypatch, case):
    table = _integers()
    if case == "out of range":  # 40 distinct values above 2: the scan counts the rows
        suite = [{"type": "expect_column_values_to_be_between", "kwargs": {"column": "val", "max_value": 2}}]
    elif case == "float column":  # a NaN hides from a float column's footer statistics
        table = table.append_column("score", pa.array([float("nan") if i == 7 else 1.0 for i in range(len(table))]))
        suite = [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "score"}}]
    else:
        table = table.append_column("grp", pa.array(["a", "b", "c"] * (len(table) // 3) + ["a"] * (len(table) % 3)))
        suite = [{"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "grp", "value_set": ["a", "b"]}}]
    rows, decoded, _ds = _register(home, tmp_path, "scanned", table, monkeypatch)
    report = checks.validate(rows, suite)
    assert sum(decoded) >= len(table) and sum(decoded) % len(table) == 0, "these counts need the rows: a scan"
    assert not report.success, report.lines
    assert report == checks.validate(table, suite)


def test_a_release_checks_a_numeric_dataset_from_the_footer(home, tmp_path, monkeypatch):
    """The registered default suite of an all-integer dataset (the benchmark's shape) needs no scan."""
    from dprelease import pipeline

    table = _integers()
    _rows, _decoded, ds = _register(home, tmp_path, "numeric", table, monkeypatch)
    scans: list[int] = []
    original = escrow.blobs.open_batches
    monkeypatch.setattr(escrow.blobs, "open_batches", lambda *a, **k: scans.append(1) or original(*a, **k))
    report = pipeline.check_data(Platform.open(home), "numeric")
    assert report.success and len(report.lines) == len(json.loads(ds.expectations_json))
    assert scans == [1], "only the footer's reader (one open, no row group read) may run"


def test_at_rest_numbers_are_lz4_without_dictionaries_and_text_keeps_them(home, tmp_path, monkeypatch):
    """The encoding that makes registration and every scan fast (blobs.at_rest_encoding): a
    dictionary of a million distinct integer keys cost 40% of the write time and grew the file."""
    from dprelease.escrow import stream

    table = _integers().append_column("grp", pa.array(["a", "b"] * 2_500))
    _rows, _decoded, ds = _register(home, tmp_path, "encoded", table, monkeypatch)
    plain = stream.DecryptingFile(ds.blob_path, Platform.open(home).escrow_key(), ds.fingerprint)
    try:
        meta = pq.ParquetFile(plain).metadata
        chunks = {meta.row_group(0).column(j).path_in_schema: meta.row_group(0).column(j) for j in range(meta.num_columns)}
    finally:
        plain.close()
    assert {c.compression for c in chunks.values()} == {"LZ4"}
    assert not any("DICTIONARY" in e for name in ("uid", "part", "val") for e in chunks[name].encodings)
    assert any("DICTIONARY" in e for e in chunks["grp"].encodings)


def test_a_flat_column_named_like_a_struct_field_keeps_its_own_statistics(home, tmp_path, monkeypatch):
    """A column named "a.b" and field b of a struct a share the Parquet path "a.b": the footer's
    leaves are counted along the schema, never matched by name (found in review: the struct's
    statistics stood in for the flat column's, hiding its NULLs from the checks and the engine)."""
    import dp_core as dp

    n = 300
    table = pa.table({"uid": pa.array(np.arange(n), type=pa.int64()),
                      "a.b": pa.array([None if i % 10 == 0 else i for i in range(n)], type=pa.int64()),
                      "a": pa.array([{"b": i} for i in range(n)]), "part": pa.array(np.arange(n) % 3, type=pa.int32())})
    rows, _decoded, _ds = _register(home, tmp_path, "dotted", table, monkeypatch)
    assert rows.column_statistics()["a.b"] == escrow.blobs.ColumnStatistics(1, n - 1, 30, "integer", n)
    assert rows.column_statistics()["a"] is None
    suite = [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "a.b"}}]
    report = checks.validate(rows, suite)
    assert not report.success and ": 30 unexpected value(s)" in report.lines[0]
    query = dp.Query([dp.count(upper=3)], privacy_unit="a.b", group_by=("part",), epsilon=1.0, delta=1e-6,
                     max_partitions_contributed=2, public_partitions=[0, 1, 2])
    with pytest.raises(dp.InvalidDataError, match="30 row"):
        dp.execute(query, rows)


def test_an_infinite_bound_is_left_to_the_scan(home, tmp_path, monkeypatch):
    """A bound the scan refuses (an infinite number) is never judged by the footer: both paths agree."""
    table = _integers()
    rows, _decoded, _ds = _register(home, tmp_path, "inf", table, monkeypatch)
    suite = [{"type": "expect_column_values_to_be_between", "kwargs": {"column": "val", "max_value": float("inf")}}]
    from dp_core import InvalidQueryError

    for data in (rows, table):  # the escrow's stream, and the same rows in memory: the same refusal
        with pytest.raises(InvalidQueryError, match="non-finite number inf"):
            checks.validate(data, suite)
