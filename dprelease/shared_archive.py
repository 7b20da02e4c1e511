"""The release archive and the publications, shared by every host through an object store
(`DPRELEASE_ARCHIVE_URL=s3://bucket/prefix`), so that a worker on another host can finish, recover
or publish a release that one worker began, and a controller's tools read the report they decide on.

Each host keeps its working copy where it always has (`<home>/archive`, `<home>/published`); the
object store holds the same tree (`<url>/archive/...`, `<url>/published/...`) and is the one that
counts: a step pushes what it wrote, and a step that reads what another host may have written pulls
it first. Without DPRELEASE_ARCHIVE_URL every function here does nothing (one machine, as before).

- An object appears whole or not at all (a PUT is atomic).
- A sealed result is created once, never replaced (`push_new`: a conditional PUT, If-None-Match),
  so no second draw of noise can take the place of the first.
- A publication counts when its signed manifest is there: `publish_directory` removes the manifest
  first, writes the files, removes what the new version no longer has, and writes the manifest last
  (the commit marker); a staging copy is pushed before the budget is committed, so that a run killed
  after the commit is finished from the store by `recovery.finish_publication` on any host.
- A store that does not answer is one ArchiveError line saying what to check.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from dp_core.errors import DPError

from .object_store import ObjectStoreMissing, failure, filesystem
from .reporting.signing import MANIFEST
from .settings import Settings


class ArchiveError(DPError):
    """The shared archive cannot be used; the message says what to check."""


def is_shared(settings: Settings) -> bool:
    """Whether the archive and publications live in an object store (DPRELEASE_ARCHIVE_URL is set)."""
    return settings.archive_url is not None


def _store(settings: Settings):
    """The archive's fsspec filesystem and the root path inside it."""
    try:
        return filesystem(settings.archive_url)
    except ObjectStoreMissing as err:
        raise ArchiveError(f"the shared archive at {settings.archive_url}: {err}") from None


def _unreachable(settings: Settings, err: BaseException) -> ArchiveError:
    return ArchiveError(f"the shared archive's object store did not answer for {settings.archive_url} "
                        f"({failure(err)}): check DPRELEASE_ARCHIVE_URL, AWS_ENDPOINT_URL, the credentials, the "
                        "bucket and the network")


def _key(settings: Settings, root: str, local: Path) -> str:
    """The object-store path of a file or folder of the home's archive or publication tree."""
    relative = Path(local).resolve().relative_to(settings.home)
    return f"{root.rstrip('/')}/{relative.as_posix()}"


def check(settings: Settings) -> None:
    """Raise ArchiveError unless the shared archive answers (asked before any budget is reserved)."""
    if not is_shared(settings):
        return
    fs, root = _store(settings)
    bucket = root.split("/", 1)[0]
    try:
        fs.call_s3("head_bucket", Bucket=bucket)  # asked, not `exists`: that one says False for a dead server
        return
    except FileNotFoundError:
        pass
    except Exception as err:  # botocore's and aiohttp's own errors: the store did not answer
        raise _unreachable(settings, err) from None
    raise ArchiveError(f"the shared archive's bucket {bucket!r} does not exist ({settings.archive_url}): create "
                       "it, or fix DPRELEASE_ARCHIVE_URL")


def push(settings: Settings, local: Path) -> None:
    """Copy a file, or every file of a folder, of the home's archive or publications to the store
    (each object replaced whole)."""
    if not is_shared(settings):
        return
    fs, root = _store(settings)
    local = Path(local)
    files = sorted(p for p in local.rglob("*") if p.is_file()) if local.is_dir() else [local]
    try:
        for path in files:
            fs.put_file(str(path), _key(settings, root, path))
    except Exception as err:
        raise _unreachable(settings, err) from None


def push_new(settings: Settings, local: Path) -> bool:
    """Create the file's object only if none is there (a conditional PUT); False when one was
    already there (it is left as it is). For what must never be replaced: a sealed result."""
    if not is_shared(settings):
        return True
    fs, root = _store(settings)
    try:
        fs.pipe_file(_key(settings, root, local), Path(local).read_bytes(), mode="create")
    except FileExistsError:
        return False
    except Exception as err:
        if "PreconditionFailed" in str(err) or "precondition" in str(err).lower():
            return False
        raise _unreachable(settings, err) from None
    return True


def pull(settings: Settings, local: Path) -> None:
    """Bring a file, or every file under a folder, from the store into the home (the store's copy
    replaces this host's); nothing there is nothing to do."""
    if not is_shared(settings):
        return
    fs, root = _store(settings)
    local = Path(local)
    key = _key(settings, root, local)
    try:
        if fs.isfile(key):
            pairs = [(key, local)]
        else:
            pairs = [(found, local / Path(found[len(key) + 1:])) for found in sorted(fs.find(key))]
        for remote, target in pairs:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.pull")
            fs.get_file(remote, str(tmp))
            tmp.replace(target)
    except Exception as err:
        raise _unreachable(settings, err) from None


def remove(settings: Settings, local: Path) -> None:
    """Delete a folder's (or a file's) objects from the store, if any."""
    if not is_shared(settings):
        return
    fs, root = _store(settings)
    key = _key(settings, root, local)
    try:
        found = [key] if fs.isfile(key) else fs.find(key)
        if found:
            fs.rm(found)
    except Exception as err:
        raise _unreachable(settings, err) from None


def publish_directory(settings: Settings, directory: Path) -> None:
    """Put a signed publication folder in place in the store, its manifest last: readers count a
    release as published when its manifest is there, so they never take a half-written version."""
    if not is_shared(settings):
        return
    fs, root = _store(settings)
    key = _key(settings, root, directory)
    files = sorted(p for p in Path(directory).rglob("*") if p.is_file())
    wanted = {_key(settings, root, p) for p in files}
    try:
        if fs.exists(f"{key}/{MANIFEST}"):
            fs.rm_file(f"{key}/{MANIFEST}")  # the old version stops counting before any file changes
        for path in files:
            if path.name != MANIFEST:
                fs.put_file(str(path), _key(settings, root, path))
        stale = [found for found in fs.find(key) if found not in wanted]
        if stale:
            fs.rm(stale)
        fs.put_file(str(Path(directory) / MANIFEST), f"{key}/{MANIFEST}")  # the commit marker
    except Exception as err:
        raise _unreachable(settings, err) from None
