"""Every bad input through the real command line: files, requests, SQL, parameters, keys and blobs.

For each case: a non-zero exit, exactly one line on stderr that names the problem, no traceback,
the budget of every dataset unchanged and the publication directory unchanged. Most cases fail
before any flow starts and share one registered home (module fixture); a few run as real
`dprelease` processes, to show that no traceback and no library noise (Prefect, DuckDB's
nanobind, great-expectations) reaches the terminal. The engine API gives the same verdict, with
the same message, on the same files.
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from patience import PATIENCE_S
from typer.testing import CliRunner

from dprelease.cli.app import app
from dprelease.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
GOOD_CSV = "uid,g,x,s\n" + "".join(f"{i},{'ab'[i % 2]},{i % 7},t{i % 3}\n" for i in range(1, 41))
SQL = "SELECT WITH ANONYMIZATION g, ANON_COUNT(*, 1) AS people FROM small GROUP BY g"


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


#: a CSV whose row 100,002 (line 100,003) has one field too many, 1.9 MB: past the first MiB the file checks read
FAR_RAGGED = b"uid,g,x\n" + b"".join(b"%d,a,7\n" % i for i in range(100_001)) + b"7,b,8,9\n1,a,2\n"

#: bad data files: name -> content (bytes), or None for a directory
FILES = {
    "directory.csv": None,
    "empty.csv": b"",
    "header_only.csv": b"uid,g,x\n",
    "blank_lines.csv": b"\n\n  \n",
    "gzip_named.csv": gzip.compress(GOOD_CSV.encode()),
    "parquet_named.csv": _parquet(pa.table({"uid": [1, 2]})),
    "not_gzip.csv.gz": GOOD_CSV.encode(),
    "not_parquet.parquet": GOOD_CSV.encode(),
    "zipped.csv": b"PK\x03\x04" + b"\x00" * 40,
    "bzipped.csv": b"BZh91AY&SY" + b"\x00" * 20,
    "duplicate.csv": b"uid,amount,amount\n1,2,3\n",
    "case_duplicate.csv": b"uid,Amount,amount\n1,2,3\n",
    "unnamed.csv": b"uid,,x\n1,2,3\n",
    "latin1.csv": "uid,city\n1,Köln\n".encode("latin-1"),
    "sheet.xlsx": b"PK\x03\x04",
    "notes.txt": b"uid\n1\n",
    "empty.parquet": _parquet(pa.table({"uid": pa.array([], pa.int64())})),
    "duplicate.parquet": _parquet(pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array([3])],
                                                       names=["uid", "amount", "amount"])),
    "header_only.csv.gz": gzip.compress(b"uid,g,x\n"),
    "gzip_of_parquet.csv.gz": gzip.compress(_parquet(pa.table({"uid": [1]}))),
    # rows with another number of fields than the header: near the top (read by the file checks),
    # first (DuckDB's sniffer took it for the header), after a value spanning two lines, and past the
    # first MiB (found when DuckDB stops on it)
    "ragged_long.csv": b"uid,region,score,age\n1,north,3.0,40\n2,south,4.0,41,EXTRA\n3,east,5.0,42\n",
    "ragged_short.csv": b"uid,region,score,age\n1,north,3.0,40\n2,south,4.0\n3,east,5.0,42\n",
    "ragged_first.csv": b"uid,region,score,age\n2,south,4.0,41,EXTRA\n" + b"3,east,5.0,42\n" * 50,
    "ragged_quoted.csv": b'uid,g,x\n1,"two\nlines",2\n2,c,3,4\n',
    "ragged.tsv": b"uid\tg\n1\ta\n2\n",
    "ragged_far.csv": FAR_RAGGED,
    "ragged_far.csv.gz": gzip.compress(FAR_RAGGED),
}

#: (case id, file, words the one line must contain); the engine API must say the same
FILE_CASES = [
    ("missing file", "missing.csv", "not found"),
    ("directory", "directory.csv", "is a directory"),
    ("empty file", "empty.csv", "is empty (0 bytes)"),
    ("header only", "header_only.csv", "header row but no data rows"),
    ("blank lines only", "blank_lines.csv", "no header row"),
    ("gzip named .csv", "gzip_named.csv", "gzip-compressed but named .csv: rename it to gzip_named.csv.gz"),
    ("parquet named .csv", "parquet_named.csv", "is a Parquet file but named .csv"),
    (".csv.gz not gzip", "not_gzip.csv.gz", "is named csv.gz but is not gzip-compressed"),
    (".parquet not parquet", "not_parquet.parquet", "is named .parquet but is not a Parquet file"),
    ("zip named .csv", "zipped.csv", "is a zip archive"),
    ("bzip2 named .csv", "bzipped.csv", "bzip2-compressed"),
    ("duplicate columns", "duplicate.csv", "has the column 'amount' twice"),
    ("duplicate in another case", "case_duplicate.csv", "differ only in case"),
    ("unnamed column", "unnamed.csv", "column 2 has no name"),
    ("not UTF-8", "latin1.csv", "is not UTF-8 text"),
    ("excel file", "sheet.xlsx", "unsupported file type"),
    ("text file", "notes.txt", "unsupported file type"),
    ("parquet without rows", "empty.parquet", "has columns but no rows"),
    ("parquet duplicate columns", "duplicate.parquet", "has the column 'amount' twice"),
    ("gzip header only", "header_only.csv.gz", "header row but no data rows"),
    ("parquet inside gzip", "gzip_of_parquet.csv.gz", "holds a Parquet file inside the gzip"),
    ("a row with a field too many", "ragged_long.csv", "ragged_long.csv, line 3: 5 fields, but the header (line 1) "
     "has 4: every row needs one field per column (put a value holding a comma in double quotes); fix or remove"),
    ("a row with a field too few", "ragged_short.csv", "ragged_short.csv, line 3: 3 fields, but the header (line 1) "
     "has 4"),
    ("the first row ragged", "ragged_first.csv", "ragged_first.csv, line 2: 5 fields, but the header (line 1) has 4"),
    ("ragged after a value on two lines", "ragged_quoted.csv", "ragged_quoted.csv, line 4: 4 fields, but the header "
     "(line 1) has 3"),
    ("a TSV row with a field too few", "ragged.tsv", "ragged.tsv, line 3: 1 field, but the header (line 1) has 2: "
     "every row needs one field per column (put a value holding a tab in double quotes)"),
    ("ragged past the first MiB", "ragged_far.csv", "ragged_far.csv, line 100003: 4 fields, but the header (line 1) "
     "has 3"),
    ("ragged past the first MiB, gzip", "ragged_far.csv.gz", "ragged_far.csv.gz, line 100003: 4 fields, but the "
     "header (line 1) has 3"),
]

#: release requests: case id -> (request text, words)
BAD_REQUESTS = {
    "not yaml": ("dataset: [small\n", "not valid YAML/JSON"),
    "a list, not a mapping": ("- dataset: small\n", "must be a mapping"),
    "unknown field": (f"dataset: small\nsql: {SQL}\nepsilon: 1\ncolour: red\n", "unknown field(s) ['colour']"),
    "no dataset": (f"sql: {SQL}\nepsilon: 1\n", "must name a registered dataset"),
    "sql and query": (f"dataset: small\nsql: {SQL}\nquery: {{aggregates: [{{kind: count}}]}}\nepsilon: 1\n",
                      "exactly one of `sql`"),
    "neither sql nor query": ("dataset: small\nepsilon: 1\n", "exactly one of `sql`"),
    "epsilon zero": (f"dataset: small\nsql: {SQL}\nepsilon: 0\n", "epsilon must be a finite number > 0, got 0"),
    "epsilon negative": (f"dataset: small\nsql: {SQL}\nepsilon: -1\n", "epsilon must be a finite number > 0"),
    "epsilon text": (f"dataset: small\nsql: {SQL}\nepsilon: lots\n", "epsilon must be a finite number > 0"),
    "epsilon NaN": (f"dataset: small\nsql: {SQL}\nepsilon: .nan\n", "epsilon must be a finite number > 0"),
    "epsilon absurd": (f"dataset: small\nsql: {SQL}\nepsilon: 1.0e+9\n", "above the maximum 100"),
    "epsilon bad mode": (f"dataset: small\nsql: {SQL}\nepsilon: {{foo: 1}}\n", "epsilon must be a number, {pri"),
    "risk fields missing": (f"dataset: small\nsql: {SQL}\nepsilon: {{risk: {{trust: low}}}}\n", "epsilon.risk needs"),
    "risk n zero": (f"dataset: small\nsql: {SQL}\nepsilon: {{risk: {{max_noise: 10, n: 0}}}}\n",
                    "epsilon.risk (Risk model): n: Input should be greater than or equal to 2"),
    "risk reference value zero": (f"dataset: small\nsql: {SQL}\nepsilon: {{risk: {{max_noise: '10%', n: 4, "
                                  "reference_value: 0}}\n", "reference_value: Input should be greater than 0"),
    "risk m zero": (f"dataset: small\nsql: {SQL}\nepsilon: {{risk: {{max_noise: 10, n: 4, m: 0}}}}\n",
                    "epsilon.risk (Risk model): m: Input should be greater than or equal to 1"),
    "delta above 1": (f"dataset: small\nsql: {SQL}\nepsilon: 1\ndelta: 1.5\n",
                      "delta = 1.5 is above the maximum 0.001"),
    "delta near 1": (f"dataset: small\nsql: {SQL}\nepsilon: 1\ndelta: 0.999999\n",
                     "delta = 0.999999 is above the maximum 0.001"),
    "sql epsilon tiny": (f"dataset: small\nsql: {SQL}\nepsilon: 1.0e-300\n", "epsilon = 1e-300 is too small for this "
                     "query: the partition selection would get epsilon 5e-301"),
    "sql epsilon subnormal": (f"dataset: small\nsql: {SQL}\nepsilon: 5.0e-324\n", "is too small for this query"),
    "delta text": (f"dataset: small\nsql: {SQL}\nepsilon: 1\ndelta: tiny\n", "delta must be a finite number"),
    "C_u zero": (f"dataset: small\nsql: {SQL}\nepsilon: 1\nmax_partitions_contributed: 0\n",
                 "max_partitions_contributed must be a whole number >= 1"),
    "C_u fraction": (f"dataset: small\nsql: {SQL}\nepsilon: 1\nmax_partitions_contributed: 1.5\n",
                     "max_partitions_contributed must be a whole number >= 1"),
    "unknown dataset": (f"dataset: nosuch\nsql: {SQL.replace('small', 'nosuch')}\nepsilon: 1\n",
                        "unknown dataset 'nosuch'"),
    "over the budget": (f"dataset: small\nsql: {SQL}\nepsilon: 6\n", "budget exceeded for dataset 'small'"),
    "sql unknown column": (("dataset: small\nsql: SELECT WITH ANONYMIZATION nope, ANON_COUNT(*, 1) AS n FROM small "
                           "GROUP BY nope\nepsilon: 1\n"), "unknown column 'nope'"),
    "sql syntax": ("dataset: small\nsql: SELEKT WITH ANONYMIZATION g FROM small\nepsilon: 1\n", "not valid SQL"),
    "sql unknown table": (("dataset: small\nsql: SELECT WITH ANONYMIZATION g, ANON_COUNT(*, 1) AS n FROM other "
                          "GROUP BY g\nepsilon: 1\n"), "other"),
    "sql groups by the unit": (("dataset: small\nsql: SELECT WITH ANONYMIZATION uid, ANON_COUNT(*, 1) AS n FROM small "
                               "GROUP BY uid\nepsilon: 1\n"), "privacy unit"),
    "spec average of text": (("dataset: small\nquery: {aggregates: [{kind: avg, column: s, lower: 0, upper: 1}]}\n"
                             "epsilon: 1\n"), "needs a numeric column, but 's' has type VARCHAR"),
    "spec unknown column": (("dataset: small\nquery: {aggregates: [{kind: sum, column: y, lower: 0, upper: 1}]}\n"
                            "epsilon: 1\n"), "column 'y' is not in the input"),
    "sql bounds reversed": (("dataset: small\nsql: SELECT WITH ANONYMIZATION g, ANON_SUM(x, 5, 1) AS t FROM small "
                            "GROUP BY g\nepsilon: 1\n"), "exceeds upper bound"),
    "spec without aggregates": ("dataset: small\nquery: {aggregates: []}\nepsilon: 1\n", "non-empty list `aggregates`"),
    "spec unknown kind": ("dataset: small\nquery: {aggregates: [{kind: median, column: x}]}\nepsilon: 1\n", "median"),
    "spec unknown aggregate field": ("dataset: small\nquery: {aggregates: [{kind: count, colour: red}]}\nepsilon: 1\n",
                                     "unknown field(s) ['colour']"),
    "spec quantile out of range": (("dataset: small\nquery: {aggregates: [{kind: quantile, column: x, q: 2, lower: 0, "
                                   "upper: 9}]}\nepsilon: 1\n"), "q must be in [0, 1]"),
    "spec public keys without group_by": (("dataset: small\nquery: {aggregates: [{kind: count}], public_partitions: "
                                          "[a]}\nepsilon: 1\n"), "no group_by"),
    "spec unknown option": ("dataset: small\nquery: {aggregates: [{kind: count}], order_by: [g]}\nepsilon: 1\n",
                            "unknown field(s) ['order_by']"),
}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One home with dataset `small` (cap 5) registered, and the bad files; never mutated."""
    root = tmp_path_factory.mktemp("bad-input")
    saved = os.environ.get("DPRELEASE_HOME")
    os.environ["DPRELEASE_HOME"] = str(root / "home")
    (root / "small.csv").write_text(GOOD_CSV)
    files = root / "files"
    files.mkdir()
    for name, content in FILES.items():
        if content is None:
            (files / name).mkdir()
        else:
            (files / name).write_bytes(content)
    requests = root / "requests"
    requests.mkdir()
    for i, (text, _) in enumerate(BAD_REQUESTS.values()):
        (requests / f"r{i}.yaml").write_text(text)
    (requests / "latin1.yaml").write_bytes("dataset: Köln\n".encode("latin-1"))
    (requests / "good.yaml").write_text(f"dataset: small\nsql: {SQL}\nepsilon: 1\n")
    assert invoke("init")[0] == 0
    code, _, err = invoke("dataset", "register", "small", str(root / "small.csv"), "--unit", "uid", "--epsilon-cap", "5")
    assert code == 0, err
    yield root
    if saved is None:
        os.environ.pop("DPRELEASE_HOME", None)
    else:
        os.environ["DPRELEASE_HOME"] = saved


def invoke(*args, env: dict | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    return result.exit_code, result.stdout, result.stderr


def state(root: Path) -> tuple:
    """What a refused command must leave alone: every dataset's budget, the published files."""
    from dprelease.settings import Settings
    from dprelease.store import Store

    settings = Settings.from_env({"DPRELEASE_HOME": str(root / "home")})
    store = Store(settings.store_url)
    budgets = tuple(sorted((ds.name, tuple(sorted(store.budget(ds.name).items()))) for ds in store.list_datasets()))
    published = sorted(str(p.relative_to(settings.publication_dir)) for p in settings.publication_dir.rglob("*"))
    store.close()
    return budgets, tuple(published)


def refused(root: Path, *args, words: str, env: dict | None = None) -> str:
    """Run the command; assert the refusal contract; return the line."""
    before = state(root)
    code, out, err = invoke(*args, env=env)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0, f"exit 0 for {args}: {out}"
    assert len(lines) == 1, f"not one line for {args}: {err!r}"
    assert lines[0].startswith("error: ") and words in lines[0], f"{words!r} not in {lines[0]!r}"
    assert "Traceback" not in out + err
    assert state(root) == before, "a refused command changed the budget or the publication directory"
    return lines[0]


@pytest.mark.parametrize("case,filename,words", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bad_file_is_refused_at_registration_and_by_the_engine_alike(home, case, filename, words):
    import dp_core as dp

    path = home / "files" / filename
    line = refused(home, "dataset", "register", "bad", path, "--unit", "uid", "--epsilon-cap", "1", words=words)
    with pytest.raises(dp.InvalidDataError) as engine:
        dp.execute(dp.Query([dp.count()], privacy_unit="uid", epsilon=1.0), path)
    assert line == f"error: {engine.value}", "the engine API and the CLI must say the same"


@pytest.mark.parametrize("case", list(BAD_REQUESTS), ids=list(BAD_REQUESTS))
def test_bad_request_is_refused_before_any_flow(home, case):
    index = list(BAD_REQUESTS).index(case)
    words = BAD_REQUESTS[case][1]
    line = refused(home, "release", home / "requests" / f"r{index}.yaml", "--approve-as", "alice", words=words)
    if case not in ("unknown dataset", "over the budget") and "sql" not in case and "spec" not in case:
        assert f"r{index}.yaml" in line, "a malformed request names its file"


@pytest.mark.parametrize("args,words", [
    (("release", "{root}/requests/missing.yaml"), "missing.yaml: no such file or directory"),
    (("release", "{root}/requests"), "is a directory"),
    (("release", "{root}/requests/latin1.yaml"), "not UTF-8 text"),
    (("utility", "{root}/requests/good.yaml", "--evaluator", "spearman_rank", "--params", "oops"), "--params is not valid JSON"),
    (("utility", "{root}/requests/good.yaml", "--evaluator", "spearman_rank"), "evaluator 'spearman_rank' is not enabled"),
    (("approve", "no-such-release", "--reason", "checked"), "unknown release 'no-such-release'"),
    (("reject", "no-such-release", "--reason", "too fine"), "unknown release 'no-such-release'"),
    (("budget", "nosuch"), "unknown dataset 'nosuch'"),
    (("policy", "add", "p", "--dataset", "nosuch", "--max-epsilon", "1"), "unknown dataset 'nosuch'"),
    (("policy", "add", "p", "--dataset", "small", "--max-epsilon", "1", "--evaluator", "astrology"), "unknown evaluator"),
    (("policy", "add", "p", "--dataset", "small", "--max-epsilon", "-1"), "must be a finite number > 0"),
    (("policy", "add", "p", "--dataset", "small", "--max-epsilon", "1", "--approval", "sometimes"), "approval"),
    (("verify", "{root}/nowhere"), "nowhere"),
    (("verify", "{root}/files", "--key", "{root}/small.csv"), "small.csv"),
    (("dataset", "register", "small", "{root}/small.csv", "--unit", "uid", "--epsilon-cap", "5"), "already registered"),
    (("dataset", "register", "b", "{root}/small.csv", "--unit", "nobody", "--epsilon-cap", "5"), "'nobody' is not in"),
    (("dataset", "register", "b", "{root}/small.csv", "--unit", "[uid]", "--epsilon-cap", "5"), "'[uid]' is not in"),
    (("dataset", "register", "b", "{root}/small.csv", "--unit", "uid", "--add-row-id", "--epsilon-cap", "5"),
     "already has a column 'uid'"),
    (("dataset", "register", "b", "{root}/small.csv", "--unit", "uid", "--epsilon-cap", "5", "--sensitivity", "huge"),
     "unknown level 'huge'"),
    (("dataset", "register", "b", "{root}/small.csv", "--unit", "uid", "--epsilon-cap", "5", "--max-risk", "7"),
     "a level must be in [0, 1]"),
    (("dataset", "register", "b", "{root}/small.csv", "--unit", "uid", "--epsilon-cap", "5", "--sensitive-values", "0"),
     "must be a whole number of at least 2"),
    (("dataset", "register", "b", "{root}/small.csv", "--unit", "uid", "--epsilon-cap", "5", "--sensitive-values", "1"),
     "must be a whole number of at least 2"),
    (("dataset", "register", "b", "{root}/small.csv", "--unit", "uid", "--epsilon-cap", "5", "--sensitive-values",
      "-3", "--snapshot", "2026-11", "--series-budget", "series_cap"), "must be a whole number of at least 2"),
], ids=lambda v: " ".join(v) if isinstance(v, tuple) else None)
def test_bad_command_is_one_line(home, args, words):
    refused(home, *[a.format(root=home) for a in args], words=words)


@pytest.mark.parametrize("n", [0, 1, -3, 2.5, "2", True])
def test_a_risk_profile_no_release_could_use_is_refused_by_the_api_as_by_the_cli(home, n):
    """A registered risk profile is read by every release: n (the sensitive attribute's values) below 2
    or not whole refused every one of them; it is refused at registration, nothing sealed or recorded."""
    from dp_core import DPError
    from dprelease import admin

    before = state(home)
    blobs = sorted((home / "home" / "escrow").iterdir())
    with pytest.raises(DPError, match=r"must be a whole number of at least 2 \(a yes/no attribute: 2\), got") as err:
        admin.register_dataset(Settings.from_env(), "b", home / "small.csv", "uid", 5.0, risk_profile={"n": n})
    if type(n) is int:  # what the command line's --sensitive-values can carry
        line = refused(home, "dataset", "register", "b", home / "small.csv", "--unit", "uid", "--epsilon-cap", "5",
                       "--sensitive-values", n, words="at least 2")
        assert line == f"error: {err.value}", "the API and the CLI must say the same"
    assert state(home) == before and sorted((home / "home" / "escrow").iterdir()) == blobs


@pytest.mark.parametrize("env,words", [
    ({"DPRELEASE_ESCROW_KEY": "not-a-key"}, "from DPRELEASE_ESCROW_KEY is not a valid Fernet key"),
    ({"DPRELEASE_KEY_DIR": "{root}/no-keys"}, "no escrow key"),
    ({"DPRELEASE_KEY_DIR": "{root}/open-keys"}, "readable by other users"),
    ({"DPRELEASE_KEY_DIR": "{root}/home/escrow"}, "inside the escrow directory"),
], ids=["invalid key", "no key", "key readable by others", "key next to the blobs"])
@pytest.mark.parametrize("command", ["register", "release"])
def test_unusable_escrow_key_is_one_line(home, env, words, command):
    open_keys = home / "open-keys"
    if not open_keys.exists():
        open_keys.mkdir()
        (open_keys / "escrow.key").write_bytes((home / "home" / "keys" / "escrow.key").read_bytes())
        (open_keys / "escrow.key").chmod(0o644)
    env = {k: v.format(root=home) for k, v in env.items()}
    if command == "register":
        args = ("dataset", "register", "b", home / "small.csv", "--unit", "uid", "--epsilon-cap", "5")
    else:
        args = ("release", home / "requests" / "good.yaml", "--approve-as", "alice")
    refused(home, *args, words=words, env=env)


@pytest.mark.parametrize("threads", ["0", "two", "-1"])
def test_bad_engine_threads_setting_is_one_line_from_the_cli_and_the_api(home, threads):
    words = f"DPRELEASE_ENGINE_THREADS={threads!r} is not a positive whole number"
    refused(home, "release", home / "requests" / "good.yaml", "--approve-as", "alice",
            words=words, env={"DPRELEASE_ENGINE_THREADS": threads})
    with pytest.raises(ValueError, match=words):
        Settings.from_env({"DPRELEASE_HOME": str(home / "home"), "DPRELEASE_ENGINE_THREADS": threads})
    assert Settings.from_env({"DPRELEASE_HOME": str(home / "home"), "DPRELEASE_ENGINE_THREADS": "2"}).engine_threads == 2
    assert Settings.from_env({"DPRELEASE_HOME": str(home / "home")}).engine_threads == "auto"
    assert Settings.from_env({"DPRELEASE_HOME": str(home / "home"), "DPRELEASE_ENGINE_THREADS": "Auto"}).engine_threads == "auto"
    # every core DuckDB is given, for a machine that runs one release at a time (dp_core's default)
    assert Settings.from_env({"DPRELEASE_HOME": str(home / "home"), "DPRELEASE_ENGINE_THREADS": "all"}).engine_threads is None


def test_debug_shows_the_traceback(home):
    result = CliRunner().invoke(app, ["--debug", "budget", "nosuch"])
    assert result.exit_code != 0 and "unknown dataset" in str(result.exception)


def test_an_unexpected_error_is_one_line_that_says_it_is_a_bug():
    from dprelease.cli.errors import EXIT_BUG, describe, one_line

    message, code = describe(TypeError("unhashable type: 'numpy.ndarray'"))
    assert code == EXIT_BUG and "a bug" in message and "--debug" in message
    assert one_line("Data checks FAILED\nFAIL expect_column_values_to_not_be_null [uid]: 2") == (
        "Data checks FAILED; FAIL expect_column_values_to_not_be_null [uid]: 2")


def test_a_bugs_traceback_is_kept_in_the_home_for_the_report(tmp_path, monkeypatch):
    """A failure seen once (under load, in CI) can be reported without running it again."""
    from dprelease.cli.errors import keep_traceback

    monkeypatch.setenv("DPRELEASE_HOME", str(tmp_path / "home"))
    try:
        {}[["unhashable"]]
    except TypeError as err:
        kept = keep_traceback(err)
    assert kept.parent == tmp_path / "home" / "logs" and kept.name.startswith("bug-")
    text = kept.read_text()
    assert text.startswith("Traceback") and "test_a_bugs_traceback_is_kept" in text and "TypeError" in text


# --- data rules of the engine API -------------------------------------------------------------------


def test_absurd_epsilon_is_refused_by_the_engine_with_the_cli_message():
    import dp_core as dp

    df = pd.DataFrame({"uid": [1, 2, 3], "g": ["a", "b", "a"]})
    with pytest.raises(dp.InvalidQueryError, match="above the maximum 100"):
        dp.execute(dp.Query([dp.count()], privacy_unit="uid", epsilon=1e9, group_by=("g",)), df)
    dp.execute(dp.Query([dp.count()], privacy_unit="uid", epsilon=100.0, group_by=("g",)), df)  # no overflow


def test_duplicate_columns_in_a_frame_are_refused():
    import dp_core as dp

    df = pd.DataFrame([[1, 2, 3]], columns=["uid", "amount", "amount"])
    with pytest.raises(dp.InvalidDataError, match="'amount' twice"):
        dp.execute(dp.Query([dp.count()], privacy_unit="uid", epsilon=1.0), df)


def test_unused_nested_columns_do_not_break_registration_or_release(home, tmp_path):
    import dp_core as dp
    from dprelease import checks
    from dprelease.escrow import parse_bytes

    table = pa.table({"uid": [1, 2, 3, 4], "g": ["a", "b", "a", "b"], "x": [1.0, 2.0, 3.0, 4.0],
                      "tags": [[1, 2], [3], [], [4]], "meta": [{"k": 1}, {"k": 2}, {"k": 3}, {"k": 4}]})
    path = tmp_path / "nested.parquet"
    pq.write_table(table, path)
    frame = parse_bytes(path.read_bytes(), "parquet")
    assert checks.validate(frame, checks.default_expectations(frame, "uid")).success
    query = dp.Query([dp.sum_("x", 0, 10)], privacy_unit="uid", epsilon=1.0, group_by=("g",), public_partitions=["a", "b"])
    for data in (path, frame, table):
        assert list(dp.execute(query, data).table["g"]) == ["a", "b"]


# --- real processes: no traceback, no library noise -------------------------------------------------


def start_cli(root: Path, *args, env: dict | None = None) -> subprocess.Popen:
    """A real `dprelease` process on the home under `root` (its own temporary Prefect server)."""
    cli = Path(sys.executable).with_name("dprelease")
    full_env = {**os.environ, "DPRELEASE_HOME": str(root / "home"), "PYTHONPATH": str(ROOT), **(env or {})}
    full_env.pop("PREFECT_API_URL", None)
    return subprocess.Popen([str(cli), *map(str, args)], env=full_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_cli(root: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    process = start_cli(root, *args, env=env)
    out, err = process.communicate(timeout=PATIENCE_S)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def assert_one_clean_line(done: subprocess.CompletedProcess, words: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert lines == [lines[0]] and lines[0].startswith("error: ") and words in lines[0], done.stderr
    for noise in ("Traceback", "nanobind", "prefect", "INFO", "WARNING", "great_expectations"):
        assert noise not in done.stderr + done.stdout


def test_process_register_duplicate_columns_is_one_line(home):
    done = run_cli(home, "dataset", "register", "bad", home / "files" / "duplicate.csv", "--unit", "uid",
                   "--epsilon-cap", "1")
    assert_one_clean_line(done, "has the column 'amount' twice")


@pytest.mark.slow
def test_process_corrupted_blob_and_wrong_key_file_are_one_line_after_the_flow_starts(home):
    """Failures inside the flow (Prefect's temporary server running, DuckDB loaded): one line each,
    nothing reserved, nothing published. Dataset `fragile` has a blob of its own, damaged on purpose;
    the wrong key is a valid key file of another home. Both processes run at once."""
    from cryptography.fernet import Fernet

    for name, extra in (("fragile", "999,a,1,t0\n"), ("locked", "998,b,2,t1\n")):  # blobs of their own
        (home / f"{name}.csv").write_text(GOOD_CSV + extra)
        code, _, err = invoke("dataset", "register", name, home / f"{name}.csv", "--unit", "uid", "--epsilon-cap", "5")
        assert code == 0, err
        (home / f"{name}.yaml").write_text(f"dataset: {name}\nsql: {SQL.replace('small', name)}\nepsilon: 1\n")
    from dprelease.settings import Settings
    from dprelease.store import Store

    settings = Settings.from_env({"DPRELEASE_HOME": str(home / "home")})
    Path(Store(settings.store_url).get_dataset("fragile").blob_path).write_bytes(b"garbage")
    other_keys = home / "other-keys"
    other_keys.mkdir(mode=0o700)
    (other_keys / "escrow.key").write_bytes(Fernet.generate_key())
    (other_keys / "escrow.key").chmod(0o600)
    before = state(home)
    # no decision is asked for: both fail inside the flow, at its data checks, before any pause
    runs = [start_cli(home, "release", home / "fragile.yaml"),
            start_cli(home, "release", home / "locked.yaml", env={"DPRELEASE_KEY_DIR": str(other_keys)})]
    for process in runs:
        out, err = process.communicate(timeout=PATIENCE_S)
        assert_one_clean_line(subprocess.CompletedProcess(process.args, process.returncode, out, err), "cannot decrypt")
    assert state(home) == before


# --- safe outputs -----------------------------------------------------------------------------------


def test_results_csv_neutralises_formula_cells_and_keeps_numbers(tmp_path):
    """A partition key a spreadsheet would execute gets a leading quote in results.csv (OWASP);
    numbers, negative ones included, stay numbers; results.json keeps the exact key."""
    import csv
    import json

    import dp_core as dp
    from dprelease.reporting.data_files import write_data_files

    keys = ['=HYPERLINK("http://x")', "+1", "-2", "@SUM(A1)", "\tTab", "\rCR", "plain", "a-b"]
    df = pd.DataFrame({"uid": range(len(keys) * 3), "k": keys * 3, "x": [-5.0] * (len(keys) * 3)})
    query = dp.Query([dp.sum_("x", -10, 0, name="total")], privacy_unit="uid", epsilon=1.0, group_by=("k",),
                     public_partitions=keys)
    result = dp.execute(query, df)
    write_data_files(result, tmp_path)
    with (tmp_path / "results.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    released = {row["k"] for row in rows}
    assert released == {"'" + k if k[0] in "=+-@\t\r" else k for k in keys}
    for row in rows:
        float(row["total"])  # a number, never quoted
    assert any(float(row["total"]) < 0 for row in rows), "negative numbers stay numbers"
    text = (tmp_path / "results.json").read_text()
    json.loads(text)
    assert '"=HYPERLINK(\\"http://x\\")"' in text and "'=HYPERLINK" not in text  # exact, JSON-escaped


def _rows_with_empty_units(where: int, count: int = 60) -> list[tuple]:
    """(uid, g, x) rows with the unit left empty in row `where` (0-based) and in the last row too."""
    return [(None if i in (where, count - 1) else i, "ab"[i % 2], i % 7) for i in range(count)]


@pytest.mark.parametrize("where", [0, 31, 59])
@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".parquet"])
def test_data_with_rows_of_no_one_is_refused_at_registration_not_at_every_release(home, tmp_path, where, suffix):
    """A unit cell left empty registered fine and then failed every release at its first data check
    (a non-null unit); registration now refuses it, naming how many rows and the first, with nothing
    sealed or recorded, by the CLI and the API in the same words."""
    from dprelease import admin
    from dprelease.escrow import EscrowError

    rows = _rows_with_empty_units(where)
    path = tmp_path / f"people{suffix}"
    if suffix == ".parquet":
        pq.write_table(pa.table({"uid": [r[0] for r in rows], "g": [r[1] for r in rows], "x": [r[2] for r in rows]}),
                       path)
    else:
        text = "uid,g,x\n" + "".join(f"{'' if u is None else u},{g},{x}\n" for u, g, x in rows)
        path.write_bytes(gzip.compress(text.encode()) if suffix == ".csv.gz" else text.encode())
    blobs = sorted((home / "home" / "escrow").iterdir())
    empty = sum(u is None for u, _, _ in rows)
    words = (f"the privacy unit column 'uid' is empty in {empty} row(s) (the first: data row {where + 1}, line "
             f"{where + 2} of a CSV)")
    line = refused(home, "dataset", "register", "people", path, "--unit", "uid", "--epsilon-cap", "1", words=words)
    with pytest.raises(EscrowError) as api:
        admin.register_dataset(Settings.from_env(), "people", path, "uid", 1.0)
    assert line == f"error: {api.value}", "the API and the CLI must say the same"
    assert sorted((home / "home" / "escrow").iterdir()) == blobs, "a refused registration left a blob"
