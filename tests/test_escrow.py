"""The escrow (invariant 6): round trips for every format, ciphertext only on disk, wrong key and
tampering refused (every chunk-level attack on the streaming format), legacy Fernet blobs still
readable, key file handling, and no plaintext temp file when loading."""

from __future__ import annotations

import io
import os
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from cryptography.fernet import Fernet

from dprelease import escrow
from dprelease.escrow import (
    EscrowError,
    engine_files,
    file_fingerprint,
    load_frame,
    load_or_create_key,
    open_batches,
    open_blob,
    seal_file,
    stream,
)
from dprelease.settings import Settings

MARKER = "Zebulon-Quixotic-7731"  # a value that must never appear in ciphertext


def _settings(tmp_path: Path, escrow_key: str | None = None, key_dir: Path | None = None) -> Settings:
    home = tmp_path / "home"
    return Settings(
        home=home, store_url=f"sqlite:///{home / 'store.db'}", key_dir=key_dir or tmp_path / "keys", escrow_key=escrow_key
    )


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"person_id": [1, 2, 3], "name": [MARKER, "bob", "carol"], "age": [31.5, 42.0, 57.25]})


def _write(df: pd.DataFrame, path: Path) -> Path:
    if path.name.endswith(".parquet"):
        df.to_parquet(path, engine="pyarrow", index=False)
    else:
        df.to_csv(path, index=False, compression="gzip" if path.name.endswith(".gz") else None)
    return path


@pytest.mark.parametrize("filename, file_format", [("d.csv", "csv"), ("d.csv.gz", "csv.gz"), ("d.parquet", "parquet")])
def test_round_trip_and_ciphertext_only(tmp_path, filename, file_format):
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    source = _write(_frame(), tmp_path / filename)

    blob, digest, fmt = seal_file(source, settings, key)
    assert fmt == "parquet"  # at rest: Parquet, whatever the source format (file_format is the source's)
    assert file_format in ("csv", "csv.gz", "parquet")
    assert digest == file_fingerprint(source) == escrow.fingerprint(source.read_bytes())
    assert blob.parent == settings.escrow_dir and blob.name.startswith(digest) and blob.suffix == ".escrow"
    sealed = blob.read_bytes()
    assert MARKER.encode() not in sealed and b"carol" not in sealed and b"person_id" not in sealed
    assert [p.name for p in settings.escrow_dir.iterdir()] == [blob.name]  # no temp file left behind

    assert open_blob(blob, key, digest).startswith(b"PAR1")
    pd.testing.assert_frame_equal(load_frame(blob, key, digest, fmt), _frame(), check_dtype=False)
    again, _, _ = seal_file(source, settings, key)
    assert again != blob and again.read_bytes() != sealed  # each registration: its own blob and nonces


@pytest.mark.parametrize("filename", ["visits 'q1'.csv", "it''s.csv.gz"])
def test_a_csv_whose_folder_and_name_hold_single_quotes_is_sealed_with_its_rows(tmp_path, filename):
    """DuckDB reads a CSV source through SQL, where the path is a quoted literal: a single quote in
    the folder or the file name (a doubled one too) is escaped, so the file itself is read, whole."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    folder = tmp_path / "o'brien's data"
    folder.mkdir()
    source = _write(_frame(), folder / filename)
    blob, digest, fmt = seal_file(source, settings, key)
    assert (digest, fmt) == (file_fingerprint(source), "parquet")
    pd.testing.assert_frame_equal(load_frame(blob, key, digest, fmt), _frame(), check_dtype=False)


def test_a_sealed_csv_is_lz4_at_rest_with_dictionary_pages_for_its_text_only(tmp_path):
    """The Parquet a registration writes at rest follows blobs.at_rest_encoding: every column chunk
    LZ4-compressed, dictionary pages for the text column and none for the integer and float columns
    (a dictionary of a million distinct numbers slows the write and grows the file)."""
    import pyarrow.parquet as pq

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    meta = pq.ParquetFile(io.BytesIO(open_blob(blob, key, digest))).metadata
    chunks = {meta.row_group(0).column(j).path_in_schema: meta.row_group(0).column(j) for j in range(meta.num_columns)}
    assert {name: chunk.compression for name, chunk in chunks.items()} == {
        "person_id": "LZ4", "name": "LZ4", "age": "LZ4"}
    assert {name: any("DICTIONARY" in e for e in chunk.encodings) for name, chunk in chunks.items()} == {
        "person_id": False, "name": True, "age": False}


def test_unsupported_suffix_and_misnamed_file_refused(tmp_path):
    settings = _settings(tmp_path)
    key = Fernet.generate_key()
    xlsx = tmp_path / "d.xlsx"
    xlsx.write_bytes(b"whatever")
    with pytest.raises(EscrowError, match=r"d\.xlsx.*\.csv\.gz, \.csv, \.parquet"):
        seal_file(xlsx, settings, key)
    fake_gz = _write(_frame(), tmp_path / "plain.csv")
    fake_gz = fake_gz.rename(tmp_path / "plain.csv.gz")
    with pytest.raises(EscrowError, match="not gzip"):
        seal_file(fake_gz, settings, key)
    with pytest.raises(EscrowError, match="no such file"):
        seal_file(tmp_path / "missing.csv", settings, key)


def test_wrong_key_and_tampering_refused(tmp_path):
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)

    with pytest.raises(EscrowError, match="wrong escrow key"):
        open_blob(blob, Fernet.generate_key(), digest)

    # a validly encrypted blob of another file (swapped blob) fails the fingerprint check
    other, _, _ = seal_file(_write(_frame().head(1), tmp_path / "other.csv"), settings, key)
    with pytest.raises(EscrowError, match="does not match the registered fingerprint"):
        open_blob(other, key, digest)
    with pytest.raises(EscrowError, match="wrong escrow key or the blob was altered"):  # header changed
        data = bytearray(blob.read_bytes())
        data[stream.FIXED_SIZE + 3] ^= 1
        (tmp_path / "header.escrow").write_bytes(bytes(data))
        open_blob(tmp_path / "header.escrow", key, digest)

    with pytest.raises(EscrowError, match="missing"):
        open_blob(tmp_path / "gone.fernet", key, digest)


def test_key_file_created_private_and_reused(tmp_path):
    settings = _settings(tmp_path)
    with pytest.raises(EscrowError, match="dprelease init.*DPRELEASE_ESCROW_KEY"):
        load_or_create_key(settings, create=False)
    key = load_or_create_key(settings, create=True)
    assert stat.S_IMODE(settings.escrow_key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(settings.key_dir.stat().st_mode) == 0o700
    assert load_or_create_key(settings, create=False) == key
    assert load_or_create_key(settings, create=True) == key  # never replaced once it exists


def test_loose_key_file_refused(tmp_path):
    settings = _settings(tmp_path)
    load_or_create_key(settings, create=True)
    os.chmod(settings.escrow_key_file, 0o644)
    with pytest.raises(EscrowError, match="chmod 600"):
        load_or_create_key(settings, create=False)


@pytest.mark.parametrize("inside", ["escrow", "published", "archive"])
def test_key_inside_a_data_directory_refused(tmp_path, inside):
    settings = _settings(tmp_path, key_dir=tmp_path / "home" / inside / "keys")
    with pytest.raises(EscrowError) as caught:
        load_or_create_key(settings, create=True)
    label, directory = {"escrow": ("escrow", settings.escrow_dir),
                        "published": ("publication", settings.publication_dir),
                        "archive": ("archive", settings.archive_dir)}[inside]
    assert str(caught.value) == (
        f"the escrow key file {settings.escrow_key_file.resolve()} is inside the {label} directory "
        f"{directory.resolve()}: keep keys apart from the data (set DPRELEASE_KEY_DIR elsewhere) or set "
        "DPRELEASE_ESCROW_KEY")
    assert not settings.escrow_key_file.exists()


def test_escrow_key_setting_takes_precedence(tmp_path):
    env_key = Fernet.generate_key()
    settings = _settings(tmp_path, escrow_key=env_key.decode())
    assert load_or_create_key(settings, create=True) == env_key
    assert not settings.escrow_key_file.exists()  # no key file made when the key is given
    blob, digest, fmt = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, env_key)
    assert load_frame(blob, env_key, digest, fmt)["name"].tolist()[0] == MARKER

    bad = _settings(tmp_path, escrow_key="not-a-key")
    with pytest.raises(EscrowError, match="DPRELEASE_ESCROW_KEY is not a valid Fernet key"):
        load_or_create_key(bad, create=False)
    not_ascii = _settings(tmp_path, escrow_key="clé-" + env_key.decode()[4:])  # refused the same way
    with pytest.raises(EscrowError, match="DPRELEASE_ESCROW_KEY is not a valid Fernet key"):
        load_or_create_key(not_ascii, create=False)


def test_settings_from_env_key_is_used(tmp_path):
    env_key = Fernet.generate_key().decode()
    settings = Settings.from_env({"DPRELEASE_HOME": str(tmp_path / "h"), "DPRELEASE_ESCROW_KEY": env_key})
    assert load_or_create_key(settings, create=False) == env_key.encode()


def _listing(root: Path, recursive: bool) -> set[str]:
    """Names under a directory (recursively or not), ignoring entries that vanish while listing."""
    if not recursive:
        return set(os.listdir(root))
    return {str(p) for p in root.rglob("*")}


@pytest.mark.parametrize("filename", ["d.csv", "d.csv.gz", "d.parquet"])
def test_load_frame_writes_no_file(tmp_path, monkeypatch, filename):
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, fmt = seal_file(_write(_frame(), tmp_path / filename), settings, key)

    # route Python's temp files somewhere watched as well, then compare listings before and after
    watched_tmp = tmp_path / "tmp"
    watched_tmp.mkdir()
    system_tmp = Path(tempfile.gettempdir())
    before_system = _listing(system_tmp, recursive=False)
    monkeypatch.setattr(tempfile, "tempdir", str(watched_tmp))
    monkeypatch.setenv("TMPDIR", str(watched_tmp))
    before_tree = _listing(tmp_path, recursive=True)

    df = load_frame(blob, key, digest, fmt)

    assert df["name"].tolist()[0] == MARKER
    assert _listing(tmp_path, recursive=True) == before_tree
    assert _listing(system_tmp, recursive=False) - before_system == set()


def test_a_bad_key_is_refused_with_a_command_that_makes_a_good_one(tmp_path):
    """The refusal of a malformed key tells how to make a valid one: that command, run as given,
    prints a key the escrow accepts."""
    bad = _settings(tmp_path, escrow_key="not-a-key")
    with pytest.raises(EscrowError) as caught:
        load_or_create_key(bad, create=False)
    command = re.search(r"`python -c '([^']+)'`", str(caught.value))
    assert command, str(caught.value)
    made = subprocess.run([sys.executable, "-c", command.group(1)], capture_output=True, text=True, check=True)
    key = made.stdout.strip()
    assert load_or_create_key(_settings(tmp_path, escrow_key=key), create=False) == key.encode()


def test_a_malformed_key_is_refused_naming_where_it_came_from(tmp_path):
    """The key file, the setting, or the caller of the escrow's readers: the refusal says which."""
    settings = _settings(tmp_path)
    load_or_create_key(settings, create=True)
    settings.escrow_key_file.write_bytes(b"not-a-key\n")
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), _settings(tmp_path / "other"),
                                Fernet.generate_key())
    for read, source in ((lambda: load_or_create_key(settings, create=False), str(settings.escrow_key_file)),
                         (lambda: open_blob(blob, b"not-a-key", digest), "the caller"),
                         (lambda: open_batches(blob, b"not-a-key", digest), "the caller")):
        with pytest.raises(EscrowError) as caught:
            read()
        assert str(caught.value).startswith(f"the escrow key from {source} is not a valid Fernet key "), \
            str(caught.value)


def test_sealing_a_file_numbers_its_rows_when_asked(tmp_path):
    """seal_file passes its options on: a row-number column (datasets without a unit column get one)
    comes out of the blob first, 0-based."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key, row_number_column="row_id")
    table = open_batches(blob, key, digest).read_all()
    assert table.column_names == ["row_id", "person_id", "name", "age"]
    assert table["row_id"].to_pylist() == [0, 1, 2]


def test_a_source_read_in_several_batches_is_numbered_and_counted_across_them(tmp_path):
    """Row numbers run on from one batch to the next (0 to n - 1, no restart), and the sealed blob
    records every row and one row group per batch."""
    from dprelease.escrow.blobs import read_source, seal_source

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    frame = pd.DataFrame({"person_id": range(10), "age": [30.5] * 10})
    source_path = _write(frame, tmp_path / "d.parquet")
    sealed = seal_source(source_path, read_source(source_path, batch_rows=4), file_fingerprint(source_path), settings,
                         key, row_number_column="row_id")
    assert (sealed.rows, sealed.row_groups) == (10, 3)
    table = open_batches(sealed.path, key, sealed.fingerprint).read_all()
    assert table["row_id"].to_pylist() == list(range(10)) and table["person_id"].to_pylist() == list(range(10))


def test_a_sealed_blob_s_footer_gives_each_column_s_statistics_over_every_row_group(tmp_path):
    """EscrowRows.column_statistics: from the footer registration wrote (numbers without dictionary
    pages, text with), each flat column's least and greatest value and NULL count over all row
    groups, not the last one's; a map column (two leaf columns) gets none and does not shift the
    columns after it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dprelease.escrow.blobs import ColumnStatistics, EscrowRows, at_rest_encoding, read_source, seal_source

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    table = pa.table({"person_id": pa.array(range(10), pa.int64()),
                      "tags": pa.array([[("k", i)] for i in range(10)], pa.map_(pa.string(), pa.int64())),
                      "age": pa.array([30.5, None, 20.0, 41.0, 35.0, 22.5, 50.0, 33.0, 28.0, 47.5]),
                      "name": pa.array(["b", "a", "c", None, "d", "e", "f", "g", "h", "z"])})
    assert at_rest_encoding(table.schema) == {"compression": "lz4", "use_dictionary": ["tags", "name"]}
    source_path = tmp_path / "d.parquet"
    pq.write_table(table, source_path)
    sealed = seal_source(source_path, read_source(source_path, batch_rows=4), file_fingerprint(source_path), settings,
                         key)
    stats = EscrowRows(sealed.path, key, sealed.fingerprint).column_statistics()
    assert stats == {"person_id": ColumnStatistics(0, 9, 0, "integer", 10), "tags": None,
                     "age": ColumnStatistics(20.0, 50.0, 1, "float", 10), "name": ColumnStatistics("a", "z", 1, "other", 10)}


def test_a_missing_blob_is_named_by_every_reader(tmp_path):
    """A blob removed behind the store's back: whichever way it is opened (whole, batch by batch,
    as a frame, as the engine's replayable rows), the one-line error names the file and the fix."""
    key = Fernet.generate_key()
    gone = tmp_path / "gone.escrow"
    digest = escrow.fingerprint(b"registered")
    readers = {"open_blob": lambda: open_blob(gone, key, digest),
               "open_batches": lambda: open_batches(gone, key, digest),
               "load_frame": lambda: load_frame(gone, key, digest, "parquet"),
               "EscrowRows": lambda: escrow.EscrowRows(gone, key, digest)}
    for name, read in readers.items():
        with pytest.raises(EscrowError) as caught:
            read()
        assert str(caught.value) == f"the escrow blob {gone} is missing: register the dataset again", name


def test_a_csv_broken_past_the_sniffed_rows_is_refused_in_one_line(tmp_path):
    """DuckDB reads a CSV's dialect from its first rows; a row with an extra field further down shows
    only while the batches stream into the blob. It is refused like an early fault, in the engine's
    words (dp_core.input_checks.csv_read_error): one line that names the file, the line at fault and
    its number of fields, and nothing left in the escrow."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    source = tmp_path / "late.csv"
    rows = "\n".join(f"{i},{i % 7}" for i in range(50_000))
    source.write_text(f"person_id,visits\n{rows}\n1,2,3\n4,5\n")  # the header is line 1: 1,2,3 is 50002
    with pytest.raises(EscrowError) as caught:
        seal_file(source, settings, key)
    message = str(caught.value)
    assert message == (f"{source}, line 50002: 3 fields, but the header (line 1) has 2: every row needs one field "
                       "per column (put a value holding a comma in double quotes); fix or remove that row")
    assert not list(settings.escrow_dir.iterdir())  # no blob, no temporary file


def test_parse_bytes_rejects_unknown_format():
    with pytest.raises(EscrowError, match="unknown file format 'xlsx'"):
        escrow.parse_bytes(b"", "xlsx")


def test_legacy_fernet_blobs_stay_readable(tmp_path):
    """Blobs of the first format (one Fernet token over the source file) still open."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    for name in ("d.csv", "d.parquet"):
        source = _write(_frame(), tmp_path / name)
        legacy = tmp_path / f"{name}.fernet"
        legacy.write_bytes(Fernet(key).encrypt(source.read_bytes()))
        fmt = escrow.file_format_of(source)
        digest = escrow.fingerprint(source.read_bytes())
        pd.testing.assert_frame_equal(load_frame(legacy, key, digest, fmt), _frame(), check_dtype=False)
        assert open_batches(legacy, key, digest, fmt).read_all().num_rows == 3
        # a validly encrypted legacy blob of another file (swapped), a wrong key, an altered token
        with pytest.raises(EscrowError, match="does not match the registered fingerprint"):
            load_frame(legacy, key, escrow.fingerprint(b"another file"), fmt)
        with pytest.raises(EscrowError, match="does not match the registered fingerprint"):
            open_batches(legacy, key, escrow.fingerprint(b"another file"), fmt).read_all()
        with pytest.raises(EscrowError, match="wrong escrow key or the blob was altered"):
            load_frame(legacy, Fernet.generate_key(), digest, fmt)
        token = bytearray(legacy.read_bytes())
        token[-5] = ord("A") if token[-5] != ord("A") else ord("B")  # base64 text: stays decodable
        legacy.write_bytes(bytes(token))
        with pytest.raises(EscrowError, match="wrong escrow key or the blob was altered"):
            load_frame(legacy, key, digest, fmt)


def test_a_legacy_gzip_csv_blob_reads_back_as_its_rows(tmp_path):
    """A blob of the first format holding a gzip-compressed CSV (file format csv.gz) decrypts and
    decompresses into the source's rows, through load_frame and through open_batches."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    source = _write(_frame(), tmp_path / "d.csv.gz")
    legacy = tmp_path / "d.csv.gz.fernet"
    legacy.write_bytes(Fernet(key).encrypt(source.read_bytes()))
    digest = escrow.fingerprint(source.read_bytes())
    pd.testing.assert_frame_equal(load_frame(legacy, key, digest, "csv.gz"), _frame(), check_dtype=False)
    assert open_batches(legacy, key, digest, "csv.gz").read_all().column("name").to_pylist() == [MARKER, "bob", "carol"]


def test_legacy_blobs_are_replayable_rows_for_the_engine(tmp_path):
    """EscrowRows over a legacy Fernet blob: the right fingerprint gives the rows, again at every
    scan; another file's fingerprint is refused when the rows are made, before any engine work."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    source = _write(_frame(), tmp_path / "d.csv")
    legacy = tmp_path / "d.csv.fernet"
    legacy.write_bytes(Fernet(key).encrypt(source.read_bytes()))
    rows = escrow.EscrowRows(legacy, key, escrow.fingerprint(source.read_bytes()), "csv")
    for _scan in range(2):
        pd.testing.assert_frame_equal(rows.reader().read_all().to_pandas(), _frame(), check_dtype=False)
    with pytest.raises(EscrowError, match="does not match the registered fingerprint"):
        escrow.EscrowRows(legacy, key, escrow.fingerprint(b"another file"), "csv")


def test_every_scan_of_escrowed_rows_reports_each_batch_it_reads(tmp_path):
    """The release's progress (`on_rows`) sees every batch of every scan, for streamed and legacy
    blobs alike, as Arrow streams and through DuckDB's own reader: two full scans of three rows
    report six rows each way."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    source = _write(_frame(), tmp_path / "d.csv")
    digest = escrow.fingerprint(source.read_bytes())
    legacy = tmp_path / "d.csv.fernet"
    legacy.write_bytes(Fernet(key).encrypt(source.read_bytes()))
    streamed, _, _ = seal_file(source, settings, key)
    for blob, fmt in ((streamed, "parquet"), (legacy, "csv")):
        seen: list[int] = []
        rows = escrow.EscrowRows(blob, key, digest, fmt, on_rows=seen.append)
        assert seen == []  # checking the key and fingerprint reads no rows
        for _scan in range(2):
            assert rows.reader().read_all().num_rows == 3
        assert sum(seen) == 6, (blob.name, seen)
        seen.clear()
        con = duckdb.connect(":memory:")
        reader = rows.duckdb_reader(con) or "rows"  # a legacy blob: its Arrow stream
        if reader == "rows":
            con.register("rows", rows)
        for _scan in range(2):
            assert con.execute(f"SELECT count(*), sum(age) FROM {reader}").fetchall() == [(3, 130.75)]
        assert sum(seen) == 6, (blob.name, seen)


CHUNK = 64  # tiny chunks, so a three-row file spans many


def _chunked_blob(tmp_path):
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key, chunk_size=CHUNK)
    data = blob.read_bytes()
    header, body = data[:stream.HEADER_SIZE], data[stream.HEADER_SIZE:]
    size = CHUNK + stream.TAG_SIZE
    chunks = [body[i:i + size] for i in range(0, len(body), size)]
    assert len(chunks) > 4
    return key, digest, header, chunks


def _tampered(chunks, attack: str) -> list[bytes]:
    out = list(chunks)
    if attack == "changed chunk":
        out[2] = bytes([out[2][0] ^ 1]) + out[2][1:]
    elif attack == "changed tag only":
        out[1] = out[1][:-1] + bytes([out[1][-1] ^ 0x80])
    elif attack == "dropped chunk":
        del out[2]
    elif attack == "dropped final chunk":
        del out[-1]
    elif attack == "reordered chunks":
        out[1], out[2] = out[2], out[1]
    elif attack == "truncated chunk":
        out[-1] = out[-1][:-5]
    elif attack == "appended chunk":
        out.append(out[1])
    elif attack == "duplicated chunk":
        out.insert(2, out[2])
    return out


ATTACKS = ["changed chunk", "changed tag only", "dropped chunk", "dropped final chunk", "reordered chunks",
           "truncated chunk", "appended chunk", "duplicated chunk"]


@pytest.mark.parametrize("attack", ATTACKS)
def test_every_chunk_attack_is_refused_with_one_message(tmp_path, attack):
    key, digest, header, chunks = _chunked_blob(tmp_path)
    blob = tmp_path / "attacked.escrow"
    blob.write_bytes(header + b"".join(chunks))
    assert load_frame(blob, key, digest, "parquet")["name"].tolist()[0] == MARKER  # intact: opens
    blob.write_bytes(header + b"".join(_tampered(chunks, attack)))
    for read in (lambda: open_blob(blob, key, digest), lambda: load_frame(blob, key, digest, "parquet")):
        with pytest.raises(EscrowError) as caught:
            read()
        # the whole message: which blob, where, what may have happened, and the two ways out
        assert re.fullmatch(rf"the escrow blob {re.escape(str(blob))} failed authentication at chunk \d+ of \d+: it "
                            "was altered, truncated, reordered or extended; restore it from a backup or register the "
                            "dataset again", str(caught.value)), str(caught.value)


def test_the_refusal_names_the_chunk_that_failed(tmp_path):
    """A changed third chunk of N is refused as "chunk 3 of N" (numbered from 1), the others intact."""
    key, digest, header, chunks = _chunked_blob(tmp_path)
    blob = tmp_path / "attacked.escrow"
    blob.write_bytes(header + b"".join(_tampered(chunks, "changed chunk")))
    with pytest.raises(EscrowError, match=rf"failed authentication at chunk 3 of {len(chunks)}: "):
        open_blob(blob, key, digest).read()


def test_a_sealed_writer_refuses_further_writes():
    """After finish() sealed the final chunk, a write is refused: its bytes would follow the final
    chunk unsealed, lost to every reader."""
    out = io.BytesIO()
    writer = stream.EncryptingWriter(out, Fernet.generate_key(), "00" * 32, chunk_size=CHUNK)
    writer.write(b"rows")
    writer.finish()
    sealed = out.getvalue()
    with pytest.raises(ValueError, match="^the escrow blob is already sealed$"):
        writer.write(b"more rows")
    assert out.getvalue() == sealed


def test_the_data_engine_never_spills_to_disk():
    """The engine's DuckDB has no temporary directory: a query larger than memory fails rather than
    writing decrypted rows to disk (moved here from test_cli.py so that mutation testing runs it)."""
    from dp_core.backend import DuckDBBackend

    backend = DuckDBBackend.for_input(pd.DataFrame({"a": [1]}))
    assert backend.run("SELECT current_setting('temp_directory') AS t")["t"].iloc[0] == ""


def test_a_writer_past_two_to_the_32_chunks_refuses_to_seal_more():
    """Chunk numbers are 32-bit in the nonce: after 2^32 chunks (set here, not written) the next chunk is
    refused with the reason, never sealed under a repeated nonce."""
    out = io.BytesIO()
    writer = stream.EncryptingWriter(out, Fernet.generate_key(), "00" * 32, chunk_size=CHUNK)
    writer._index = 1 << 32  # as if 2^32 chunks had been sealed
    before = out.getvalue()
    with pytest.raises(EscrowError) as refused:
        writer.finish()
    assert str(refused.value) == "the dataset is too large for one escrow blob (2^32 chunks)"
    assert out.getvalue() == before


def test_release_from_an_attacked_blob_reports_the_escrow_error(tmp_path):
    """Through the engine (DuckDB reading the batches), the escrow's message comes out."""
    import dp_core as dp

    key, digest, header, chunks = _chunked_blob(tmp_path)
    blob = tmp_path / "attacked.escrow"
    blob.write_bytes(header + b"".join(_tampered(chunks, "changed chunk")))
    failures: list = []
    query = dp.Query([dp.count(upper=1)], privacy_unit="person_id", epsilon=1.0)
    with pytest.raises((dp.InvalidDataError, EscrowError), match="failed authentication at chunk"):
        dp.execute(query, open_batches(blob, key, digest, failures=failures))


@pytest.mark.parametrize("attack", ATTACKS)
def test_every_chunk_attack_is_refused_through_the_engine_s_own_parquet_reader(tmp_path, attack):
    """The release's path: DuckDB reads the blob's Parquet itself through the decrypting filesystem
    (EscrowRows.duckdb_reader). A query that needs every column reads every chunk, and each attack is
    refused with the escrow's whole message: when the rows are opened (the footer's chunks), or from
    inside DuckDB, where `failures` keeps the escrow's own error for the caller to report."""
    import dp_core as dp

    key, digest, header, chunks = _chunked_blob(tmp_path)
    blob = tmp_path / "attacked.escrow"
    blob.write_bytes(header + b"".join(chunks))
    query = dp.Query([dp.count(upper=1), dp.sum_("age", 0, 100)], privacy_unit="person_id", group_by=("name",),
                     public_partitions=[MARKER, "bob", "carol"], epsilon=1.0)
    assert len(dp.execute(query, escrow.EscrowRows(blob, key, digest)).table) == 3  # intact: released
    blob.write_bytes(header + b"".join(_tampered(chunks, attack)))
    rows = None
    with pytest.raises((dp.InvalidDataError, EscrowError)) as caught:
        rows = escrow.EscrowRows(blob, key, digest)
        dp.execute(query, rows)
    error = caught.value if isinstance(caught.value, EscrowError) else rows.failures[0]
    assert re.fullmatch(rf"the escrow blob {re.escape(str(blob))} failed authentication at chunk \d+ of \d+: it "
                        "was altered, truncated, reordered or extended; restore it from a backup or register the "
                        "dataset again", str(error)), str(error)


def _grouped_blob(tmp_path, monkeypatch, rows: int = 6_000):
    """A blob of `rows` rows in row groups of 500, in 1 KiB chunks: many groups, many chunks."""
    monkeypatch.setattr(escrow.blobs, "BATCH_ROWS", 500)
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    frame = pd.DataFrame({"person_id": range(rows), "age": [float(i % 90) for i in range(rows)]})
    blob, digest, _ = seal_file(_write(frame, tmp_path / "g.csv"), settings, key, chunk_size=1024)
    return blob, key, digest, float(frame["age"].sum())


@pytest.mark.parametrize("attack", ["changed chunk", "reordered chunks", "dropped chunk", "truncated chunk"])
def test_a_blob_attacked_after_the_engine_opened_it_is_refused_with_the_escrow_s_words(tmp_path, monkeypatch,
                                                                                        attack):
    """The blob is changed once the engine's reader is registered (its footer read and checked): the
    scan is refused, and `failures` holds the escrow's own error, whatever DuckDB makes of it."""
    blob, key, digest, total = _grouped_blob(tmp_path, monkeypatch)
    rows = escrow.EscrowRows(blob, key, digest)
    con = duckdb.connect(":memory:", config={"temp_directory": ""})
    reader = rows.duckdb_reader(con)
    assert con.execute(f"SELECT sum(age) FROM {reader}").fetchall() == [(total,)]
    data = blob.read_bytes()
    header, body = data[:stream.HEADER_SIZE], data[stream.HEADER_SIZE:]
    size = 1024 + stream.TAG_SIZE
    chunks = [body[i:i + size] for i in range(0, len(body), size)]
    middle = len(chunks) // 2
    attacked = _tampered(chunks[middle - 2:], attack)  # the attack lands mid-file, among row groups
    blob.write_bytes(header + b"".join(chunks[:middle - 2] + attacked))
    with pytest.raises(duckdb.Error):
        con.execute(f"SELECT sum(age) FROM {reader}").fetchall()
    assert rows.failures, attack
    assert re.search(r"failed authentication at chunk \d+ of \d+|changed while it was being read",
                     str(rows.failures[0])), str(rows.failures[0])


def test_duckdb_threads_reading_one_escrowed_file_at_once_each_read_their_own_bytes(tmp_path, monkeypatch):
    """DuckDB's threads share one handle, each seeking and then reading: with four threads over twelve
    row groups every value is read exactly once (a shared position would mix their reads up)."""
    blob, key, digest, total = _grouped_blob(tmp_path, monkeypatch)
    rows = escrow.EscrowRows(blob, key, digest)
    con = duckdb.connect(":memory:", config={"temp_directory": ""})
    con.execute("SET threads = 4")
    reader = rows.duckdb_reader(con)
    for _scan in range(5):
        assert con.execute(f"SELECT count(*), sum(age), sum(person_id) FROM {reader}").fetchall() == \
            [(6_000, total, 6_000 * 5_999 // 2)]


def test_the_engine_s_reader_holds_the_key_only_on_its_own_connection(tmp_path):
    """The decrypting filesystem is registered on the engine's connection alone, under a name of its
    own, and is never kept in fsspec's instance cache (it holds the key)."""
    import fsspec

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    rows = escrow.EscrowRows(blob, key, digest)
    first, second, bystander = duckdb.connect(), duckdb.connect(), duckdb.connect()
    readers = [rows.duckdb_reader(first), rows.duckdb_reader(second)]
    assert readers[0] != readers[1]  # each registration its own protocol
    assert first.execute(f"SELECT count(*) FROM {readers[0]}").fetchall() == [(3,)]
    with pytest.raises(duckdb.Error):
        bystander.execute(f"SELECT count(*) FROM {readers[0]}").fetchall()
    assert not engine_files.DecryptingFileSystem.cachable
    assert not any(isinstance(fs, engine_files.DecryptingFileSystem)
                   for fs in getattr(fsspec.AbstractFileSystem, "_cache", {}).values())


def test_a_sql_connection_locked_to_its_tables_still_reads_each_escrowed_blob(tmp_path):
    """The SQL front end's connections (DuckDBBackend.for_tables) read no file but their tables' own:
    two escrowed tables, each read through its own decrypting filesystem, stay readable once external
    access is off, while a plain file beside them is refused."""
    from dp_core.backend import DuckDBBackend

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    first, digest_1, _ = seal_file(_write(_frame(), tmp_path / "a.csv"), settings, key)
    second, digest_2, _ = seal_file(_write(_frame().head(2), tmp_path / "b.csv"), settings, key)
    backend = DuckDBBackend.for_tables({"a": escrow.EscrowRows(first, key, digest_1),
                                        "b": escrow.EscrowRows(second, key, digest_2)})
    try:
        assert len(backend.connection.list_filesystems()) == 2  # one decrypting filesystem per blob
        counts = backend.run("SELECT (SELECT count(*) FROM a) AS a, (SELECT count(*) FROM b) AS b")
        assert counts.iloc[0].tolist() == [3, 2]
        with pytest.raises(duckdb.Error, match="file system operations are disabled"):
            backend.connection.execute(f"SELECT * FROM read_csv('{tmp_path / 'a.csv'}')")
    finally:
        backend.close()


def _reachable(root, depth: int = 6) -> list:
    """Every object reachable from `root` in `depth` steps (what a leak of it would expose)."""
    import gc

    seen, frontier, found = {id(root)}, [root], [root]
    for _ in range(depth):
        following = []
        for obj in frontier:
            for ref in gc.get_referents(obj):
                if id(ref) not in seen and not isinstance(ref, type) and not type(ref).__name__ == "module":
                    seen.add(id(ref))
                    following.append(ref)
        found += following
        frontier = following
    return found


def test_the_engine_s_reader_holds_its_blob_s_own_keys_not_the_escrow_key(tmp_path):
    """The filesystem DuckDB reads through lives as long as its connection: it keeps the keys derived
    for its one blob (which open no other blob), never the escrow key (fsspec keeps a filesystem's
    constructor arguments: the escrow key was among them); a blob swapped in under the same path,
    sealed with the same escrow key, is refused with the escrow's own words."""
    import base64

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    failures: list = []
    fs = engine_files.DecryptingFileSystem.for_blob(blob, key, digest, None, failures)
    secrets_held = {bytes(o) for o in _reachable(fs) if isinstance(o, (bytes, bytearray))}
    assert key not in secrets_held and base64.urlsafe_b64decode(key) not in secrets_held
    assert any(len(o) == 32 for o in secrets_held)  # the blob's AES key is what it holds
    con = duckdb.connect()
    con.register_filesystem(fs)
    assert con.execute(f"SELECT count(*) FROM read_parquet('{fs.url}')").fetchall() == [(3,)]
    again, _, _ = seal_file(_write(_frame(), tmp_path / "same.csv"), settings, key)  # same rows, another salt
    blob.write_bytes(again.read_bytes())
    with pytest.raises(duckdb.Error):
        con.execute(f"SELECT count(*) FROM read_parquet('{fs.url}')").fetchall()
    assert [str(f) for f in failures] == [
        f"cannot decrypt {blob}: wrong escrow key or the blob was altered (check DPRELEASE_ESCROW_KEY / the key "
        "file, or register the dataset again)"]
    import pickle

    for holder, why in ((fs, "the escrow's engine filesystem is never pickled (it holds a blob's keys)"),
                        (fs._blob[1], "a blob key is never pickled (it opens an escrowed dataset)")):
        with pytest.raises(TypeError) as caught:  # neither is ever serialised, and the refusal says why
            pickle.dumps(holder)
        assert str(caught.value) == why
    with pytest.raises(EscrowError, match="a blob key is a 16-byte salt, a 32-byte AES key and a 32-byte MAC key"):
        stream.BlobKey(fs._blob[1].salt, b"short", fs._blob[1].mac_key)


def test_a_new_key_file_is_private_from_the_moment_it_exists(tmp_path, monkeypatch):
    """The key file is created with mode 0600, not widened by a loose umask and narrowed after:
    between the two another user could open it. Seen at the first moment the code touches the
    open file (its fchmod), with a umask of 0."""
    settings = _settings(tmp_path)
    modes = []
    fchmod = os.fchmod

    def observed(fd, mode):
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", observed)
    old = os.umask(0)
    try:
        load_or_create_key(settings, create=True)
    finally:
        os.umask(old)
    assert modes == [0o600], [oct(m) for m in modes]
    assert stat.S_IMODE(settings.escrow_key_file.stat().st_mode) == 0o600


def test_columns_duckdb_s_reader_would_type_otherwise_are_read_as_arrow(tmp_path):
    """A duration, a timestamp in seconds, a float16 or a decimal256 column: DuckDB's Parquet reader
    would not give them the types the Arrow scan gives (ticks instead of an INTERVAL, ...), so such a
    blob is read as its Arrow stream; common columns go to DuckDB's reader."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dprelease.escrow.blobs import _read_alike

    for odd in (pa.duration("ms"), pa.timestamp("s"), pa.float16(), pa.decimal256(40, 2), pa.list_(pa.duration("s"))):
        assert not _read_alike(odd), odd
    for common in (pa.int64(), pa.float64(), pa.string(), pa.dictionary(pa.int32(), pa.string()), pa.date32(),
                   pa.timestamp("us", tz="UTC"), pa.decimal128(10, 2), pa.binary(), pa.list_(pa.int32())):
        assert _read_alike(common), common
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"person_id": [1, 2], "wait": pa.array([5, 7], pa.duration("s"))}), path)
    blob, digest, _ = seal_file(path, settings, key)
    rows = escrow.EscrowRows(blob, key, digest)
    assert rows.duckdb_reader(duckdb.connect()) is None
    con = duckdb.connect()
    con.register("rows", rows)
    assert con.execute("SELECT typeof(wait) FROM rows LIMIT 1").fetchall() == [("INTERVAL",)]


def test_a_new_escrow_key_is_created_with_every_missing_directory_above_it(tmp_path):
    """The key directory may be new and nested (a fresh home): every missing directory is created,
    the key's own with mode 0700."""
    settings = _settings(tmp_path, key_dir=tmp_path / "new" / "deeper" / "keys")
    key = load_or_create_key(settings, create=True)
    assert settings.escrow_key_file.read_bytes().strip() == key
    assert stat.S_IMODE(settings.escrow_key_file.parent.stat().st_mode) == 0o700


def test_an_escrow_key_another_process_created_first_is_the_one_both_use(tmp_path, monkeypatch):
    """Two `dprelease init` at once: the one whose exclusive create finds the key file the other wrote
    since it looked uses that key, so the escrow has one key, never two. The other process's write is
    made at the last step before the create (the new key's generation)."""
    from dprelease.escrow import keys

    settings = _settings(tmp_path)
    theirs = Fernet.generate_key()

    class Raced(Fernet):
        @classmethod
        def generate_key(cls) -> bytes:
            fd = os.open(settings.escrow_key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, theirs + b"\n")
            os.close(fd)
            return Fernet.generate_key()

    monkeypatch.setattr(keys, "Fernet", Raced)
    assert load_or_create_key(settings, create=True) == theirs
    assert settings.escrow_key_file.read_bytes() == theirs + b"\n"


def test_an_escrow_key_file_that_links_to_nothing_is_refused_saying_so(tmp_path):
    """The key file as a symbolic link whose target is missing (a secrets volume not mounted): reading
    and `dprelease init` alike say so and name the target; init creates no key through the link."""
    settings = _settings(tmp_path)
    settings.escrow_key_file.parent.mkdir(parents=True, mode=0o700)
    target = tmp_path / "secrets" / "escrow.key"
    settings.escrow_key_file.symlink_to(target)
    for create in (False, True):
        with pytest.raises(EscrowError) as caught:
            load_or_create_key(settings, create=create)
        assert str(caught.value) == (
            f"the escrow key file {settings.escrow_key_file} is a symbolic link to {target}, which does not "
            "exist: restore the key there, or remove the link and run `dprelease init` again for a new key "
            "(which opens no dataset sealed with the old one)")
    assert not target.exists()


def test_a_file_that_is_not_an_escrow_blob_is_refused_as_such(tmp_path):
    other = tmp_path / "notes.escrow"
    other.write_bytes(b"x" * 200)
    with pytest.raises(EscrowError) as caught:
        stream.DecryptingFile(other, Fernet.generate_key(), None)
    assert str(caught.value) == f"{other} is not an escrow blob (bad header): register the dataset again"


# ------------------------------------------------------------------ the footer's statistics in the engine
# (moved from tests/test_checks_footer.py, outside mutation testing's selection: dp_core's use of an input's
# statistics is engine code, and these tests are what shows it)


def _units(rows: int = 5_000) -> pa.Table:
    uid = np.arange(rows) // 3
    return pa.table({"uid": pa.array(uid, type=pa.int64()), "part": pa.array(uid % 13, type=pa.int32())})


class _Streamed:
    """An engine input that offers column statistics beside its Arrow stream (as EscrowRows does),
    counting the scans the engine makes of it."""

    def __init__(self, table: pa.Table, statistics):
        self.table, self.statistics, self.scans = table, statistics, 0

    def __arrow_c_stream__(self, requested_schema=None):
        self.scans += 1
        return self.table.__arrow_c_stream__(requested_schema)

    def column_statistics(self):
        return self.statistics


def _count_query(**options):
    import dp_core as dp

    return dp.Query([dp.count(upper=3)], privacy_unit="uid", group_by=("part",), epsilon=1.0, delta=1e-6,
                    max_partitions_contributed=2, public_partitions=list(range(13)), **options)


@pytest.mark.parametrize("unit, proves", [
    (escrow.blobs.ColumnStatistics(0, 9, 0, "integer", 5_000), True),
    (escrow.blobs.ColumnStatistics(0, 9, 1, "integer", 5_000), False),   # a NULL unit: the scan refuses
    (escrow.blobs.ColumnStatistics(None, None, 0, "integer", 0), False),  # no rows: the scan refuses
    (escrow.blobs.ColumnStatistics(0.0, 9.0, 0, "float", 5_000), False),  # a float unit may hold NaN
    (None, False),                                                         # no statistics for the unit
])
def test_the_engine_skips_its_whole_input_scan_only_when_statistics_prove_the_rules(unit, proves):
    import dp_core as dp

    table = _units()
    source = _Streamed(table, {"uid": unit, "part": None})
    dp.execute(_count_query(), source)
    scanned_plain = _Streamed(table, None)
    dp.execute(_count_query(), scanned_plain)
    # DuckDB opens a stream more than once per query (its schema, then the scan)
    assert (source.scans < scanned_plain.scans) if proves else (source.scans == scanned_plain.scans)


def test_statistics_never_stand_in_for_a_refusal():
    """Statistics that show a NULL unit send the engine to its scan, which refuses with the count."""
    import dp_core as dp

    table = pa.table({"uid": pa.array([1, None, 2], type=pa.int64()), "part": pa.array([0, 1, 2], type=pa.int32())})
    stats = {"uid": escrow.blobs.ColumnStatistics(1, 2, 1, "integer", 3), "part": None}
    with pytest.raises(dp.InvalidDataError, match="1 row"):
        dp.execute(_count_query(), _Streamed(table, stats))


@pytest.mark.parametrize("nulls, proves", [(0, True), (1, False)])
def test_sql_skips_a_tables_whole_input_scan_only_when_statistics_prove_the_rules(nulls, proves):
    from dp_core.sql import Table, run_sql

    table = _units()
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(epsilon=1, delta=1e-6, max_groups_contributed=2) "
           "part, COUNT(*) AS n FROM t GROUP BY part")
    unit = escrow.blobs.ColumnStatistics(0, 1_666, nulls, "integer", len(table))
    source, plain = _Streamed(table, {"uid": unit, "part": None}), _Streamed(table, None)
    run_sql(sql, {"t": Table(source, privacy_unit="uid")})
    run_sql(sql, {"t": Table(plain, privacy_unit="uid")})
    assert (source.scans < plain.scans) if proves else (source.scans == plain.scans)


# ------------------------------------------------------------------ each refusal in full


def test_each_escrow_refusal_names_the_file_and_the_remedy_in_full(tmp_path):
    """The whole message of each refusal of registration and reading: a file misnamed .parquet, a CSV
    DuckDB cannot sniff, a chunk size out of range, a blob sealed for another fingerprint, a blob
    whose authenticated plaintext is not Parquet."""
    from dprelease.escrow.blobs import read_source

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    fake = tmp_path / "rows.parquet"
    fake.write_bytes(b"uid,x\n1,2\n")
    unsniffable = tmp_path / "rows.csv"
    unsniffable.write_bytes(b'uid,x\n1,"2\n')
    other, _, _ = seal_file(_write(_frame().head(1), tmp_path / "other.csv"), settings, key)
    text_blob = tmp_path / "text.escrow"
    with open(text_blob, "wb") as target:
        writer = stream.EncryptingWriter(target, key, "ab" * 32, chunk_size=64)
        writer.write(b"not Parquet")
        writer.finish()
    refusals = [
        (lambda: read_source(fake), f"{fake} is declared parquet but is not a Parquet file: rename it or convert it"),
        (lambda: read_source(unsniffable),
         f'cannot read {unsniffable} as CSV with a header row: Invalid Input Error: Error when sniffing file '
         f'"{unsniffable}".'),
        (lambda: stream.DecryptingFile(other, key, "cd" * 32),
         f"the escrow blob {other} does not match the registered fingerprint (tampered or swapped): register the "
         "dataset again"),
    ]
    for attempt, message in refusals:
        with pytest.raises(EscrowError) as caught:
            attempt()
        assert str(caught.value) == message
    with pytest.raises(ValueError) as caught:
        stream.EncryptingWriter(io.BytesIO(), key, "ab" * 32, chunk_size=0)
    assert str(caught.value) == "chunk_size must be between 1 byte and 2 GiB"
    with pytest.raises(EscrowError) as caught:
        open_batches(text_blob, key, "ab" * 32)
    assert re.fullmatch(rf"the escrow blob {re.escape(str(text_blob))} holds no readable Parquet data \([^\n]+\): "
                        "register the dataset again", str(caught.value)), str(caught.value)


def test_a_blob_whose_parquet_pages_do_not_decode_is_refused_as_the_escrow_s_error(tmp_path):
    """A blob that authenticates but holds a Parquet page that does not decode (a writer's fault, not
    an attack: chunks are authenticated): the scan is refused with the escrow's one-line message,
    also recorded in `failures`, not pyarrow's multi-line OSError."""
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"x": list(range(5000))}), buffer, row_group_size=1000)
    data = bytearray(buffer.getvalue())
    start = pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(3).column(0).data_page_offset
    for i in range(start + 20, start + 200):
        data[i] ^= 0x5A
    key, blob = Fernet.generate_key(), tmp_path / "broken.escrow"
    with open(blob, "wb") as target:
        writer = stream.EncryptingWriter(target, key, "ab" * 32, chunk_size=64)
        writer.write(bytes(data))
        writer.finish()
    failures: list = []
    reader = open_batches(blob, key, "ab" * 32, failures=failures)
    with pytest.raises(EscrowError) as caught:
        reader.read_all()
    assert re.fullmatch(rf"the escrow blob {re.escape(str(blob))} holds unreadable Parquet data \([^\n]+\): "
                        "register the dataset again", str(caught.value)), str(caught.value)
    assert failures and str(failures[0]) == str(caught.value)


def test_a_blob_s_keys_are_derived_as_sealed_blobs_were():
    """The AES key and header key of a blob come from the escrow key and the blob's salt through
    HKDF-SHA256 with the stream's own info string: a known answer, so that blobs sealed by earlier
    versions stay readable."""
    aes_key, mac_key = stream._derive(b"A" * 43 + b"=", b"\x00" * 16)
    assert aes_key.hex() == "4ad83e5c0b891075e3b1dccd808c36004294f48b9d23d8b9a352d2b7ce25c7b8"
    assert len(mac_key) == 32 and mac_key != aes_key


def test_the_engine_s_file_system_offers_one_read_only_file_read_from_its_first_byte(tmp_path):
    """The file system DuckDB reads a blob through (engine_files): one file, described by its name,
    plaintext size and type; opened for reading it starts at byte 0 (the Parquet magic) and can seek;
    opened for writing it is refused."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    fs = engine_files.DecryptingFileSystem.for_blob(blob, key, digest, None, [])
    size = len(open_blob(blob, key, digest))
    assert fs.info(fs.url) == {"name": fs.url, "size": size, "type": "file"}
    with fs.open(fs.url, "rb") as handle:
        assert handle.read(4) == b"PAR1" and handle.seekable()
        handle.seek(-4, io.SEEK_END)
        assert handle.read(4) == b"PAR1"
    with pytest.raises(PermissionError) as caught:
        fs.open(fs.url, "wb")
    assert str(caught.value) == "the escrow is read only"


def test_the_engine_s_file_system_lists_its_one_file_to_a_pattern_and_to_a_listing_without_details(tmp_path):
    """A pattern over the engine's file system (DuckDB's glob() and a read of *.parquet, which list the
    directory with details) finds its one file and reads it; fsspec's listing without details gives
    that file's name, with details its description."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    fs = engine_files.DecryptingFileSystem.for_blob(blob, key, digest, None, [])
    con = duckdb.connect()
    con.register_filesystem(fs)
    assert con.execute(f"SELECT * FROM glob('{fs.protocol}://*')").fetchall() == [(fs.url,)]
    assert con.execute(f"SELECT count(*) FROM read_parquet('{fs.protocol}://*.parquet')").fetchall() == [(3,)]
    assert fs.ls(fs.url, detail=False) == [fs.url]
    assert fs.ls(fs.url) == [fs.info(fs.url)]


def test_a_footer_without_a_row_group_s_statistics_proves_nothing_about_its_columns(tmp_path):
    """footer_statistics: a column gets statistics only when every row group records its NULL count;
    a Parquet file written without statistics gives none for any column (so the engine scans the
    rows for NULL units instead of trusting a partial count)."""
    import pyarrow.parquet as pq

    from dprelease.escrow.blobs import footer_statistics

    path = tmp_path / "plain.parquet"
    table = pa.table({"uid": pa.array([1, None, 3], pa.int64()), "x": pa.array([1.0, 2.0, None])})
    pq.write_table(table, path, write_statistics=False)
    assert footer_statistics(pq.ParquetFile(path)) == {"uid": None, "x": None}
    pq.write_table(table, path, row_group_size=2)
    assert footer_statistics(pq.ParquetFile(path))["uid"] == escrow.blobs.ColumnStatistics(1, 3, 1, "integer", 3)


def test_the_engine_s_file_credits_a_row_group_once_when_a_read_first_takes_its_bytes(tmp_path, monkeypatch):
    """Progress through the engine's file (engine_files): a read that takes bytes of a row group's column
    chunks credits that group's rows, once per handle, and no other group's; reading it again credits
    nothing, nor does a read that reaches the end of the file (the footer's). Read here directly, as one
    of DuckDB's threads would."""
    import pyarrow.parquet as pq

    blob, key, digest, _ = _grouped_blob(tmp_path, monkeypatch, rows=2_000)
    meta = pq.ParquetFile(io.BytesIO(open_blob(blob, key, digest))).metadata
    starts = [min(meta.row_group(g).column(c).data_page_offset for c in range(meta.num_columns))
              for g in range(meta.num_row_groups)]
    ends = [max(meta.row_group(g).column(c).data_page_offset + meta.row_group(g).column(c).total_compressed_size
                for c in range(meta.num_columns)) for g in range(meta.num_row_groups)]
    assert meta.num_row_groups == 4 and [meta.row_group(g).num_rows for g in range(4)] == [500] * 4
    credited: list[int] = []
    fs = engine_files.DecryptingFileSystem.for_blob(blob, key, digest, credited.append, [])
    with fs.open(fs.url, "rb") as handle:
        handle.seek(-8, io.SEEK_END)
        assert handle.read(8)[4:] == b"PAR1" and credited == []
        handle.seek(starts[2])
        handle.read(16)
        assert credited == [500]
        handle.seek(starts[2] + 4)
        handle.read(16)
        handle.seek(starts[0])
        handle.read(16)
        assert credited == [500, 500]
        handle.read(16)
        assert credited == [500, 500]
    with fs.open(fs.url, "rb") as handle:  # a new handle (a new scan) credits its groups again
        handle.seek(starts[3])
        handle.read(16)
        handle.seek(ends[1] - 16)  # a group's last bytes (its last column's) are its bytes too
        handle.read(16)
    assert credited == [500, 500, 500, 500]


def test_the_engine_s_file_seeks_from_its_position_and_refuses_to_open_for_update(tmp_path):
    """The engine's file seeks from the start, the current position and the end as io does; opened for
    reading and writing ("r+b", "rb+") it is refused like any write: the escrow is read only."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    plain = open_blob(blob, key, digest)
    fs = engine_files.DecryptingFileSystem.for_blob(blob, key, digest, None, [])
    with fs.open(fs.url, "rb") as handle:
        assert handle.seek(10) == 10 and handle.seek(5, io.SEEK_CUR) == 15
        assert handle.read(6) == plain[15:21]
        assert handle.seek(-3, io.SEEK_CUR) == 18 and handle.read(3) == plain[18:21]
        assert handle.seek(-6, io.SEEK_END) == len(plain) - 6 and handle.read() == plain[-6:]
    for mode in ("r+b", "rb+"):
        with pytest.raises(PermissionError) as caught:
            fs.open(fs.url, mode)
        assert str(caught.value) == "the escrow is read only"


def test_the_escrow_s_other_refusals_are_worded_in_full(tmp_path):
    """The whole message of refusals not covered above: a malformed key (with the command that makes a
    good one), footer statistics asked of a blob replaced since by one that holds no Parquet, the engine's
    file system handed the escrow key instead of a blob's own keys, a chunk size one byte over 2 GiB
    (2 GiB itself is accepted)."""
    from dprelease.escrow.blobs import EscrowRows

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    with pytest.raises(EscrowError) as caught:
        open_blob(blob, b"not-a-key", digest)
    assert str(caught.value) == (
        "the escrow key from the caller is not a valid Fernet key (32 url-safe base64-encoded bytes); generate one "
        "with `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`")
    rows = EscrowRows(blob, key, digest)
    with open(blob, "wb") as target:  # another blob under the same path, same key and fingerprint
        writer = stream.EncryptingWriter(target, key, digest, chunk_size=64)
        writer.write(b"not Parquet")
        writer.finish()
    with pytest.raises(EscrowError) as caught:
        rows.column_statistics()
    assert re.fullmatch(rf"the escrow blob {re.escape(str(blob))} holds no readable Parquet data \([^\n]+\): "
                        "register the dataset again", str(caught.value)), str(caught.value)
    with pytest.raises(TypeError) as caught:
        engine_files.DecryptingFileSystem(blob, key, digest, None, [])
    assert str(caught.value) == "DecryptingFileSystem takes the blob's own keys: use DecryptingFileSystem.for_blob"
    stream.EncryptingWriter(io.BytesIO(), key, "ab" * 32, chunk_size=1 << 31)
    with pytest.raises(ValueError) as caught:
        stream.EncryptingWriter(io.BytesIO(), key, "ab" * 32, chunk_size=(1 << 31) + 1)
    assert str(caught.value) == "chunk_size must be between 1 byte and 2 GiB"


def test_a_decrypted_blob_is_a_seekable_file_to_the_standard_library_s_buffered_reader(tmp_path):
    """DecryptingFile says it is seekable: io.BufferedReader (which refuses seeks on a raw file that says
    otherwise) reads its footer from the end and its start again."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    with io.BufferedReader(stream.DecryptingFile(blob, key, digest)) as buffered:
        assert buffered.seekable()
        buffered.seek(-4, io.SEEK_END)
        assert buffered.read() == b"PAR1"
        buffered.seek(0)
        assert buffered.read(4) == b"PAR1"


def test_a_file_s_fingerprint_reports_progress_in_blocks_of_eight_mebibytes(tmp_path):
    """file_fingerprint reads (and reports to on_bytes) 8 MiB at a time: a 9 MiB file in two steps."""
    import hashlib

    path = tmp_path / "big.bin"
    data = os.urandom(1 << 20) * 9
    path.write_bytes(data)
    steps: list[int] = []
    assert file_fingerprint(path, on_bytes=steps.append) == hashlib.sha256(data).hexdigest()
    assert steps == [8 << 20, 1 << 20]


def test_a_float_column_whose_row_group_holds_only_nans_gets_no_footer_statistics(tmp_path):
    """footer_statistics: a row group of values but no recorded minimum and maximum (only NaNs: the
    writer leaves them out) proves nothing, so the column gets None; the integer column beside it keeps its own."""
    import pyarrow.parquet as pq

    from dprelease.escrow.blobs import ColumnStatistics, footer_statistics

    path = tmp_path / "nans.parquet"
    nan = float("nan")
    pq.write_table(pa.table({"uid": pa.array([1, 2, 3, 4], pa.int64()), "x": pa.array([nan, nan, 1.5, None])}),
                   path, row_group_size=2)
    assert footer_statistics(pq.ParquetFile(path)) == {"uid": ColumnStatistics(1, 4, 0, "integer", 4), "x": None}


def test_a_flat_column_beside_a_list_of_structs_keeps_its_footer_statistics(tmp_path):
    """A list of structs is stored as one leaf column per struct field (two here): counted so, the flat
    columns after it line up with their leaves and get their statistics; the nested one gets none."""
    import pyarrow.parquet as pq

    from dprelease.escrow.blobs import ColumnStatistics, footer_statistics

    items = pa.list_(pa.struct([("a", pa.int64()), ("b", pa.string())]))
    for list_type in (items, pa.large_list(items.value_type)):
        path = tmp_path / "nested.parquet"
        pq.write_table(pa.table({"uid": pa.array([1, 2, 3], pa.int64()),
                                 "items": pa.array([[{"a": 1, "b": "x"}], [], None], list_type),
                                 "x": pa.array([0.5, None, 2.5])}), path)
        assert footer_statistics(pq.ParquetFile(path)) == {
            "uid": ColumnStatistics(1, 3, 0, "integer", 3), "items": None,
            "x": ColumnStatistics(0.5, 2.5, 1, "float", 3)}, list_type


def test_a_legacy_parquet_blob_written_with_an_index_gives_only_its_columns(tmp_path):
    """A Parquet file of the first (Fernet) format written by pandas from a frame with a non-default index
    (rows kept by a filter): the index is not one of the dataset's columns."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    source = tmp_path / "d.parquet"
    _frame().set_axis([10, 20, 30]).to_parquet(source, engine="pyarrow")
    legacy = tmp_path / "d.parquet.fernet"
    legacy.write_bytes(Fernet(key).encrypt(source.read_bytes()))
    rows = escrow.EscrowRows(legacy, key, escrow.fingerprint(source.read_bytes()), "parquet")
    assert rows.schema.names == ["person_id", "name", "age"]
    pd.testing.assert_frame_equal(rows.reader().read_all().to_pandas(), _frame())


def test_a_blob_grown_after_the_engine_planned_its_scan_is_refused_naming_the_change(tmp_path):
    """The engine's file system checks the blob's size at each open against the one its footer was read
    at: bytes appended since are refused in the escrow's words (also recorded in `failures`)."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    failures: list = []
    fs = engine_files.DecryptingFileSystem.for_blob(blob, key, digest, None, failures)
    blob.write_bytes(blob.read_bytes() + bytes(100))
    with pytest.raises(EscrowError) as caught:
        fs.open(fs.url, "rb")
    assert str(caught.value) == (
        f"the escrow blob {blob} changed while it was being read (its size is not the one its footer was read at): "
        "restore it from a backup or register the dataset again")
    assert failures == [caught.value]


def test_small_reads_within_one_chunk_decrypt_it_once(tmp_path):
    """DecryptingFile keeps the chunk it decrypted last: the engine's many small reads of one chunk (a
    footer, a page header) authenticate and decrypt it once, not once per read."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key, chunk_size=256)
    with stream.DecryptingFile(blob, key, digest) as plain:
        assert plain.size > 512
        pieces = [plain.read(16) for _ in range(16)]
        assert b"".join(pieces) == open_blob(blob, key, digest)[:256] and plain.chunks_read == 1
        plain.seek(300)
        plain.read(8)
        plain.seek(260)
        plain.read(8)
        assert plain.chunks_read == 2


def test_a_categorical_column_has_footer_statistics_like_its_values(tmp_path):
    """A dictionary-typed (categorical) column is one leaf column: it and the columns after it get their
    statistics."""
    import pyarrow.parquet as pq

    from dprelease.escrow.blobs import ColumnStatistics, footer_statistics

    path = tmp_path / "categorical.parquet"
    pq.write_table(pa.table({"kind": pa.array(["b", "a", None]).dictionary_encode(),
                             "uid": pa.array([1, 2, 3], pa.int64())}), path)
    stats = footer_statistics(pq.ParquetFile(path))
    assert stats["uid"] == ColumnStatistics(1, 3, 0, "integer", 3) and stats["kind"].nulls == 1


def test_a_writer_closed_by_its_user_says_so_and_is_sealed_by_finish_alone(tmp_path):
    """pyarrow closes the sink it wrote to; the EncryptingWriter then reports itself closed (as a file
    does) but is sealed only by finish(), after which the blob reads back."""
    key = Fernet.generate_key()
    target = io.BytesIO()
    writer = stream.EncryptingWriter(target, key, "ab" * 32, chunk_size=64)
    writer.write(b"x" * 100)
    writer.close()
    assert writer.closed
    assert writer.finish() == 2
    blob = tmp_path / "b.escrow"
    blob.write_bytes(target.getvalue())
    with stream.DecryptingFile(blob, key, "ab" * 32) as plain:
        assert plain.read() == b"x" * 100


def test_an_encrypting_writer_tells_how_many_plaintext_bytes_it_was_given_in_all():
    """The writer is a file to its user: tell() is the count of plaintext bytes written so far, over
    every write (none, a few, ones that seal chunks), not the ciphertext's size nor the last write's."""
    writer = stream.EncryptingWriter(io.BytesIO(), Fernet.generate_key(), "ab" * 32, chunk_size=64)
    told = []
    for size in (0, 5, 64, 100, 3):
        assert writer.write(b"x" * size) == size
        told.append(writer.tell())
    assert told == [0, 5, 69, 169, 172]


def test_a_parquet_file_cut_short_is_refused_with_the_reader_s_reason_and_nothing_sealed(tmp_path):
    """A file with Parquet's magic bytes at both ends but cut in the middle (a copy that stopped
    half-way): sealing it is refused naming the file and, in one line, why the Parquet reader cannot
    read it (the footer it points to is not there), and nothing is left in the escrow."""
    import pyarrow.parquet as pq

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    whole = _write(_frame(), tmp_path / "whole.parquet").read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole[:len(whole) // 2] + b"PAR1")
    with pytest.raises(pa.ArrowException) as reader:
        pq.ParquetFile(cut)
    reason = str(reader.value).splitlines()[0]
    assert reason
    with pytest.raises(EscrowError) as caught:
        seal_file(cut, settings, key)
    assert str(caught.value) == f"cannot read {cut} as Parquet: {reason}"
    assert not settings.escrow_dir.exists() or not any(settings.escrow_dir.iterdir())


def test_rows_without_columns_are_refused_by_the_engine_as_unreadable_input(tmp_path):
    """A source with rows but no column (a Parquet file whose footer counts rows and names no column
    reads as such): the blob sealed from it is refused by the engine as input it cannot read, with
    DuckDB's reason, like any other unreadable input, not with a crash of the escrow's reader while it
    maps the row groups for progress."""
    from dp_core.backend import DuckDBBackend
    from dp_core.errors import InvalidDataError
    from dprelease.escrow.blobs import EscrowRows, SourceReader, seal_source

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    batch = pa.record_batch({"x": [1, 2, 3]}).select([])
    assert (batch.num_rows, batch.num_columns) == (3, 0)
    sealed = seal_source(tmp_path / "no_columns.parquet", SourceReader(batch.schema, iter([batch]), 3, lambda: None),
                         "ab" * 32, settings, key)
    with pytest.raises(InvalidDataError) as caught:
        DuckDBBackend.for_input(EscrowRows(sealed.path, key, "ab" * 32))
    assert re.fullmatch(r"cannot read the input: Invalid Input Error: Failed to read Parquet file "
                        r"'dprescrow[0-9a-f]{12}://data\.parquet': Need at least one non-root column in the file",
                        str(caught.value)), str(caught.value)


# ------------------------------------------------------------------ mutation sample of seed 20270130


def test_a_struct_column_of_common_types_is_read_by_duckdb_and_one_holding_a_duration_as_arrow(tmp_path):
    """A struct column whose fields DuckDB's Parquet reader types as the Arrow scan does goes to that
    reader (as a STRUCT); a struct holding a duration field sends the blob to its Arrow stream, where
    the field is an INTERVAL."""
    import pyarrow.parquet as pq

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    for name, field_type, reader_expected, typed in (
            ("plain", pa.int64(), True, "STRUCT(a BIGINT, b VARCHAR)"),
            ("odd", pa.duration("s"), False, "STRUCT(a INTERVAL, b VARCHAR)")):
        path = tmp_path / f"{name}.parquet"
        kind = pa.struct([("a", field_type), ("b", pa.string())])
        pq.write_table(pa.table({"person_id": [1, 2],
                                 "pair": pa.array([{"a": 5, "b": "x"}, {"a": 7, "b": "y"}], kind)}), path)
        blob, digest, _ = seal_file(path, settings, key)
        rows = escrow.EscrowRows(blob, key, digest)
        con = duckdb.connect()
        reader = rows.duckdb_reader(con)
        assert (reader is not None) == reader_expected, name
        if reader is None:
            con.register("rows", rows)
            reader = "rows"
        assert con.execute(f"SELECT typeof(pair), count(*) FROM {reader} GROUP BY 1").fetchall() == [(typed, 2)]


def test_a_legacy_blob_opened_as_batches_comes_back_in_batches_of_at_most_the_row_group_size(tmp_path,
                                                                                             monkeypatch):
    """open_batches on a blob of the first format: decrypted whole, then handed out (and reported to
    `on_batch`) in batches of at most BATCH_ROWS rows, as a streamed blob's row groups are."""
    monkeypatch.setattr(escrow.blobs, "BATCH_ROWS", 500)
    key = Fernet.generate_key()
    source = _write(pd.DataFrame({"person_id": range(1_200), "age": [1.5] * 1_200}), tmp_path / "d.csv")
    legacy = tmp_path / "d.csv.fernet"
    legacy.write_bytes(Fernet(key).encrypt(source.read_bytes()))
    seen: list[int] = []
    reader = open_batches(legacy, key, escrow.fingerprint(source.read_bytes()), "csv",
                          on_batch=lambda batch: seen.append(batch.num_rows))
    assert [batch.num_rows for batch in reader] == [500, 500, 200]
    assert seen == [500, 500, 200]


def test_a_blob_is_written_under_a_hidden_temporary_name_in_the_escrow_directory_itself(tmp_path):
    """While a dataset is sealed, its ciphertext goes to a hidden temporary file beside the final blob
    (in the escrow directory, so that the final rename is atomic and never crosses a file system);
    once sealed, only the blob is there, under the temporary name's stem."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    during: list[list[str]] = []
    blob, _, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key,
                           on_batch=lambda batch: during.append(sorted(p.name for p in settings.escrow_dir.iterdir())))
    assert len(during) == 1 and len(during[0]) == 1, during
    assert re.fullmatch(rf"\.{re.escape(blob.name)}\.[^/]+\.tmp", during[0][0]), during
    assert [p.name for p in settings.escrow_dir.iterdir()] == [blob.name]


def test_a_blob_read_as_arrow_and_attacked_after_the_release_opened_it_is_reported_in_the_escrow_s_words(tmp_path):
    """A blob the engine reads as its Arrow stream (a duration column), changed after EscrowRows
    checked it: the release's scan fails, and `failures` (what the pipeline reports instead of the
    engine's wording) holds the escrow's own error, whether the change is met when the scan opens the
    blob (its footer) or while it reads the rows."""
    import pyarrow.parquet as pq

    import dp_core as dp

    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"person_id": [1, 2, 3], "age": [31.5, 42.0, 57.25],
                             "wait": pa.array([5, 7, 9], pa.duration("s"))}), path)
    blob, digest, _ = seal_file(path, settings, key, chunk_size=CHUNK)
    query = dp.Query([dp.count(upper=1), dp.sum_("age", 0, 100)], privacy_unit="person_id", epsilon=1.0)
    rows = escrow.EscrowRows(blob, key, digest)
    assert rows.duckdb_reader(duckdb.connect()) is None
    assert len(dp.execute(query, rows).table) == 1  # intact: released
    data = blob.read_bytes()
    header, body = data[:stream.HEADER_SIZE], data[stream.HEADER_SIZE:]
    size = CHUNK + stream.TAG_SIZE
    chunks = [body[i:i + size] for i in range(0, len(body), size)]
    blob.write_bytes(header + b"".join(_tampered(chunks, "changed chunk")))
    with pytest.raises(dp.InvalidDataError):
        dp.execute(query, rows)
    assert rows.failures, "the escrow's error was not recorded"
    assert str(rows.failures[0]) == (
        f"the escrow blob {blob} failed authentication at chunk 3 of {len(chunks)}: it was altered, truncated, "
        "reordered or extended; restore it from a backup or register the dataset again")


def test_the_engine_s_file_is_readable_to_the_standard_library_s_buffered_reader(tmp_path):
    """The engine's file (engine_files) says it is readable: io.BufferedReader, which refuses a raw
    file that says otherwise, reads the Parquet magic at its start and its end through it."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    fs = engine_files.DecryptingFileSystem.for_blob(blob, key, digest, None, [])
    with io.BufferedReader(fs.open(fs.url, "rb")) as buffered:
        assert buffered.readable() and buffered.read(4) == b"PAR1"
        buffered.seek(-4, io.SEEK_END)
        assert buffered.read() == b"PAR1"


def test_a_read_of_the_engine_s_file_that_reaches_its_end_credits_no_row_group_even_one_it_covers(tmp_path,
                                                                                                  monkeypatch):
    """A read that reaches the end of the file is the footer's (DuckDB reads a small file's footer with
    the bytes before it): it credits no row group, not even the last one, whose bytes it covers; a
    read of that group's bytes that stops short of the end credits it. Read directly, as one of
    DuckDB's threads would."""
    import pyarrow.parquet as pq

    blob, key, digest, _ = _grouped_blob(tmp_path, monkeypatch, rows=1_000)
    meta = pq.ParquetFile(io.BytesIO(open_blob(blob, key, digest))).metadata
    last = min(meta.row_group(1).column(c).data_page_offset for c in range(meta.num_columns))
    credited: list[int] = []
    fs = engine_files.DecryptingFileSystem.for_blob(blob, key, digest, credited.append, [])
    with fs.open(fs.url, "rb") as handle:
        handle.seek(last)
        assert handle.read()[-4:] == b"PAR1"
        assert credited == []
        handle.seek(last)
        handle.read(16)
        assert credited == [500]


# ------------------------------------------------------------------ mutation sample of seed 20270170


def test_a_streamed_blob_sealed_for_another_source_is_refused_by_every_reader_of_its_batches(tmp_path):
    """A blob swapped for another dataset's (same escrow key, valid chunks, another source's
    fingerprint in its header): opening it batch by batch, as a frame or as the engine's rows is
    refused naming the blob, and open_batches records the refusal in `failures`; no row is read."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    _, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    other, _, _ = seal_file(_write(_frame().head(1), tmp_path / "other.csv"), settings, key)
    message = (f"the escrow blob {other} does not match the registered fingerprint (tampered or swapped): "
               "register the dataset again")
    failures: list = []
    for read in (lambda: open_batches(other, key, digest, failures=failures),
                 lambda: load_frame(other, key, digest, "parquet"),
                 lambda: escrow.EscrowRows(other, key, digest)):
        with pytest.raises(EscrowError) as caught:
            read()
        assert str(caught.value) == message
    assert [str(f) for f in failures] == [message]


def test_escrowed_rows_record_a_scan_s_escrow_error_in_the_list_their_caller_gave(tmp_path):
    """EscrowRows(failures=...): the caller's own list receives the escrow's error met by a later scan
    (here the blob removed after the rows were made), so the caller can report it in the escrow's words."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)
    earlier = EscrowError("an earlier failure")
    mine: list = [earlier]
    rows = escrow.EscrowRows(blob, key, digest, failures=mine)
    assert rows.reader().read_all().num_rows == 3
    blob.unlink()
    with pytest.raises(EscrowError) as caught:
        rows.reader()
    assert str(caught.value) == f"the escrow blob {blob} is missing: register the dataset again"
    assert mine == [earlier, caught.value]


def test_escrow_rows_read_a_legacy_parquet_blob_when_no_format_is_given(tmp_path):
    """EscrowRows' file format defaults to Parquet: a Fernet blob of a Parquet file (the first
    format) opens and gives its rows without the format being named."""
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    source = _write(_frame(), tmp_path / "d.parquet")
    legacy = tmp_path / "d.parquet.fernet"
    legacy.write_bytes(Fernet(key).encrypt(source.read_bytes()))
    rows = escrow.EscrowRows(legacy, key, escrow.fingerprint(source.read_bytes()))
    assert rows.schema.names == ["person_id", "name", "age"]
    pd.testing.assert_frame_equal(rows.reader().read_all().to_pandas(), _frame())


def test_footer_statistics_asked_after_the_caller_spoiled_its_key_are_refused_naming_the_caller(tmp_path):
    """The key is checked again when the footer is read: a caller that overwrote its key buffer after
    making the rows (here with text that is no Fernet key) gets the malformed-key refusal, in full,
    naming the caller as where the key came from."""
    from dprelease.escrow.blobs import EscrowRows

    settings = _settings(tmp_path)
    key = bytearray(load_or_create_key(settings, create=True))
    blob, digest, _ = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, bytes(key))
    rows = EscrowRows(blob, key, digest)
    key[:] = b"not-a-key"
    with pytest.raises(EscrowError) as caught:
        rows.column_statistics()
    assert str(caught.value) == (
        "the escrow key from the caller is not a valid Fernet key (32 url-safe base64-encoded bytes); generate one "
        "with `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`")


def test_a_decrypted_blob_read_up_to_and_past_its_end_gives_the_bytes_left_then_nothing(tmp_path):
    """A blob whose plaintext fills its chunks exactly (two of 64 bytes): a read asking for more than
    is left gives what is left, and reads at or past the end give no bytes (end of file), not an
    attempt at a chunk that does not exist."""
    key, blob = Fernet.generate_key(), tmp_path / "b.escrow"
    data = bytes(range(128))
    with open(blob, "wb") as target:
        writer = stream.EncryptingWriter(target, key, "ab" * 32, chunk_size=64)
        writer.write(data)
        assert writer.finish() == 2
    with stream.DecryptingFile(blob, key, "ab" * 32) as plain:
        assert plain.size == 128
        plain.seek(100)
        assert plain.read(1000) == data[100:]
        assert plain.read(1) == b""
        assert plain.seek(500) == 500
        assert plain.read(10) == b""
        assert plain.readinto(bytearray(10)) == 0
