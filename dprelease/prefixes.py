"""Ids a person pastes (release ids, inbox request ids): the whole id, or any prefix that only one id
starts with; an ambiguous prefix is refused in one line, never guessed."""

from __future__ import annotations

from collections.abc import Iterable

from dp_core import DPError


class AmbiguousPrefix(DPError):
    """A prefix that more than one id starts with: which one is meant cannot be known."""


def by_prefix(text: str, ids: Iterable[str], what: str) -> str | None:
    """The one id that is `text` or starts with it, None when none does; AmbiguousPrefix when
    several do (`what` names them in the message: "releases", "inbox requests")."""
    ids = list(dict.fromkeys(ids))
    if text in ids:
        return text
    matches = sorted(i for i in ids if text and i.startswith(text))
    if len(matches) > 1:
        shown = ", ".join(matches[:3]) + (", ..." if len(matches) > 3 else "")
        raise AmbiguousPrefix(f"{text!r} is the start of {len(matches)} {what} ({shown}): give more of the id")
    return matches[0] if matches else None
