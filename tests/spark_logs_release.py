"""A release of the external dataset `lake` through the platform's Python API (the release flow,
on the Prefect API of PREFECT_API_URL), as tests/test_spark_logs.py runs it in a process of its own:
`python spark_logs_release.py SQL`. A refused release prints `refused: <the message>` and exits 2."""

from __future__ import annotations

import sys

from dp_core import DPError
from dprelease.flows.release import release_flow


def main(sql: str) -> int:
    try:
        release_flow(dataset="lake", sql=sql, epsilon=1.0, backend="spark", approval_timeout=60)
    except DPError as err:
        print(f"refused: {err}")
        return 2
    print("released")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
