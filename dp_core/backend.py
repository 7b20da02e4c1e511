"""The data engine behind one narrow interface: register the input, describe it, run SQL.

DuckDB (in-process) now; the plan's SQL is dialect-portable (bounding.render) so another backend
can run it later. Accepted inputs: a pandas DataFrame, a pyarrow Table, a CSV or Parquet path, or
a DuckDB relation (run on its own connection, nothing copied).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from .bounding import INPUT_NAME
from .errors import InvalidDataError
from .sql_text import literal

NUMERIC_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                 "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "REAL")
INTEGER_TYPES = NUMERIC_TYPES[:10]


@dataclass
class DuckDBBackend:
    """Runs plans on one DuckDB connection where the input is visible as `dp_input`."""

    connection: duckdb.DuckDBPyConnection | None
    relation: duckdb.DuckDBPyRelation | None = None
    frame: pd.DataFrame | None = None  # a pandas input: DuckDB reads its NaN as NULL
    dialect: str = "duckdb"

    @classmethod
    def for_input(cls, data, threads: int | None = None) -> "DuckDBBackend":
        """Make `data` queryable as `dp_input` without copying it."""
        if isinstance(data, duckdb.DuckDBPyRelation):
            return cls(None, relation=data)
        con = duckdb.connect(":memory:")
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        if isinstance(data, (str, Path)):
            path = Path(data)
            if not path.exists():
                raise InvalidDataError(f"input file not found: {path}")
            name = path.name.lower()
            if name.endswith(".parquet"):
                reader, kind = f"read_parquet({literal(str(path))})", "Parquet"
            elif name.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")):
                # an explicit dialect: DuckDB's sniffer would otherwise read a malformed file as
                # one text column or accept an unterminated quote without a word
                delim = "\t" if ".tsv" in name else ","
                reader = (f"read_csv({literal(str(path))}, header = true, delim = {literal(delim)}, "
                          "quote = '\"', escape = '\"', strict_mode = true)")
                kind = "CSV with a header row"
            else:
                raise InvalidDataError(f"cannot read {path}: give a .csv, .csv.gz, .tsv or .parquet file")
            try:
                con.execute(f"CREATE VIEW {INPUT_NAME} AS SELECT * FROM {reader}")
                con.execute(f"SELECT count(*) FROM {INPUT_NAME}").fetchall()
            except duckdb.Error as err:
                first = str(err).splitlines()[0]
                raise InvalidDataError(f"cannot read {path} as {kind}: {first}") from None
        elif isinstance(data, pd.DataFrame) or type(data).__module__.startswith("pyarrow"):
            con.register(INPUT_NAME, data)
            if isinstance(data, pd.DataFrame):
                return cls(con, frame=data)
        else:
            raise InvalidDataError(
                f"unsupported input type {type(data).__name__}: give a pandas DataFrame, a pyarrow "
                "Table, a CSV/Parquet path or a DuckDB relation"
            )
        return cls(con)

    def run(self, sql: str) -> pd.DataFrame:
        """Execute SQL over `dp_input` and return the (small) result as a DataFrame."""
        try:
            if self.relation is not None:
                return self.relation.query(INPUT_NAME, sql).df()
            return self.connection.sql(sql).df()
        except duckdb.Error as err:
            raise InvalidDataError(f"the data engine could not run the query: {err}") from None

    def schema(self) -> dict[str, str]:
        """Column name -> DuckDB type name of the input."""
        described = self.run(f"DESCRIBE SELECT * FROM {INPUT_NAME}")
        return dict(zip(described["column_name"], described["column_type"]))

    def count_nan(self, column: str) -> int:
        """NaN values of a pandas float column (DuckDB's scan turns them into NULL, hiding them)."""
        if self.frame is None or column not in self.frame:
            return 0
        values = self.frame[column]
        if not isinstance(values.dtype, np.dtype) or values.dtype.kind != "f":
            return 0  # nullable dtypes keep NA (missing) apart from NaN, which SQL then sees
        return int(np.isnan(values.to_numpy()).sum())

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
