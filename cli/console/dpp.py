"""The DPP tool in the console (issue 37, the decision-support seed): a controller's page per
analyst request, or a draft, with sliders for trust, sensitivity, tolerable risk and noise, the
noise-against-risk graph, the 3D risk surface, the written summary and each statistic's accuracy;
"use this epsilon" writes the choice into the request. An analyst's request form previews the
accuracy at the epsilon their policy allows. Every number comes from dprelease.decision_support
(the release's own functions), computed here on the server; nothing reads the data or the escrow key."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool

from dprelease import decision_support as tool
from dprelease.pipeline import Platform
from dprelease.requests import ReleaseRequest, RequestError
from dprelease.requests import inbox as request_inbox
from dprelease.requests import signed as request_signed
from dprelease.requests.request import parse_request

from . import states
from .security import Refused, check_csrf, require
from .views import render

router = APIRouter()


def plotly_js() -> Path:
    """plotly.js as the `plotly` package ships it (served by the console: no CDN, no internet)."""
    import plotly

    return Path(plotly.__file__).with_name("package_data") / "plotly.min.js"


@router.get("/vendor/plotly.min.js")
def plotly_script(request: Request):
    require(request, "controller", "analyst")
    return FileResponse(plotly_js(), media_type="text/javascript", headers={"Cache-Control": "private, max-age=86400"})


def _inbox_path(settings, request_id: str) -> Path:
    if not request_id.isalnum():
        raise Refused(404, f"there is no request {request_id!r} in the inbox")
    path = settings.inbox_dir / f"{request_id}.json"
    if not path.exists():
        raise Refused(404, f"there is no request {request_id!r} in the inbox (run already, or never submitted)")
    return path


def _stored_request(settings, request_id: str) -> tuple[Path, dict, ReleaseRequest]:
    """An inbox request: its file, its fields, and the request they make."""
    path = _inbox_path(settings, request_id)
    fields = json.loads(path.read_text())
    try:  # as the inbox stores it (the request's JSON), or in the request format
        return path, fields, ReleaseRequest(**fields) if "epsilon_mode" in fields else parse_request(fields)
    except (TypeError, RequestError) as err:
        raise Refused(400, f"request {request_id} cannot be read: {err}") from None


def _draft(text: str) -> ReleaseRequest:
    try:
        return request_inbox.parse_text(text, "the draft")
    except RequestError as err:
        raise Refused(400, str(err)) from None


def _platform(request: Request) -> Platform:
    state = request.app.state
    return Platform(state.settings, state.store)


@router.get("/dpp", response_class=HTMLResponse)
def draft_page(request: Request):
    """The tool for a draft request (pasted on the page): explore before anyone submits it."""
    who = require(request, "controller")
    return render(request, who, "dpp.html", request_id="", fields={}, start={}, draft=True, problem="")


@router.get("/dpp/{request_id}", response_class=HTMLResponse)
def request_page(request: Request, request_id: str):
    """The tool for an analyst's request waiting in the inbox."""
    who = require(request, "controller")
    _, fields, req = _stored_request(request.app.state.settings, request_id)
    try:
        start, problem = tool.defaults(_platform(request), req), ""
    except tool.ToolError as err:
        start, problem = {}, str(err)
    return render(request, who, "dpp.html", request_id=request_id, fields=fields, start=start, draft=False,
                  problem=problem)


@router.post("/dpp/numbers")
async def numbers(request: Request):
    """The page's numbers for its sliders (JSON in, JSON out), computed by the release's functions."""
    who = require(request, "controller")
    await check_csrf(request, who)
    body = await _json(request)
    settings = request.app.state.settings
    if body.get("request_id"):
        _, _, req = _stored_request(settings, str(body["request_id"]))
    else:
        req = _draft(str(body.get("draft") or ""))
    platform = _platform(request)

    def compute():
        try:
            if body.get("defaults"):  # a draft's starting values (no sliders yet)
                return {"defaults": tool.defaults(platform, req)}
            return tool.numbers(platform, req, tool.Sliders.from_json(body), body.get("whatif") or None)
        except tool.ToolError as err:
            raise Refused(400, str(err)) from None
    return JSONResponse(await run_in_threadpool(compute))


@router.post("/dpp/{request_id}/use")
async def use_epsilon(request: Request, request_id: str):
    """"Use this epsilon": the request's epsilon becomes the risk model's choice for these values
    (trust, sensitivity, tolerable risk, tolerable noise recorded in it), so its run chooses the
    same total epsilon, and its summary and reports show what the page showed."""
    who = require(request, "controller")
    await check_csrf(request, who)
    body = await _json(request)
    settings = request.app.state.settings
    path, fields, req = _stored_request(settings, request_id)
    run = request_inbox.run_of(path, fields, request_inbox.runs_by_request(request.app.state.store.release_requests()))
    if run is not None:  # rewritten, it would be listed as waiting again, and run a second time
        raise Refused(409, f"nothing was written: request {request_id} was run already (release {run.id}, "
                           f"{states.label(run.status)}), with the epsilon its run chose; to ask again, the analyst "
                           "submits it again")
    if (problem := request_signed.check(request.app.state.store, path).problem):  # said before anything is computed
        raise Refused(409, f"nothing was written: {problem}")
    platform = _platform(request)

    def choose():
        try:
            shown = tool.numbers(platform, req, tool.Sliders.from_json(body))
        except tool.ToolError as err:
            raise Refused(400, str(err)) from None
        if not shown["feasible"]:
            raise Refused(400, f"nothing was written: {shown['message']}")
        return shown
    shown = await run_in_threadpool(choose)
    chosen = tool.with_risk(req, shown["risk_fields"])
    try:  # a request file, runnable as is, and still its analyst's
        request_inbox.rewrite_in_console(settings, request.app.state.store, path, chosen.to_spec(), who.name)
    except RequestError as err:
        raise Refused(409, f"nothing was written: {err}") from None
    return JSONResponse({"epsilon": shown["epsilon"], "epsilon_written": shown["epsilon_written"],
                         "summary": shown["summary"], "risk_fields": shown["risk_fields"],
                         "message": f"Request {request_id} now chooses epsilon {shown['epsilon_written']} with the risk "
                                    f"model (recorded by {who.name}): run it from the Prefect UI or with "
                                    f"dprelease release; its summary and reports will show these numbers."})


@router.post("/requests/preview")
async def analyst_preview(request: Request):
    """The accuracy an analyst's request would get, before they submit it (data-free)."""
    who = require(request, "analyst")
    await check_csrf(request, who)
    body = await _json(request)
    req = _draft(str(body.get("request") or ""))
    platform = _platform(request)

    def compute():
        try:
            return tool.analyst_preview(platform, req, who.name)
        except tool.ToolError as err:
            raise Refused(400, str(err)) from None
    return JSONResponse(await run_in_threadpool(compute))


async def _json(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise Refused(400, "the page sent no JSON object") from None
    if not isinstance(body, dict):
        raise Refused(400, "the page sent no JSON object")
    return body
