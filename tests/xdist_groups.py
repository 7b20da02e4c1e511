"""A pytest plugin for `--dist loadgroup`: each `xdist_group` runs on one worker again, and so does
each module whose tests share a module-scoped fixture.

pytest-xdist (3.8) marks a test of a group by appending "@<group>" to its `item._nodeid`; since
pytest 9.2 a node's id is `item._id` (a structured NodeId), so that write changed nothing, every
test kept its plain id and the groups were spread over all workers (pytest-dev/pytest-xdist#1386, a fix
proposed in #1388; drop this part once an xdist release has it): each worker then started its
own SparkSession, Spark cluster, wheel venv and two-host deployment. And under loadgroup a test
outside any group is a unit of its own, so a module's tests went to whichever worker was free and
its module fixture (a Prefect harness, a console server, a browser) was set up once per worker that
ran one of them (twice or three times for a dozen modules). This plugin appends the suffix on the
workers, in xdist's own form (sorted group names joined by "_"; a module's group is its file's
name), so xdist's scheduler keeps each group together, as designed.
"""

from __future__ import annotations

import pytest

MODULE_SCOPES = ("module", "package")  # fixtures set up once per module (or package) in one process


def group_name(item: pytest.Item) -> str | None:
    """The item's xdist group: the names of its `xdist_group` marks (first argument, or `name=`, else
    "default") sorted and joined by "_", as pytest-xdist names it; else, when it uses a module- or
    package-scoped fixture, its module's file name (`test_series.py`); else None."""
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    if names:
        return "_".join(sorted(names))
    info = getattr(item, "_fixtureinfo", None)  # the fixtures the test requests, with their definitions
    if info is not None and any(defs and defs[-1].scope in MODULE_SCOPES for defs in info.name2fixturedefs.values()):
        return item.path.name
    return None


def _renamed(item: pytest.Item, nodeid: str) -> None:
    """Give `item` this node id, where this pytest keeps it."""
    if hasattr(item, "_id"):  # pytest >= 9.2: a structured NodeId
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)
    else:
        item._nodeid = nodeid


@pytest.hookimpl(trylast=True)  # after xdist's own attempt: a suffix it managed to add is kept as it is
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set on an xdist worker under --dist loadgroup only
        return
    for item in items:
        group = group_name(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue
        _renamed(item, f"{item.nodeid}@{group}")
        if not item.nodeid.endswith(f"@{group}"):
            raise pytest.UsageError(f"tests/xdist_groups.py cannot name {item.nodeid}'s xdist group with this "
                                    f"pytest ({pytest.__version__}): update it to how this pytest sets a node's id")
