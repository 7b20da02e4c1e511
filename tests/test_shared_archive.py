"""The release archive shared through an object store (DPRELEASE_ARCHIVE_URL, dprelease/shared_archive.py),
against a real S3 server process (moto): a sealed result is drawn once whichever host computes, and
never replaced; a publication appears with its signed manifest last and keeps no stale file; a store
that does not answer refuses before anything is reserved, in one line. The whole deployment (two
workers, PostgreSQL, Prefect) is tests/test_workers_two_hosts.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from s3_server import free_port, new_bucket, s3_server  # noqa: F401 - s3_server: a fixture

from dprelease import admin, pipeline, shared_archive
from dprelease.reporting import signing
from dprelease.requests import parse_request
from dprelease.settings import Settings
from dprelease.store import StoreError

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture
def bucket(s3_server, monkeypatch):  # noqa: F811 - s3_server: the fixture imported above
    """A new bucket on the server; its name."""
    return new_bucket(s3_server, monkeypatch, "archive")[1]


def _host(tmp_path: Path, name: str, store: str, archive_url: str, escrow_key: str | None = None) -> Settings:
    """One host's settings: its own home, the shared store and archive (and escrow key)."""
    return Settings(home=tmp_path / name, store_url=store, key_dir=tmp_path / name / "keys", escrow_key=escrow_key,
                    archive_url=archive_url)


def _fs():
    import fsspec

    return fsspec.filesystem("s3", skip_instance_cache=True)


def _planned(settings: Settings) -> tuple[pipeline.Platform, pipeline.Plan, pipeline.EpsilonDecision]:
    platform = pipeline.Platform.open(settings)
    request = parse_request({"dataset": "people", "epsilon": 1.0, "delta": 1e-6,
                             "sql": "SELECT WITH ANONYMIZATION town, ANON_COUNT(*, 1) AS people FROM people GROUP BY town"})
    planned = pipeline.plan(platform, request)
    return platform, planned, pipeline.choose_epsilon(platform, planned)


@pytest.fixture
def two_hosts(bucket, tmp_path):
    """Host a registered a dataset; host b has its own home, the same store, escrow key and archive."""
    store = f"sqlite:///{tmp_path / 'store.db'}"
    a = _host(tmp_path, "a", store, f"s3://{bucket}/shared")
    admin.init(a)
    source = tmp_path / "people.csv"
    pd.DataFrame({"uid": range(200), "town": [f"t{i % 2}" for i in range(200)]}).to_csv(source, index=False)
    admin.register_dataset(a, "people", source, "uid", epsilon_cap=5.0, delta_cap=1e-4)
    b = _host(tmp_path, "b", store, a.archive_url, a.escrow_key_file.read_text().strip())
    b.ensure_dirs()
    return bucket, a, b


def test_a_result_sealed_on_one_host_is_the_one_every_host_uses(two_hosts):
    """Noise is drawn once per release whichever host computes: a run resumed on another host
    (its own empty archive folder) opens the first host's seal from the bucket, it does not draw
    again; the seal in the bucket is never replaced."""
    bucket, a, b = two_hosts
    platform_a, planned, decision = _planned(a)
    pipeline.reserve(platform_a, "r1", "people", decision.epsilon, planned.query.delta)
    first = pipeline.compute_sealed(platform_a, "r1", planned, decision)
    key = f"{bucket}/shared/archive/r1/sealed-result.fernet"
    sealed = _fs().cat_file(key)

    platform_b, planned_b, decision_b = _planned(b)
    assert not pipeline.sealed_path(platform_b, "r1").exists()
    again = pipeline.compute_sealed(platform_b, "r1", planned_b, decision_b)
    pd.testing.assert_frame_equal(again.table, first.table)
    assert pipeline.open_sealed(platform_b, "r1", planned_b, decision_b).table.equals(first.table)
    assert _fs().cat_file(key) == sealed

    pipeline.sealed_path(platform_b, "r1").write_bytes(b"another draw")
    assert shared_archive.push_new(b, pipeline.sealed_path(platform_b, "r1")) is False  # never replaced
    assert _fs().cat_file(key) == sealed
    pipeline.sealed_path(platform_a, "r1").unlink()  # even a host that lost its copy reads the first one back
    assert pipeline.compute_sealed(platform_a, "r1", planned, decision).table.equals(first.table)


def test_the_seal_that_reached_the_bucket_first_wins(two_hosts, monkeypatch):
    """Two runs of one release sealing at once (host b looked before host a's seal arrived): b's
    seal is refused by the bucket, and b drops its own numbers, never shown, for a's."""
    bucket, a, b = two_hosts
    platform_a, planned, decision = _planned(a)
    platform_b, planned_b, decision_b = _planned(b)
    pipeline.reserve(platform_a, "r2", "people", decision.epsilon, planned.query.delta)
    first = pipeline.compute_sealed(platform_a, "r2", planned, decision)

    real_pull, looks = shared_archive.pull, []

    def late_pull(settings, local):  # b's first look comes before a's seal is there
        looks.append(local)
        if len(looks) > 1:
            real_pull(settings, local)

    monkeypatch.setattr(shared_archive, "pull", late_pull)
    later = pipeline.compute_sealed(platform_b, "r2", planned_b, decision_b)
    assert len(looks) == 2  # b computed, was refused by the bucket, and read a's seal
    pd.testing.assert_frame_equal(later.table, first.table)
    path_b = pipeline.sealed_path(platform_b, "r2")
    assert path_b.read_bytes() == _fs().cat_file(f"{bucket}/shared/archive/r2/sealed-result.fernet")


class _Recording:
    """An fsspec filesystem that lists the writes and deletions made through it, in order."""

    def __init__(self, fs, calls: list):
        self._fs, self.calls = fs, calls

    def __getattr__(self, name):
        attr = getattr(self._fs, name)
        if name in ("put_file", "rm_file", "rm", "pipe_file"):
            def recorded(*args, **kwargs):
                self.calls.append((name, args[1] if name == "put_file" else args[0]))
                return attr(*args, **kwargs)
            return recorded
        return attr


def test_a_publication_counts_only_once_its_manifest_is_written_last(bucket, tmp_path, monkeypatch):
    """A new version of a publication: its manifest (what readers and `verify` trust) goes first,
    then the files, then stale files of the old version, and the new manifest comes last."""
    settings = _host(tmp_path, "a", f"sqlite:///{tmp_path / 'store.db'}", f"s3://{bucket}/shared")
    admin.init(settings)
    folder = settings.publication_dir / "r3"
    folder.mkdir(parents=True)
    (folder / "index.html").write_text("v1")
    (folder / "old.csv").write_text("v1")
    signing.sign_directory(folder, {"release_id": "r3"}, signing.load_private_key(settings.signing_key_file))
    shared_archive.publish_directory(settings, folder)

    (folder / "old.csv").unlink()
    (folder / "index.html").write_text("v2")
    signing.sign_directory(folder, {"release_id": "r3"}, signing.load_private_key(settings.signing_key_file))
    calls: list = []
    real = shared_archive.filesystem
    monkeypatch.setattr(shared_archive, "filesystem", lambda url: (lambda fs, root: (_Recording(fs, calls), root))(
        *real(url)))
    shared_archive.publish_directory(settings, folder)

    manifest = f"{bucket}/shared/published/r3/{signing.MANIFEST}"
    assert calls[0] == ("rm_file", manifest) and calls[-1] == ("put_file", manifest), calls
    assert sorted(_fs().find(f"{bucket}/shared/published/r3")) == sorted(  # old.csv is gone
        f"{bucket}/shared/published/r3/{p.name}" for p in folder.iterdir())
    assert "old.csv" not in {p.name for p in folder.iterdir()}
    fetched = _host(tmp_path, "elsewhere", settings.store_url, settings.archive_url)
    shared_archive.pull(fetched, fetched.publication_dir / "r3")
    assert signing.verify_directory(fetched.publication_dir / "r3", settings.public_key_file).ok


def test_an_unreachable_archive_refuses_the_reservation_in_one_line(tmp_path):
    """The shared archive's server does not answer: the release is refused before its budget is
    reserved, in one line that names what to check; the ledger holds nothing."""
    store = f"sqlite:///{tmp_path / 'store.db'}"
    local = _host(tmp_path, "a", store, None)
    admin.init(local)
    source = tmp_path / "people.csv"
    pd.DataFrame({"uid": range(50), "town": ["t"] * 50}).to_csv(source, index=False)
    admin.register_dataset(local, "people", source, "uid", epsilon_cap=5.0)
    import os

    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_MAX_ATTEMPTS")}
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}", AWS_ACCESS_KEY_ID="test",
                      AWS_SECRET_ACCESS_KEY="test", AWS_MAX_ATTEMPTS="2")
    try:
        settings = _host(tmp_path, "a", store, "s3://nowhere/shared")
        platform = pipeline.Platform.open(settings)
        with pytest.raises(shared_archive.ArchiveError) as refused:
            pipeline.reserve(platform, "r4", "people", 1.0, 1e-6)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("the shared archive's object store did not answer for "
                                                      "s3://nowhere/shared"), message
    assert "DPRELEASE_ARCHIVE_URL" in message
    with pytest.raises(StoreError):
        platform.store.ledger_entry("r4")
    assert platform.store.budget("people")["epsilon_reserved"] == 0


def test_an_archive_url_that_is_not_an_object_store_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"DPRELEASE_ARCHIVE_URL='/srv/x' is not an object-store location: give s3://"):
        Settings.from_env({"DPRELEASE_HOME": "/tmp/h", "DPRELEASE_ARCHIVE_URL": "/srv/x"})
    assert Settings.from_env({"DPRELEASE_HOME": "/tmp/h", "DPRELEASE_ARCHIVE_URL": "s3://b/p/"}).archive_url == "s3://b/p"
    assert Settings.from_env({"DPRELEASE_HOME": "/tmp/h"}).archive_url is None


def test_the_cli_refuses_a_release_when_the_archive_does_not_answer(tmp_path):
    """`dprelease release` with the shared archive's server down: the same line as the Python API,
    as `error: ...`, exit 2, no traceback, nothing reserved."""
    import os
    import subprocess
    import sys

    from dprelease.store import Store

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPRELEASE_", "AWS_", "PREFECT_"))}
    env.update(DPRELEASE_HOME=str(home))
    cli = str(Path(sys.executable).with_name("dprelease"))
    source = tmp_path / "people.csv"
    pd.DataFrame({"uid": range(50), "town": ["t"] * 50}).to_csv(source, index=False)
    subprocess.run([cli, "init"], env=env, check=True, capture_output=True)
    subprocess.run([cli, "dataset", "register", "people", str(source), "--unit", "uid", "--epsilon-cap", "5"],
                   env=env, check=True, capture_output=True)
    request = tmp_path / "request.yaml"
    request.write_text("dataset: people\nsql: SELECT WITH ANONYMIZATION ANON_COUNT(*, 1) AS n FROM people\n"
                       "epsilon: 1.0\n")
    env.update(DPRELEASE_ARCHIVE_URL="s3://nowhere/shared", AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",
               AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_MAX_ATTEMPTS="2")
    done = subprocess.run([cli, "release", str(request)], env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: the shared archive's object store did not answer for s3://nowhere/shared"), done.stderr
    assert "DPRELEASE_ARCHIVE_URL" in lines[0] and "Traceback" not in done.stderr
    assert Store(f"sqlite:///{home / 'store.db'}").ledger_entries("people") == []


def test_a_series_page_published_on_another_host_shows_the_periods_published_anywhere(two_hosts, tmp_path):
    """A series' periods are published by whichever worker runs them: host a publishes 2026-01, then
    host b publishes the series page (as its run of the next period does). The page lists 2026-01,
    its signed folder pulled from the bucket as the index pulls a manifest; before, the page read the
    folder from b's own disk and failed (FileNotFoundError) after b's period was published."""
    from dprelease import series
    from dprelease.store import series as store_series

    _, a, b = two_hosts
    source = tmp_path / "visits.csv"
    pd.DataFrame({"uid": range(200), "town": [f"t{i % 2}" for i in range(200)]}).to_csv(source, index=False)
    series.register_snapshot(a, "visits", source, "2026-01", privacy_unit="uid", budget_mode="per_snapshot",
                             epsilon_cap=5.0)
    platform_a = pipeline.Platform.open(a)
    request = parse_request({"dataset": "visits@2026-01", "epsilon": 1.0, "delta": 1e-6, "title": "Visits: 2026-01",
                             "sql": "SELECT WITH ANONYMIZATION town, ANON_COUNT(*, 1) AS people FROM visits GROUP BY town"})
    planned = pipeline.plan(platform_a, request)
    decision = pipeline.choose_epsilon(platform_a, planned)
    platform_a.store.add_release(request.dataset, request.to_json(), release_id="v1")
    store_series.claim(platform_a.store, "visits", "2026-01", "v1")
    pipeline.reserve(platform_a, "v1", request.dataset, decision.epsilon, planned.query.delta)
    result = pipeline.compute_sealed(platform_a, "v1", planned, decision)
    pipeline.publish(platform_a, "v1", planned, decision, result, approved_by="alice")

    shutil.copytree(a.key_dir, b.key_dir, dirs_exist_ok=True)  # the publisher's keys, as every host has them
    platform_b = pipeline.Platform.open(b)
    assert not (b.publication_dir / "v1").exists()
    page = series.publish_series_page(platform_b, "visits")
    shown = json.loads((page / "series.json").read_text())
    assert [(p["snapshot"], p["release_id"]) for p in shown["periods"]] == [("2026-01", "v1")]
    assert signing.verify_directory(b.publication_dir / "v1", a.public_key_file).ok
