"""External datasets: registered by reference (a Spark table, or a Parquet/CSV lake path) instead
of being copied into the escrow, and computed where they live (the Spark backend).

The store records that the dataset is external (its `file_format` is one of EXTERNAL_FORMATS) and
where it is (`blob_path` holds the reference); nothing is copied or fingerprinted byte by byte,
since the data stays in the lake. Its fingerprint is the SHA-256 of the reference and the schema
seen at registration: it names *what was registered*, not the bytes (an external table can change
between releases; the data checks then catch a changed column set or new categories).

Which engine computes a release (`backend`, the flow's typed parameter and a request's field):
"auto" is the dataset's own (Spark for an external dataset, DuckDB in this process for escrowed
data); "spark" runs only external datasets (escrowed data is decrypted in this process and never
leaves it); "duckdb" can read an external Parquet/CSV path, never a Spark table. pyspark is
imported only when Spark is needed (the `spark` extra).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Literal

from dp_core.errors import InvalidDataError

from .settings import Settings

#: `Dataset.file_format` of an external dataset, by what its reference names
EXTERNAL_FORMATS = {"table": "external-table", "parquet": "external-parquet", "csv": "external-csv"}
BackendChoice = Literal["auto", "duckdb", "spark"]
BACKEND_CHOICES = ("auto", "duckdb", "spark")
INSTALL_HINT = "pip install 'dprelease[spark]'"


class ExternalDataError(InvalidDataError):
    """An external dataset cannot be read or run where asked; the message says why and what to do."""


def is_external(ds) -> bool:
    """The dataset lives outside the escrow (registered by reference)."""
    return ds.file_format in EXTERNAL_FORMATS.values()


def escrowed_bytes(ds) -> int | None:
    """The size of a dataset's escrow blob: None for an external dataset, or a blob that is gone
    (the release reports that itself)."""
    if is_external(ds):
        return None
    try:
        return Path(ds.blob_path).stat().st_size
    except OSError:
        return None


def reference_kind(reference: str) -> str:
    """table, parquet or csv: what a reference names (the Spark backend reads it the same way)."""
    lower = reference.lower().rstrip("/")
    if lower.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")):
        return "csv"
    if lower.endswith((".parquet", ".pq")) or "/" in reference or "\\" in reference or "://" in reference:
        return "parquet"  # a Parquet file, a folder of Parquet files, or a lake URL
    return "table"


def resolve_backend(ds, backend: str = "auto") -> str:
    """The engine that computes releases of `ds` ("duckdb" or "spark"), or a one-line refusal."""
    if backend not in BACKEND_CHOICES:
        raise ExternalDataError(f"unknown backend {backend!r}: choose one of {', '.join(BACKEND_CHOICES)}")
    if not is_external(ds):
        if backend == "spark":
            raise ExternalDataError(
                f"dataset {ds.name!r} is held in the escrow: it is decrypted in this process only and runs on "
                "DuckDB; backend 'spark' runs external datasets (dprelease dataset register NAME --external "
                "TABLE_OR_PATH): use backend 'auto' or 'duckdb'")
        return "duckdb"
    if backend == "duckdb" and ds.file_format == EXTERNAL_FORMATS["table"]:
        raise ExternalDataError(f"dataset {ds.name!r} is the Spark table {ds.blob_path!r}: only Spark can read it; "
                                "use backend 'auto' or 'spark'")
    return "duckdb" if backend == "duckdb" else "spark"


def spark_session(settings: Settings):
    """The process's SparkSession: the active one (a worker or a notebook that made it, its logging
    its maker's), else a new one on DPRELEASE_SPARK_MASTER (Spark's own default, local[*], when
    unset): a master URL (spark://..., local[...], yarn) makes this process a driver; a Spark Connect
    URL (sc://...) makes it a client of that server, which is the driver (no JVM here). Spark's own
    logs, which quote the data, are off in a session started here (dprelease.spark_logs) unless
    DPRELEASE_SPARK_LOGS=on."""
    try:
        from pyspark.errors import PySparkException
        from pyspark.sql import SparkSession
    except ImportError:
        raise ExternalDataError(f"external datasets run on Spark, and pyspark is not installed: {INSTALL_HINT}") from None
    from . import spark_logs

    session = SparkSession.getActiveSession()
    if session is not None:
        return session
    remote = bool(settings.spark_master and settings.spark_master.startswith("sc://"))
    try:
        if remote:
            session = SparkSession.builder.appName("dprelease").remote(settings.spark_master).getOrCreate()
            if not settings.spark_logs:
                spark_logs.quiet_query_context_loggers()
            return session
        conf = _driver_conf(settings)
        if settings.spark_logs:
            return SparkSession.builder.config(conf=conf).getOrCreate()
        return spark_logs.start_driver(conf)
    except (PySparkException, spark_logs.JvmDidNotStart) as err:  # no Java, a cluster that cannot be reached
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        shown = _without_token(settings.spark_master or "local[*]")
        raise ExternalDataError(f"cannot start Spark (master {shown}): {_without_token(first)}; "
                                "check Java 17+ and DPRELEASE_SPARK_MASTER") from None


def _driver_conf(settings: Settings):
    """The conf of a driver this process starts: the app's name, the master when one is set."""
    from pyspark import SparkConf

    conf = SparkConf().setAppName("dprelease")
    return conf.setMaster(settings.spark_master) if settings.spark_master else conf


def _without_token(text: str) -> str:
    """`text` with a Spark Connect URL's token (`;token=...`) blanked: a refusal line is shown and logged."""
    return re.sub(r"(token=)[^;\s)]*", r"\1***", text)


def read_reference(settings: Settings, reference: str, spark=None):
    """A Spark DataFrame over the reference (nothing is read but its schema), or a one-line error
    naming it (no such table, no such path)."""
    from dp_core.backend_spark import _read

    session = spark or spark_session(settings)
    try:
        return _read(session, reference)
    except InvalidDataError as err:
        raise ExternalDataError(f"external data {reference!r}: {err}") from None


def rows_for(settings: Settings, ds, backend: str = "auto"):
    """What the engine reads for a release of the external dataset `ds`: a Spark DataFrame (Spark),
    or the lake path itself (DuckDB reads a Parquet/CSV file)."""
    if resolve_backend(ds, backend) == "duckdb":
        return ds.blob_path
    frame = read_reference(settings, ds.blob_path)
    registered = list(json.loads(ds.schema_json))
    if list(frame.columns) != registered:  # the checks say it in detail; the engine must not guess
        missing = [c for c in registered if c not in frame.columns]
        if missing:
            raise ExternalDataError(f"external dataset {ds.name!r} ({ds.blob_path}) no longer has column(s) {missing}: "
                                    "register it again under a new name; nothing was computed")
    return frame


def snapshot_reference(reference: str, snapshot: str) -> str:
    """A series' reference for one period: `{snapshot}` in it becomes the label (one lake path
    pattern for every period, e.g. s3a://lake/visits/month={snapshot}/)."""
    return reference.replace("{snapshot}", snapshot)


def reference_schema(settings: Settings, reference: str) -> dict[str, str]:
    """The schema an external reference would be registered with (column -> type; no rows read)."""
    from .admin import _schema_names

    return _schema_names(read_reference(settings, reference).limit(0).toArrow().schema)


def register_external(settings: Settings, name: str, reference: str, privacy_unit: str, epsilon_cap: float,
                      delta_cap: float = 1e-5, expectations: list[dict] | None = None,
                      risk_profile: dict | None = None, spark=None):
    """Record an external dataset: its reference, schema, caps and data checks; nothing is copied.

    The suite is the one escrowed datasets get (checks.DatasetProfile): the column set, a non-null
    unit, finite numbers, and the categories of text columns with at most MAX_CATEGORIES values,
    found by Spark (one `SELECT DISTINCT ... LIMIT` per text column: partition-sized results).
    Everything that can be refused (unit, name, reference, columns) is refused before the record
    is written."""
    from dp_core import input_checks

    from . import checks
    from .admin import checked_risk_profile
    from .store import Store, StoreError

    if not privacy_unit:
        raise ExternalDataError("an external dataset needs --unit (a public table is registered from a file, "
                                "into the escrow)")
    profile = checked_risk_profile(risk_profile)
    store = Store(settings.store_url)
    if name in {d.name for d in store.list_datasets()}:
        raise StoreError(f"dataset {name!r} is already registered: choose another name")
    frame = read_reference(settings, reference, spark)
    columns = list(frame.columns)
    input_checks.check_column_names(columns, reference)
    if privacy_unit not in columns:
        raise ExternalDataError(f"the privacy unit column {privacy_unit!r} is not in {reference} (columns: {columns})")
    schema = frame.limit(0).toArrow().schema
    if expectations is None:
        data_profile = checks.DatasetProfile.for_schema(schema)
        for column in list(data_profile.categories):
            values = frame.select(frame[column]).where(frame[column].isNotNull()).distinct() \
                .limit(checks.MAX_CATEGORIES + 1).toArrow()
            found = {str(v) for v in values.column(0).to_pylist()}
            data_profile.categories[column] = found if len(found) <= checks.MAX_CATEGORIES else None
        expectations = data_profile.expectations(privacy_unit)
    from .admin import _schema_names

    names = _schema_names(schema)
    kind = reference_kind(reference)
    fingerprint = hashlib.sha256(json.dumps({"reference": reference, "kind": kind, "schema": names},
                                            sort_keys=True).encode()).hexdigest()
    return store.add_dataset(name, privacy_unit=privacy_unit, blob_path=reference, fingerprint=fingerprint,
                             file_format=EXTERNAL_FORMATS[kind], schema=names, epsilon_cap=epsilon_cap,
                             delta_cap=delta_cap, expectations=expectations, risk_profile=profile)
