"""A file moved aside while a block runs, and put back after: what reads it fails meanwhile (a test
shows that a refusal needed no data, no key)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def moved_away(path: Path) -> Iterator[None]:
    """`path` renamed to `<name>.away` inside the block, back to its name after it (even on error)."""
    away = path.with_name(path.name + ".away")
    path.rename(away)
    try:
        yield
    finally:
        away.rename(path)
