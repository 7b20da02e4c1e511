"""The truncated geometric selection's keep probabilities, exactly: integers on a grid of 2^-128.

Desfontaines, Voss, Gipson, Mandayam ("Differentially private partition selection", PoPETs 2022,
arXiv 2006.03684) define the optimal keep probability of a partition of n units, for a per-partition
(e, d), by the recursion

    p(0) = 0,   p(n + 1) = min(e^e p(n) + d,  1 - e^-e (1 - p(n) - d),  1),

whose two terms are the two (e, d)-DP constraints between the sizes n and n + 1 that bound p(n + 1)
from above (the other two hold because p never decreases). Their closed form
(partition_selection.truncated_geometric_keep_probability) computed in floats breaks the second
constraint: where 1 - p(n + 1) is near e^-e it is rounded by up to 2^-53, and the constraint multiplies
it by e^e (at e = 50, p(2) rounded to 1: a partition of two units always kept, of one dropped with
probability 1 - d, an infinite privacy loss; at e = 25, d = 1e-6, an excess of 8 d).

Here the recursion runs on integers P(n) = p(n) 2^K (K = 128), every step rounded down, with e^e taken
from below and e^-e from above (60-digit decimals, widened by 10^-50): each P(n + 1) is at most both
bounds for the true e^e and d, so the constraints hold exactly for the probabilities drawn. A partition
is kept when a uniform integer U on [0, 2^K) from the OS CSPRNG is below P(n): probability P(n) / 2^K
exactly. d is partition_selection.per_partition_delta (at most the share's per-partition delta).
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np

from .noise import random_words

#: the grid of the keep probabilities: 2^-KEEP_BITS (two 64-bit CSPRNG words per decision)
KEEP_BITS = 128
ONE = 1 << KEEP_BITS
_WORD = 1 << 64


def _growth_bounds(epsilon: float, max_partitions: int) -> tuple[int, int]:
    """(floor(a 2^K), ceil(b 2^K)) with a <= e^e and b >= e^-e, e = epsilon / C_u exactly."""
    with localcontext() as ctx:
        ctx.prec = 60
        exact = Fraction(epsilon) / max_partitions
        growth = (Decimal(exact.numerator) / Decimal(exact.denominator)).exp()
        widen = Decimal(10) ** -50  # above the rounding of the quotient and of exp (10^-58 relative)
        low, high = Fraction(growth * (1 - widen)), Fraction((1 + widen) / growth)
    return int(low * ONE), -int(-high * ONE // 1)


def keep_grid(largest: int, epsilon: float, max_partitions: int, d: float) -> list[int]:
    """P(0), ..., P(m) on the 2^-K grid (module docstring) for e = epsilon / C_u, m = min(largest, the
    first n with P(n) = 2^K)."""
    grow, shrink = _growth_bounds(epsilon, max_partitions)
    step = int(Fraction(d) * ONE)  # floor(d 2^K)
    grid = [0]
    while len(grid) <= largest and grid[-1] < ONE:
        p = grid[-1]
        first = (grow * p >> KEEP_BITS) + step  # <= e^e p + d
        rest = ONE - p - step
        second = ONE - (-(-shrink * rest // ONE)) if rest > 0 else ONE  # <= 1 - e^-e (1 - p - d)
        grid.append(min(first, second, ONE))
    return grid


def keep_numerators(n: np.ndarray, epsilon: float, max_partitions: int, d: float) -> list[int]:
    """P(n) for each size in `n` (2^K from the first size where P reaches 1 on)."""
    sizes = np.asarray(n, dtype=np.float64)
    largest = int(sizes.max()) if sizes.size else 0
    grid = keep_grid(max(largest, 0), epsilon, max_partitions, d)
    last = len(grid) - 1
    return [0 if s <= 0 else grid[min(int(s), last)] if int(s) <= last else ONE for s in sizes.tolist()]


def keep_probability(n: np.ndarray, epsilon: float, max_partitions: int, d: float) -> np.ndarray:
    """P(n) / 2^K as floats (rounded to nearest: for display and expected counts, not for deciding)."""
    return np.array([p / ONE for p in keep_numerators(n, epsilon, max_partitions, d)], dtype=np.float64)


def draw_keep(n: np.ndarray, epsilon: float, max_partitions: int, d: float) -> np.ndarray:
    """Keep each partition with probability exactly P(n) / 2^K: U < P(n), U = two CSPRNG words."""
    numerators = keep_numerators(n, epsilon, max_partitions, d)
    count = len(numerators)
    high, low = random_words(count), random_words(count)
    return np.array([p >= ONE or (int(h) * _WORD + int(lo)) < p for p, h, lo in zip(numerators, high, low)],
                    dtype=bool)
