"""How a number a person reads is written: a released value, its interval, a half-width, an
epsilon. The accuracy preview, the controller's summary, the reports and `DPResult`'s text all
call these functions, so one statistic reads as one string wherever it is shown (the preview's
`± 10.5` beside the summary's `[52, 72]` was two roundings of one interval).

Counts are whole numbers (their noise is drawn on the integers, dp_core.release.calibrate), so
they are written as integers: `62 [52, 72]`, `±10`, never `62.00` or `10.5`. Other values are
written short: thousands separators from 100 on, up to two decimals from 1, three significant
digits below. An epsilon gets four significant digits (`0.4375`, not `0.43745083326922696`). The data
files keep exact values (results.json) or the table's own numbers (results.csv): only text is
rounded here.
"""

from __future__ import annotations

import math
from typing import SupportsFloat

#: the kinds of statistic released as whole numbers (noise on the integers, intervals whole too)
INTEGER_KINDS = frozenset({"count", "count_units"})

#: significant digits of an epsilon or a delta as a person reads it
BUDGET_DIGITS = 4


def is_integer_kind(kind: str) -> bool:
    """True for the kinds of statistic released as whole numbers (counts)."""
    return kind in INTEGER_KINDS


def value(x: SupportsFloat, integer: bool = False) -> str:
    """A released value (or an interval end): whole with thousands separators when `integer`;
    otherwise short (thousands separators from 100, up to two decimals from 1, three
    significant digits below); '—' for a missing one, '∞' for an infinite one."""
    v = float(x)
    if math.isnan(v):
        return "—"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if integer:
        return f"{round(v):,d}"
    if abs(v) >= 100 or v == 0:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def interval(x: SupportsFloat, low: SupportsFloat, high: SupportsFloat, integer: bool = False) -> str:
    """A released value with its interval, `value [low, high]`; the value alone without one."""
    if math.isnan(float(low)) or math.isnan(float(high)):
        return value(x, integer)
    return f"{value(x, integer)} [{value(low, integer)}, {value(high, integer)}]"


def halfwidth(h: SupportsFloat, integer: bool = False, ascii: bool = False) -> str:
    """An interval's half-width, `±10`: written as the interval's ends are (`value`). ascii: the
    engine's plain-text form, `+-10` (`+-inf` for an infinite one), as its messages write it."""
    if ascii:
        return "+-inf" if math.isinf(float(h)) else f"+-{value(h, integer)}"
    return f"±{value(h, integer)}"


def budget(x: SupportsFloat | None) -> str:
    """An epsilon, delta or rho a person reads: four significant digits ('—' for none)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{float(x):.{BUDGET_DIGITS}g}"
