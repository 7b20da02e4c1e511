"""An external dataset through the platform (issue 15): registered by reference (a Parquet lake
folder), nothing copied into the escrow; its checks run on Spark (great-expectations' Spark
datasource); a release of it runs on Spark through the real flow (prefect_test_harness), is
approved by a controller's signed decision, and its report is signed and verifies. Bad input
(a missing path or table, an engine that cannot read the data) is one line, nothing spent.

Shares the suite's one local[2] SparkSession (conftest `spark`, one xdist worker)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
import pytest
from patience import PATIENCE_S

import dp_core as dp

pytestmark = [pytest.mark.xdist_group("spark"),  # one worker, one SparkSession (pyproject: --dist loadgroup)
              pytest.mark.runs_first]  # the Spark group: minutes on one worker, started first (conftest.py)

SQL = ("SELECT WITH ANONYMIZATION education, ANON_COUNT(*, 1) AS people, ANON_AVG(age, 17, 90) AS avg_age "
       "FROM lake GROUP BY education")


@pytest.fixture(scope="module")
def lake_env(spark, adult, tmp_path_factory):
    """A fresh home; Adult as a lake folder of two Parquet files, registered as `lake` (external);
    the controller alice; a temporary Prefect API for the module."""
    home = tmp_path_factory.mktemp("home")
    saved = {k: os.environ.get(k) for k in ("DPRELEASE_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED")}
    os.environ["DPRELEASE_HOME"] = str(home)
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect_harness import prefect_harness

    from dprelease import admin, decisions, external
    from dprelease.settings import Settings

    settings = Settings.from_env()
    admin.init(settings)
    folder = tmp_path_factory.mktemp("lake") / "adult"
    folder.mkdir()
    half = len(adult) // 2
    adult.iloc[:half].to_parquet(folder / "part-0.parquet", index=False)
    adult.iloc[half:].to_parquet(folder / "part-1.parquet", index=False)
    external.register_external(settings, "lake", str(folder), "person_id", epsilon_cap=10,
                               risk_profile={"max_risk": 0.5})
    keys = tmp_path_factory.mktemp("controller-keys")
    decisions.create_controller(settings, "alice", keys / "alice.pem")
    with prefect_harness():
        yield settings, folder, keys / "alice.pem"
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.mark.parametrize("asked", [
    {"sql": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6) sex, COUNT(*, "
            "contribution_bounds_per_group => (0, 1)) AS n FROM lake WHERE regexp_matches(education, sex) GROUP BY sex"},
    {"query": {"group_by": ["sex"], "aggregates": [{"kind": "count", "upper": 1}],
               "where": "education LIKE sex", "public_partitions": ["Female", "Male"]}},
], ids=["sql", "spec"])
def test_what_spark_would_fail_on_whatever_the_value_is_refused_before_any_flow(lake_env, asked):
    """A pattern read from the data, which Spark compiles row by row and fails on, is refused by the
    request's checks (the CLI's quick verdict, and the flow's before it reserves anything) when the
    dataset runs on Spark, with the refusal dp_core gives; on DuckDB (backend duckdb) it runs."""
    from dprelease import pipeline, preflight
    from dprelease.requests import parse_request

    settings, _, _ = lake_env
    platform = pipeline.Platform.open(settings)
    with pytest.raises(dp.InvalidQueryError) as caught:
        preflight.check_submission(platform, parse_request({"dataset": "lake", "epsilon": 1, **asked}))
    assert "on the Spark backend a pattern (regular expression, LIKE) must be a literal string" in str(caught.value)
    assert "\n" not in str(caught.value)
    preflight.check_submission(platform, parse_request({"dataset": "lake", "epsilon": 1, "backend": "duckdb", **asked}))


def test_external_registration_records_a_reference_and_copies_nothing(lake_env):
    from dprelease import external
    from dprelease.store import Store

    settings, folder, _ = lake_env
    ds = Store(settings.store_url).get_dataset("lake")
    assert external.is_external(ds) and ds.file_format == "external-parquet" and ds.blob_path == str(folder)
    assert not list(settings.escrow_dir.iterdir())  # nothing sealed: the data stays in the lake
    # the same suite an escrowed dataset gets, its categories found by Spark
    suite = {(e["type"], e["kwargs"].get("column")): e["kwargs"] for e in json.loads(ds.expectations_json)}
    assert suite[("expect_column_values_to_not_be_null", "person_id")] == {"column": "person_id"}
    assert "Male" in suite[("expect_column_values_to_be_in_set", "sex")]["value_set"]
    assert ("expect_column_values_to_be_between", "age") in suite


def test_checks_on_spark_give_the_verdicts_of_the_duckdb_path(lake_env, adult, spark):
    """(The registered suite passes on Spark in the release test: its flow's first step.) A narrower
    suite fails on Spark with the lines, counts and verdicts the DuckDB path gives."""
    from dprelease import checks

    strict = [{"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "sex", "value_set": ["Male"]}},
              {"type": "expect_column_values_to_be_between", "kwargs": {"column": "age", "min_value": 0, "max_value": 60}}]
    on_spark = checks.validate(spark.createDataFrame(adult), strict)
    on_duckdb = checks.validate(adult, strict)
    assert not on_spark.success and on_spark.lines == on_duckdb.lines
    assert f"{int((adult['sex'] != 'Male').sum())} unexpected" in on_spark.lines[0]


def test_a_release_of_an_external_dataset_runs_on_spark_is_approved_signed_and_verifies(lake_env):
    """The real flow with its typed backend parameter: checks, plan, reservation, compute on Spark,
    controller summary, a signed decision, publication; the report verifies with the public key."""
    import threading

    from dprelease import pipeline
    from dprelease.cli.deciding import decide
    from dprelease.flows.approvals import wait_until_paused
    from dprelease.flows.release import outcome, release_flow
    from dprelease.reporting import signing

    settings, _, alice = lake_env
    platform = pipeline.Platform.open(settings)
    box: dict = {}

    def run():
        try:
            box["result"] = outcome(release_flow(dataset="lake", sql=SQL, epsilon=1.0, approval_timeout=PATIENCE_S,
                                                 backend="spark", return_state=True))
        except BaseException as err:  # noqa: BLE001
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + PATIENCE_S
    while not (waiting := platform.store.list_releases(status="awaiting_approval")):
        assert thread.is_alive() and time.monotonic() < deadline, f"no approval asked: {box}"
        time.sleep(0.3)
    rel = waiting[0]
    assert platform.store.budget("lake")["epsilon_reserved"] == pytest.approx(1.0)
    wait_until_paused(rel.flow_run_id)
    decide(settings, rel.id, "approve", alice, "checked on the lake")
    thread.join(PATIENCE_S)
    assert box.get("result", {}).get("status") == "published", box
    directory = Path(box["result"]["directory"])
    verified = signing.verify_directory(directory, settings.public_key_file)
    assert verified.ok and verified.facts["dataset"] == "lake" and verified.facts["approved_by"] == "alice"
    budget = platform.store.budget("lake")
    assert budget["epsilon_committed"] == pytest.approx(1.0) and budget["epsilon_reserved"] == 0
    assert '"backend": "spark"' in platform.store.get_release(rel.id).request_json
    released = pd.read_csv(directory / "results.csv")
    assert {"education", "people", "avg_age"} <= set(released.columns) and len(released) > 5
    assert signing.verify_directory(settings.archive_dir / rel.id / "controller", settings.public_key_file).ok


def test_bad_external_input_is_one_line_and_spends_nothing(lake_env, tmp_path):
    from dp_core import DPError
    from dprelease import admin, external, pipeline
    from dprelease.requests import parse_request

    settings, folder, _ = lake_env
    platform = pipeline.Platform.open(settings)
    before = platform.store.budget("lake")
    names = {d.name for d in platform.store.list_datasets()}
    for reference, words in ((str(tmp_path / "gone" / "trips.parquet"), "not found"),
                             ("no_such_table", "no table or view 'no_such_table'")):
        with pytest.raises(DPError, match=words) as err:
            external.register_external(settings, "bad", reference, "person_id", epsilon_cap=1)
        assert "\n" not in str(err.value)
    with pytest.raises(DPError, match="privacy unit column 'rider'"):
        external.register_external(settings, "bad", str(folder), "rider", epsilon_cap=1)
    assert {d.name for d in platform.store.list_datasets()} == names  # nothing registered
    # an engine that cannot read the data: refused by the first step, before any reservation
    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "adult.csv.gz"
    admin.register_dataset(settings, "sealed", data, "person_id", epsilon_cap=1, add_row_id=True)
    with pytest.raises(DPError, match="held in the escrow.*backend 'spark' runs external datasets"):
        pipeline.check_data(platform, "sealed", "spark")
    planned = pipeline.plan(platform, parse_request({"dataset": "lake", "sql": SQL, "epsilon": 1.0, "backend": "spark"}))
    assert planned.request.backend == "spark"
    # PRI data mode would collect every unit's contribution from Spark: refused before anything is spent
    spec = {"group_by": ["education"], "aggregates": [{"kind": "count", "upper": 1}]}
    pri_data = parse_request({"dataset": "lake", "query": spec, "epsilon": {"pri": {"p": 50, "mode": "data"}}})
    with pytest.raises(DPError, match="PRI data mode needs every unit's contribution in this process"):
        pipeline.choose_epsilon(platform, pipeline.plan(platform, pri_data))
    with pytest.raises(DPError, match="backend must be one of auto, duckdb, spark"):
        parse_request({"dataset": "lake", "sql": SQL, "epsilon": 1.0, "backend": "dask"})
    assert platform.store.budget("lake") == before


def test_without_pyspark_the_error_says_how_to_install_it(monkeypatch):
    import sys

    from dp_core import DPError
    from dprelease import external
    from dprelease.settings import Settings

    monkeypatch.setitem(sys.modules, "pyspark.sql", None)  # as if the spark extra were not installed
    with pytest.raises(DPError, match=r"pip install 'dprelease\[spark\]'"):
        external.spark_session(Settings.from_env())


def test_a_spark_connect_url_that_cannot_be_used_is_one_line_without_its_token(monkeypatch):
    """DPRELEASE_SPARK_MASTER=sc://...;token=...: a refusal names the URL with the token blanked
    (the line is shown on the CLI and kept in logs)."""
    from pyspark.sql import SparkSession

    from dprelease import external
    from dprelease.settings import Settings

    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))  # not the suite's session
    settings = Settings.from_env({"DPRELEASE_SPARK_MASTER": "sc://localhost:1/;token=Sesame-4471;user_id"})
    with pytest.raises(external.ExternalDataError, match=r"cannot start Spark \(master sc://localhost:1/;token=\*\*\*;") as err:
        external.spark_session(settings)
    assert "Sesame-4471" not in str(err.value) and "\n" not in str(err.value)


def test_the_engine_s_spark_backend_without_pyspark_says_how_to_install_it(monkeypatch):
    """dp_core's backend="spark" (no platform around it) names the extra to install."""
    import sys

    from dp_core import DPError
    from dp_core.backend_spark import default_session

    monkeypatch.setitem(sys.modules, "pyspark.sql", None)  # as if the spark extra were not installed
    with pytest.raises(DPError) as caught:
        default_session()
    assert str(caught.value) == "the Spark backend needs pyspark: pip install 'dprelease[spark]'"


def test_spark_reads_one_parquet_file_and_a_csv_with_typed_columns(spark, tmp_path):
    """The Spark reader external datasets go through (dp_core.backend_spark): one Parquet file (.parquet
    or .pq), not only a lake folder, is read as Parquet; a folder Spark cannot read is named a folder;
    a CSV's columns get the types of their values (numbers
    stay numbers: the checks' ranges and the SQL compiler rely on them); the input is seen under the
    engine's name for it; what it cannot read is refused saying what it can."""
    from dp_core import InvalidDataError
    from dp_core.backend_spark import SparkBackend

    frame = pd.DataFrame({"uid": [1, 2, 3], "site": ["a", "b", "a"], "minutes": [3.5, 1.0, 2.0]})
    single, short, csv = tmp_path / "visits.parquet", tmp_path / "visits.pq", tmp_path / "visits.csv"
    frame.to_parquet(single, index=False)
    frame.to_parquet(short, index=False)
    frame.to_csv(csv, index=False)
    for path, uid_type in ((single, "BIGINT"), (short, "BIGINT"), (csv, "INTEGER")):
        backend = SparkBackend.for_input(str(path), spark)
        try:
            assert backend.schema() == {"uid": uid_type, "site": "VARCHAR", "minutes": "DOUBLE"}, path
            assert backend.columns("dp_input") == ["uid", "site", "minutes"]
        finally:
            backend.close()
    empty = tmp_path / "lake"
    empty.mkdir()
    with pytest.raises(InvalidDataError) as caught:  # a folder without Parquet files: Spark's reason, in one line
        SparkBackend.for_input(str(empty), spark)
    assert str(caught.value).startswith(f"cannot read folder {str(empty)!r} with Spark: [UNABLE_TO_INFER_SCHEMA] "
                                        "Unable to infer schema for Parquet."), str(caught.value)
    assert "\n" not in str(caught.value)
    fake = tmp_path / "notes.parquet"
    fake.write_text("uid,site\n1,a\n")
    with pytest.raises(InvalidDataError) as caught:  # a file named Parquet holding text: named a file, one line
        SparkBackend.for_input(str(fake), spark)
    assert str(caught.value).startswith(f"cannot read file {str(fake)!r} with Spark: "), str(caught.value)
    assert "is not a Parquet file" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(InvalidDataError) as caught:
        SparkBackend.for_input(42, spark)
    assert str(caught.value) == ("unsupported input type int for the Spark backend: give a Spark DataFrame, a table "
                                 "name, or a Parquet/CSV path")
    # a Spark DataFrame (or a session) with backend="duckdb": refused, saying which backend reads it
    query = dp.Query([dp.count(upper=1)], privacy_unit="uid", epsilon=1.0)
    for data, session in ((spark.createDataFrame(frame), None), (frame, spark)):
        with pytest.raises(dp.InvalidQueryError) as caught:
            dp.execute(query, data, backend="duckdb", spark=session)
        assert str(caught.value) == "backend='duckdb' cannot read a Spark DataFrame: use backend='spark'"


def test_a_csv_on_spark_reads_quoted_fields_as_rfc_4180_writes_them(spark, tmp_path):
    """A quoted CSV field's doubled quote is one quote and a backslash is itself (RFC 4180, what pandas,
    DuckDB and spreadsheets write): the values Spark reads are those written, so keys and labels match."""
    from dp_core.backend_spark import SparkBackend

    sites = ['say "hi" now', "C:\\dir\\", "a,b"]
    csv = tmp_path / "quoted.csv"
    pd.DataFrame({"uid": [1, 2, 3], "site": sites}).to_csv(csv, index=False)
    assert '"say ""hi"" now"' in csv.read_text()  # the file quotes as RFC 4180 does
    backend = SparkBackend.for_input(str(csv), spark)
    try:
        assert backend.run("SELECT site FROM dp_input ORDER BY uid")["site"].tolist() == sites
    finally:
        backend.close()


def test_a_spark_failure_is_refused_without_a_deprecation_warning(spark):
    """PySpark 4 warns (FutureWarning) when an error's condition is read by its old name, getErrorClass: the
    refusal names the condition read by its new name, and the analyst sees the refusal, not a warning."""
    import warnings

    from pyspark.sql import functions as F

    from dp_core.backend_spark import SparkBackend

    frame = spark.createDataFrame(pd.DataFrame({"uid": [1, 2], "code": ["x-7", "y-8"]}))
    # the input's own plan fails (a cast its owner wrote under ANSI mode): a query's expressions no longer do
    backend = SparkBackend.for_input(frame.withColumn("code", F.col("code").cast("int")), spark)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(dp.InvalidDataError, match=r"could not run the query: \[CAST_INVALID_INPUT\] "):
                backend.run("SELECT sum(code) AS s FROM dp_input")
    finally:
        backend.close()
    assert [str(w.message) for w in seen if issubclass(w.category, (DeprecationWarning, FutureWarning))] == []


def test_spark_refuses_a_malformed_csv_and_names_every_column_type(spark, tmp_path):
    """A CSV row with a field too many is refused on Spark (read FAILFAST), not read with the field
    dropped, in one line naming the file (not Spark's Java trace, which quotes the record); a column of a Spark type the engine has no name for keeps Spark's (upper-cased), so
    the checks can refuse it by name."""
    from dp_core.backend_spark import SparkBackend

    bad = tmp_path / "bad.csv"
    bad.write_text("uid,x\n1,2\n2,3,4\n3,5\n")
    with pytest.raises(dp.InvalidDataError) as refused:
        dp.execute(dp.Query([dp.sum_("x", 0, 10)], privacy_unit="uid", epsilon=1.0), str(bad), backend="spark",
                   spark=spark)
    assert str(refused.value) == (f"cannot read {bad} with Spark: a malformed record (a row whose fields do not "
                                  "match the header); fix the file, or convert it to Parquet")  # one line, no record
    backend = SparkBackend.for_input(spark.createDataFrame(pd.DataFrame({"uid": [1], "tags": [[1, 2]]})), spark)
    try:
        assert backend.schema() == {"uid": "BIGINT", "tags": "ARRAY<BIGINT>"}
    finally:
        backend.close()


def test_cli_registers_an_external_csv_and_refuses_what_does_not_fit(lake_env, tmp_path):
    from typer.testing import CliRunner

    from dprelease.cli.app import app
    from dprelease.store import Store

    settings, _, _ = lake_env
    csv = tmp_path / "visits.csv"
    pd.DataFrame({"uid": [1, 1, 2, 3], "site": ["a", "b", "a", "c"], "minutes": [3.5, 1.0, 2.0, 9.0]}).to_csv(csv, index=False)

    def run(*args):
        result = CliRunner().invoke(app, ["dataset", "register", *args])
        return result.exit_code, result.output

    code, out = run("visits", "--external", str(csv), "--unit", "uid", "--epsilon-cap", "2")
    assert code == 0 and "external csv" in out and "nothing copied" in out, out
    ds = Store(settings.store_url).get_dataset("visits")
    assert ds.file_format == "external-csv" and ds.blob_path == str(csv)
    assert {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "site", "value_set": ["a", "b", "c"]}} \
        in json.loads(ds.expectations_json)
    for args, words in ((("other",), "give the file to seal into the escrow, or --external"),
                        (("other", str(csv), "--external", str(csv)), "not both"),
                        (("other", "--external", str(csv), "--unit", "uid"), "needs --unit <column> and --epsilon-cap"),
                        (("other", "--external", str(csv), "--public"), "--add-row-id and --public need a file")):
        code, out = run(*args)
        assert code != 0 and words in " ".join(out.split()), out
    assert "other" not in {d.name for d in Store(settings.store_url).list_datasets()}


def test_a_series_of_external_snapshots_from_one_lake_path_pattern(lake_env, tmp_path):
    """Issue 21's series, by reference: `{snapshot}` in the path names each period's folder; the
    series' schema contract holds for external periods too (a changed schema is refused)."""
    from dprelease import external, series
    from dprelease.store import Store
    from dprelease.store import series as store_series

    settings, _, _ = lake_env
    for month, extra in (("2026-10", {}), ("2026-11", {}), ("2026-12", {"new_col": [1, 2]})):
        folder = tmp_path / f"month={month}"
        folder.mkdir()
        pd.DataFrame({"uid": [1, 2], "site": ["a", "b"], **extra}).to_parquet(folder / "part-0.parquet", index=False)
    pattern = str(tmp_path / "month={snapshot}")
    series.register_snapshot(settings, "lakevisits", None, "2026-10", privacy_unit="uid", budget_mode="per_snapshot",
                             epsilon_cap=1.0, external=pattern)
    latest = series.register_snapshot(settings, "lakevisits", None, "2026-11", external=pattern)
    assert external.is_external(latest) and latest.blob_path == str(tmp_path / "month=2026-11")
    store = Store(settings.store_url)
    assert store_series.resolve(store, "lakevisits", "latest").dataset == latest.name
    with pytest.raises(series.SnapshotRefused, match="changes the schema"):
        series.register_snapshot(settings, "lakevisits", None, "2026-12", external=pattern)
    with pytest.raises(series.SnapshotRefused, match="--add-row-id needs a file"):
        series.register_snapshot(settings, "lakevisits", None, "2027-01", external=pattern, add_row_id=True)


def test_any_other_java_failure_is_one_line_its_innermost_cause():
    from dp_core.backend_spark import java_failure

    trace = ("An error occurred while calling o60.getResult.\n: org.apache.spark.SparkException: Job aborted\n"
             "\tat org.apache.spark.Foo.bar(Foo.scala:1)\nCaused by: java.lang.ArithmeticException: / by zero\n"
             "\tat org.apache.spark.Baz.qux(Baz.scala:2)\n")
    assert java_failure(trace) == "the data engine (Spark) failed: / by zero"
    assert java_failure("An error occurred while calling o1.x.") == (
        "the data engine (Spark) failed: An error occurred while calling o1.x.")


def test_spark_reads_an_arrow_table_and_a_statement_takes_its_session_from_a_spark_frame(spark):
    """Two inputs of the Spark backend: a pyarrow Table (read through pandas, its column names checked as
    any frame's) and, in a statement without spark=, a Spark DataFrame, whose own session runs it."""
    import pyarrow as pa

    from dp_core.sql import Table, run_sql

    arrow = pa.table({"uid": list(range(300)), "g": ["a", "b", "c"] * 100})
    q = dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", group_by=("g",), epsilon=100.0,
                 public_partitions=["a", "b", "c"])
    released = dp.execute(q, arrow, backend="spark", spark=spark).table.sort_values("g")
    assert released["n"].round().tolist() == [100.0, 100.0, 100.0]
    twice = pa.Table.from_arrays([arrow["uid"], arrow["g"], arrow["uid"]], names=["uid", "g", "uid"])
    with pytest.raises(dp.InvalidDataError) as caught:
        dp.execute(q, twice, backend="spark", spark=spark)
    assert str(caught.value) == ("the input has the column 'uid' twice, at positions 1 and 3: rename or drop one (each "
                                 "column must have its own name)")
    frame = spark.createDataFrame(arrow.to_pandas())
    result = run_sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 100, delta = 1e-6, privacy_unit_column = uid) "
                     "COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM people", {"people": Table(frame, "uid")},
                     backend="spark")
    assert result.table["n"].round().tolist() == [300.0]


def test_a_malformed_record_is_named_without_its_values_in_either_wording_of_spark():
    """Spark words a malformed CSV record with its condition (MALFORMED_RECORD_IN_PARSING) or, from the
    CSV reader's own exception, only as "Malformed records are detected ...": either way the failure
    names the file and the remedy and never the record, whose values Spark quotes."""
    from dp_core.backend_spark import java_failure

    expected = ("cannot read /data/visits.csv with Spark: a malformed record (a row whose fields do not match the "
                "header); fix the file, or convert it to Parquet")
    for words in ("[MALFORMED_RECORD_IN_PARSING.WITHOUT_SUGGESTION] Malformed records are detected in record "
                  "parsing: [alice,42,secret].", "Malformed records are detected in record parsing. Parse Mode: "
                  "FAILFAST. Record: alice,42,secret"):
        trace = (f"An error occurred while calling o60.csv.\n: org.apache.spark.SparkException: Encountered error "
                 f"while reading file file:///data/visits.csv. Details:\nCaused by: org.apache.spark.SparkException: "
                 f"{words}\n")
        assert java_failure(trace) == expected


def test_grouped_quantiles_on_spark_are_binned_per_partition_like_duckdb(spark):
    """Spark has no histogram(): each quantile's bins are counted per partition and joined back to their
    partition (two keys here). The plan's pre-noise partials on Spark equal DuckDB's, bin for bin (the
    comparison of tests/test_spark_backend.py, which mutation testing does not run)."""
    from test_spark_backend import QUERIES, SEED, _run_both, assert_same_frame, make_data

    from dp_core.bounding import build_plan
    from dp_core.engine import check_columns

    query = QUERIES["quantiles (MEDIAN, MIN, MAX, NTILE), two keys"]
    data = make_data(units=150)

    def partials(backend):
        schema = backend.schema()
        plan = build_plan(query, check_columns(query, schema), SEED, key_types=schema, dialect=backend.dialect,
                          transpile=False, portable_hash=True)
        return backend.run(plan.sql)

    duck, on_spark = _run_both((data, spark.createDataFrame(data)), partials, spark)
    assert len(duck) > 10 and all(f"_a{i}_hist" in duck for i in range(4))
    assert_same_frame(duck, on_spark, list(query.group_by))


def test_the_engine_reads_a_table_from_the_spark_session_it_is_given(spark):
    """A temporary view of a session other than the active one is read from that session (the one
    passed as spark=), not looked up in the active session, which does not have it."""
    from pyspark.sql import SparkSession

    other = spark.newSession()
    other.createDataFrame(pd.DataFrame({"uid": range(200), "x": [1.0] * 200})).createOrReplaceTempView("only_here")
    spark.createDataFrame(pd.DataFrame({"a": [1]})).count()  # the suite's session is the active one again
    assert SparkSession.getActiveSession() is not None
    assert not SparkSession.getActiveSession().catalog.tableExists("only_here")
    result = dp.execute(dp.Query([dp.count(upper=1, name="n")], privacy_unit="uid", epsilon=50.0), "only_here",
                        backend="spark", spark=other)
    assert result.table["n"].iloc[0] == pytest.approx(200, abs=2)


def test_per_partition_bounds_on_spark_are_those_of_duckdb(spark):
    """bounds_scope="partition" on Spark: each partition's histogram runs in Spark's SQL and gives the
    bounds DuckDB gives (values 1 to 3: [1, 4]; 100 to 300: [64, 512]; epsilon 8, 1,000 units per
    partition far out of the noise)."""
    rows = []
    for g, low in (("small", 1.0), ("large", 100.0)):
        rows += [{"g": g, "v": low * (1 + i % 3)} for i in range(1000)]
    data = pd.DataFrame(rows).assign(uid=range(len(rows)))
    query = dp.Query([dp.Aggregate("sum", column="v", name="s")], privacy_unit="uid", group_by=("g",), epsilon=8.0,
                     bounds_scope="partition")
    found = {}
    for engine, frame in (("duckdb", data), ("spark", spark.createDataFrame(data))):
        result = dp.execute(query, frame, backend=engine, spark=spark if engine == "spark" else None)
        found[engine] = sorted((b.partition["g"], b.lower, b.upper) for b in result.inferred_bounds)
    assert found["spark"] == found["duckdb"] == [("large", 64.0, 512.0), ("small", 1.0, 4.0)]


def test_per_partition_bounds_over_units_past_their_bound_are_the_same_noisy_histograms_on_spark(spark, monkeypatch):
    """Each unit is in 4 of 6 partitions and keeps 2 (C_u): which 2 is the portable hash's choice for the
    seed, on both engines, so with the noise replayed each partition's bounds histogram is the same noisy
    counts and the release the same table on DuckDB and Spark (another hash would keep other rows, and a
    count would differ)."""
    from noise_replay import replay_noise

    data = pd.DataFrame([{"uid": u, "g": f"p{(u + k) % 6}", "v": float(1 + (u * 7 + k) % 50)}
                         for u in range(1200) for k in range(4)])
    query = dp.Query([dp.Aggregate("sum", column="v", name="s")], privacy_unit="uid", group_by=("g",), epsilon=50.0,
                     max_partitions_contributed=2, bounds_scope="partition")
    found = {}
    for engine, frame in (("duckdb", data), ("spark", spark.createDataFrame(data))):
        replay_noise(monkeypatch, 21)
        result = dp.execute(query, frame, backend=engine, spark=spark if engine == "spark" else None,
                            bounding_seed=77, portable_hash=True)
        found[engine] = ([(b.partition["g"], b.noisy_counts) for b in result.inferred_bounds],
                         result.table.sort_values("g")["s"].tolist())
    monkeypatch.undo()
    assert len(found["duckdb"][0]) == 6 and found["spark"] == found["duckdb"]


def test_a_mad_selection_on_spark_runs_both_rounds_and_releases_what_duckdb_releases(spark, monkeypatch):
    """MaxAdaptiveDegree on Spark (no DuckDB connection to keep the bounded rows in): round 1 releases
    the three large partitions, round 2 the six small ones, and with the noise replayed and the
    portable hash the release is the table DuckDB gives, partition for partition."""
    from noise_replay import replay_noise
    from test_spark_backend import assert_same_frame

    rows = [(f"u{u}", f"big{u % 3}", u % 5) for u in range(900)]
    rows += [(f"v{u}", f"small{u % 6}", u % 7) for u in range(360)] + [(f"v{u}", f"small{(u + 1) % 6}", 2)
                                                                       for u in range(120)]
    data = pd.DataFrame(rows, columns=["uid", "part", "k"])
    query = dp.Query([dp.count(name="n"), dp.sum_("k", 0, 6, name="s")], privacy_unit="uid", group_by=("part",),
                     epsilon=1.0, max_partitions_contributed=2, noise="gaussian", selection="mad")
    found = {}
    for engine, frame in (("duckdb", data), ("spark", spark.createDataFrame(data))):
        replay_noise(monkeypatch, 5)
        found[engine] = dp.execute(query, frame, backend=engine, spark=spark if engine == "spark" else None,
                                   bounding_seed=7, portable_hash=True)
    monkeypatch.undo()
    said = found["duckdb"].partition_selection
    assert "released 3 partitions" in said and "released 6 more" in said, said
    assert found["spark"].partition_selection == said
    assert_same_frame(found["duckdb"].table, found["spark"].table, ["part"])


def test_a_dp_select_on_spark_reads_its_derived_rows_unchecked_and_names_what_spark_cannot_prepare(spark):
    """On Spark as on DuckDB, the rows a DP SELECT derives are not checked as an input (a WHERE that
    keeps none releases a count of 0, never "no rows"); a statement DuckDB accepts but Spark cannot
    prepare (a DuckDB-only function) is refused in one line that says which; a remainder by zero is
    NULL on Spark as on DuckDB (it failed the release under Spark's ANSI mode until 2026-11-30)."""
    from dp_core.sql import Table, run_sql

    people = {"people": Table(pd.DataFrame({"uid": range(300), "dept": ["a", "b", "c"] * 100,
                                            "age": [20 + i % 60 for i in range(300)]}), "uid")}
    dps = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 100, delta = 1e-6, privacy_unit_column = uid) "
           "COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM people WHERE ")
    none_kept = run_sql(dps + "age > 1000", people, backend="spark", spark=spark)
    assert none_kept.table["n"].tolist() == [0.0]
    with pytest.raises(dp.InvalidDataError) as caught:
        run_sql(dps + "regexp_full_match(dept, 'a')", people, backend="spark", spark=spark)
    assert str(caught.value).startswith("the data engine (Spark) could not prepare the query: [UNRESOLVED_ROUTINE] "
                                        "Cannot resolve routine `REGEXP_FULL_MATCH`") and "\n" not in str(caught.value)
    by_zero = dps + "CAST(age AS INTEGER) % (age - age) = 0"  # every row's remainder is NULL: none kept
    assert run_sql(by_zero, people, backend="spark", spark=spark).table["n"].tolist() == \
        run_sql(by_zero, people).table["n"].tolist() == [0.0]


def test_a_spark_query_failing_on_a_value_never_quotes_it(spark, tmp_path):
    """ANSI SQL: a cast of a text value fails when the rows are read, and Spark's message quotes
    the value ("The value 'secret' of the type STRING..."): the refusal names the condition and the
    remedy, never the value (it would reach the store, the logs and the Prefect UI). The cast that
    fails is the input's own (its owner's DataFrame, under ANSI mode); the same cast in the query is
    NULL for that row, as on DuckDB (it failed the release until 2026-11-30)."""
    from pyspark.sql import functions as F

    from dp_core.sql import Table, run_sql

    rows = pd.DataFrame({"uid": range(30), "code": ["x-secret-7"] * 30})
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6, privacy_unit_column = uid) "
           "COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM people WHERE CAST(code AS INTEGER) > 0")
    for backend in ("spark", "duckdb"):  # the same verdict: every row's cast is NULL, so no row is kept
        assert len(run_sql(sql, {"people": Table(rows, "uid")}, backend=backend, spark=spark
                           if backend == "spark" else None).table) == 1
    rows.to_parquet(tmp_path / "people.parquet")
    # over a lake, and over local rows, whose plan Spark computes while planning (reading the table's
    # columns raised Spark's own error, with the value, until 2026-11-30)
    for read in (spark.read.parquet(str(tmp_path / "people.parquet")), spark.createDataFrame(rows)):
        owners = read.withColumn("code", F.col("code").cast("int"))
        with pytest.raises(dp.InvalidDataError) as caught:
            run_sql(sql.replace("CAST(code AS INTEGER)", "code"), {"people": Table(owners, "uid")}, spark=spark)
        assert str(caught.value) == (
            "the data engine (Spark) could not run the query: [CAST_INVALID_INPUT] a value of the data does not fit "
            "the query (not shown: it is the data's); check the query's casts, arithmetic and formats, or filter such "
            "rows out")


def test_a_java_failure_s_cause_has_its_quoted_values_blanked():
    """A cause from inside the JVM may quote the value it failed on (Java's NumberFormatException
    says `For input string: "x-secret-7"`): every quoted literal is blanked."""
    from dp_core.backend_spark import java_failure

    trace = ('py4j.protocol.Py4JJavaError: An error occurred while calling o9.collect.\n'
             'Caused by: java.lang.NumberFormatException: For input string: "x-secret-7" in \'column\'\n')
    assert java_failure(trace) == ('the data engine (Spark) failed: For input string: "…" in \'…\'')


def test_spark_reads_a_lake_url_and_names_a_path_it_cannot_place(spark, tmp_path):
    """A URL (here file://) is a lake folder of Parquet handed to Spark as is, whether or not it is a local
    path; a path that is neither a file of a known kind nor a folder is refused saying what may be given."""
    from dp_core import InvalidDataError
    from dp_core.backend_spark import SparkBackend

    lake = tmp_path / "lake"
    lake.mkdir()
    pd.DataFrame({"uid": [1, 2, 3], "x": [1.0, 2.0, 3.0]}).to_parquet(lake / "part-0.parquet", index=False)
    backend = SparkBackend.for_input(lake.as_uri(), spark)
    try:
        assert backend.schema() == {"uid": "BIGINT", "x": "DOUBLE"}
    finally:
        backend.close()
    missing = tmp_path / "no" / "such"
    with pytest.raises(InvalidDataError) as caught:
        SparkBackend.for_input(str(missing), spark)
    assert str(caught.value) == (f"input file not found: {missing} (give a table name, a .parquet, .pq, .csv, "
                                 ".csv.gz, .tsv, .tsv.gz file, or a folder or lake URL of Parquet files)")


def test_a_missing_path_with_a_trailing_slash_is_read_by_its_suffix_and_a_malformed_csv_record_is_never_quoted(
        tmp_path):
    """`missing.parquet/` and `missing.csv/` are named by their suffix (a missing file of a known kind, not a
    path of unknown kind), before any Spark session is needed; a Java failure that carries only Spark's
    MALFORMED_CSV_RECORD class is the malformed-record refusal naming the file, never the record's values."""
    from dp_core import InvalidDataError
    from dp_core.backend_spark import _read, java_failure

    for name in ("missing.parquet/", "missing.csv/"):
        with pytest.raises(InvalidDataError) as caught:
            _read(None, f"{tmp_path}/{name}")
        assert str(caught.value) == f"input file not found: {tmp_path}/{name}"
    failure = ("org.apache.spark.SparkException: Encountered error while reading file file:///d/people.csv. Details:\n"
               "Caused by: org.apache.spark.SparkRuntimeException: [MALFORMED_CSV_RECORD] Malformed CSV record: "
               "17,jane,42 SQLSTATE: KD000\n\tat org.apache.spark.sql.catalyst.csv.UnivocityParser.parse")
    assert java_failure(failure) == ("cannot read /d/people.csv with Spark: a malformed record (a row whose fields do "
                                     "not match the header); fix the file, or convert it to Parquet")


def test_a_statement_on_spark_reads_a_spark_frame_a_tsv_and_skips_nan_in_a_single_precision_column(spark, tmp_path):
    """Each table of a statement on Spark is read as given: a Spark DataFrame as itself, a .tsv file by
    its tabs; a NaN in a single-precision (FLOAT) column is missing, as on DuckDB and as in a DOUBLE one,
    so each person's value is counted once and no NaN reaches a sum (epsilon 100: the noise is far below
    0.5 on the counts and below 2 on the sums)."""
    from pyspark.sql import types as T

    from dp_core.sql import Table, run_sql

    rows = [(u, "a" if u % 2 else "b", float("nan") if u % 3 == 0 else 1.5, float("nan") if u % 5 == 0 else 2.0)
            for u in range(600)]
    schema = T.StructType([T.StructField("uid", T.LongType()), T.StructField("dept", T.StringType()),
                           T.StructField("f", T.FloatType()), T.StructField("d", T.DoubleType())])
    frame = spark.createDataFrame(rows, schema)
    tsv = tmp_path / "depts.tsv"
    tsv.write_text("dept\tregion\na\tnorth\nb\tsouth\n")
    dps = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 100, delta = 1e-6, privacy_unit_column = uid) "
           "region, COUNT(f, contribution_bounds_per_group => (0, 1)) AS nf, "
           "SUM(f, contribution_bounds_per_group => (0, 2)) AS sf, "
           "COUNT(d, contribution_bounds_per_group => (0, 1)) AS nd FROM people JOIN depts USING (dept) "
           "GROUP BY region")
    result = run_sql(f"SELECT * FROM ({dps}) ORDER BY region", {"people": Table(frame, "uid"), "depts": Table(str(tsv))},
                     backend="spark", spark=spark)
    assert result.table["region"].tolist() == ["north", "south"]
    expected_f = [sum(1 for u in range(600) if u % 2 == odd and u % 3) for odd in (1, 0)]
    assert result.table["nf"].round().tolist() == expected_f
    assert result.table["sf"].round().tolist() == pytest.approx([1.5 * n for n in expected_f], abs=2)
    assert result.table["nd"].round().tolist() == [sum(1 for u in range(600) if u % 2 == odd and u % 5) for odd in (1, 0)]
    missing = run_sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 100, delta = 1e-6, privacy_unit_column = uid) "
                      "COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM people WHERE f IS NULL",
                      {"people": Table(frame, "uid")}, backend="spark", spark=spark)
    assert missing.table["n"].round().tolist() == [200.0]  # the NaN rows are the missing ones, as on DuckDB
