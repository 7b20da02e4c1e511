"""The typed query: what to compute, with which bounds and budget. Data-independent.

The SQL front end compiles both SQL syntaxes to this object; the engine executes it. Every check
here looks at the query only, so a malformed query is refused before any data is read.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal, TypeGuard

from .errors import InvalidQueryError
from .input_checks import check_delta, check_epsilon

AggregateKind = Literal["count", "count_units", "sum", "avg", "var", "stddev", "quantile"]
NoiseKind = Literal["laplace", "gaussian"]
SelectionKind = Literal["auto", "laplace-threshold", "truncated-geometric", "weighted_gaussian", "mad", "mad_damped"]

NOISE_KINDS = ("laplace", "gaussian")
SELECTION_KINDS = ("auto", "laplace-threshold", "truncated-geometric", "weighted_gaussian", "mad", "mad_damped")


#: the names the bounding plan, the selections and MAD give their own columns (bounding.py,
#: aggregates.py, selection_mad.py); the group keys and the unit travel through the same relations,
#: and DuckDB matches names without regard to case
PLAN_COLUMN = re.compile(r"_(n_units|dropped_pairs|dropped_part|rk|m|over|cutoff|tie|t|deg|deg_c|c|le|pos|r|b|w1|w2|mad_r1|pid|"
                         r"row_draw|hist|u\d+|a\d+(_\w*)?)", re.IGNORECASE)


#: the columns the controller's table of exact values (ControllerOnly.exact, engine._controller_view)
#: has beside the group keys and the statistics (dp_select: sql/outer.combine's): a key or statistic of the same name
#: would overwrite one
EXACT_COLUMNS = {"units": "the number of privacy units in each group", "released": "whether each group was released",
                 "dp_select": "the number of the DP SELECT each row comes from, in a SQL statement's table"}


#: the columns the released table gives each statistic beside its value (engine.release): `<name>_ci_low`, ...
INTERVAL_SUFFIXES = ("_ci_low", "_ci_high", "_noise_sd")


#: the largest bound magnitude of an AVG, VAR or STDDEV: its squared deviations (up to 2^200), their
#: noise and the noise's square in the interval stay finite doubles (a bound of 1e160 overflowed: an
#: AVG's interval came out zero-wide beside an infinite noise SD, with NumPy's overflow warnings)
SPREAD_BOUND_MAX = 2.0**100

#: the magnitudes a bound of a SUM or a quantile may have, and the smallest non-zero one of any statistic:
#: the noise's grid is 2^-32 of the larger bound (aggregates._quantum), so a bound of 1e-300 made a grid
#: whose inverse overflowed (ZeroDivisionError, or NaN turned into an integer) and a SUM within +-1e300
#: released an overflowed value with NumPy's warnings; 2^-100 .. 2^100 keeps every step a normal double
BOUND_MAGNITUDE = (2.0**-100, 2.0**100)

#: the largest per-unit row bound of a count (OPTIONS' max_groups_contributed has the same): the counts,
#: their noise and their interval ends stay 64-bit integers (2^62 gave the interval [0, -9.2e18], 1e300
#: an OverflowError)
COUNT_BOUND_MAX = 2**31 - 1


def _finite(x: object) -> TypeGuard[int | float]:
    """A finite int or float (not a bool): what every bound, weight and probability must be."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _plain_value(value: object) -> bool:
    """A value a partition key can hold: hashable and not a container (a dict, a list, a nested tuple)."""
    return isinstance(value, Hashable) and not isinstance(value, (tuple, frozenset))


@dataclass(frozen=True)
class Aggregate:
    """One DP aggregate with its contribution bounds.

    kind: `count` (rows, or non-null `column`, per unit clamped to [0, upper]); `count_units`
    (distinct privacy units); `sum`, `avg`, `var`, `stddev` (per-unit value clamped to
    [lower, upper]); `quantile` (the `q`-quantile of per-unit values in [lower, upper]).
    A bound left as None is inferred privately (APPROX_BOUNDS). `weight` is this aggregate's
    relative share of the budget.
    """

    kind: AggregateKind
    column: str | None = None
    lower: float | None = None
    upper: float | None = None
    q: float | None = None
    name: str | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        # a NumPy number (np.int64(4), as a DataFrame's max gives) is taken as the Python number it
        # holds, as a float64 already is: validate() then judges the value, not its type
        for field in ("lower", "upper", "q", "weight"):
            value = getattr(self, field)
            if isinstance(value, numbers.Real) and not isinstance(value, (int, float)) and hasattr(value, "item"):
                object.__setattr__(self, field, value.item())

    @property
    def label(self) -> str:
        """The output column name: the given name, else one derived from kind and column."""
        if self.name:
            return self.name
        if self.kind == "count_units":
            return "count_units"
        if self.kind == "quantile":
            if not _finite(self.q):  # validate() refuses it, naming the aggregate by this label
                return f"quantile_{self.column}"
            tag = {0.0: "min", 0.5: "median", 1.0: "max"}.get(float(self.q), f"q{self.q:g}")
            return f"{tag}_{self.column}"
        return f"{self.kind}_{self.column}" if self.column else self.kind

    def validate(self) -> None:
        """Refuse impossible bounds, a missing column, q outside [0, 1], a bad weight."""
        where = f"aggregate {self.label!r}"
        if self.kind not in ("count", "count_units", "sum", "avg", "var", "stddev", "quantile"):
            raise InvalidQueryError(f"{where}: unknown aggregate kind {self.kind!r}")
        if not (_finite(self.weight) and self.weight > 0):
            raise InvalidQueryError(f"{where}: weight must be a positive number, got {self.weight!r}")
        if self.kind == "count_units":
            return
        if self.kind != "count" and not self.column:
            raise InvalidQueryError(f"{where}: needs a column")
        if self.kind == "count":
            if not (self.lower is None or (_finite(self.lower) and self.lower == 0)):  # the engine never reads it
                raise InvalidQueryError(f"{where}: a count takes no lower bound (each person's rows in a group are "
                                        f"counted from 0 up to the upper bound): leave it out, got {self.lower!r}")
            if self.upper is not None and not (_finite(self.upper) and 1 <= self.upper <= COUNT_BOUND_MAX
                                               and float(self.upper).is_integer()):
                raise InvalidQueryError(
                    f"{where}: the per-unit row bound must be a whole number from 1 to 2^31 - 1, got {self.upper!r}"
                )
            return
        for side, value in (("lower", self.lower), ("upper", self.upper)):
            if value is not None and not _finite(value):
                raise InvalidQueryError(f"{where}: the {side} bound must be a finite number, got {value!r}")
            if value is not None and self.kind in ("avg", "var", "stddev") and abs(value) > SPREAD_BOUND_MAX:
                raise InvalidQueryError(
                    f"{where}: the {side} bound of a mean, variance or standard deviation must be within +-2^100 "
                    f"(about 1.27e30: beyond, its squares overflow), got {value!r}")
            if value is not None and value != 0 and not BOUND_MAGNITUDE[0] <= abs(value) <= BOUND_MAGNITUDE[1]:
                raise InvalidQueryError(
                    f"{where}: the {side} bound must be 0 or between 2^-100 and 2^100 in size (about 7.9e-31 to "
                    f"1.27e30: beyond, the noise's grid underflows or its values overflow), got {value!r}: express "
                    "the column in other units (thousands, millionths) to bring it within")
        if self.lower is not None and self.upper is not None:
            if self.lower > self.upper:
                raise InvalidQueryError(f"{where}: lower bound L={self.lower} exceeds upper bound U={self.upper}")
            if self.kind in ("avg", "var", "stddev", "quantile") and self.lower == self.upper:
                raise InvalidQueryError(f"{where}: bounds must differ (L = U = {self.lower} leaves nothing to learn)")
            if self.kind == "sum" and self.lower == self.upper == 0:
                raise InvalidQueryError(f"{where}: bounds [0, 0] make every sum 0")
        if self.kind == "quantile":
            if not (_finite(self.q) and 0.0 <= self.q <= 1.0):
                raise InvalidQueryError(f"{where}: quantile q must be in [0, 1], got {self.q!r}")

    @property
    def needs_bounds(self) -> bool:
        """True when a bound is left out: the engine infers it with APPROX_BOUNDS."""
        if self.kind == "count_units":
            return False
        if self.kind == "count":
            return self.upper is None
        return self.lower is None or self.upper is None


def count(upper: int = 1, column: str | None = None, name: str | None = None, weight: float = 1.0) -> Aggregate:
    """COUNT(*) (or COUNT(column)): rows per unit and partition clamped to [0, upper]."""
    return Aggregate("count", column=column, upper=upper, name=name, weight=weight)


def count_units(name: str | None = None, weight: float = 1.0) -> Aggregate:
    """COUNT(DISTINCT privacy unit): each unit counts once per partition."""
    return Aggregate("count_units", name=name, weight=weight)


def sum_(column: str, lower: float, upper: float, name: str | None = None, weight: float = 1.0) -> Aggregate:
    """SUM(column) with each unit's per-partition sum clamped to [lower, upper]."""
    return Aggregate("sum", column=column, lower=lower, upper=upper, name=name, weight=weight)


def avg(column: str, lower: float, upper: float, name: str | None = None, weight: float = 1.0) -> Aggregate:
    """AVG over units of each unit's mean, clamped to [lower, upper]."""
    return Aggregate("avg", column=column, lower=lower, upper=upper, name=name, weight=weight)


def var(column: str, lower: float, upper: float, name: str | None = None, weight: float = 1.0) -> Aggregate:
    """Population variance over units of each unit's mean, clamped to [lower, upper]."""
    return Aggregate("var", column=column, lower=lower, upper=upper, name=name, weight=weight)


def stddev(column: str, lower: float, upper: float, name: str | None = None, weight: float = 1.0) -> Aggregate:
    """Square root of `var`."""
    return Aggregate("stddev", column=column, lower=lower, upper=upper, name=name, weight=weight)


def quantile(column: str, q: float, lower: float, upper: float, name: str | None = None, weight: float = 1.0) -> Aggregate:
    """The q-quantile of one randomly chosen value per unit and partition, searched in [lower, upper]."""
    return Aggregate("quantile", column=column, lower=lower, upper=upper, q=q, name=name, weight=weight)


def median(column: str, lower: float, upper: float, name: str | None = None, weight: float = 1.0) -> Aggregate:
    return quantile(column, 0.5, lower, upper, name=name, weight=weight)


def min_(column: str, lower: float, upper: float, name: str | None = None, weight: float = 1.0) -> Aggregate:
    return quantile(column, 0.0, lower, upper, name=name, weight=weight)


def max_(column: str, lower: float, upper: float, name: str | None = None, weight: float = 1.0) -> Aggregate:
    return quantile(column, 1.0, lower, upper, name=name, weight=weight)


@dataclass(frozen=True)
class Query:
    """A user-level DP aggregation: GROUP BY `group_by`, the `aggregates`, one budget.

    max_partitions_contributed (C_u): partitions one unit may touch; the rest of its rows are
    dropped at random. public_partitions: keys given by the controller (tuples when several
    group-by columns); then no partition selection and no delta is spent on it. selection: how
    private partitions are chosen (`auto`: Laplace threshold when the only aggregates are counts of
    units, whose noisy count it reuses; truncated geometric otherwise; `weighted_gaussian`, `mad`
    (MaxAdaptiveDegree) and `mad_damped` (MAD whose second round damps the partitions round 1 saw far
    above its threshold) spread each unit's weight over its partitions: selection_weighted.py,
    selection_damped.py). selection_weight: the
    selection's budget share relative to an aggregate's weight. where: a row filter (SQL condition
    on each row's own columns), applied before contribution bounding. bounds_fraction: the share of
    an aggregate's epsilon spent on inferring its missing bounds (APPROX_BOUNDS); bounds_failure:
    the probability that an empty histogram bin passes its threshold; bounds_scope: `dataset` (one
    set of inferred bounds) or `partition` (inferred per partition, for magnitudes that differ a
    lot; private partitions only). part_weights: ((part, weight), ...) overriding selection_weight and the
    aggregates' weights, part 'selection' or an aggregate's output name (the split chosen by need: split.py).
    bounds_fallback: when no histogram bin stands out (or the bounds come out empty), clamp to the
    histogram's whole range, noted, instead of refusing: whether the refusal happens is a noisy
    fact about the data, which the platform must not let reach an analyst before a controller's
    decision, nor refund (bounds.py, "Falling back").
    """

    aggregates: tuple[Aggregate, ...]
    privacy_unit: str
    epsilon: float
    delta: float = 1e-6
    group_by: tuple[str, ...] = ()
    max_partitions_contributed: int = 1
    noise: NoiseKind = "laplace"
    public_partitions: tuple | None = None
    selection: SelectionKind = "auto"
    selection_weight: float = 1.0
    confidence: float = 0.95
    quantile_bins: int = 1024
    where: str | None = None
    bounds_fraction: float = 0.5
    bounds_failure: float = 1e-9
    bounds_scope: str = "dataset"
    part_weights: tuple[tuple[str, float], ...] = ()
    bounds_fallback: bool = False

    def __post_init__(self) -> None:
        # accept lists for convenience; store tuples so the query is hashable and comparable
        object.__setattr__(self, "aggregates", tuple(self.aggregates))
        if isinstance(self.group_by, str):
            object.__setattr__(self, "group_by", (self.group_by,))
        object.__setattr__(self, "group_by", tuple(self.group_by))
        if isinstance(self.part_weights, dict):
            object.__setattr__(self, "part_weights", tuple(self.part_weights.items()))
        elif isinstance(self.part_weights, list):
            object.__setattr__(self, "part_weights", tuple(tuple(x) if isinstance(x, list) else x
                                                           for x in self.part_weights))
        if self.public_partitions is not None:
            keys = tuple(k if isinstance(k, tuple) else (k,) for k in self.public_partitions)
            object.__setattr__(self, "public_partitions", keys)

    @property
    def private_partitions(self) -> bool:
        """True when partitions come from the data and must be selected privately."""
        return bool(self.group_by) and self.public_partitions is None

    def _validate_part_weights(self, labels: list[str]) -> None:
        """part_weights name parts of this query (the selection, its aggregates) with positive finite weights."""
        if not isinstance(self.part_weights, tuple):
            raise InvalidQueryError(f"part_weights must be ((part, weight), ...), got {self.part_weights!r}")
        for item in self.part_weights:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise InvalidQueryError(f"part_weights must be ((part, weight), ...), got the item {item!r}")
            part, weight = item
            known = labels + (["selection"] if self.private_partitions else [])
            if part not in known:
                raise InvalidQueryError(f"part_weights names {part!r}, which is not a part of the query "
                                        f"(parts: {', '.join(known)})")
            if not (_finite(weight) and weight > 0):
                raise InvalidQueryError(f"part_weights: the weight of {part!r} must be a positive number, got {weight!r}")

    @property
    def effective_max_partitions(self) -> int:
        """C_u as the mechanisms use it: 1 for an ungrouped query (one partition only)."""
        return self.max_partitions_contributed if self.group_by else 1

    def validate(self, *, noise_floor: bool = True) -> None:
        """Refuse a malformed query, naming the field and the fix. Reads no data. noise_floor: also
        refuse a budget one of whose noisy parts would be pure noise (noise_floor.py); the accuracy
        preview leaves it out, to state such a part's interval as infinite."""
        if not self.aggregates:
            raise InvalidQueryError("the query has no aggregates: add at least one (e.g. count())")
        if not isinstance(self.privacy_unit, str) or not self.privacy_unit:
            raise InvalidQueryError("privacy_unit must name the column that identifies each person/unit")
        check_epsilon(self.epsilon)  # finite, > 0, at most MAX_EPSILON (input_checks)
        check_delta(self.delta)  # 0 or in [MIN_DELTA, MAX_DELTA] (input_checks)
        if self.private_partitions and self.delta == 0.0:
            raise InvalidQueryError(
                "delta = 0 is impossible with private partitions (selecting which groups exist "
                "needs delta > 0): set delta (e.g. 1e-6) or give public_partitions"
            )
        if self.noise not in NOISE_KINDS:
            raise InvalidQueryError(f"noise must be one of {NOISE_KINDS}, got {self.noise!r}")
        if self.noise == "gaussian" and self.delta == 0.0:
            raise InvalidQueryError("Gaussian noise needs delta > 0: set delta or use noise='laplace'")
        if self.selection not in SELECTION_KINDS:
            raise InvalidQueryError(f"selection must be one of {SELECTION_KINDS}, got {self.selection!r}")
        cu = self.max_partitions_contributed
        if isinstance(cu, bool) or not isinstance(cu, int) or cu < 1:
            raise InvalidQueryError(
                f"max_partitions_contributed (C_u) must be a whole number >= 1, got {cu!r}"
            )
        if not (_finite(self.confidence) and 0.0 < self.confidence < 1.0):
            raise InvalidQueryError(f"confidence must be in (0, 1), got {self.confidence!r}")
        if not (_finite(self.selection_weight) and self.selection_weight > 0):
            raise InvalidQueryError(f"selection_weight must be > 0, got {self.selection_weight!r}")
        if not (_finite(self.bounds_fraction) and 0 < self.bounds_fraction < 1):
            raise InvalidQueryError(f"bounds_fraction must be in (0, 1), got {self.bounds_fraction!r}")
        if not (_finite(self.bounds_failure) and 0 < self.bounds_failure < 0.5):
            raise InvalidQueryError(f"bounds_failure must be in (0, 0.5), got {self.bounds_failure!r}")
        if not isinstance(self.bounds_fallback, bool):
            raise InvalidQueryError(f"bounds_fallback must be True or False, got {self.bounds_fallback!r}")
        if self.bounds_scope not in ("dataset", "partition"):
            raise InvalidQueryError(f"bounds_scope must be 'dataset' or 'partition', got {self.bounds_scope!r}")
        if self.bounds_scope == "partition" and any(a.needs_bounds for a in self.aggregates):
            if not self.private_partitions:
                raise InvalidQueryError("per-partition bounds need a GROUP BY with private partitions "
                                        "(public partitions may be empty: use bounds_scope='dataset')")
            if any(a.needs_bounds and a.kind == "quantile" for a in self.aggregates):
                raise InvalidQueryError("per-partition bounds are not available for quantiles: give the bounds, "
                                        "or use bounds_scope='dataset'")
        if not (isinstance(self.quantile_bins, int) and 2 <= self.quantile_bins <= 1 << 16):
            raise InvalidQueryError(f"quantile_bins must be an integer in [2, 65536], got {self.quantile_bins!r}")
        if len(set(self.group_by)) != len(self.group_by):
            raise InvalidQueryError(f"group_by repeats a column: {list(self.group_by)}")
        internal = [c for c in (self.privacy_unit, *self.group_by) if isinstance(c, str) and PLAN_COLUMN.fullmatch(c)]
        if internal:
            raise InvalidQueryError(
                f"the column name {internal[0]!r} is one of the engine's internal column names ({internal[0].lower()!r}): "
                "the plan would read that column for its own (a group key named _n_units was read as the "
                "number of units, and released one person's value); rename it, e.g. "
                f"SELECT {internal[0]} AS {internal[0].lstrip('_')} or group_by=({internal[0].lstrip('_')!r},)")
        if self.privacy_unit in self.group_by:
            raise InvalidQueryError(
                f"grouping by the privacy unit {self.privacy_unit!r} would publish one row per unit"
            )
        if self.public_partitions is not None:
            if not self.group_by:
                raise InvalidQueryError("public_partitions given but the query has no group_by")
            bad = [k for k in self.public_partitions if len(k) != len(self.group_by)]
            if bad:
                raise InvalidQueryError(
                    f"public partition keys must have {len(self.group_by)} value(s) "
                    f"(one per group_by column), got {bad[0]!r}"
                )
            odd = [v for k in self.public_partitions for v in k if not _plain_value(v)]
            if odd:
                raise InvalidQueryError(
                    f"public partition keys must be plain values (text, numbers, dates), got {odd[0]!r} "
                    f"({type(odd[0]).__name__}): give each key as a value, or a tuple of values for several group_by columns")
            if len(set(self.public_partitions)) != len(self.public_partitions):
                raise InvalidQueryError("public_partitions lists a key twice")
        if self.where is not None:
            from .row_filter import compile_filter

            compile_filter(self.where)
        labels = [a.label for a in self.aggregates]
        clash = {x for x in labels if labels.count(x) > 1} | (set(labels) & set(self.group_by))
        if clash:
            raise InvalidQueryError(f"output names must be unique; repeated: {sorted(clash)} (give name=...)")
        taken = [x for x in (*self.group_by, *labels) if x in EXACT_COLUMNS]
        if taken:
            raise InvalidQueryError(
                f"the output name {taken[0]!r} is taken: the controller's table of exact values has a column of its "
                f"own by that name ({EXACT_COLUMNS[taken[0]]}); rename it, e.g. {taken[0]}_")
        beside = {f"{label}{suffix}": label for label in labels for suffix in INTERVAL_SUFFIXES}
        shadowed = [x for x in (*self.group_by, *labels) if x in beside]
        if shadowed:  # the engine writes the interval column over the key's or statistic's values
            owner = beside[shadowed[0]]
            raise InvalidQueryError(
                f"the output name {shadowed[0]!r} is taken: the released table gives the statistic {owner!r} a "
                f"column of that name ({', '.join(owner + suffix for suffix in INTERVAL_SUFFIXES)}); rename one of "
                "them")
        self._validate_part_weights(labels)
        for agg in self.aggregates:
            agg.validate()
        if noise_floor:
            from .noise_floor import check_noise_floor  # the budget split: imported when a query is checked

            check_noise_floor(self)
