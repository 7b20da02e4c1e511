"""Memory of a whole process tree (a command and every process it started: Prefect's server,
Spark's JVM), read from /proc: what the benchmarks report as peak memory."""

from __future__ import annotations

import os

PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants now."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack += children.get(p, [])
    return total
