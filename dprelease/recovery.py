"""No reservation outlives its run: leases on running releases, and the recovery of dead ones.

A run holds a *lease* on its release (the store's `leases` table: host, pid and the process's start
time, and a heartbeat renewed every few seconds by a thread of the owning process). A release is
*alive* while its owner process exists (same host: checked directly, a reused pid is told apart by
its start time) or, for an owner on another host, while its heartbeat is younger than LEASE_TTL_S.

`sweep` finds the releases that are not finished and whose run is dead (killed, crashed, an
interrupted CLI that could not clean up) and ends each one, in one store transaction:
- its budget was not committed: the reservation is refunded, the release marked failed, any
  half-written staging folder removed (as if the run had never started, except that a sealed result
  stays in the archive: a resumed run reuses it, and nothing draws noise twice);
- its budget was committed (the controller approved and publication had begun): the signed,
  staged publication is moved into place and the release marked published (committed once).

The sweep runs when a release flow starts (on a worker or in a CLI) and as `dprelease recover`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from . import pipeline, publication_lock, shared_archive
from .reporting import signing
from .store import FINAL_STATUSES, Lease, Release, Store, StoreError

HEARTBEAT_S = 5.0  # how often a running release renews its lease
LEASE_TTL_S = 60.0  # a heartbeat older than this means the run is dead (owner on another host)
START_GRACE_S = 60.0  # a release younger than this without a lease is still starting


# -- the owner of a run: this process ------------------------------------------------------------

def process_started(pid: int) -> float:
    """The start time of a process in clock ticks since boot (Linux /proc), 0 when unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return float(fields[19])
    except (OSError, IndexError, ValueError):
        return 0.0


def _process_state(pid: int) -> str:
    """The one-letter state of a process (Linux /proc); "" when unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def process_alive(pid: int, started: float = 0.0) -> bool:
    """Whether the process `pid` of this host still runs (a zombie does not; a pid reused by a
    process that started at another time is not the same process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _process_state(pid) in ("Z", "X"):
        return False
    return not (started and process_started(pid) and process_started(pid) != started)


def this_host() -> str:
    return socket.gethostname()


class Heartbeat:
    """The lease of one release, renewed by a daemon thread until the release is finished or
    `stop` is called (the flow's end hooks); the lease is then removed."""

    def __init__(self, store: Store, release_id: str, flow_run_id: str | None = None) -> None:
        self.store, self.release_id = store, release_id
        pid = os.getpid()
        store.take_lease(release_id, this_host(), pid, process_started(pid), flow_run_id)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{release_id[:8]}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            try:
                if self.store.get_release(self.release_id).status in FINAL_STATUSES:
                    break
                self.store.renew_lease(self.release_id)
            except Exception:  # noqa: BLE001 - a missed beat is retried; the TTL is many beats long
                continue
        self._end()

    def _end(self) -> None:
        try:
            self.store.end_lease(self.release_id)
        except Exception:  # noqa: BLE001 - a lease left behind only delays a sweep
            pass

    def stop(self) -> None:
        self._stopped.set()


_held: dict[str, Heartbeat] = {}
_held_lock = threading.Lock()


def hold_lease(store: Store, release_id: str, flow_run_id: str | None = None) -> Heartbeat:
    """Take the lease of a release for this process and keep it alive (once per release)."""
    with _held_lock:
        if release_id not in _held:
            _held[release_id] = Heartbeat(store, release_id, flow_run_id)
        return _held[release_id]


def release_lease(release_id: str) -> None:
    """Stop renewing the lease of a release this process held (its run ended)."""
    with _held_lock:
        beat = _held.pop(release_id, None)
    if beat is not None:
        beat.stop()


# -- is a run alive? -------------------------------------------------------------------------------

def run_is_alive(store: Store, release: Release, now: datetime | None = None) -> tuple[bool, str]:
    """Whether the run of a release can still finish it, and what that is based on."""
    now = now or datetime.now(UTC)
    lease: Lease | None = store.get_lease(release.id)
    if lease is None:
        age = (now - release.created_at).total_seconds()
        if age < START_GRACE_S:
            return True, f"started {age:.0f} s ago, no process has taken it yet"
        return False, "no process holds it"
    owner = f"process {lease.pid} on {lease.host}"
    if lease.host == this_host():
        if process_alive(lease.pid, lease.process_started):
            return True, f"{owner} runs it"
        return False, f"{owner} has ended"
    silent = (now - lease.heartbeat_at).total_seconds()
    if silent < LEASE_TTL_S:
        return True, f"{owner} was alive {silent:.0f} s ago"
    return False, f"{owner} has been silent for {silent:.0f} s (lease {LEASE_TTL_S:g} s)"


# -- recovery --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recovered:
    """What the recovery did to one release."""

    release_id: str
    dataset: str
    outcome: str  # "refunded" (reservation returned, marked failed) | "marked" (nothing reserved) | "published"
    epsilon: float
    flow_run_id: str | None
    reason: str

    def line(self) -> str:
        what = {"refunded": f"epsilon {self.epsilon:g} refunded, marked failed",
                "marked": "nothing was reserved, marked failed",
                "published": f"it was approved: publication completed, epsilon {self.epsilon:g} committed once"}
        return f"release {self.release_id} ({self.dataset}): {self.reason}; {what[self.outcome]}"


def unfinished(store: Store) -> list[Release]:
    """Releases whose run has not ended: not in a final status, or still holding a reservation."""
    releases = {r.id: r for r in store.list_releases() if r.status not in FINAL_STATUSES}
    for entry in store.reserved_entries():
        if entry.release_id not in releases:
            try:
                releases[entry.release_id] = store.get_release(entry.release_id)
            except StoreError:  # a reservation made through the Store API alone: no run owns it
                continue
    return sorted(releases.values(), key=lambda r: (r.created_at, r.id))


def sweep(platform: pipeline.Platform, now: datetime | None = None) -> list[Recovered]:
    """End every unfinished release whose run is dead (see the module docstring); the live ones
    are left alone. Safe to run from several processes at once."""
    done = []
    for release in unfinished(platform.store):
        alive, why = run_is_alive(platform.store, release, now)
        if not alive:
            done.append(stop(platform, release.id, f"its run is dead ({why})"))
    return done


def stop(platform: pipeline.Platform, release_id: str, reason: str, status: str = "failed") -> Recovered:
    """End one release that will not publish: refund and mark it `status` in one transaction, remove
    any staging folder; or, if the controller had approved it and its budget is committed, finish
    the publication that had begun."""
    store = platform.store
    release = store.get_release(release_id)
    epsilon = _reserved_epsilon(store, release_id)
    ledger = store.abandon(release_id, status, reason)
    if ledger == "committed":
        finish_publication(platform, release_id)
        reason += finish_series_period(platform, release.dataset)
        outcome = "published"
    else:
        _discard_staging(platform, release_id)
        outcome = "refunded" if ledger == "refunded" else "marked"
    store.end_lease(release_id)
    return Recovered(release_id, release.dataset, outcome, epsilon, release.flow_run_id, reason)


def _reserved_epsilon(store: Store, release_id: str) -> float:
    try:
        return store.ledger_entry(release_id).epsilon
    except StoreError:
        return 0.0


def _discard_staging(platform: pipeline.Platform, release_id: str) -> None:
    """Remove what an unapproved run may have begun writing in the publication directory."""
    staging = platform.settings.publication_dir / f".staging-{release_id}"
    if staging.exists():
        shutil.rmtree(staging, ignore_errors=True)
    shared_archive.remove(platform.settings, staging)  # staged by a worker, maybe on another host


def finish_series_period(platform: pipeline.Platform, dataset: str) -> str:
    """After a series snapshot's publication is finished here: what its run would have done next
    (dprelease.series_period.period_published: the running total, the series page, the index). Returns what
    the recovery line adds ('' for a plain dataset or when all is done); never raises: the
    publication itself is complete, and the next period's run catches up what could not be done."""
    from .series_period import period_published
    from .store import series as store_series

    found = store_series.snapshot_of_dataset(platform.store, dataset)
    if found is None:
        return ""
    return "".join(f"; {note}" for note in period_published(platform, *found))


def finish_publication(platform: pipeline.Platform, release_id: str) -> None:
    """Complete a publication whose budget is committed: the signed staging folder (or a previous
    version set aside while it was being replaced) goes into place, then status and index; under the
    publication's lock, after its run or another finisher (dprelease.publication_lock)."""
    with publication_lock.held(platform.settings, release_id):
        _finish_publication(platform, release_id)


def _finish_publication(platform: pipeline.Platform, release_id: str) -> None:
    """finish_publication's work, its lock held."""
    pub = platform.settings.publication_dir
    directory, staging, old = pub / release_id, pub / f".staging-{release_id}", pub / f".old-{release_id}"
    for folder in (directory, staging):  # what the run's host had put in the shared archive
        shared_archive.pull(platform.settings, folder)
    if (staging / signing.MANIFEST).exists() and not (directory / signing.MANIFEST).exists():
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    elif not directory.exists() and old.exists():
        old.rename(directory)
    for leftover in (staging, old):
        if leftover.exists():
            shutil.rmtree(leftover, ignore_errors=True)
    manifest = directory / signing.MANIFEST
    if manifest.exists():
        shared_archive.publish_directory(platform.settings, directory)
    shared_archive.remove(platform.settings, staging)
    if not manifest.exists():
        platform.store.update_release(release_id, status="failed", decision_comment=(
            "its budget was committed but no signed publication was found: ask the operator to republish"))
        return
    signed = json.loads(manifest.read_text())
    facts = signed["facts"]
    platform.store.update_release(
        release_id, status="published", decision_by=facts.get("approved_by"),
        artifacts_json=json.dumps({k: v["sha256"] for k, v in signed["files"].items()}))
    pipeline.write_index(platform)
