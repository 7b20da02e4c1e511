"""The Spark backend: the same bounding plan, run where the data lives (a SparkSession's cluster).

The engine writes its SQL in DuckDB's syntax with the backend's dialect pieces (bounding.DIALECT_PIECES);
this backend transpiles it to Spark SQL with sqlglot, points `dp_input` at its own temporary view and
returns the result through Arrow. Every statement the engine sends ends in a GROUP BY partition (or
a single row), so what reaches the driver is partition-sized, never data-sized.

Inputs: a Spark DataFrame, a table name in the session's catalog, or a Parquet/CSV path (read by
Spark, so a lake path works too); a pandas DataFrame or Arrow table is shipped to the session (small
inputs, tests). pyspark is imported here only, so `dp_core` runs without it (the `spark` extra).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import sqlglot
from sqlglot import exp

from .bounding import INPUT_NAME
from .engine_errors import blank_quoted, spark_message
from .errors import InvalidDataError
from .input_checks import check_column_names
from .spark_no_value_errors import ansi_off, check_patterns, never_failing_on_spark
from .sql_scopes import table_reads

#: Spark's simple type names -> the DuckDB names the engine's checks speak (schema())
SPARK_TYPES = {"tinyint": "TINYINT", "smallint": "SMALLINT", "int": "INTEGER", "bigint": "BIGINT",
               "float": "FLOAT", "double": "DOUBLE", "string": "VARCHAR", "boolean": "BOOLEAN",
               "date": "DATE", "timestamp": "TIMESTAMP", "timestamp_ntz": "TIMESTAMP", "binary": "BLOB"}
FILE_SUFFIXES = (".parquet", ".pq", ".csv", ".csv.gz", ".tsv", ".tsv.gz")


def is_spark_input(data) -> bool:
    """A pyspark DataFrame (told by its module, so that pyspark need not be imported)."""
    return type(data).__module__.startswith("pyspark.sql") and hasattr(data, "createOrReplaceTempView")


def default_session():
    """The active SparkSession, or a clear error when there is none."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise InvalidDataError("the Spark backend needs pyspark: pip install 'dprelease[spark]'") from None
    session = SparkSession.getActiveSession()
    if session is None:
        raise InvalidDataError("backend='spark' needs a SparkSession: pass spark=<session> (or start one first)")
    return session


@dataclass
class SparkBackend:
    """Runs the engine's SQL on a SparkSession where the input is the temporary view `view`."""

    spark: object
    view: str
    dialect: str = "spark"
    derived: bool = False  # `view` is rows a query selected (SparkTables.backend_for), not a whole input
    kept: dict = field(default_factory=dict)  # view name -> its cached DataFrame (keep())
    patterns: set = field(default_factory=set)  # the literal patterns Spark compiled (check_patterns)

    @classmethod
    def for_input(cls, data, spark=None) -> SparkBackend:
        """Make `data` queryable (nothing is collected): DataFrame, table name, file path, or a
        pandas/Arrow table shipped to the session."""
        if isinstance(data, SparkBackend):
            return data
        if is_spark_input(data):
            spark = spark or data.sparkSession
            frame = data
        else:
            spark = spark or default_session()
            frame = _read(spark, data)
        check_column_names(frame.columns)
        view = f"{INPUT_NAME}_{secrets.token_hex(6)}"
        _missing_as_null(frame).createOrReplaceTempView(view)
        return cls(spark, view)

    def schema(self) -> dict[str, str]:
        """Column name -> type name in DuckDB's words (BIGINT, DOUBLE, VARCHAR, DECIMAL(p,s), ...)."""
        fields = self.spark.table(self.view).schema.fields
        return {f.name: _duck_type(f.dataType.simpleString()) for f in fields}

    def columns(self, name: str) -> list[str]:
        return list(self.spark.table(self.view if name == INPUT_NAME else name).columns)

    def run(self, sql: str) -> pd.DataFrame:
        """Run DuckDB-syntax SQL (transpiled here) and bring its small result back through Arrow."""
        table = self._spark_does(lambda: self.spark.sql(self.spark_sql(sql)).toArrow())
        return table.to_pandas(maps_as_pydicts="strict")

    can_keep = True  # keep(): rows computed once for several statements (shared_partials.py)

    def keep(self, name: str, sql: str) -> None:
        """Keep the rows of `sql` as the temporary view `name`, computed once and cached in the
        executors' memory only (a partition evicted is recomputed, never written to disk)."""
        from pyspark import StorageLevel

        def persisted():
            frame = self.spark.sql(self.spark_sql(sql)).persist(StorageLevel.MEMORY_ONLY)
            try:
                frame.count()  # computed now, once
            except BaseException:  # the session's cache would keep the plan and what was computed of it
                frame.unpersist()
                raise
            return frame

        frame = self._spark_does(persisted)
        frame.createOrReplaceTempView(name)
        self.kept[name] = frame

    def drop(self, name: str) -> None:
        frame = self.kept.pop(name, None)
        if frame is not None:
            frame.unpersist()
        self.spark.catalog.dropTempView(name)

    def _spark_does(self, work):
        return spark_does(self.spark, work)

    def spark_sql(self, sql: str) -> str:
        """`sql` (DuckDB syntax, Spark pieces) as Spark SQL over this backend's view."""
        return to_spark_sql(sql, {INPUT_NAME: self.view}, spark=self.spark, patterns=self.patterns)

    def close(self) -> None:
        for name in list(self.kept):
            self.drop(name)
        self.spark.catalog.dropTempView(self.view)


def spark_does(spark, work):
    """`work()` on `spark`, its failure in one line that never quotes a value of the data."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    try:
        with ansi_off(spark):  # a value that does not fit is NULL (spark_no_value_errors.py)
            return work()
    except PySparkException as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        words = spark_message(_condition(err), first)  # never a value of the data (dp_core.engine_errors)
        raise InvalidDataError(f"the data engine (Spark) could not run the query: {words}") from None
    except Py4JJavaError as err:  # a failure inside the JVM, e.g. a CSV read FAILFAST
        raise InvalidDataError(java_failure(str(err))) from None


def _condition(err) -> str | None:
    """A PySpark error's condition (its error class), e.g. CAST_INVALID_INPUT, when it has one."""
    for getter in ("getCondition", "getErrorClass"):
        try:
            value = getattr(err, getter)()
        except Exception:  # noqa: BLE001, S112 - older PySpark, or an error without one
            continue
        if value:
            return str(value)
    return None


def java_failure(text: str) -> str:
    """One line for a Java exception's many: a malformed CSV names its file and the remedy, never
    the record (Spark quotes the record's values); anything else, its innermost cause."""
    read = re.search(r"Encountered error while reading file (\S+?)\.?\s", text)
    where = read.group(1).removeprefix("file://") if read else "the input"
    if "MALFORMED" in text or "Malformed records are detected" in text:
        return (f"cannot read {where} with Spark: a malformed record (a row whose fields do not match the "
                "header); fix the file, or convert it to Parquet")
    causes = re.findall(r"Caused by: [\w.$]+: (.+)", text) or [text.strip().splitlines()[0] if text.strip() else ""]
    return f"the data engine (Spark) failed: {blank_quoted(causes[-1].strip())[:300]}"


def to_spark_sql(sql: str, views: dict[str, str], whole: bool = False, spark=None, patterns: set | None = None) -> str:
    """DuckDB-syntax SQL as Spark SQL, each table named in `views` read from its temporary view.
    The analyst's expressions in it (all of it when `whole`: a DP SELECT's source) in their
    never-failing forms, what has none refused (spark_no_value_errors.py); given the session, its
    literal patterns compiled once by Spark (`patterns`: those already compiled).

    A name is matched as DuckDB and the ownership check match it: without regard to case, and only
    where it reads a table, not a CTE of that name (a CTE is seen by the CTEs after it and by its
    query). Until 2026-11-25 a CTE named like a registered table was read from that table's view on
    Spark (`WITH visits AS (<public rows>) ... FROM visits` read the protected table's rows, under a
    unit the analyst chose for public rows), and `FROM VISITS` read no registered table."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    lowered = {name.lower(): view for name, view in views.items()}
    for table in [t for t, cte in table_reads(tree) if cte is None and t.name.lower() in lowered]:
        name, alias = table.name, table.alias
        table.set("this", exp.to_identifier(lowered[name.lower()]))
        if not alias:  # columns qualified by the table's name still resolve
            table.set("alias", exp.TableAlias(this=exp.to_identifier(name)))
    tree = never_failing_on_spark(tree, whole)
    if spark is not None:
        check_patterns(spark, tree, patterns if patterns is not None else set())
    return tree.sql(dialect="spark")


@dataclass
class SparkTables:
    """The named tables of a SQL statement on Spark (sql.run_sql with backend="spark"), each a
    temporary view of its own: empty Arrow stand-ins for the compiler's checks (no rows read),
    one SparkBackend per DP SELECT over its source, public tables brought back for outer queries."""

    spark: object
    views: dict[str, str]
    patterns: set = field(default_factory=set)  # the literal patterns Spark compiled (check_patterns)

    @classmethod
    def open(cls, tables: dict, spark=None) -> SparkTables:
        spark = spark or next((d.sparkSession for d in tables.values() if is_spark_input(d)), None) or default_session()
        views = {}
        try:
            for name, data in tables.items():
                frame = data if is_spark_input(data) else _read(spark, data)
                check_column_names(frame.columns, f"table {name!r}")
                views[name] = f"dp_t_{secrets.token_hex(6)}"
                _missing_as_null(frame).createOrReplaceTempView(views[name])
        except BaseException:
            for view in views.values():
                spark.catalog.dropTempView(view)
            raise
        return cls(spark, views)

    def empty(self, name: str):
        """An empty Arrow table with `name`'s columns and types (for compiling, reads no rows)."""
        # an input's own plan over local rows is computed while planned (Spark folds it): its failure
        # on a value is one line without it, as a query's
        return spark_does(self.spark, lambda: self.spark.table(self.views[name]).limit(0).toArrow())

    def local(self, name: str):
        """A public table's rows as Arrow (outer queries join them to the released tables)."""
        return spark_does(self.spark, lambda: self.spark.table(self.views[name]).toArrow())

    def source(self, source_sql: str) -> str:
        """A DP SELECT's source (DuckDB syntax) as the Spark SQL its view runs: never failing on a
        value, or refused by what it holds (spark_no_value_errors.py), before any row is read."""
        return to_spark_sql(source_sql, self.views, whole=True, spark=self.spark, patterns=self.patterns)

    def backend_for(self, source_sql: str) -> SparkBackend:
        """A backend whose `dp_input` is one DP SELECT's source (DuckDB syntax) over these tables
        (a derived input: engine.check_values)."""
        from pyspark.errors import PySparkException

        view = f"{INPUT_NAME}_{secrets.token_hex(6)}"
        source = self.source(source_sql)
        try:
            with ansi_off(self.spark):  # the view keeps the setting it was created with
                self.spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {view} AS {source}")
        except PySparkException as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise InvalidDataError(f"the data engine (Spark) could not prepare the query: {first}") from None
        return SparkBackend(self.spark, view, derived=True)

    def close(self) -> None:
        for view in self.views.values():
            self.spark.catalog.dropTempView(view)


def _duck_type(spark_type: str) -> str:
    if spark_type.startswith("decimal"):
        return spark_type.upper()
    return SPARK_TYPES.get(spark_type, spark_type.upper())


def _read(spark, data):
    """A Spark DataFrame over a path or table name (or a small local frame)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    if isinstance(data, pd.DataFrame) or type(data).__module__.startswith("pyarrow"):
        frame = data if isinstance(data, pd.DataFrame) else data.to_pandas()
        check_column_names(list(frame.columns))
        return spark.createDataFrame(frame)
    if not isinstance(data, (str, Path)):
        raise InvalidDataError(
            f"unsupported input type {type(data).__name__} for the Spark backend: give a Spark DataFrame, a "
            "table name, or a Parquet/CSV path")
    text = str(data)
    lower = text.lower().rstrip("/")
    try:
        if lower.endswith((".parquet", ".pq")) or "://" in text or Path(text).is_dir():  # a lake folder: Parquet
            if "://" not in text and not Path(text).exists():
                raise InvalidDataError(f"input file not found: {text}")
            return spark.read.parquet(text)
        if lower.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")):
            if "://" not in text and not Path(text).exists():
                raise InvalidDataError(f"input file not found: {text}")
            sep = "\t" if ".tsv" in lower else ","
            return spark.read.csv(text, header=True, inferSchema=True, sep=sep, quote='"', escape='"',
                                  mode="FAILFAST", enforceSchema=False)
        if "/" in text or "\\" in text:
            raise InvalidDataError(f"input file not found: {text} (give a table name, a {', '.join(FILE_SUFFIXES)} "
                                   "file, or a folder or lake URL of Parquet files)")
        return spark.table(text)
    except (PySparkException, Py4JJavaError) as err:
        what = ("file" if lower.endswith(FILE_SUFFIXES) else "folder" if "://" in text or Path(text).is_dir()
                else "table")
        if isinstance(err, Py4JJavaError):  # inside the JVM, e.g. a file named .parquet that is not Parquet: one line
            said = java_failure(str(err))
            raise InvalidDataError(said if said.startswith("cannot read ") else
                                   f"cannot read {what} {text!r} with Spark: {said.split(': ', 1)[1]}") from None
        first = str(err).strip().splitlines()[0]
        if "TABLE_OR_VIEW_NOT_FOUND" in first:
            raise InvalidDataError(f"no table or view {text!r} in the Spark session's catalog: register it or "
                                   "give a Parquet/CSV path") from None
        raise InvalidDataError(f"cannot read {what} {text!r} with Spark: {first}") from None


def _missing_as_null(frame):
    """NaN in float columns becomes NULL (missing), as on DuckDB (input_checks.missing_as_null)."""
    from pyspark.sql import functions as F

    floats = {f.name for f in frame.schema.fields if f.dataType.simpleString() in ("float", "double")}
    if not floats:
        return frame
    return frame.select(*[
        F.when(F.isnan(F.col(f"`{c}`")), None).otherwise(F.col(f"`{c}`")).alias(c) if c in floats else F.col(f"`{c}`")
        for c in frame.columns])
