"""The store of a URL, opened once per process on PostgreSQL: a release opens its platform in every
step, hook and command (Platform.open, some twenty times a release), and there a new engine's first
connection and create_all's catalog queries cost 150-200 ms each at load 15 (2026-11-30), against
2 ms for a query on an open store. One Store per URL keeps one pool, its tables checked once.

At most KEPT URLs are kept (the oldest one's connections are closed when another comes): a command
or a run uses one, a test process many schemas, each pool holding connections of the server's
limited number. SQLite stores are still opened afresh (13 ms): a test's home, its file with it, is
removed and made again under the same path, which a store kept open would not see. A child forked
without exec opens its own (a pool's connections are not shared across processes).
"""

from __future__ import annotations

import os
import threading

from sqlalchemy.engine import make_url

from .ledger import Store

KEPT = 4
_open: dict[str, Store] = {}  # PostgreSQL store URL -> this process's Store, its tables created; oldest first
_lock = threading.Lock()

os.register_at_fork(after_in_child=_open.clear)


def opened_store(url: str) -> Store:
    """The Store of `url` with its tables created: this process's one Store for a PostgreSQL URL,
    a new one for SQLite."""
    if make_url(url).get_backend_name() == "sqlite":
        store = Store(url)
        store.create_all()
        return store
    with _lock:
        if url not in _open:
            store = Store(url)
            store.create_all()
            _open[url] = store
            while len(_open) > KEPT:
                _open.pop(next(iter(_open))).close()
        return _open[url]
