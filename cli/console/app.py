"""The console application: every route, the role each needs, one clear line for every refusal
(a page, or JSON for the passkey ceremonies' script), and the headers that keep it to itself."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from dprelease.passkeys import RelyingParty
from dprelease.settings import Settings
from dprelease.store import Store

from . import analysts, deciding, dpp, enrolment, history
from .security import Refused, visitor
from .views import render

#: pages may frame only the console's own pages (the controller report on the decision page);
#: scripts only from /static (no inline script: a page cannot be made to run injected code)
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; frame-ancestors 'self'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def create_app(settings: Settings, rp: RelyingParty) -> FastAPI:
    """The console for this home's store and archive, with passkeys for `rp` (its RP id and origin)."""
    app = FastAPI(title="dprelease console", docs_url=None, redoc_url=None, openapi_url=None)
    store = Store(settings.store_url)
    store.create_all()
    app.state.settings, app.state.store, app.state.rp = settings, store, rp
    for module in (enrolment, deciding, history, analysts, dpp):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=str(Path(__file__).with_name("static"))), name="static")

    @app.exception_handler(Refused)
    async def refused(request: Request, err: Refused):
        if _wants_json(request):
            return JSONResponse({"error": err.message}, status_code=err.status)
        if err.status == 401 and request.method == "GET":
            return RedirectResponse(f"/signin?next={request.url.path}", status_code=303)
        return render(request, visitor(request), "message.html", status=err.status, message=err.message)

    @app.exception_handler(StarletteHTTPException)
    async def no_such_page(request: Request, err: StarletteHTTPException):
        """A mistyped address or method: the console's one line, not the framework's JSON."""
        what = (f"there is no page {request.url.path} in the console" if err.status_code == 404 else
                f"{request.url.path} does not answer {request.method} ({err.detail})")
        return await refused(request, Refused(err.status_code, f"{what}: start from the menu above"))

    @app.middleware("http")
    async def headers(request: Request, call_next):
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request):
        who = visitor(request)
        where = {"controller": "/inbox", "analyst": "/requests"}.get(who.role, "/signin")
        return RedirectResponse(where, status_code=303)

    return app


def _wants_json(request: Request) -> bool:
    """The ceremonies' script posts and reads JSON; a browser's page load or form post wants a page."""
    return "application/json" in (request.headers.get("content-type", "") + request.headers.get("accept", ""))
