"""dprelease: the release platform around the DP engine (`dp_core`). So far: charts for the
controller (PRI ranges, noise against risk)."""
