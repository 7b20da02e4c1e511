"""One writer at a time for a release's publication: its run moving the signed staging folder into
place, or a recovery finishing what the run left (the command's stop, the run's watchdog, a sweep,
`dprelease recover`), each a thread or process of the host whose publication directory it is.

Without it two finishers of one committed release could each find the staging folder not yet
moved, and the second remove, or set aside as the old version, the folder the first had just put in
place: a release marked published with no published folder. The lock is an exclusive `flock` on a
file of the release's archive folder (private, never published; beside its decision's lock): the
kernel drops it when its holder dies, so a run killed while publishing never blocks the recovery
that finishes it, and two opens in one process (a command's stop and its run's thread) exclude
each other too.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager

from .settings import Settings

LOCK_FILE = "publication.lock"


@contextmanager
def held(settings: Settings, release_id: str) -> Iterator[None]:
    """Hold the publication lock of `release_id` (waits while another writer holds it)."""
    path = settings.archive_dir / release_id / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
