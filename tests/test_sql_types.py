"""A DP SQL request whose aggregate reads a column of the wrong type (text, a boolean, a date) is
refused before any flow starts, data-free, with the engine's own message: through `dprelease
release`, `dprelease request submit` (real processes and in-process) and the Python API alike, with
no release recorded, no ledger entry and the escrow blob never opened (it is moved away while the
request is judged). The verdict is the one the engine gives on the escrowed rows, and requests that
work on the data (numbers, casts, dates as keys, a decimal column) still pass.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moved_away import moved_away
from patience import PATIENCE_S
from typer.testing import CliRunner

from dprelease.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
PEOPLE_CSV = "uid,g,x,f,s,b,d\n" + "".join(
    f"{i},{'ab'[i % 2]},{i % 7},{i / 3:.2f},t{i % 3},{'true' if i % 2 else 'false'},2020-01-{1 + i % 28:02d}\n"
    for i in range(1, 121))
REGIONS_CSV = "g,name,code\na,north,1\nb,south,2\n"


def _sql(aggregate: str, source: str = "people", keys: str = "g") -> str:
    return f"SELECT WITH ANONYMIZATION {keys}, {aggregate} AS v FROM {source} GROUP BY {keys}"


#: case -> (SQL, the engine's words: the column and the type it reads)
WRONG_TYPES = {
    "avg of text": (_sql("ANON_AVG(s, 0, 1)"), "'s' has type VARCHAR"),
    "sum of text": (_sql("ANON_SUM(s, 0, 1)"), "'s' has type VARCHAR"),
    "variance of text": (_sql("ANON_VAR(s, 0, 1)"), "'s' has type VARCHAR"),
    "stddev of text": (_sql("ANON_STDDEV(s, 0, 1)"), "'s' has type VARCHAR"),
    "quantiles of text": (_sql("ANON_QUANTILES(s, 4 CLAMPED BETWEEN 0 AND 1)"), "has type VARCHAR"),
    "sum of a boolean": (_sql("ANON_SUM(b, 0, 1)"), "'b' has type BOOLEAN"),
    "avg of a date": (_sql("ANON_AVG(d, 0, 1)"), "'d' has type DATE"),
    "the other syntax": ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6) g, "
                         "AVG(s, contribution_bounds_per_group => (0, 1)) AS v FROM people GROUP BY g",
                         "'s' has type VARCHAR"),
    "an inner SELECT's alias": (_sql("ANON_AVG(score, 0, 1)", "(SELECT uid, g, s AS score FROM people) AS t"),
                                "'score' has type VARCHAR"),
    "a CTE": ("WITH t AS (SELECT uid, g, s AS score FROM people) " + _sql("ANON_SUM(score, 0, 1)", "t"),
              "'score' has type VARCHAR"),
    "a public table's renamed text": (_sql("ANON_AVG(nm, 0, 1)", "people JOIN regions AS r(g, nm, cd) USING (g)"),
                                      "'nm' has type VARCHAR"),
    "a public table's text": (_sql("ANON_AVG(name, 0, 1)", "people JOIN regions USING (g)"),
                              "'name' has type VARCHAR"),
    "the second DP SELECT": ("WITH a AS (" + _sql("ANON_COUNT(*, 1)") + "), c AS (" + _sql("ANON_SUM(b, 0, 1)")
                             + ") SELECT a.g, a.v AS n, c.v AS t FROM a JOIN c USING (g)", "'b' has type BOOLEAN"),
}

#: case -> SQL the engine runs on the data: refused by no one
RIGHT_TYPES = {
    "numbers": _sql("ANON_AVG(x, 0, 9)") .replace(" AS v", " AS v, ANON_SUM(f, 0, 50) AS t"),
    "a cast in the inner SELECT": _sql("ANON_AVG(score, 0, 9)", "(SELECT uid, g, CAST(x AS DOUBLE) AS score FROM people)"),
    "text cast to a number": _sql("ANON_SUM(CAST(length(s) AS DOUBLE), 0, 3)"),
    "a boolean cast to a number": _sql("ANON_SUM(CAST(b AS INTEGER), 0, 1)"),
    "a date as the group key": _sql("ANON_COUNT(*, 1)", keys="d"),
    "a date's year": _sql("ANON_AVG(year(d), 2019, 2021)"),
    "days between dates": _sql("ANON_AVG(d - DATE '2020-01-01', 0, 31)"),
    "a public table's number": _sql("ANON_AVG(code, 0, 3)", "people JOIN regions USING (g)"),
    "a decimal column": _sql("ANON_SUM(amount, 0, 100)", "ledger"),
}


def _decimals() -> bytes:
    """A Parquet file with a decimal column (the store records it as `object`, as it does text)."""
    table = pa.table({"uid": pa.array(range(1, 61), pa.int64()), "g": ["ab"[i % 2] for i in range(60)],
                      "amount": pa.array([Decimal(f"{i}.25") for i in range(60)], pa.decimal128(10, 2))})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A home with `people` (text, numbers, a boolean, a date), `ledger` (a decimal column) and the
    public table `regions`: (root, env)."""
    root = tmp_path_factory.mktemp("sql-types")
    env = {"DPRELEASE_HOME": str(root / "home"), "DPRELEASE_KEY_DIR": str(root / "keys")}
    (root / "people.csv").write_text(PEOPLE_CSV)
    (root / "regions.csv").write_text(REGIONS_CSV)
    (root / "ledger.parquet").write_bytes(_decimals())
    for args in (["init"],
                 ["dataset", "register", "people", root / "people.csv", "--unit", "uid", "--epsilon-cap", "5"],
                 ["dataset", "register", "ledger", root / "ledger.parquet", "--unit", "uid", "--epsilon-cap", "5"],
                 ["dataset", "register", "regions", root / "regions.csv", "--public"],
                 ["analyst", "key", "ana", "--private-key", root / "ana.pem"]):
        result = CliRunner().invoke(app, [str(a) for a in args], env=env)
        assert result.exit_code == 0, result.stderr
    return root, env


def _settings(env: dict):
    from dprelease.settings import Settings

    return Settings.from_env(env)


def _request(root: Path, case: str, sql: str, dataset: str = "people") -> Path:
    path = root / f"{case.replace(' ', '-')}.yaml"
    path.write_text(f"dataset: {dataset}\nepsilon: 1\nsql: \"{sql}\"\n")
    return path


def written(env: dict) -> tuple:
    """What a refused request must leave alone: the releases, the ledger, the inbox, the archive."""
    from dprelease.store import Store

    settings = _settings(env)
    store = Store(settings.store_url)
    try:
        releases = tuple(r.id for r in store.list_releases())
        ledger = tuple((e.release_id, e.status) for e in store.ledger_entries())
    finally:
        store.close()
    inbox = tuple(sorted(p.name for p in settings.inbox_dir.glob("*"))) if settings.inbox_dir.exists() else ()
    archive = tuple(sorted(str(p) for p in settings.archive_dir.rglob("*"))) if settings.archive_dir.exists() else ()
    return releases, ledger, inbox, archive


def blob_away(env: dict, dataset: str = "people"):
    """The dataset's escrow blob moved away while the block runs: any decryption would fail."""
    from dprelease.store import Store

    store = Store(_settings(env).store_url)
    try:
        return moved_away(Path(store.get_dataset(dataset).blob_path))
    finally:
        store.close()


def engine_verdict(env: dict, sql: str, dataset: str = "people") -> str | None:
    """What the release's engine says on the escrowed rows (pipeline.compute_sealed's call): the
    refusal's message, or None when it computes the result."""
    from dp_core import InvalidDataError
    from dp_core.sql import run_sql
    from dprelease import pipeline

    platform = pipeline.Platform.open(_settings(env))
    ds = platform.store.get_dataset(dataset)
    try:
        pipeline.with_rows(platform, dataset, lambda rows: run_sql(sql, pipeline._sql_tables(platform, ds, rows),
                                                                   epsilon=1.0), "compute")
    except InvalidDataError as err:
        return str(err)
    finally:
        platform.store.close()
    return None


def preflight_verdict(env: dict, sql: str, dataset: str = "people") -> str | None:
    """What the Python API says before any flow: preflight.check_request's refusal, or None."""
    from dp_core import DPError
    from dprelease import preflight
    from dprelease.requests import parse_request

    try:
        preflight.check_request(_settings(env), parse_request({"dataset": dataset, "sql": sql, "epsilon": 1}))
    except DPError as err:
        return str(err)
    return None


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_a_column_of_the_wrong_type_is_refused_before_any_flow_as_the_engine_refuses_it(home, case):
    """Release, submission and the API each refuse in one line, exit 2, with the message the engine
    gives on the data; nothing is recorded and the escrow blob is not read."""
    root, env = home
    sql, words = WRONG_TYPES[case]
    on_data = engine_verdict(env, sql)
    assert on_data is not None and words in on_data
    path = _request(root, case, sql)
    before = written(env)
    with blob_away(env):
        assert preflight_verdict(env, sql) == on_data
        for args in (["release", path, "--approve-as", "alice"], ["request", "submit", path, "--as", "ana", "--key", root / "ana.pem"]):
            result = CliRunner().invoke(app, [str(a) for a in args], env=env)
            assert result.exit_code == 2, result.stdout + result.stderr
            assert result.stderr.strip().splitlines() == [f"error: {on_data}"]
            assert "Traceback" not in result.stdout + result.stderr
    assert written(env) == before, "a refused request recorded something"


@pytest.mark.parametrize("case", list(RIGHT_TYPES))
def test_a_request_the_engine_runs_is_not_refused_for_its_types(home, case):
    _, env = home
    sql = RIGHT_TYPES[case]
    dataset = "ledger" if "ledger" in sql else "people"
    assert engine_verdict(env, sql, dataset) is None
    assert preflight_verdict(env, sql, dataset) is None


def run_cli(env: dict, *args) -> subprocess.CompletedProcess:
    """A real `dprelease` process (its own temporary Prefect server if it gets that far)."""
    cli = Path(sys.executable).with_name("dprelease")
    full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "DPRELEASE_PREFECT_SERVER": "temporary"}
    full_env.pop("PREFECT_API_URL", None)
    return subprocess.run([str(cli), *map(str, args)], env=full_env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=PATIENCE_S)


@pytest.mark.parametrize("case", ["avg of text", "sum of a boolean", "a public table's text"])
def test_a_dprelease_process_refuses_a_wrong_type_in_one_line(home, case):
    root, env = home
    sql, words = WRONG_TYPES[case]
    path = _request(root, case, sql)
    before = written(env)
    with blob_away(env):
        for args in (["release", path, "--approve-as", "alice"], ["request", "submit", path, "--as", "ana", "--key", root / "ana.pem"]):
            done = run_cli(env, *args)
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            assert done.returncode == 2, done.stderr
            assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], done.stderr
            assert "Traceback" not in done.stdout + done.stderr
    assert written(env) == before


#: a spec request's aggregate -> the engine's words on the data (None: it runs)
SPEC_AGGREGATES = {
    "people": [({"kind": "sum", "column": "b", "lower": 0, "upper": 1}, "'b' has type BOOLEAN"),
               ({"kind": "avg", "column": "d", "lower": 0, "upper": 1}, "'d' has type DATE"),
               ({"kind": "avg", "column": "s", "lower": 0, "upper": 1}, "'s' has type VARCHAR"),
               ({"kind": "avg", "column": "x", "lower": 0, "upper": 9}, None)],
    "ledger": [({"kind": "sum", "column": "amount", "lower": 0, "upper": 100}, None)],
}


@pytest.mark.parametrize("dataset,aggregate,words", [(d, a, w) for d, cases in SPEC_AGGREGATES.items()
                                                     for a, w in cases])
def test_a_spec_request_gets_the_engines_verdict_on_its_column_types_before_any_flow(home, dataset, aggregate, words):
    """A spec request is judged on the same typed stand-ins: a boolean is named BOOLEAN (as the engine
    names it, not text), and a decimal column (recorded like text) is a number."""
    import dp_core as dp
    from dprelease import pipeline, preflight
    from dprelease.requests import parse_request

    _, env = home
    request = parse_request({"dataset": dataset, "query": {"aggregates": [aggregate]}, "epsilon": 1})
    platform = pipeline.Platform.open(_settings(env))
    try:
        query = pipeline.plan(platform, request).query
        try:
            pipeline.with_rows(platform, dataset, lambda rows: dp.execute(query, rows), "compute")
            on_data = None
        except dp.InvalidDataError as err:
            on_data = str(err)
        with blob_away(env, dataset):
            try:
                preflight.check_submission(platform, request)
                before_flow = None
            except dp.DPError as err:
                before_flow = str(err)
    finally:
        platform.store.close()
    assert before_flow == on_data and (words is None) == (on_data is None) and (words or "") in (on_data or "")


def test_the_flows_own_refusal_of_a_type_it_alone_can_see_is_one_line_and_spends_nothing(home):
    """A column whose registered type is not exact (the unit, text in this file, might be a
    decimal) passes the data-free check; the release's engine refuses it on the data: a real
    `dprelease release` ends in the engine's one line, exit 2, the reservation refunded, nothing
    sealed or published, and the release recorded as failed with that line."""
    from dprelease.store import Store

    root, env = home
    (root / "coded.csv").write_text("uid,g\n" + "".join(f"p{i},{'ab'[i % 2]}\n" for i in range(1, 61)))
    result = CliRunner().invoke(app, ["dataset", "register", "coded", str(root / "coded.csv"), "--unit", "uid",
                                      "--epsilon-cap", "5"], env=env)
    assert result.exit_code == 0, result.stderr
    sql = _sql("ANON_SUM(code, 0, 1)", "(SELECT uid, g, uid AS code FROM coded)")
    assert preflight_verdict(env, sql, "coded") is None, "the unit's type is not known before the data"
    on_data = engine_verdict(env, sql, "coded")
    assert on_data == "aggregate 'v' needs a numeric column, but 'code' has type VARCHAR"
    settings = _settings(env)
    releases_before = set(written(env)[0])
    published_before = sorted(settings.publication_dir.rglob("*"))
    done = run_cli(env, "release", _request(root, "coded", sql, "coded"))
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()] == [f"error: {on_data}"]
    assert "Traceback" not in done.stdout + done.stderr
    store = Store(settings.store_url)
    try:
        (release,) = [r for r in store.list_releases() if r.id not in releases_before]
        assert (release.status, release.decision_comment) == ("failed", on_data)
        assert store.ledger_entry(release.id).status == "refunded"
        budget = store.budget("coded")
        assert budget["epsilon_reserved"] == 0 and budget["epsilon_committed"] == 0
    finally:
        store.close()
    assert not (settings.archive_dir / release.id / "sealed-result.fernet").exists()
    assert sorted(settings.publication_dir.rglob("*")) == published_before
