"""Running a flow from a terminal: create *its own* flow run, wait for its pause, show the
controller's summary and take the decision here, signed with the controller's key (a flag, a
prompt, or the no-terminal rule). SIGINT, SIGTERM or a cancel from the UI stop it (cli/runs.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from dprelease.settings import Settings

console = Console()


def run_release_interactively(settings: Settings, request, *, approve_as: str | None, timeout: int,
                              no_terminal_reviewer: str | None = None, controller_key: Path | None = None,
                              risk_override: str = "") -> dict:
    """Start the flow in this process, show the controller summary, and take the decision here,
    signed with the controller's key (`controller_key`, else DPRELEASE_CONTROLLER_KEY): approve
    right away (`approve_as`), a terminal prompt, or (no terminal) approve when
    `no_terminal_reviewer` is given. Without a key the run waits for a decision from elsewhere.
    The flow run is created first, so this command knows its own release (the flow run id) and
    answers only that one."""
    from dprelease.flows.release import answer_here, release_flow
    from dprelease.pipeline import ReleaseError
    from dprelease.requests.epsilon import to_parameter

    from . import runs

    epsilon = to_parameter(request)
    if epsilon is None:  # the pipeline's own words, before any flow run is created
        raise ReleaseError("the request fixes no epsilon: give epsilon, or choose it with {pri: ...} or {risk: ...}")
    params = dict(
        dataset=request.dataset, sql=request.sql, query=request.query, title=request.title, epsilon=epsilon,
        delta=request.delta,
        max_partitions_contributed=request.max_partitions_contributed, requested_by=request.requested_by,
        approval_timeout=timeout, backend=request.backend)
    at_once = bool(approve_as or (no_terminal_reviewer and not sys.stdin.isatty()))  # no person to wait for
    answers_itself = at_once or sys.stdin.isatty()  # else: decided elsewhere, later
    if (controller_key or settings.controller_key) and answers_itself:
        answer_here(at_once)
    with runs.own_run(settings, release_flow, params, request, warm=warm_release_imports) as run:
        if run.wait_for_approval():
            summary_file = settings.archive_dir / run.release_id / "controller" / "controller.html"
            from rich.markdown import Markdown

            console.print(Markdown(_summary_markdown(settings, run.release_id)))
            console.print(f"[dim]controller report (signed, archive only): {summary_file}[/dim]", soft_wrap=True)
            _decide_here(settings, run.release_id, controller_key or settings.controller_key, approve_as,
                         no_terminal_reviewer, risk_override)
        return run.result()


def warm_release_imports() -> None:
    """What a release imports on its way (the report renderer; the checks framework unless its own
    process judges the checks), loaded while a Prefect server this command started boots, not after."""
    from dprelease import checks_judge
    from dprelease.reporting import pages  # noqa: F401

    if not checks_judge.started():
        checks_judge.load_framework()


def where_to_decide(settings: Settings, release_id: str, why: str) -> str:
    """The line a release prints when it cannot ask here: why, and every place its decision can be made
    (the console's decision page, the command line, the Prefect UI), while it waits for the run."""
    return (f"{why}: decide in the console ({settings.console_url}/releases/{release_id}, `dprelease console`), "
            f"with `dprelease approve|reject {release_id} --key YOUR_KEY`, or in the Prefect UI (Resume); "
            "waiting for the run")


def _decide_here(settings: Settings, release_id: str, key: Path | None, approve_as: str | None,
                 no_terminal_reviewer: str | None, risk_override: str = "") -> bool:
    """Ask, sign with the controller's key and send the decision; re-ask when the run refuses it.
    False when nothing was decided here (no key, or no terminal to ask)."""
    from dp_core import risk
    from dprelease import decisions

    from .deciding import decide

    context = decisions.read_context(settings, release_id)
    if context.get("above_tolerance"):
        words = risk.risk_words(float(context["risk"]), risk.level_value(context["max_risk"]))
        console.print(f"[bold red]WARNING: above your tolerable risk[/bold red]: risk {words}; approving needs an "
                      "override with a reason.")
    if key is None:
        line = where_to_decide(settings, release_id, "no controller key (--key or DPRELEASE_CONTROLLER_KEY)")
        console.print(f"[yellow]{escape(line)}[/yellow]", soft_wrap=True)
        return False
    while True:
        decision, comment, override = _ask(approve_as, no_terminal_reviewer, bool(context.get("above_tolerance")),
                                           risk_override)
        if decision is None:
            line = where_to_decide(settings, release_id, "no terminal to ask")
            console.print(f"[yellow]{escape(line)}[/yellow]", soft_wrap=True)
            return False
        try:
            decide(settings, release_id, decision, key, comment, override)
            return True
        except decisions.DecisionRefused as err:
            console.print(f"[red]decision refused:[/red] {err}")
            if approve_as or not sys.stdin.isatty():
                raise


def _summary_markdown(settings: Settings, release_id: str) -> str:
    path = settings.archive_dir / release_id / "summary.md"
    return path.read_text() if path.exists() else f"Release {release_id} awaits approval."


def _ask(approve_as: str | None, no_terminal_reviewer: str | None, above_tolerance: bool = False,
         risk_override: str = "") -> tuple[str | None, str, str]:
    """(decision, reason, risk override): no default; only approve or reject is accepted (asked
    again otherwise); an approval above the tolerable risk needs an override reason."""
    if approve_as:
        return "approve", "approved on the command line", risk_override
    if not sys.stdin.isatty():
        if no_terminal_reviewer:
            console.print(f"[yellow]no terminal: approved automatically as {no_terminal_reviewer!r}[/yellow]")
            return "approve", "no terminal: approved automatically", risk_override
        return None, "", ""
    while True:
        answer = typer.prompt("Approve or reject this release? (type approve or reject)").strip().lower()
        if answer in ("approve", "reject"):
            break
        console.print("please type approve or reject")
    comment = typer.prompt("Reason (recorded)", default="", show_default=False)
    override = ""
    while answer == "approve" and above_tolerance and not override.strip():
        override = typer.prompt("The risk is above your tolerable risk. Reason for approving anyway (override)")
    return answer, comment, override


def run_utility_interactively(settings: Settings, request, evaluator: str, params: dict, *, timeout: int,
                              no_terminal_reviewer: str | None = None, controller_key: Path | None = None) -> dict:
    """The utility flow in this process; every pause of *its own* run is answered here, signed
    with the controller's key (or automatically as `no_terminal_reviewer` without a terminal)."""
    from dprelease.flows.utility import utility_flow

    from . import runs

    flow_params = dict(
        dataset=request.dataset, evaluator=evaluator, evaluator_params=params, sql=request.sql,
        query=request.query, title=request.title, epsilon=request.epsilon, delta=request.delta,
        max_partitions_contributed=request.max_partitions_contributed, requested_by=request.requested_by,
        approval_timeout=timeout, poll_interval=1)
    with runs.own_run(settings, utility_flow, flow_params, request) as run:
        while run.wait_for_approval():
            from rich.markdown import Markdown

            console.print(Markdown(_pause_description(run.flow_run_id)))
            if not _decide_here(settings, run.release_id, controller_key or settings.controller_key, None,
                                no_terminal_reviewer):
                break
        return run.result()


def _pause_description(flow_run_id: str) -> str:
    """The markdown shown above the pause form (the summary the controller decides on)."""
    from dprelease.flows.api_client import api_client

    with api_client() as client:
        run = client.read_flow_run(flow_run_id)
        keyset = run.state.state_details.run_input_keyset or {}
        key = keyset.get("description")
        if key:
            try:
                # the stored input is the description as JSON (orjson: UTF-8, not \u escapes): decoded as
                # JSON, "±" stays "±" (decoding it as unicode_escape made it "Â±")
                value = json.loads(client.read_flow_run_input(flow_run_id, key))
                return value if isinstance(value, str) else str(value)
            except Exception:  # noqa: BLE001 - the description is a convenience
                pass
    return "A decision is needed."
