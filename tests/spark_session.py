"""The test suite's local Spark session (tests/conftest.py `spark` fixture)."""

from __future__ import annotations

import os
import shutil

import pytest

#: the options of every JVM the tests start, all short-lived on 2 shared cores: C1 only and one GC
#: thread. A local[1] session, a small query and a failing one: 14.6 CPU-s, 7.9 with these; the
#: CPU-seconds of test_spark_logs.py 96 -> 57, of test_spark_cluster.py (executors too) 141 -> 72,
#: of test_spark_backend.py and test_spark_platform.py (the suite's session) 143 -> 80 (load 4-13)
QUICK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: where Spark's scripts and launcher read a JVM's options: a driver's (spark-submit, pyspark's
#: gateway), the launcher's own JVM, a standalone cluster's daemons
JVM_OPTIONS_VARIABLES = ("SPARK_SUBMIT_OPTS", "SPARK_LAUNCHER_OPTS", "SPARK_DAEMON_JAVA_OPTS")


def quick_jvms() -> None:
    """Every Spark JVM this process or its children start gets QUICK_JVM_OPTIONS, unless the
    environment sets its own (nothing they print or compute changes, only how fast they start)."""
    for variable in JVM_OPTIONS_VARIABLES:
        os.environ.setdefault(variable, QUICK_JVM_OPTIONS)


def executor_conf() -> dict[str, str]:
    """The conf that gives a cluster's executors the drivers' options (SPARK_SUBMIT_OPTS): their
    worker starts them from the application's conf, not from an environment variable."""
    options = os.environ.get("SPARK_SUBMIT_OPTS", "")
    return {"spark.executor.extraJavaOptions": options} if options else {}


def local_spark_session():
    """A local[2] SparkSession tuned for small test data, or a skip saying what is missing."""
    if shutil.which("java") is None:
        pytest.skip("Spark tests need a Java runtime (java not on PATH; CI installs openjdk-17-jre-headless)")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        pytest.skip("Spark tests need pyspark: pip install '.[spark]'")
    session = (
        SparkSession.builder.master("local[2]").appName("dprelease-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session
