"""A dataset's privacy budget as a person reads it (the Prefect UI's budget artifact, `dprelease
budget`): one labelled row per budget parameter, epsilon and delta, each amount written by
`dp_core.display.budget` (four significant digits: `0.4375`, not `0.43745083326922696`)."""

from __future__ import annotations

from dp_core import display

#: the budget's parameters, one row each
PARAMETERS = ("epsilon", "delta")
#: the columns of a row: the cap and what is committed, reserved and left of it
AMOUNTS = ("cap", "committed", "reserved", "remaining")


def budget_rows(budget: dict) -> list[dict[str, str]]:
    """One row per parameter of `Store.budget(dataset)`: its name under `budget`, then each amount."""
    return [{"budget": param, **{amount: display.budget(budget[f"{param}_{amount}"]) for amount in AMOUNTS}}
            for param in PARAMETERS]
