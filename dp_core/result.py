"""The result of a DP query: a public view for analysts, and a controller-only field.

`DPResult.table`, `mechanisms`, `budget` and everything `to_dict()` returns are differentially
private or derived from public parameters. `controller_only` holds numbers computed from raw data
(partition loss, clamping loss, bounding loss, exact values): not DP, for the trusted controller
only. `repr`, `to_dict`, `to_json` and `str` never include it (usability.md, "Measures of accuracy").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from . import display
from .accounting import Share
from .query import Query
from .release import MechanismRecord

CI_NOTE = (
    "Confidence intervals cover the noise only: not the bias from clamping to the bounds, nor "
    "partitions dropped by selection. Quantiles have no interval."
)


@dataclass(frozen=True)
class ClampingLoss:
    """Per aggregate: per-unit values clamped to the bounds and the total distance moved."""

    values: int
    clamped: int
    total_shift: float


@dataclass(frozen=True)
class ControllerOnly:
    """Numbers computed from raw data, NOT differentially private: never show them to analysts."""

    partitions_nonempty: int
    partitions_released: int
    clamping: dict[str, ClampingLoss]
    unit_partition_pairs: int
    pairs_dropped_by_bounding: int
    exact: pd.DataFrame = field(repr=False)
    pri_ranges: tuple = ()  # when epsilon was chosen from the PRI: pri.PRIRange per candidate

    @property
    def partitions_dropped(self) -> int:
        return self.partitions_nonempty - self.partitions_released

    @property
    def partition_loss(self) -> float:
        """Share of non-empty partitions that selection dropped (0 when there were none)."""
        return self.partitions_dropped / self.partitions_nonempty if self.partitions_nonempty else 0.0

    def summary(self) -> dict:
        return {
            "partitions_nonempty": self.partitions_nonempty,
            "partitions_released": self.partitions_released,
            "partitions_dropped": self.partitions_dropped,
            "partition_loss": self.partition_loss,
            "unit_partition_pairs": self.unit_partition_pairs,
            "pairs_dropped_by_bounding": self.pairs_dropped_by_bounding,
            "clamping": {k: asdict(v) for k, v in self.clamping.items()},
            "pri_ranges": [asdict(r) for r in self.pri_ranges],
        }


class ChosenEpsilon(Protocol):
    """What a result reads of how epsilon was chosen (pri.EpsilonChoice; named by its fields here
    because pri imports the engine, which builds results)."""

    @property
    def mode(self) -> str: ...
    @property
    def p(self) -> float: ...
    @property
    def guarantee(self) -> str: ...

    def public_summary(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class DPResult:
    """Released partitions with values and confidence intervals, and how they were protected."""

    table: pd.DataFrame
    query: Query
    epsilon_spent: float
    delta_spent: float
    budget: tuple[Share, ...]
    mechanisms: tuple[MechanismRecord, ...]
    partition_selection: str
    notes: tuple[str, ...]
    controller_only: ControllerOnly = field(repr=False, compare=False)
    epsilon_choice: ChosenEpsilon | None = None  # pri.EpsilonChoice (public part) when the platform chose epsilon
    inferred_bounds: tuple = ()  # bounds.InferredBounds: bounds chosen by APPROX_BOUNDS, with their DP histograms
    #: the tables a SQL statement read, as (name, privacy unit or None): protected ones are what the
    #: budget is charged for; public ones (no unit) hold no one's rows and are never charged
    tables_read: tuple = ()

    def __post_init__(self) -> None:
        # a count is released on the integers (its value and interval ends are whole): it is held as
        # integers, so the data files and the Python API show 932, not 932.0
        object.__setattr__(self, "table", integer_counts(self.table, self.query))

    def __str__(self) -> str:
        head = (
            f"DP release: epsilon={display.budget(self.epsilon_spent)}, delta={display.budget(self.delta_spent)}, "
            f"{len(self.table)} partition(s); each value with its {self.query.confidence * 100:g}% confidence interval"
        )
        return f"{head}\n{self.readable_table().to_string(index=False)}\n{CI_NOTE}"

    def readable_table(self) -> pd.DataFrame:
        """The released table with one text column per aggregate: `value [low, high]`."""
        out = self.table[list(self.query.group_by)].copy()
        for agg in self.query.aggregates:
            name = agg.label
            whole = display.is_integer_kind(agg.kind)
            out[name] = [display.interval(v, lo, hi, whole) for v, lo, hi in
                         zip(self.table[name], self.table[f"{name}_ci_low"], self.table[f"{name}_ci_high"])]
        return out

    def to_dict(self) -> dict:
        """The public view as plain data (what an analyst may receive)."""
        q = self.query
        return {
            "epsilon": self.epsilon_spent,
            "delta": self.delta_spent,
            "privacy_unit": q.privacy_unit,
            "group_by": list(q.group_by),
            "max_partitions_contributed": q.max_partitions_contributed,
            "confidence": q.confidence,
            "partition_selection": self.partition_selection,
            "budget": [asdict(s) for s in self.budget],
            "mechanisms": [m.to_dict() for m in self.mechanisms],
            "aggregates": [
                {"name": a.label, "kind": a.kind, "column": a.column, "lower": a.lower, "upper": a.upper, "q": a.q}
                for a in q.aggregates
            ],
            "inferred_bounds": [b.to_dict() for b in self.inferred_bounds],
            "notes": list(self.notes),
            "epsilon_choice": self.epsilon_choice.public_summary() if self.epsilon_choice is not None else None,
            "rows": json.loads(self.table.to_json(orient="records", date_format="iso")),
            **({"tables": self.tables_summary()} if self.tables_read else {}),
        }

    def tables_summary(self) -> list[dict]:
        """Each table the statement read: protected (charged) or public (not charged)."""
        return [{"name": name, "public": unit is None, "charged": unit is not None,
                 **({"privacy_unit": unit} if unit is not None else {})} for name, unit in self.tables_read]

    def to_json(self, **kwargs: Any) -> str:
        # json writes every value of to_dict itself (numpy's float64 is a Python float; bounds and keys are
        # Python numbers) but one: a date or timestamp partition key of per-partition bounds (a pandas
        # Timestamp), written as its text
        return json.dumps(self.to_dict(), default=str, **kwargs)

    def explain(self) -> str:
        """Plain text: the budget split and each mechanism with its sensitivity and scale."""
        eps = display.budget
        lines = [f"Total: epsilon {eps(self.epsilon_spent)}, delta {eps(self.delta_spent)} (basic composition)"]
        lines += [f"  share {s.part}: epsilon {eps(s.epsilon)}, delta {eps(s.delta)}"
                  + (f", rho {eps(s.rho)}" if s.rho else "") for s in self.budget]
        lines.append(f"Partition selection: {self.partition_selection}")
        for m in self.mechanisms:
            scale = f", scale {m.scale:.6g}" if m.scale is not None else ""
            lines.append(
                f"  {m.target}: {m.mechanism}, sensitivity {m.sensitivity_per_partition:g} per partition "
                f"x C_u={m.max_partitions} -> {m.sensitivity:g}{scale}, epsilon {eps(m.epsilon)}"
                + (f", rho {eps(m.rho)}" if m.rho else "") + (f" ({m.note})" if m.note else "")
            )
        for b in self.inferred_bounds:
            lo = "0" if b.lower is None else f"{b.lower:g}"
            hi = "given" if b.upper is None else f"{b.upper:g}"
            lines.append(f"  bounds of {b.aggregate} inferred (APPROX_BOUNDS): [{lo}, {hi}], "
                         f"estimated share of values outside: {b.outside_share:.1%}")
        lines += list(self.notes)
        if self.epsilon_choice is not None:
            c = self.epsilon_choice
            lines.append(f"Epsilon chosen from the privacy risk indicator ({c.mode} mode, p = {c.p:g}): {c.guarantee}.")
        return "\n".join(lines)


def integer_counts(table: pd.DataFrame, query: Query) -> pd.DataFrame:
    """The table with each count's value and interval ends as integers (int64), when all of them are
    whole numbers (a count always is: its noise is on the integers); other columns as they are."""
    columns = [f"{a.label}{suffix}" for a in query.aggregates if display.is_integer_kind(a.kind)
               for suffix in ("", "_ci_low", "_ci_high")]
    columns = [c for c in columns if c in table.columns and table[c].dtype.kind == "f"]
    whole = [c for c in columns if np.isfinite(table[c].to_numpy()).all()
             and (table[c].to_numpy() == np.round(table[c].to_numpy())).all()]
    if not whole:
        return table
    return table.astype({c: "int64" for c in whole})
