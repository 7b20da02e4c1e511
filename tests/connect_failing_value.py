"""A DP statement that fails on a value of the data (a malformed record of its CSV input, which Spark
quotes: a query's own expressions no longer fail on a value), run as a Spark Connect client in the
session the platform starts (DPRELEASE_SPARK_MASTER=sc://...), in a process of its own
(tests/test_spark_cluster.py): `python connect_failing_value.py URL SECRET`. Prints `refused: <the
message>` and exits 2."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pandas as pd

from dp_core import DPError
from dp_core.sql import Table, run_sql
from dprelease.external import spark_session
from dprelease.settings import Settings


def main(url: str, secret: str) -> int:
    spark = spark_session(Settings.from_env({"DPRELEASE_SPARK_MASTER": url}))
    with tempfile.TemporaryDirectory(prefix="connect-failing-") as folder:  # the server reads it: the same machine
        lake = Path(folder) / "people.csv"
        pd.DataFrame({"uid": range(30), "code": ["7"] * 30}).to_csv(lake, index=False)
        with lake.open("a") as appended:
            appended.write(f"30,{secret},{secret}\n")  # a field too many: Spark's parser quotes the record
        try:
            run_sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6, privacy_unit_column = uid) "
                    "COUNT(*) AS n FROM people WHERE CAST(code AS INTEGER) > 0", {"people": Table(str(lake), "uid")},
                    backend="spark", spark=spark)
        except DPError as err:
            print(f"refused: {err}")
            return 2
        finally:
            spark.stop()
    print("released")
    return 0

if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
