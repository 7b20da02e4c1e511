"""DP quantiles (MIN, MAX, MEDIAN, NTILE) by the exponential mechanism over a fine histogram, drawn exactly.

Each unit contributes one value per partition (chosen at random in SQL), clamped to [L, U] and
placed in one of B equal bins. Bin j holds the ranks [C_(j-1), C_j] (C_j = values in bins <= j,
n = all values); its distance from the target rank q n is
d_j = max(C_(j-1) - q n, q n - C_j, 0), so a bin holding the quantile (even as a repeated value)
is at distance 0. Removing one unit's value moves C_(j-1), C_j by 0 or 1 and q n by q; each of the
three terms then moves by at most max(q, 1 - q) = Delta, the sensitivity. The exponential mechanism
(McSherry-Talwar 2007; Smith 2011 for quantiles) picks bin j with probability proportional to
exp(-eps_p d_j / (2 Delta)) (equal widths), then a uniform point in it. A unit is in at most C_u
partitions, so each partition gets eps_p = eps / C_u. MIN and MAX are q = 0 and q = 1
(Delta = 1, d_j = C_(j-1) and n - C_j). No confidence interval is given.

Exactly, as implemented. The float version this replaces (exp() of float64 utilities, a normalised
float CDF searched with a 53-bit uniform) gave bins probability 0 on one histogram and more on its
neighbour (float weights underflow or are absorbed, the uniform's grid misses small masses): an
infinite privacy loss in 9 of the 64 neighbouring-pair cases of tests/test_quantile_exact.py, a
ratio above exp(eps_p) in 5 more (Ilvento, CCS 2020, measures such failures). Ilvento's exact
construction (base 2, arbitrary-precision weights) wants integer utilities, and d_j carries q n's
fraction; here the exponents are int64 and the draw a rejection with exact Bernoulli draws. Every
quantity below is an exact integer or rational:

- eps_p = eps / C_u and q are the exact rationals of their floats, Delta = max(q, 1 - q) exactly.
- The exponent of bin j is X_j / 2^b with the integer X_j = min(ceil(S d_j), M 2^b), where
  S = floor(floor(eps_p 2^(b-1)) / Delta) and b is chosen so that S has 30 to 33 bits
  (`exponent_scale`). Both maps keep a bounded sensitivity: S d_j moves by at most S Delta, so
  ceil(S d_j) by at most ceil(S Delta) (ceil(x) - ceil(y) < x - y + 1, an integer), and
  min(., M 2^b) by no more. Hence for every bin and every pair of neighbouring histograms,
  P(j) / P'(j) <= exp(2 ceil(S Delta) / 2^b) <= exp(eps_p), since S Delta <= floor(eps_p 2^(b-1)),
  an integer. Over C_u partitions: at most eps, the epsilon recorded and charged.
- X_j is computed without products beyond int64: with q = m / D and q n = f + rem / D,
  d_j = (f - C_j) + rem / D left of the rank and (C_(j-1) - ceil(q n)) + (D - rem) / D right of it,
  so ceil(S d_j) = S i + ceil(S rem / D) (or ceil(S (D - rem) / D)) for the integer i; the two
  ceilings are per partition (Python integers), and i is clipped first where S i would pass M 2^b.
- The bin is drawn with probability exp(-X_j / 2^b) / sum_i exp(-X_i / 2^b) exactly, from the OS
  CSPRNG, by dp_core/exponential_mechanism.py (rejection from a dyadic envelope with exact Bernoulli
  draws of exp(-k) 2^t and of exp(-r), Canonne-Kamath-Steinke 2020): no float weight, no
  normalisation, no float inverse CDF.

What this changes from the ideal exp(-eps_p d_j / (2 Delta)): the scale S / 2^b is below
eps_p / (2 Delta) by a relative 2^-29 at most (b <= 56 bits; less precise below eps_p = 2^-24),
each exponent is rounded up by less than 2^-b, and exponents beyond M (36 for 1,024 bins, 32 for
65,536, `exponential_mechanism.level_cap`) are clipped to M: bins that far from the quantile
(weight below e^-36 of the best bin's) gain at most B e^-M of probability in all (2.4e-13 for
1,024 bins, 8.3e-10 for 65,536). The release's uniform point inside the chosen bin depends on the
bin only (post-processing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .accounting import Share
from .exponential_mechanism import level_cap, sample_exponential
from .noise import secure_uniform
from .release import MechanismRecord

_SCALE_BITS = 32  # floor(eps_p 2^(b-1)) in [2^30, 2^32): S keeps 30 bits at least
_MAX_FRACTION_BITS = 56  # X <= M 2^b + 2 S stays below 2^63 (M <= 42)
_MAX_SCALE = 1 << 40  # S's bound where eps_p is huge (b = 1): S i stays in int64


@dataclass(frozen=True)
class ExponentScale:
    """The integer form of the exponent eps_p d_j / (2 Delta): X_j = min(ceil(S d_j), M 2^b),
    read as X_j / 2^b."""

    fraction_bits: int  # b
    s: int  # S <= eps_p 2^(b-1) / Delta
    cap: int  # M: integer parts of X / 2^b above M are clipped to M


def _present(m) -> bool:
    """A partition's {bin: count} map holds counts (None or pandas NA: a partition with no rows,
    e.g. a public partition absent from the data)."""
    try:
        return bool(m)
    except TypeError:  # pandas NA is neither true nor false
        return False


def dense_histograms(maps: list, bins: int) -> np.ndarray:
    """Per-partition {bin: count} maps (None when empty) to a dense (P, bins) count matrix."""
    out = np.zeros((len(maps), bins), dtype=np.int64)
    for row, m in enumerate(maps):
        if _present(m):
            items = m.items() if isinstance(m, dict) else m if isinstance(m, list) else zip(m["key"], m["value"])
            for b, c in items:
                out[row, int(b)] += c
    return out


def exponent_scale(epsilon_per_partition: Fraction, q: Fraction, bins: int) -> ExponentScale:
    """S, b and M of the exponents X_j = min(ceil(S d_j), M 2^b) (module docstring): b makes
    floor(eps_p 2^(b-1)) lie in [2^30, 2^32) (b within [1, 56]), S = floor(floor(eps_p 2^(b-1)) / Delta)."""
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q}")
    sensitivity = max(q, 1 - q)
    log2_floor = epsilon_per_partition.numerator.bit_length() - epsilon_per_partition.denominator.bit_length()
    bits = min(max(_SCALE_BITS - log2_floor, 1), _MAX_FRACTION_BITS)
    budget = math.floor(epsilon_per_partition * 2 ** (bits - 1))  # 2 ceil(S Delta) / 2^b <= eps_p
    s = min(math.floor(budget / sensitivity), _MAX_SCALE)  # a smaller S only spends less
    return ExponentScale(fraction_bits=bits, s=s, cap=level_cap(bins))


def bin_exponents(counts: np.ndarray, q: float, share: Share, max_partitions: int) -> tuple[np.ndarray, ExponentScale]:
    """X (int64, the shape of the integer histogram `counts`): the mechanism picks bin j of a row
    with probability proportional to exp(-X_j / 2^b), at eps_p = share.epsilon / max_partitions
    exactly. Integer arithmetic only (module docstring)."""
    bins = counts.shape[1]
    q = Fraction(q)
    scale = exponent_scale(Fraction(share.epsilon) / max_partitions, q, bins)
    s, limit = scale.s, scale.cap << scale.fraction_bits
    steps_cap = -(-limit // s) if s else 0  # S i >= M 2^b from i = steps_cap on: clip i there
    cum = np.cumsum(counts, axis=1)
    floor_rank, ceil_rank, left_part, right_part = _rank_parts(cum[:, -1], q, s)
    # ceil(S (C_(j-1) - q n)) = S (C_(j-1) - ceil(q n)) + ceil(S (D - rem) / D), positive right of the
    # rank (C_(j-1) = C_j - count_j)
    right = cum - counts
    right -= ceil_rank[:, None]
    np.clip(right, -1, steps_cap, out=right)
    right *= s
    right += right_part[:, None]
    # ceil(S (q n - C_j)) = S (f - C_j) + ceil(S rem / D), positive exactly left of it; i clipped to
    # [-1, steps_cap] first: -S + ceil(S rem / D) <= 0 keeps the sign, S i stays in int64
    left = np.subtract(floor_rank[:, None], cum, out=cum)  # cum is not needed after this
    np.clip(left, -1, steps_cap, out=left)
    left *= s
    left += left_part[:, None]
    exponents = np.maximum(left, right, out=left)  # ceil(S max(a, b, 0)) = max(ceil(S a), ceil(S b), 0)
    np.clip(exponents, 0, limit, out=exponents)
    return exponents, scale


def _rank_parts(totals: np.ndarray, q: Fraction, s: int) -> tuple[np.ndarray, ...]:
    """Per partition, with q n = f + rem / D: f = floor(q n), ceil(q n), and the exponents' two
    fractional parts ceil(S rem / D) and ceil(S (D - rem) / D) (0 when rem = 0), in Python
    integers (m n can pass int64)."""
    m, d = q.numerator, q.denominator
    parts = []
    for n in totals.tolist():
        whole, rem = divmod(m * n, d)
        parts.append((whole, whole + (rem > 0), -(-s * rem // d), -(-s * (d - rem) // d) if rem else 0))
    if not parts:
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(4))
    return tuple(np.array(column, dtype=np.int64) for column in zip(*parts))


def _integer_counts(counts: np.ndarray) -> np.ndarray:
    """The histogram as int64, refusing what is not a count (the exact mechanism needs integers)."""
    counts = np.asarray(counts)
    whole = counts.astype(np.int64)
    if counts.ndim != 2 or (whole != counts).any() or (whole < 0).any():
        raise ValueError("quantile histograms must be a 2-d array of non-negative integer counts")
    return whole


def exponential_quantile(
    counts: np.ndarray,
    q: float,
    lower: float,
    upper: float,
    *,
    target: str,
    share: Share,
    max_partitions: int,
) -> tuple[np.ndarray, MechanismRecord]:
    """One DP q-quantile per row of `counts` (shape (P, B) integer histogram over [lower, upper]),
    share.epsilon-DP over a unit's max_partitions partitions exactly (module docstring)."""
    counts = _integer_counts(counts)
    parts, bins = counts.shape
    sens = max(q, 1.0 - q)
    exponents, scale = bin_exponents(counts, q, share, max_partitions)
    chosen = sample_exponential(exponents, scale.fraction_bits)
    width = (upper - lower) / bins
    values = lower + (chosen + secure_uniform(parts) * (1.0 - 1e-12)) * width
    record = MechanismRecord(
        target=target,
        mechanism="exponential mechanism (quantile)",
        sensitivity_per_partition=sens,
        max_partitions=max_partitions,
        sensitivity=sens * max_partitions,
        epsilon=share.epsilon,
        delta=0.0,
        rho=None,
        scale=None,
        grid=width,
        note=f"{bins} bins over [{lower}, {upper}]; bin drawn from integer exponents, no floating-point "
             "weights; output uniform within the chosen bin; no CI",
    )
    return np.clip(values, lower, upper), record


#: the cells of one block of partitions' histograms (int64): the dense (P, B) matrices a release
#: holds at once (the counts, their exponents, the envelope's cumulative sums) stay near 3 x 8 x this
#: many bytes (96 MB) whatever the number of partitions and bins
BLOCK_CELLS = 1 << 22


def exponential_quantile_of_maps(maps: list, bins: int, q: float, lower: float, upper: float, *, target: str,
                                 share: Share, max_partitions: int) -> tuple[np.ndarray, MechanismRecord]:
    """exponential_quantile over the partitions' {bin: count} maps (as the engine's SQL returns them),
    a block of partitions at a time: each partition's draw is independent of the others', so blocks
    change nothing in the output's law, and memory stays bounded by BLOCK_CELLS (100,000 partitions
    of 1,024 bins were three dense matrices of 0.8 GB each)."""
    rows = max(1, BLOCK_CELLS // bins)
    values, record = [], None
    for start in range(0, max(len(maps), 1), rows):
        block = dense_histograms(maps[start:start + rows], bins)
        value, record = exponential_quantile(block, q, lower, upper, target=target, share=share,
                                             max_partitions=max_partitions)
        values.append(value)
    return np.concatenate(values), record
