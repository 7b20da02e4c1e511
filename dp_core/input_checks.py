"""The data rules every entry point applies, with the same message: the engine API (`execute`,
`run_sql`, via the backend) and the platform's registration. Each refusal names the input, the
problem and the fix, and comes before anything is read into the engine, sealed or spent.

- A file: exists, is a file, is not empty, its content matches its name (a gzip file named .csv,
  a Parquet file named .csv, a .csv.gz that is not gzip, another compression), is UTF-8 text
  (CSV), has a header row and at least one data row, names every column once, and every row has
  as many fields as the header (the first one that does not is named by its line and its count,
  never its values: in the first MiB by these checks, beyond by `ragged_row` when DuckDB stops;
  `csv_reader_sql` is the one DuckDB dialect the engine and the platform's sealing read with).
- Column names: none empty, none twice (also not in another case: SQL cannot tell `Amount` from
  `amount`). pandas would rename a second `amount` to `amount.1`; DuckDB to `amount_1`.
- Missing values: an empty CSV cell, a NULL, pandas' NA and NaN are all *missing*: the row stays
  (it counts for COUNT(*)) and a numeric aggregate skips the value, as SQL skips NULL. NaN is
  mapped to NULL when the input is registered (`missing_as_null`), so every reader agrees: pandas
  itself reads an empty cell as NaN. An infinite value in a column an aggregate reads is refused
  in a whole input (engine.check_values); one a query computes is clamped (aggregates.py).
- Nested columns (lists, structs) the query does not read are carried along untouched.
- epsilon: finite, > 0 and at most MAX_EPSILON (a query's smallest working epsilon depends on how
  it splits the budget: noise_floor.py).
- delta: 0, or from MIN_DELTA to MAX_DELTA (`check_delta`). delta is the probability with which the
  guarantee may fail outright: a mechanism that publishes one person's whole record with
  probability delta is (0, delta)-DP, and partition selection does publish a group made of one
  person's single row with probability up to its delta share. delta must therefore be far below
  1 / (number of people), but that number is private (a refusal that depended on it would itself
  reveal it), so the ceiling is a fixed public one: MAX_DELTA = 1e-3, enough for any dataset of
  up to a few hundred people and far above what larger ones need (the default is 1e-6). Below
  MIN_DELTA = 1e-100 nothing more is protected and the selections' per-partition share (delta / C_u,
  halved and times e^-eps) underflows. The same rule, in this one place, checks the Python API, the
  SQL OPTIONS, the platform's requests and the dataset caps (dprelease/requests, store).
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import itertools
import math
import zlib
from pathlib import Path

from .errors import InvalidDataError, InvalidQueryError

#: above this, epsilon promises nothing (e^100 ~ 2.7e43: an output may become that many times
#: likelier when one person's data changes) and the mechanisms' arithmetic (e^epsilon) overflows
#: near 709; a request beyond it is a typo or a misunderstanding
MAX_EPSILON = 100.0

#: the largest delta accepted anywhere (a query, a request, a dataset's or a series' cap): see the docstring
MAX_DELTA = 1e-3
#: the smallest positive delta accepted (0 is accepted: pure DP)
MIN_DELTA = 1e-100

#: DuckDB's names of the float types (the only ones that hold NaN and infinities)
FLOAT_TYPES = ("FLOAT", "DOUBLE", "REAL")

#: suffix (lower case) -> the kind of file the engine reads; longest first
SUFFIX_KINDS = ((".csv.gz", "csv.gz"), (".tsv.gz", "tsv.gz"), (".csv", "csv"), (".tsv", "tsv"),
                (".parquet", "parquet"), (".pq", "parquet"))
ACCEPTED = ".csv, .csv.gz, .tsv, .tsv.gz or .parquet"
#: how much of a file is read to check its header and first data row
HEAD_BYTES = 1 << 20

#: magic bytes of formats a user may hand over by mistake
_MAGIC = ((b"\x1f\x8b", "gzip-compressed"), (b"PAR1", "a Parquet file"), (b"PK\x03\x04", "a zip archive (or an Excel workbook)"),
          (b"BZh", "bzip2-compressed"), (b"\xfd7zXZ\x00", "xz-compressed"), (b"\x28\xb5\x2f\xfd", "zstd-compressed"),
          (b"\xd0\xcf\x11\xe0", "an Excel 97 workbook"))


def check_epsilon(epsilon, what: str = "epsilon") -> float:
    """epsilon is a finite number in (0, MAX_EPSILON]."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon <= 0:
        raise InvalidQueryError(f"{what} must be a finite number > 0, got {epsilon!r}")
    if epsilon > MAX_EPSILON:
        raise InvalidQueryError(
            f"{what} = {epsilon:g} is above the maximum {MAX_EPSILON:g}: at that level the guarantee means nothing "
            f"(e^epsilon is astronomically large); ask for at most {MAX_EPSILON:g} (typical values are 0.1 to 10)"
        )
    return float(epsilon)


def check_delta(delta, what: str = "delta") -> float:
    """delta is 0 or a number in [MIN_DELTA, MAX_DELTA] (why: the module docstring)."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta < 0:
        raise InvalidQueryError(f"{what} must be 0 or a number from {MIN_DELTA:g} to {MAX_DELTA:g}, got {delta!r}")
    if delta > MAX_DELTA:
        raise InvalidQueryError(
            f"{what} = {delta:g} is above the maximum {MAX_DELTA:g}: delta is the chance that the guarantee fails "
            "outright (a group made of one person's single row may be published with about that probability); ask "
            f"for at most {MAX_DELTA:g}, and far below 1 / (number of people) (a query's default is 1e-6)"
        )
    if 0 < delta < MIN_DELTA:
        raise InvalidQueryError(f"{what} = {delta:g} is below the minimum {MIN_DELTA:g} (it protects nothing more and "
                                f"underflows the arithmetic): ask for 0 or at least {MIN_DELTA:g}")
    return float(delta)


def file_kind(path: Path) -> str:
    """csv, csv.gz, tsv, tsv.gz or parquet, from the file's name."""
    name = Path(path).name.lower()
    for suffix, kind in SUFFIX_KINDS:
        if name.endswith(suffix):
            return kind
    raise InvalidDataError(f"cannot read {path}: unsupported file type; give a {ACCEPTED} file")


def check_file(path: Path | str) -> str:
    """Every file rule (module docstring) on `path`; returns its kind (csv, csv.gz, ..., parquet)."""
    path = Path(path)
    if not path.exists():
        raise InvalidDataError(f"input file not found: {path}")
    if path.is_dir():
        raise InvalidDataError(f"{path} is a directory, not a file: give the path of a {ACCEPTED} file")
    kind = file_kind(path)
    size = path.stat().st_size
    if size == 0:
        raise InvalidDataError(f"{path} is empty (0 bytes): give a file with a header row and at least one data row")
    with path.open("rb") as handle:
        head = handle.read(HEAD_BYTES)
        if kind == "parquet" and size >= 8:
            handle.seek(-4, io.SEEK_END)
            tail = handle.read(4)
        else:
            tail = b""
    if kind == "parquet":
        _check_parquet(path, head, tail)
    else:
        _check_csv(path, kind, head)
    return kind


def check_column_names(names, label: str = "the input") -> None:
    """No column name empty, none twice (not even in another case)."""
    seen: dict[str, tuple[int, str]] = {}
    for position, raw in enumerate(names, start=1):
        name = str(raw)
        if not name.strip():
            raise InvalidDataError(f"{label}: column {position} has no name: name every column in the header")
        key = name.casefold()
        if key in seen:
            first_position, first = seen[key]
            same = "twice" if first == name else f"twice ({first!r} and {name!r} differ only in case, which SQL ignores)"
            raise InvalidDataError(
                f"{label} has the column {name!r} {same}, at positions {first_position} and {position}: "
                "rename or drop one (each column must have its own name)"
            )
        seen[key] = (position, name)


def check_frame(data, label: str = "the input") -> None:
    """The column rules for a pandas DataFrame or an Arrow table."""
    names = data.column_names if hasattr(data, "column_names") else list(data.columns)
    check_column_names(names, label)


def nan_as_null(expr: str) -> str:
    """SQL of `expr` (a float) with NaN as NULL: a value that is not a number is missing."""
    return f"CASE WHEN isnan({expr}) THEN NULL ELSE {expr} END"


def missing_as_null(con, source_sql: str) -> str:
    """SQL selecting everything from `source_sql` with NaN in float columns turned into NULL
    (missing), so a NaN is skipped as a NULL is, whatever reader produced it."""
    described = con.execute(f"DESCRIBE {source_sql}").fetchall()
    floats = [row[0] for row in described if str(row[1]).upper() in FLOAT_TYPES]
    if not floats:
        return source_sql
    quoted = ['"' + name.replace('"', '""') + '"' for name in floats]
    replaced = ", ".join(f"{nan_as_null(q)} AS {q}" for q in quoted)
    return f"SELECT * REPLACE ({replaced}) FROM ({source_sql})"


# --- files ------------------------------------------------------------------------------------------


def _content(head: bytes) -> str | None:
    """What the first bytes say the file is, if a known binary format."""
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return what
    return None


def _check_parquet(path: Path, head: bytes, tail: bytes) -> None:
    if not (head.startswith(b"PAR1") and tail == b"PAR1"):
        what = _content(head)
        hint = f"it is {what}" if what else "convert it, or rename it if it is CSV"
        raise InvalidDataError(f"{path} is named .parquet but is not a Parquet file: {hint}")
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path)
        names, rows = meta.schema_arrow.names, meta.metadata.num_rows
    except Exception as err:  # noqa: BLE001 - any reader failure is a damaged file
        raise InvalidDataError(f"cannot read {path} as Parquet: {str(err).splitlines()[0]}") from None
    check_column_names(names, str(path))
    if rows == 0:
        raise InvalidDataError(f"{path} has columns but no rows: nothing can be released")


def _check_csv(path: Path, kind: str, head: bytes) -> None:
    compressed = kind.endswith(".gz")
    what = _content(head)
    if compressed:
        if what != "gzip-compressed":
            plain = path.name[:-3]
            raise InvalidDataError(
                f"{path} is named {kind} but is not gzip-compressed"
                + (f" (it is {what})" if what else f": compress it with gzip, or rename it to {plain}")
            )
        try:
            head = _gunzip_head(path)
        except (OSError, EOFError, zlib.error) as err:
            raise InvalidDataError(f"{path} is not a valid gzip file ({err}): compress it again") from None
        what = _content(head)
        if what:
            raise InvalidDataError(f"{path} holds {what} inside the gzip, not {kind[:3].upper()} text")
    elif what:
        fix = f"rename it to {path.name}.gz" if what == "gzip-compressed" else (
            f"rename it to {Path(path.name).stem}.parquet" if what == "a Parquet file" else
            f"export or decompress it to a {ACCEPTED} file")
        raise InvalidDataError(f"{path} is {what} but named .{kind}: {fix}")
    text = _utf8(head, path)
    cut = len(head) >= HEAD_BYTES  # the last record read may be cut short: its fields are not counted
    rows = _records(io.StringIO(text), kind)
    found = next(rows, None)
    if found is None:
        raise InvalidDataError(f"{path} has no header row (only blank lines): give a header row and data")
    header_line, header = found
    check_column_names(header, str(path))
    first = next(rows, None)
    if first is None:
        raise InvalidDataError(f"{path} has a header row but no data rows: nothing can be released")
    records = itertools.chain([first], rows)
    problem = _ragged(path, kind, header_line, header, _all_but_last(records) if cut else records)
    if problem:
        raise InvalidDataError(problem)


def _records(handle, kind: str):
    """(line where it starts, fields) of each record that is not blank, in the engine's CSV dialect
    (a quoted value may span lines)."""
    delimiter = "\t" if kind.startswith("tsv") else ","
    records = csv.reader(handle, delimiter=delimiter, quotechar='"', doublequote=True, strict=False)
    start = 1
    for row in records:
        if any(cell.strip() for cell in row):
            yield start, row
        start = records.line_num + 1


def _ragged(path, kind: str, header_line: int, header: list, records) -> str | None:
    """The message for the first of `records` whose number of fields is not the header's, or None.
    A double quote never closed swallows the rest of the file into one record: that is said as such."""
    records = iter(records)
    for line, row in records:
        if len(row) != len(header):
            if row and "\n" in row[-1] and next(records, None) is None:
                return (f"{path}, line {line}: a value opened with a double quote is never closed (the rest of the "
                        f"file reads as one value): close the quote, or double a quote that is part of a value "
                        f"(\"\")")
            sep = "a tab" if kind.startswith("tsv") else "a comma"
            return (f"{path}, line {line}: {len(row)} field{'s' if len(row) != 1 else ''}, but the header (line "
                    f"{header_line}) has {len(header)}: every row needs one field per column (put a value holding "
                    f"{sep} in double quotes); fix or remove that row")
    return None


def _all_but_last(records):
    """`records` without the very last one."""
    pending = None
    for record in records:
        if pending is not None:
            yield pending
        pending = record


def ragged_row(path: Path | str) -> str | None:
    """The whole file's first record with another number of fields than its header, as a refusal
    line (None: none). Reads the whole file: the engine calls it when DuckDB could not read one."""
    path = Path(path)
    kind = file_kind(path)
    if kind == "parquet":
        return None
    opener = gzip.open if kind.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as handle:
            rows = _records(handle, kind)
            found = next(rows, None)
            return None if found is None else _ragged(path, kind, found[0], found[1], rows)
    except (OSError, EOFError, UnicodeDecodeError, zlib.error, csv.Error):
        return None


def csv_reader_sql(path: Path | str) -> str:
    """DuckDB's read_csv of a .csv/.tsv(.gz) in the engine's dialect: the header on the first line
    (skip = 0: DuckDB's sniffer would otherwise skip lines and take a later row, a ragged one, for the
    header), comma or tab, double quotes, strict (a malformed file is refused, not read as one text
    column)."""
    delim = "\t" if ".tsv" in Path(path).name.lower() else ","
    quoted = "'" + str(path).replace("'", "''") + "'"
    return (f"read_csv({quoted}, header = true, skip = 0, delim = '{delim}', quote = '\"', escape = '\"', "
            "strict_mode = true)")


def csv_read_error(path: Path | str, err: Exception) -> InvalidDataError:
    """The refusal for a CSV DuckDB could not read: the row with the wrong number of fields when
    there is one (the line and the counts, never the row's values), else DuckDB's first line."""
    return InvalidDataError(ragged_row(path) or
                            f"cannot read {path} as CSV with a header row: {str(err).splitlines()[0]}")


def _gunzip_head(path: Path) -> bytes:
    """The first HEAD_BYTES of the decompressed content."""
    with gzip.open(path, "rb") as handle:
        return handle.read(HEAD_BYTES)


def _utf8(head: bytes, path: Path) -> str:
    """The head as text; a multi-byte character cut by the read limit is fine."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    try:
        return decoder.decode(head, final=len(head) < HEAD_BYTES)
    except UnicodeDecodeError as err:
        raise InvalidDataError(
            f"{path} is not UTF-8 text (byte 0x{head[err.start]:02x} at offset {err.start}): save it as UTF-8 CSV"
        ) from None
