"""Running a flow from a terminal: start it in this process, wait for *its own* pause, show the
controller's summary and take the decision here (a flag, a prompt, or the no-terminal rule)."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from rich.markdown import Markdown

from dprelease.settings import Settings

console = Console()


def run_release_interactively(settings: Settings, request, *, approve_as: str | None, timeout: int,
                              no_terminal_reviewer: str | None = None) -> dict:
    """Start the flow in this process, show the controller summary, and take the decision here:
    from `approve_as`, a terminal prompt, or (no terminal) `no_terminal_reviewer`. The flow run is
    created first, so this CLI knows its own release (the flow run id) and answers only that one;
    SIGINT or SIGTERM stops it (cli/runs.py)."""
    from flows.approvals import answer
    from flows.release import release_flow

    from . import runs

    params = dict(
        dataset=request.dataset, sql=request.sql, query=request.query, title=request.title,
        epsilon=request.epsilon, pri_p=request.pri.get("p") if request.epsilon_mode == "pri" else None,
        pri_mode=request.pri.get("mode", "public"), pri_beta=float(request.pri.get("beta", 0.5)),
        risk=request.risk or None, delta=request.delta,
        max_partitions_contributed=request.max_partitions_contributed, requested_by=request.requested_by,
        approval_timeout=timeout, poll_interval=1)
    with runs.own_run(settings, release_flow, params, request) as run:
        if run.wait_for_approval():
            summary_file = settings.archive_dir / run.release_id / "controller" / "controller.html"
            console.print(Markdown(_summary_markdown(settings, run.release_id)))
            console.print(f"[dim]controller report (signed, archive only): {summary_file}[/dim]")
            decision, reviewer, comment = _ask(approve_as, no_terminal_reviewer)
            answer(run.flow_run_id, decision, reviewer, comment)
        return run.result()


def _summary_markdown(settings: Settings, release_id: str) -> str:
    path = settings.archive_dir / release_id / "summary.md"
    return path.read_text() if path.exists() else f"Release {release_id} awaits approval."


def _ask(approve_as: str | None, no_terminal_reviewer: str | None) -> tuple[str, str, str]:
    if approve_as:
        return "approve", approve_as, "approved on the command line"
    if not sys.stdin.isatty():
        if no_terminal_reviewer:
            console.print(f"[yellow]no terminal: approved automatically as {no_terminal_reviewer!r}[/yellow]")
            return "approve", no_terminal_reviewer, "no terminal: approved automatically"
        return "reject", "cli", "no terminal to ask and no --approve-as: rejected"
    answer = typer.prompt("Approve this release? [approve/reject]", default="approve").strip().lower()
    reviewer = typer.prompt("Your name (reviewer)", default=os.environ.get("USER", "controller"))
    comment = typer.prompt("Comment", default="")
    return ("approve" if answer.startswith("a") else "reject"), reviewer, comment


def run_utility_interactively(settings: Settings, request, evaluator: str, params: dict, *, timeout: int,
                              no_terminal_reviewer: str | None = None) -> dict:
    """The utility flow in this process; every pause of *its own* run is answered at a prompt (or
    automatically as `no_terminal_reviewer` without a terminal)."""
    from flows.approvals import answer
    from flows.utility import utility_flow

    from . import runs

    flow_params = dict(
        dataset=request.dataset, evaluator=evaluator, evaluator_params=params, sql=request.sql,
        query=request.query, title=request.title, epsilon=request.epsilon, delta=request.delta,
        max_partitions_contributed=request.max_partitions_contributed, requested_by=request.requested_by,
        approval_timeout=timeout, poll_interval=1)
    with runs.own_run(settings, utility_flow, flow_params, request) as run:
        while run.wait_for_approval():
            console.print(Markdown(_pause_description(run.flow_run_id)))
            decision, reviewer, comment = _ask(None, no_terminal_reviewer)
            answer(run.flow_run_id, decision, reviewer, comment)
        return run.result()


def _pause_description(flow_run_id: str) -> str:
    """The markdown shown above the pause form (the summary the controller decides on)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        keyset = run.state.state_details.run_input_keyset or {}
        key = keyset.get("description")
        if key:
            try:
                value = client.read_flow_run_input(flow_run_id, key)
                return str(value).strip('"').encode().decode("unicode_escape")
            except Exception:  # noqa: BLE001 - the description is a convenience
                pass
    return "A decision is needed."
