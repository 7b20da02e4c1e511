"""Sampler benchmark (issue 18): the exact integer samplers against the float samplers they replaced.

For several scales, times `noise.discrete_laplace` and `noise.discrete_gaussian` (exact, integers
only, os.urandom bits) and, in the same run, the previous float64 samplers (geometric by inversion,
floor(-t ln U), and the same CKS rejection with a float exp), kept here only as a baseline. Prints
samples per second of CPU time (process time, system time of os.urandom included; best of REPEATS:
the machine is shared, and CPU time is what "one core" means there) and the ratio exact / float.
Target: >= 2 million exact samples per second on one core. Run: python bench/noise.py [--n 2000000].
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")

from dp_core import noise

REPEATS = 5


def float_discrete_laplace(scale: float, n: int) -> np.ndarray:
    """The replaced sampler: difference of two geometrics floor(-t ln U), U from os.urandom."""
    return np.floor(-scale * np.log(noise.secure_uniform(n))) - np.floor(-scale * np.log(noise.secure_uniform(n)))


def float_discrete_gaussian(sigma: float, n: int) -> np.ndarray:
    """The replaced sampler: CKS rejection from the float discrete Laplace with a float exp."""
    t = math.floor(sigma) + 1.0
    var = sigma * sigma
    out = np.empty(n)
    filled = 0
    while filled < n:
        want = n - filled
        batch = max(int(want * 1.6) + 16, 64)
        y = float_discrete_laplace(t, batch)
        kept = y[noise.secure_uniform(batch) <= np.exp(-((np.abs(y) - var / t) ** 2) / (2.0 * var))]
        take = min(kept.size, want)
        out[filled : filled + take] = kept[:take]
        filled += take
    return out


def rate(fn, n: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.process_time()
        fn(n)
        best = min(best, time.process_time() - start)
    return n / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_000_000)
    args = ap.parse_args()
    print(f"{args.n:,} samples per call, best of {REPEATS}; M/s = million samples per CPU second")
    print(f"{'sampler':<10} {'scale':>9} {'exact M/s':>10} {'float M/s':>10} {'exact/float':>12}")
    for name, exact, old, scales in (
        ("laplace", noise.discrete_laplace, float_discrete_laplace, (0.5, 1.0, 10.0, 1000.0, 2.0**12 * 100, 2.0**30)),
        ("gaussian", noise.discrete_gaussian, float_discrete_gaussian, (0.5, 3.3, 100.0, 2.0**16, 2.0**24)),
    ):
        for scale in scales:
            r_exact = rate(lambda n, f=exact, s=scale: f(s, n), args.n)
            r_old = rate(lambda n, f=old, s=scale: f(s, n), args.n)
            print(f"{name:<10} {scale:>9.4g} {r_exact / 1e6:>10.2f} {r_old / 1e6:>10.2f} {r_exact / r_old:>12.2f}")


if __name__ == "__main__":
    main()
