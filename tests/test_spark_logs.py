"""No value of the data in Spark's own logs (dprelease/spark_logs.py): a release on Spark that
fails on a value (a malformed record of its CSV lake, which Spark's executor quotes: a query's own
expressions no longer fail on a value, tests/test_spark_value_errors.py) is refused in one line that
never quotes it, and nothing Spark prints by itself quotes it either (the driver JVM's log4j2
Executor and TaskSetManager lines, pyspark's query-context logger), in a real process started as
a user starts it: the platform's Python API (the release flow) and the `dprelease` command, each
starting its own local Spark driver. Spark Connect: tests/test_spark_cluster.py (its server).

In the Spark group (pyproject: --dist loadgroup): the two processes' JVMs run on the worker that
runs the Spark tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from patience import PATIENCE_S
from test_bad_input import assert_one_clean_line, state

pytestmark = [pytest.mark.xdist_group("spark"), pytest.mark.runs_first]

ROOT = Path(__file__).resolve().parents[1]
#: the value every row of `code` holds: distinctive, so that any copy of it in an output is found
SECRET = "Zq-5521-vault"
#: ran past the value until 2026-11-30 (CAST_INVALID_INPUT under ANSI mode); now its cast is NULL there,
#: and the release fails on the lake's malformed record instead (lake_home)
SQL = ("SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 1) AS n FROM lake WHERE CAST(code AS INTEGER) > 0 "
       "GROUP BY dept")


@pytest.fixture(scope="module")
def lake_home(spark, tmp_path_factory):
    """A home under `root`/home with `lake` registered by reference (a CSV file), then given a
    malformed record that holds SECRET (a field too many: Spark, reading FAILFAST, fails on it and its
    executor's log quotes the record), a controller, and a Prefect API for the processes (PREFECT_API_URL)."""
    from prefect.settings import PREFECT_API_URL
    from prefect_harness import prefect_harness

    from dprelease import admin, decisions, external
    from dprelease.settings import Settings

    root = tmp_path_factory.mktemp("spark-logs")
    settings = Settings.from_env({"DPRELEASE_HOME": str(root / "home")})
    admin.init(settings)
    lake = root / "lake.csv"
    pd.DataFrame({"uid": range(300), "dept": ["a", "b", "c"] * 100, "code": ["x"] * 300}).to_csv(lake, index=False)
    external.register_external(settings, "lake", str(lake), "uid", epsilon_cap=10, spark=spark)
    with lake.open("a") as appended:  # after its registration, which read it whole
        appended.write(f"300,a,{SECRET},{SECRET}\n")
    decisions.create_controller(settings, "alice", root / "alice.pem")
    (root / "request.yaml").write_text(f"dataset: lake\nsql: {SQL}\nepsilon: 1\nbackend: spark\n")
    with prefect_harness():
        yield root, str(PREFECT_API_URL.value())


def start(root: Path, api_url: str, *command: str) -> subprocess.Popen:
    """A process on the home under `root` that starts its own local Spark driver (local[1])."""
    env = {**os.environ, "DPRELEASE_HOME": str(root / "home"), "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
           "PREFECT_API_URL": api_url, "DPRELEASE_SPARK_MASTER": "local[1]"}
    return subprocess.Popen(list(command), env=env, cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_release_failing_on_a_value_prints_it_nowhere_from_the_api_or_the_command(lake_home):
    """Both processes at once (a JVM each): the value is in neither's stdout or stderr; the command
    says one line, `error: ...`, exit 2; the API raises the same refusal; nothing spent or published."""
    root, api_url = lake_home
    before = state(root)
    api = start(root, api_url, sys.executable, str(ROOT / "tests" / "spark_logs_release.py"), SQL)
    cli = start(root, api_url, str(Path(sys.executable).with_name("dprelease")), "release", "request.yaml")
    api_out, api_err = api.communicate(timeout=PATIENCE_S)
    cli_out, cli_err = cli.communicate(timeout=PATIENCE_S)
    for out in (api_out, api_err, cli_out, cli_err):
        assert SECRET not in out, out
    refusal = f"cannot read {root / 'lake.csv'} with Spark: a malformed record (a row whose fields do not match the header)"
    assert api.returncode == 2 and f"refused: {refusal}" in api_out, api_out + api_err
    assert_one_clean_line(subprocess.CompletedProcess(cli.args, cli.returncode, cli_out, cli_err), refusal)
    assert state(root) == before


def test_a_jvm_that_cannot_start_is_one_line_that_says_why(tmp_path):
    """The driver JVM's stderr is not the terminal's: when it does not start (here JAVA_HOME names
    no Java), what the launcher said is in the one line, and nothing else is printed."""
    from dprelease import admin
    from dprelease.settings import Settings

    admin.init(Settings.from_env({"DPRELEASE_HOME": str(tmp_path / "home")}))
    folder = tmp_path / "lake"
    folder.mkdir()
    pd.DataFrame({"uid": [1, 2]}).to_parquet(folder / "part-0.parquet", index=False)
    done = subprocess.run([str(Path(sys.executable).with_name("dprelease")), "dataset", "register", "lake",
                           "--external", str(folder), "--unit", "uid", "--epsilon-cap", "1"],
                          env={**os.environ, "DPRELEASE_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT),
                               "JAVA_HOME": str(tmp_path / "no-java"), "DPRELEASE_SPARK_MASTER": "local[1]"},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=PATIENCE_S)
    assert_one_clean_line(done, "cannot start Spark (master local[1]): [JAVA_GATEWAY_EXITED]")
    assert f"{tmp_path / 'no-java'}/bin/java" in done.stderr  # the launcher's words: that Java is not there


@pytest.mark.parametrize(("written", "reason"), [
    (["WARNING: Using incubator modules: jdk.incubator.vector",
      "26/11/29 16:58:10 WARN StandaloneAppClient$ClientEndpoint: Failed to connect to master 127.0.0.1:7",
      "26/11/29 16:59:10 ERROR StandaloneSchedulerBackend: Application has been killed. Reason: All masters are "
      "unresponsive! Giving up.", "\tat org.apache.spark.SparkContext.assertNotStopped(SparkContext.scala:128)"],
     "Application has been killed. Reason: All masters are unresponsive! Giving up."),
    (["spark-class: line 71: /opt/jdk/bin/java: No such file or directory", "spark-class: line 97: CMD: bad array "
      "subscript"], "spark-class: line 71: /opt/jdk/bin/java: No such file or directory"),
    (["JAVA_HOME is not set"], "JAVA_HOME is not set"),
    (["", "something the JVM said last", ""], "something the JVM said last"),
    ([], None),
], ids=["a master that never answered", "no java where JAVA_HOME says", "no java at all", "other words", "nothing"])
def test_a_jvm_s_reason_is_its_log_s_last_error_else_its_first_failure_else_its_last_line(written, reason):
    """What the JVM wrote on the pipe that is its stderr (a real pipe, written and closed as a JVM
    that exited would) gives the reason a session that did not start is refused with."""
    from dprelease.spark_logs import JvmStderr

    stderr = JvmStderr()
    with open(os.dup(stderr.write_end), "w") as jvm:  # the JVM's copy of the write end
        jvm.write("".join(f"{line}\n" for line in written))
    stderr.launched()
    assert stderr.reason(exited=True) == reason


def test_spark_s_logs_are_on_only_when_asked_and_the_command_s_debug_asks(monkeypatch):
    """DPRELEASE_SPARK_LOGS is on or off (default off), anything else one line; `dprelease --debug`
    turns it on for the command only (cli.quiet), unless the user set it."""
    from dprelease.cli.quiet import quiet_libraries
    from dprelease.settings import Settings

    monkeypatch.delenv("DPRELEASE_SPARK_LOGS", raising=False)
    assert [Settings.from_env({"DPRELEASE_SPARK_LOGS": v}).spark_logs for v in ("on", "ON ", "off", "")] == [
        True, True, False, False]
    with pytest.raises(ValueError) as caught:
        Settings.from_env({"DPRELEASE_SPARK_LOGS": "yes"})
    assert str(caught.value) == ("DPRELEASE_SPARK_LOGS='yes' is neither on nor off: set it to on (Spark's own logs, "
                                 "which can quote the data) or off, or unset it (default off)")
    for debug, logs in ((True, True), (False, False)):
        with quiet_libraries(debug):
            assert Settings.from_env().spark_logs is logs
        assert "DPRELEASE_SPARK_LOGS" not in os.environ
    monkeypatch.setenv("DPRELEASE_SPARK_LOGS", "off")
    with quiet_libraries(True):
        assert Settings.from_env().spark_logs is False


def test_the_user_s_own_session_keeps_its_logging(spark):
    """The process's active session (the suite's, at ERROR) is the one used, and its log level stays."""
    from dprelease import external
    from dprelease.settings import Settings

    root = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getRootLogger()
    assert external.spark_session(Settings.from_env({"DPRELEASE_SPARK_MASTER": "local[1]"})) is spark
    assert str(root.getLevel()) == "ERROR"
