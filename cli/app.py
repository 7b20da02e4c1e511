"""The `dprelease` command line (typer). Settings come from the environment once (`Settings`).

    dprelease init
    dprelease dataset register adult adult.csv --unit person_id --epsilon-cap 10
    dprelease release request.yaml            # runs the release flow; asks for approval here
    dprelease pending | approve ID --reviewer alice | reject ID --reviewer alice
    dprelease budget | verify DIR | server | demo
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table as RichTable

from dprelease.settings import Settings

from .errors import CommandLine, fail
from .interactive import console, run_release_interactively, run_utility_interactively

app = CommandLine(help="Differentially private releases: register data, request, approve, publish, verify.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
dataset_app = typer.Typer(help="Register and list datasets (encrypted in the escrow).", no_args_is_help=True)
app.add_typer(dataset_app, name="dataset")
policy_app = typer.Typer(help="Standing policies: what a request may ask, and what is approved automatically.",
                         no_args_is_help=True)
app.add_typer(policy_app, name="policy")


@app.callback()
def global_options(debug: bool = typer.Option(False, "--debug", help="show tracebacks and library logs")) -> None:
    """Differentially private releases: register data, request, approve, publish, verify."""


def _settings() -> Settings:
    return Settings.from_env()


def _fail(message: str) -> None:
    fail(message)  # one line on stderr, exit 2 (cli.errors)


@app.command()
def init() -> None:
    """Create the home directory, the escrow and signing keys, and the store.

    Example: DPRELEASE_HOME=/srv/dprelease dprelease init"""
    from dprelease import admin

    for line in admin.init(_settings()):
        console.print(line)


@dataset_app.command("register")
def dataset_register(
    name: str = typer.Argument(..., help="a name for the dataset"),
    path: Path = typer.Argument(..., help="a .csv, .csv.gz or .parquet file"),
    unit: str = typer.Option(..., "--unit", help="the privacy-unit column (one person, device, ...)"),
    epsilon_cap: float = typer.Option(..., help="total epsilon this dataset may ever spend"),
    delta_cap: float = typer.Option(1e-5, help="total delta this dataset may ever spend"),
    add_row_id: bool = typer.Option(False, help="add the unit column as a row number (one row per person)"),
    sensitivity: str = typer.Option("medium", help="harm if the data were exploited: very low ... very high, or 0-1"),
    trust: str = typer.Option("low", help="trust in the recipients of releases: very low ... very high, or 0-1"),
    sensitive_values: int = typer.Option(2, help="values a person's sensitive attribute can take (risk model's n)"),
    max_risk: str = typer.Option("0.2", help="the tolerable risk (level or 0-1)"),
) -> None:
    """Encrypt a file into the escrow and record its fingerprint, unit, caps and data checks.

    Example: dprelease dataset register adult adult.csv.gz --unit person_id --add-row-id --epsilon-cap 10"""
    from dprelease import admin

    profile = {"sensitivity": _level(sensitivity), "trust": _level(trust), "n": sensitive_values,
               "max_risk": _level(max_risk)}
    ds = admin.register_dataset(_settings(), name, path, unit, epsilon_cap, delta_cap, add_row_id=add_row_id,
                                risk_profile=profile)  # its errors: one line from the boundary (cli.errors)
    console.print(escape(f"registered {ds.name!r}: fingerprint {ds.fingerprint[:16]}..., unit {ds.privacy_unit!r}, "
                  f"epsilon cap {ds.epsilon_cap:g}, delta cap {ds.delta_cap:g}"))


def _level(text: str) -> str | float:
    try:
        return float(text)
    except ValueError:
        return text


@dataset_app.command("list")
def dataset_list() -> None:
    """The registered datasets."""
    from dprelease.store import Store

    table = RichTable("name", "unit", "format", "fingerprint", "epsilon cap", "delta cap")
    for ds in Store(_settings().store_url).list_datasets():
        table.add_row(escape(ds.name), escape(ds.privacy_unit), ds.file_format, ds.fingerprint[:16], f"{ds.epsilon_cap:g}", f"{ds.delta_cap:g}")
    console.print(table)


@policy_app.command("add")
def policy_add(
    name: str,
    dataset: str = typer.Option(..., help="the dataset it covers"),
    max_epsilon: float = typer.Option(..., help="the largest epsilon one release may spend"),
    approval: str = typer.Option("manual", help="manual (the controller decides) or auto (approved when within)"),
    analyst: str = typer.Option(None, help="the analyst it covers (default: any)"),
    evaluator: list[str] = typer.Option([], help="an evaluation function the analyst may use (repeatable)"),
) -> None:
    """Add a standing policy. Example: dprelease policy add monthly --dataset adult --max-epsilon 0.1 --approval auto

    Example: dprelease policy add ana --dataset adult --analyst ana --max-epsilon 1 --evaluator spearman_rank"""
    from dprelease.evaluators import catalogue
    from dprelease.store import Store, StoreError

    unknown = set(evaluator) - set(catalogue())
    if unknown:
        _fail(f"unknown evaluator(s) {sorted(unknown)}; the catalogue: {sorted(catalogue())}")
    try:
        Store(_settings().store_url).add_policy(name, dataset, max_epsilon_per_release=max_epsilon,
                                                analyst=analyst, approval=approval, evaluators=list(evaluator))
    except (StoreError, ValueError) as err:
        _fail(str(err))
    console.print(escape(f"policy {name!r}: dataset {dataset!r}, at most epsilon {max_epsilon:g} per release, {approval} approval"))


@policy_app.command("list")
def policy_list(dataset: str) -> None:
    """The policies of a dataset."""
    import json

    from dprelease.store import Store

    table = RichTable("name", "analyst", "max epsilon", "approval", "evaluators")
    for p in Store(_settings().store_url).all_policies(dataset):
        table.add_row(escape(p.name), escape(p.analyst or "any"), f"{p.max_epsilon_per_release:g}", p.approval,
                      ", ".join(json.loads(p.evaluators_json or "[]")))
    console.print(table)


@app.command()
def budget(dataset: str = typer.Argument(None, help="one dataset (default: all)")) -> None:
    """Budget per dataset: cap, committed, reserved, remaining."""
    from dprelease.store import Store

    store = Store(_settings().store_url)
    names = [dataset] if dataset else [d.name for d in store.list_datasets()]
    table = RichTable("dataset", "epsilon cap", "committed", "reserved", "remaining", "delta remaining")
    for name in names:
        b = store.budget(name)
        table.add_row(escape(name), f"{b['epsilon_cap']:g}", f"{b['epsilon_committed']:g}", f"{b['epsilon_reserved']:g}",
                      f"{b['epsilon_remaining']:g}", f"{b['delta_remaining']:.3g}")
    console.print(table)


@app.command()
def verify(directory: Path, key: Path = typer.Option(None, help="the trusted public key (PEM)")) -> None:
    """Check a published release: signature, every file's digest, nothing added or removed.

    Example: dprelease verify ~/.dprelease/published/<release id> --key signing_ed25519.pub.pem"""
    from dprelease.reporting import signing

    trusted = key
    if trusted is None:
        for candidate in (directory.parent / signing.PUBLIC_KEY, _settings().public_key_file):
            if candidate.exists():
                trusted = candidate
                break
    try:
        report = signing.verify_directory(directory, trusted)
    except signing.SigningError as err:
        _fail(str(err))
    if report.ok and trusted is None:
        console.print(f"[yellow]INTACT, SIGNER UNKNOWN[/yellow] {escape(str(directory))}: the files match a signature made with the "
                      "key inside the directory; give --key with the publisher's public key to check who signed")
        raise typer.Exit(1)
    if report.ok:
        console.print(f"[green]OK[/green] {escape(str(directory))}: signed by the trusted key {escape(str(trusted))}, every file intact")
        return
    console.print(f"[red]FAILED[/red] {escape(str(directory))}")
    for problem in report.problems:
        console.print(f"  - {escape(str(problem))}")
    raise typer.Exit(1)


@app.command()
def pending() -> None:
    """Releases waiting for a controller's decision."""
    from dprelease.store import Store

    table = RichTable("release id", "dataset", "created", "flow run")
    for rel in Store(_settings().store_url).list_releases(status="awaiting_approval"):
        table.add_row(escape(rel.id), escape(rel.dataset), str(rel.created_at)[:19], rel.flow_run_id or "")
    console.print(table)


def _resume(release_id: str, decision: str, reviewer: str, comment: str) -> None:
    from dprelease.store import Store
    from flows.approvals import answer

    rel = Store(_settings().store_url).get_release(release_id)
    if rel.status != "awaiting_approval" or not rel.flow_run_id:
        _fail(f"release {release_id} is {rel.status}, not awaiting approval")
    if not reviewer.strip():
        _fail("name the reviewer: --reviewer NAME")
    answer(rel.flow_run_id, decision, reviewer, comment)
    console.print(f"{decision}d release {release_id} (the flow run continues on the Prefect server)")


@app.command()
def approve(release_id: str, reviewer: str = typer.Option(..., help="who decides"), comment: str = "") -> None:
    """Approve a pending release (its flow run, on the Prefect server of PREFECT_API_URL, publishes it)."""
    _resume(release_id, "approve", reviewer, comment)


@app.command()
def reject(release_id: str, reviewer: str = typer.Option(..., help="who decides"), comment: str = "") -> None:
    """Reject a pending release: nothing is published and the budget is refunded."""
    _resume(release_id, "reject", reviewer, comment)


@app.command()
def release(
    spec: Path = typer.Argument(..., help="a release request (.yaml or .json)"),
    approve_as: str = typer.Option(None, help="approve right away as this reviewer (no prompt)"),
    timeout: int = typer.Option(3600, help="seconds to wait for the decision"),
) -> None:
    """Run the release flow for a request and decide here (a prompt), or from the Prefect UI.

    Example: dprelease release examples/request.yaml"""
    from dp_core import DPError
    from dprelease.preflight import check_request
    from dprelease.requests import load_request

    try:
        request = load_request(spec)
        check_request(_settings(), request)  # refused before any flow starts (quick, same message)
        result = run_release_interactively(_settings(), request, approve_as=approve_as, timeout=timeout)
    except DPError as err:
        _fail(str(err))
    console.print(result)


@app.command()
def evaluators() -> None:
    """The catalogue of evaluation functions for utility signaling, with what each reveals."""
    from dprelease.evaluators import catalogue

    table = RichTable("name", "parameters", "what its value on raw data can reveal")
    for name, ev in sorted(catalogue().items()):
        table.add_row(name, ", ".join(ev.params), ev.reveals)
    console.print(table)


@app.command()
def utility(
    spec: Path = typer.Argument(..., help="a release request (.yaml or .json) with a fixed epsilon"),
    evaluator: str = typer.Option(..., help="an evaluator the policy enables (see `dprelease evaluators`)"),
    params: str = typer.Option("{}", help="the evaluator's parameters as JSON"),
    timeout: int = typer.Option(3600, help="seconds to wait for each decision"),
) -> None:
    """Utility signaling: a DP release, then f(DP output) and f(raw output) with three approvals.
    Each decision is asked here (or answered from the Prefect UI / `dprelease approve`).

    Example: dprelease utility request.yaml --evaluator spearman_rank --params '{"column": "people", "other": "hours"}'"""
    import json

    from dp_core import DPError
    from dprelease.preflight import check_request
    from dprelease.requests import load_request

    try:
        evaluator_params = json.loads(params)
    except json.JSONDecodeError as err:
        _fail(f"--params is not valid JSON ({err}): give an object, e.g. '{{\"column\": \"people\"}}'")
    try:
        request = load_request(spec)
        check_request(_settings(), request, evaluator)
        result = run_utility_interactively(_settings(), request, evaluator, evaluator_params, timeout=timeout)
    except (DPError, json.JSONDecodeError) as err:
        _fail(str(err))
    console.print(result)


@app.command()
def server(port: int = 4200) -> None:
    """Start a local Prefect server (analytics off); the UI is the controllers' console."""
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    os.execvpe(sys.executable, [sys.executable, "-m", "prefect", "server", "start", "--port", str(port)], env)


@app.command()
def demo() -> None:
    """The whole path on Adult: a temporary Prefect server, the encrypted dataset, one release
    with epsilon chosen by the platform, the approval, the signed report verified."""
    from dp_core import DPError

    from .demo import run_demo

    try:
        run_demo(console)
    except DPError as err:
        _fail(str(err))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
