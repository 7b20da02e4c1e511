"""A rejection is its own final state (Completed, named Rejected), read in one place: dprelease.flows.outcomes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prefect.states import Cancelled, Completed, Failed

from dprelease.flows.outcomes import REJECTED, is_rejected, outcome, rejected

ROOT = Path(__file__).resolve().parents[1]


def test_a_rejection_is_neither_a_publication_nor_a_failure_nor_a_cancel():
    state = rejected("rejected by alice: no", {"release_id": "r1", "status": "rejected"})
    assert state.name == REJECTED and state.is_final() and not (state.is_failed() or state.is_cancelled())
    assert state.result() == {"release_id": "r1", "status": "rejected"}  # no exception: no traceback in its logs
    assert is_rejected(state) and outcome(state) == {"release_id": "r1", "status": "rejected"}
    for other in (Cancelled(message="cancelled in the UI"), Completed(data={}), Failed(message="x"), None):
        assert not is_rejected(other)
    with pytest.raises(BaseException, match="cancelled in the UI"):  # a cancel is not an outcome
        outcome(Cancelled(message="cancelled in the UI"))
    assert outcome(Completed(data={"status": "published"})) == {"status": "published"}


def test_every_place_that_reads_an_outcome_asks_the_one_helper():
    """No module names the Rejected state itself (a scattered check would drift from the helper)."""
    scattered = []
    for path in [*ROOT.glob("flows/*.py"), *ROOT.glob("cli/*.py"), *ROOT.glob("tasks/*.py"), *ROOT.glob("dprelease/**/*.py")]:
        if path.name == "outcomes.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""name\s*==\s*["']Rejected|name\s*=\s*["']Rejected""", line):
                scattered.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not scattered, scattered


def test_a_final_state_without_its_value_falls_back_to_the_stored_outcome():
    """The API's copy of a final state has no value (results are kept in memory): the outcome is read
    from the store; without a store to ask, Prefect's error stands. A real lost answer:
    test_operations.py::test_a_lost_answer_to_the_final_state_still_reports_the_published_release."""
    from prefect.exceptions import MissingResult

    stored = {"release_id": "r2", "status": "published", "directory": "/p/r2"}
    assert outcome(Completed(), stored=lambda: stored) == stored
    assert outcome(rejected("rejected by alice: no", None), stored=lambda: {"status": "rejected"}) == {
        "status": "rejected"}
    with pytest.raises(MissingResult):
        outcome(Completed())
    assert outcome(Completed(data={"status": "published"}), stored=lambda: stored) == {"status": "published"}
    with pytest.raises(BaseException, match="boom"):  # a failure is never replaced by the store's view
        outcome(Failed(message="boom"), stored=lambda: stored)
