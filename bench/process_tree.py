"""Memory of a whole process tree (a command and every process it started: Prefect's server,
Spark's JVM), read from /proc: what the benchmarks report as peak memory."""

from __future__ import annotations

import os

PAGE = os.sysconf("SC_PAGE_SIZE")


def _processes() -> tuple[dict[int, list[int]], dict[int, int]]:
    """Every process now: parent PID -> its children's PIDs, and PID -> resident bytes."""
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
    return children, rss


def _tree(pid: int, children: dict[int, list[int]], rss: dict[int, int]) -> int:
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack += children.get(p, [])
    return total


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants now."""
    return _tree(pid, *_processes())


def children_rss(pid: int) -> list[int]:
    """Resident bytes of each child of `pid` with its own descendants, `pid` itself left out: a
    Spark worker daemon's executors, each a JVM the worker started (none: an empty list)."""
    children, rss = _processes()
    return [_tree(child, children, rss) for child in children.get(pid, [])]
