"""Rendering a page: the Jinja2 templates beside this module, with the visitor and their CSRF token."""

from __future__ import annotations

from pathlib import Path

from fastapi import Request
from fastapi.templating import Jinja2Templates

from .security import Visitor, set_presession_cookie

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).with_name("templates")))


def render(request: Request, who: Visitor, template: str, status: int = 200, **context):
    """The page `template` for this visitor (a new pre-session cookie set when one was made)."""
    response = TEMPLATES.TemplateResponse(request, template, {"who": who, "csrf": who.csrf, **context},
                                          status_code=status)
    fresh = getattr(request.state, "new_presession", None)
    if fresh:
        set_presession_cookie(response, fresh)
    return response
