"""Blobs: registered datasets encrypted at rest, decrypted only into memory, batch by batch.

- `seal_file` converts a CSV, CSV.gz or Parquet file to Parquet (DuckDB's CSV reader, the
  engine's own parsing) batch by batch and encrypts the Parquet bytes as they are written
  (`stream`: chunked AES-256-GCM) into `<escrow location>/<fingerprint>-<random>.escrow`, a folder
  or an object store (`location`), appearing under that name only when complete: only ciphertext
  is ever written, the source is never held in memory whole, and every registration gets its own
  blob (no blob is shared between datasets, so removing one never harms another).
- `open_batches` gives the rows back as a pyarrow RecordBatchReader that decrypts and decodes one
  row group at a time (no plaintext file, no pandas copy); `EscrowRows` is the replayable form
  the engine scans (a fresh reader per scan).
- Blobs of the first format (one Fernet token over the whole source file, `.fernet`) stay
  readable: `open_batches` / `open_blob` / `load_frame` tell the formats apart by their header.
"""

from __future__ import annotations

import hashlib
import io
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from cryptography.fernet import Fernet, InvalidToken

from dp_core.input_checks import csv_read_error, csv_reader_sql
from dprelease.settings import Settings

from . import location, stream
from .errors import EscrowError
from .keys import _checked_key

if TYPE_CHECKING:
    import pandas as pd  # legacy blobs only: a registration never loads pandas

# suffix (lower case) -> file_format recorded in the store; longest suffixes first
SUFFIX_FORMATS = ((".csv.gz", "csv.gz"), (".csv", "csv"), (".parquet", "parquet"), (".pq", "parquet"))
BLOB_SUFFIX = ".escrow"  # chunked AEAD blobs (stream.py)
BATCH_ROWS = 1_000_000  # rows per Parquet row group at rest = rows per batch read back


def at_rest_encoding(schema: pa.Schema) -> dict:
    """The Parquet writer's options at rest: LZ4, and dictionary pages for text columns only.
    Measured on the engine benchmark's 10M integer rows (this machine, 2026-11-25): zstd with
    dictionaries everywhere wrote in 0.74-0.90 s, read back in 0.20-0.24 s, 62 MB; LZ4 without
    dictionaries on numbers wrote in 0.40 s, read back in 0.12-0.14 s, 87 MB. A dictionary of a
    million distinct keys costs time and grows the file; text columns keep theirs (few values)."""
    text = [f.name for f in schema if not (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
                                           or pa.types.is_decimal(f.type) or pa.types.is_temporal(f.type))]
    return {"compression": "lz4", "use_dictionary": text}


def _fernet(key: bytes) -> Fernet:
    """A Fernet for the key, with an escrow error instead of a bare ValueError."""
    return Fernet(_checked_key(key, "the caller"))


# --- sealing and opening --------------------------------------------------------------------------


def fingerprint(data: bytes) -> str:
    """SHA-256 hex of the plaintext bytes: identifies a dataset without revealing it."""
    return hashlib.sha256(data).hexdigest()


def file_format_of(path: Path) -> str:
    """The file format from the suffix (csv, csv.gz, parquet); EscrowError for anything else."""
    name = path.name.lower()
    for suffix, file_format in SUFFIX_FORMATS:
        if name.endswith(suffix):
            return file_format
    accepted = ", ".join(suffix for suffix, _ in SUFFIX_FORMATS)
    raise EscrowError(f"cannot register {path.name}: unsupported file type; accepted suffixes are {accepted}")


def file_fingerprint(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """SHA-256 hex of a file, read in 8 MiB blocks (the registered source's identity)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
            if on_bytes is not None:
                on_bytes(len(block))
    return digest.hexdigest()


def _check_file_magic(path: Path, file_format: str) -> None:
    """Cheap content check so a misnamed file is refused before anything is written."""
    with open(path, "rb") as handle:
        head = handle.read(4)
        handle.seek(max(0, path.stat().st_size - 4))
        tail = handle.read(4)
    if file_format == "csv.gz" and not head.startswith(b"\x1f\x8b"):
        raise EscrowError(f"{path} is declared csv.gz but is not gzip-compressed: rename it or compress it")
    if file_format == "parquet" and not (head == b"PAR1" and tail == b"PAR1"):
        raise EscrowError(f"{path} is declared parquet but is not a Parquet file: rename it or convert it")


def _csv_reader_sql(path: Path) -> str:
    """The engine's CSV dialect (dp_core.input_checks.csv_reader_sql): a header row, comma, double quotes, strict."""
    return f"SELECT * FROM {csv_reader_sql(path)}"


@dataclass
class SourceReader:
    """The rows of a source file as Arrow batches, with the schema known before any is read."""

    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    total_rows: int | None  # known for Parquet sources
    _close: Callable[[], None]

    def close(self) -> None:
        self._close()


def read_source(path: Path, batch_rows: int | None = None, threads: int | None = None) -> SourceReader:
    """Open a CSV / CSV.gz / Parquet file for streaming (batch_rows: rows per batch, default
    BATCH_ROWS); EscrowError for what cannot be read."""
    path = Path(path)
    batch_rows = batch_rows or BATCH_ROWS
    file_format = file_format_of(path)
    if not path.exists():
        raise EscrowError(f"cannot register {path}: no such file")
    if path.is_dir():
        raise EscrowError(f"cannot register {path}: it is a directory, give a file")
    _check_file_magic(path, file_format)
    if file_format == "parquet":
        try:
            parquet = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as err:
            raise EscrowError(f"cannot read {path} as Parquet: {str(err).splitlines()[0]}") from None
        return SourceReader(parquet.schema_arrow, parquet.iter_batches(batch_size=batch_rows),
                            parquet.metadata.num_rows, parquet.close)
    import duckdb

    con = duckdb.connect(":memory:", config={"temp_directory": ""})
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    try:
        reader = con.sql(_csv_reader_sql(path)).to_arrow_reader(batch_rows)
    except duckdb.Error as err:
        con.close()
        raise EscrowError(str(csv_read_error(path, err))) from None  # the engine's words (the line, its fields)

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            yield from reader
        except (duckdb.Error, pa.ArrowException, OSError) as err:  # a fault past the sniffed rows: OSError
            raise EscrowError(str(csv_read_error(path, err))) from None

    return SourceReader(reader.schema, batches(), None, con.close)


@dataclass(frozen=True)
class SealedBlob:
    path: Path | str  # a local path, or the object's URL in an object-store escrow
    fingerprint: str  # SHA-256 of the source file
    file_format: str  # of the plaintext at rest: always parquet
    schema: pa.Schema
    rows: int
    row_groups: int


def seal_source(path: Path, source: SourceReader, fingerprint_hex: str, settings: Settings, key: bytes, *,
                row_number_column: str | None = None,
                on_batch: Callable[[pa.RecordBatch], None] | None = None,
                chunk_size: int = stream.CHUNK_SIZE) -> SealedBlob:
    """Write the source's batches as Parquet (one row group per batch) through the encrypting
    sink into a new blob; `row_number_column` prepends a 0-based row number. The blob appears
    under its final name only when complete; on any failure nothing is left behind (location.py)."""
    _fernet(key)  # a bad key fails before anything is written
    schema = source.schema
    if row_number_column is not None:
        schema = schema.insert(0, pa.field(row_number_column, pa.int64(), nullable=False))
    rows = groups = 0
    try:
        with location.new_blob(settings.escrow_location, f"{fingerprint_hex}-{secrets.token_hex(6)}{BLOB_SUFFIX}") \
                as (handle, blob):
            sink = stream.EncryptingWriter(handle, key, fingerprint_hex, chunk_size=chunk_size)
            writer = pq.ParquetWriter(sink, schema, **at_rest_encoding(schema))
            for batch in source.batches:
                if row_number_column is not None:
                    numbers = pa.array(range(rows, rows + batch.num_rows), type=pa.int64())
                    batch = pa.RecordBatch.from_arrays([numbers, *batch.columns], schema=schema)
                if batch.num_rows == 0:
                    continue
                writer.write_batch(batch)
                rows += batch.num_rows
                groups += 1
                if on_batch is not None:
                    on_batch(batch)
            writer.close()
            sink.finish()
    finally:
        source.close()
    return SealedBlob(blob, fingerprint_hex, "parquet", schema, rows, groups)


def seal_file(path: Path, settings: Settings, key: bytes, **options) -> tuple[Path, str, str]:
    """Encrypt a CSV / CSV.gz / Parquet file into the escrow; return (blob path, fingerprint, format)."""
    path = Path(path)
    source = read_source(path)
    sealed = seal_source(path, source, file_fingerprint(path), settings, key, **options)
    return sealed.path, sealed.fingerprint, sealed.file_format


def open_batches(blob_path: Path | str, key: bytes, expected_fingerprint: str, file_format: str = "parquet",
                 on_batch: Callable[[pa.RecordBatch], None] | None = None,
                 failures: list | None = None) -> pa.RecordBatchReader:
    """The dataset's rows as a RecordBatchReader: one row group decrypted and decoded at a time
    (legacy Fernet blobs: decrypted whole, then batched). An EscrowError met while a consumer
    opens or reads it (a chunk of the footer or of the rows failing authentication: EscrowRows
    opens the blob afresh for each scan) is also appended to `failures`, so the caller can report
    it even when the consumer (DuckDB) wraps it in its own error."""
    blob_path = location.as_address(blob_path)
    try:
        if not stream.is_stream_blob(blob_path):  # a missing blob: EscrowError
            table = _legacy_table(open_blob(blob_path, key, expected_fingerprint), file_format)
            batches = iter(table.to_batches(max_chunksize=BATCH_ROWS))
            schema = table.schema
        else:
            plain = stream.DecryptingFile(blob_path, _checked_key(key, "the caller"), expected_fingerprint)
            try:
                parquet = pq.ParquetFile(plain)  # its footer's chunks are authenticated: EscrowError
            except EscrowError:
                plain.close()
                raise
            except pa.ArrowException as err:
                plain.close()
                raise EscrowError(f"the escrow blob {blob_path} holds no readable Parquet data ({err}): "
                                  "register the dataset again") from None
            schema = parquet.schema_arrow

            def decrypted() -> Iterator[pa.RecordBatch]:
                try:
                    for group in range(parquet.num_row_groups):
                        yield from parquet.read_row_group(group).to_batches()
                except EscrowError as err:
                    if failures is not None:
                        failures.append(err)
                    raise
                except (pa.ArrowException, OSError) as err:  # a page that does not decode: pyarrow's OSError
                    failure = EscrowError(f"the escrow blob {blob_path} holds unreadable Parquet data "
                                          f"({str(err).splitlines()[0]}): register the dataset again")
                    if failures is not None:
                        failures.append(failure)
                    raise failure from None
                finally:
                    plain.close()

            batches = decrypted()
    except EscrowError as err:  # met when a consumer opens a scan (DuckDB, through EscrowRows): recorded too
        if failures is not None:
            failures.append(err)
        raise
    if on_batch is not None:
        batches = _observed(batches, on_batch)
    return pa.RecordBatchReader.from_batches(schema, batches)


@dataclass(frozen=True)
class ColumnStatistics:
    """One column over the whole dataset, from the Parquet footer registration wrote: the least
    and greatest value (None when every value is NULL), the NULL count, the kind of values
    ("integer", "float" or "other"; only integers' minimum and maximum are exact values that no
    NaN can hide from), and the dataset's row count."""

    minimum: object
    maximum: object
    nulls: int
    kind: str
    rows: int


def footer_statistics(parquet: pq.ParquetFile) -> dict[str, ColumnStatistics | None]:
    """Each column's statistics summed over the row groups (None for a column some row group
    holds none for: a nested column, or a writer that left them out)."""
    meta, schema = parquet.metadata, parquet.schema_arrow
    first_leaf, starts = 0, {}
    for field in schema:  # a field's leaf columns follow the previous field's, in schema order
        starts[field.name] = first_leaf
        first_leaf += _leaf_count(field.type)
    out: dict[str, ColumnStatistics | None] = {}
    for field in schema:
        kind = ("integer" if pa.types.is_integer(field.type) else
                "float" if pa.types.is_floating(field.type) else "other")
        j = starts[field.name]
        if (pa.types.is_nested(field.type) or first_leaf != meta.num_columns or len(starts) != len(schema)
                or parquet.schema.column(j).path != field.name):
            out[field.name] = None  # nested, or the leaves do not line up with the fields: no proof
            continue
        lo = hi = None
        nulls, known = 0, True
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            stats = group.column(j).statistics
            if stats is None or not stats.has_null_count:
                known = False
                break
            nulls += stats.null_count
            if stats.has_min_max:
                lo = stats.min if lo is None else min(lo, stats.min)
                hi = stats.max if hi is None else max(hi, stats.max)
            elif stats.null_count != group.num_rows:  # values present but no min/max recorded
                known = False
                break
        out[field.name] = ColumnStatistics(lo, hi, nulls, kind, meta.num_rows) if known else None
    return out


def _leaf_count(arrow_type: pa.DataType) -> int:
    """How many Parquet leaf columns an Arrow type is stored as (a struct: its fields' leaves; a
    list: its values'; a map: its keys' and items'). Counting them, rather than matching a leaf's
    dotted path against a name, tells a flat column named "a.b" from field b of a struct a."""
    if pa.types.is_struct(arrow_type):
        return sum(_leaf_count(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    if pa.types.is_map(arrow_type):
        return _leaf_count(arrow_type.key_type) + _leaf_count(arrow_type.item_type)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return _leaf_count(arrow_type.value_type)
    if pa.types.is_dictionary(arrow_type):
        return _leaf_count(arrow_type.value_type)
    return 1


def _read_alike(arrow_type: pa.DataType) -> bool:
    """Whether DuckDB's Parquet reader gives this column the type its Arrow scan gives it (checked:
    strings, dictionaries, integers, floats, decimal128, dates, timestamps in ms/us/ns with or without
    a zone, binary, lists, nulls). Not: durations (ticks instead of an INTERVAL), timestamps in
    seconds, decimal256 and float16 (which the Arrow scan refuses): those are read as Arrow."""
    if pa.types.is_duration(arrow_type) or pa.types.is_decimal256(arrow_type) or pa.types.is_float16(arrow_type):
        return False
    if pa.types.is_timestamp(arrow_type) and arrow_type.unit == "s":
        return False
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return _read_alike(arrow_type.value_type)
    if pa.types.is_struct(arrow_type):
        return all(_read_alike(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    if pa.types.is_dictionary(arrow_type):
        return _read_alike(arrow_type.value_type)
    return not pa.types.is_map(arrow_type)


class EscrowRows:
    """A dataset's rows, decrypted only into memory, for the engine: DuckDB reads the blob's Parquet
    with its own reader through a decrypting filesystem on its connection (`duckdb_reader`,
    engine_files.py); any other consumer gets a replayable Arrow stream (the Arrow PyCapsule stream
    protocol: a fresh RecordBatchReader per call that decrypts and decodes one row group at a
    time). The engine scans its input several times; either way no scan needs a copy of the
    dataset in memory, and nothing is ever written out. The key and the fingerprint are checked
    when it is made, before any engine work. `on_rows` counts the rows read, over all scans."""

    def __init__(self, blob_path: Path | str, key: bytes, expected_fingerprint: str, file_format: str = "parquet",
                 on_rows: Callable[[int], None] | None = None, failures: list | None = None):
        self.blob_path = location.as_address(blob_path)
        self._args = (self.blob_path, key, expected_fingerprint, file_format)
        self._on_rows = on_rows
        self._on_batch = (lambda batch: on_rows(batch.num_rows)) if on_rows is not None else None
        self.failures = failures if failures is not None else []
        self._legacy: pa.Table | None = None
        if location.exists(self.blob_path) and not stream.is_stream_blob(self.blob_path):
            self._legacy = _legacy_table(open_blob(self.blob_path, key, expected_fingerprint), file_format)
            self.schema = self._legacy.schema
        else:
            self.schema = open_batches(*self._args).schema  # checks key and fingerprint now

    def reader(self) -> pa.RecordBatchReader:
        if self._legacy is not None:
            batches = iter(self._legacy.to_batches(max_chunksize=BATCH_ROWS))
            if self._on_batch is not None:
                batches = _observed(batches, self._on_batch)
            return pa.RecordBatchReader.from_batches(self.schema, batches)
        return open_batches(*self._args, on_batch=self._on_batch, failures=self.failures)

    def __arrow_c_stream__(self, requested_schema=None):
        return self.reader().__arrow_c_stream__(requested_schema)

    def duckdb_reader(self, con) -> str | None:
        """Register a decrypting filesystem for this blob on DuckDB connection `con` and return the
        table function that reads it (None for a blob of the first format: its Arrow stream)."""
        if self._legacy is not None or not all(_read_alike(f.type) for f in self.schema):
            return None
        from .engine_files import DecryptingFileSystem

        files = DecryptingFileSystem.for_blob(self.blob_path, _checked_key(self._args[1], "the caller"), self._args[2],
                                              self._on_rows, self.failures)
        con.register_filesystem(files)
        return f"read_parquet('{files.url}')"

    def column_statistics(self) -> dict[str, ColumnStatistics | None] | None:
        """Per column, the statistics of the Parquet footer that registration wrote, read without
        decoding a single row (the footer's chunks are authenticated like every other); None for
        a blob of the first format, which has no footer."""
        if self._legacy is not None:
            return None
        plain = stream.DecryptingFile(self.blob_path, _checked_key(self._args[1], "the caller"), self._args[2])
        try:
            return footer_statistics(pq.ParquetFile(plain))
        except pa.ArrowException as err:
            raise EscrowError(f"the escrow blob {self.blob_path} holds no readable Parquet data ({err}): "
                              "register the dataset again") from None
        finally:
            plain.close()


def _observed(batches: Iterator[pa.RecordBatch], on_batch) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        on_batch(batch)
        yield batch


def _legacy_table(data: bytes, file_format: str) -> pa.Table:
    return pa.Table.from_pandas(parse_bytes(data, file_format), preserve_index=False)


def open_blob(blob_path: Path | str, key: bytes, expected_fingerprint: str) -> bytes:
    """Decrypt a whole escrow blob into memory (small data and tests only; releases use
    `open_batches`). v1: the Parquet at rest, every chunk authenticated in order; legacy: the
    source file's bytes, checked against the fingerprint."""
    blob_path = location.as_address(blob_path)
    if location.exists(blob_path) and stream.is_stream_blob(blob_path):
        with stream.DecryptingFile(blob_path, _checked_key(key, "the caller"), expected_fingerprint) as plain:
            plain.verify_all()
            plain.seek(0)
            return plain.read()
    handle, _size = location.open_for_reading(blob_path)  # a missing blob: EscrowError
    try:
        token = handle.read()
    finally:
        handle.close()
    try:
        data = _fernet(key).decrypt(token)
    except InvalidToken as exc:
        raise EscrowError(
            f"cannot decrypt {blob_path}: wrong escrow key or the blob was altered "
            f"(check DPRELEASE_ESCROW_KEY / the key file, or register the dataset again)"
        ) from exc
    if fingerprint(data) != expected_fingerprint:
        raise EscrowError(
            f"the escrow blob {blob_path} does not match the registered fingerprint (tampered or wrong key)"
        )
    return data


def parse_bytes(data: bytes, file_format: str) -> pd.DataFrame:
    """Parse plaintext bytes from an in-memory buffer (no file is written)."""
    import pandas as pd

    buffer = io.BytesIO(data)
    if file_format == "csv":
        return pd.read_csv(buffer)
    if file_format == "csv.gz":
        return pd.read_csv(buffer, compression="gzip")
    if file_format == "parquet":
        return pd.read_parquet(buffer, engine="pyarrow")
    raise EscrowError(f"unknown file format {file_format!r}: expected one of csv, csv.gz, parquet")


def load_frame(blob_path: Path | str, key: bytes, fingerprint: str, file_format: str) -> pd.DataFrame:
    """Decrypt a registered dataset into a DataFrame (small data only: releases stream batches)."""
    return open_batches(blob_path, key, fingerprint, file_format).read_all().to_pandas()
