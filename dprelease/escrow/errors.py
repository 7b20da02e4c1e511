"""The escrow's error."""

from __future__ import annotations


class EscrowError(Exception):
    """An escrow operation that cannot proceed; the message names the problem and the fix."""
