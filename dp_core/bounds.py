"""APPROX_BOUNDS: clamping bounds chosen privately from a logarithmic histogram (usability.md).

1. Histogram of the per-unit values (after per-unit aggregation and partition bounding, so a unit
   adds at most C_u values), computed in SQL. For x >= 0, bin e holds [2^e, 2^(e+1)), and the
   lowest bin [0, 2^(e_min+1)): e_min = 0 for integer values (so [0, 2) and 64 bins up to 2^64),
   -32 for real values (bins for negative powers of two). Negative values get mirrored bins
   (not for COUNT, which is never negative). B is the number of bins of all kinds.
2. Discrete Laplace noise of scale C_u / e_b on every bin (empty ones too).
3. Threshold: a bin's noise exceeds K with probability P(K' > K) = q^(K+1) / (1 + q),
   q = exp(-e_b / C_u). K is the smallest integer with (1 - P)^(B - 1) >= p, so that no empty bin
   passes with probability at least p (the success probability, default 1 - 1e-9). The spec's
   formula for continuous noise, K = -(1/e) ln(2 - 2 p^(1/(B-1))), e = e_b / C_u, is
   `continuous_threshold` (the discrete K stays within one step of it).
4. U: the upper edge of the first bin above K scanning down from the largest values; L: the lower
   edge of the first bin above K scanning up from the smallest (for integer values, the largest or
   smallest integer inside that bin: [0, 2) gives U = 1). No bin above K: a clear error, and
   nothing is released.
The noisy histogram is DP (part of the public result), and so is the estimate it gives of the
share of values outside the chosen bounds.

Falling back (`Query.bounds_fallback`, the platform's releases). Whether a bin stands out is a
noisy fact about the data: with a filter selecting K - 1 known people and one target, the bin
passes at a large epsilon exactly when the target matches the filter. A refusal there reached the
analyst as "Failed (refunded)": an e_b-DP bit, unapproved and refunded, so free to ask again and
again. With the fallback the bounds are the histogram's whole range instead (a count's per-unit
bound: the largest, 2^31 - 1), noted for the controller, and the release goes to its decision like
any other: a fixed choice, so the result stays DP at the stated epsilon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .accounting import Share
from .errors import DPError
from .release import MechanismRecord, add_noise
from .sql_text import ident

E_MAX = 63
E_MIN_REAL = -32


#: what a release says when no bin stood out and the bounds fell back to the histogram's whole range
FALLBACK_NOTE = ("no histogram bin stood out of the noise: the bounds are the histogram's whole range (the noise "
                 "is that wide); set the bounds by hand, or give more epsilon")


class BoundsError(DPError):
    """No histogram bin stands out of the noise: the bounds cannot be inferred."""


@dataclass(frozen=True)
class InferredBounds:
    """The chosen bounds and the DP histogram they came from (public)."""

    aggregate: str
    lower: float | None  # None: not inferred (the query gave it)
    upper: float | None
    bin_edges: tuple[tuple[float, float], ...]  # ascending values
    noisy_counts: tuple[float, ...]
    threshold: int
    outside_share: float  # DP estimate of the share of per-unit values outside [lower, upper]
    record: MechanismRecord
    partition: dict | None = None  # the group keys, when bounds were inferred per partition

    def to_dict(self) -> dict:
        return {
            "aggregate": self.aggregate, "partition": self.partition, "lower": self.lower, "upper": self.upper,
            "threshold": self.threshold, "outside_share": self.outside_share,
            "bins": [{"low": lo, "high": hi, "noisy_count": c} for (lo, hi), c in zip(self.bin_edges, self.noisy_counts)],
            "mechanism": self.record.to_dict(),
        }


def bin_layout(integer: bool, signed: bool) -> list[tuple[bool, int, float, float]]:
    """All bins in ascending order of value: (negative, exponent, low edge, high edge)."""
    e_min = 0 if integer else E_MIN_REAL
    positive = [(False, e, 0.0 if e == e_min else 2.0**e, 2.0 ** (e + 1)) for e in range(e_min, E_MAX + 1)]
    if not signed:
        return positive
    negative = [(True, e, -(2.0 ** (e + 1)), -(0.0 if e == e_min else 2.0**e)) for e in range(E_MAX, e_min - 1, -1)]
    return negative + positive


def histograms_sql(with_clause: str, values: list[tuple[int, str, bool]], keys: tuple[str, ...] = ()) -> str:
    """The histograms of several aggregates in one statement, so that the bounding runs once for
    all of them: rows (`_agg`, keys..., neg, e, n), `values` giving (aggregate index, value
    column, integer?) each; per partition when `keys` are given. A histogram counts the per-unit
    values of a column of `_bounded` by bin; a value at or beyond 2^E_MAX (an infinite one too,
    which a query can compute) is in the top bin."""
    parts = [f"SELECT {int(index)} AS _agg, * FROM ({_histogram_select(value, integer, keys)}) AS _h{int(index)}"
             for index, value, integer in values]
    return f"{with_clause}\n" + "\nUNION ALL ".join(parts)


def _histogram_select(value: str, integer: bool, keys: tuple[str, ...]) -> str:
    e_min = 0 if integer else E_MIN_REAL
    v = f"CAST({ident(value)} AS DOUBLE)"
    exponent = (f"CASE WHEN abs({v}) < {2.0 ** (e_min + 1)!r} THEN {e_min} WHEN abs({v}) >= {2.0 ** E_MAX!r} "
                f"THEN {E_MAX} ELSE CAST(floor(log2(abs({v}))) AS INTEGER) END")
    lead = "".join(f"{ident(k)}, " for k in keys)
    return (f"SELECT {lead}{v} < 0 AS neg, {exponent} AS e, count(*) AS n "
            f"FROM _bounded WHERE {ident(value)} IS NOT NULL GROUP BY ALL")


def continuous_threshold(epsilon: float, max_partitions: int, bins: int, failure: float) -> float:
    """The spec's K for continuous Laplace noise: -(1/e) ln(2 - 2 p^(1/(B-1))), e = eps / C_u."""
    e = epsilon / max_partitions
    p_root = math.exp(math.log1p(-failure) / (bins - 1))
    return -(1.0 / e) * math.log(2.0 - 2.0 * p_root)


def discrete_threshold(epsilon: float, max_partitions: int, bins: int, failure: float) -> int:
    """Smallest integer K with (1 - q^(K+1) / (1 + q))^(B-1) >= 1 - failure for the discrete noise."""
    q = math.exp(-epsilon / max_partitions)
    r = -math.expm1(math.log1p(-failure) / (bins - 1))  # allowed P(an empty bin passes)
    k = max(math.ceil(math.log(r * (1.0 + q)) / math.log(q) - 1.0 - 1e-9), 0)
    while q ** (k + 1) / (1.0 + q) > r:
        k += 1
    return k


def infer_bounds(
    counts: dict[tuple[bool, int], int],
    *,
    label: str,
    integer: bool,
    signed: bool,
    share: Share,
    max_partitions: int,
    failure: float,
    need_lower: bool,
    need_upper: bool,
    fallback: bool = False,
) -> InferredBounds:
    """Noise the histogram, threshold it, and read the bounds off it. fallback: no bin above the
    threshold gives the layout's whole range (noted) instead of BoundsError (module docstring)."""
    layout = bin_layout(integer, signed)
    exact = np.array([counts.get((neg, e), 0) for neg, e, _, _ in layout], dtype=np.int64)
    noisy = add_noise(exact, target=f"bounds of {label}", quantum=1.0, sensitivity_quanta=1,
                      max_partitions=max_partitions, share=share, noise="laplace", confidence=0.95)
    k = discrete_threshold(share.epsilon, max_partitions, len(layout), failure)
    above = np.flatnonzero(noisy.values > k)
    if above.size == 0 and fallback:
        above = np.array([0, len(layout) - 1])  # the whole range: a fixed choice (module docstring)
    elif above.size == 0:
        raise BoundsError(
            f"automatic bounds for {label!r}: no histogram bin stands out of the noise (threshold {k}); "
            "give more epsilon, use more data, or set the bounds by hand. Nothing was released"
        )
    lower = layout[above[0]][2] if need_lower else None
    upper = layout[above[-1]][3] if need_upper else None
    if integer:  # integer values: the open edges of [2^e, 2^(e+1)) and (-2^(e+1), -2^e] move in by one
        if upper is not None and upper > 0:
            upper -= 1.0
        if lower is not None and lower < 0:
            lower += 1.0
    lo_i, hi_i = above[0], above[-1]
    positive = np.maximum(noisy.values, 0.0)
    total = positive.sum()
    outside = (positive[:lo_i].sum() + positive[hi_i + 1:].sum()) / total if total > 0 else 0.0
    record = MechanismRecord(
        target=f"bounds of {label}", mechanism="discrete Laplace on a log histogram (APPROX_BOUNDS)",
        sensitivity_per_partition=1.0, max_partitions=max_partitions, sensitivity=float(max_partitions),
        epsilon=share.epsilon, delta=0.0, rho=None, scale=noisy.scale, grid=1.0,
        note=f"{len(layout)} bins, threshold {k}, failure probability {failure:g}"
             + ("" if (noisy.values > k).any() else f"; {FALLBACK_NOTE}"),
    )
    return InferredBounds(label, lower, upper, tuple((lo, hi) for _, _, lo, hi in layout),
                          tuple(float(x) for x in noisy.values), k, float(outside), record)
