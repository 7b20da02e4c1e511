"""dprelease: the release platform around the DP engine (`dp_core`): the store and budget ledger,
the escrow, requests, reporting; and, as subpackages, the Prefect tasks and flows and the command
line (dprelease.tasks, dprelease.flows, dprelease.cli). In a checkout those three live at the
repository's top level (flows/, tasks/, cli/); checkout_layout maps them here (the wheel has them
inside this package)."""

from dprelease import checkout_layout

checkout_layout.install()
