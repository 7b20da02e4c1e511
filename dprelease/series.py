"""Periodic publication on new data: registering the snapshots of a dataset series, and the series'
signed page (dprelease.reporting.series_page) after each published period.

A series is created with its first snapshot (`dprelease dataset register visits jan.csv --snapshot
2026-01 --unit person_id --epsilon-cap 1 --series-budget per_snapshot`); every later snapshot must
have the same columns and types (the schema contract): a changed schema is refused, with the
differences named, before anything is sealed or recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import escrow, shared_archive
from .faults import pause_point
from .settings import Settings
from .store import Store
from .store import series as store_series
from .store.series import SnapshotRefused
from .store.tables import FILE_FORMATS


class SeriesPageRefused(Exception):
    """The series page cannot be published as it stands (a published period without its signed folder)."""


def register_snapshot(settings: Settings, series: str, path: Path, snapshot: str, *, privacy_unit: str | None = None,
                      budget_mode: str | None = None, epsilon_cap: float | None = None, delta_cap: float | None = None,
                      add_row_id: bool = False, risk_profile: dict | None = None, external: str | None = None,
                      running_total: dict | None = None):
    """Register `path` as snapshot `snapshot` of `series` (its own escrowed, checked dataset
    `series@snapshot`). The first snapshot creates the series with its unit, budget mode and cap
    (per_snapshot: epsilon each period may spend, parallel composition over disjoint snapshots;
    series_cap: epsilon all periods together may spend, sequential composition). Refused, with
    nothing written: a label already registered, options that contradict the series, a schema that
    differs from the series'. A later snapshot without `risk_profile` keeps the series' profile.
    external: the period is registered by reference instead of a file (dprelease.external), `{snapshot}`
    in it replaced by the label, so one lake path pattern serves every period.
    running_total: with the first snapshot only, the series' running total (dprelease.running_total),
    checked before anything is written and charged once for its horizon when the series is created."""
    from . import admin
    from . import external as external_data
    from . import running_total as running_totals

    if external is not None and add_row_id:
        raise SnapshotRefused("an external snapshot is registered by reference: --add-row-id needs a file (drop it)")

    store = Store(settings.store_url)
    store.create_all()
    store_series.check_label(snapshot)
    existing = store_series.find_series(store, series)
    if existing is None:
        missing = [flag for flag, value in (("--unit", privacy_unit), ("--series-budget", budget_mode),
                                            ("--epsilon-cap", epsilon_cap)) if value is None]
        if missing:
            raise SnapshotRefused(f"series {series!r} does not exist yet: its first snapshot creates it, give "
                                  f"{', '.join(missing)} (--series-budget per_snapshot: disjoint people each period; "
                                  "series_cap: the same people in every period)")
        if budget_mode not in store_series.SERIES_BUDGETS:
            raise SnapshotRefused(f"--series-budget must be one of {', '.join(store_series.SERIES_BUDGETS)}, "
                                  f"got {budget_mode!r}")
    else:
        for flag, given, held in (("--unit", privacy_unit, existing.privacy_unit),
                                  ("--series-budget", budget_mode, existing.budget_mode),
                                  ("--epsilon-cap", epsilon_cap, existing.epsilon_cap),
                                  ("--delta-cap", delta_cap, existing.delta_cap)):
            if given is not None and given != held:
                raise SnapshotRefused(f"series {series!r} has {flag} {held}, not {given}: a series keeps its unit and "
                                      f"budget (drop {flag}, or create a new series)")
        privacy_unit = existing.privacy_unit
        if risk_profile is None:  # the series keeps its risk profile: the latest snapshot's
            latest = store_series.resolve(store, series, "latest")
            risk_profile = json.loads(store.get_dataset(latest.dataset).risk_json)
        taken = {s.snapshot for s in store_series.snapshots(store, series)}
        if snapshot in taken:
            raise SnapshotRefused(f"snapshot {snapshot} of series {series!r} is already registered: a snapshot is "
                                  "registered once (give the next period's label)")
        running_totals.check_next_label(store, series, snapshot)
        if taken:
            store_series.check_same_widths(series, snapshot, max(taken))
    reference = None if external is None else external_data.snapshot_reference(external, snapshot)
    schema = (file_schema(path, privacy_unit if add_row_id else None) if reference is None
              else external_data.reference_schema(settings, reference))
    if existing is not None:
        differences = store_series.schema_differences(json.loads(existing.schema_text), schema)
        if differences:
            raise SnapshotRefused(f"snapshot {snapshot} of series {series!r} changes the schema: "
                                  f"{'; '.join(differences)}; nothing registered (every snapshot keeps the series' "
                                  "columns and types: fix the file, or start a new series)")
    mode = budget_mode or existing.budget_mode
    cap = epsilon_cap if epsilon_cap is not None else existing.epsilon_cap
    delta = delta_cap if delta_cap is not None else (existing.delta_cap if existing is not None else 1e-5)
    total = None
    if running_total is not None:
        if existing is not None:
            raise SnapshotRefused(f"series {series!r} exists: a running total is declared with the series' first "
                                  "snapshot (start a new series to add one)")
        if reference is not None:
            raise SnapshotRefused("running total: it reads escrowed snapshots; an --external series cannot have one "
                                  "(register the files instead)")
        total = running_totals.RunningTotal.from_dict(running_total, schema)
        running_totals.check_declaration(total, mode, cap, delta)
    name = store_series.snapshot_dataset_name(series, snapshot)
    if reference is not None:
        dataset = external_data.register_external(settings, name, reference, privacy_unit, cap, delta,
                                                  risk_profile=risk_profile)
    else:
        dataset = admin.register_dataset(settings, name, Path(path), privacy_unit, cap, delta, add_row_id=add_row_id,
                                         risk_profile=risk_profile)
    pause_point("snapshot_sealed")
    try:
        if existing is None:
            store_series.add_series(store, series, privacy_unit=privacy_unit, schema=json.loads(dataset.schema_json),
                                    budget_mode=mode, epsilon_cap=cap, delta_cap=delta)
        store_series.add_snapshot(store, series, snapshot, dataset.name)
    except BaseException:  # refused where it is recorded (a registration at once took a later label): nothing kept
        forgotten = store_series.forget_unrecorded_dataset(store, dataset.name)
        if forgotten is not None and forgotten.file_format in FILE_FORMATS:  # this registration's own blob
            escrow.location.remove(forgotten.blob_path)
        raise
    if total is not None:  # charged once, for the whole horizon
        store_series.declare_running_total(store, series, total.to_dict(), total.epsilon, total.delta)
    return dataset


def file_schema(path: Path, row_id_column: str | None = None) -> dict[str, str]:
    """The schema a file would be registered with (column -> type), read from its header only."""
    from .admin import _int64_field, _schema_names

    source = escrow.read_source(Path(path))
    try:
        schema = source.schema
    finally:
        source.close()
    if row_id_column is not None:
        schema = schema.insert(0, _int64_field(row_id_column))
    return _schema_names(schema)


def dataset_for_policy(store: Store, name: str) -> str:
    """A policy given for a series applies to its latest snapshot and is carried over to every
    later one (store.series.add_snapshot); any other name is a dataset's."""
    store.create_all()
    if store_series.find_series(store, name) is None:
        return name
    return store_series.resolve(store, name, "latest").dataset


# --- refusals and the series page ---------------------------------------------------------------------

REFUSALS_FILE = "refusals.jsonl"  # every scheduled run of the series that published nothing (controller)


def _series_archive(settings: Settings, series: str) -> Path:
    return settings.archive_dir / "series" / series


def note_refusal(platform, series: str, snapshot: str, why: str, run_id=None, public: bool = False) -> None:
    """Record a run of the series that published nothing (archive); a public one (a missing
    snapshot: a fact about the schedule, not about anyone's data) is shown on the series page,
    which is published again at once when the series exists."""
    from datetime import UTC, datetime

    folder = _series_archive(platform.settings, series)
    folder.mkdir(parents=True, exist_ok=True)
    entry = {"at": datetime.now(UTC).isoformat(timespec="seconds"), "snapshot": snapshot, "why": why[:500],
             "flow_run_id": str(run_id) if run_id else None, "public": public}
    with (folder / REFUSALS_FILE).open("a") as fh:
        fh.write(json.dumps(entry) + "\n")
    if public and store_series.find_series(platform.store, series) is not None:
        publish_series_page(platform, series)


def _public_refusals(settings: Settings, series: str) -> list[dict]:
    path = _series_archive(settings, series) / REFUSALS_FILE
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"at": e["at"], "snapshot": e["snapshot"], "why": e["why"]} for e in entries if e.get("public")]


def published_periods(platform, series: str) -> list:
    """The series' published periods, oldest first, read back from their signed release folders."""
    import hashlib

    from .reporting.series_page import Period
    from .reporting.signing import MANIFEST

    held = store_series.claims(platform.store, series)
    periods = []
    for snap in store_series.snapshots(platform.store, series):
        release_id = held.get(snap.snapshot)
        if release_id is None or platform.store.get_release(release_id).status != "published":
            continue
        folder = platform.settings.publication_dir / release_id
        if not (folder / MANIFEST).exists():  # published from another host: its folder is in the shared archive
            shared_archive.pull(platform.settings, folder)
        if not (folder / MANIFEST).exists():  # the page shows signed numbers only, never the store's word alone
            raise SeriesPageRefused(
                f"series {series!r}: period {snap.snapshot}'s release {release_id} is published in the store but "
                f"its signed folder {folder} is missing, so the series page cannot show it: put the release's "
                "signed folder back (from a backup or the shared archive)")
        manifest_bytes = (folder / MANIFEST).read_bytes()
        facts = json.loads(manifest_bytes)["facts"]
        public = json.loads((folder / "results.json").read_text())
        periods.append(Period(snapshot=snap.snapshot, release_id=release_id, path=f"../../{release_id}/index.html",
                              epsilon=facts["epsilon"], delta=facts["delta"], published_at=facts["published_at"],
                              approved_by=facts["approved_by"],
                              manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest(), rows=public["rows"],
                              title=facts.get("title") or series, public=public))
    return periods


def snapshots_to_publish(store: Store, series: str) -> list:
    """What the `latest` rule publishes: every registered snapshot not yet published, oldest label
    first; a snapshot that another run holds (being published) is left to that run. SnapshotRefused
    (no new snapshot, naming the newest) when there is none."""
    store_series.get_series(store, series)
    known = store_series.snapshots(store, series)
    if not known:
        raise SnapshotRefused(f"series {series!r} has no snapshot yet: register one first")
    held = store_series.claims(store, series)
    waiting = [snap for snap in known if snap.snapshot not in held
               or store.get_release(held[snap.snapshot]).status in store_series.UNPUBLISHED_ENDS]
    if not waiting:
        store_series.check_new(store, series, known[-1].snapshot)  # the newest is published: says so
        raise SnapshotRefused(f"every snapshot of series {series!r} is published or being published by another run "
                              "(nothing spent)")
    return waiting


def series_directory(settings: Settings, series: str) -> Path:
    """Where the series page is published: publication/series/NAME/."""
    return settings.publication_dir / "series" / series


def publish_series_page(platform, series: str) -> Path:
    """Write, sign and put in place the series page with series.csv and series.json (staged and
    swapped in, under a lock so that two runs finishing at once do not interleave)."""
    import fcntl
    import shutil

    from . import running_total as running_totals
    from .reporting import signing
    from .reporting.series_page import render_series_page

    settings = platform.settings
    root = settings.publication_dir / "series"
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        periods = published_periods(platform, series)
        budget = store_series.series_budget(platform.store, series)
        latest = periods[-1].public if periods else {"group_by": [], "aggregates": [], "confidence": None}
        keys, statistics = list(latest["group_by"]), [a["name"] for a in latest["aggregates"]]
        title = (periods[-1].title.rsplit(": ", 1)[0] if periods else series)
        directory = series_directory(settings, series)
        hint = signing.verify_hint(directory.name)
        staging = root / f".staging-{series}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        running = running_totals.released(settings, series)
        (staging / "index.html").write_text(render_series_page(
            series, title, periods, keys, statistics, budget, _public_refusals(settings, series),
            latest.get("confidence"), hint, running))
        _write_series_data(staging, series, title, periods, keys, statistics, budget)
        if running is not None:  # the running total's public table, beside the series' data
            (staging / "running-total.json").write_text(json.dumps(running, indent=2) + "\n", encoding="utf-8")
        facts = {"kind": "series", "series": series, "title": title, "composition": budget["composition"],
                 "epsilon_total": budget["epsilon_total"], "delta_total": budget["delta_total"],
                 "periods": [{"snapshot": p.snapshot, "release_id": p.release_id, "epsilon": p.epsilon,
                              "delta": p.delta, "release_manifest_sha256": p.manifest_sha256} for p in periods]}
        if running is not None:
            facts["running_total"] = {"epsilon": running["epsilon"], "delta": running["delta"],
                                      "horizon": running["horizon"], "periods_released": running["periods_released"],
                                      "charged": "once, for the whole horizon"}
            if running.get("groups_chosen"):  # groups chosen at the series' start: which, when, at what cost
                chosen = running["groups_chosen"]
                facts["running_total"]["groups_chosen"] = {
                    "snapshot": chosen["snapshot"], "groups": running["groups"], "epsilon": chosen["epsilon"],
                    "delta": chosen["delta"], "threshold": chosen["threshold"]}
        signing.sign_directory(staging, facts, signing.load_private_key(settings.signing_key_file))
        old = root / f".old-{series}"
        shutil.rmtree(old, ignore_errors=True)
        if directory.exists():
            directory.rename(old)
        staging.rename(directory)
        shutil.rmtree(old, ignore_errors=True)
    return directory


def _write_series_data(folder: Path, series: str, title: str, periods: list, keys: list[str], statistics: list[str],
                       budget: dict) -> None:
    """series.csv (one row per period and group, spreadsheet-safe) and series.json (exact)."""
    import csv

    import pandas as pd

    from .reporting.data_files import safe_for_spreadsheets

    columns = ["snapshot", "release_id", *keys]
    for s in statistics:
        columns += [s, f"{s}_ci_low", f"{s}_ci_high"]
    rows = [{"snapshot": p.snapshot, "release_id": p.release_id, **{c: row.get(c) for c in columns[2:]}}
            for p in periods for row in p.rows]
    safe_for_spreadsheets(pd.DataFrame(rows, columns=columns)).to_csv(
        folder / "series.csv", index=False, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    document = {"series": series, "title": title, "group_by": keys, "statistics": statistics, "budget": budget,
                "periods": [{"snapshot": p.snapshot, "release_id": p.release_id, "epsilon": p.epsilon,
                             "delta": p.delta, "published_at": p.published_at, "release": p.path, "rows": p.rows}
                            for p in periods]}
    (folder / "series.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def index_entries(platform) -> list[dict]:
    """The publication index's series section: a link to each series page, and the last run that
    found its snapshot missing."""
    out = []
    for s in store_series.list_series(platform.store):
        page = series_directory(platform.settings, s.name) / "index.html"
        if not page.exists():
            continue
        refusals = _public_refusals(platform.settings, s.name)
        out.append({"name": s.name, "path": f"series/{s.name}/index.html",
                    "notice": f"{refusals[-1]['at']}: {refusals[-1]['why']}" if refusals else ""})
    return out
