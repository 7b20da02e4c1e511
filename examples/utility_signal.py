"""Utility signaling on Adult (run: .venv/bin/python examples/utility_signal.py).

The analyst asks for counts and average working hours by education and sex, then wants to know
whether the DP noise changes the rank agreement between group size and working hours. The
controller enables that evaluator for the analyst in a policy; the three approvals are given
automatically here (in real use: at the prompt, in the Prefect UI, or with `dprelease approve`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from rich.console import Console

DATA = Path(__file__).parent / "data" / "adult.csv.gz"


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="dprelease-utility-"))
    os.environ["DPRELEASE_HOME"] = str(home)
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from dprelease import admin
    from dprelease.cli.app import run_utility_interactively
    from dprelease.requests import parse_request
    from dprelease.settings import Settings
    from dprelease.store import Store

    console = Console()
    settings = Settings.from_env()
    admin.init(settings)
    # a tolerable risk of 0.4: epsilon 1 on this histogram stays within it (risk about 0.31)
    admin.register_dataset(settings, "adult", DATA, "person_id", epsilon_cap=5, add_row_id=True,
                           risk_profile={"max_risk": 0.4})
    from dprelease import decisions

    key = settings.key_dir / "controllers" / "example.pem"
    if not key.exists():
        decisions.create_controller(settings, "example", key)
    Store(settings.store_url).add_policy("ana", "adult", analyst="ana", max_epsilon_per_release=1.0,
                                        evaluators=["spearman_rank"])
    request = parse_request({
        "dataset": "adult", "title": "Group size and working hours", "requested_by": "ana", "epsilon": 1.0,
        "sql": "SELECT WITH ANONYMIZATION education, sex, ANON_COUNT(*, 1) AS people, "
               "ANON_AVG(hours_per_week, 1, 99) AS hours FROM adult GROUP BY education, sex",
    })
    result = run_utility_interactively(settings, request, "spearman_rank", {"column": "people", "other": "hours"},
                                       timeout=600, no_terminal_reviewer="example",
                                       controller_key=key)
    signal = json.loads((Path(result["directory"]) / "utility.json").read_text())
    console.print(f"\nRank agreement (Spearman) between group size and hours: on the DP output {signal['f_dp']}, "
                  f"without noise {signal['f_raw']}. Published: {result['directory']}/index.html")


if __name__ == "__main__":
    main()
