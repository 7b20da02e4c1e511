"""A tiny epsilon, or a tiny share of one, is refused in one line before any data is read, naming the
part that would be pure noise and the smallest epsilon that works; it never ends in a float error
(ZeroDivisionError, math domain error) in a threshold, a half-width or the budget split."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import dp_core as dp
from dp_core import accuracy
from dp_core.errors import InvalidQueryError
from dp_core.sql import Table, run_sql

#: down to the smallest subnormal double (5e-324 is read as 2^-1074)
EPSILONS = (1e-6, 1e-9, 1e-12, 1e-15, 1e-17, 1e-20, 1e-100, 1e-300, 1e-310, 5e-324)

DATA = pd.DataFrame({"uid": np.arange(400), "g": np.tile(["a", "b"], 200), "x": np.arange(400) % 50 * 1.0})

#: every noisy part the engine has: each selection, the bounds inference, Laplace and Gaussian
#: aggregates (count, sum, avg's and var's components), quantiles, with and without GROUP BY
SHAPES = {
    "count, no GROUP BY": dict(aggregates=[dp.count()]),
    "laplace threshold": dict(aggregates=[dp.count_units()], group_by=("g",)),
    "truncated geometric": dict(aggregates=[dp.count(), dp.avg("x", 0, 50)], group_by=("g",)),
    "weighted gaussian": dict(aggregates=[dp.count()], group_by=("g",), selection="weighted_gaussian"),
    "mad": dict(aggregates=[dp.count()], group_by=("g",), selection="mad", max_partitions_contributed=2),
    "damped mad": dict(aggregates=[dp.count()], group_by=("g",), selection="mad_damped", max_partitions_contributed=2),
    "inferred bounds": dict(aggregates=[dp.sum_("x", None, None)], group_by=("g",)),
    "gaussian aggregates": dict(aggregates=[dp.count(), dp.var("x", 0, 50)], group_by=("g",), noise="gaussian"),
    "gaussian selection and aggregates": dict(aggregates=[dp.sum_("x", 0, 50)], group_by=("g",), noise="gaussian",
                                              selection="mad"),
    "median": dict(aggregates=[dp.median("x", 0, 50), dp.count()]),
}

SMALLEST = re.compile(r"the smallest epsilon that works for this query is ([0-9.e+-]+) ")


def _run(query: dp.Query):
    """The release, or the DPError it ends in (any other exception fails the test)."""
    try:
        return dp.execute(query, DATA)
    except dp.DPError as err:
        return err


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_epsilon_down_to_the_smallest_double_is_released_or_refused_with_the_epsilon_that_works(shape):
    """Through the Python API: each epsilon gives a release or the one-line refusal, whose named
    epsilon passes and whose next smaller 3-digit value does not."""
    for eps in EPSILONS:
        query = dp.Query(privacy_unit="uid", epsilon=eps, **SHAPES[shape])
        out = _run(query)
        if not isinstance(out, dp.DPError):
            continue
        message = str(out)
        assert isinstance(out, InvalidQueryError) and "\n" not in message, message
        assert message.startswith(f"epsilon = {eps:.6g} is too small for this query: "), message
        assert "times its sensitivity (over 2^20: the output would be pure noise, so it is refused)" in message
        named = float(SMALLEST.search(message).group(1))
        replace(query, epsilon=named).validate()  # the named epsilon works
        below = float(f"{named - 10.0 ** (math.floor(math.log10(named)) - 2):.3g}")  # the 3-digit value before
        with pytest.raises(InvalidQueryError, match="is too small for this query"):
            replace(query, epsilon=below).validate()


@pytest.mark.parametrize("eps", ["1e-300", "1e-15", "5e-324", "1e-310"])
def test_a_tiny_epsilon_in_sql_options_is_refused_at_compile_time(eps):
    """The issue's case: OPTIONS (epsilon = 1e-300) ended in ZeroDivisionError."""
    tables = {"t": Table(DATA, privacy_unit="uid")}
    for sql in (f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {eps}) g, COUNT(*) AS n FROM t GROUP BY g",
                f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {eps}) COUNT(*) AS n FROM t",
                f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {eps}, delta = 1e-6) g, "
                "SUM(x) AS s FROM t GROUP BY g"):
            with pytest.raises(InvalidQueryError, match=r"is too small for this query: .* the smallest epsilon that "
                                                        r"works for this query is "):
                run_sql(sql, tables)
    with pytest.raises(InvalidQueryError, match="is too small for this query"):
        run_sql("SELECT WITH DIFFERENTIAL_PRIVACY g, COUNT(*) AS n FROM t GROUP BY g", tables, epsilon=float(eps))


@pytest.mark.parametrize("setting, value, part", [
    ("selection_weight", 1e-300, "the partition selection"),
    ("selection_weight", 5e-324, "the partition selection"),
    ("bounds_fraction", 1e-300, "the bounds inference of 'sum_x'"),
    ("max_partitions_contributed", 10**9, "the bounds inference of 'sum_x'"),
])
def test_a_share_too_thin_for_any_epsilon_names_the_setting_that_sizes_it(setting, value, part):
    """A tiny budget share (a weight, bounds_fraction) or a huge C_u: no epsilon can help, the
    refusal names the part and the setting."""
    query = dp.Query([dp.sum_("x", None, None)], privacy_unit="uid", group_by=("g",), epsilon=1.0, **{setting: value})
    with pytest.raises(InvalidQueryError) as caught:
        dp.execute(query, DATA)
    message = str(caught.value)
    opening = f"this query's budget is split too thin: of epsilon = 1, {part} would get epsilon "
    assert message.startswith(opening), message
    assert "no epsilon up to 100 is enough" in message and setting.split("_contributed")[0] in message, message


def test_an_aggregate_of_tiny_weight_is_refused_by_name():
    query = dp.Query([dp.count(weight=1e-300, name="rare"), dp.count(name="n")], privacy_unit="uid",
                     group_by=("g",), epsilon=1.0)
    with pytest.raises(InvalidQueryError, match=r"of epsilon = 1, rare would get epsilon 5e-301 .* raise its weight"):
        dp.execute(query, DATA)


@pytest.mark.parametrize("eps", EPSILONS)
def test_the_accuracy_preview_states_an_infinite_interval_instead_of_failing(eps):
    """The preview (no floor: it states what each part would give) never divides by zero either."""
    for kwargs in (dict(aggregates=[dp.count(upper=1), dp.avg("x", 0, 50)], group_by=("g",)),
                   dict(aggregates=[dp.count(upper=1), dp.sum_("x", 0, 50)], noise="gaussian"),
                   dict(aggregates=[dp.count_units()], group_by=("g",))):
        query = dp.Query(privacy_unit="uid", epsilon=1.0, **kwargs)
        at_1e6 = {s.name: s.halfwidth for s in accuracy.statistic_intervals(query, epsilon=1e-6)}
        for interval in accuracy.statistic_intervals(query, epsilon=eps):
            if interval.mechanism == "discrete Gaussian":
                # a Gaussian is (eps, delta)-DP with finite noise as eps goes to 0: its delta buys it
                # (Canonne-Kamath-Steinke's conversion), so its interval may stay finite, never narrower
                # (infinite once the share itself underflows to 0)
                assert interval.halfwidth >= at_1e6[interval.name], interval
            else:
                assert interval.halfwidth == math.inf or eps >= 1e-6, interval
