"""A series' running total: each period's value and every total to date, released under one budget
charged once for the whole horizon (the tree mechanism, dp_core.continual; docs/continual-release.md).

Declared when the series is created (`register_snapshot(..., running_total={...})`, or
`dprelease dataset register ... --running-total FILE`): the statistic (COUNT, SUM or
COUNT_DISTINCT of the unit), the horizon T, what one unit may contribute (B per period, in at most k
periods, at most C_u groups) and the (epsilon, delta) for all T periods. Only a series_cap series
(the same people in every period) has one. The budget is a ledger entry on the first snapshot,
reserved and committed at the declaration; no period spends anything more.

By group, the groups are either public (`groups: [...]`, declared) or, with `group_by` alone, chosen
at the first release from the first period's data by the engine's partition selection, with the
declared `selection_share` of the (epsilon, delta) (dp_core.continual_selection, where the split and
the per-unit bound are derived); the chosen groups are sealed with the tree's noise and kept for
the whole horizon.

Each period released by the scheduled publication (flows/publication.py), once its own release is
approved and published, adds the running total's period t (`release_published`: through the newest
period up to which every period's own release is published, so no period's data enters it before
its own approval): the exact values of periods 1..t
(every unit bounded over the horizon, dp_core.continual_bounding), the noise of the tree nodes
that complete by t drawn once and sealed (encrypted with the escrow key in the controller's archive)
before anything is written, then the period values and totals to date with their intervals, next to
the interval the naive sum of monthly releases would have had. Public values only leave this module.
"""

from __future__ import annotations

import fcntl
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
from cryptography.fernet import Fernet

from dp_core import display
from dp_core.continual import ContributionBound, TreeNoise, calibrate_tree
from dp_core.continual import release_period as release_tree_period
from dp_core.continual_bounding import STATISTICS, bounded_period_values, sum_quantum
from dp_core.continual_selection import (
    DEFAULT_SELECTION_SHARE,
    GroupSelection,
    HorizonBudget,
    choose_groups,
    horizon_budget,
)
from dp_core.errors import DPError
from dp_core.query import BOUND_MAGNITUDE, COUNT_BOUND_MAX

from . import escrow
from .store import series as store_series
from .store.series import SnapshotRefused

#: the public file of the running total's releases, beside the series' refusals in the archive
RELEASED_FILE = "running-total.json"
NOISE_FILE = "running-total-noise.fernet"  # the sealed node noise (controller only)
#: the fields of a declaration file
FIELDS = ("name", "statistic", "value", "group_by", "groups", "horizon", "per_period", "periods", "max_groups",
          "epsilon", "delta", "confidence", "selection_share")


class RunningTotalRefused(SnapshotRefused):
    """A running total that cannot be declared or released: what is wrong and how to fix it."""


@dataclass(frozen=True)
class RunningTotal:
    """The declaration: what is totalled, over how many periods, how each unit is bounded, at what budget."""

    statistic: str
    horizon: int
    epsilon: float
    delta: float
    name: str = "total to date"
    value: str | None = None
    group_by: str | None = None
    groups: list = field(default_factory=list)
    per_period: float = 1.0
    periods: int = 1
    max_groups: int = 1
    confidence: float = 0.95
    selection_share: float | None = None  # with group_by and no public groups: the selection's share of the budget
    #: what a SUM's per-unit values are rounded to, fixed at the declaration from the column's type
    #: (continual_bounding.sum_quantum); 1 for counts and for declarations made before it was recorded
    quantum: float = 1.0

    @classmethod
    def from_dict(cls, data: dict, schema: dict[str, str] | None = None) -> RunningTotal:
        """Read and check a declaration (a YAML or JSON mapping); RunningTotalRefused names the field."""
        if not isinstance(data, dict):
            raise RunningTotalRefused("running total: the declaration must be a mapping of fields "
                                      f"({', '.join(FIELDS)})")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise RunningTotalRefused(f"running total: unknown field {unknown[0]!r} "
                                      f"(the fields are {', '.join(FIELDS)})")
        missing = [f for f in ("statistic", "horizon", "epsilon", "delta") if f not in data]
        if missing:
            raise RunningTotalRefused(f"running total: give {', '.join(missing)} (e.g. statistic: COUNT_DISTINCT, "
                                      "horizon: 12, epsilon: 1, delta: 1e-6)")
        spec = dict(data)
        spec["statistic"] = str(spec["statistic"]).upper().replace(" ", "_")
        if spec["statistic"] not in STATISTICS:
            raise RunningTotalRefused(f"running total: statistic must be one of {', '.join(STATISTICS)}, "
                                      f"got {data['statistic']!r}")
        for name, kind in (("horizon", int), ("periods", int), ("max_groups", int)):
            if name in spec and (isinstance(spec[name], bool) or not isinstance(spec[name], int) or spec[name] < 1):
                raise RunningTotalRefused(f"running total: {name} must be a whole number >= 1, got {spec[name]!r}")
        for name, low, high in (("epsilon", 0, math.inf), ("delta", 0, 1), ("per_period", 0, math.inf),
                                ("confidence", 0, 1), ("selection_share", 0, 1)):
            if name in spec:
                try:
                    spec[name] = float(spec[name])
                except (TypeError, ValueError):
                    spec[name] = math.nan
                if not (low < spec[name] < high):
                    raise RunningTotalRefused(f"running total: {name} must be a number in ({low}, {high}), "
                                              f"got {data[name]!r}")
        if spec["statistic"] == "SUM" and not spec.get("value"):
            raise RunningTotalRefused("running total: a SUM needs `value: COLUMN` (and per_period: the largest "
                                      "contribution of one unit to one period)")
        if spec["statistic"] == "COUNT_DISTINCT":  # a unit counts once, where it first appears: B = 1, k = 1
            spec["per_period"], spec["periods"] = 1.0, 1
        per_period = spec.get("per_period", 1.0)
        if spec["statistic"] == "COUNT" and not (per_period.is_integer() and per_period <= COUNT_BOUND_MAX):
            raise RunningTotalRefused("running total: a COUNT's per_period is a whole number of rows from 1 to "
                                      f"2^31 - 1, got {data['per_period']!r}")
        if spec["statistic"] == "SUM" and not BOUND_MAGNITUDE[0] <= per_period <= BOUND_MAGNITUDE[1]:
            raise RunningTotalRefused(  # the engine's bounds (dp_core.query): the grid's steps stay normal doubles
                f"running total: a SUM's per_period must be between 2^-100 and 2^100 (about 7.9e-31 to 1.27e30: beyond, "
                f"the noise's grid underflows or its values overflow), got {data['per_period']!r}: express the column "
                "in other units (thousands, millionths)")
        if spec.get("groups") and not spec.get("group_by"):
            raise RunningTotalRefused("running total: public `groups: [...]` need their `group_by: COLUMN`")
        if not isinstance(spec.get("groups", []), list):
            raise RunningTotalRefused(f"running total: groups must be a list (groups: [North, South]), got "
                                      f"{spec['groups']!r}")
        twice = next((g for i, g in enumerate(spec.get("groups") or []) if g in spec["groups"][:i]), None)
        if twice is not None:  # each would be totalled apart, a person counting in the first only
            raise RunningTotalRefused(f"running total: group {twice!r} is listed twice in `groups`; list each once")
        if spec.get("group_by") and not spec.get("groups"):  # groups chosen privately from the first period
            spec.setdefault("selection_share", DEFAULT_SELECTION_SHARE)
        elif "selection_share" in spec:
            raise RunningTotalRefused("running total: selection_share is the budget share that chooses the groups "
                                      "of a `group_by` without public `groups`; drop it (public groups cost nothing)")
        for column in (spec.get("value"), spec.get("group_by")):
            if column and schema is not None and column not in schema:
                raise RunningTotalRefused(f"running total: column {column!r} is not in the series "
                                          f"(columns: {', '.join(schema)})")
        group_type = (schema or {}).get(spec.get("group_by") or "", "")
        if "selection_share" in spec and group_type.startswith(("datetime64", "timedelta64")):
            raise RunningTotalRefused(f"running total: groups chosen from the data are text or numbers, and "
                                      f"{spec['group_by']!r} holds {group_type} values (group by a text column)")
        spec.setdefault("groups", [])
        if spec["statistic"] == "SUM":  # a column of unknown type is rounded as a real one
            value_type = (schema or {}).get(spec["value"], "float")
            spec["quantum"] = sum_quantum(spec.get("per_period", 1.0), value_type.lower().startswith(("int", "uint")))
        return cls(**spec)

    @property
    def bound(self) -> ContributionBound:
        return ContributionBound(float(self.per_period), int(self.periods), int(self.max_groups))

    @property
    def selects_groups(self) -> bool:
        """By group without public groups: the first period's data chooses them, once."""
        return bool(self.group_by) and not self.groups

    def budget(self) -> HorizonBudget:
        """The (epsilon, delta) split between the group selection (if any) and the tree's rho."""
        return horizon_budget(self.epsilon, self.delta, self.selection_share if self.selects_groups else None)

    def calibration(self):
        """The tree's noise for the horizon: its rho from its share of (epsilon, delta), by the tight conversion."""
        return calibrate_tree(horizon=self.horizon, bound=self.bound, rho=self.budget().rho, confidence=self.confidence,
                              quantum=self.quantum)

    def to_dict(self) -> dict:
        return asdict(self)


def check_declaration(spec: RunningTotal, budget_mode: str, epsilon_cap: float, delta_cap: float) -> None:
    """Before anything is written: a running total spans periods, so it needs the series cap, and
    its (epsilon, delta), charged at once, must fit the series' caps (else the charge would fail
    after the series is created, leaving a series without its running total)."""
    if budget_mode != "series_cap":
        raise RunningTotalRefused("running total: it spans periods, so the series must be --series-budget "
                                  "series_cap (one cap for the same people in every period)")
    if spec.epsilon > epsilon_cap:
        raise RunningTotalRefused(f"running total: epsilon {spec.epsilon:g} is over the series cap "
                                  f"{epsilon_cap:g} (it is charged once, for all {spec.horizon} periods)")
    if spec.delta > delta_cap:
        raise RunningTotalRefused(f"running total: delta {spec.delta:g} is over the series' delta cap {delta_cap:g} "
                                  f"(it is charged once, for all {spec.horizon} periods): declare a smaller delta "
                                  "or give a larger --delta-cap")
    spec.calibration()  # the engine's refusals (e.g. a horizon over its limit) before anything is written


def check_next_label(store, series: str, snapshot: str) -> None:
    """A series with a running total takes only a snapshot that sorts after its newest: periods are
    numbered in label order and period s's sealed node noise is added to period s's data at every
    later release, so a snapshot sorting before a released one would take that period's place and
    its noise, and two published values would differ by the two periods' exact difference."""
    if store_series.running_total_declaration(store, series) is None:
        return
    newest = max(s.snapshot for s in store_series.snapshots(store, series))
    try:
        store_series.check_after_newest(series, snapshot, newest)
    except store_series.SnapshotRefused as refused:
        raise RunningTotalRefused(str(refused)) from None
    padded = store_series.same_widths(snapshot, newest)
    if padded != snapshot:
        raise RunningTotalRefused(
            f"running total of series {series!r}: snapshot {snapshot} writes a number with other digits than "
            f"{newest}, so the labels after it would sort before it and be refused (as 2026-10 sorts before 2026-2): "
            f"write its numbers as the series does{f', {padded}' if padded and padded > newest else ''}; nothing "
            "registered")


def _sealed_periods(settings, series: str, sealed: dict | None) -> list[str]:
    """The snapshots of the periods whose node noise is drawn, in order: as sealed, or, for a state
    sealed before they were recorded, as the published rows name them (every drawn node's period is
    in them; with no group chosen nothing was drawn nor published)."""
    if sealed is None:
        return []
    if "periods" in sealed:
        return sealed["periods"]
    shown = released(settings, series)
    return list(dict.fromkeys(row["snapshot"] for row in shown["rows"])) if shown else []


def _check_sealed_periods(series: str, drawn: list[str], labels: list[str]) -> None:
    """The periods whose node noise is sealed must be the same snapshots in the same places: a
    node's noise is only ever added to its own periods' data (`check_next_label`)."""
    if labels[:len(drawn)] == drawn:
        return
    moved = next(i for i, label in enumerate(drawn) if i >= len(labels) or labels[i] != label)
    now = labels[moved] if moved < len(labels) else "missing"
    raise RunningTotalRefused(
        f"running total of series {series!r}: period {moved + 1} was {drawn[moved]} when its noise was sealed and is "
        f"now {now} (a snapshot out of label order); its noise is not added to other data, nothing released: "
        "remove that snapshot from the series")


def declaration(store, series: str) -> RunningTotal | None:
    found = store_series.running_total_declaration(store, series)
    return None if found is None else RunningTotal(**json.loads(found.spec_json))


def _folder(settings, series: str) -> Path:
    return settings.archive_dir / "series" / series


def released(settings, series: str) -> dict | None:
    """The running total as last released (public values), or None."""
    path = _folder(settings, series) / RELEASED_FILE
    return json.loads(path.read_text()) if path.exists() else None


def release_period(platform, series: str, snapshot: str) -> dict:
    """Release the running total through `snapshot` (its period t, 1-based in label order): the
    groups chosen at the first release if the declaration has no public ones (kept, never chosen
    again), the node noise of periods <= t drawn once (the sealed noise reused), both sealed before
    anything is written, then the public table written (unless a later period is already shown:
    its rows hold these). Returns the public document."""
    spec = declaration(platform.store, series)
    if spec is None:
        raise RunningTotalRefused(f"series {series!r} has no running total")
    labels = [s.snapshot for s in store_series.snapshots(platform.store, series)]
    t = labels.index(snapshot) + 1
    if t > spec.horizon:
        raise RunningTotalRefused(f"running total of series {series!r}: its horizon of {spec.horizon} periods ended "
                                  f"at {labels[spec.horizon - 1]}; {snapshot} is not in it (declare a new series)")
    unit = store_series.get_series(platform.store, series).privacy_unit
    data = pd.concat(_period_frames(platform, series, spec, unit, t), ignore_index=True)
    cal = spec.calibration()
    folder = _folder(platform.settings, series)
    folder.mkdir(parents=True, exist_ok=True)
    fernet = Fernet(platform.escrow_key())
    with (folder / ".running-total.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = folder / NOISE_FILE
        sealed = _sealed_state(path, fernet)
        drawn = _sealed_periods(platform.settings, series, sealed)
        _check_sealed_periods(series, drawn, labels)
        selection = _horizon_selection(spec, sealed, data, unit)
        groups = selection.groups if selection is not None else list(spec.groups)
        noise = TreeNoise.from_dict(sealed) if sealed is not None else TreeNoise(groups=max(1, len(groups)))
        result = None
        if groups or not spec.group_by:  # no group chosen: nothing to total, no tree noise drawn
            exact = bounded_period_values(data, unit=unit, period="_period", statistic=spec.statistic,
                                          periods=spec.periods, groups=groups or None, group_by=spec.group_by,
                                          value=spec.value, per_period=spec.per_period, max_groups=spec.max_groups,
                                          quantum=spec.quantum, horizon=t)
            result = release_tree_period(cal, noise, exact)
        kept = {**noise.to_dict(), "periods": labels[:max(t, len(drawn))],  # the drawn periods' snapshots
                **({"selection": selection.to_dict()} if selection is not None else {})}
        tmp = path.with_suffix(".tmp")  # sealed before anything derived from it is written
        tmp.write_bytes(fernet.encrypt(json.dumps(kept).encode()))
        tmp.replace(path)
        document = public_document(series, spec, cal, labels[:t], result, groups, selection)
        out = folder / RELEASED_FILE
        shown = released(platform.settings, series)
        if shown is None or shown["periods_released"] <= t:  # an earlier period again: the later stay shown
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
            tmp.replace(out)
    return document


def release_published(platform, series: str, snapshot: str) -> str | None:
    """After `snapshot`'s release is published: the running total through the newest period of the
    horizon up to which every period's own release is published. The total through period t carries
    period t's data, so a period not published (its release rejected, or still to come) holds it at
    the period before; its data enters once its own release is approved. Returns what the run
    should log when the total does not reach `snapshot` (held, or past the horizon), else None."""
    spec = declaration(platform.store, series)
    if spec is None:
        return None
    held = store_series.claims(platform.store, series)
    labels = [s.snapshot for s in store_series.snapshots(platform.store, series)]
    through = None
    for label in labels[:spec.horizon]:
        release_id = held.get(label)
        if release_id is None or platform.store.get_release(release_id).status != "published":
            break
        through = label
    if through is not None:
        release_period(platform, series, through)
    if labels.index(snapshot) >= spec.horizon:
        return (f"running total of series {series!r}: its horizon of {spec.horizon} periods ended at "
                f"{labels[spec.horizon - 1]}; {snapshot} is not in it (declare a new series)")
    if through is None or labels.index(through) < labels.index(snapshot):
        waiting = labels[0 if through is None else labels.index(through) + 1]
        return (f"running total of series {series!r}: released through {through or 'no period'}, not {snapshot}: "
                f"{waiting} is not published (its data enters the running total once its own release is)")
    return None


def _period_frames(platform, series: str, spec: RunningTotal, unit: str, t: int) -> list[pd.DataFrame]:
    """The escrowed rows of periods 1..t, the columns the running total reads, each with its `_period`."""
    frames = []
    for period, snap in enumerate(store_series.snapshots(platform.store, series)[:t], start=1):
        ds = platform.store.get_dataset(snap.dataset)
        if ds.file_format.startswith("external"):
            raise RunningTotalRefused(f"running total of series {series!r}: snapshot {snap.snapshot} is external "
                                      "(computed on Spark); a running total reads escrowed snapshots only")
        frame = escrow.load_frame(ds.blob_path, platform.escrow_key(), ds.fingerprint, ds.file_format)
        columns = [c for c in {unit, spec.value, spec.group_by} if c]
        frames.append(frame[columns].assign(_period=period))
    return frames


def _sealed_state(path: Path, fernet: Fernet) -> dict | None:
    """What the earlier releases sealed (the tree's node noise, the chosen groups), or None before the first."""
    return json.loads(fernet.decrypt(path.read_bytes())) if path.exists() else None


def _horizon_selection(spec: RunningTotal, sealed: dict | None, data: pd.DataFrame, unit: str) -> GroupSelection | None:
    """The horizon's chosen groups: the sealed choice if there is one, else chosen now from period 1's
    rows (the first release); None when the groups are public or there are none."""
    if not spec.selects_groups:
        return None
    if sealed is not None and "selection" in sealed:
        return GroupSelection.from_dict(sealed["selection"])
    try:
        return choose_groups(data[data["_period"] == 1], unit=unit, group_by=spec.group_by,
                             max_groups=spec.max_groups, share=spec.budget().selection)
    except DPError as err:
        raise RunningTotalRefused(f"running total: {err}") from None


def node_noise(cal) -> dict:
    """Each node's noise as an auditor re-derives it, from public parameters only: the discrete
    Gaussian on the grid g with sigma^2 = Delta_2^2 / (2 rho) (in the statistic's units), its exact
    variance as sampled, and the rho and L2 sensitivity it was calibrated from."""
    grid = float(cal.grid)
    return {"law": "discrete Gaussian", "grid": grid, "sigma": math.sqrt(float(cal.node_variance_parameter)) * grid,
            "variance": float(cal.node_variance), "rho": float(cal.rho), "l2_sensitivity": float(cal.sensitivity_l2)}


def public_document(series: str, spec: RunningTotal, cal, labels: list[str], result, groups: list,
                    selection: GroupSelection | None = None) -> dict:
    """The released running total: per period and group the period value and the total to date with
    their intervals, and the naive sum's interval at the tree's budget (rho / T per month); with
    groups chosen at the series' start, which were chosen and how (their names are released)."""
    names = [str(g) for g in groups] if spec.group_by else ["all"]
    rows = []
    for s, label in enumerate(labels if result is not None else [], start=1):
        total_half, naive_half = result.total_halfwidths[s - 1], cal.naive_prefix_halfwidth(s)
        for i, group in enumerate(names):
            value, total = float(result.values[s - 1, i]), float(result.totals[s - 1, i])
            rows.append({"snapshot": label, "period": s, "group": group, "value": value,
                         "value_ci_low": value - result.value_halfwidth,
                         "value_ci_high": value + result.value_halfwidth,
                         "total": total, "total_ci_low": total - total_half, "total_ci_high": total + total_half,
                         "naive_ci_halfwidth": naive_half, "total_ci_halfwidth": total_half})
    budget, noise = spec.budget(), node_noise(cal)
    document = {"series": series, "name": spec.name, "statistic": spec.statistic, "horizon": spec.horizon,
                "periods_released": len(labels), "epsilon": spec.epsilon, "delta": spec.delta,
                "rho": cal.rho, "confidence": spec.confidence, "groups": names,
                "bound": {"per_period": spec.per_period, "periods": spec.periods, "max_groups": spec.max_groups},
                "mechanism": f"binary tree over {spec.horizon} periods, {cal.levels} levels, discrete Gaussian noise "
                             f"of sigma {display.value(noise['sigma'])} per node "
                             f"(L2 sensitivity {display.value(cal.sensitivity_l2)})",
                "node_noise": noise, "rows": rows}
    if selection is not None:
        document["groups_chosen"] = {
            "snapshot": labels[0], "strategy": selection.strategy, "threshold": selection.threshold,
            "epsilon": selection.epsilon, "delta": selection.delta, "max_groups": selection.max_groups,
            "tree_epsilon": budget.tree_epsilon, "tree_delta": budget.tree_delta,
            "text": f"{selection.description}; they are kept for the whole horizon: a group that first appears in a "
                    "later period is not in the totals"}
    return document
