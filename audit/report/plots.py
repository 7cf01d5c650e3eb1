"""Chart geometry for inline SVG: speedups with CI whiskers, TFLOP/s per backend and shape.

Only numbers and plain strings are computed here; the template draws them, so every label goes
through Jinja's autoescape (labels come from evidence: backend and shape names are untrusted).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

PALETTE = 8  # CSS classes c0..c7 colour the series
ROW_H = 22
LABEL_W = 330
PLOT_W = 420
PAD_TOP = 28
PAD_BOTTOM = 34


@dataclass
class Bar:
    label: str  # row label (left of the bar)
    text: str  # value as printed at the bar's end
    x: float
    y: float
    w: float
    h: float
    css: str = "c0"
    # CI whisker (absent when the evidence has no interval)
    lo_x: float | None = None
    hi_x: float | None = None
    title: str = ""  # tooltip (SVG <title>)


@dataclass
class Tick:
    x: float
    label: str


@dataclass
class Chart:
    id: str
    title: str
    caption: str
    width: float
    height: float
    plot_x: float  # where the value axis starts
    plot_w: float
    axis_y: float  # y of the value axis line
    bars: list[Bar] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    ref_x: float | None = None  # a reference line (speedup 1.0)
    ref_label: str = ""
    group_labels: list[Tick] = field(default_factory=list)  # (y in .x, text) group headings
    legend: list[tuple[str, str]] = field(default_factory=list)  # (css, text)
    unit: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def nice_max(v: float) -> float:
    """A round axis maximum >= v (1, 2, 2.5, 5 x 10^k)."""
    if not (v > 0 and math.isfinite(v)):
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def _ticks(vmax: float, plot_x: float, plot_w: float, n: int = 5) -> list[Tick]:
    out = []
    for i in range(n + 1):
        v = vmax * i / n
        label = f"{v:.0f}" if vmax >= 10 else f"{v:.2g}" if vmax < 1 else f"{v:.1f}"
        out.append(Tick(plot_x + plot_w * i / n, label))
    return out


def speedup_chart(rows: list[dict]) -> Chart | None:
    """rows: {label, ratio, lo, hi}; ratio > 1 means the first backend is faster."""
    rows = [r for r in rows if isinstance(r.get("ratio"), (int, float)) and math.isfinite(r["ratio"])
            and r["ratio"] > 0]
    if not rows:
        return None
    vmax = nice_max(max(max(r["ratio"], r.get("hi") or 0) for r in rows) * 1.05)
    scale = PLOT_W / vmax
    height = PAD_TOP + ROW_H * len(rows) + PAD_BOTTOM
    chart = Chart("speedups", "Speedups (ratio of medians, 95% bootstrap CI)",
                  "Bars: the named backend's median time divided by ours, so above 1.0 ours is "
                  "faster and below 1.0 the named backend is; whiskers: 95% CI. The line marks "
                  "1.0 (level).",
                  LABEL_W + PLOT_W + 70, height, LABEL_W, PLOT_W, PAD_TOP + ROW_H * len(rows),
                  ticks=_ticks(vmax, LABEL_W, PLOT_W), ref_x=LABEL_W + scale * 1.0, ref_label="1.0",
                  unit="x")
    for i, r in enumerate(rows):
        y = PAD_TOP + ROW_H * i + 3
        lo, hi = r.get("lo"), r.get("hi")
        has_ci = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (lo, hi))
        ci_text = f" [{lo:.2f}, {hi:.2f}]" if has_ci else ""
        chart.bars.append(Bar(
            label=str(r["label"]), text=f"{r['ratio']:.2f}x", x=LABEL_W, y=y, w=max(1.0, scale * r["ratio"]),
            h=ROW_H - 6, css=f"c{r.get('series', 0) % PALETTE}",
            lo_x=LABEL_W + scale * lo if has_ci else None, hi_x=LABEL_W + scale * hi if has_ci else None,
            title=f"{r['label']}: {r['ratio']:.3f}x{ci_text}"))
    return chart


def grouped_chart(groups: list[tuple[str, list[tuple[str, float, bool]]]], chart_id: str, title: str,
                  caption: str, unit: str) -> Chart | None:
    """groups: [(group label, [(series name, value, vendor?)])]: one bar per series in each group."""
    groups = [(g, [(n, v, vend) for n, v, vend in items if isinstance(v, (int, float)) and math.isfinite(v)
                   and v >= 0]) for g, items in groups]
    groups = [(g, items) for g, items in groups if items]
    if not groups:
        return None
    series: list[str] = []
    for _, items in groups:
        for n, _, _ in items:
            if n not in series:
                series.append(n)
    vmax = nice_max(max(v for _, items in groups for _, v, _ in items) * 1.05)
    scale = PLOT_W / vmax
    rows = sum(len(items) + 1 for _, items in groups)
    height = PAD_TOP + ROW_H * rows + PAD_BOTTOM + 6
    chart = Chart(chart_id, title, caption, LABEL_W + PLOT_W + 90, height, LABEL_W, PLOT_W,
                  PAD_TOP + ROW_H * rows, ticks=_ticks(vmax, LABEL_W, PLOT_W), unit=unit)
    y = PAD_TOP
    for g, items in groups:
        chart.group_labels.append(Tick(y + ROW_H - 7, g))
        y += ROW_H
        for n, v, vendor in items:
            css = f"c{series.index(n) % PALETTE}" + (" vendor" if vendor else "")
            chart.bars.append(Bar(label=n + (" (vendor)" if vendor else ""), text=f"{v:.3g} {unit}",
                                  x=LABEL_W, y=y + 3, w=max(1.0, scale * v), h=ROW_H - 6, css=css,
                                  title=f"{g} / {n}: {v:.4g} {unit}"))
            y += ROW_H
    return chart
