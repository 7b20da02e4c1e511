"""The store's errors: what cannot proceed, with a message that names the problem and the fix."""

from __future__ import annotations


class StoreError(Exception):
    """A store operation that cannot proceed; the message names the problem and the fix."""


class BudgetExceeded(StoreError):
    """A reservation that would take a dataset's committed plus reserved budget above its cap."""
