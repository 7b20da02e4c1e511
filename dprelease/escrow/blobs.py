"""Blobs: registered datasets encrypted at rest (Fernet), decrypted only into memory.

- `seal_file` (or `seal_bytes`, for data already in memory) encrypts a CSV, CSV.gz or Parquet file
  into `<escrow_dir>/<fingerprint>.fernet` (written atomically; nothing but ciphertext is written).
- `open_blob` / `load_frame` decrypt into memory and check the plaintext's SHA-256 fingerprint;
  parsing reads from an in-memory buffer, never a temporary plaintext file (invariant 6).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from pathlib import Path

import pandas as pd
from cryptography.fernet import Fernet, InvalidToken

from dprelease.settings import Settings

from .errors import EscrowError
from .keys import _checked_key

# suffix (lower case) -> file_format recorded in the store; longest suffixes first
SUFFIX_FORMATS = ((".csv.gz", "csv.gz"), (".csv", "csv"), (".parquet", "parquet"), (".pq", "parquet"))
BLOB_SUFFIX = ".fernet"


def _fernet(key: bytes) -> Fernet:
    """A Fernet for the key, with an escrow error instead of a bare ValueError."""
    return Fernet(_checked_key(key, "the caller"))


# --- sealing and opening --------------------------------------------------------------------------


def fingerprint(data: bytes) -> str:
    """SHA-256 hex of the plaintext bytes: identifies a dataset without revealing it."""
    return hashlib.sha256(data).hexdigest()


def file_format_of(path: Path) -> str:
    """The file format from the suffix (csv, csv.gz, parquet); EscrowError for anything else."""
    name = path.name.lower()
    for suffix, file_format in SUFFIX_FORMATS:
        if name.endswith(suffix):
            return file_format
    accepted = ", ".join(suffix for suffix, _ in SUFFIX_FORMATS)
    raise EscrowError(f"cannot register {path.name}: unsupported file type; accepted suffixes are {accepted}")


def _check_magic(data: bytes, file_format: str, label: str) -> None:
    """Cheap content check so a misnamed file is refused at registration, not at release time."""
    if file_format == "csv.gz" and not data.startswith(b"\x1f\x8b"):
        raise EscrowError(f"{label} is declared csv.gz but is not gzip-compressed: rename it or compress it")
    if file_format == "parquet" and not (data.startswith(b"PAR1") and data.endswith(b"PAR1")):
        raise EscrowError(f"{label} is declared parquet but is not a Parquet file: rename it or convert it")


def _write_atomically(target: Path, payload: bytes) -> None:
    """Write to a temporary name in the target's directory, fsync, then rename over the target."""
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _seal(data: bytes, file_format: str, settings: Settings, key: bytes) -> tuple[Path, str, str]:
    """Encrypt checked plaintext into `<escrow_dir>/<fingerprint>.fernet` (ciphertext only)."""
    digest = fingerprint(data)
    token = _fernet(key).encrypt(data)
    settings.escrow_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    blob = settings.escrow_dir / f"{digest}{BLOB_SUFFIX}"
    _write_atomically(blob, token)
    return blob, digest, file_format


def seal_bytes(data: bytes, file_format: str, settings: Settings, key: bytes) -> tuple[Path, str, str]:
    """Encrypt plaintext already in memory into the escrow; return (blob path, fingerprint, format)."""
    if file_format not in {fmt for _, fmt in SUFFIX_FORMATS}:
        raise EscrowError(f"unknown file format {file_format!r}: expected one of csv, csv.gz, parquet")
    _check_magic(data, file_format, "the data")
    return _seal(data, file_format, settings, key)


def seal_file(path: Path, settings: Settings, key: bytes) -> tuple[Path, str, str]:
    """Encrypt a CSV / CSV.gz / Parquet file into the escrow; return (blob path, fingerprint, format)."""
    path = Path(path)
    file_format = file_format_of(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise EscrowError(f"cannot register {path}: no such file") from exc
    _check_magic(data, file_format, str(path))
    return _seal(data, file_format, settings, key)


def open_blob(blob_path: Path | str, key: bytes, expected_fingerprint: str) -> bytes:
    """Decrypt an escrow blob into memory and check it is the registered plaintext."""
    blob_path = Path(blob_path)
    try:
        token = blob_path.read_bytes()
    except FileNotFoundError as exc:
        raise EscrowError(f"the escrow blob {blob_path} is missing: register the dataset again") from exc
    try:
        data = _fernet(key).decrypt(token)
    except InvalidToken as exc:
        raise EscrowError(
            f"cannot decrypt {blob_path}: wrong escrow key or the blob was altered "
            f"(check DPRELEASE_ESCROW_KEY / the key file, or register the dataset again)"
        ) from exc
    if fingerprint(data) != expected_fingerprint:
        raise EscrowError(
            f"the escrow blob {blob_path} does not match the registered fingerprint (tampered or wrong key)"
        )
    return data


def parse_bytes(data: bytes, file_format: str) -> pd.DataFrame:
    """Parse plaintext bytes from an in-memory buffer (no file is written)."""
    buffer = io.BytesIO(data)
    if file_format == "csv":
        return pd.read_csv(buffer)
    if file_format == "csv.gz":
        return pd.read_csv(buffer, compression="gzip")
    if file_format == "parquet":
        return pd.read_parquet(buffer, engine="pyarrow")
    raise EscrowError(f"unknown file format {file_format!r}: expected one of csv, csv.gz, parquet")


def load_frame(blob_path: Path | str, key: bytes, fingerprint: str, file_format: str) -> pd.DataFrame:
    """Decrypt a registered dataset and parse it, all in memory."""
    return parse_bytes(open_blob(blob_path, key, fingerprint), file_format)
