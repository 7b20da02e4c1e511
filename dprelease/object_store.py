"""Object-store URLs (s3://bucket/prefix) shared by the escrow and the release archive: which
addresses are object-store URLs, the setting that names one, the fsspec filesystem behind a URL
(s3fs, endpoint and credentials from the standard AWS_* variables) and the words for a store that
did not answer. Each user wraps these failures in its own error (EscrowError, ArchiveError).
"""

from __future__ import annotations

import os
from pathlib import Path

#: the URL schemes of object stores the platform can use (s3fs: AWS S3 and S3-compatible servers)
OBJECT_STORE_SCHEMES = ("s3://",)


class ObjectStoreMissing(Exception):
    """fsspec or s3fs is not installed; the message says what to install."""


def is_object_store(address: str | Path) -> bool:
    """Whether an address (a blob's, a file's, a location's) is an object-store URL, not a local path."""
    return isinstance(address, str) and address.startswith(OBJECT_STORE_SCHEMES)


def location_setting(variable: str, value: str | None, default: str) -> str | None:
    """An environment variable naming an object-store location (s3://bucket/prefix), without a
    trailing slash; None when unset or empty. Anything else is refused in one line naming
    `variable` and what unsetting it means (`default`)."""
    if value is None or not value.strip():
        return None
    url = value.strip()
    if not is_object_store(url) or not url.split("://", 1)[1].strip("/"):
        raise ValueError(f"{variable}={value!r} is not an object-store location: give s3://bucket/prefix "
                         f"(or unset it to keep {default})")
    return url.rstrip("/")


#: one filesystem per (process, scheme, AWS_* variables): see `filesystem`
_FILESYSTEMS: dict[tuple, object] = {}


def filesystem(url: str):
    """The fsspec filesystem (s3fs) and the path inside it of an object-store URL. One per process
    and endpoint/credentials (the AWS_* variables): making one loads botocore's service models and
    opens new connections (8% of a release's CPU when made per call). Its listings are never cached
    (another host may have written since); a forked child makes its own (the pid is in the key)."""
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec is a dependency
        raise ObjectStoreMissing("the object store needs fsspec and s3fs: pip install 'dprelease[s3]'") from None
    scheme = url.split("://", 1)[0]
    key = (os.getpid(), scheme, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    fs = _FILESYSTEMS.get(key)
    if fs is None:
        try:
            fs = fsspec.filesystem(scheme, skip_instance_cache=True, use_listings_cache=False)
        except ImportError:
            raise ObjectStoreMissing(f"{url} needs s3fs: pip install 'dprelease[s3]'") from None
        _FILESYSTEMS[key] = fs
    return fs, fs._strip_protocol(url)


def failure(err: BaseException) -> str:
    """An object store's failure in a few words: its kind and the first line of its message."""
    first = (str(err).splitlines() or [type(err).__name__])[0] or type(err).__name__
    return f"{type(err).__name__}: {first}"
