"""The escrow (invariant 6): round trips for every format, ciphertext only on disk, wrong key and
tampering refused, key file handling, and no plaintext temp file when loading."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from cryptography.fernet import Fernet

from dprelease import escrow
from dprelease.escrow import EscrowError, fingerprint, load_frame, load_or_create_key, open_blob, seal_file
from dprelease.settings import Settings

MARKER = "Zebulon-Quixotic-7731"  # a value that must never appear in ciphertext


def _settings(tmp_path: Path, escrow_key: str | None = None, key_dir: Path | None = None) -> Settings:
    home = tmp_path / "home"
    return Settings(
        home=home, store_url=f"sqlite:///{home / 'store.db'}", key_dir=key_dir or tmp_path / "keys", escrow_key=escrow_key
    )


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"person_id": [1, 2, 3], "name": [MARKER, "bob", "carol"], "age": [31.5, 42.0, 57.25]})


def _write(df: pd.DataFrame, path: Path) -> Path:
    if path.name.endswith(".parquet"):
        df.to_parquet(path, engine="pyarrow", index=False)
    else:
        df.to_csv(path, index=False, compression="gzip" if path.name.endswith(".gz") else None)
    return path


@pytest.mark.parametrize("filename, file_format", [("d.csv", "csv"), ("d.csv.gz", "csv.gz"), ("d.parquet", "parquet")])
def test_round_trip_and_ciphertext_only(tmp_path, filename, file_format):
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    source = _write(_frame(), tmp_path / filename)

    blob, digest, fmt = seal_file(source, settings, key)
    assert fmt == file_format
    assert digest == fingerprint(source.read_bytes())
    assert blob == settings.escrow_dir / f"{digest}.fernet"
    sealed = blob.read_bytes()
    assert MARKER.encode() not in sealed and b"carol" not in sealed and b"person_id" not in sealed
    assert [p.name for p in settings.escrow_dir.iterdir()] == [blob.name]  # no temp file left behind

    assert open_blob(blob, key, digest) == source.read_bytes()
    pd.testing.assert_frame_equal(load_frame(blob, key, digest, fmt), _frame(), check_dtype=False)


def test_unsupported_suffix_and_misnamed_file_refused(tmp_path):
    settings = _settings(tmp_path)
    key = Fernet.generate_key()
    xlsx = tmp_path / "d.xlsx"
    xlsx.write_bytes(b"whatever")
    with pytest.raises(EscrowError, match=r"d\.xlsx.*\.csv\.gz, \.csv, \.parquet"):
        seal_file(xlsx, settings, key)
    fake_gz = _write(_frame(), tmp_path / "plain.csv")
    fake_gz = fake_gz.rename(tmp_path / "plain.csv.gz")
    with pytest.raises(EscrowError, match="not gzip"):
        seal_file(fake_gz, settings, key)
    with pytest.raises(EscrowError, match="no such file"):
        seal_file(tmp_path / "missing.csv", settings, key)


def test_wrong_key_and_tampering_refused(tmp_path):
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, fmt = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, key)

    with pytest.raises(EscrowError, match="wrong escrow key"):
        open_blob(blob, Fernet.generate_key(), digest)

    token = bytearray(blob.read_bytes())
    token[len(token) // 2] = ord("A") if token[len(token) // 2] != ord("A") else ord("B")
    tampered = tmp_path / "tampered.fernet"
    tampered.write_bytes(bytes(token))
    with pytest.raises(EscrowError, match="wrong escrow key or the blob was altered"):
        load_frame(tampered, key, digest, fmt)

    # a validly encrypted blob of other bytes (swapped blob) fails the fingerprint check
    swapped = tmp_path / "swapped.fernet"
    swapped.write_bytes(Fernet(key).encrypt(b"person_id\n1\n"))
    with pytest.raises(EscrowError, match="does not match the registered fingerprint"):
        open_blob(swapped, key, digest)

    with pytest.raises(EscrowError, match="missing"):
        open_blob(tmp_path / "gone.fernet", key, digest)


def test_key_file_created_private_and_reused(tmp_path):
    settings = _settings(tmp_path)
    with pytest.raises(EscrowError, match="dprelease init.*DPRELEASE_ESCROW_KEY"):
        load_or_create_key(settings, create=False)
    key = load_or_create_key(settings, create=True)
    assert stat.S_IMODE(settings.escrow_key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(settings.key_dir.stat().st_mode) == 0o700
    assert load_or_create_key(settings, create=False) == key
    assert load_or_create_key(settings, create=True) == key  # never replaced once it exists


def test_loose_key_file_refused(tmp_path):
    settings = _settings(tmp_path)
    load_or_create_key(settings, create=True)
    os.chmod(settings.escrow_key_file, 0o644)
    with pytest.raises(EscrowError, match="chmod 600"):
        load_or_create_key(settings, create=False)


@pytest.mark.parametrize("inside", ["escrow", "published"])
def test_key_inside_a_data_directory_refused(tmp_path, inside):
    settings = _settings(tmp_path, key_dir=tmp_path / "home" / inside / "keys")
    with pytest.raises(EscrowError, match="inside the .* directory"):
        load_or_create_key(settings, create=True)
    assert not settings.escrow_key_file.exists()


def test_escrow_key_setting_takes_precedence(tmp_path):
    env_key = Fernet.generate_key()
    settings = _settings(tmp_path, escrow_key=env_key.decode())
    assert load_or_create_key(settings, create=True) == env_key
    assert not settings.escrow_key_file.exists()  # no key file made when the key is given
    blob, digest, fmt = seal_file(_write(_frame(), tmp_path / "d.csv"), settings, env_key)
    assert load_frame(blob, env_key, digest, fmt)["name"].tolist()[0] == MARKER

    bad = _settings(tmp_path, escrow_key="not-a-key")
    with pytest.raises(EscrowError, match="DPRELEASE_ESCROW_KEY is not a valid Fernet key"):
        load_or_create_key(bad, create=False)


def test_settings_from_env_key_is_used(tmp_path):
    env_key = Fernet.generate_key().decode()
    settings = Settings.from_env({"DPRELEASE_HOME": str(tmp_path / "h"), "DPRELEASE_ESCROW_KEY": env_key})
    assert load_or_create_key(settings, create=False) == env_key.encode()


def _listing(root: Path, recursive: bool) -> set[str]:
    """Names under a directory (recursively or not), ignoring entries that vanish while listing."""
    if not recursive:
        return set(os.listdir(root))
    return {str(p) for p in root.rglob("*")}


@pytest.mark.parametrize("filename", ["d.csv", "d.csv.gz", "d.parquet"])
def test_load_frame_writes_no_file(tmp_path, monkeypatch, filename):
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    blob, digest, fmt = seal_file(_write(_frame(), tmp_path / filename), settings, key)

    # route Python's temp files somewhere watched as well, then compare listings before and after
    watched_tmp = tmp_path / "tmp"
    watched_tmp.mkdir()
    system_tmp = Path(tempfile.gettempdir())
    before_system = _listing(system_tmp, recursive=False)
    monkeypatch.setattr(tempfile, "tempdir", str(watched_tmp))
    monkeypatch.setenv("TMPDIR", str(watched_tmp))
    before_tree = _listing(tmp_path, recursive=True)

    df = load_frame(blob, key, digest, fmt)

    assert df["name"].tolist()[0] == MARKER
    assert _listing(tmp_path, recursive=True) == before_tree
    assert _listing(system_tmp, recursive=False) - before_system == set()


def test_parse_bytes_rejects_unknown_format():
    with pytest.raises(EscrowError, match="unknown file format 'xlsx'"):
        escrow.parse_bytes(b"", "xlsx")


def test_seal_bytes_round_trip_without_a_source_file(tmp_path):
    settings = _settings(tmp_path)
    key = load_or_create_key(settings, create=True)
    data = _frame().to_parquet(index=False)
    blob, digest, fmt = escrow.seal_bytes(data, "parquet", settings, key)
    assert (fmt, digest) == ("parquet", fingerprint(data)) and MARKER.encode() not in blob.read_bytes()
    pd.testing.assert_frame_equal(load_frame(blob, key, digest, fmt), _frame())
    with pytest.raises(EscrowError, match="unknown file format 'xlsx'"):
        escrow.seal_bytes(data, "xlsx", settings, key)
    with pytest.raises(EscrowError, match="not a Parquet file"):
        escrow.seal_bytes(b"a,b\n1,2\n", "parquet", settings, key)
