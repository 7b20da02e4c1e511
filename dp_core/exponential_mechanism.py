"""Exact draws of the exponential mechanism: one column per row, P(j) proportional to exp(-X_j / 2^b).

The exponents X are integers (a row's utilities scaled and rounded by its caller, e.g.
dp_core/quantiles.py), so gamma_j = X_j / 2^b is an exact dyadic rational: k_j = X_j >> b is its
integer part and r_j = (X_j mod 2^b) / 2^b its fraction. No weight is ever computed in floating
point. The draw is rejection sampling from a dyadic envelope, every step exact:

1. Propose column j with probability W_j / sum(W), W_j = 2^(T - t(k_j)) an int64 and
   t(k) = floor(k log2 e), so that 2^-(t+1) < exp(-k) <= 2^-t: an exact integer uniform below the
   row's sum, located in the row's cumulative sums.
2. Accept with probability exp(-k_j) 2^t(k_j) (in (1/2, 1]; a uniform against the exact binary
   expansion of exp(-k), noise.bernoulli_pow2_exp_neg) times exp(-r_j) (in (1/e, 1]; Canonne,
   Kamath, Steinke 2020, Algorithm 1, with the dyadic r_j: noise.bernoulli_exp_neg_ratio).
3. Otherwise draw again for that row, independently.

A round outputs j with probability W_j exp(-k_j) 2^t(k_j) exp(-r_j) / sum(W) = 2^T exp(-X_j/2^b)
/ sum(W), proportional to exp(-X_j / 2^b): the output law is exactly the exponential mechanism's
on these exponents, whatever the number of rounds. A round accepts with probability above
1/(2e), so a row needs fewer than 5.5 rounds on average.

The envelope needs every k_j <= `level_cap(columns)`, where T = 62 - bit_length(columns - 1)
keeps sum(W) <= columns 2^T <= 2^62 in int64: exponents are clipped there by the caller, which
keeps a utility's sensitivity (min(x, c) moves by at most as much as x). All randomness comes from
dp_core.noise (the OS CSPRNG).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .noise import (
    POW2_EXP_NEG_MAX_V,
    bernoulli_exp_neg_ratio,
    bernoulli_pow2_exp_neg,
    exp_neg_octave,
    uniform_below_each,
)

_SUM_BITS = 62  # a row's envelope sum stays at most 2^62


def _envelope_bits(columns: int) -> int:
    """T: the largest envelope weight is 2^T, so that `columns` of them sum to at most 2^62."""
    return _SUM_BITS - (columns - 1).bit_length()


@lru_cache(maxsize=None)
def level_cap(columns: int) -> int:
    """The largest integer part k of an exponent the envelope holds: the last k with t(k) <= T
    (36 for 1024 columns, 32 for 65536)."""
    top = _envelope_bits(columns)
    return max(k for k in range(POW2_EXP_NEG_MAX_V + 1) if exp_neg_octave(k) <= top)


def _envelope_weights(columns: int) -> np.ndarray:
    """W by level k = 0..level_cap: 2^(T - t(k)) as int64."""
    top = _envelope_bits(columns)
    return np.array([1 << (top - exp_neg_octave(k)) for k in range(level_cap(columns) + 1)], dtype=np.int64)


def _first_above(cumulative: np.ndarray, rows: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Per row, the first column whose cumulative weight exceeds the row's draw (draw < the row's
    total): a binary search run on all rows at once."""
    low = np.zeros(rows.size, dtype=np.int64)
    high = np.full(rows.size, cumulative.shape[1] - 1, dtype=np.int64)
    while True:
        open_ = low < high
        if not open_.any():
            return low
        middle = (low + high) // 2
        above = cumulative[rows, middle] > draws
        high = np.where(open_ & above, middle, high)
        low = np.where(open_ & ~above, middle + 1, low)


def sample_exponential(exponents: np.ndarray, fraction_bits: int) -> np.ndarray:
    """One column per row of `exponents` (int64, shape (P, B), 0 <= X <= level_cap(B) 2^b), drawn
    with probability exp(-X_j / 2^b) / sum_i exp(-X_i / 2^b) exactly (b = fraction_bits <= 56)."""
    parts, columns = exponents.shape
    if not 0 <= fraction_bits <= 56:
        raise ValueError(f"fraction_bits must be in [0, 56], got {fraction_bits}")
    if exponents.size and not 0 <= int(exponents.min()) <= int(exponents.max()) <= level_cap(columns) << fraction_bits:
        raise ValueError(f"exponents must lie in [0, {level_cap(columns)} * 2^{fraction_bits}]")
    cumulative = _envelope_weights(columns)[exponents >> fraction_bits]
    np.cumsum(cumulative, axis=1, out=cumulative)
    chosen = np.zeros(parts, dtype=np.int64)
    rows = np.arange(parts)
    while rows.size:
        columns_drawn = _first_above(cumulative, rows, uniform_below_each(cumulative[rows, -1]))
        x = exponents[rows, columns_drawn]
        accepted = bernoulli_pow2_exp_neg(x >> fraction_bits)
        kept = np.flatnonzero(accepted)
        accepted[kept] = bernoulli_exp_neg_ratio(x[kept] & ((1 << fraction_bits) - 1), 1 << fraction_bits)
        chosen[rows[accepted]] = columns_drawn[accepted]
        rows = rows[~accepted]
    return chosen
