"""Secure noise: randomness from the OS CSPRNG, exact discrete samplers on a power-of-two grid.

Why not `numpy.random` floats: textbook Laplace on floats leaks through floating-point artefacts
(Mironov, CCS 2012) and a seeded PRNG is predictable. Here every random bit comes from
`os.urandom`, and noise is an *integer* number of grid steps: the released value is
`(round(x / g) + K) * g` with `K` drawn from a discrete law (discrete Laplace = two-sided geometric,
Ghosh-Roughgarden-Sundararajan 2009; discrete Gaussian, Canonne-Kamath-Steinke 2020), so the output
lies on the grid `g * Z` and carries no trace of `x`'s low bits.

The samplers are exact: every decision compares uniform random integers with integers (no
floating-point logarithm or exponential). They follow Canonne, Kamath, Steinke, "The Discrete
Gaussian for Differential Privacy" (NeurIPS 2020; CKS below): Bernoulli(exp(-gamma)) for rational
gamma in [0, 1) by their Algorithm 1, the discrete Laplace by their Algorithm 2 and the discrete
Gaussian by rejection from a discrete Laplace (their Algorithm 3), all vectorised over numpy int64
arrays. Two changes from the paper, both exact: Bernoulli(exp(-v)) for an integer v and the
geometric count of Bernoulli(exp(-1)) successes are drawn by comparing one uniform 64-bit word with
the binary expansion of exp(-v), computed once with integer arithmetic (a proven series bound)
and refined with more random words in the 2^-64-rare case of a tie. The noise scale (and the
Gaussian's variance) is first rounded *up* to a rational the int64 arithmetic can hold (relative
change below 2^-19, see `laplace_parameters` and `gaussian_parameters`): the law is then sampled
exactly, with at least the requested noise. docs/noise.md has the derivations.
"""

from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from .errors import DPError
from .normal_law import normal_isf

_TWO_POW_53 = float(2**53)
_SMALL = float(2**32)  # below 2^-21, a uniform gets 53 more bits
#: grid steps per noise scale (log2): noise is resolved to 2^-12 of its scale, and a draw stays
#: far below 2^53 steps, where float64 integers stop being exact.
GRID_STEPS_PER_SCALE_LOG2 = 12
#: bits of precision kept when a Laplace scale or a Gaussian variance is rounded up to a rational
#: with small terms (the relative increase of the noise is below 2^-(bits - 2))
SCALE_PRECISION_BITS = 20
_MAX_LAPLACE_T_BITS = 48  # T = 2^b: X = U + T V stays below 2^62 for V < 2^14
_WORD_BITS = 64


# ---------------------------------------------------------------------------------------------
# random words and uniforms
# ---------------------------------------------------------------------------------------------


def random_words(n: int) -> np.ndarray:
    """`n` uniform 64-bit words from the OS CSPRNG."""
    if n <= 0:
        return np.empty(0, dtype=np.uint64)
    return np.frombuffer(os.urandom(8 * n), dtype=np.uint64)


def random_halfwords(n: int) -> np.ndarray:
    """`n` uniform 32-bit words from the OS CSPRNG (half the bytes where 32 bits decide)."""
    if n <= 0:
        return np.empty(0, dtype=np.uint32)
    return np.frombuffer(os.urandom(4 * n), dtype=np.uint32)


def bits_below(x: np.ndarray, bits: int) -> np.ndarray:
    """Bernoulli(x / 2^bits) for each integer 0 <= x < 2^bits (bits <= 62): a uniform `bits`-bit
    W is compared with x 32 bits at a time, the low bits drawn only where the high bits tie."""
    if bits <= 32:
        return (random_halfwords(x.size) >> np.uint32(32 - bits)).astype(np.int64) < x if bits else np.zeros(x.size, bool)
    low_bits = bits - 32
    high = random_halfwords(x.size).astype(np.int64)
    x_high = x >> low_bits
    out = high < x_high
    tie = np.flatnonzero(high == x_high)
    if tie.size:
        low = (random_words(tie.size) >> np.uint64(64 - low_bits)).astype(np.int64)
        out[tie] = low < (x[tie] & ((1 << low_bits) - 1))
    return out


def uniform_from_words(high: np.ndarray, low: np.ndarray) -> np.ndarray:
    """Uniforms on (0, 1] from two 53-bit integers each: (high + 1) / 2^53, and where high < 2^32
    (u < 2^-21) the finer (high * 2^53 + low + 1) / 2^106, which keeps 53 significant bits."""
    hi = high.astype(np.float64)
    coarse = (hi + 1.0) / _TWO_POW_53
    fine = (hi * _TWO_POW_53 + low.astype(np.float64) + 1.0) / (_TWO_POW_53 * _TWO_POW_53)
    return np.where(hi < _SMALL, fine, coarse)


def secure_uniform(n: int) -> np.ndarray:
    """`n` floats uniform on (0, 1], from the OS CSPRNG (53 significant bits down to 2^-106).

    Used for the quantile's point inside the bin its exact exponential mechanism chose (after the
    private choice); the noise samplers below use integers only."""
    if n <= 0:
        return np.empty(0, dtype=np.float64)
    words = random_words(n) >> np.uint64(11)
    small = np.flatnonzero(words < np.uint64(2**32))
    low = np.zeros(n, dtype=np.uint64)
    if small.size:
        low[small] = random_words(small.size) >> np.uint64(11)
    return uniform_from_words(words, low)


def uniform_below(bound: int, n: int) -> np.ndarray:
    """`n` integers uniform on {0, ..., bound - 1} (int64; an object array when bound > 2^62).

    Powers of two take the top bits of a word; other bounds reject words of bit_length(bound)
    bits that are >= bound (acceptance above 1/2)."""
    if bound < 1:
        raise ValueError("bound must be positive")
    if bound > 2**62:
        return np.array([secrets.randbelow(bound) for _ in range(n)], dtype=object)
    bits = (bound - 1).bit_length()
    if bound == 1 << bits:
        if bits == 0:
            return np.zeros(n, dtype=np.int64)
        return (random_words(n) >> np.uint64(_WORD_BITS - bits)).astype(np.int64)
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = n - filled
        draw = (random_words(want + want // 2 + 8) >> np.uint64(_WORD_BITS - bits)).astype(np.int64)
        draw = draw[draw < bound][:want]
        out[filled : filled + draw.size] = draw
        filled += draw.size
    return out


def _bit_lengths(values: np.ndarray) -> np.ndarray:
    """int.bit_length of each non-negative int64, exactly: the float exponent, corrected by one
    where converting to float64 rounded the value up to the next power of two."""
    lengths = np.frexp(values.astype(np.float64))[1].astype(np.int64)  # 0 for 0
    too_long = (lengths > 0) & ((values >> np.maximum(lengths - 1, 0)) == 0)
    return lengths - too_long


def uniform_below_each(bounds: np.ndarray) -> np.ndarray:
    """One integer uniform on {0, ..., bounds[i] - 1} per entry (int64, 1 <= bounds[i] < 2^63):
    the top bit_length(bound - 1) bits of a word, redrawn where they are >= the bound (each
    draw is kept with probability above 1/2)."""
    bounds = np.asarray(bounds, dtype=np.int64)
    if bounds.size and int(bounds.min()) < 1:
        raise ValueError("bounds must be positive")
    shifts = (_WORD_BITS - _bit_lengths(bounds - 1)).astype(np.uint64)
    out = np.zeros(bounds.size, dtype=np.int64)
    pending = np.flatnonzero(shifts < _WORD_BITS)  # a bound of 1 has only 0
    while pending.size:
        draw = (random_words(pending.size) >> shifts[pending]).astype(np.int64)
        kept = draw < bounds[pending]
        out[pending[kept]] = draw[kept]
        pending = pending[~kept]
    return out


# ---------------------------------------------------------------------------------------------
# exp(-v): exact binary expansions, Bernoulli(exp(-v)) for integers and rationals
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def exp_neg_floor(v: int, bits: int) -> int:
    """floor(exp(-v) * 2^bits) exactly, for an integer v >= 1, with integer arithmetic only.

    exp(v) lies in [S_N, S_N + 2 t_(N+1)] (S_N the Taylor partial sum, t the next term, valid for
    N + 2 > 2v: the tail is below a geometric series of ratio 1/2); both ends give the same floor of
    2^bits / exp(v) once N is large enough (exp(-v) is irrational, so that always happens)."""
    n_terms = 2 * v + 8
    while True:
        num, den, term_num, term_den = 0, 1, 1, 1  # S_N = num / den; term t_n = term_num / term_den
        for k in range(n_terms + 1):
            if k:
                term_num *= v
                term_den *= k
            num = num * term_den + term_num * den
            den *= term_den
            g = math.gcd(num, den)
            num, den = num // g, den // g
        next_num, next_den = term_num * v, term_den * (n_terms + 1)
        upper_num = num * next_den + 2 * next_num * den  # S_N + 2 t_(N+1)
        upper_den = den * next_den
        lo = (den << bits) // num  # 2^bits / S_N: an upper bound of 2^bits exp(-v)
        hi = (upper_den << bits) // upper_num  # a lower bound
        if lo == hi:
            return lo
        n_terms *= 2


_HALF_BITS = 32
#: floor(exp(-v) 2^32) for v = 0..31 (v = 0 is never compared); 0 from v = 23 on
_EXP_NEG_HALF = [0] + [exp_neg_floor(v, _HALF_BITS) for v in range(1, 32)]
_GEOM_MAX_V = max(v for v in range(32) if _EXP_NEG_HALF[v] > 0)  # 22
#: thresholds of the geometric count, ascending: floor(exp(-v) 2^32) for v = 22 down to 1
_GEOM_THRESHOLDS = np.array(_EXP_NEG_HALF[_GEOM_MAX_V:0:-1], dtype=np.uint32)
_EXP_NEG_TABLE = np.array(_EXP_NEG_HALF, dtype=np.uint32)
#: the same with 0 in front: entry pos is the largest threshold <= W (0 when W < all of them), so
#: `_GEOM_BELOW[pos] == W` flags both a tie and W = 0, the draws that need more bits
_GEOM_BELOW = np.concatenate([np.zeros(1, dtype=np.uint32), _GEOM_THRESHOLDS])


def _uniform_below_exp_neg(v: int, prefix: int, bits: int) -> bool:
    """Is the uniform U whose first `bits` bits are `prefix` below exp(-v)? More CSPRNG bits are
    drawn while the known bits equal exp(-v)'s expansion."""
    while True:
        threshold = exp_neg_floor(v, bits)
        if prefix != threshold:
            return prefix < threshold
        prefix = (prefix << _WORD_BITS) | secrets.randbits(_WORD_BITS)
        bits += _WORD_BITS


def bernoulli_exp_neg_int(v: np.ndarray) -> np.ndarray:
    """Bernoulli(exp(-v)) for each non-negative integer v: a uniform 32-bit W against
    floor(exp(-v) 2^32); W below is a success, above a failure; equal (probability 2^-32) is
    refined with more bits (`_uniform_below_exp_neg`)."""
    v = np.asarray(v, dtype=np.int64)
    out = np.ones(v.size, dtype=bool)  # exp(-0) = 1: no randomness spent
    positive = np.flatnonzero(v > 0)
    words = random_halfwords(positive.size)
    thresholds = _EXP_NEG_TABLE[np.minimum(v[positive], 31)]
    out[positive] = words < thresholds
    for k in np.flatnonzero(words == thresholds):
        out[positive[k]] = _uniform_below_exp_neg(int(v[positive[k]]), int(words[k]), _HALF_BITS)
    return out


#: the largest v that `bernoulli_pow2_exp_neg` takes (exp(-v) 2^t(v) needs t(v) + 32 bits)
POW2_EXP_NEG_MAX_V = 64


@lru_cache(maxsize=None)
def exp_neg_octave(v: int) -> int:
    """t(v) = floor(v log2 e) for an integer v >= 0, exactly: 2^-(t+1) < exp(-v) <= 2^-t, read
    from the bit length of floor(exp(-v) 2^(2v + 64)) (which lies in [2^(2v+63-t), 2^(2v+64-t)))."""
    if v == 0:
        return 0
    bits = 2 * v + 64
    return bits - exp_neg_floor(v, bits).bit_length()


@lru_cache(maxsize=1)
def _pow2_exp_neg_thresholds() -> np.ndarray:
    """floor(exp(-v) 2^(t(v) + 32)) for v = 0..POW2_EXP_NEG_MAX_V, in [2^31, 2^32) (v = 0 unused)."""
    return np.array([0] + [exp_neg_floor(v, exp_neg_octave(v) + _HALF_BITS) for v in range(1, POW2_EXP_NEG_MAX_V + 1)],
                    dtype=np.uint32)


def bernoulli_pow2_exp_neg(v: np.ndarray) -> np.ndarray:
    """Bernoulli(exp(-v) 2^t(v)) for each integer 0 <= v <= POW2_EXP_NEG_MAX_V, t(v) = floor(v log2 e)
    (`exp_neg_octave`): a probability in (1/2, 1]. U < exp(-v) 2^t iff U 2^-t < exp(-v), and U 2^-t
    is a uniform whose first t bits are 0: its first t + 32 bits are U's 32-bit word W, compared
    with floor(exp(-v) 2^(t + 32)); a tie (probability 2^-32) is refined with more bits."""
    v = np.asarray(v, dtype=np.int64)
    if v.size and not 0 <= int(v.min()) <= int(v.max()) <= POW2_EXP_NEG_MAX_V:
        raise ValueError(f"bernoulli_pow2_exp_neg takes 0 <= v <= {POW2_EXP_NEG_MAX_V}")
    out = np.ones(v.size, dtype=bool)  # exp(0) 2^0 = 1: no randomness spent
    positive = np.flatnonzero(v > 0)
    words = random_halfwords(positive.size)
    thresholds = _pow2_exp_neg_thresholds()[v[positive]]
    out[positive] = words < thresholds
    for k in np.flatnonzero(words == thresholds):
        level = int(v[positive[k]])
        out[positive[k]] = _uniform_below_exp_neg(level, int(words[k]), _HALF_BITS + exp_neg_octave(level))
    return out


def geometric_exp_neg_one(n: int) -> np.ndarray:
    """`n` draws of V >= 0 with P(V >= k) = exp(-k) (the number of successes of Bernoulli(exp(-1))
    before the first failure), by inversion: V = max{k : U < exp(-k)}, U's first 32 bits compared
    with exact thresholds; a tie with a threshold, or W = 0, is refined bit by bit."""
    words = random_halfwords(n)
    pos = np.searchsorted(_GEOM_THRESHOLDS, words, side="right")  # thresholds <= W
    v = (_GEOM_MAX_V - pos).astype(np.int64)  # thresholds > W
    for i in np.flatnonzero(_GEOM_BELOW[pos] == words):
        v[i] = _geometric_slow(int(words[i]), _HALF_BITS)
    return v


def _geometric_slow(prefix: int, bits: int) -> int:
    """The geometric draw for a uniform known to its first `bits` bits, refined as needed."""
    k = 0
    while True:
        threshold = exp_neg_floor(k + 1, bits)
        if prefix == threshold:
            prefix = (prefix << _WORD_BITS) | secrets.randbits(_WORD_BITS)
            bits += _WORD_BITS
            continue
        if prefix > threshold:
            return k
        k += 1


def _one_in(k: int, n: int) -> np.ndarray:
    """Bernoulli(1 / k), n times: a uniform integer below k (rejection from words of 8, 16 or 32
    bits, the narrowest that holds k - 1: the CSPRNG's bytes are the sampler's cost) is 0."""
    if k == 1:
        return np.ones(n, dtype=bool)
    if k >= 2**31:
        return uniform_below(k, n) == 0
    bits = (k - 1).bit_length()
    width = 8 if bits <= 8 else 16 if bits <= 16 else 32
    dtype = {8: np.uint8, 16: np.uint16, 32: np.uint32}[width]
    out = np.empty(n, dtype=bool)
    filled = 0
    while filled < n:
        want = n - filled
        count = want + want // 2 + 8
        draw = np.frombuffer(os.urandom(count * width // 8), dtype=dtype) >> dtype(width - bits)
        draw = draw[draw < k][:want]
        out[filled : filled + draw.size] = draw == 0
        filled += draw.size
    return out


def _floor_times_pow2_over(numerator: np.ndarray, denominator: int, bits: int) -> np.ndarray:
    """floor(num * 2^bits / den) exactly for int64 0 <= num < den < 2^62.

    den = 2^e d with d odd: floor(num 2^bits / den) = floor(num 2^(bits - e) / d) when e <= bits
    (one int64 division while num 2^(bits - e) < 2^63, i.e. d <= 2^(62 - bits)), and
    floor(floor(num / 2^(e - bits)) / d) when e > bits (nested floors of positive integers).
    Otherwise long division in chunks of (62 - bit_length(den)) bits, no product leaving int64."""
    e = (denominator & -denominator).bit_length() - 1
    odd = denominator >> e
    if e >= bits:
        return (numerator >> (e - bits)) // odd
    if odd.bit_length() <= 62 - bits:
        return (numerator << (bits - e)) // odd
    chunk = 62 - denominator.bit_length()
    quotient = np.zeros(numerator.size, dtype=np.int64)
    remainder = numerator.astype(np.int64, copy=True)
    done = 0
    while done < bits:
        step = min(chunk, bits - done)
        shifted = remainder << step
        quotient = (quotient << step) + shifted // denominator
        remainder = shifted % denominator
        done += step
    return quotient


def bernoulli_ratio(numerator: np.ndarray, denominator: int) -> np.ndarray:
    """Bernoulli(num / den) per entry, 0 <= num < den, exactly, with one 32-bit word per draw.

    A power-of-two den goes to `bits_below`. Otherwise the uniform U on [0, 1) is compared with
    num / den through their first 32 bits: W = floor(U 2^32) against th = floor(num 2^32 / den);
    W < th is a success, W > th a failure. On a tie (probability 2^-32) U < num / den iff the rest
    of U, uniform on [0, 1), is below frac(num 2^32 / den) = ((num 2^32) mod den) / den: one more
    exact draw below den."""
    numerator = np.asarray(numerator)
    if denominator & (denominator - 1) == 0 and numerator.dtype == np.int64:
        return bits_below(numerator, denominator.bit_length() - 1)
    if numerator.dtype != np.int64 or denominator >= 2**61:  # Python integers: exact, rare, slow
        return np.asarray(uniform_below(denominator, numerator.size) < numerator, dtype=bool)
    thresholds = _floor_times_pow2_over(numerator, denominator, _HALF_BITS).astype(np.uint32)  # < 2^32
    words = random_halfwords(numerator.size)
    out = words < thresholds
    for i in np.flatnonzero(words == thresholds):
        rest = (int(numerator[i]) << _HALF_BITS) % denominator
        out[i] = secrets.randbelow(denominator) < rest
    return out


def bernoulli_exp_neg_ratio(numerator: np.ndarray, denominator: int) -> np.ndarray:
    """Bernoulli(exp(-gamma)) for gamma = numerator / denominator in [0, 1), one per entry
    (CKS Algorithm 1): K = 1; while Bernoulli(gamma / K): K += 1; success when K is odd.
    Bernoulli(num / (den K)) is drawn as Bernoulli(1 / K) and Bernoulli(num / den): integers only."""
    numerator = np.asarray(numerator)
    first = bernoulli_ratio(numerator, denominator)  # K = 1 on the whole array
    out = ~first
    alive = np.flatnonzero(first)
    k = 2
    while alive.size:
        go_on = _one_in(k, alive.size)
        idx = np.flatnonzero(go_on)
        go_on[idx] = bernoulli_ratio(numerator[alive[idx]], denominator)
        out[alive[~go_on]] = k % 2 == 1
        alive = alive[go_on]
        k += 1
    return out


# ---------------------------------------------------------------------------------------------
# discrete Laplace
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaplaceParameters:
    """The scale actually sampled: T / S = 2^t_bits / s >= the requested scale."""

    t_bits: int
    s: int

    @property
    def scale(self) -> Fraction:
        return Fraction(1 << self.t_bits, self.s)


def _exact(x) -> Fraction:
    if isinstance(x, Fraction):
        return x
    if isinstance(x, (int, np.integer)):
        return Fraction(int(x))
    x = float(x)
    if not (x > 0 and math.isfinite(x)):
        raise DPError(f"noise scale must be a positive finite number, got {x!r}")
    return Fraction(x)


def laplace_parameters(scale) -> LaplaceParameters:
    """Round `scale` (a float or an exact Fraction) up to 2^b / S with b = ceil(log2 scale) + 24
    capped to [0, 48] and S = floor(2^b / scale) (exact): the sampled scale exceeds the requested
    one by a relative amount below 1 / S <= 2^-19 (scale <= 2^28), or scale / 2^48 beyond."""
    scale = _exact(scale)
    if scale <= 0:
        raise DPError(f"noise scale must be positive, got {float(scale)!r}")
    log2_ceil = (scale.numerator - 1).bit_length() - scale.denominator.bit_length() + 1  # >= ceil(log2)
    b = min(max(log2_ceil + SCALE_PRECISION_BITS, 0), _MAX_LAPLACE_T_BITS)
    s = (scale.denominator << b) // scale.numerator
    if s < 1:
        raise DPError(f"noise scale {float(scale):.4g} is over 2^48 grid steps: refused")
    if s >= 2**62:
        raise DPError(f"noise scale {float(scale):.4g} is below 2^-62 grid steps: refused")
    return LaplaceParameters(b, s)


def _discrete_laplace_exact(params: LaplaceParameters, n: int) -> np.ndarray:
    """`n` draws with P(Y = y) proportional to exp(-|y| S / T), T = 2^b (CKS Algorithm 2):
    U uniform on [0, T), kept with probability exp(-U / T); V geometric, P(V >= k) = exp(-k);
    X = U + T V has P(X = x) proportional to exp(-x / T); Y = floor(X / S); a random sign, with
    the draw (negative sign, Y = 0) rejected so that 0 is not counted twice."""
    b, s = params.t_bits, params.s
    mask = np.uint64((1 << b) - 1)
    q = math.exp(-s / float(1 << b))  # only to size batches, never in a decision
    acceptance = (1.0 - math.exp(-1.0)) * (1.0 + q) / 2.0
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = n - filled
        count = int(want / acceptance * 1.05) + 32
        if b < 32:  # U and the sign from one word of 8, 16 or 32 bits, the narrowest that holds b + 1
            width = 8 if b < 8 else 16 if b < 16 else 32
            dtype = {8: np.uint8, 16: np.uint16, 32: np.uint32}[width]
            words = np.frombuffer(os.urandom(count * width // 8), dtype=dtype)
            u = (words & dtype((1 << b) - 1)).astype(np.int64)
            negative = words >> dtype(width - 1) == 1
        else:
            words = random_words(count)
            u = (words & mask).astype(np.int64)
            negative = (words >> np.uint64(63)).astype(bool)
        kept = bernoulli_exp_neg_ratio(u, 1 << b)
        u, negative = u[kept], negative[kept]
        v = geometric_exp_neg_one(u.size)
        if v.size and int(v.max()) >= 1 << (62 - b):  # probability below exp(-2^14)
            raise DPError("discrete Laplace sampler: geometric draw out of range (probability < 1e-7000)")
        y = (u + (v << b)) // s
        valid = ~(negative & (y == 0))
        y = np.where(negative, -y, y)[valid][:want]
        out[filled : filled + y.size] = y
        filled += y.size
    return out


def discrete_laplace(scale, n: int) -> np.ndarray:
    """`n` integers K with P(K = k) proportional to exp(-|k| / scale), exactly (int64).

    `scale` is in grid steps: a positive float, or an exact `Fraction` (the release passes
    C_u * steps / epsilon exactly). It is rounded up by a relative amount below 2^-19 first
    (`laplace_parameters`), so the noise is never smaller than requested.
    """
    if not isinstance(scale, Fraction) and not (float(scale) > 0 and math.isfinite(float(scale))):
        raise DPError(f"noise scale must be a positive finite number, got {scale!r}")
    return _discrete_laplace_exact(laplace_parameters(scale), int(n))


# ---------------------------------------------------------------------------------------------
# discrete Gaussian
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GaussianParameters:
    """The law actually sampled: variance parameter sigma^2 = A 4^j / 2^r (>= the requested one),
    proposals from the discrete Laplace of scale t = 2^j."""

    j: int
    r: int
    a: int

    @property
    def variance(self) -> Fraction:
        return Fraction(self.a * 4**self.j, 1 << self.r)


def gaussian_parameters(variance) -> GaussianParameters:
    """t = 2^j with 4^j / sigma^2 in [1/2, 2) (t = 1 when sigma < 1/sqrt(2)), r = max(24, j) and A = ceil(sigma^2 2^r / 4^j)
    (exact): sigma^2 grows by a relative amount below 1 / A <= 2^-19 when sigma >= 1/2."""
    variance = _exact(variance)
    if variance <= 0:
        raise DPError(f"noise variance must be positive, got {float(variance)!r}")
    j = 0
    while Fraction(2 * 4**j) < variance:  # t = 2^j within a factor sqrt(2) of sigma (or 1)
        j += 1
    r = max(SCALE_PRECISION_BITS, j)
    scaled = variance * (1 << r) / 4**j
    a = -(-scaled.numerator // scaled.denominator)
    return GaussianParameters(j, r, a)


def _square_divmod(w: np.ndarray, den: int) -> tuple[np.ndarray, np.ndarray]:
    """(floor(w^2 / den), w^2 mod den) exactly: int64 where w^2 < 2^63, Python integers beyond."""
    w = np.abs(w)
    small = w < 3_037_000_499  # sqrt(2^63)
    if den < 2**62 and small.all():
        sq = w * w
        return sq // den, sq % den
    g = np.empty(w.size, dtype=object)
    rem = np.empty(w.size, dtype=object)
    for i, x in enumerate(w.tolist()):
        g[i], rem[i] = divmod(int(x) * int(x), den)
    return g, rem


def _discrete_gaussian_exact(params: GaussianParameters, n: int) -> np.ndarray:
    """CKS Algorithm 3 with t = 2^j: Y discrete Laplace of scale t, accepted with probability
    exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)). With sigma^2 = A 4^j / 2^r this exponent is
    w^2 / (2^(r+1) A), w = |Y| 2^(r-j) - A: an integer part g (Bernoulli(exp(-g)) by comparison with
    exp(-g)'s expansion) plus a fraction rem / den in [0, 1) (CKS Algorithm 1)."""
    j, r, a = params.j, params.r, params.a
    den = (1 << (r + 1)) * a
    proposal = LaplaceParameters(j, 1)  # scale 2^j exactly (CKS: t = 2^j, s = 1)
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        want = n - filled
        y = _discrete_laplace_exact(proposal, int(want * 1.9) + 32)
        w = (np.abs(y) << (r - j)) - a
        g, rem = _square_divmod(w, den)
        ok = bernoulli_exp_neg_int(np.minimum(g, 2**62).astype(np.int64))
        idx = np.flatnonzero(ok)
        ok[idx] = bernoulli_exp_neg_ratio(rem[idx], den)
        y = y[ok][:want]
        out[filled : filled + y.size] = y
        filled += y.size
    return out


def discrete_gaussian(sigma, n: int, *, variance=None) -> np.ndarray:
    """`n` integers K with P(K = k) proportional to exp(-k^2 / (2 sigma^2)), exactly (int64).

    `sigma` in grid steps; `variance` (sigma^2 as an exact Fraction, e.g. C_u D^2 / (2 rho)) takes
    precedence when given, so that no square root is rounded. The variance is rounded up by a
    relative amount below 2^-19 (`gaussian_parameters`). Rejection sampling from a discrete Laplace
    (Canonne, Kamath, Steinke, NeurIPS 2020, Algorithm 3), vectorised.
    """
    if variance is None:
        if not (float(sigma) > 0 and math.isfinite(float(sigma))):
            raise DPError(f"noise sigma must be a positive finite number, got {sigma!r}")
        variance = _exact(sigma) ** 2
    return _discrete_gaussian_exact(gaussian_parameters(variance), int(n))


# ---------------------------------------------------------------------------------------------
# grids and confidence half-widths (public parameters only; floats are fine here)
# ---------------------------------------------------------------------------------------------


def real_grid(scale: float) -> float:
    """The power-of-two grid step for a statistic whose noise has this scale.

    Depends on the (public) noise scale only, never on the data: 2^(ceil(log2 scale) - 12).
    """
    return math.ldexp(1.0, math.ceil(math.log2(scale)) - GRID_STEPS_PER_SCALE_LOG2)


def discrete_laplace_halfwidth(scale: float, alpha: float) -> int:
    """Smallest integer m with P(|K| > m) <= alpha, i.e. 2 q^(m+1) / (1 + q) <= alpha."""
    q = math.exp(-1.0 / scale)
    # 2 q^(m+1) / (1+q) <= alpha  <=>  m + 1 >= ln(alpha (1+q) / 2) / ln q
    bound = math.log(alpha * (1.0 + q) / 2.0) / math.log(q)
    m = max(math.ceil(bound - 1.0 - 1e-12), 0)
    while 2.0 * q ** (m + 1) / (1.0 + q) > alpha:  # guard against float rounding
        m += 1
    return m


def discrete_gaussian_halfwidth(sigma: float, alpha: float) -> int:
    """Smallest integer m with P(|K| > m) <= alpha under the discrete Gaussian.

    Summed exactly from the probability mass function when sigma < 1e4 grid steps; beyond, the
    discrete and continuous laws agree to far below float precision (CKS 2020, Fact 20), and the
    continuous quantile rounded up plus one step is used.
    """
    if sigma >= 1e4:
        return math.ceil(sigma * normal_isf(alpha / 2.0)) + 1
    k = np.arange(0, math.ceil(40 * sigma) + 2, dtype=np.float64)
    w = np.exp(-(k * k) / (2.0 * sigma * sigma))
    total = w[0] + 2.0 * w[1:].sum()
    # P(|K| > m) = 2 * sum_{k > m} w_k / total
    tail_after = 2.0 * (w[::-1].cumsum()[::-1] - w) / total
    return int(np.argmax(tail_after <= alpha))
