"""The truncated geometric selection's keep probabilities, exactly: integers on a grid of 2^-K.

Desfontaines, Voss, Gipson, Mandayam ("Differentially private partition selection", PoPETs 2022,
arXiv 2006.03684) define the optimal keep probability of a partition of n units, for a per-partition
(e, d), by the recursion

    p(0) = 0,   p(n + 1) = min(e^e p(n) + d,  1 - e^-e (1 - p(n) - d),  1),

whose two terms are the two (e, d)-DP constraints between the sizes n and n + 1 that bound p(n + 1)
from above (the other two hold because p never decreases). Its closed form, computed in floats,
breaks the second constraint: where 1 - p(n + 1) is near e^-e it is rounded by up to 2^-53 and the
constraint multiplies it by e^e (measured with d = 1e-6: an excess of 0.07 d at e = 20, 1.8 d at
e = 25; at e = 50 p(2) rounds to 1, so a partition of two units is always kept and one of one unit
dropped with probability 1 - d: an infinite privacy loss).

Here the recursion runs on integers P(n) = p(n) 2^K, every step rounded down, with e^e taken from
below and e^-e from above (60-digit decimals, widened by 10^-50): each P(n + 1) is at most both
bounds for the true e^e and d, so the constraints hold exactly for the probabilities drawn (rounding
down costs at most 2^-K per step). A partition is kept when a uniform integer U on [0, 2^K) from the
OS CSPRNG is below P(n): probability P(n) / 2^K exactly. K = 128 + ceil(log2(1/d)), so that d has 128
bits on the grid (MIN_DELTA is 1e-100); d is partition_selection.per_partition_delta (at most the
share's per-partition delta). The work is one step per size up to the largest group or to p = 1,
about 2 ln(1/d) / e steps.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np

from .noise import random_words, uniform_below

#: the bits of one CSPRNG word (dp_core.noise.random_words)
_WORD = 64

#: the bits of the keep probabilities' grid beyond those d needs (d is 2^-K times an integer of 128 bits)
KEEP_BITS = 128


def grid_bits(d: float) -> int:
    """K: the keep probabilities are integers over 2^K (d > 0 has KEEP_BITS significant bits on that grid)."""
    if not d > 0:
        raise ValueError(f"the truncated geometric needs a per-partition delta > 0, got {d!r}")
    return KEEP_BITS + max(0, math.ceil(-math.log2(d)))


def _growth_bounds(epsilon: float, max_partitions: int, bits: int) -> tuple[int, int]:
    """(floor(a 2^K), ceil(b 2^K)) with a <= e^e and b >= e^-e, e = epsilon / C_u exactly."""
    with localcontext() as ctx:
        ctx.prec = 60
        exact = Fraction(epsilon) / max_partitions
        growth = (Decimal(exact.numerator) / Decimal(exact.denominator)).exp()
        widen = Decimal(10) ** -50  # above the rounding of the quotient and of exp (10^-58 relative)
        low, high = Fraction(growth * (1 - widen)), Fraction((1 + widen) / growth)
    return math.floor(low * (1 << bits)), math.ceil(high * (1 << bits))


def keep_grid(largest: int, epsilon: float, max_partitions: int, d: float) -> tuple[list[int], int]:
    """(P(0), ..., P(m); 2^K) on the 2^-K grid (module docstring) for e = epsilon / C_u, m = min(largest,
    the first n with P(n) = 2^K)."""
    bits = grid_bits(d)
    one = 1 << bits
    grow, shrink = _growth_bounds(epsilon, max_partitions, bits)
    step = math.floor(Fraction(d) * one)  # <= d 2^K
    grid = [0]
    while len(grid) <= largest and grid[-1] < one:
        p = grid[-1]
        first = (grow * p >> bits) + step  # <= e^e p + d
        rest = one - p - step
        second = one - -(-shrink * rest // one) if rest > 0 else one  # <= 1 - e^-e (1 - p - d)
        grid.append(min(first, second, one))
    return grid, one


def _sized_grid(n, epsilon: float, max_partitions: int, d: float) -> tuple[list[int], int, np.ndarray, np.ndarray]:
    """(the grid P(0..m), 2^K, each size's index in it, whether the size is past it, where P is 2^K)
    for the sizes `n`, floored; a NaN or a size <= 0 is 0 (noisy estimates too)."""
    sizes = np.nan_to_num(np.asarray(n, dtype=np.float64), nan=0.0, posinf=2.0**62, neginf=0.0)
    grid, one = keep_grid(max(int(sizes.max()) if sizes.size else 0, 0), epsilon, max_partitions, d)
    last = len(grid) - 1
    return grid, one, np.clip(sizes, 0, last).astype(np.int64), np.floor(sizes) > last


def keep_numerators(n: np.ndarray, epsilon: float, max_partitions: int, d: float) -> tuple[list[int], int]:
    """(P(n) for each size in `n`, 2^K): 2^K from the first size where P reaches 1 on."""
    grid, one, index, past = _sized_grid(n, epsilon, max_partitions, d)
    return [one if beyond else grid[i] for i, beyond in zip(index.tolist(), past.tolist())], one


def keep_probability(n: np.ndarray, epsilon: float, max_partitions: int, d: float) -> np.ndarray:
    """P(n) / 2^K as floats (rounded to nearest: for display and expected counts, not for deciding)."""
    grid, one, index, past = _sized_grid(n, epsilon, max_partitions, d)
    return np.where(past, 1.0, np.array([p / one for p in grid], dtype=np.float64)[index])


def draw_keep(n: np.ndarray, epsilon: float, max_partitions: int, d: float) -> np.ndarray:
    """Keep each partition with probability exactly P(n) / 2^K: U < P(n) for U uniform on [0, 2^K)
    from the OS CSPRNG (dp_core.noise, so that a test's replayed stream replays it too), compared a
    word at a time: U's top 64 bits W decide unless W equals P's top 64 bits (probability 2^-64),
    when U's other K - 64 bits are drawn and compared with P's. Vectorised over the partitions:
    one word each, the grid's words looked up by size."""
    grid, one, index, past = _sized_grid(n, epsilon, max_partitions, d)
    low_bits = one.bit_length() - 1 - _WORD
    always = np.array([p == one for p in grid], dtype=bool)[index] | past  # P = 2^K: kept whatever U is
    top = np.array([0 if p == one else p >> low_bits for p in grid], dtype=np.uint64)[index]
    words = random_words(index.size)
    keep = always | (words < top)
    tied = np.flatnonzero(~always & (words == top))
    if tied.size:  # U's top word equals P's: the rest of U against the rest of P
        rest = uniform_below(1 << low_bits, tied.size)
        mask = (1 << low_bits) - 1
        keep[tied] = [int(u) < (grid[index[i]] & mask) for u, i in zip(rest, tied.tolist())]
    return keep
