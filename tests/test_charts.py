"""The controller's charts are self-contained SVG (no external resources)."""

from __future__ import annotations

import pytest

from dp_core.pri import PRIRange
from dprelease.reporting import charts


def _check(svg: str):
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    import re

    urls = set(re.findall(r"https?://[^\"\s<>]+", svg))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls  # namespaces only


def test_pri_range_chart():
    ranges = [PRIRange(e, 1.0 / e, 1.2 / e, 1.5 / e, e < 1) for e in (10.0, 1.0, 0.1, 0.01)]
    svg = charts.pri_ranges_svg(ranges, 50, chosen=0.1)
    _check(svg)
    assert "chosen epsilon 0.1" in svg and "threshold 1 - p/100 = 0.5" in svg


def test_noise_risk_chart_and_surface():
    svg = charts.noise_risk_svg(trust="low", sensitivity="high", max_risk=0.2, n=4, m=2, chosen_eps=0.23)
    _check(svg)
    assert "tolerable risk 0.2" in svg and "chosen: epsilon 0.23" in svg
    _check(charts.risk_surface_svg(eps=0.23, n=4, m=2))


# --- the release charts, written as SVG directly (dprelease/reporting/svg_chart.py) ---------------


def _bars(svg: str) -> list[dict]:
    """The bars of a chart: their attributes and hover title, parsed as XML (so the SVG is well formed)."""
    import xml.etree.ElementTree as ET

    ns = "{http://www.w3.org/2000/svg}"
    root = ET.fromstring(svg)
    return [dict(r.attrib, title=r.find(f"{ns}title").text) for r in root.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]


def test_released_values_chart_draws_each_value_to_scale_with_its_interval():
    from dprelease.reporting import pages

    svg = pages.released_values_svg("people", ["a", "b", "c"], [100.0, 50.0, 25.0], [90.0, 40.0, float("nan")],
                                    [110.0, 60.0, float("nan")])
    _check(svg)
    bars = _bars(svg)
    assert [b["title"] for b in bars] == ["a: 100", "b: 50", "c: 25"]  # largest first
    heights = [float(b["height"]) for b in bars]
    assert heights[0] / heights[1] == pytest.approx(2.0, rel=1e-3)
    assert heights[1] / heights[2] == pytest.approx(2.0, rel=1e-3)
    assert svg.count("<path") == 2  # whiskers where the interval is finite, none for "c"
    assert svg == pages.released_values_svg("people", ["a", "b", "c"], [100.0, 50.0, 25.0],
                                            [90.0, 40.0, float("nan")], [110.0, 60.0, float("nan")])  # same bytes


def test_the_chart_s_top_groups_are_the_largest_released_values_missing_ones_last():
    """With more groups than the chart shows, it shows the largest released values; a group whose
    value is missing (NaN) is never ranked among them ahead of a released one."""
    from dprelease.reporting import pages

    nan = float("nan")
    svg = pages.released_values_svg("people", ["gone", "a", "b", "c"], [nan, 30.0, 10.0, 20.0],
                                    [nan, 25.0, 5.0, 15.0], [nan, 35.0, 15.0, 25.0], limit=2)
    _check(svg)
    assert [b["title"] for b in _bars(svg)] == ["a: 30", "c: 20"]


def test_per_group_charts_widen_with_their_groups_within_600_to_1400_px():
    """A chart of many groups gets room for each group's bars and label (45 px a group beside the
    exact value, 40 px for the released one alone, plus 200 for the axis), never below 600 px nor
    above 1400 px."""
    import xml.etree.ElementTree as ET

    from dprelease.reporting import pages

    def widths(n: int) -> tuple[float, float]:
        groups, values = [f"g{i}" for i in range(n)], [float(i + 1) for i in range(n)]
        both = pages.exact_vs_released_svg("people", groups, values, values, values, values)
        alone = pages.released_values_svg("people", groups, values, values, values)
        return float(ET.fromstring(both).get("width")), float(ET.fromstring(alone).get("width"))

    assert widths(3) == (600.0, 600.0)
    assert widths(16) == (16 * 45 + 200, 16 * 40 + 200)
    assert widths(29) == (1400.0, 29 * 40 + 200)
    assert widths(60)[0] == 1400.0  # (the released-values chart shows the largest 30)


def test_chart_text_is_escaped_and_loads_nothing():
    from dprelease.reporting import pages

    hostile = '<script>alert("x")</script> & <a onclick="steal()">'
    svg = pages.exact_vs_released_svg(hostile, [hostile, "ok"], [3.0, 4.0], [2.0, 5.0], [1.0, 4.0], [3.0, 6.0])
    _check(svg)
    assert "<script" not in svg and "<a " not in svg and "&lt;script&gt;" in svg
    assert len(_bars(svg)) == 4  # exact and released, per group


def test_bounds_histogram_marks_the_threshold_on_a_symmetric_log_axis():
    from types import SimpleNamespace

    from dprelease.reporting import pages

    edges = [(0, 1)] + [(2 ** k, 2 ** (k + 1)) for k in range(12)]
    counts = [3, -2, 5, 40, 300, 1200, 800, 60, 7, -4, 1, 0, 2]
    svg = pages.bounds_histogram_svg(SimpleNamespace(noisy_counts=counts, bin_edges=edges, threshold=25.0, lower=4,
                                                     upper=64, aggregate="income"))
    _check(svg)
    assert "threshold 25" in svg and "bounds chosen: [4, 64]" in svg
    bars = {b["title"].split(": ")[1]: float(b["height"]) for b in _bars(svg)}
    # symlog with linear threshold 10: height ~ log10(1 + |y| / 10)
    import math

    assert bars["1200"] / bars["300"] == pytest.approx(math.log10(121) / math.log10(31), rel=1e-3)


def test_the_bounds_histogram_shows_three_bins_either_side_of_those_above_the_threshold_and_the_bounds():
    """Of 31 bins, only those from three below the first bin above the threshold (or holding the
    bounds) to three above the last are drawn: the bins far away hold noise only."""
    import re
    from types import SimpleNamespace

    from dprelease.reporting import pages

    edges = [(0, 1)] + [(2 ** k, 2 ** (k + 1)) for k in range(30)]
    counts = [1.0] * 31
    counts[10:13] = [80.0, 200.0, 90.0]  # [512, 2^10), [2^10, 2^11), [2^11, 2^12)
    svg = pages.bounds_histogram_svg(SimpleNamespace(noisy_counts=counts, bin_edges=edges, threshold=25.0, lower=512,
                                                     upper=4096, aggregate="income"))
    labels = re.findall(r">(\[[^<]*\))</text>", svg)
    assert labels == ["[64, 128)", "[128, 256)", "[256, 512)", "[512, 2^10)", "[2^10, 2^11)", "[2^11, 2^12)",
                      "[2^12, 2^13)", "[2^13, 2^14)", "[2^14, 2^15)"]
    wider = pages.bounds_histogram_svg(SimpleNamespace(noisy_counts=counts, bin_edges=edges, threshold=25.0, lower=512,
                                                       upper=4096, aggregate="income"), upper=2 ** 20)
    assert re.findall(r">(\[[^<]*\))</text>", wider)[-1] == "[2^22, 2^23)"  # the given bound's bin, and three more


def test_the_controller_chart_shows_the_forty_groups_with_the_largest_exact_values(monkeypatch):
    """With more groups than the exact-against-released chart holds (40), it shows those with the
    largest exact values, not the first 40 of the table."""
    from types import SimpleNamespace

    import pandas as pd

    import dp_core as dp
    from dprelease.reporting import pages

    sizes = {f"g{i:02d}": 100 + 10 * i for i in range(50)}
    df = pd.DataFrame({"g": [g for g, n in sizes.items() for _ in range(n)]})
    df["uid"] = range(len(df))
    r = dp.execute(dp.Query([dp.count(name="n")], privacy_unit="uid", group_by=("g",), epsilon=1.0), df)
    assert len(r.table) == 50
    shown = {}

    def chart(name, groups, *values):
        shown[name] = groups
        return "<svg></svg>"

    monkeypatch.setattr(pages, "exact_vs_released_svg", chart)
    context = pages._controller_context(r, SimpleNamespace(charts={}))
    assert sorted(shown["n"]) == sorted(g for g, n in sizes.items() if n >= 200)  # the 40 largest: g10 to g49
    assert (context["chart"]["shown"], context["chart"]["total"]) == (40, 50)


def test_the_bounds_histogram_labels_bin_edges_from_1024_on_as_signed_powers_of_two():
    """A bin edge of magnitude 2^10 or more is labelled as a power of two with its sign ("-2^11",
    "2^10"), a smaller one as the number itself, zero as "0": the bins of a signed column read in order."""
    from types import SimpleNamespace

    from dprelease.reporting import pages

    edges = [(-4096, -2048), (-2048, -1024), (-1024, -512), (0, 1), (512, 1024), (1024, 2048), (2048, 4096)]
    svg = pages.bounds_histogram_svg(SimpleNamespace(noisy_counts=[100.0] * 7, bin_edges=edges, threshold=25.0,
                                                     lower=-4096, upper=4096, aggregate="balance"))
    _check(svg)
    for label in ("[-2^12, -2^11)", "[-2^11, -2^10)", "[-2^10, -512)", "[0, 1)", "[512, 2^10)", "[2^10, 2^11)",
                  "[2^11, 2^12)"):
        assert f">{label}</text>" in svg, label


def test_the_bounds_histogram_is_titled_for_its_statistic_and_its_bounds_and_its_axis_counts_people():
    """The histogram behind inferred bounds says what it shows: its title names the statistic and the
    bounds chosen, and its vertical axis reads "noisy count of people" (the bins count people, not rows)."""
    import re
    from types import SimpleNamespace

    from dprelease.reporting import pages

    edges = [(0, 1)] + [(2 ** k, 2 ** (k + 1)) for k in range(8)]
    svg = pages.bounds_histogram_svg(SimpleNamespace(noisy_counts=[1.0, 2.0, 40.0, 90.0, 3.0, 0.0, 1.0, 2.0, 0.0],
                                                     bin_edges=edges, threshold=25.0, lower=2, upper=8,
                                                     aggregate="income"))
    _check(svg)
    assert re.findall(r'<text x="[^"]*" y="20" font-size="13" text-anchor="middle">([^<]*)</text>', svg) == [
        "Noisy histogram of income per person (bins double in width); bounds chosen: [2, 8]"]
    assert re.findall(r'rotate\(-90\)" font-size="11" text-anchor="middle">([^<]*)</text>', svg) == [
        "noisy count of people"]


def test_a_bin_whose_noisy_count_equals_the_threshold_is_drawn_blue_with_three_bins_either_side():
    """A noisy count reaching the threshold exactly counts as above it: that bin (far above the
    bounds here) is drawn blue, with the three bins beyond it, as a bin above the threshold is."""
    import re
    from types import SimpleNamespace

    from dprelease.reporting import pages

    edges = [(0, 1)] + [(2 ** k, 2 ** (k + 1)) for k in range(30)]
    counts = [1.0] * 31
    counts[11] = 80.0  # [2^10, 2^11): inside the bounds
    counts[20] = 25.0  # [2^19, 2^20): exactly the threshold
    svg = pages.bounds_histogram_svg(SimpleNamespace(noisy_counts=counts, bin_edges=edges, threshold=25.0, lower=1024,
                                                     upper=2048, aggregate="income"))
    labels = re.findall(r">(\[[^<]*\))</text>", svg)
    assert labels == ["[128, 256)", "[256, 512)", "[512, 2^10)"] + [f"[2^{k}, 2^{k + 1})" for k in range(10, 23)]
    fills = re.findall(r'fill="(#[0-9a-f]+)" stroke="#333333" stroke-width="0.3"><title>', svg)
    assert [i for i, f in enumerate(fills) if f == "#2d6cdf"] == [labels.index("[2^10, 2^11)"),
                                                                  labels.index("[2^19, 2^20)")]


def test_the_released_values_chart_takes_a_value_or_interval_end_given_as_none_as_missing():
    """A released value or an interval end given as None is missing, as NaN is: no bar for a missing
    value (its group ranked last), no whisker for a missing end; the chart is the one drawn from NaN."""
    from dprelease.reporting import pages

    nan = float("nan")
    svg = pages.released_values_svg("people", ["a", "b", "c"], [100.0, None, 25.0], [None, 40.0, 20.0],
                                    [110.0, 60.0, 30.0])
    _check(svg)
    assert [b["title"] for b in _bars(svg)] == ["a: 100", "c: 25"]
    assert svg.count("<path") == 1  # c's whisker; a has no low end
    assert svg == pages.released_values_svg("people", ["a", "b", "c"], [100.0, nan, 25.0], [nan, 40.0, 20.0],
                                            [110.0, 60.0, 30.0])
