"""The analysts' inbox: requests submitted for a controller to run (from the command line or the
console), one file per request, named by its id (`<home>/inbox/<id>.json`) and written in the
request format, so that `dprelease release` reads it as it reads any request file. The analyst's
name (`--as`, or the console's signed-in analyst) is the request's `requested_by`, whatever the
submitted file said: their policy and the dataset's budget apply when it is released. From the
command line the request is signed with the analyst's own key (`<id>.sig` beside it); the console
records its signed-in analyst's request in the store; a controller's command runs it only once that
is checked (dprelease.requests.signed). A request a controller has decided (published or rejected)
moves to `inbox/decided/`; submitting can neither approve nor read anything of the controller's.
Every analyst may write the inbox folder, so it has the sticky bit (ready_folder): none of them can
delete, rename or rewrite a colleague's request."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import yaml

from ..prefixes import by_prefix
from ..settings import Settings
from ..store import analysts
from . import signed
from .request import ReleaseRequest, RequestError, load_request, parse_request

DECIDED = "decided"  # the inbox's folder of requests a controller has decided


@dataclass(frozen=True)
class Submitted:
    """A request waiting in the inbox."""

    id: str
    path: Path
    request: ReleaseRequest


def parse_text(text: str, where: str = "the request") -> ReleaseRequest:
    """A request from YAML or JSON text (a JSON document is YAML too), checked field by field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RequestError(f"{where}: not valid YAML/JSON: {err}") from None
    try:
        return parse_request(data)
    except RequestError as err:
        raise RequestError(f"{where}: {err}") from None


#: an analyst's epsilon choice that reads the raw data before any approval (docs/privacy.md, "Two modes")
DATA_MODE_REFUSAL = (
    "epsilon.pri.mode: data chooses epsilon from the people's own privacy risk indicators, and whether it "
    "finds one is a fact about the data that you would learn (the release fails) before any controller "
    "approves anything; use mode: public (the default: chosen without the data), a fixed epsilon, or "
    "{risk: ...}")


def submit(settings: Settings, request: ReleaseRequest, analyst: str, key) -> Submitted:
    """Put a checked request in the inbox as `analyst`'s, signed with her private key (a key file's
    path or the key: signed.private_key); written whole or not at all. Where the store can be read, a
    key that is not the one registered for `analyst` is refused at once (signed.check_signer)."""
    private_key = signed.private_key(key)

    def seal(request_id: str, text: bytes) -> None:
        signed.check_signer(settings, analyst, private_key)
        _write_whole(signed.signature_path(settings.inbox_dir / f"{request_id}.json"),
                     signed.sign(request_id, text, analyst, private_key))
    return _write(settings, request, analyst, seal)


def submit_in_console(settings: Settings, store, request: ReleaseRequest, analyst: str) -> Submitted:
    """Put a checked request in the inbox for the analyst signed in to the console (her passkey),
    recorded in the store before the file appears: what makes it hers (signed.check)."""
    return _write(settings, request, analyst, lambda request_id, text: analysts.record_console_submission(
        store, request_id, analyst, hashlib.sha256(text).hexdigest()))


def rewrite_in_console(settings: Settings, store, path: Path, fields: dict, controller: str) -> None:
    """A controller's change to a waiting request in the console (the DPP tool's epsilon), written
    only when the request is proven its analyst's (RequestError saying why otherwise) and recorded
    in the store as the console's, so that it stays hers once changed."""
    verdict = signed.check(store, path)
    if verdict.analyst is None:
        raise RequestError(verdict.problem)
    text = (json.dumps({**fields, "requested_by": verdict.analyst}, indent=2) + "\n").encode()
    analysts.record_console_submission(store, Path(path).stem, verdict.analyst, hashlib.sha256(text).hexdigest(),
                                       controller)
    _write_whole(Path(path), text)


def _write(settings: Settings, request: ReleaseRequest, analyst: str, seal) -> Submitted:
    """Write the request file as `analyst`'s, once `seal(id, its bytes)` kept the proof of who she
    is (or refused). PRI data mode is the controller's (DATA_MODE_REFUSAL): with p = 0 and a row filter that
    selects one person, no candidate passes exactly when that person matches, and the refunded
    failure said so."""
    if not analyst.strip() or analyst != analyst.strip():
        raise RequestError(f"--as takes your name, non-blank without surrounding spaces, got {analyst!r}")
    if request.epsilon_mode == "pri" and request.pri.get("mode") == "data":
        raise RequestError(DATA_MODE_REFUSAL)
    request = replace(request, requested_by=analyst)
    ready_folder(settings.inbox_dir)
    request_id = uuid.uuid4().hex[:12]
    path = settings.inbox_dir / f"{request_id}.json"
    text = (json.dumps(request.to_spec(), indent=2) + "\n").encode()
    seal(request_id, text)
    _write_whole(path, text)
    return Submitted(request_id, path, request)


def _write_whole(path: Path, data: bytes) -> None:
    """Write a file of the inbox in one step (a reader never sees a part of it), writable by its owner
    alone (mode 0644 at most: another analyst of the group cannot rewrite it in place), through a new
    file of a name no one could have made ready for it."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # the umask may only narrow it
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


#: the write bits that let users other than a folder's owner add, delete and rename its files
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def ready_folder(folder: Path) -> None:
    """Create an inbox folder (the inbox, its decided/) if missing, with the sticky bit and the other
    bits the installation chose: in a sticky folder only a file's owner, the folder's owner (the
    controller who owns the home) or root may delete or rename it, so an analyst given write access
    to submit cannot delete or replace a colleague's request. An existing folder gains the bit at its
    owner's next command (`init`, `request submit` or `list`, a decided request's move): only its owner
    may change its mode, so another user's command leaves it, and a controller's `request list` says
    how to fix it (folder_problems). POSIX only: Windows has no sticky bit."""
    folder.mkdir(parents=True, exist_ok=True)
    _make_sticky(folder)


def _make_sticky(folder: Path) -> None:
    """Add the sticky bit to a folder this user owns (or root); leave another user's as it is."""
    if os.name != "posix":
        return
    mode = folder.stat().st_mode
    if not mode & stat.S_ISVTX:
        try:
            os.chmod(folder, stat.S_IMODE(mode) | stat.S_ISVTX)
        except PermissionError:
            pass  # not its owner: folder_problems reports it when others can write it


def folder_problems(settings: Settings) -> list[str]:
    """One line for each existing inbox folder (the inbox, its decided/) that users other than its
    owner may write without the sticky bit (any of them could delete or rename a colleague's
    request), saying how to fix it, once the folders this user owns were given the bit."""
    problems = []
    for folder in (settings.inbox_dir, settings.inbox_dir / DECIDED):
        if os.name != "posix" or not folder.is_dir():
            continue
        _make_sticky(folder)
        mode = folder.stat().st_mode
        if mode & _OTHERS_WRITE and not mode & stat.S_ISVTX:
            problems.append(f"the inbox folder {folder} (mode {stat.S_IMODE(mode):o}) lets other users write it "
                            "without the sticky bit: any analyst could delete or rename another's request; run "
                            f"`chmod +t {folder}` as its owner or root")
    return problems


def waiting(settings: Settings) -> list[Submitted]:
    """The requests in the inbox, oldest first (a file that is not a request is listed with the
    reason in its title, so that a controller sees it rather than misses it)."""
    found = []
    for path in sorted(settings.inbox_dir.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name)):
        try:
            request = read(path)
        except RequestError as err:
            request = ReleaseRequest(dataset="?", title=f"not a request: {err}", sql="")
        found.append(Submitted(path.stem, path, request))
    return found


def read(path: Path) -> ReleaseRequest:
    """The request of an inbox file; a file of an earlier version (the store's record of a request,
    with `epsilon_mode`) is read too, checked as a request file is."""
    path = Path(path)
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        fields = None
    if isinstance(fields, dict) and "epsilon_mode" in fields:
        try:
            return parse_request(ReleaseRequest(**fields).to_spec())
        except (TypeError, RequestError) as err:
            raise RequestError(f"{path}: {err}") from None
    return load_request(path)


def find(settings: Settings, text: str) -> Path | None:
    """The inbox file of a request id or of a prefix only one id starts with; None when no request
    has it (AmbiguousPrefix when several do)."""
    return _find_in(settings.inbox_dir, text, "inbox requests")


def find_decided(settings: Settings, text: str) -> Path | None:
    """The file of a request a controller already decided (inbox/decided/), by its id or a prefix only
    one decided id starts with; None when none has it."""
    return _find_in(settings.inbox_dir / DECIDED, text, "decided inbox requests")


def _find_in(folder: Path, text: str, what: str) -> Path | None:
    if not text or "/" in text or text.startswith("."):
        return None
    found = by_prefix(text, [p.stem for p in folder.glob("*.json")], what)
    return None if found is None else folder / f"{found}.json"


def mark_decided(settings: Settings, path: Path) -> None:
    """Move a request of the inbox that a controller decided out of the waiting list. The sticky inbox
    lets its owner (the controller who owns the home) move an analyst's file; a controller of another
    user id may not, and the request then stays listed, while running it again is still refused (a
    request runs once: its release is found by run_of)."""
    path = Path(path)
    if path.parent.resolve() != settings.inbox_dir.resolve() or not path.exists():
        return
    decided = settings.inbox_dir / DECIDED
    ready_folder(decided)
    try:
        os.replace(path, decided / path.name)
        if (signature := signed.signature_path(path)).exists():
            os.replace(signature, decided / signature.name)
    except PermissionError:
        return


def submitted(inbox_dir: Path) -> list[tuple[Path, dict]]:
    """Every request waiting in the inbox, with its fields as written (files that are not JSON
    objects left out): what the console lists."""
    found = []
    for path in sorted(inbox_dir.glob("*.json")) if inbox_dir.is_dir() else []:
        try:
            fields = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(fields, dict):
            found.append((path, fields))
    return found


def request_key(fields: dict) -> str:
    """What identifies a request whichever way it was stored (an inbox file in the request format,
    a release's request JSON): the request as a release records it, without the empty fields, in
    canonical JSON. A release run from an inbox request has the same key, so the console no longer
    lists the request as waiting."""
    try:
        fields = json.loads(parse_request(fields).to_json())
    except (RequestError, ValueError, TypeError):  # already as a release records it (or not a request)
        pass
    return json.dumps({k: v for k, v in fields.items() if v is not None}, sort_keys=True)


def runs_by_request(releases) -> dict[str, list]:
    """The store's releases (rows of id, status, created_at, request_json: Store.release_requests)
    grouped by their request's key."""
    runs: dict[str, list] = {}
    for row in releases:
        try:
            runs.setdefault(request_key(json.loads(row.request_json)), []).append(row)
        except ValueError:
            continue
    return runs


def run_of(path: Path, fields: dict, runs: dict[str, list]):
    """The newest release run from this inbox file (`runs`: runs_by_request), or None: one of the same
    request created no earlier than the file was last written. The same request submitted again after
    a run (the analyst asking again, as they are told to) is a new file, written after that run: a new
    request, waiting for its own run."""
    try:
        written = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except OSError:
        return None
    after = [row for row in runs.get(request_key(fields), []) if row.created_at >= written]
    return max(after, key=lambda row: row.created_at, default=None)
