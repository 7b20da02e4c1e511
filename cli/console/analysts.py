"""The analysts' side: submit a request (checked as `dprelease request submit` checks it: its form,
and what it asks against the registered datasets, preflight.check_submission), follow
its state, read and download published reports. Nothing of the controller's is shown here."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from dp_core import DPError
from dprelease import preflight
from dprelease.pipeline import Platform
from dprelease.reporting import signing
from dprelease.requests import inbox, signed
from dprelease.store import StoreError

from . import states
from .deciding import waiting_requests
from .security import Refused, check_csrf, form_of, require
from .views import render

router = APIRouter()


def my_requests(store, settings, name: str) -> list[dict]:
    """An analyst's requests, newest first: those waiting in the inbox (proven hers: a file that only
    names her is not), then their releases' states."""
    rows = [{"id": path.stem, "dataset": fields.get("dataset", ""), "title": fields.get("title") or "",
             "label": "Submitted (waiting for a controller)", "published": False}
            for path, fields in waiting_requests(store, settings)
            if fields.get("requested_by") == name and signed.check(store, path).analyst == name]
    for rel in sorted(store.list_releases(), key=lambda r: r.created_at, reverse=True):
        fields = json.loads(rel.request_json or "{}")
        if fields.get("requested_by") == name:
            rows.append({"id": rel.id, "dataset": rel.dataset, "title": fields.get("title") or "",
                         "label": states.label(rel.status), "published": rel.status == "published"})
    return rows


@router.get("/requests", response_class=HTMLResponse)
def requests_page(request: Request):
    who = require(request, "analyst")
    state = request.app.state
    return render(request, who, "requests.html", rows=my_requests(state.store, state.settings, who.name), text="",
                  error="", submitted=request.query_params.get("submitted", ""))


@router.post("/requests", response_class=HTMLResponse)
async def submit_request(request: Request):
    who = require(request, "analyst")
    form = await form_of(request)
    await check_csrf(request, who, form)
    state = request.app.state
    text = form.get("request", "")
    try:
        submitted = inbox.parse_text(text)
        preflight.check_submission(Platform(state.settings, state.store), submitted)
        path = inbox.submit_in_console(state.settings, state.store, submitted, who.name).path
    except (DPError, StoreError) as err:  # what the request asks, refused as its release would refuse it
        return render(request, who, "requests.html", status=400, text=text, error=str(err), submitted="",
                      rows=my_requests(state.store, state.settings, who.name))
    return RedirectResponse(f"/requests?submitted={path.stem}", status_code=303)


#: a series' signed page is published at published/series/<name>/ (dprelease.series.series_directory)
SERIES = "series"


def published(store, settings) -> list[dict]:
    """The published releases (their signed facts), newest first, then each series' signed page."""
    rows = []
    for rel in store.list_releases(status="published"):
        manifest = settings.publication_dir / rel.id / signing.MANIFEST
        if manifest.exists():
            facts = json.loads(manifest.read_text())["facts"]
            rows.append({"id": rel.id, "facts": facts, "files": sorted(json.loads(manifest.read_text())["files"])})
    rows.sort(key=lambda r: r["facts"].get("published_at", ""), reverse=True)
    for manifest in sorted((settings.publication_dir / SERIES).glob(f"*/{signing.MANIFEST}")):
        signed = json.loads(manifest.read_text())
        facts = signed["facts"]
        rows.append({"id": f"{SERIES}/{manifest.parent.name}", "files": sorted(signed["files"]),
                     "facts": {"title": f"{facts.get('title') or facts.get('series')} (every period)",
                               "dataset": f"series {facts.get('series')}", "epsilon": facts.get("epsilon_total")}})
    return rows


@router.get("/published", response_class=HTMLResponse)
def published_page(request: Request):
    who = require(request, "analyst", "controller")
    state = request.app.state
    return render(request, who, "published.html", rows=published(state.store, state.settings))


@router.get("/published/{release_id}/{name:path}")
def published_file(request: Request, release_id: str, name: str):
    """A file of a published, signed release (only the files its manifest lists, and the manifest)."""
    require(request, "analyst", "controller")
    folder = request.app.state.settings.publication_dir / release_id
    if release_id == SERIES and "/" in name:  # a series' page: published/series/<name>/<file>
        series, name = name.split("/", 1)
        if series in ("", ".", ".."):
            raise Refused(404, f"there is no published series {series!r}")
        folder = folder / series
    try:
        listed = json.loads((folder / signing.MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        raise Refused(404, f"release {release_id} is not published") from None
    if name not in listed and name != signing.MANIFEST:
        raise Refused(404, f"{name} is not a file of release {release_id}")
    download = request.query_params.get("download") == "1"
    return FileResponse(folder / name, filename=name.rsplit("/", 1)[-1] if download else None)
