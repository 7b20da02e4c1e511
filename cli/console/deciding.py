"""The controllers' inbox and decision page, and the passkey-signed decision that resumes the run.

A decision is made in two requests: the page asks for the decision's options (the server writes the
decision it is about to sign: release, question, approve/reject, the controller, the fingerprint of
the signed controller report, time, reason, risk override) and the controller's device signs its
hash with their passkey; the answer is checked here exactly as the flow checks it (decisions.check),
claimed (one decision per question, however many controllers click at once) and handed to the paused
run, which checks it again and records it in the archive."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from dprelease import decisions, passkeys
from dprelease.reporting import signing
from dprelease.requests import inbox as request_inbox
from dprelease.requests import signed as request_signed
from dprelease.store import StoreError, people

from . import states
from .enrolment import challenge_of, credential_of
from .security import Refused, check_csrf, require
from .views import render

router = APIRouter()


def _request_fields(release) -> dict:
    try:
        return json.loads(release.request_json)
    except ValueError:
        return {}


def _context(settings, release_id: str) -> dict:
    try:
        return decisions.read_context(settings, release_id)
    except (decisions.DecisionRefused, ValueError):
        return {}


def inbox_rows(store, settings) -> list[dict]:
    """What waits for a decision, newest first: paused runs (with their epsilon and risk) and
    analysts' requests not yet run (with why one will not run, when it is not proven its analyst's)."""
    epsilon = {e.release_id: e.epsilon for e in store.reserved_entries()}
    rows = []
    for rel in store.list_releases(status="awaiting_approval"):
        fields, context = _request_fields(rel), _context(settings, rel.id)
        rows.append({"kind": "release", "id": rel.id, "dataset": rel.dataset, "title": fields.get("title") or "",
                     "requester": fields.get("requested_by") or "", "epsilon": epsilon.get(rel.id),
                     "risk": context.get("risk"), "above": bool(context.get("above_tolerance")),
                     "at": rel.created_at})
    for path, fields in waiting_requests(store, settings):
        rows.append({"kind": "request", "id": path.stem, "dataset": fields.get("dataset", ""),
                     "title": fields.get("title") or "", "requester": fields.get("requested_by") or "",
                     "refused": request_signed.check(store, path).problem,
                     "epsilon": _fixed(fields.get("epsilon")), "risk": None, "above": False,
                     "at": datetime.fromtimestamp(path.stat().st_mtime, UTC)})
    rows.sort(key=lambda r: r["at"], reverse=True)
    return rows


def _fixed(epsilon):
    """A request's epsilon when it fixes one; None when the platform chooses it (PRI, risk model)."""
    return epsilon if isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool) else None


def waiting_requests(store, settings) -> list:
    """The analysts' requests in the inbox that no release was run from yet."""
    submitted = request_inbox.submitted(settings.inbox_dir)
    if not submitted:
        return []
    runs = request_inbox.runs_by_request(store.release_requests())
    return [(path, fields) for path, fields in submitted if request_inbox.run_of(path, fields, runs) is None]


@router.get("/inbox", response_class=HTMLResponse)
def inbox(request: Request):
    who = require(request, "controller")
    state = request.app.state
    return render(request, who, "inbox.html", rows=inbox_rows(state.store, state.settings))


@router.get("/inbox/requests/{request_id}", response_class=HTMLResponse)
def request_page(request: Request, request_id: str):
    """An analyst's request not run yet: what it asks, whose it is proven to be (signed.check), and how
    to run it (the Prefect UI or the CLI), or why it will not run."""
    who = require(request, "controller")
    state = request.app.state
    found = [(path, fields) for path, fields in request_inbox.submitted(state.settings.inbox_dir)
             if path.stem == request_id]
    if not found:
        raise Refused(404, f"there is no request {request_id!r} in the inbox")
    path, fields = found[0]
    run = request_inbox.run_of(path, fields, request_inbox.runs_by_request(state.store.release_requests()))
    return render(request, who, "request.html", path=path, fields=fields, epsilon=fields.get("epsilon"),
                  text=fields.get("sql") or json.dumps(fields.get("query"), indent=2), run=run,
                  verdict=request_signed.check(state.store, path),
                  label=states.label(run.status) if run else "Submitted (waiting for a controller)")


def _release(store, release_id: str):
    try:
        return store.get_release(release_id)
    except StoreError:
        raise Refused(404, f"there is no release {release_id!r}") from None


def _markdown(text: str) -> str:
    """The controller summary (markdown the pipeline wrote) as HTML; raw HTML in it is escaped."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def _risk_notice_here(context: dict) -> str:
    """The summary's warning above the tolerable risk as this page's form asks it: the override's reason
    has its own field here (the Resume form has none, so the summary's own words send there to the terminal)."""
    return (f"**WARNING: above your tolerable risk.** The risk at this epsilon is {decisions.risk_written(context)}. "
            "Approving needs your reason for the override, in *Why approve above the tolerable risk* below: it is "
            "signed with your decision and recorded in the archive.")


def _risk_notice_decided(context: dict) -> str:
    """The summary's warning once the release is no longer waiting: no field or command to send to."""
    return (f"**WARNING: above your tolerable risk.** The risk at this epsilon is {decisions.risk_written(context)}; "
            "an approval needed a reason for the override (see Decided by above).")


@router.get("/releases/{release_id}", response_class=HTMLResponse)
def release_page(request: Request, release_id: str):
    """The decision page while the release waits; its state, decisions and reports afterwards."""
    who = require(request, "controller")
    state = request.app.state
    settings, store = state.settings, state.store
    rel = _release(store, release_id)
    folder = settings.archive_dir / rel.id
    summary = folder / "summary.md"
    try:
        entry = store.ledger_entry(rel.id)
    except StoreError:
        entry = None
    context = _context(settings, rel.id)
    text = summary.read_text() if summary.exists() else ""
    if context.get("above_tolerance"):  # the summary's warning tells the terminal and the Resume form what to do
        here = _risk_notice_here(context) if rel.status == "awaiting_approval" else _risk_notice_decided(context)
        text = text.replace(decisions.risk_notice(context, rel.id), here)
    return render(request, who, "release.html", rel=rel, fields=_request_fields(rel), label=states.label(rel.status),
                  context=context, entry=entry,
                  risk_written=decisions.risk_written(context) if isinstance(context.get("risk"), int | float) else "",
                  summary=_markdown(text) if text else "",
                  has_controller_report=(folder / "controller" / signing.MANIFEST).exists(),
                  audit=decisions.audit(settings, store, rel.id) if decisions.recorded(settings, rel.id) else [],
                  published=(settings.publication_dir / rel.id / signing.MANIFEST).exists())


@router.get("/releases/{release_id}/controller/{name}")
def controller_file(request: Request, release_id: str, name: str):
    """A file of the signed controller report (controllers only; only the files its manifest lists)."""
    require(request, "controller")
    folder = request.app.state.settings.archive_dir / release_id / "controller"
    try:
        listed = json.loads((folder / signing.MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError):
        raise Refused(404, f"release {release_id} has no signed controller report") from None
    if name not in listed and name != signing.MANIFEST:
        raise Refused(404, f"{name} is not a file of the controller report")
    return FileResponse(folder / name)


def _waiting(store, release_id: str):
    rel = _release(store, release_id)
    if rel.status != "awaiting_approval" or not rel.flow_run_id:
        raise Refused(409, f"release {release_id} is {states.label(rel.status)}, not waiting for a decision: "
                           "nothing was decided")
    return rel


@router.post("/releases/{release_id}/decision/options")
async def decision_options(request: Request, release_id: str):
    """The decision about to be signed, and the WebAuthn options whose challenge is its hash."""
    who = require(request, "controller")
    await check_csrf(request, who)
    state = request.app.state
    settings, store = state.settings, state.store
    try:
        body = await request.json()
        decision, reason, override = body["decision"], str(body.get("reason", "")), str(body.get("risk_override", ""))
    except (ValueError, KeyError, TypeError):
        raise Refused(400, "the request says no decision (approve or reject)") from None
    _waiting(store, release_id)
    context = _context(settings, release_id)
    if decision == "approve" and context.get("above_tolerance") and not override.strip():
        raise Refused(400, f"the risk of release {release_id} is {decisions.risk_written(context)}: approving "
                           "needs your reason in 'Why approve above the tolerable risk'")
    try:
        content = decisions.to_sign(settings, release_id, decision, who.name, reason, override)
    except decisions.DecisionRefused as err:
        raise Refused(400, str(err)) from None
    payload = decisions.payload_of(content)
    challenge = passkeys.decision_challenge(payload)
    people.new_challenge(store, passkeys.b64url(challenge), f"decide:{release_id}", payload.decode())
    allowed = [p.credential_id for p in people.passkeys_of(store, who.name)]
    return JSONResponse({"options": json.loads(passkeys.assertion_options(state.rp, challenge, allowed)),
                         "decision": json.loads(payload)})


@router.post("/releases/{release_id}/decision")
async def decision_made(request: Request, release_id: str):
    """The controller's passkey answer: checked as the flow checks it, claimed once, delivered to the run."""
    who = require(request, "controller")
    await check_csrf(request, who)
    credential = await credential_of(request)
    from starlette.concurrency import run_in_threadpool

    answer = await run_in_threadpool(deliver_decision, request.app.state, who.name, release_id, credential)
    return JSONResponse(answer)


def deliver_decision(state, name: str, release_id: str, credential: dict) -> dict:
    """Check the passkey's answer as the run will (this release, waiting, this question, this report,
    `name`'s registered passkey), claim the question, resume the run and wait until it recorded the
    decision; Refused with one line otherwise (then nothing was resumed, or the run refused it).
    Runs in a worker thread: the store and the run are waited on here, not in the event loop."""
    from dprelease.cli.deciding import deliver

    settings, store = state.settings, state.store
    try:
        challenge = people.take_challenge(store, challenge_of(credential), f"decide:{release_id}")
    except people.ConsoleRefused as err:
        raise Refused(409, f"refused: {err}") from None
    token = passkeys.make_token(challenge.payload.encode(), credential)
    _waiting(store, release_id)
    context = _context(settings, release_id)
    try:
        signed = decisions.check(store, token, release_id=release_id, question=context.get("question", ""),
                                 fingerprint=decisions.report_fingerprint(settings, release_id),
                                 above_tolerance=bool(context.get("above_tolerance")))
    except decisions.DecisionRefused as err:
        raise Refused(409, f"decision refused: {err}") from None
    if signed.controller != name:
        raise Refused(403, f"decision refused: it is {signed.controller}'s, and you are signed in as {name}")
    try:
        people.claim_decision(store, release_id, signed.question, name)
    except people.ConsoleRefused as err:
        raise Refused(409, str(err)) from None
    try:
        status = deliver(settings, release_id, token)
    except Exception as err:  # noqa: BLE001 - the run refused it or could not be resumed: the question is open again
        people.drop_claim(store, release_id, signed.question)
        raise Refused(409, f"decision refused: {err}") from None
    return {"next": f"/releases/{release_id}", "status": status, "decision": signed.decision}
