"""The test suite's local Spark session (tests/conftest.py `spark` fixture)."""

from __future__ import annotations

import shutil

import pytest


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
