"""Charts for the controller, as self-contained SVG text (no network resources).

- `pri_ranges_svg`: per candidate epsilon, the range of PRIs (min..max box, median tick) of one
  probe, as in the seed's user study (range plots led to more consistent choices than histograms).
  Computed from raw data: controller only.
- `noise_risk_svg`: the decision-support chart of risk.md: % noise against risk, the
  tolerable-risk line, the chosen point. Public parameters only.
- `risk_surface_svg`: the optional 3-D surface of risk over trust x sensitivity at the chosen noise.
"""

from __future__ import annotations

import io

import numpy as np

from dp_core import risk as risk_model

from .svg_chart import Chart

_METADATA = {"Creator": None, "Date": None, "Format": None, "Type": None}


def pyplot():
    """matplotlib, loaded by the charts that need it (PRI ranges, the risk surface, the series
    page) and by nothing a plain release draws: it costs about a second to import."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text (smaller, selectable)
    return plt


def svg_text(fig) -> str:
    """A matplotlib figure as inline SVG text: no XML prolog, no metadata, stable ids; closed after."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dprelease"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata=dict(_METADATA))
    pyplot().close(fig)
    fig.clear()
    text = buf.getvalue()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text




def pri_ranges_svg(ranges, p: float, chosen: float | None = None) -> str:
    """Top: boxes from the smallest to the largest PRI at each candidate epsilon, median ticked.
    Bottom: min / max against the test's threshold 1 - p/100 (green: the candidate passes)."""
    eps = np.array([r.epsilon for r in ranges])
    lo = np.array([r.minimum for r in ranges])
    hi = np.array([r.maximum for r in ranges])
    med = np.array([r.median for r in ranges])
    colours = np.where([r.passed for r in ranges], "#4c9a6a", "#b0b7c3")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(hi > 0, lo / hi, 1.0)
    fig, (top, bottom) = pyplot().subplots(2, 1, figsize=(7.5, 5.2), sharex=True, height_ratios=[3, 2])
    floor = max(hi.max(initial=1.0) * 1e-6, 1e-12)
    top.vlines(eps, np.maximum(lo, floor), np.maximum(hi, floor), colors=colours, linewidth=6)
    top.scatter(eps, np.maximum(med, floor), marker="_", s=80, color="#111", zorder=3, label="median PRI")
    top.set_yscale("log")
    top.set_ylabel("PRI (L1 distance)")
    top.set_title("PRI range of one probe per candidate epsilon (controller only)")
    bottom.scatter(eps, ratio, c=colours, edgecolors="#333", linewidths=0.4, zorder=3)
    bottom.axhline(1 - p / 100, color="#c0392b", linestyle="--", linewidth=1, label=f"threshold 1 - p/100 = {1 - p / 100:g}")
    bottom.set_ylim(-0.02, 1.02)
    bottom.set_ylabel("min PRI / max PRI")
    bottom.set_xlabel("candidate epsilon")
    bottom.set_xscale("log")
    for ax in (top, bottom):
        if chosen is not None:
            ax.axvline(chosen, color="#2d6cdf", linestyle=":", linewidth=1.2, label=f"chosen epsilon {chosen:g}")
        ax.legend(loc="lower left", fontsize=8)
    return svg_text(fig)


def noise_risk_svg(*, trust, sensitivity, max_risk, n: int, m: int = 1, df: float = 1.0, p: float = 0.9,
                   example_value: float = 100.0, chosen_eps: float | None = None, noise_at=None,
                   statistic: str = "a count") -> str:
    """Risk against % noise at confidence p, relative to a value of example_value. noise_at: total
    epsilon -> the interval half-width of the plan's `statistic` (dp_core.accuracy), so that the
    x axis is the release's real noise; without it, one Laplace count of sensitivity df that
    receives the whole epsilon (the seed's model)."""
    t, s, r = (risk_model.level_value(x) for x in (trust, sensitivity, max_risk))
    if noise_at is not None:  # sampled along epsilon: the plan's noise has no closed-form inverse
        grid = np.geomspace(1e-3, 50.0, 120)
        half = np.array([noise_at(e) for e in grid])
        pct_all = 100.0 * half / example_value
        keep = np.isfinite(pct_all) & (pct_all <= 60) & (pct_all >= 0.5)
        pct, eps = pct_all[keep], grid[keep]
    else:
        pct = np.linspace(0.5, 60, 240)  # the seed treats ~50% noise as a practical limit
        eps = np.array([risk_model.laplace_epsilon(x / 100 * example_value, df, p) for x in pct])
    rk = np.array([risk_model.risk(s, t, risk_model.guessing_bound(e, n, m)) for e in eps])
    chart = Chart(f"Noise against risk (trust {t:g}, sensitivity {s:g}, {n} possible values)",
                  y_label="risk = s (1 - t) q",
                  x_label=f"% noise (for {statistic} of {example_value:g}, with {p:.0%} probability)",
                  y_limits=(0.0, max(s * (1 - t), r) * 1.05 + 1e-9))
    chart.line(pct, rk, "#2d6cdf", "risk")
    chart.hline(r, "#c0392b", f"tolerable risk {r:g}")
    if chosen_eps is not None:
        noise = noise_at(chosen_eps) if noise_at is not None else risk_model.laplace_error(chosen_eps, df, p)
        x = 100 * noise / example_value
        y = risk_model.risk(s, t, risk_model.guessing_bound(chosen_eps, n, m))
        chart.points([x], [y], "#111111", f"chosen: epsilon {chosen_eps:.3g}, {x:.0f}% noise")
    return chart.svg()


def risk_surface_svg(*, eps: float, n: int, m: int = 1) -> str:
    """Risk over trust x sensitivity at one epsilon (translucent surface)."""
    q = risk_model.guessing_bound(eps, n, m)
    t, s = np.meshgrid(np.linspace(0, 1, 21), np.linspace(0, 1, 21))
    fig = pyplot().figure(figsize=(5.5, 4.2))
    ax = fig.add_subplot(projection="3d")
    ax.plot_surface(t, s, s * (1 - t) * q, alpha=0.6, cmap="viridis")
    ax.set_xlabel("trust")
    ax.set_ylabel("sensitivity")
    ax.set_zlabel("risk")
    ax.set_title(f"Risk at epsilon {eps:.3g} (q = {q:.2f})")
    return svg_text(fig)
