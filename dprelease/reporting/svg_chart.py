"""Small charts written directly as SVG text: bars (grouped, with interval whiskers), lines, points
and reference lines over a category or a numeric x axis, on a linear or symmetric-log y axis.

The charts of every release (released values, exact against released, the bounds histogram, noise
against risk) are drawn here rather than with matplotlib: a report needs a few bars and lines, and
matplotlib costs about a second to import and a few tenths of a second per chart, on every release.
The output is self-contained (no fonts, scripts or links), deterministic (the same input gives the
same bytes, so signed reports are reproducible) and escapes every piece of text it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

FONT = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""
CHAR_W = 0.58  # average glyph width, in font sizes: enough to lay out labels without a font engine


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def tick_label(v: float) -> str:
    """A y tick as a reader writes it: 0, 250, 1.5k, 2M, 0.05."""
    if v == 0:
        return "0"
    a = abs(v)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= scale:
            return f"{v / scale:g}{suffix}"
    return f"{v:.3g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round ticks (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks, v = [], first
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 12))
        v += step
    if ticks[-1] < hi:
        ticks.append(round(v, 12))
    return ticks


@dataclass
class _Series:
    kind: str  # "bars", "line", "points"
    values: list[float]
    colour: str
    label: str | None
    low: list[float] | None = None
    high: list[float] | None = None
    x: list[float] | None = None  # numeric x (lines and points on a numeric axis)
    colours: list[str] | None = None  # one colour per bar


@dataclass
class Chart:
    """One chart. Add series, then `svg()`. x is either categories (bars) or numeric (lines)."""

    title: str
    y_label: str = ""
    x_label: str = ""
    width: float = 720.0
    height: float = 340.0
    categories: list[str] | None = None
    rotate_labels: bool = True
    symlog_threshold: float | None = None  # symmetric log y axis, linear within +-threshold
    y_limits: tuple[float, float] | None = None
    series: list[_Series] = field(default_factory=list)
    hlines: list[tuple[float, str, str]] = field(default_factory=list)  # (y, colour, label)

    # -- what to draw ---------------------------------------------------------------------------

    def bars(self, values, colour: str, label: str | None = None, low=None, high=None, colours=None) -> Chart:
        """Bars, one per category (several calls: grouped side by side); low/high draw whiskers
        where both are finite."""
        self.series.append(_Series("bars", [float(v) for v in values], colour, label,
                                   None if low is None else [float(v) for v in low],
                                   None if high is None else [float(v) for v in high], colours=colours))
        return self

    def line(self, x, y, colour: str, label: str | None = None) -> Chart:
        self.series.append(_Series("line", [float(v) for v in y], colour, label, x=[float(v) for v in x]))
        return self

    def points(self, x, y, colour: str, label: str | None = None) -> Chart:
        self.series.append(_Series("points", [float(v) for v in y], colour, label, x=[float(v) for v in x]))
        return self

    def hline(self, y: float, colour: str, label: str) -> Chart:
        """A dashed horizontal reference line (a threshold, a tolerable risk)."""
        self.hlines.append((float(y), colour, label))
        return self

    # -- scales -------------------------------------------------------------------------------

    def _ty(self, y: float) -> float:
        """y in axis units (symlog: sign(y) log10(1 + |y| / threshold))."""
        t = self.symlog_threshold
        return y if t is None else math.copysign(math.log10(1 + abs(y) / t), y)

    def _y_range(self) -> tuple[float, float]:
        if self.y_limits is not None:
            return self.y_limits
        values = [0.0] if any(s.kind == "bars" for s in self.series) else []
        for s in self.series:
            values += [v for v in s.values if math.isfinite(v)]
            for extra in (s.low, s.high):
                values += [v for v in (extra or []) if math.isfinite(v)]
        values += [y for y, _, _ in self.hlines if math.isfinite(y)]
        if not values:
            return 0.0, 1.0
        lo, hi = min(values), max(values)
        if hi == lo:
            lo, hi = lo - 1.0, hi + 1.0
        return lo, hi

    def _y_ticks(self, lo: float, hi: float) -> list[float]:
        t = self.symlog_threshold
        if t is None:
            return nice_ticks(lo, hi)
        ticks = [0.0]
        v = t
        while v <= max(abs(lo), abs(hi)) * 10:
            if v <= hi * 1.0001:
                ticks.append(v)
            if -v >= lo * 1.0001:
                ticks.append(-v)
            v *= 10
        return sorted(ticks)

    def _x_range(self) -> tuple[float, float]:
        xs = [x for s in self.series if s.x for x in s.x if math.isfinite(x)]
        if not xs:
            return 0.0, 1.0
        lo, hi = min(xs), max(xs)
        return (lo, hi) if hi > lo else (lo - 1.0, hi + 1.0)

    # -- drawing ------------------------------------------------------------------------------

    def svg(self) -> str:
        cats = self.categories or []
        longest = max((len(c) for c in cats), default=0)
        label_room = (min(longest, 28) * CHAR_W * 11 * (0.72 if self.rotate_labels else 0) + 22) if cats else 34
        first = cats[0] if cats else ""
        hanging = min(len(first), 28) * CHAR_W * 9 * 0.71 if self.rotate_labels else 0.0  # the first label
        left, right, top = max(74.0, hanging - self.width / max(len(cats), 1) / 2 + 8), 18.0, 34.0
        bottom = label_room + (18 if self.x_label else 4)
        pw, ph = self.width - left - right, self.height - top - bottom
        y_lo, y_hi = self._y_range()
        ticks = self._y_ticks(y_lo, y_hi)
        a_lo, a_hi = self._ty(min(ticks[0], y_lo)), self._ty(max(ticks[-1], y_hi))
        if a_hi == a_lo:
            a_hi = a_lo + 1.0
        if self.y_limits is None:  # a little air above the tallest bar (and below a negative one)
            pad = (a_hi - a_lo) * 0.04
            a_hi += pad if y_hi >= ticks[-1] else 0.0
            a_lo -= pad if y_lo < 0 and y_lo <= ticks[0] else 0.0

        def py(y: float) -> float:
            return top + ph * (1 - (self._ty(y) - a_lo) / (a_hi - a_lo))

        out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(self.width)}" height="{_num(self.height)}" '
               f'viewBox="0 0 {_num(self.width)} {_num(self.height)}" role="img" {FONT}>'),
               f"<title>{escape(self.title)}</title>",
               f'<rect x="0" y="0" width="{_num(self.width)}" height="{_num(self.height)}" fill="#ffffff"/>',
               f'<text x="{_num(self.width / 2)}" y="20" font-size="13" text-anchor="middle">{escape(self.title)}</text>']
        for t in ticks:  # grid and y tick labels
            y = py(t)
            out.append(f'<line x1="{_num(left)}" y1="{_num(y)}" x2="{_num(left + pw)}" y2="{_num(y)}" '
                       f'stroke="#e3e6eb" stroke-width="1"/>')
            out.append(f'<text x="{_num(left - 6)}" y="{_num(y + 4)}" font-size="10" text-anchor="end">'
                       f"{escape(tick_label(t))}</text>")
        if self.y_label:
            out.append(f'<text transform="translate(14 {_num(top + ph / 2)}) rotate(-90)" font-size="11" '
                       f'text-anchor="middle">{escape(self.y_label)}</text>')
        bottom_value = min(ticks[0], y_lo)  # where category labels hang
        out += self._draw_bars(cats, left, pw, py, py(bottom_value)) if cats else self._draw_numeric_x(left, top, pw, ph, py)
        for y, colour, _ in self.hlines:
            out.append(f'<line x1="{_num(left)}" y1="{_num(py(y))}" x2="{_num(left + pw)}" y2="{_num(py(y))}" '
                       f'stroke={quoteattr(colour)} stroke-width="1.2" stroke-dasharray="6 4"/>')
        out.append(f'<rect x="{_num(left)}" y="{_num(top)}" width="{_num(pw)}" height="{_num(ph)}" fill="none" '
                   f'stroke="#333333" stroke-width="0.8"/>')
        if self.x_label:
            out.append(f'<text x="{_num(left + pw / 2)}" y="{_num(self.height - 6)}" font-size="11" '
                       f'text-anchor="middle">{escape(self.x_label)}</text>')
        out += self._legend(left + pw, top)
        out.append("</svg>")
        return "\n".join(out)

    def _draw_bars(self, cats: list[str], left: float, pw: float, py, axis_y: float) -> list[str]:
        out = []
        bars = [s for s in self.series if s.kind == "bars"]
        slot = pw / max(len(cats), 1)
        width = slot * 0.8 / max(len(bars), 1)
        base = py(0.0)
        for k, s in enumerate(bars):
            for i, v in enumerate(s.values):
                if not math.isfinite(v):
                    continue
                x = left + slot * i + slot * 0.1 + width * k
                y = py(v)
                colour = s.colours[i] if s.colours else s.colour
                out.append(f'<rect x="{_num(x)}" y="{_num(min(y, base))}" width="{_num(width)}" '
                           f'height="{_num(abs(base - y))}" fill={quoteattr(colour)} stroke="#333333" '
                           f'stroke-width="0.3"><title>{escape(cats[i])}: {escape(f"{v:g}")}</title></rect>')
                lo = s.low[i] if s.low else math.nan
                hi = s.high[i] if s.high else math.nan
                if math.isfinite(lo) and math.isfinite(hi):
                    cx = x + width / 2
                    cap = min(width * 0.3, 4.0)
                    out.append(f'<path d="M{_num(cx)} {_num(py(lo))}V{_num(py(hi))}M{_num(cx - cap)} {_num(py(lo))}'
                               f'H{_num(cx + cap)}M{_num(cx - cap)} {_num(py(hi))}H{_num(cx + cap)}" '
                               f'stroke="#333333" stroke-width="1" fill="none"/>')
        for i, c in enumerate(cats):
            x = left + slot * (i + 0.5)
            text = c if len(c) <= 28 else c[:27] + "…"
            if self.rotate_labels:
                out.append(f'<text transform="translate({_num(x)} {_num(axis_y + 10)}) rotate(-45)" font-size="9" '
                           f'text-anchor="end">{escape(text)}</text>')
            else:
                out.append(f'<text x="{_num(x)}" y="{_num(axis_y + 14)}" font-size="9" text-anchor="middle">'
                           f"{escape(text)}</text>")
        return out

    def _draw_numeric_x(self, left: float, top: float, pw: float, ph: float, py) -> list[str]:
        out = []
        x_lo, x_hi = self._x_range()

        def px(x: float) -> float:
            return left + pw * (x - x_lo) / (x_hi - x_lo)

        for t in nice_ticks(x_lo, x_hi):
            if x_lo - 1e-9 <= t <= x_hi + 1e-9:
                out.append(f'<text x="{_num(px(t))}" y="{_num(top + ph + 14)}" font-size="10" text-anchor="middle">'
                           f"{escape(tick_label(t))}</text>")
        for s in self.series:
            pts = [(px(x), py(y)) for x, y in zip(s.x or [], s.values) if math.isfinite(x) and math.isfinite(y)]
            if s.kind == "line" and len(pts) > 1:
                d = "M" + "L".join(f"{_num(x)} {_num(y)}" for x, y in pts)
                out.append(f'<path d="{d}" stroke={quoteattr(s.colour)} stroke-width="1.6" fill="none"/>')
            elif s.kind == "points":
                out += [f'<circle cx="{_num(x)}" cy="{_num(y)}" r="4" fill={quoteattr(s.colour)}/>' for x, y in pts]
        return out

    def _legend(self, right_edge: float, top: float) -> list[str]:
        entries = [(s.colour, s.label, s.kind) for s in self.series if s.label]
        entries += [(colour, label, "hline") for _, colour, label in self.hlines if label]
        if not entries:
            return []
        width = max(len(label) for _, label, _ in entries) * CHAR_W * 10 + 34
        x0, y0 = right_edge - width - 6, top + 6
        out = [(f'<rect x="{_num(x0)}" y="{_num(y0)}" width="{_num(width)}" height="{_num(16 * len(entries) + 6)}" '
               f'fill="#ffffff" fill-opacity="0.85" stroke="#cccccc" stroke-width="0.6"/>')]
        for i, (colour, label, kind) in enumerate(entries):
            y = y0 + 14 + 16 * i
            if kind == "bars":
                out.append(f'<rect x="{_num(x0 + 6)}" y="{_num(y - 8)}" width="14" height="9" fill={quoteattr(colour)}/>')
            elif kind == "points":
                out.append(f'<circle cx="{_num(x0 + 13)}" cy="{_num(y - 4)}" r="4" fill={quoteattr(colour)}/>')
            else:
                dash = ' stroke-dasharray="4 3"' if kind == "hline" else ""
                out.append(f'<line x1="{_num(x0 + 5)}" y1="{_num(y - 4)}" x2="{_num(x0 + 21)}" y2="{_num(y - 4)}" '
                           f'stroke={quoteattr(colour)} stroke-width="1.6"{dash}/>')
            out.append(f'<text x="{_num(x0 + 26)}" y="{_num(y)}" font-size="10">{escape(label)}</text>')
        return out
