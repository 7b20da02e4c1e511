"""The controllers' inbox: analysts' requests waiting for a controller to run them, one JSON file
each in the home's inbox folder. Submitting (from the command line or the console) checks a request
as a release would and writes it there; it can neither approve nor read anything of the controller's."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import yaml

from . import epsilon as epsilon_choice
from .request import ReleaseRequest, RequestError, parse_request


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


def request_file_fields(request: ReleaseRequest) -> dict:
    """The request in the request-file format (what `parse_request` reads back to the same request),
    so that a controller runs an inbox file as it is: `dprelease release INBOX_FILE`."""
    fields = {"dataset": request.dataset, "title": request.title, "epsilon": epsilon_choice.to_parameter(request),
              "delta": request.delta, "max_partitions_contributed": request.max_partitions_contributed,
              "requested_by": request.requested_by}
    fields.update({"sql": request.sql} if request.sql is not None else {"query": request.query})
    if request.backend != "auto":
        fields["backend"] = request.backend
    return fields


def submit(inbox_dir: Path, request: ReleaseRequest, requested_by: str) -> Path:
    """Write the request, as `requested_by`'s, to the inbox; returns its file (its stem is its id)."""
    if not requested_by.strip():
        raise RequestError("a request must say who asks for it (the analyst's name)")
    inbox_dir.mkdir(parents=True, exist_ok=True)
    fields = request_file_fields(request)
    fields["requested_by"] = requested_by
    path = inbox_dir / f"{uuid.uuid4().hex[:12]}.json"
    path.write_text(json.dumps(fields, indent=2))
    return path


def submitted(inbox_dir: Path) -> list[tuple[Path, dict]]:
    """Every request in the inbox, with its fields (files that are not JSON objects left out)."""
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
    """What identifies a request whichever way it was stored (an inbox file in the request-file
    format, a release's request JSON): the request as a release records it, without the empty
    fields, in canonical JSON. A release run from an inbox request has the same key, so the request
    no longer waits."""
    try:
        fields = json.loads(parse_request(fields).to_json())
    except (RequestError, ValueError, TypeError):  # already as a release records it (or not a request)
        pass
    return json.dumps({k: v for k, v in fields.items() if v is not None}, sort_keys=True)
