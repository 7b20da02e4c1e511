"""Where escrow blobs live: a folder of this machine (the default, `<home>/escrow`) or an
S3-compatible object store (`DPRELEASE_ESCROW_URL=s3://bucket/prefix`, through fsspec's s3fs).

A blob's address is what the store records: a local path, or the object's URL. Either way a blob
is only ever ciphertext (stream.py), written under its final name in one step (a local temporary
file renamed; an object-store upload that becomes visible only when complete, and is aborted on
failure) and read back by ranged reads, one chunk at a time: no whole-blob download, no plaintext
anywhere. The object store's endpoint and credentials come from the standard AWS variables
(`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION`), read by
s3fs itself; a store that cannot be reached is one EscrowError line that says what to check.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from .. import object_store
from ..object_store import ObjectStoreMissing, failure, is_object_store
from .errors import EscrowError


def as_address(address: str | Path) -> str | Path:
    """A stored blob address as the escrow reads it: a URL stays a string, anything else is a Path."""
    return address if is_object_store(address) else Path(address)


def _filesystem(url: str):
    """The fsspec filesystem and the path inside it of a blob's or the escrow's URL."""
    try:
        return object_store.filesystem(url)
    except ObjectStoreMissing as err:
        raise EscrowError(f"the escrow at {url}: {err}") from None


def _unreachable(url: str, err: BaseException) -> EscrowError:
    """One line for an object store that failed to answer (network, endpoint, credentials, bucket)."""
    return EscrowError(f"the escrow's object store did not answer for {url} ({failure(err)}): "
                       "check DPRELEASE_ESCROW_URL, AWS_ENDPOINT_URL, the credentials and the network")


def open_for_reading(address: str | Path) -> tuple[BinaryIO, int]:
    """A blob opened for ranged reads, with its size in bytes; a missing blob is an EscrowError
    saying so. An object-store read fetches only the byte ranges asked for (no read-ahead cache:
    the reader asks for whole chunks)."""
    if not is_object_store(address):
        try:
            handle = open(address, "rb")  # noqa: SIM115 - the caller closes it
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise EscrowError(f"the escrow blob {address} is missing: register the dataset again") from None
        return handle, os.fstat(handle.fileno()).st_size
    fs, path = _filesystem(address)
    try:
        size = fs.info(path)["size"]
        handle = fs.open(path, "rb", cache_type="none")
    except FileNotFoundError:
        raise EscrowError(f"the escrow blob {address} is missing: register the dataset again") from None
    except Exception as err:  # botocore's and aiohttp's own errors: the store did not answer
        raise _unreachable(address, err) from None
    return _GuardedReader(handle, address), size


class _GuardedReader:
    """An object-store file whose read errors (the store gone mid-release) are one EscrowError."""

    def __init__(self, handle, address: str):
        self._handle, self._address = handle, address

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def read(self, size: int = -1) -> bytes:
        try:
            return self._handle.read(size)
        except Exception as err:
            raise _unreachable(self._address, err) from None

    def close(self) -> None:
        try:
            self._handle.close()
        except Exception:  # noqa: BLE001 - closing a read handle cannot lose data
            pass


def exists(address: str | Path) -> bool:
    if not is_object_store(address):
        return Path(address).exists()
    fs, path = _filesystem(address)
    try:
        return fs.exists(path)
    except Exception as err:
        raise _unreachable(address, err) from None


def modified(address: str | Path) -> datetime:
    """When the blob was last written (UTC): what DuckDB's readers ask of a file they cache."""
    if not is_object_store(address):
        return datetime.fromtimestamp(Path(address).stat().st_mtime, UTC)
    fs, path = _filesystem(address)
    try:
        return fs.modified(path)
    except FileNotFoundError:
        raise EscrowError(f"the escrow blob {address} is missing: register the dataset again") from None
    except Exception as err:
        raise _unreachable(address, err) from None


def remove(address: str | Path) -> None:
    """Delete a blob if it is there (a registration undoing its own new blob)."""
    if not is_object_store(address):
        Path(address).unlink(missing_ok=True)
        return
    fs, path = _filesystem(address)
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass
    except Exception as err:
        raise _unreachable(address, err) from None


@contextmanager
def new_blob(location: str | Path, name: str) -> Iterator[tuple[BinaryIO, str | Path]]:
    """A writable handle for a new blob named `name` under `location`, and its final address.
    The blob appears under that address only when the block ends without an error: a local file is
    written under a temporary name, synced and renamed; an object-store upload (multipart) is
    completed on success and aborted on failure, so a half-written blob is never visible."""
    if not is_object_store(location):
        folder = Path(location)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        final = folder / name
        fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                yield handle, final
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, final)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        return
    final = f"{location}/{name}"
    fs, path = _filesystem(final)
    try:
        handle = fs.open(path, "wb")
    except Exception as err:
        raise _unreachable(final, err) from None
    try:
        yield _GuardedWriter(handle, final), final
    except BaseException:
        try:
            handle.discard()  # abort the multipart upload: nothing appears in the bucket
        finally:
            handle.closed = True  # discarded: closing would try to upload what is left
        raise
    try:
        handle.close()  # completes the upload: the object appears whole, at once
    except Exception as err:
        raise _unreachable(final, err) from None


class _GuardedWriter:
    """An object-store upload whose write errors are one EscrowError (the block then aborts it)."""

    def __init__(self, handle, address: str):
        self._handle, self._address = handle, address

    def write(self, data) -> int:
        try:
            return self._handle.write(data)
        except Exception as err:
            raise _unreachable(self._address, err) from None

    def flush(self) -> None:
        pass  # s3fs uploads a part when its buffer is full; flushing early would make small parts
