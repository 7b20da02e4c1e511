"""A pytest plugin that makes `--dist loadgroup` keep each `xdist_group` on one worker again.

pytest-xdist (3.8) marks a test of a group by appending "@<group>" to its `item._nodeid`; since
pytest 9.2 a node's id is `item._id` (a structured NodeId), so that write changes nothing, every
test kept its plain id and the groups were spread over all workers: each worker then started its
own SparkSession, Spark cluster, wheel venv and two-host deployment (module fixtures set up two or
three times). This plugin appends the suffix where xdist's did not take, on the workers only, in
xdist's own form (sorted group names joined by "_"), so xdist's scheduler groups by it as designed.
"""

from __future__ import annotations

import pytest


def group_name(item: pytest.Item) -> str | None:
    """The item's xdist group as pytest-xdist names it, or None: the names of its `xdist_group`
    marks (first argument, or `name=`, else "default"), sorted and joined by "_"."""
    names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
             for mark in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) if names else None


@pytest.hookimpl(trylast=True)  # after xdist's own attempt: a suffix it managed to add is kept as it is
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set on an xdist worker under --dist loadgroup only
        return
    for item in items:
        group = group_name(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue
        from _pytest.nodeid import NodeId  # pytest >= 9.2, the only case that gets here

        item._id = NodeId.parse(f"{item.nodeid}@{group}")
        if not item.nodeid.endswith(f"@{group}"):
            raise pytest.UsageError(f"tests/xdist_groups.py cannot name {item.nodeid}'s xdist group with this "
                                    f"pytest ({pytest.__version__}): update it to how this pytest sets a node's id")
