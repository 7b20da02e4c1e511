"""The controller's charts are self-contained SVG (no external resources)."""

from __future__ import annotations

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
