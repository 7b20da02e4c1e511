"""The escrow key: from DPRELEASE_ESCROW_KEY, or a key file (mode 0600, directory 0700) kept apart
from every data directory; created by `dprelease init`."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.fernet import Fernet

from dprelease.settings import Settings

from .errors import EscrowError

KEY_HINT = "run `dprelease init` or set DPRELEASE_ESCROW_KEY"


# --- keys -----------------------------------------------------------------------------------------


def _checked_key(key: bytes, source: str) -> bytes:
    """Return the key if Fernet accepts it (32 url-safe base64 bytes), else say where it came from."""
    try:
        Fernet(key)
    except (ValueError, TypeError) as exc:
        raise EscrowError(
            f"the escrow key from {source} is not a valid Fernet key (32 url-safe base64-encoded bytes); "
            "generate one with `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`"
        ) from exc
    return key


def _data_dirs(settings: Settings) -> dict[str, Path]:
    """Directories holding data or outputs, where a key file must never live."""
    return {
        "escrow": settings.escrow_dir.resolve(),
        "archive": settings.archive_dir.resolve(),
        "publication": settings.publication_dir.resolve(),
    }


def _refuse_key_in_data_dir(key_file: Path, settings: Settings) -> None:
    """A key stored next to the blobs it protects (or where it would be published) protects nothing."""
    resolved = key_file.expanduser().resolve()
    for label, directory in _data_dirs(settings).items():
        if resolved.is_relative_to(directory):
            raise EscrowError(
                f"the escrow key file {resolved} is inside the {label} directory {directory}: keep keys "
                "apart from the data (set DPRELEASE_KEY_DIR elsewhere) or set DPRELEASE_ESCROW_KEY"
            )


def _read_key_file(key_file: Path) -> bytes:
    """Read the key file, refusing one that other users can read."""
    mode = stat.S_IMODE(key_file.stat().st_mode)
    if mode & 0o077:
        raise EscrowError(
            f"the escrow key file {key_file} is readable by other users (mode {mode:o}): run `chmod 600 {key_file}`"
        )
    return _checked_key(key_file.read_bytes().strip(), str(key_file))


def _create_key_file(key_file: Path) -> bytes:
    """Write a fresh key with mode 0600 in a 0700 directory; if another process won the race, use its key."""
    key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(key_file.parent, 0o700)
    key = Fernet.generate_key()
    try:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_key_file(key_file)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)  # the umask may have narrowed the mode; make it exact
        handle.write(key + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    return key


def load_or_create_key(settings: Settings, create: bool) -> bytes:
    """The escrow key: settings.escrow_key if set, else the key file (created only when `create`)."""
    if settings.escrow_key:
        return _checked_key(settings.escrow_key.strip().encode("ascii", "replace"), "DPRELEASE_ESCROW_KEY")
    key_file = settings.escrow_key_file
    _refuse_key_in_data_dir(key_file, settings)
    if key_file.is_symlink() and not key_file.exists():  # a link to nothing: "does not exist", yet no key can be made
        raise EscrowError(
            f"the escrow key file {key_file} is a symbolic link to {os.readlink(key_file)}, which does not exist: "
            "restore the key there, or remove the link and run `dprelease init` again for a new key (which opens "
            "no dataset sealed with the old one)"
        )
    if key_file.exists():
        return _read_key_file(key_file)
    if not create:
        raise EscrowError(f"no escrow key: {key_file} does not exist; {KEY_HINT}")
    return _create_key_file(key_file)
