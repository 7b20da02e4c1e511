"""The `dprelease` command line (typer). Settings come from the environment once (`Settings`).

    dprelease init
    dprelease dataset register adult adult.csv --unit person_id --epsilon-cap 10
    dprelease release request.yaml            # runs the release flow; asks for approval here
    dprelease controller add alice --private-key alice.pem     # the administrator
    dprelease pending | approve ID --key alice.pem | reject ID --key alice.pem --reason ...
    dprelease analyst key ana --public-key ana.pub.pem          # the administrator registers her key
    dprelease request submit request.yaml --as ana --key ana.pem  # an analyst (prints the request ID)
    dprelease request list | release ID                        # a controller runs it
    dprelease controller add dora --passkey | analyst add ana --passkey | console   # the browser path
    dprelease recover                         # end the releases whose process died (refund or finish)
    dprelease budget | verify DIR | server | demo
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.markup import escape

from dprelease.settings import Settings

from .console import commands as console_commands
from .errors import CommandLine, fail, run_program
from .interactive import console, run_release_interactively, run_utility_interactively
from .outcome_words import outcome_line


def _table(*columns: str, whole: tuple[str, ...] = ()):
    """A table whose `whole` columns (what a person pastes) are never cut (dprelease.cli.tables; loaded when a
    command prints one: `dprelease --help` stays fast)."""
    from .tables import Table

    return Table(*columns, whole=whole)


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


def main() -> None:
    """The `dprelease` program (the console script): the app, then a quick exit (errors.run_program).
    One command per process: a release's checks judge ends once it has answered (checks_judge)."""
    from dprelease import checks_judge

    checks_judge.one_release_per_process()
    run_program(app)


def _settings() -> Settings:
    return Settings.from_env()


def _fail(message: str) -> None:
    fail(message)  # one line on stderr, exit 2 (dprelease.cli.errors)


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
    path: Path = typer.Argument(None, help="a .csv, .csv.gz or .parquet file (sealed into the escrow)"),
    external: str = typer.Option(None, "--external", help="register by reference instead: a Spark table name or a "
                                 "Parquet/CSV lake path, computed on Spark where it lives (nothing is copied)"),
    unit: str = typer.Option(None, "--unit", help="the privacy-unit column (one person, device, ...)"),
    public: bool = typer.Option(False, "--public",
                                help="a public table (no privacy unit, never charged): DP SQL may join it"),
    epsilon_cap: float = typer.Option(None, help="total epsilon this dataset may ever spend"),
    delta_cap: float = typer.Option(1e-5, help="total delta this dataset may ever spend"),
    add_row_id: bool = typer.Option(False, help="add the unit column as a row number (one row per person)"),
    sensitivity: str = typer.Option("medium", help="harm if the data were exploited: very low ... very high, or 0-1"),
    trust: str = typer.Option("low", help="trust in the recipients of releases: very low ... very high, or 0-1"),
    sensitive_values: int = typer.Option(2, help="values a person's sensitive attribute can take (risk model's n)"),
    max_risk: str = typer.Option("0.2", help="the tolerable risk (level or 0-1)"),
    snapshot: str = typer.Option(None, help="register the file as this period of the series NAME (e.g. 2026-11)"),
    series_budget: str = typer.Option(None, help="with the first --snapshot: per_snapshot (disjoint people each "
                                      "period: --epsilon-cap per period) or series_cap (the same people: "
                                      "--epsilon-cap for all periods together)"),
    running_total: Path = typer.Option(None, "--running-total", help="with the first --snapshot of a series_cap "
                                       "series: a YAML file declaring its running total (statistic, horizon, "
                                       "bound, epsilon), charged once for the whole horizon"),
) -> None:
    """Encrypt a file into the escrow and record its fingerprint, unit, caps and data checks.

    Example: dprelease dataset register adult adult.csv.gz --unit person_id --add-row-id --epsilon-cap 10

    Example: dprelease dataset register visits visits-2026-11.csv --snapshot 2026-11

    Example: dprelease dataset register trips --external s3a://lake/trips/ --unit rider_id --epsilon-cap 5

    Example: dprelease dataset register visits --external 's3a://lake/visits/month={snapshot}/' --snapshot 2026-11"""
    from dprelease import admin

    if (path is None) == (external is None):
        _fail("give the file to seal into the escrow, or --external TABLE_OR_PATH (not both)")
    if external is not None and snapshot is None:
        _register_external(name, external, unit, epsilon_cap, delta_cap, add_row_id or public,
                           {"sensitivity": _level(sensitivity), "trust": _level(trust), "n": sensitive_values,
                            "max_risk": _level(max_risk)})
        return

    if snapshot is not None:
        profile = {"sensitivity": _level(sensitivity), "trust": _level(trust), "n": sensitive_values,
                   "max_risk": _level(max_risk)}
        default = {"sensitivity": "medium", "trust": "low", "n": 2, "max_risk": 0.2}
        _register_snapshot(name, path, snapshot, unit, epsilon_cap, delta_cap, add_row_id, series_budget,
                           None if profile == default else profile,  # None: a later snapshot keeps the series'
                           external, _running_total_file(running_total))

        return
    if running_total is not None:
        _fail("--running-total is declared with a series' first snapshot: add --snapshot LABEL --series-budget "
              "series_cap")
    if public == bool(unit):
        _fail("give --unit <column> for a protected dataset, or --public for a public table (not both)")
    if not public and epsilon_cap is None:
        _fail("a protected dataset needs --epsilon-cap (the total epsilon it may ever spend)")
    profile = {"sensitivity": _level(sensitivity), "trust": _level(trust), "n": sensitive_values,
               "max_risk": _level(max_risk)}
    ds = admin.register_dataset(_settings(), name, path, None if public else unit,
                                1.0 if epsilon_cap is None else epsilon_cap, delta_cap, add_row_id=add_row_id,
                                risk_profile=profile)  # its errors: one line from the boundary (dprelease.cli.errors)
    if public:
        console.print(escape(f"registered {ds.name!r}: fingerprint {ds.fingerprint[:16]}..., public (no privacy "
                             "unit, never charged)"))
        return
    console.print(escape(f"registered {ds.name!r}: fingerprint {ds.fingerprint[:16]}..., unit {ds.privacy_unit!r}, "
                  f"epsilon cap {ds.epsilon_cap:g}, delta cap {ds.delta_cap:g}"))
    _offer_in_run_form(quiet=True)


def _offer_in_run_form(quiet: bool) -> None:
    """The dp-release deployment's run form offers the registered datasets (dprelease.flows.release_form),
    on the server of PREFECT_API_URL; after a registration, quietly skipped when there is none."""
    from prefect.settings import PREFECT_API_URL

    from dprelease.flows import release_form

    if not PREFECT_API_URL.value():
        if not quiet:
            _fail("PREFECT_API_URL is not set: point it at the Prefect server that holds the dp-release deployment")
        return
    try:
        updated = release_form.refresh(_settings())
    except Exception as err:  # noqa: BLE001 - the registration is done; the form is a convenience
        if not quiet:
            _fail(f"could not update the run form on {PREFECT_API_URL.value()}: {err}")
        return
    names = ", ".join(release_form.registered_profiles(_settings())) or "none"
    if updated or not quiet:
        console.print(escape(f"run form of {', '.join(updated) or 'no dp-release deployment'}: datasets {names}"))


@app.command("refresh-form")
def refresh_form() -> None:
    """Offer the registered datasets as a list in the dp-release deployment's run form (Prefect UI);
    run it after `prefect deploy` (a registration does it by itself when PREFECT_API_URL is set)."""
    _offer_in_run_form(quiet=False)


def _register_external(name, reference, unit, epsilon_cap, delta_cap, unsupported_option, profile):
    """`dataset register NAME --external REF`: recorded by reference (dprelease.external), checks found by Spark."""
    from dprelease import external

    if unsupported_option:
        _fail("--external registers a protected dataset by reference: --add-row-id and --public need a file "
              "(drop them)")
    if not unit or epsilon_cap is None:
        _fail("an external dataset needs --unit <column> and --epsilon-cap (the total epsilon it may ever spend)")
    ds = external.register_external(_settings(), name, reference, unit, epsilon_cap, delta_cap, risk_profile=profile)
    console.print(escape(f"registered {ds.name!r}: external {ds.file_format.removeprefix('external-')} "
                         f"{ds.blob_path!r} (nothing copied; computed on Spark), unit {ds.privacy_unit!r}, "
                         f"epsilon cap {ds.epsilon_cap:g}, delta cap {ds.delta_cap:g}"))


def _register_snapshot(name, path, snapshot, unit, epsilon_cap, delta_cap, add_row_id, series_budget, profile,
                       external=None, running_total=None):
    """`dataset register NAME FILE --snapshot LABEL`: one period of the series NAME (dprelease.series);
    the default delta cap means 'the series' own' for a later snapshot."""
    from dprelease import series

    ds = series.register_snapshot(_settings(), name, path, snapshot, privacy_unit=unit, budget_mode=series_budget,
                                  epsilon_cap=epsilon_cap, delta_cap=None if delta_cap == 1e-5 else delta_cap,
                                  add_row_id=add_row_id, risk_profile=profile, external=external,
                                  running_total=running_total)
    console.print(escape(f"registered snapshot {snapshot} of series {name!r} as dataset {ds.name!r}: fingerprint "
                         f"{ds.fingerprint[:16]}..., unit {ds.privacy_unit!r}"))
    if running_total is not None:
        console.print(escape(f"running total of series {name!r}: {running_total['statistic']} over "
                             f"{running_total['horizon']} periods, epsilon {float(running_total['epsilon']):g} charged "
                             "once for the whole horizon (no period spends more)"))
        if running_total.get("group_by") and not running_total.get("groups"):
            from dprelease.running_total import DEFAULT_SELECTION_SHARE

            share = float(running_total.get("selection_share", DEFAULT_SELECTION_SHARE))
            console.print(escape(f"its {running_total['group_by']!r} groups are chosen once, privately, from the first "
                                 f"period's data with {share:g} of that budget, and kept for the whole horizon"))


def _running_total_file(path: Path | None) -> dict | None:
    """The --running-total declaration file (YAML or JSON), read; a file that cannot be read is one line."""
    if path is None:
        return None
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        _fail(f"--running-total {path}: cannot be read ({err.__class__.__name__}: {str(err).splitlines()[0]}); "
              "give a YAML file with statistic, horizon, epsilon, delta")
    if not isinstance(data, dict):
        _fail(f"--running-total {path}: expected a mapping of fields (statistic, horizon, epsilon, delta, ...)")
    return data


def _level(text: str) -> str | float:
    try:
        return float(text)
    except ValueError:
        return text


@dataset_app.command("list")
def dataset_list() -> None:
    """The registered datasets."""
    from dprelease.store import Store

    table = _table("name", "unit", "format", "fingerprint", "epsilon cap", "delta cap",
                   whole=("name", "unit", "fingerprint"))
    for ds in Store(_settings().store_url).list_datasets():
        if not ds.privacy_unit:  # a public table: never charged
            table.add_row(escape(ds.name), "public", ds.file_format, ds.fingerprint[:16], "-", "-")
            continue
        table.add_row(escape(ds.name), escape(ds.privacy_unit), ds.file_format, ds.fingerprint[:16],
                      f"{ds.epsilon_cap:g}", f"{ds.delta_cap:g}")
    table.print(console)


@policy_app.command("add")
def policy_add(
    name: str,
    dataset: str = typer.Option(..., help="the dataset it covers (a series: every snapshot, from the latest on)"),
    max_epsilon: float = typer.Option(..., help="the largest epsilon one release may spend"),
    approval: str = typer.Option("manual", help="manual (the controller decides) or auto (approved when within)"),
    analyst: str = typer.Option(None, help="the analyst it covers (default: any)"),
    evaluator: list[str] = typer.Option([], help="an evaluation function the analyst may use (repeatable)"),
    deployment: str = typer.Option(None, help="auto approval: the Prefect deployment whose scheduled runs it approves"),
) -> None:
    """Add a standing policy.

    Example: dprelease policy add monthly --dataset adult --max-epsilon 0.1 --approval auto \\
        --deployment dp-monthly-publication

    Example: dprelease policy add ana --dataset adult --analyst ana --max-epsilon 1 --evaluator spearman_rank"""
    from dprelease.evaluators import catalogue
    from dprelease.store import Store, StoreError

    if approval == "auto" and not deployment:
        _fail("an automatic policy approves only the scheduled runs of one deployment: give --deployment NAME "
              "(e.g. dp-monthly-publication)")
    unknown = set(evaluator) - set(catalogue())
    if unknown:
        _fail(f"unknown evaluator(s) {sorted(unknown)}; the catalogue: {sorted(catalogue())}")
    from dprelease.series import dataset_for_policy

    try:
        dataset = dataset_for_policy(Store(_settings().store_url), dataset)  # a series: its snapshots
        Store(_settings().store_url).add_policy(name, dataset, max_epsilon_per_release=max_epsilon,
                                                analyst=analyst, approval=approval, evaluators=list(evaluator),
                                                deployment=deployment)
    except (StoreError, ValueError) as err:
        _fail(str(err))
    scope = f" of the scheduled runs of {deployment!r}" if approval == "auto" else ""
    console.print(escape(f"policy {name!r}: dataset {dataset!r}, at most epsilon {max_epsilon:g} per release, "
                         f"{approval} approval{scope}"))


@policy_app.command("list")
def policy_list(dataset: str) -> None:
    """The policies of a dataset."""
    import json

    from dprelease.store import Store

    table = _table("name", "analyst", "max epsilon", "approval", "evaluators", whole=("name", "analyst"))
    for p in Store(_settings().store_url).all_policies(dataset):
        table.add_row(escape(p.name), escape(p.analyst or "any"), f"{p.max_epsilon_per_release:g}",
                      f"{p.approval} ({p.deployment})" if p.deployment else p.approval,
                      ", ".join(json.loads(p.evaluators_json or "[]")))
    table.print(console)


@app.command()
def budget(dataset: str = typer.Argument(None, help="one dataset (default: all)")) -> None:
    """Budget per dataset: cap, committed, reserved, remaining (a public table: none, never charged)."""
    from dprelease.reporting.budget_table import budget_rows
    from dprelease.store import Store

    store = Store(_settings().store_url)
    names = [dataset] if dataset else [d.name for d in store.list_datasets()]
    table = _table("dataset", "epsilon cap", "committed", "reserved", "remaining", "delta remaining",
                   whole=("dataset",))
    for name in names:
        if not store.get_dataset(name).privacy_unit:  # a public table has no budget: never charged
            table.add_row(escape(name), "public", "-", "-", "-", "-")
            continue
        epsilon, delta = budget_rows(store.budget(name))
        table.add_row(escape(name), epsilon["cap"], epsilon["committed"], epsilon["reserved"], epsilon["remaining"],
                      delta["remaining"])
    table.print(console)
    if not dataset:
        _series_budgets(store)


def _series_budgets(store) -> None:
    """The series' budgets: per period (parallel composition) or one cap for all (sequential)."""
    from dprelease.store import series as store_series

    store.create_all()
    table = _table("series", "budget", "epsilon cap", "periods", "total epsilon", "remaining", whole=("series",))
    for s in store_series.list_series(store):
        b = store_series.series_budget(store, s.name)
        per_period = b["mode"] == "per_snapshot"
        table.add_row(escape(s.name), "per period (parallel)" if per_period else "series cap (sequential)",
                      f"{b['epsilon_cap']:g}" + (" each" if per_period else ""), str(len(b["per_period"])),
                      f"{b['epsilon_total']:g}", "-" if per_period else f"{b['epsilon_remaining']:g}")
    if table.row_count:
        table.print(console)
    for s in store_series.list_series(store):
        total = store_series.series_budget(store, s.name).get("running_total")
        if total:
            console.print(escape(f"series {s.name!r}: its running total spent epsilon {total['epsilon']:g}, delta "
                                 f"{total['delta']:g} once for its horizon of {total['horizon']} periods (in the "
                                 "total above)"))


@app.command()
def verify(directory: Path,
           key: Path = typer.Option(None, help="the publisher's public key (PEM), obtained out of band; a key "
                                               "inside the publication is never trusted")) -> None:
    """Check a published release: signature, every file's digest, nothing added or removed.

    Without --key the files can only be checked against the key shipped with them, which proves
    integrity but not who signed: the command says so and exits 1.

    Example: dprelease verify ~/.dprelease/published/<release id> --key publisher.pub.pem"""
    from dprelease.reporting import signing

    try:
        report = signing.verify_directory(directory, key)
        shipped = directory / signing.PUBLIC_KEY
        shipped_fp = signing.key_fingerprint(shipped) if shipped.is_file() else None
    except signing.SigningError as err:
        _fail(str(err))
    if not report.ok:
        console.print(f"[red]FAILED[/red] {escape(str(directory))}")
        for problem in report.problems:
            console.print(f"  - {escape(str(problem))}")
        raise typer.Exit(1)
    if not _decisions_verify(directory):
        raise typer.Exit(1)
    if key is None or signing.shipped_with(directory, key):
        given = "" if key is None else f" (the key you gave, {key}, is shipped with the publication)"
        console.print(f"[yellow]intact, signer not established[/yellow] {directory}: the files match a signature "
                      f"made with the key shipped inside the publication{given} (fingerprint {shipped_fp}), which "
                      "anyone could have replaced. Get the publisher's public key out of band, check its fingerprint, "
                      f"and pin it: dprelease verify {directory} --key PUBLISHER_KEY.pem")
        raise typer.Exit(1)
    console.print(f"[green]OK[/green] {directory}: signed by the key you gave ({signing.key_fingerprint(key)}), "
                  "every file intact")


def _decisions_verify(directory: Path) -> bool:
    """With the home's archive at hand (a controller or auditor), the release's recorded decisions are
    checked too, each from the key or passkey the store registered for its controller; say each."""
    from dprelease import decisions
    from dprelease.store import Store

    settings = _settings()
    if not (settings.archive_dir / directory.name / decisions.DECISION_FILE).is_file():
        return True
    lines = decisions.audit(settings, Store(settings.store_url), directory.name)
    for ok, line in lines:
        verdict = "[green]OK[/green]" if ok else "[red]FAILED[/red]"
        console.print(f"  decision: {verdict} {escape(line)}", highlight=False)
    return all(ok for ok, _ in lines)


@app.command()
def pending() -> None:
    """Releases waiting for a controller's decision."""
    from dprelease import recovery
    from dprelease.store import Store

    store = Store(_settings().store_url)
    store.create_all()
    table = _table("release id", "dataset", "created", "flow run", "run", whole=("release id", "dataset", "flow run"))
    for rel in store.list_releases(status="awaiting_approval"):
        alive, why = recovery.run_is_alive(store, rel)
        table.add_row(escape(rel.id), escape(rel.dataset), str(rel.created_at)[:19], rel.flow_run_id or "",
                      why if alive else f"dead: {why} (dprelease recover)")
    table.print(console)


def _decide(release_id: str, decision: str, key: Path | None, reason: str, override_risk: str) -> None:
    """Sign and send a decision on exactly this release; say the truth when no process runs it."""
    from dprelease import decisions, pipeline, recovery
    from dprelease.flows.approvals import cancel_flow_run
    from dprelease.store import StoreError

    from .deciding import decide

    settings = _settings()
    platform = pipeline.Platform.open(settings)
    release_id = _release_id(platform.store, release_id)
    try:
        rel = platform.store.get_release(release_id)
    except StoreError as err:
        _fail(str(err))
    if rel.status != "awaiting_approval" or not rel.flow_run_id:
        _fail(f"release {release_id} is {rel.status}, not awaiting approval")
    key = key or settings.controller_key
    if key is None:
        _fail("a decision is signed with your controller key: give --key YOUR_KEY.pem "
              "(or set DPRELEASE_CONTROLLER_KEY)")
    from . import prefect_server

    alive, why = recovery.run_is_alive(platform.store, rel)
    if not alive:  # a pause with no process behind it: resuming it would do nothing
        done = recovery.stop(platform, release_id, f"its run is dead ({why}); found by `{decision}`")
        prefect_server.attach_for_corrections()
        cancel_flow_run(rel.flow_run_id, done.reason)
        console.print(f"[red]error:[/red] nothing was {decision}d: {escape(done.line())}", highlight=False)
        raise typer.Exit(1)
    try:
        attached = prefect_server.attach_running()  # the home's local server, where the run waits
    except prefect_server.ServerUnavailable as err:
        _fail(f"release {release_id} waits in a live run ({why}), but {err}")
    if not attached:
        _fail(f"release {release_id} waits in the command that runs it ({why}), on that command's temporary "
              "Prefect server (DPRELEASE_PREFECT_SERVER=temporary): answer at its prompt; to answer from another "
              "terminal, leave DPRELEASE_PREFECT_SERVER unset (the home's local server) or run a shared server")
    try:
        asked = decisions.read_context(settings, release_id)["question"]
        decide(settings, release_id, decision, key, reason, override_risk)
    except (decisions.DecisionRefused, Exception) as err:  # noqa: BLE001 - one line for every refusal
        _fail(f"decision refused: {err}")
    final = _outcome(platform, release_id, asked)
    if final is None:
        console.print(f"{decision} of release {release_id} accepted: its flow run continues (status: "
                      f"{platform.store.get_release(release_id).status})")
    elif final.status in ("published", "rejected"):
        where = f" to {platform.settings.publication_dir / release_id}" if final.status == "published" else ""
        console.print(f"{decision} of release {release_id} accepted: {final.status}{where}", highlight=False)
    else:
        console.print(f"[red]error:[/red] {decision} of release {release_id} accepted, but it ended {final.status}: "
                      f"{escape(final.decision_comment or '')}", highlight=False)
        raise typer.Exit(1)


def _release_id(store, text: str) -> str:
    """A release id as a person pastes it to decide it: whole, or any start of it that only one release
    waiting for a decision has (a series run's releases share their run's id: `<run>` and
    `<run>@2026-04`), else only one release has (an unknown one is left for the store to name; an
    ambiguous one is refused)."""
    from dprelease.prefixes import by_prefix

    store.create_all()
    releases = store.list_releases()
    waiting = [r.id for r in releases if r.status == "awaiting_approval"]
    if text not in {r.id for r in releases} and sum(i.startswith(text) for i in waiting) == 1:
        return by_prefix(text, waiting, "releases waiting for a decision")
    return by_prefix(text, (r.id for r in releases), "releases") or text


def _outcome(platform, release_id: str, asked: str):
    """The release once its run has acted on the decision (a final status), or None when the run
    asks its next question (the utility signal's) or has died. No deadline of its own: while the run
    lives it is on its way (at load, publishing takes minutes)."""
    import time

    from dprelease import decisions, recovery
    from dprelease.store import FINAL_STATUSES

    while True:
        alive, _ = recovery.run_is_alive(platform.store, platform.store.get_release(release_id))
        rel = platform.store.get_release(release_id)  # read after: a run that finished, then ended, is seen finished
        if rel.status in FINAL_STATUSES:
            return rel
        if not alive or (rel.status == "awaiting_approval"
                         and decisions.read_context(platform.settings, release_id)["question"] != asked):
            return None
        time.sleep(0.5)


@app.command()
def recover() -> None:
    """End the releases whose run died (a killed worker or command): refund and mark them failed,
    or finish a publication the controller had approved. Runs that are alive are left alone.

    Example: dprelease recover"""
    from dprelease import pipeline, recovery
    from dprelease.flows.approvals import cancel_flow_run

    from . import prefect_server

    platform = pipeline.Platform.open(_settings())
    done = recovery.sweep(platform)  # the store first: the budget never waits for Prefect
    for item in done:
        console.print(f"recovered {item.line()}", highlight=False, markup=False)
    stopped = [item for item in done if item.flow_run_id and item.outcome != "published"]
    if stopped:
        prefect_server.attach_for_corrections()  # their runs marked Cancelled on the home's local server too
        for item in stopped:
            cancel_flow_run(item.flow_run_id, item.reason)
    alive = [r for r in recovery.unfinished(platform.store) if recovery.run_is_alive(platform.store, r)[0]]
    console.print(f"{len(done)} release(s) recovered; {len(alive)} running", highlight=False)


_KEY_HELP = "your controller private key (default: DPRELEASE_CONTROLLER_KEY)"


_RELEASE_ID_HELP = "the release id (`dprelease pending`), or any start of it that only one release has"


@app.command()
def approve(release_id: str = typer.Argument(..., help=_RELEASE_ID_HELP),
            key: Path = typer.Option(None, help=_KEY_HELP),
            reason: str = typer.Option("", "--reason", "--comment", help="why (recorded in the archive)"),
            override_risk: str = typer.Option("", help="required when the risk is above your tolerable risk: "
                                              "the reason for approving anyway (recorded)")) -> None:
    """Approve a pending release with your signed decision (its flow run publishes it).

    Example: dprelease approve 3f2a... --key ~/.dprelease-controller/alice.pem --reason "checked" """
    _decide(release_id, "approve", key, reason, override_risk)


@app.command()
def reject(release_id: str = typer.Argument(..., help=_RELEASE_ID_HELP),
           key: Path = typer.Option(None, help=_KEY_HELP),
           reason: str = typer.Option("", "--reason", "--comment", help="why (recorded in the archive)")) -> None:
    """Reject a pending release with your signed decision: nothing is published, the budget is refunded.

    Example: dprelease reject 3f2a... --key ~/.dprelease-controller/alice.pem --reason "too fine" """
    _decide(release_id, "reject", key, reason, "")


decision_app = typer.Typer(help="Signed decisions (for the Prefect UI's Resume form).", no_args_is_help=True)
app.add_typer(decision_app, name="decision")


@decision_app.command("sign")
def decision_sign(release_id: str = typer.Argument(..., help=_RELEASE_ID_HELP),
                  decision: str = typer.Argument(..., help="approve or reject"),
                  key: Path = typer.Option(None, help=_KEY_HELP), reason: str = typer.Option("", help="why"),
                  override_risk: str = typer.Option("", help="reason for approving a risk above the tolerable "
                                                    "risk")) -> None:
    """Print your signed decision, to paste into the Resume form of the paused run in the Prefect UI.

    Example: dprelease decision sign 3f2a... approve --key alice.pem --reason checked"""
    from dprelease import decisions
    from dprelease.store import Store

    key = key or _settings().controller_key
    if key is None:
        _fail("give --key YOUR_KEY.pem (or set DPRELEASE_CONTROLLER_KEY)")
    try:
        release_id = _release_id(Store(_settings().store_url), release_id)
        print(decisions.sign_for_release(_settings(), release_id, decision, key, reason, override_risk))
    except Exception as err:  # noqa: BLE001 - one line for every refusal
        _fail(str(err))


controller_app = typer.Typer(help="Controllers: who may decide releases (administrator).", no_args_is_help=True)
app.add_typer(controller_app, name="controller")


@controller_app.command("add")
def controller_add(name: str,
                   private_key: Path = typer.Option(None, help="write a new key pair here (the controller keeps it)"),
                   public_key: Path = typer.Option(None, help="or register this existing public key (PEM)"),
                   passkey: bool = typer.Option(False, "--passkey", help="or print a one-time link with which they "
                                                "register a passkey for the console (`dprelease console`)")) -> None:
    """Register a controller: their public key goes into the store; only they can sign decisions.

    Example: dprelease controller add alice --private-key ~/.dprelease-controller/alice.pem
             dprelease controller add alice --passkey"""
    from dprelease import decisions

    if passkey and private_key is None and public_key is None:
        return console_commands.enrolment_link(name, "controller")
    fingerprint = _register_key(private_key, public_key, lambda path: decisions.create_controller(
        _settings(), name, path), lambda path: decisions.register_controller(_settings(), name, path))
    where = f"; private key {private_key} (keep it to yourself)" if private_key else ""
    console.print(escape(f"controller {name!r} registered: key {fingerprint}{where}"), soft_wrap=True, highlight=False)


def _register_key(private_key: Path | None, public_key: Path | None, create, register):
    """What registering a person's key returns: a new key pair written at `private_key` (`create`),
    or the public key file given (`register`); one line for every problem."""
    if (private_key is None) == (public_key is None):
        _fail("give one of --private-key PATH (create a key pair) or --public-key PATH (register a key)")
    try:
        return create(private_key) if private_key is not None else register(public_key)
    except Exception as err:  # noqa: BLE001 - one line for every registration problem
        _fail(str(err))


@console_commands.analyst_app.command("key")
def analyst_key(name: str,
                public_key: Path = typer.Option(None, help="register the public key (PEM) the analyst handed you"),
                private_key: Path = typer.Option(None, help="or write a new key pair here (hand the analyst its "
                                                 "private key, out of band)")) -> None:
    """Register an analyst's command-line key: a request in the inbox counts as theirs only when it is
    signed with it (`dprelease request submit FILE --as NAME --key THEIR_KEY.pem`). Registering
    again replaces the key (a lost one): requests signed with the old key no longer count.

    Example: dprelease analyst key ana --public-key ana.pub.pem"""
    from dprelease.requests import signed

    fingerprint, replaced = _register_key(private_key, public_key, lambda path: signed.create_key(
        _settings(), name, path), lambda path: signed.register_key(_settings(), name, path))
    where = f"; private key {private_key} (hand it to {name} alone)" if private_key else ""
    again = " (replacing the key registered before: requests signed with it no longer count)" if replaced else ""
    console.print(escape(f"analyst {name!r}: key {fingerprint} registered{again}{where}"), soft_wrap=True,
                  highlight=False)


@controller_app.command("list")
def controller_list() -> None:
    """The registered controllers and their key fingerprints."""
    from dprelease.reporting import signing
    from dprelease.store import Store

    table = _table("name", "key fingerprint", "added", whole=("name", "key fingerprint"))
    for c in Store(_settings().store_url).list_controllers():
        table.add_row(escape(c.name), signing.key_fingerprint(c.public_key_pem.encode()), str(c.added_at)[:19])
    console_commands.people_rows(table, "controller")
    table.print(console)


app.add_typer(console_commands.analyst_app, name="analyst")  # the console's people and the console itself
app.command("console")(console_commands.console)


request_app = typer.Typer(help="Analysts' channel: submit a request to the controllers' inbox.", no_args_is_help=True)
app.add_typer(request_app, name="request")


@request_app.command("submit")
def request_submit(spec: Path = typer.Argument(..., help="a release request (.yaml or .json)"),
                   requested_by: str = typer.Option(..., "--as", help="your name (the analyst): the request's "
                                                    "requested_by, whose policy applies"),
                   key: Path = typer.Option(None, envvar="DPRELEASE_ANALYST_KEY", help="your analyst private key, "
                                            "whose public key a controller registered for your name (`dprelease "
                                            "analyst key`); the request is signed with it")) -> None:
    """Submit a request to the controllers' inbox, signed with your key; a controller runs it
    (`dprelease release ID`) and decides. Submitting can neither approve nor read anything of the
    controller's.

    Example: dprelease request submit request.yaml --as ana --key ~/.dprelease-analyst/ana.pem"""
    from dprelease.requests import inbox, load_request

    settings = _settings()
    request = load_request(spec)  # its errors: one line from the boundary, in `release`'s words (cli/errors.py)
    _check_submission(settings, request)
    if key is None:
        _fail(f"a request is signed with your analyst key: give --key YOUR_KEY.pem (or DPRELEASE_ANALYST_KEY), the "
              f"private key whose public key a controller registered for you (`dprelease analyst key "
              f"{requested_by} --public-key YOUR_KEY.pub.pem`)")
    submitted = inbox.submit(settings, request, requested_by, key)
    console.print(escape(f"submitted request {submitted.id} to the controllers' inbox as {requested_by!r}: a "
                         f"controller runs it with `dprelease release {submitted.id}`"), soft_wrap=True,
                  highlight=False)


def _check_submission(settings: Settings, request) -> None:
    """Refuse at once a request its release would refuse for what it asks (preflight.check_submission),
    where this home's store can be read; an analyst given the inbox alone (the guide's set-up) has
    it checked when a controller runs it."""
    from dprelease.store.database import readable_here

    if not readable_here(settings.store_url):
        return
    from dprelease import pipeline, preflight  # 0.7 s to import: not for an analyst given the inbox alone
    from dprelease.store import Store

    preflight.check_submission(pipeline.Platform(settings, Store(settings.store_url)), request)


@request_app.command("list")
def request_list() -> None:
    """The requests waiting in the inbox, each with whose it is proven to be (a controller runs one
    with `dprelease release ID`; one that is not proven is refused, said below the table), and an
    inbox folder analysts could delete each other's requests in (not sticky) with how to fix it."""
    from dprelease.requests import inbox, signed
    from dprelease.store.database import readable_here
    from dprelease.store.opened import opened_store

    settings = _settings()
    # its tables created: a store of an earlier version gains those of analysts' keys
    store = opened_store(settings.store_url) if readable_here(settings.store_url) else None
    table = _table("id", "dataset", "title", "requested by", "signed", "epsilon",
                   whole=("id", "dataset", "requested by"))
    refused = []
    for entry in inbox.waiting(settings):
        r = entry.request
        epsilon = f"{r.epsilon:g}" if r.epsilon_mode == "fixed" and r.epsilon is not None else r.epsilon_mode
        verdict = signed.check(store, entry.path) if store is not None else None
        if verdict is not None and verdict.analyst is None:
            refused.append(verdict.problem)
        proven = ("not checked (no store here)" if verdict is None else "REFUSED (below)" if verdict.analyst is None
                  else {"key": "with their key", "console": "in the console"}[verdict.how])
        table.add_row(escape(entry.id), escape(r.dataset), escape(r.title), escape(r.requested_by or ""), proven,
                      epsilon)
    table.print(console)
    for problem in refused + inbox.folder_problems(settings):
        console.print(escape(problem), soft_wrap=True, highlight=False)
    console.print(escape(f"inbox: {settings.inbox_dir} (run a request with `dprelease release ID`)"), soft_wrap=True,
                  highlight=False)


@app.command()
def release(
    spec: Path = typer.Argument(..., help="a release request (.yaml or .json), or the id of a request in the "
                                "analysts' inbox (`dprelease request list`; any unique start of it)"),
    approve_as: str = typer.Option(None, help="approve right away (no prompt) as this controller, signed with "
                                   "their key (--key)"),
    timeout: int = typer.Option(3600, help="seconds to wait for the decision"),
    key: Path = typer.Option(None, help=_KEY_HELP),
    override_risk: str = typer.Option("", help="with --approve-as: the reason for approving a risk above the "
                                      "tolerable risk"),
) -> None:
    """Run the release flow for a request and decide here (a prompt), or from the Prefect UI.

    Example: dprelease release examples/request.yaml

    Example: dprelease release 3f2a9c1e5b7d     # a request an analyst submitted to the inbox"""
    from dp_core import DPError
    from dprelease import checks_judge

    from . import prefect_server

    checks_judge.start_ahead()  # first of all: great-expectations' import (1.5 s) runs beside the rest
    try:
        settings = _settings()
        prefect_server.check_mode()
        request, inbox_file = _read_request(settings, spec)
        _keep_checks_judge(request)
        prefect_server.start()  # without a shared server, this command's own boots (2.6 s) beside the rest
        if prefect_server.own_server_started():
            checks_judge.yield_cpu()  # the flow waits for the server first, for the judge after it
        from dprelease.preflight import check_request  # the pipeline: 0.7 s to import

        from .deciding import refuse_before_start

        check_request(settings, request)  # refused before any flow starts (quick, same message)
        if inbox_file is not None:
            _refuse_a_request_run_already(settings, inbox_file)
        key = key or settings.controller_key
        preview = _preview(settings, request)
        refuse_before_start(settings, approve_as, key, override_risk, preview and preview[1])
        if preview:
            from rich.markdown import Markdown

            console.print(Markdown(preview[0]))
        result = run_release_interactively(settings, request, approve_as=approve_as, timeout=timeout,
                                           controller_key=key, risk_override=override_risk)
    except DPError as err:
        _fail(str(err))
    finally:
        checks_judge.not_needed()  # unused when the release was refused
    if inbox_file is not None and result.get("status") in ("published", "rejected"):
        from dprelease.requests import inbox

        inbox.mark_decided(settings, inbox_file)
    console.print(outcome_line(result), soft_wrap=True)  # one line, its folder whole


def _read_request(settings: Settings, spec: Path):
    """The request of a file, or of a request of the analysts' inbox named by its id (or a unique
    start of it) once it is proven its analyst's (signed.require); with the inbox file it came from
    (None for a file given by its path elsewhere)."""
    from dprelease.requests import RequestError, inbox, load_request

    if spec.exists():
        path = spec
    else:
        path = inbox.find(settings, str(spec))
        if path is None and not spec.suffix and len(spec.parts) == 1:
            if (decided := inbox.find_decided(settings, str(spec))) is not None:
                raise _already_decided(decided)
            raise RequestError(f"{str(spec)!r} is neither a request file nor the id of a request in the analysts' "
                               "inbox: list them with `dprelease request list`")
        path = path or spec
    if path.resolve().parent != settings.inbox_dir.resolve():
        return load_request(path), None  # the controller's own request file: its requested_by is theirs
    from dprelease.requests import signed

    request = inbox.read(path)
    signed.require(settings, path)  # an analyst's request runs only once it is proven hers
    if (decided := settings.inbox_dir / inbox.DECIDED / path.name).exists():
        raise _already_decided(decided)  # its signed file put back into the inbox: signed, but decided once
    return request, path


def _already_decided(decided: Path):
    """The refusal of a request of the inbox a controller already decided (its file in inbox/decided/)."""
    from dprelease.requests import RequestError

    return RequestError(f"request {decided.stem} of the analysts' inbox was already decided (its release published "
                        f"or rejected; its file: {decided}): it runs once; to ask again, the analyst submits it "
                        "again (`dprelease request submit`)")


def _refuse_a_request_run_already(settings: Settings, path: Path) -> None:
    """A request of the inbox runs once: refused while a release run from it waits or runs, and once
    it is published or rejected (a run from the Prefect UI leaves the file in the inbox); a run that
    failed or expired, refunded, may be run again."""
    import json

    from dprelease.requests import RequestError, inbox
    from dprelease.store import Store

    from .console import states

    run = inbox.run_of(path, json.loads(path.read_text()), inbox.runs_by_request(Store(settings.store_url)
                                                                                  .release_requests()))
    if run is not None and run.status not in ("failed", "expired"):
        waits = run.status in ("pending", "awaiting_approval")
        raise RequestError(f"request {path.stem} of the analysts' inbox was run already: release {run.id} is "
                           f"{states.label(run.status)}; a request runs once ("
                           + (f"decide that release: dprelease approve|reject {run.id}, or in the console)" if waits
                              else "to ask again, the analyst submits it again)"))


def _keep_checks_judge(request) -> None:
    """Keep the judge process started ahead only for an escrowed dataset (checks_judge.worth_a_process):
    an external dataset is judged beside its SparkSession, and an unknown one is refused by the checks
    after this (one line). Started before the store is even imported (0.17 s sooner: on 2 cores the
    judge's import, not the command's, is what the flow waits for); when not needed, ended here in the
    `dprelease` program, kept for the next release in a process that runs several (checks_judge)."""
    from dprelease import checks_judge, external
    from dprelease.store import Store

    if request.backend == "spark":  # refused for escrowed data, judged beside Spark for external data
        checks_judge.not_needed()
        return
    store = Store(_settings().store_url)  # a home with no store is refused here, before a Prefect server starts
    try:
        ds = store.get_dataset(request.dataset)
    except Exception:  # noqa: BLE001 - an unknown dataset: check_request says so in one line
        checks_judge.not_needed()
        return
    if not checks_judge.worth_a_process(external.escrowed_bytes(ds)):
        checks_judge.not_needed()


def _preview(settings: Settings, request) -> tuple[str, dict] | None:
    """The accuracy preview shown before the flow reserves anything (epsilon chosen without the
    data), with the risk profile at that epsilon; None in PRI data mode (epsilon is chosen from the
    data: the preview is in the summary instead)."""
    from dprelease import pipeline

    if request.epsilon_mode == "pri" and request.pri.get("mode") == "data":
        return None
    platform = pipeline.Platform.open(settings)
    planned = pipeline.plan(platform, request)
    decision = pipeline.choose_epsilon(platform, planned)
    return pipeline.preview_markdown(platform, planned, decision.epsilon), pipeline.risk_profile(platform, planned, decision)


@app.command()
def evaluators() -> None:
    """The catalogue of evaluation functions for utility signaling, with what each reveals."""
    from dprelease.evaluators import catalogue

    table = _table("name", "parameters", "what its value on raw data can reveal", whole=("name",))
    for name, ev in sorted(catalogue().items()):
        table.add_row(name, ", ".join(ev.params), ev.reveals)
    table.print(console)


@app.command()
def utility(
    spec: Path = typer.Argument(..., help="a release request (.yaml or .json) with a fixed epsilon"),
    evaluator: str = typer.Option(..., help="an evaluator the policy enables (see `dprelease evaluators`)"),
    params: str = typer.Option("{}", help="the evaluator's parameters as JSON"),
    timeout: int = typer.Option(3600, help="seconds to wait for each decision"),
    key: Path = typer.Option(None, help=_KEY_HELP),
) -> None:
    """Utility signaling: a DP release, then f(DP output) and f(raw output) with three approvals.
    Each decision is asked here (or answered from the Prefect UI / `dprelease approve`).

    Example: dprelease utility request.yaml --evaluator spearman_rank \\
        --params '{"column": "people", "other": "hours"}'"""
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
        result = run_utility_interactively(_settings(), request, evaluator, evaluator_params, timeout=timeout,
                                           controller_key=key)
    except (DPError, json.JSONDecodeError) as err:
        _fail(str(err))
    console.print(outcome_line(result), soft_wrap=True)  # one line, its folder whole


_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@app.command()
def server(port: int = 4200, host: str = typer.Option("127.0.0.1", help="address to listen on"),
           stop: bool = typer.Option(False, "--stop", help="stop this PREFECT_HOME's local server (the one "
                                     "commands start and share when PREFECT_API_URL is unset) and exit")) -> None:
    """Start a Prefect server (analytics off); its UI is where runs are started and watched. Beyond localhost
    it must be protected: set PREFECT_SERVER_API_AUTH_STRING=user:password (Prefect's basic auth)
    and give controllers PREFECT_API_AUTH_STRING.

    Example: dprelease server --port 4200"""
    from prefect.settings import get_current_settings

    if stop:
        from . import local_prefect_server
        from .temporary_prefect_server import prefect_home

        try:
            console.print(local_prefect_server.stop_running(prefect_home()), highlight=False)
        except RuntimeError as err:
            _fail(str(err))
        return

    auth = get_current_settings().server.api.auth_string
    if host not in _LOCAL_HOSTS and not (auth and auth.get_secret_value()):
        _fail(f"refusing to listen on {host} without authentication: anyone reaching the console could start "
              "and decide releases. Set PREFECT_SERVER_API_AUTH_STRING=user:password, or listen on 127.0.0.1")
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    os.execvpe(sys.executable,
               [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)], env)


@app.command()
def demo() -> None:
    """The whole path on Adult: a temporary Prefect server, the encrypted dataset, one release
    with epsilon chosen by the platform, the approval, the signed report verified.

    Everything goes to ./demo-output (deleted by the next demo); your DPRELEASE_HOME, store, keys and
    Prefect server are never read or changed."""
    from dp_core import DPError

    from .demo import DemoHomeTaken, run_demo

    try:
        run_demo(console)
    except (DPError, DemoHomeTaken) as err:
        _fail(str(err))


if __name__ == "__main__":
    main()
