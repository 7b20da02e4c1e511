"""The data engine behind one narrow interface: register the input, describe it, run SQL.

DuckDB (in-process) now; the plan's SQL is dialect-portable (bounding.render) so another backend
can run it later. Accepted inputs: a pandas DataFrame, a pyarrow Table, a pyarrow RecordBatchReader
(a one-shot stream: read once into DuckDB's own columnar memory), any object with
`__arrow_c_stream__` that gives a fresh stream per call (scanned afresh by each query, never
copied), an object whose `duckdb_reader(connection)` registers what DuckDB needs to read it and
returns the table function that does (how the platform hands over its escrowed Parquet, decrypted
as DuckDB's own reader reads it), a CSV or Parquet path, or a DuckDB relation (run on its own
connection, nothing copied).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from pathlib import Path

import duckdb
import pandas as pd

from .bounding import INPUT_NAME
from .engine_errors import duckdb_message
from .errors import InvalidDataError, InvalidQueryError
from .input_checks import (
    FLOAT_TYPES,
    check_column_names,
    check_file,
    check_frame,
    csv_read_error,
    csv_reader_sql,
    missing_as_null,
)
from .sql_text import ident, literal

NUMERIC_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                 "UINTEGER", "UBIGINT", "UHUGEINT", *FLOAT_TYPES)
INTEGER_TYPES = NUMERIC_TYPES[:10]


@dataclass
class DuckDBBackend:
    """Runs plans on one DuckDB connection where the input is visible as `dp_input`."""

    connection: duckdb.DuckDBPyConnection | None
    relation: duckdb.DuckDBPyRelation | None = None
    frame: pd.DataFrame | None = None  # a pandas input
    frames: dict | None = None  # pandas tables of a SQL query, by name
    dialect: str = "duckdb"
    derived: bool = False  # `dp_input` is rows a query selected (define_input), not the caller's whole input
    source: object = None  # the caller's input as handed over (engine.check_values asks it for statistics)

    @classmethod
    def for_input(cls, data, threads: int | None = None) -> DuckDBBackend:
        """Make `data` queryable as `dp_input` without copying it (a prepared backend is used as is)."""
        if isinstance(data, DuckDBBackend):
            return data
        if isinstance(data, duckdb.DuckDBPyRelation):
            return cls(None, relation=data)
        con = _connect(threads)
        _register(con, INPUT_NAME, data)
        return cls(con, frame=data if isinstance(data, pd.DataFrame) else None, source=data)

    @classmethod
    def for_tables(cls, tables: dict, threads: int | None = None) -> DuckDBBackend:
        """Several named inputs (for SQL queries); `define_input` then sets `dp_input`. The connection
        reads no file but those the tables are read from: DuckDB itself refuses read_csv('<any other
        path>'), COPY ... TO, ATTACH and INSTALL on it. SQL reads registered tables by name only: the
        SQL check refuses anything else first (ownership.py); this holds should the check miss a way."""
        con = _connect(threads)
        frames, paths = {}, []
        for name, data in tables.items():
            if isinstance(data, duckdb.DuckDBPyRelation):
                raise InvalidDataError(f"table {name!r}: give a DataFrame, Arrow table or file for SQL queries")
            _register(con, name, data)
            if isinstance(data, (str, Path)):
                paths.append(str(data))
            if isinstance(data, pd.DataFrame):
                frames[name] = data
        # the file systems registered for the tables (the escrow's, one per blob): the connection is new
        directories = [f"{protocol}://" for protocol in con.list_filesystems()]
        con.execute(f"SET allowed_paths = [{', '.join(literal(p) for p in paths)}]")
        con.execute(f"SET allowed_directories = [{', '.join(literal(d) for d in directories)}]")
        con.execute("SET enable_external_access = false")  # cannot be set back on this connection
        return cls(con, frames=frames)

    def define_input(self, sql: str) -> None:
        """`dp_input` becomes the view `sql` over the registered tables (the checked source): a
        derived input, which the engine's whole-input checks leave alone (engine.check_values)."""
        try:
            self.connection.execute(f"CREATE OR REPLACE VIEW {INPUT_NAME} AS {sql}")
        except duckdb.Error as err:
            raise InvalidDataError(f"the data engine could not prepare the query: {str(err).splitlines()[0]}") from None
        self.derived = True

    def columns(self, name: str) -> list[str]:
        described = self.run(f"DESCRIBE SELECT * FROM {ident(name)}")
        return list(described["column_name"])



    def run(self, sql: str) -> pd.DataFrame:
        """Execute SQL over `dp_input` and return the (small) result as a DataFrame."""
        try:
            if self.relation is not None:
                return self.relation.query(INPUT_NAME, sql).df()
            return self.connection.sql(sql).df()
        except duckdb.Error as err:
            raise _engine_error(err) from None

    @property
    def can_keep(self) -> bool:
        """Whether `keep` can hold rows: only on a connection of the engine's own (not a relation's)."""
        return self.connection is not None

    def keep(self, name: str, sql: str) -> None:
        """Keep the rows of `sql` as the in-memory temporary table `name` on the engine's own
        connection (never spilled: _connect), failing in the words of `run`."""
        try:
            self.connection.execute(f"CREATE TEMP TABLE {ident(name)} AS {sql}")
        except duckdb.Error as err:
            raise _engine_error(err) from None

    def drop(self, name: str) -> None:
        self.connection.execute(f"DROP TABLE IF EXISTS {ident(name)}")

    def schema(self) -> dict[str, str]:
        """Column name -> DuckDB type name of the input."""
        described = self.run(f"DESCRIBE SELECT * FROM {INPUT_NAME}")
        return dict(zip(described["column_name"], described["column_type"]))

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


def _engine_error(err: duckdb.Error) -> InvalidDataError:
    words = duckdb_message(err) or str(err)  # never a value of the data (dp_core.engine_errors)
    return InvalidDataError(f"the data engine could not run the query: {words}")


def _connect(threads: int | None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that never spills to disk (its temporary files would hold plaintext
    rows): a query larger than memory fails instead of writing data out. `threads`: a whole number
    from 1, or None for DuckDB's default (every core); anything else (the platform's setting `auto`
    before Settings.threads_now resolves it) is one line, not DuckDB's or int()'s words."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, Integral) or threads < 1):
        raise InvalidQueryError(f"threads={threads!r} is not a number of DuckDB threads: give a whole number from 1, "
                                "or None for every core DuckDB is given")
    con = duckdb.connect(":memory:", config={"temp_directory": ""})
    if threads is not None:
        con.execute(f"SET threads = {int(threads)}")
    return con


def _register(con, name: str, data) -> None:
    """Register one input under `name`: a DataFrame or Arrow table in place, a file as a view."""
    if isinstance(data, (str, Path)):
        path = Path(data)
        check_file(path)  # the shared file rules (same verdict as registration)
        suffix = path.name.lower()
        if suffix.endswith(".parquet"):
            reader, kind = f"read_parquet({literal(str(path))})", "Parquet"
        elif suffix.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")):
            # an explicit dialect (input_checks.csv_reader_sql): DuckDB's sniffer would otherwise read a
            # malformed file as one text column, accept an unterminated quote without a word, or take
            # a ragged row for the header
            reader, kind = csv_reader_sql(path), "CSV with a header row"
        else:
            raise InvalidDataError(f"cannot read {path}: give a .csv, .csv.gz, .tsv or .parquet file")
        try:
            con.execute(f"CREATE VIEW {ident(name)} AS {missing_as_null(con, 'SELECT * FROM ' + reader)}")
            con.execute(f"SELECT count(*) FROM {ident(name)}").fetchall()
        except duckdb.Error as err:
            if kind != "Parquet":  # the row with the wrong number of fields, if that is the fault
                raise csv_read_error(path, err) from None
            first = str(err).splitlines()[0]
            raise InvalidDataError(f"cannot read {path} as {kind}: {first}") from None
    elif (reader := _own_reader(con, data)) is not None:
        check_column_names(data.schema.names)
        try:
            con.execute(f"CREATE VIEW {ident(name)} AS {missing_as_null(con, 'SELECT * FROM ' + reader)}")
        except duckdb.Error as err:
            raise InvalidDataError(f"cannot read the input: {str(err).splitlines()[0]}") from None
    elif _is_batch_stream(data):
        _load_stream(con, name, data)
    elif (isinstance(data, pd.DataFrame) or type(data).__module__.startswith("pyarrow")
          or hasattr(data, "__arrow_c_stream__")):  # the last: a replayable Arrow stream, read afresh per scan
        if isinstance(data, pd.DataFrame) or hasattr(data, "column_names"):
            check_frame(data)
        elif hasattr(data, "schema"):
            check_column_names(data.schema.names)
        raw = f"_input_{name}"
        con.register(raw, data)  # the view below reads NaN as NULL (DuckDB does so for pandas, not Arrow)
        con.execute(f"CREATE VIEW {ident(name)} AS {missing_as_null(con, 'SELECT * FROM ' + ident(raw))}")
    else:
        raise InvalidDataError(
            f"unsupported input type {type(data).__name__}: give a pandas DataFrame, a pyarrow "
            "Table or RecordBatchReader, a CSV/Parquet path or a DuckDB relation"
        )


def _own_reader(con, data) -> str | None:
    """The DuckDB table function an input registers on `con` to be read by DuckDB itself (e.g. the
    platform's escrowed Parquet, decrypted as DuckDB reads it: a stream of Arrow batches scans
    slower), or None: the input is read as what it is."""
    register = getattr(data, "duckdb_reader", None)
    return register(con) if callable(register) else None


def _is_batch_stream(data) -> bool:
    return type(data).__name__ == "RecordBatchReader" and type(data).__module__.startswith("pyarrow")


def _load_stream(con, name: str, reader) -> None:
    """A RecordBatchReader can be scanned once and a plan scans its input several times: DuckDB
    reads it batch by batch into an in-memory table (never spilled: see _connect)."""
    check_column_names(reader.schema.names, "the input stream")
    stream_name = f"_stream_{name}"
    con.register(stream_name, reader)
    try:
        source = missing_as_null(con, f"SELECT * FROM {ident(stream_name)}")
        con.execute(f"CREATE TEMP TABLE {ident(name)} AS {source}")
    except duckdb.Error as err:
        raise InvalidDataError(f"cannot read the input stream: {str(err).splitlines()[0]}") from None
    finally:
        con.unregister(stream_name)
