"""The steps of a release (platform.md, "The release flow"), as plain functions. Prefect tasks
call these; nothing here imports Prefect, so every step can be tested and reused on its own.

Raw data never leaves memory: each step that needs it decrypts the escrow blob itself, as a
stream of Arrow batches that the engine (DuckDB) reads (`open_rows`: no pandas copy, no plaintext
file; nothing is passed between tasks, so no orchestration layer can persist it). The DP result is
sealed (pickled, encrypted with the escrow key) in the controller's archive under the release id:
a retried or resumed run finds it and never draws noise twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import pickle
import shutil
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
from cryptography.fernet import Fernet, InvalidToken

import dp_core as dp
from dp_core import display, pri, risk
from dp_core.bounds import FALLBACK_NOTE
from dp_core.spark_no_value_errors import refuse_text_failing_on_spark
from dp_core.sql import Table, compile_statement_for, run_sql

from . import checks, checks_judge, column_types, escrow, external, progress, publication_lock, shared_archive
from .faults import pause_point
from .reporting import data_files, pages, signing
from .requests import ReleaseRequest, query_from_spec
from .settings import Settings
from .store import BudgetExceeded, Store, StoreError
from .store import series as store_series
from .store.opened import opened_store


class ReleaseError(dp.DPError):
    """A release step refused to go on; the message says why. Nothing was published."""


@dataclass(frozen=True)
class Platform:
    """Settings and the store, opened once per flow run and passed to every step."""

    settings: Settings
    store: Store

    @classmethod
    def open(cls, settings: Settings) -> Platform:
        return cls(settings, opened_store(settings.store_url))

    def escrow_key(self) -> bytes:
        return escrow.load_or_create_key(self.settings, create=False)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- 1-2: load and check -----------------------------------------------------------------------

def load_frame(platform: Platform, dataset_name: str) -> tuple[object, pd.DataFrame]:
    """The dataset's record and its rows as a DataFrame (small data only; steps use `with_rows`)."""
    ds = platform.store.get_dataset(dataset_name)
    frame = escrow.load_frame(ds.blob_path, platform.escrow_key(), ds.fingerprint, ds.file_format)
    return ds, frame


def with_rows(platform: Platform, dataset_name: str, use, label: str, backend: str = "auto"):
    """Call `use(rows)` on the dataset's rows: an `escrow.EscrowRows`, a replayable Arrow stream
    the engine scans as often as it needs, decrypting and decoding one row group at a time (no
    plaintext file, no pandas copy, never the whole dataset in memory). Progress counts the rows
    read over all scans. A chunk failing authentication is reported as the escrow's error even
    when the engine wrapped it. An external dataset's rows are where it lives (external.rows_for:
    a Spark DataFrame, or its lake path for DuckDB); `backend` is the request's choice."""
    import time

    ds = platform.store.get_dataset(dataset_name)
    started = time.monotonic()
    engine = external.resolve_backend(ds, backend)  # refuses an engine that cannot read this dataset
    if external.is_external(ds):
        progress.note(f"{label}: {dataset_name} ({ds.blob_path}) on {engine}")
        result = use(external.rows_for(platform.settings, ds, backend))
        progress.note(f"{label}: done in {time.monotonic() - started:.1f} s")
        return result
    with progress.track(f"{label}: {dataset_name}", None, "rows read") as advance:
        rows = escrow.EscrowRows(ds.blob_path, platform.escrow_key(), ds.fingerprint, ds.file_format,
                                 on_rows=advance)
        try:
            result = use(rows)
        except dp.DPError:
            if rows.failures:
                raise rows.failures[0] from None
            raise
        finally:
            _return_arrow_memory()
    progress.note(f"{label}: done in {time.monotonic() - started:.1f} s")
    return result


def _return_arrow_memory() -> None:
    """Give the decoded row groups' freed buffers back to the OS: Arrow's allocator keeps them for
    reuse (about 50 MB after a 10M-row scan), and the next step's engine query needs the room."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def check_data(platform: Platform, dataset_name: str, backend: str = "auto") -> checks.CheckReport:
    """The dataset's expectations judged on its rows. In a process started for one flow run, escrowed
    rows' witness is judged by a judge process started now (checks_judge): great-expectations' import
    then runs beside the escrow's scan, without its Spark and SciPy parts (1.2-1.4 CPU-seconds where
    the run's own import took 2.3), and its memory is the judge's."""
    ds = platform.store.get_dataset(dataset_name)
    if checks_judge.runs_one_flow_run() and backend != "spark" and not external.is_external(ds):
        checks_judge.start_ahead()  # kept for a series run's next snapshot; ended at the process's exit
    report = with_rows(platform, dataset_name, lambda rows: checks.validate(
        rows, json.loads(ds.expectations_json), progress=progress.note, threads=platform.settings.threads_now()),
        "data checks", backend)
    pause_point("after_checks")
    return report


# -- 3: plan -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """The request checked against the dataset: the typed query (epsilon still a placeholder)."""

    request: ReleaseRequest
    query: dp.Query
    sql: str | None  # the compiled source when the request is SQL
    options_epsilon: bool = False  # a DP SELECT of the SQL fixes its own epsilon in OPTIONS


def plan(platform: Platform, request: ReleaseRequest) -> Plan:
    """Parse the SQL or spec, check row ownership, and the analyst's policy (when one exists)."""
    ds = platform.store.get_dataset(request.dataset)
    placeholder = request.epsilon or 1.0
    options = risk_confidence(request)
    empty = column_types.planning_stand_in(ds)
    if not ds.privacy_unit:
        raise ReleaseError(f"dataset {ds.name!r} is public (no privacy unit): there is nothing to protect; a DP "
                           "release reads a protected dataset (public ones may be joined in its SQL)")
    if request.sql:
        statement = compile_statement_for(request.sql, _sql_tables(platform, ds, empty, planning=True),
                                          epsilon=placeholder, delta=request.delta,
                                          max_partitions_contributed=request.max_partitions_contributed, **options)
        if not statement.parts:
            raise ReleaseError("the SQL has no DP SELECT: nothing to release")
        column_types.check_sql_types(request.sql, statement, sql_datasets(platform, ds))  # before any data
        if len(statement.parts) > 1 and request.epsilon_mode == "risk" and request.risk.get("split") == "need":
            raise ReleaseError("epsilon.risk.split: need chooses the shares of one DP SELECT, and this SQL has "
                               f"{len(statement.parts)}: use split: equal, or one DP SELECT; nothing was computed")
        if on_spark(platform, request):  # what Spark fails on whatever the value: refused before any flow
            for part in statement.parts:
                refuse_text_failing_on_spark(part.source_sql("duckdb"))
        # the ledger is charged the statement's total (the sum over its DP SELECTs)
        query = replace(statement.parts[0].query, epsilon=statement.epsilon, delta=statement.delta)
        sql = request.sql
        options_epsilon = statement.options_epsilon
    else:
        query = query_from_spec(request.query, ds.privacy_unit, placeholder, delta=request.delta,
                                max_partitions_contributed=request.max_partitions_contributed, **options)
        if query.where is not None and on_spark(platform, request):
            refuse_text_failing_on_spark(query.where)
        sql, options_epsilon = None, False
    return Plan(request, query, sql, options_epsilon)


def on_spark(platform: Platform, request: ReleaseRequest) -> bool:
    """The request's dataset is computed on Spark (an external dataset, backend auto or spark)."""
    return external.resolve_backend(platform.store.get_dataset(request.dataset), request.backend) == "spark"


def risk_confidence(request: ReleaseRequest) -> dict:
    """When the risk model chooses epsilon, the release's intervals are stated at the confidence p
    of its tolerable noise (default 0.9, the seed's), so that the report shows what was promised."""
    return {"confidence": float(request.risk.get("p", 0.9))} if request.epsilon_mode == "risk" else {}


def integer_columns(ds) -> frozenset[str]:
    """The dataset's integer-typed columns (a SUM over one of them is noised on the integers)."""
    return frozenset(c for c, kind in json.loads(ds.schema_json).items() if kind.startswith(("int", "uint")))


def preview_markdown(platform: Platform, planned: Plan, epsilon: float) -> str:
    """The accuracy preview of a plan at this epsilon (before anything is reserved), with the
    dataset's integer columns: the half-widths the release will report."""
    from .preview import preview_markdown as markdown

    return markdown(planned.query, epsilon, integer_columns(platform.store.get_dataset(planned.request.dataset)))


def _sql_tables(platform: Platform, ds, data, planning: bool = False) -> dict[str, Table]:
    """The tables a SQL request may read: its dataset (protected) and every public dataset (empty
    stand-ins of the registered schema while planning, their rows when computing)."""
    tables = {}
    for name, record in sql_datasets(platform, ds).items():
        if record is ds:
            tables[name] = Table(data, ds.privacy_unit)
        elif planning:
            tables[name] = Table(column_types.planning_stand_in(record))
        else:
            _, rows = load_frame(platform, record.name)  # public tables: small, read whole
            tables[name] = Table(rows)
    return tables


def sql_datasets(platform: Platform, ds) -> dict:
    """The SQL name -> the registered dataset of every table a SQL request on `ds` may read: `ds`
    (under its series' name too, for a snapshot: the series' SQL names the series, whatever the
    period) and every public dataset."""
    out = {ds.name: ds}
    series_name = store_series.series_name_of(platform.store, ds.name)
    if series_name:
        out[series_name] = ds
    for other in platform.store.list_datasets():
        if not other.privacy_unit and other.name != ds.name:
            out[other.name] = other
    return out


# -- 5: choose epsilon ---------------------------------------------------------------------------

@dataclass(frozen=True)
class EpsilonDecision:
    epsilon: float
    mode: str  # fixed | pri | risk
    explanation: str
    pri_choice: object | None = None  # dp_core.pri.EpsilonChoice (public part; ranges are controller-only)
    risk_choice: object | None = None  # dp_core.risk.RiskChoice


def choose_epsilon(platform: Platform, planned: Plan) -> EpsilonDecision:
    """Fixed, from the PRI (public mode by default: data-free), or from the risk model."""
    req = planned.request
    budget = platform.store.budget(req.dataset)
    if req.epsilon_mode == "fixed":
        if req.epsilon is None:
            raise ReleaseError("the request fixes no epsilon: give epsilon, or choose it with {pri: ...} or {risk: ...}")
        total = statement_epsilon(platform, planned, req.epsilon)
        return EpsilonDecision(total, "fixed", f"epsilon {total:g} was fixed by the request")
    if planned.options_epsilon:
        chooser = "privacy risk indicator" if req.epsilon_mode == "pri" else "risk model"
        raise ReleaseError(f"the SQL fixes epsilon in its OPTIONS, so the {chooser} cannot choose it: remove "
                           f"epsilon from every DP SELECT's OPTIONS, or give a fixed `epsilon:`; nothing was computed")
    if req.epsilon_mode == "pri":
        p, mode = float(req.pri.get("p", 50)), req.pri.get("mode", "public")
        cap = budget["epsilon_cap"]
        spent = cap - budget["epsilon_remaining"]  # a series_cap snapshot: what its series' cap leaves
        if mode == "public":
            choice = pri.choose_epsilon_public(planned.query, p, beta=float(req.pri.get("beta", 0.5)),
                                               spent=spent, cap=cap)
        else:
            if planned.sql:
                raise ReleaseError("PRI data mode needs a query spec, not SQL; use public mode or a `query:` spec")
            if on_spark(platform, req):
                raise ReleaseError("PRI data mode needs every unit's contribution in this process, and "
                                   f"{req.dataset!r} is computed on Spark (only per-partition rows come back): "
                                   "use PRI public mode, or fix epsilon; nothing was computed")
            choice = with_rows(platform, req.dataset, lambda rows: pri.choose_epsilon_data(
                planned.query, rows, p, spent=spent, cap=cap), "PRI data mode", req.backend)
        return EpsilonDecision(choice.epsilon, "pri", f"chosen from the privacy risk indicator (p = {p:g}, "
                               f"{mode} mode): {choice.guarantee}", pri_choice=choice)
    return choose_epsilon_from_risk(platform, planned)


#: what a request's `epsilon: {risk: {...}}` may hold
RISK_FIELDS = frozenset({"trust", "sensitivity", "max_risk", "max_noise", "n", "m", "p", "prefer", "headline",
                         "reference_value", "reference_count", "split", "groups"})


def risk_fields(platform: Platform, request: ReleaseRequest) -> dict:
    """The request's risk-model fields, where trust, sensitivity and max_risk left `registered`
    (or not given) are the dataset's registered risk profile: the run form's default."""
    from .requests.epsilon import REGISTERED

    r = dict(request.risk)
    left = [f for f in ("trust", "sensitivity", "max_risk") if r.get(f, REGISTERED) == REGISTERED]
    if left:
        profile = json.loads(platform.store.get_dataset(request.dataset).risk_json or "{}")
        missing = [f for f in left if f not in profile]
        if missing:
            raise ReleaseError(f"epsilon.risk: {', '.join(missing)} left to the dataset, but {request.dataset!r} has no "
                               "registered value: give them in the request; nothing was computed")
        r.update({f: profile[f] for f in left})
    return r


def choose_epsilon_from_risk(platform: Platform, planned: Plan) -> EpsilonDecision:
    """The smallest total epsilon at which the plan's statistics meet the tolerable noise, checked
    against the tolerable risk (dp_core.risk.choose_epsilon_for_plan). The request's risk fields:
    trust, sensitivity, max_risk, n; max_noise (a number, 'P%' of reference_value, or a mapping
    statistic -> either); optional m, p, prefer, headline, reference_value, reference_count, split
    ('need': the shares each tolerance needs, dp_core.split) and groups (the selection's need)."""
    r = risk_fields(platform, planned.request)
    unknown = set(r) - RISK_FIELDS
    if unknown:
        raise ReleaseError(f"epsilon.risk: unknown field(s) {sorted(unknown)} (allowed: {sorted(RISK_FIELDS)}); "
                           "nothing was computed")
    ds = platform.store.get_dataset(planned.request.dataset)
    try:
        choice = risk.choose_epsilon_for_plan(
            planned.query, trust=r["trust"], sensitivity=r["sensitivity"], max_risk=r["max_risk"],
            max_noise=r["max_noise"], n=int(r["n"]), m=int(r.get("m", 1)), p=float(r.get("p", 0.9)),
            prefer=r.get("prefer", "privacy"), headline=r.get("headline"),
            reference_value=float(r.get("reference_value", 100.0)),
            reference_count=None if r.get("reference_count") is None else float(r["reference_count"]),
            integer_columns=integer_columns(ds), split=r.get("split", "equal"), groups=r.get("groups"))
    except dp.InvalidQueryError as err:
        raise ReleaseError(f"epsilon from the risk model: {err}") from None
    asked = ", ".join(f"{name} within ±{tol:g}" for name, tol in choice.tolerances.items())
    rule = (f"the smallest total epsilon with {asked} at {choice.confidence:.0%}" if choice.prefer == "privacy"
            else "the largest total epsilon within the tolerable risk")
    allowed = (f"the tolerable risk is met at every epsilon up to {display.budget(choice.epsilon_risk)}"
               if choice.epsilon_risk >= risk.EPSILON_CAP else
               f"the risk allows at most {display.budget(choice.epsilon_risk)}")
    explanation = (f"chosen from the risk model for the whole plan: {rule} (the noise needs at least "
                   f"{display.budget(choice.epsilon_noise)}, {allowed})")
    return EpsilonDecision(choice.epsilon, "risk", explanation, risk_choice=choice)


def statement_epsilon(platform: Platform, planned: Plan, epsilon: float) -> float:
    """What a SQL request spends at this request epsilon: its DP SELECTs' total (OPTIONS epsilons
    count as given; the request's epsilon is shared by the others)."""
    if not planned.sql:
        return epsilon
    ds = platform.store.get_dataset(planned.request.dataset)
    return compile_statement_for(planned.sql, _sql_tables(platform, ds, column_types.planning_stand_in(ds),
                                                          planning=True), epsilon=epsilon,
                                 delta=planned.request.delta).epsilon


# -- 7: compute and seal -------------------------------------------------------------------------

def request_digest(planned: Plan, epsilon: float) -> str:
    return hashlib.sha256((planned.request.to_json() + f"|{epsilon!r}").encode()).hexdigest()


def sealed_path(platform: Platform, release_id: str) -> Path:
    return platform.settings.archive_dir / release_id / "sealed-result.fernet"


def compute_sealed(platform: Platform, release_id: str, planned: Plan, decision: EpsilonDecision) -> dp.DPResult:
    """The DP result of the release, computed once: a sealed result for this release id is reused
    (and must belong to the same request and epsilon)."""
    path = sealed_path(platform, release_id)
    digest = request_digest(planned, decision.epsilon)
    fernet = Fernet(platform.escrow_key())
    shared_archive.pull(platform.settings, path)  # sealed on another host: the shared archive's copy counts
    if path.exists():
        shared_archive.push_new(platform.settings, path)  # sealed here before the shared archive had it
        try:
            stored_digest, result = pickle.loads(fernet.decrypt(path.read_bytes()))
        except (InvalidToken, pickle.UnpicklingError) as err:
            raise ReleaseError(f"the sealed result of release {release_id} cannot be opened: {err!r}") from None
        if stored_digest != digest:
            raise ReleaseError(f"release {release_id} was sealed for another request: refusing to recompute")
        return result
    split = getattr(decision.risk_choice, "split", None)  # the need split: its weights are the release's
    weights = {"part_weights": split.part_weights} if split is not None else {}
    # APPROX_BOUNDS finding no bin falls back to the histogram's whole range (noted for the controller)
    # instead of failing: the failure was a noisy fact about the data that reached the analyst as
    # "Failed (refunded)", unapproved and free to ask again (dp_core/bounds.py, "Falling back")
    query = replace(planned.query, epsilon=decision.epsilon, bounds_fallback=True, **weights)
    if planned.sql:
        ds = platform.store.get_dataset(planned.request.dataset)
        result = with_rows(platform, planned.request.dataset, lambda rows: run_sql(
            planned.sql, _sql_tables(platform, ds, rows), epsilon=decision.epsilon,
            delta=query.delta, max_partitions_contributed=query.max_partitions_contributed,
            confidence=query.confidence, threads=platform.settings.threads_now(), bounds_fallback=True,
            **weights), "compute", planned.request.backend)
    else:
        result = with_rows(platform, planned.request.dataset, lambda rows: dp.execute(
            query, rows, threads=platform.settings.threads_now()), "compute", planned.request.backend)
    if split is not None:
        result = replace(result, notes=tuple(result.notes) + (split.explain(),))
    result = replace(result, notes=tuple(result.notes) + tuple(
        f"{b.aggregate}: {FALLBACK_NOTE}" for b in result.inferred_bounds if FALLBACK_NOTE in b.record.note))
    if decision.pri_choice is not None:
        result = replace(result, epsilon_choice=replace(decision.pri_choice, controller_only=()))
        if not planned.sql and not on_spark(platform, planned.request):  # the controller's view: PRI
            # ranges of the real data per candidate (every unit's contribution: not collected from Spark)
            contrib = with_rows(platform, planned.request.dataset, lambda rows: pri.contributions(query, rows),
                                "compute (PRI ranges)", planned.request.backend)
            cache: dict = {}
            p = decision.pri_choice.p
            ranges = tuple(pri.pri_range(contrib, e, p, cache) for e in decision.pri_choice.candidates)
            result = replace(result, controller_only=replace(result.controller_only, pri_ranges=ranges))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(fernet.encrypt(pickle.dumps((digest, result))))
    tmp.replace(path)
    if not shared_archive.push_new(platform.settings, path):  # another run sealed first: its numbers count,
        path.unlink()                                         # these were never shown to anyone
        return compute_sealed(platform, release_id, planned, decision)
    pause_point("after_seal")
    return result


def open_sealed(platform: Platform, release_id: str, planned: Plan, decision: EpsilonDecision) -> dp.DPResult:
    """The sealed result of a release for the steps after computing it: a missing seal is an
    error (recomputing would draw new noise that nobody approved)."""
    shared_archive.pull(platform.settings, sealed_path(platform, release_id))
    if not sealed_path(platform, release_id).exists():
        raise ReleaseError(f"release {release_id} has no sealed result in {platform.settings.archive_dir}: "
                           "refusing to compute new numbers after the compute step")
    return compute_sealed(platform, release_id, planned, decision)


# -- 8: the controller's summary -------------------------------------------------------------------

def controller_summary(release_id: str, planned: Plan, decision: EpsilonDecision, result: dp.DPResult,
                       risk_info: dict | None = None) -> str:
    """Markdown for the approval form (Prefect artifact): what would be released, and the
    controller-only numbers next to it."""
    c = result.controller_only
    lines = [
        f"## Release {release_id}: {planned.request.title or planned.request.dataset}",
        f"**Dataset** `{planned.request.dataset}`; **epsilon** {display.budget(result.epsilon_spent)}, "
        f"**delta** {display.budget(result.delta_spent)} ({decision.mode}: {decision.explanation})",
        "", "**Request**", "```", planned.request.text, "```",
        "", "**Would be released** (values with confidence intervals)", "",
        *_released_rows(result.readable_table()),
        "", "**Controller only (not DP)**",
        f"- partitions dropped by selection: {c.partitions_dropped} of {c.partitions_nonempty} ({c.partition_loss:.1%})",
        f"- (unit, partition) pairs dropped by bounding: {c.pairs_dropped_by_bounding} of {c.unit_partition_pairs}",
    ]
    lines += [f"- {name}: {loss.clamped} of {loss.values} per-unit values clamped (total shift {loss.total_shift:.4g})"
              for name, loss in c.clamping.items()]
    if decision.risk_choice is not None:
        lines.append(f"- risk model: {decision.risk_choice.summary}")
        lines += promise_lines(decision, result)
    elif risk_info:
        lines.append(
            f"- risk at this epsilon (dataset profile: sensitivity {risk_info['sensitivity']}, trust "
            f"{risk_info['trust']}, {risk_info['n']} possible values): an attacker's guess is right with "
            f"probability at most {risk_info['q']:.0%}; risk "
            f"{risk.risk_words(risk_info['risk'], risk.level_value(risk_info['max_risk']))}")
    lines += ["", "Approve to publish the analyst report (signed); reject to refund the budget."]
    return "\n".join(lines)


def promise_lines(decision: EpsilonDecision, result: dp.DPResult) -> list[str]:
    """Markdown: per statistic, the interval promised when epsilon was chosen beside the widest one
    the result delivers (both public: the promise is data-free, the intervals are DP)."""
    if decision.risk_choice is None:
        return []
    lines = []
    chosen = decision.risk_choice.epsilon
    if abs(result.epsilon_spent - chosen) > 1e-9 * chosen:  # e.g. the SQL's OPTIONS set another epsilon
        lines.append(f"- **WARNING**: this release spends epsilon {display.budget(result.epsilon_spent)}, not the "
                     f"chosen {display.budget(chosen)}: the promise below does not describe it; reject and fix the "
                     "request")
    for row in pages.promise_rows(result, decision.risk_choice):
        lines.append(f"- {row['name']}: promised {row['promised']}; delivered {row['delivered']}")
    return lines


def save_summary(platform: Platform, release_id: str, markdown: str) -> Path:
    """The summary beside the controller report (the CLI shows it at the approval prompt)."""
    path = platform.settings.archive_dir / release_id / "summary.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown)
    shared_archive.push(platform.settings, path)
    return path


#: rows of the would-be release shown in the summary (the approval form, the terminal, the Prefect
#: artifact); the controller report holds every row. 1,705 rows took 0.5 s to print and buried the
#: controller-only lines below them.
SUMMARY_ROWS = 50


def _released_rows(table: pd.DataFrame) -> list[str]:
    """The summary's table: the first SUMMARY_ROWS rows, and how many more the controller report shows."""
    lines = [_markdown_table(table.head(SUMMARY_ROWS))]
    if len(table) > SUMMARY_ROWS:
        lines += ["", f"(the first {SUMMARY_ROWS} of {len(table):,} rows; the controller report holds all of them)"]
    return lines


def _markdown_table(df: pd.DataFrame) -> str:
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *rows])


def write_controller_report(platform: Platform, release_id: str, planned: Plan, decision: EpsilonDecision,
                            result: dp.DPResult) -> Path:
    """The controller report, signed, in the archive (never in the publication directory)."""
    directory = platform.settings.archive_dir / release_id / "controller"
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.iterdir():
        stale.unlink()
    ds = platform.store.get_dataset(planned.request.dataset)
    ctx = replace(report_context(release_id, planned, decision, approved_by=None, decided_at=None),
                  dataset_fingerprint=public_fingerprint(platform, ds.fingerprint))  # the analyst report's
    ctx.charts.update(_controller_charts(platform, planned, decision))
    ctx.risk_warning = _risk_warning(platform, release_id, planned, decision)
    (directory / "controller.html").write_text(pages.render_controller_report(result, ctx))
    signing.sign_directory(directory, {"release_id": release_id, "kind": "controller-report"},
                           signing.load_private_key(platform.settings.signing_key_file))
    shared_archive.push(platform.settings, directory)
    return directory


def _risk_warning(platform: Platform, release_id: str, planned: Plan, decision: EpsilonDecision) -> str:
    """Words for the controller report when the risk is above the tolerable risk (else empty)."""
    from . import decisions

    profile = risk_profile(platform, planned, decision)
    return decisions.risk_notice(profile, release_id, markdown=False) if decisions.risk_above_tolerance(profile) else ""


def risk_profile(platform: Platform, planned: Plan, decision: EpsilonDecision) -> dict:
    """What the risk model says of this release, whichever way epsilon was chosen (risk.md, "In
    this platform"): the request's risk parameters, else the dataset's registered profile. A
    histogram lets one person change two outputs (m = 2), a single number one (m = 1)."""
    if decision.risk_choice is not None:
        r = risk_fields(platform, planned.request)
    else:
        r = json.loads(platform.store.get_dataset(planned.request.dataset).risk_json or "{}")
        if not r:
            return {}
        r.setdefault("m", 2 if planned.query.group_by else 1)
    t, s = risk.level_value(r["trust"]), risk.level_value(r["sensitivity"])
    q = risk.guessing_bound(decision.epsilon, int(r["n"]), int(r.get("m", 1)))
    rk = risk.risk(s, t, q)
    return {**r, "q": q, "risk": rk, "level": risk.level_name(rk)}


def _controller_charts(platform: Platform, planned: Plan, decision: EpsilonDecision) -> dict[str, str]:
    """The noise-against-risk chart, for every release."""
    from .reporting import charts

    r = risk_profile(platform, planned, decision)
    if not r:
        return {}
    p = float(r.get("p", 0.9))
    noise_at, statistic = plan_noise(platform, planned, decision, p)
    return {"noise against risk": charts.noise_risk_svg(
        trust=r["trust"], sensitivity=r["sensitivity"], max_risk=r["max_risk"], n=int(r["n"]), m=int(r.get("m", 1)),
        p=p, chosen_eps=decision.epsilon, example_value=float(r.get("reference_value", 100.0)),
        noise_at=noise_at, statistic=statistic)}


def plan_noise(platform: Platform, planned: Plan, decision: EpsilonDecision, p: float):
    """(total epsilon -> half-width at confidence p, its name) for the chart's noise axis: the
    statistic the risk model was asked about, else the plan's first count or sum; (None, 'a
    count') when the plan has none (the chart then uses the seed's one-count model)."""
    from dp_core import accuracy

    ints = integer_columns(platform.store.get_dataset(planned.request.dataset))
    shown = [s for s in accuracy.statistic_intervals(planned.query, 1.0, confidence=p, integer_columns=ints)
             if s.promised and s.kind in ("count", "count_units", "sum")]
    asked = list(decision.risk_choice.tolerances) if decision.risk_choice is not None else []
    shown.sort(key=lambda s: s.name not in asked)
    if not shown:
        return None, "a count"
    name = shown[0].name

    def noise_at(eps: float) -> float:
        return next(s.halfwidth for s in accuracy.statistic_intervals(planned.query, eps, confidence=p,
                                                                      integer_columns=ints) if s.name == name)
    return noise_at, f"{name} ({shown[0].kind})"


def public_fingerprint(platform: Platform, fingerprint: str) -> str:
    """What analysts see of the dataset's identity: an HMAC of its SHA-256 under the escrow key
    (a bare hash of the plaintext would let someone who knows most rows confirm guesses offline)."""
    return hmac.new(platform.escrow_key(), fingerprint.encode(), hashlib.sha256).hexdigest()


def report_context(release_id: str, planned: Plan, decision: EpsilonDecision, approved_by: str | None,
                   decided_at: str | None, created_at: str | None = None) -> pages.ReleaseContext:
    req = planned.request
    return pages.ReleaseContext(
        release_id=release_id, dataset=req.dataset, dataset_fingerprint="", privacy_unit=planned.query.privacy_unit,
        request_text=req.text, requested_by=req.requested_by, approved_by=approved_by, decided_at=decided_at,
        created_at=created_at or now(), epsilon_mode=decision.mode, epsilon_explanation=decision.explanation,
        risk_summary=decision.risk_choice.summary if decision.risk_choice is not None else None, charts={},
        promise=decision.risk_choice,
        verify_hint="dprelease verify <this directory>", title=req.title,
    )


# -- 9-10: decide, then publish or refund ------------------------------------------------------------

def check_policy(platform: Platform, request: ReleaseRequest, epsilon: float | None,
                 evaluator: str | None = None) -> None:
    """A dataset with policies accepts only the requests one of them allows (analyst, epsilon per
    release, evaluator); refused before any computation, with the reason."""
    every = platform.store.all_policies(request.dataset)
    if not every:
        if evaluator is not None:
            raise ReleaseError(f"evaluator {evaluator!r} is not enabled: dataset {request.dataset!r} has no policy")
        return
    mine = [p for p in every if p.analyst in (None, request.requested_by)]
    if not mine:
        raise ReleaseError(f"no policy lets {request.requested_by or 'an anonymous analyst'} query dataset "
                           f"{request.dataset!r}: nothing was computed")
    if epsilon is not None and all(epsilon > p.max_epsilon_per_release + 1e-12 for p in mine):
        limit = max(p.max_epsilon_per_release for p in mine)
        raise ReleaseError(f"epsilon {epsilon:g} is above the policy limit {limit:g} per release on dataset "
                           f"{request.dataset!r}: nothing was computed and no budget was spent")
    if evaluator is not None:
        enabled = {name for p in mine for name in json.loads(p.evaluators_json or "[]")}
        if evaluator not in enabled:
            raise ReleaseError(f"evaluator {evaluator!r} is not enabled for this analyst on {request.dataset!r} "
                               f"(enabled: {sorted(enabled) or 'none'}): nothing was computed")


def check_budget_left(platform: Platform, request: ReleaseRequest, delta: float) -> None:
    """A fixed epsilon that the remaining budget cannot cover is refused before the data is read, in
    the reservation's words (the reservation checks again, atomically: this one saves decrypting and
    checking data that could not be released)."""
    if request.epsilon is None:
        return
    try:
        platform.store.check_fits(request.dataset, request.epsilon, delta)
    except BudgetExceeded as err:
        raise ReleaseError(f"budget: {err}") from None


def reserve(platform: Platform, release_id: str, dataset: str, epsilon: float, delta: float) -> None:
    """Reserve the release's budget; a shared archive that does not answer refuses first (nothing spent)."""
    shared_archive.check(platform.settings)
    try:
        platform.store.reserve(dataset, release_id, epsilon, delta)
    except BudgetExceeded as err:
        raise ReleaseError(f"budget: {err}") from None
    pause_point("after_reserve")


def publish(platform: Platform, release_id: str, planned: Plan, decision: EpsilonDecision, result: dp.DPResult,
            approved_by: str, comment: str = "") -> Path:
    """Write the analyst report and data files in a staging folder and sign them; then commit the
    budget (a refunded reservation refuses: nothing appears) and move the folder into place, from the
    commit on under the publication's lock (dprelease.publication_lock: no recovery finishes it beside
    this run). A run killed after the commit is completed by `recovery.finish_publication`."""
    ds = platform.store.get_dataset(planned.request.dataset)
    directory = platform.settings.publication_dir / release_id
    staging = _staging(platform, release_id)
    ctx = _published_context(platform, release_id, planned, decision, approved_by, ds, directory)
    (staging / "index.html").write_text(pages.render_analyst_report(result, ctx))
    data_files.write_data_files(result, staging)
    facts = {
        "release_id": release_id, "dataset": ds.name, "dataset_fingerprint": ctx.dataset_fingerprint,
        "title": planned.request.title, "epsilon": result.epsilon_spent, "delta": result.delta_spent,
        "epsilon_mode": decision.mode, "approved_by": approved_by, "published_at": ctx.decided_at,
    }
    manifest = signing.sign_directory(staging, facts, signing.load_private_key(platform.settings.signing_key_file))
    shared_archive.push(platform.settings, staging)  # after the commit, any host can finish from it
    with publication_lock.held(platform.settings, release_id):
        try:
            platform.store.commit(release_id)
        except StoreError:  # refunded meanwhile (the run was stopped): nothing may appear
            shutil.rmtree(staging, ignore_errors=True)
            shared_archive.remove(platform.settings, staging)
            raise
        pause_point("during_publication")
        _swap_in(staging, directory)
        shared_archive.publish_directory(platform.settings, directory)
        shared_archive.remove(platform.settings, staging)
        platform.store.update_release(release_id, status="published", decision_by=approved_by,
                                      decision_comment=comment, decided_at=datetime.now(UTC),
                                      artifacts_json=json.dumps({k: v["sha256"] for k, v in manifest["files"].items()}))
        write_index(platform)
    return directory


def _staging(platform: Platform, release_id: str) -> Path:
    """An empty folder beside the publication, where a release is written and signed before it
    appears (a failure leaves nothing half-written in the public directory)."""
    staging = platform.settings.publication_dir / f".staging-{release_id}"
    if staging.exists():
        shutil.rmtree(staging)
    shared_archive.remove(platform.settings, staging)
    staging.mkdir(parents=True)
    return staging


def _swap_in(staging: Path, directory: Path) -> None:
    """Put the signed staging folder in place of the release directory (renames on one disk)."""
    old = directory.with_name(f".old-{directory.name}")
    if directory.exists():
        directory.rename(old)
    staging.rename(directory)
    if old.exists():
        shutil.rmtree(old)


def _published_context(platform, release_id, planned, decision, approved_by, ds, directory) -> pages.ReleaseContext:
    release = platform.store.get_release(release_id)
    ctx = report_context(release_id, planned, decision, approved_by=approved_by, decided_at=now(),
                         created_at=release.created_at.isoformat(timespec="seconds"))
    return replace(ctx, dataset_fingerprint=public_fingerprint(platform, ds.fingerprint),
                   verify_hint=signing.verify_hint(directory.name),
                   signer_fingerprint=signing.key_fingerprint(platform.settings.public_key_file))


def write_index(platform: Platform) -> Path:
    """The publication index: every published release, newest first."""
    entries = []
    for rel in platform.store.list_releases(status="published"):
        manifest = platform.settings.publication_dir / rel.id / signing.MANIFEST
        if not manifest.exists():  # published from another host: its manifest is in the shared archive
            shared_archive.pull(platform.settings, manifest)
        if not manifest.exists():
            continue
        facts = json.loads(manifest.read_text())["facts"]
        entries.append({"release_id": rel.id, "dataset": facts["dataset"], "title": facts.get("title") or facts["dataset"],
                        "epsilon": facts["epsilon"], "delta": facts["delta"], "published_at": facts["published_at"],
                        "path": f"{rel.id}/index.html"})
    entries.sort(key=lambda e: e["published_at"], reverse=True)
    path = platform.settings.publication_dir / "index.html"
    from .series import index_entries  # the series pages (periodic publication)

    path.write_text(pages.render_index(entries, series=index_entries(platform)))
    key = platform.settings.publication_dir / signing.PUBLIC_KEY  # the trusted key, published once
    key.write_bytes(platform.settings.public_key_file.read_bytes())
    shared_archive.push(platform.settings, key)
    shared_archive.push(platform.settings, path)
    return path


def refund(platform: Platform, release_id: str, status: str, by: str | None, comment: str = "") -> None:
    """Reject or expiry: give the reservation back and record the decision, in one transaction
    (Store.abandon: a release already final, or already committed, is left as it is)."""
    platform.store.abandon(release_id, status, comment, by)


# -- utility signaling (pri.md, "Utility signaling protocol") -----------------------------------

def enabled_evaluators(platform: Platform, request: ReleaseRequest) -> list[str]:
    """The evaluator names the dataset's policies enable for this analyst."""
    names = set()
    for p in platform.store.all_policies(request.dataset):
        if p.analyst in (None, request.requested_by):
            names.update(json.loads(p.evaluators_json or "[]"))
    return sorted(names)


def utility_tables(result: dp.DPResult) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The released table and the same groups without noise (controller only), same columns."""
    keys = list(result.query.group_by)
    labels = [a.label for a in result.query.aggregates]
    released = result.table[keys + labels].reset_index(drop=True)
    exact = result.controller_only.exact
    exact = exact[exact["released"]][keys + labels]
    if keys:
        raw = released[keys].merge(exact, on=keys, how="left")
    else:
        raw = exact.reset_index(drop=True)
    return released, raw[keys + labels]


def evaluate_utility(platform: Platform, release_id: str, result: dp.DPResult, name: str, params: dict,
                     enabled: list[str]) -> dict:
    """f(DP output) and f(output without noise), withheld in the archive (controller only)."""
    from . import evaluators

    evaluator = evaluators.enabled_evaluator(name, enabled)
    released, raw = utility_tables(result)
    utility = {"name": name, "description": evaluator.description, "reveals": evaluator.reveals,
               "params": json.dumps(params, sort_keys=True), "f_dp": evaluator(released, params),
               "f_raw": evaluator(raw, params)}
    path = platform.settings.archive_dir / release_id / "utility.json"
    path.write_text(json.dumps(utility, indent=2))
    shared_archive.push(platform.settings, path)
    return utility


def utility_summary(utility: dict) -> str:
    return "\n".join([
        f"## Utility signal: `{utility['name']}`", f"{utility['description']}; parameters `{utility['params']}`",
        "", f"- on the DP output: **{utility['f_dp']:.6g}**",
        f"- on the output without noise (not DP): **{utility['f_raw']:.6g}**",
        "", f"What the second number can reveal: {utility['reveals']}.",
        "", "Approve to release both numbers to the analyst; reject to keep them withheld.",
    ])


def publish_utility(platform: Platform, release_id: str, planned: Plan, decision: EpsilonDecision,
                    result: dp.DPResult, utility: dict, approved_by: str) -> Path:
    """The last approval: the analyst report gains its utility-signal section; the release is
    signed again (its manifest now lists utility.json)."""
    ds = platform.store.get_dataset(planned.request.dataset)
    directory = platform.settings.publication_dir / release_id
    release = platform.store.get_release(release_id)
    staging = _staging(platform, release_id)
    shared_archive.pull(platform.settings, directory)  # published from another host
    for name in ("results.csv", "results.json"):
        shutil.copy2(directory / name, staging / name)
    shown = {k: utility[k] for k in ("name", "description", "params")}
    shown.update(f_dp=f"{utility['f_dp']:.6g}", f_raw=f"{utility['f_raw']:.6g}", status=f"approved by {approved_by}")
    ctx = replace(_published_context(platform, release_id, planned, decision, release.decision_by, ds, directory),
                  utility=shown)
    (staging / "index.html").write_text(pages.render_analyst_report(result, ctx))
    (staging / "utility.json").write_text(json.dumps({**shown, "reveals": utility["reveals"]}, indent=2))
    facts = json.loads((directory / signing.MANIFEST).read_text())["facts"]
    facts["utility_signal"] = {"evaluator": utility["name"], "approved_by": approved_by}
    manifest = signing.sign_directory(staging, facts, signing.load_private_key(platform.settings.signing_key_file))
    _swap_in(staging, directory)
    shared_archive.publish_directory(platform.settings, directory)
    platform.store.update_release(release_id, artifacts_json=json.dumps({k: v["sha256"] for k, v in manifest["files"].items()}))
    return directory
