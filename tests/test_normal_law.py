"""dp_core.normal_law: the standard normal tail and its inverse without scipy, checked against
scipy.stats.norm (a test dependency only), and a Gaussian release that never imports scipy."""

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import norm

from dp_core.normal_law import normal_isf, normal_sf


def test_the_tail_matches_scipy_over_the_whole_range_of_normal_floats():
    """sf is the weighted Gaussian selection's bound on a lone unit passing: it must be the tail,
    not 1 - Phi (which is 0 beyond x = 8.3); x up to 37.5 keeps P above the smallest normal float."""
    x = np.linspace(-10.0, 37.5, 47_501)
    expected = norm.sf(x)
    got = normal_sf(x)
    assert got.dtype == np.float64 and got.shape == x.shape
    assert np.max(np.abs(got - expected) / expected) < 1e-12
    for v in (-3.0, 0.0, 1.5, 9.0, 30.0):  # a number gives a float
        assert isinstance(normal_sf(v), float)
        assert normal_sf(v) == pytest.approx(float(norm.sf(v)), rel=1e-12)
    assert normal_sf(0.0) == 0.5 and normal_sf(math.inf) == 0.0 and normal_sf(-math.inf) == 1.0


def test_the_inverse_tail_matches_scipy_from_1e_300_to_1():
    tails = np.concatenate([10.0 ** -np.linspace(0.01, 300, 3_000), 1 - 10.0 ** -np.linspace(1, 15, 141),
                            [0.5, 0.25, 0.75, 0.975, 0.025]])
    for p in tails:
        expected = float(norm.isf(p))
        assert normal_isf(p) == pytest.approx(expected, rel=1e-13, abs=1e-15), p
    assert normal_isf(0.5) == 0.0
    assert normal_isf(0.0) == math.inf and normal_isf(-0.1) == math.inf
    assert normal_isf(1.0) == -math.inf and normal_isf(1.5) == -math.inf
    assert math.isnan(normal_isf(math.nan))
    # the round trip: the tail of the tail's quantile is the tail
    for p in (1e-12, 1e-6, 0.01, 0.3):
        assert normal_sf(normal_isf(p)) == pytest.approx(p, rel=1e-12)


def test_a_gaussian_release_with_weighted_selection_and_intervals_never_imports_scipy():
    """scipy.stats took 0.5-0.7 s of each release (summary, selection, intervals); dp_core needs
    only numpy and the standard library for the normal law."""
    code = """
import sys
import pandas as pd
import dp_core as dp
rows = pd.DataFrame({"uid": list(range(3000)) * 2, "g": ["a", "b", "c"] * 2000, "v": [1.0, 2.0] * 3000})
q = dp.Query([dp.count(upper=4), dp.sum_("v", 0, 3), dp.avg("v", 0, 3)], privacy_unit="uid", group_by=("g",),
             epsilon=1.0, delta=1e-6, max_partitions_contributed=2, noise="gaussian", selection="weighted_gaussian")
result = dp.execute(q, rows)
assert len(result.table) == 3, result.table
from dp_core import selection_advice, noise
noise.discrete_gaussian_halfwidth(2e4, 0.05)
print(" ".join(sorted(sys.modules)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert not {m.split(".")[0] for m in out} & {"scipy"}
