"""How many DuckDB threads a release's scan takes under DPRELEASE_ENGINE_THREADS=auto: the cores
this process may use (its affinity mask, within a container's CPU quota) that the last minute's
load leaves idle, from 1 to AUTO_THREADS_MAX (docs/engine.md, "Threads")."""

from __future__ import annotations

import os
from pathlib import Path

AUTO_THREADS_MAX = 4  # bounds the memory a large idle machine would give one release (a hash table per thread)


def idle_cores(cores: int, load: float | None) -> int:
    """Threads for a scan that should not compete with other work: the cores not busy on average
    over the last minute (`load`, the run queue the kernel averages), at least 1, at most
    AUTO_THREADS_MAX; one where the load is unknown (the default before `auto`)."""
    if load is None:
        return 1
    return max(1, min(AUTO_THREADS_MAX, cores, int(cores - load + 0.5)))


def usable_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may run on: its affinity mask where the OS has one (Linux), else
    every core of the machine (macOS and Windows have no os.sched_getaffinity), capped by a
    container's CPU quota, which the mask does not show (`cpu_quota_cores`)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    quota = cpu_quota_cores(cgroup_root)
    return cores if quota is None else max(1, min(cores, quota))


def cpu_quota_cores(cgroup_root: Path) -> int | None:
    """The whole cores a cgroup CPU quota allows (rounded up), or None without a quota: cgroup v2
    `cpu.max` ("<quota> <period>" or "max <period>"), else v1 `cpu/cpu.cfs_quota_us` over
    `cpu.cfs_period_us` (a quota of -1: none). A container limited to 1.5 CPUs gets 2."""
    try:
        quota, period = (cgroup_root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
    except (OSError, ValueError):
        try:
            quota = (cgroup_root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup_root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return -(-quota_us // period_us)


def load_average() -> float | None:
    """The 1-minute load average, or None where the OS gives none (Windows has no os.getloadavg;
    it raises OSError where the load is unobtainable)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
