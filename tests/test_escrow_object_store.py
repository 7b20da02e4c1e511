"""The escrow on an S3-compatible object store (`DPRELEASE_ESCROW_URL=s3://bucket/prefix`), tested
against a real S3 server process (moto's standalone server on 127.0.0.1): registration seals into
the bucket (ciphertext only, nothing local), reads are ranged (footer statistics fetch a few chunks,
not the blob), a release runs from it, a blob changed or swapped in the bucket is refused, and an
unreachable store is one clear line with nothing registered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from s3_server import free_port, new_bucket, s3_server  # noqa: F401 - s3_server: a fixture

import dp_core as dp
from dprelease import admin, escrow
from dprelease.escrow import EscrowError
from dprelease.settings import Settings
from dprelease.store import Store

pytest.importorskip("s3fs")
pytest.importorskip("moto")

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("dprelease"))
MARKER = "Zebulon-Quixotic-7731"  # a value that must never appear in the bucket


@pytest.fixture
def bucket(s3_server, monkeypatch):  # noqa: F811 - s3_server: the fixture imported above
    """A new bucket on the server; returns its fsspec filesystem and its name."""
    return new_bucket(s3_server, monkeypatch, "escrow")


def _settings(tmp_path: Path, url: str) -> Settings:
    home = tmp_path / "home"
    return Settings(home=home, store_url=f"sqlite:///{home / 'store.db'}", key_dir=tmp_path / "keys",
                    escrow_url=url)


def _people(n: int = 2000) -> pd.DataFrame:
    rng = np.random.default_rng(7)  # test data only; the noise comes from the engine's CSPRNG
    return pd.DataFrame({"uid": np.arange(n), "region": rng.choice(["north", "south"], n),
                         "name": [MARKER if i == 0 else f"p{i}" for i in range(n)], "age": rng.integers(18, 90, n)})


def test_a_dataset_is_sealed_into_the_bucket_and_released_from_it(bucket, tmp_path):
    fs, name = bucket
    settings = _settings(tmp_path, f"s3://{name}/datasets")
    admin.init(settings)
    source = tmp_path / "people.csv"
    _people().to_csv(source, index=False)
    ds = admin.register_dataset(settings, "people", source, "uid", epsilon_cap=5.0)

    assert ds.blob_path.startswith(f"s3://{name}/datasets/") and ds.blob_path.endswith(".escrow")
    assert list(settings.escrow_dir.glob("*")) == []  # nothing of the dataset on the local disk
    objects = fs.find(name)
    assert objects == [ds.blob_path[len("s3://"):]]  # one blob, no temporary or partial object
    stored = fs.cat_file(objects[0])
    assert MARKER.encode() not in stored and b"region" not in stored and b"PAR1" not in stored

    key = escrow.load_or_create_key(settings, create=False)
    back = escrow.load_frame(ds.blob_path, key, ds.fingerprint, ds.file_format)
    pd.testing.assert_frame_equal(back, _people(), check_dtype=False)
    rows = escrow.EscrowRows(ds.blob_path, key, ds.fingerprint, ds.file_format)
    query = dp.Query([dp.count(upper=1)], privacy_unit="uid", group_by=("region",), epsilon=1.0,
                     public_partitions=["north", "south"])
    result = dp.execute(query, rows)
    assert sorted(result.table["region"]) == ["north", "south"]
    assert (result.table["count"] > 500).all()  # ~1000 each, noise of scale 1


def test_reads_from_the_bucket_are_ranged_never_the_whole_blob(bucket, tmp_path, monkeypatch):
    """The Parquet footer's statistics of a blob of many chunks are read by fetching the chunks
    that hold the footer, not the object: the bytes read from the store are a small part of it."""
    fs, name = bucket
    settings = _settings(tmp_path, f"s3://{name}/e")
    key = escrow.load_or_create_key(settings, create=True)
    source = tmp_path / "people.parquet"
    _people(200_000).to_parquet(source, index=False)
    sealed = escrow.seal_source(source, escrow.read_source(source), escrow.file_fingerprint(source), settings, key,
                                chunk_size=16 * 1024)
    size = fs.info(sealed.path[len("s3://"):])["size"]
    import s3fs.core

    fetched = []  # the bytes each ranged GET brought from the server
    original = s3fs.core.S3File._fetch_range

    def counting(self, start, end):
        data = original(self, start, end)
        fetched.append(len(data))
        return data

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", counting)
    stats = escrow.EscrowRows(sealed.path, key, sealed.fingerprint).column_statistics()
    assert stats["age"] is not None
    assert size > 40 * 16 * 1024 and 0 < sum(fetched) < size / 10


def test_a_blob_changed_or_swapped_in_the_bucket_is_refused(bucket, tmp_path):
    fs, name = bucket
    settings = _settings(tmp_path, f"s3://{name}/e")
    key = escrow.load_or_create_key(settings, create=True)
    source, other = tmp_path / "a.csv", tmp_path / "b.csv"
    _people(3000).to_csv(source, index=False)
    _people(10).to_csv(other, index=False)
    blob, digest, fmt = escrow.seal_file(source, settings, key, chunk_size=4096)
    other_blob, _, _ = escrow.seal_file(other, settings, key)

    path = blob[len("s3://"):]
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0x01  # one bit of a chunk in the middle
    fs.pipe_file(path, bytes(data))
    with pytest.raises(EscrowError, match="failed authentication at chunk"):
        escrow.load_frame(blob, key, digest, fmt)

    fs.pipe_file(path, fs.cat_file(other_blob[len("s3://"):]))  # another dataset's blob in its place
    with pytest.raises(EscrowError, match="does not match the registered fingerprint"):
        escrow.EscrowRows(blob, key, digest, fmt)

    fs.rm_file(path)
    with pytest.raises(EscrowError, match="is missing: register the dataset again"):
        escrow.load_frame(blob, key, digest, fmt)


def test_an_unreachable_store_is_one_line_and_registers_nothing(tmp_path):
    """The CLI with the escrow in a bucket whose server does not answer: `error: ...` naming what to
    check, exit 2, no traceback, no dataset in the store, no blob anywhere."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPRELEASE_", "AWS_"))}
    env.update(DPRELEASE_HOME=str(home), DPRELEASE_ESCROW_URL="s3://nowhere/escrow",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}", AWS_ACCESS_KEY_ID="test",
               AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1", AWS_MAX_ATTEMPTS="2",
               PYTHONPATH=str(ROOT))
    source = tmp_path / "people.csv"
    _people(50).to_csv(source, index=False)
    subprocess.run([CLI, "init"], env=env, check=True, capture_output=True)
    done = subprocess.run([CLI, "dataset", "register", "people", str(source), "--unit", "uid", "--epsilon-cap", "1"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the escrow's object store did not answer for s3://nowhere/"), \
        done.stderr
    assert "DPRELEASE_ESCROW_URL" in lines[0] and "Traceback" not in done.stderr
    assert Store(f"sqlite:///{home / 'store.db'}").list_datasets() == []
    assert not (home / "escrow").exists() or list((home / "escrow").iterdir()) == []


def test_an_escrow_url_that_is_not_an_object_store_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"DPRELEASE_ESCROW_URL='/tmp/x' is not an object-store location: give s3://"):
        Settings.from_env({"DPRELEASE_HOME": "/tmp/h", "DPRELEASE_ESCROW_URL": "/tmp/x"})
    assert Settings.from_env({"DPRELEASE_HOME": "/tmp/h", "DPRELEASE_ESCROW_URL": "s3://b/p/"}).escrow_location == "s3://b/p"
    assert Settings.from_env({"DPRELEASE_HOME": "/tmp/h"}).escrow_location == Path("/tmp/h/escrow")


def test_every_platform_step_reads_a_dataset_from_the_bucket(bucket, tmp_path):
    """The platform's own readers take the blob's stored address as it is: each step that reads a
    dataset (data checks, the engine's rows, the small-data frame) reads it from the bucket. A
    bucket URL turned into a local path (s3:/bucket/...) made every release of such a dataset end
    with 'the escrow blob ... is missing'."""
    from dprelease import pipeline

    fs, name = bucket
    settings = _settings(tmp_path, f"s3://{name}/datasets")
    admin.init(settings)
    source = tmp_path / "people.csv"
    _people(300).to_csv(source, index=False)
    admin.register_dataset(settings, "people", source, "uid", epsilon_cap=5.0)
    platform = pipeline.Platform.open(settings)

    assert pipeline.check_data(platform, "people").success
    assert pipeline.with_rows(platform, "people", lambda rows: rows.reader().read_all().num_rows, "count") == 300
    _ds, frame = pipeline.load_frame(platform, "people")
    pd.testing.assert_frame_equal(frame, _people(300), check_dtype=False)
