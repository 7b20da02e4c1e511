"""The recovery sweep in process (fast): which runs are dead, what is refunded, what is finished.
The same paths with real processes and signals: tests/test_operations.py."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from dprelease import pipeline, recovery
from dprelease.reporting import signing


@pytest.fixture()
def platform(tmp_path):
    from dprelease import admin
    from dprelease.settings import Settings

    settings = Settings.from_env({"DPRELEASE_HOME": str(tmp_path / "home")})
    admin.init(settings)
    p = pipeline.Platform.open(settings)
    p.store.add_dataset("d", privacy_unit="u", blob_path="/nowhere", fingerprint="0" * 64, file_format="csv",
                        schema={"u": "int"}, epsilon_cap=10.0, delta_cap=1e-5)
    return p


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _running(platform, release_id: str, epsilon: float = 1.0, pid: int | None = None, host: str | None = None,
             heartbeat_age_s: float = 0.0) -> None:
    platform.store.add_release("d", "{}", release_id=release_id)
    platform.store.reserve("d", release_id, epsilon, 0.0)
    platform.store.take_lease(release_id, host or recovery.this_host(), pid or os.getpid(),
                              recovery.process_started(pid or os.getpid()))
    if heartbeat_age_s:
        from sqlmodel import Session

        from dprelease.store.tables import Lease

        with Session(platform.store.engine) as session, session.begin():
            lease = session.get(Lease, release_id)
            lease.heartbeat_at = datetime.now(UTC) - timedelta(seconds=heartbeat_age_s)
            session.add(lease)


def _staged_and_signed(platform, release_id: str):
    """A release's report written and signed in its staging folder, as its run leaves it before the
    commit (approved by alice, epsilon 1.5); returns the folder."""
    staging = platform.settings.publication_dir / f".staging-{release_id}"
    staging.mkdir(parents=True)
    (staging / "index.html").write_text("<html>report</html>")
    signing.sign_directory(staging, {"release_id": release_id, "dataset": "d", "approved_by": "alice",
                                     "epsilon": 1.5, "delta": 0.0, "published_at": "now"},
                           signing.load_private_key(platform.settings.signing_key_file))
    return staging


def test_only_dead_runs_are_recovered_and_refunded(platform):
    _running(platform, "alive")
    _running(platform, "dead", epsilon=2.0, pid=_dead_pid())
    _running(platform, "far-alive", host="elsewhere", heartbeat_age_s=5)
    _running(platform, "far-silent", host="elsewhere", heartbeat_age_s=recovery.LEASE_TTL_S + 5)
    staging = platform.settings.publication_dir / ".staging-dead"
    staging.mkdir(parents=True)
    (staging / "index.html").write_text("half written")
    done = {d.release_id: d for d in recovery.sweep(platform)}
    assert set(done) == {"dead", "far-silent"}
    assert done["dead"].outcome == "refunded" and done["dead"].epsilon == 2.0 and "has ended" in done["dead"].reason
    assert "silent" in done["far-silent"].reason
    for rid in done:
        assert platform.store.get_release(rid).status == "failed"
        assert platform.store.ledger_entry(rid).status == "refunded"
    assert not staging.exists()
    assert platform.store.budget("d")["epsilon_reserved"] == 2.0  # the two live runs keep theirs
    assert recovery.sweep(platform) == []  # idempotent


def test_a_release_without_a_lease_is_dead_only_after_the_start_grace(platform):
    platform.store.add_release("d", "{}", release_id="starting")
    assert recovery.sweep(platform) == []
    later = datetime.now(UTC) + timedelta(seconds=recovery.START_GRACE_S + 1)
    assert [d.outcome for d in recovery.sweep(platform, now=later)] == ["marked"]


def test_an_approved_run_killed_during_publication_is_finished_and_committed_once(platform):
    _running(platform, "approved", epsilon=1.5, pid=_dead_pid())
    staging = _staged_and_signed(platform, "approved")
    platform.store.commit("approved")
    [done] = recovery.sweep(platform)
    assert done.outcome == "published"
    directory = platform.settings.publication_dir / "approved"
    assert signing.verify_directory(directory, platform.settings.public_key_file).ok
    rel = platform.store.get_release("approved")
    assert rel.status == "published" and rel.decision_by == "alice"
    assert platform.store.budget("d")["epsilon_committed"] == 1.5
    assert not staging.exists()


def test_a_reused_pid_is_not_the_owner(platform):
    _running(platform, "reused")
    platform.store.take_lease("reused", recovery.this_host(), os.getpid(), 12345.0)  # another start time
    alive, why = recovery.run_is_alive(platform.store, platform.store.get_release("reused"))
    assert not alive and "has ended" in why


def _waits_for_lock(path) -> bool:
    """Whether some process waits for the flock of `path` (Linux /proc/locks: `-> FLOCK` lines)."""
    inode = f":{os.stat(path).st_ino} "
    return any("->" in line and "FLOCK" in line and inode in line for line in open("/proc/locks"))


def test_a_recovery_finishes_a_publication_only_after_the_run_that_holds_it(platform):
    """A committed release whose run is still moving its signed folder into place (its run holds the
    publication's lock) is finished by a recovery (the command's stop, the watchdog, the sweep) only
    after that run: it neither removes nor sets aside the folder the run put in place. Two finishers
    at once once left the release published with no folder."""
    import threading

    from dprelease import publication_lock

    _running(platform, "racing", epsilon=1.5)
    staging = _staged_and_signed(platform, "racing")
    directory = platform.settings.publication_dir / "racing"
    finished = threading.Event()

    def finish() -> None:
        try:
            recovery.finish_publication(platform, "racing")
        finally:
            finished.set()

    with publication_lock.held(platform.settings, "racing"):  # the run, after its commit
        platform.store.commit("racing")
        finisher = threading.Thread(target=finish, daemon=True)
        finisher.start()
        lock_file = platform.settings.archive_dir / "racing" / publication_lock.LOCK_FILE
        while not (finished.is_set() or _waits_for_lock(lock_file)):
            finished.wait(0.05)
        assert not finished.is_set(), "the recovery finished the publication while its run was moving it into place"
        staging.rename(directory)  # the run's own move, then its status
        platform.store.update_release("racing", status="published", decision_by="alice")
    finished.wait()
    assert signing.verify_directory(directory, platform.settings.public_key_file).ok
    assert not list(platform.settings.publication_dir.glob(".old-*")) and not staging.exists()
    assert platform.store.get_release("racing").status == "published"


def test_an_interrupted_command_says_what_is_left_of_an_approved_release_it_could_not_publish(platform):
    """The stop of an interrupted `dprelease release` (cli/runs.py) whose run ended after the commit
    without a signed publication to move into place: its line says the budget is committed and the
    release not published, and why, never "it is published" (which it said, from recovery.stop's
    outcome, whatever the publication became)."""
    import threading

    from dprelease.cli import runs

    _running(platform, "unpublishable", epsilon=1.5)
    platform.store.commit("unpublishable")
    ended = threading.Event()
    ended.set()  # the run's thread is over
    run = runs.OwnRun(platform.settings, "unpublishable", threading.Thread(target=ended.wait), {}, ended)
    outcome, words = runs._stop(platform, run, None, "interrupted by SIGTERM at the command line")
    assert outcome == "unfinished", words
    assert "committed but it is not published, marked failed" in words and "no signed publication" in words
    assert platform.store.budget("d")["epsilon_committed"] == 1.5
