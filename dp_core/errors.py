"""One exception hierarchy for the engine: every message names the input at fault and the fix.

The platform layers add their own subclasses; callers catch `DPError` to catch them all.
"""

from __future__ import annotations


class DPError(ValueError):
    """Base class: a request the engine refuses. Nothing was released and no budget was spent."""


class InvalidQueryError(DPError):
    """The query itself is malformed (bad epsilon, delta, bounds, aggregate or option)."""


class InvalidDataError(DPError):
    """The data does not fit the query (missing column, null unit id, NaN/inf, empty input)."""


class UnsupportedError(DPError):
    """A valid request that this engine version cannot compute; the message says what would work."""
