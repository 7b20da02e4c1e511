"""The line a release command ends with says what happened, with the id and folder whole."""

from dprelease.cli.outcome_words import outcome_line


def test_a_published_release_names_its_folder_and_its_utility_signal():
    line = outcome_line({"release_id": "r-1", "status": "published", "directory": "/srv/pub/r-1"})
    assert line == "Release r-1 published (signed): /srv/pub/r-1"
    withheld = outcome_line({"release_id": "r-1", "status": "published", "directory": "/p", "utility": "withheld"})
    assert withheld.endswith("; its utility signal withheld")


def test_a_rejected_release_says_nothing_was_published_and_the_budget_came_back():
    line = outcome_line({"release_id": "r-2", "status": "rejected", "stopped_at": 1})
    assert line == "Release r-2 rejected: nothing was published and its budget was refunded"
    assert "{" not in line
