"""The store's errors: what cannot proceed, with a message that names the problem and the fix."""

from __future__ import annotations


class StoreError(Exception):
    """A store operation that cannot proceed; the message names the problem and the fix."""


class BudgetExceeded(StoreError):
    """A reservation that would take a dataset's committed plus reserved budget above its cap."""

    @classmethod
    def over(cls, whose: str, param: str, cap: float, spent: float, reserved: float, asked: float) -> BudgetExceeded:
        """The refusal, with the numbers and only what a controller can do: a cap is fixed when the data
        is registered (it is all the data may ever spend), so ask for at most what remains, or wait for
        the releases holding a reservation to end (refunded unless published)."""
        remaining = max(0.0, cap - spent - reserved)
        wait = f", or wait for the pending releases holding {reserved:g} to end" if reserved > 0 else ""
        return cls(f"budget exceeded for {whose}: {param} cap {cap:g}, committed {spent:g}, reserved {reserved:g}, "
                   f"requested {asked:g} (remaining {remaining:g}); ask for at most {remaining:g}{wait} (a cap is "
                   "all the data may ever spend: it cannot be raised)")
