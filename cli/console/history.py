"""Budgets and histories for controllers: per dataset and per series, the cap and what is
committed, reserved and left, a chart of the spending over time, and every release with its state
and its signed reports."""

from __future__ import annotations

import json
import math

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from dprelease.store import StoreError
from dprelease.store import series as store_series

from . import states
from .security import Refused, require
from .views import render

router = APIRouter()

#: the spending chart's drawing area (SVG user units)
CHART_WIDTH, CHART_HEIGHT, CHART_MARGIN = 640, 180, 36


def spending_chart(entries: list, cap: float) -> dict:
    """The cumulative committed epsilon over time as an SVG step line, with the cap as a level:
    points in the chart's coordinates (time left to right, epsilon bottom to top)."""
    committed = sorted((e for e in entries if e.status == "committed"), key=lambda e: e.updated_at)
    top = max(cap, math.fsum(e.epsilon for e in committed), 1e-12)
    height = CHART_HEIGHT - 2 * CHART_MARGIN
    width = CHART_WIDTH - 2 * CHART_MARGIN

    def y(value: float) -> float:
        return round(CHART_MARGIN + height * (1 - value / top), 1)

    points, total = [(CHART_MARGIN, y(0.0))], 0.0
    if committed:
        start = committed[0].updated_at.timestamp()
        span = max(committed[-1].updated_at.timestamp() - start, 1.0)
        for e in committed:
            x = round(CHART_MARGIN + width * (e.updated_at.timestamp() - start) / span, 1)
            points += [(x, y(total))]
            total = math.fsum((total, e.epsilon))
            points += [(x, y(total))]
    points.append((CHART_MARGIN + width, y(total)))
    return {"width": CHART_WIDTH, "height": CHART_HEIGHT, "points": " ".join(f"{x},{yy}" for x, yy in points),
            "cap_y": y(cap), "left": CHART_MARGIN, "right": CHART_MARGIN + width, "bottom": y(0.0),
            "first": committed[0].updated_at if committed else None,
            "last": committed[-1].updated_at if committed else None, "total": total, "cap": cap}


@router.get("/budget", response_class=HTMLResponse)
def budgets(request: Request):
    who = require(request, "controller")
    store = request.app.state.store
    datasets = [store.budget(d.name) for d in store.list_datasets()]
    series = [store_series.series_budget(store, s.name) for s in store_series.list_series(store)]
    return render(request, who, "budget.html", datasets=datasets, series=series)


def release_rows(store, settings, datasets: list[str]) -> list[dict]:
    """The releases of these datasets, newest first, with their state in words, their budget and reports."""
    spent = {e.release_id: e for d in datasets for e in store.ledger_entries(d)}
    releases = []
    for rel in sorted((r for d in datasets for r in store.list_releases(dataset=d)), key=lambda r: r.created_at,
                      reverse=True):
        fields = json.loads(rel.request_json or "{}")
        releases.append({"rel": rel, "label": states.label(rel.status), "title": fields.get("title") or "",
                         "requester": fields.get("requested_by") or "", "entry": spent.get(rel.id),
                         "published": (settings.publication_dir / rel.id / "index.html").exists(),
                         "controller_report": (settings.archive_dir / rel.id / "controller"
                                               / "controller.html").exists()})
    return releases


@router.get("/budget/series/{name}", response_class=HTMLResponse)
def series_history(request: Request, name: str):
    """A series: its budget as its page states it, the spending of all its periods, every release."""
    who = require(request, "controller")
    state = request.app.state
    store, settings = state.store, state.settings
    try:
        budget = store_series.series_budget(store, name)
    except StoreError:
        raise Refused(404, f"there is no series {name!r}") from None
    datasets = [snap.dataset for snap in store_series.snapshots(store, name)]
    entries = [e for d in datasets for e in store.ledger_entries(d)]
    # series_cap: every period spends from one cap; per_snapshot: each period has the cap (the chart's level)
    return render(request, who, "history.html", budget=None, series=budget, dataset=name,
                  chart=spending_chart(entries, budget["epsilon_cap"]),
                  releases=release_rows(store, settings, datasets))


@router.get("/budget/{dataset}", response_class=HTMLResponse)
def dataset_history(request: Request, dataset: str):
    who = require(request, "controller")
    state = request.app.state
    store, settings = state.store, state.settings
    try:
        budget = store.budget(dataset)
    except StoreError:
        raise Refused(404, f"there is no dataset {dataset!r}") from None
    return render(request, who, "history.html", budget=budget, series=None, dataset=dataset,
                  chart=spending_chart(store.ledger_entries(dataset), budget["epsilon_cap"]),
                  releases=release_rows(store, settings, [dataset]))
