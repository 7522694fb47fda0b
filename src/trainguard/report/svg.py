"""Line charts as inline SVG, written by hand: no plotting library, no script, no font, no network.

Why by hand: the report must be one self-contained file that opens anywhere, render a million-step run
in seconds, and escape every name that comes from the run. A few hundred lines of SVG do all three and
keep `trainguard run`'s end-of-run report free of a plotting dependency.

Every text that reaches the SVG goes through `esc`. Hover titles (`<title>`) give exact numbers without
any script. Findings are vertical dashed lines at their step; NaN and inf values are red marks on the top
edge at their step (class `nan-marker` / `inf-marker`, with `data-step`), so no downsampling hides them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainguard.report.series import Series

WIDTH, HEIGHT = 900, 270
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 34, 40
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
Scale = Callable[[Any], Any]  # data value(s) -> pixel coordinate(s)
SEVERITY_COLORS = {"error": "#d62728", "warning": "#e6a100", "info": "#6c757d"}


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


@dataclass
class Mark:
    """A vertical line at a step: a finding, the planned end of the run, a restart."""

    step: float
    label: str
    title: str
    color: str = "#6c757d"
    kind: str = "finding"


@dataclass
class Plot:
    key: str
    title: str
    series: list[Series]
    y_label: str = ""
    log_y: bool | None = None  # None: log when the values are positive and span more than 2 decades
    marks: list[Mark] = field(default_factory=list)
    note: str = ""

    @property
    def empty(self) -> bool:
        return all(s.empty for s in self.series)


def render(plot: Plot) -> str:
    """The plot as one <svg> element."""
    xs = [s.x for s in plot.series] + [s.nan_x for s in plot.series] + [s.inf_x for s in plot.series]
    xs.append(np.array([m.step for m in plot.marks], dtype=float))
    allx = np.concatenate([a for a in xs if len(a)]) if any(len(a) for a in xs) else np.array([0.0, 1.0])
    x0, x1 = float(allx.min()), float(allx.max())
    if x1 <= x0:
        x0, x1 = x0 - 1, x1 + 1
    ys = [s.y for s in plot.series if len(s.y)]
    ally = np.concatenate(ys) if ys else np.array([0.0, 1.0])
    log_y = plot.log_y
    if log_y is None:
        pos = ally[ally > 0]
        log_y = bool(len(pos) == len(ally) and len(pos) and pos.max() / pos.min() > 100)
    if log_y:
        ally = ally[ally > 0]
        if not len(ally):
            ally = np.array([1e-3, 1.0])
        y0, y1 = math.log10(float(ally.min())), math.log10(float(ally.max()))
    else:
        y0, y1 = float(ally.min()), float(ally.max())
    if y1 <= y0 and y0 == 0 and not log_y:
        y0, y1 = 0.0, 1.0  # all zeros: show them on the floor, not mid-air
    elif y1 <= y0:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    else:
        pad = (y1 - y0) * 0.05
        y0, y1 = y0 - pad, y1 + pad

    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(v: np.ndarray | float) -> np.ndarray | float:
        return LEFT + (np.asarray(v, dtype=float) - x0) / (x1 - x0) * pw

    def sy(v: np.ndarray | float) -> np.ndarray | float:
        v = np.asarray(v, dtype=float)
        if log_y:
            v = np.log10(np.maximum(v, 1e-300))
        return TOP + ph - (v - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" data-plot="{esc(plot.key)}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" aria-label="{esc(plot.title)}">',
           f"<title>{esc(plot.title)}</title>",
           f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#ccc"/>']
    out += _y_axis(y0, y1, log_y, sy, pw)
    out += _x_axis(x0, x1, sx, ph)
    if plot.y_label:
        out.append(f'<text x="14" y="{TOP + ph / 2:.0f}" transform="rotate(-90 14 {TOP + ph / 2:.0f})" '
                   f'text-anchor="middle" class="axis-label">{esc(plot.y_label)}</text>')
    out.append(f'<text x="{LEFT + pw / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle" class="axis-label">step</text>')
    for i, s in enumerate(plot.series):
        color = COLORS[i % len(COLORS)]
        out += _curve(s, color, sx, sy, log_y)
    placed: list[float] = []  # label x positions so far: marks at (nearly) one step stack their labels
    for m in plot.marks:
        if not (x0 <= m.step <= x1):
            continue
        x = float(sx(m.step))
        # a label near the right edge goes on the left of its line, so it is not cut off
        anchor, tx = ("end", x - 3) if x > WIDTH - RIGHT - 8 * len(m.label) - 6 else ("start", x + 3)
        row = sum(1 for p in placed if abs(p - x) < 48)
        placed.append(x)
        ty = TOP + 11 + 12 * row
        out.append(f'<g class="mark {esc(m.kind)}" data-step="{step_text(m.step)}"><title>{esc(m.title)}</title>'
                   f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph}" stroke="{m.color}" '
                   f'stroke-width="1.5" stroke-dasharray="5,3"/>'
                   f'<text x="{tx:.1f}" y="{ty}" text-anchor="{anchor}" class="mark-label" fill="{m.color}">'
                   f"{esc(m.label)}</text></g>")
    out += _legend(plot.series)
    out.append("</svg>")
    return "".join(out)


def _curve(s: Series, color: str, sx: Scale, sy: Scale, log_y: bool) -> list[str]:
    out = []
    x, y = s.x, s.y
    if log_y:
        keep = y > 0
        x, y = x[keep], y[keep]
    if len(x):
        px, py = sx(x), sy(y)
        if s.step_like and len(x) > 1:
            # a schedule holds its value until the next point: draw horizontal then vertical
            px = np.repeat(px, 2)[1:]
            py = np.repeat(py, 2)[:-1]
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py))
        dash = ' stroke-dasharray="6,4"' if s.dashed else ""
        # downsampled: the min/max band drawn light (every spike still reaches its height), the mean on top
        band = ' stroke-opacity="0.35"' if s.mean_x is not None else ""
        out.append(f'<polyline class="curve" data-series="{esc(s.name)}" fill="none" stroke="{color}" '
                   f'stroke-width="1.4"{dash}{band} points="{pts}"><title>{esc(s.name)}</title></polyline>')
        if s.mean_x is not None and s.mean_y is not None:  # set together, by downsample
            mx, my = s.mean_x, s.mean_y
            if log_y:
                keep = my > 0
                mx, my = mx[keep], my[keep]
            mpts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(sx(mx), sy(my)))
            out.append(f'<polyline class="curve-mean" fill="none" stroke="{color}" stroke-width="1.6"{dash} '
                       f'points="{mpts}"><title>{esc(s.name)}: mean of each bucket of '
                       f'{max(1, s.n_source // max(1, len(mx)))} steps</title></polyline>')
        if len(x) == 1:
            out.append(f'<circle cx="{px[0]:.1f}" cy="{py[0]:.1f}" r="3" fill="{color}"/>')
        elif len(x) <= 40 and not s.step_like:
            for a, b, vx, vy in zip(px, py, x, y):
                out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{color}">'
                           f"<title>{esc(s.name)} = {vy:.5g} at step {step_text(vx)}</title></circle>")
    for kind, xs in (("nan", s.nan_x), ("inf", s.inf_x)):
        for v in xs:
            a = float(sx(v))
            out.append(f'<g class="{kind}-marker" data-step="{step_text(v)}" data-series="{esc(s.name)}">'
                       f"<title>{esc(s.name)} is {kind.upper()} at step {step_text(v)}</title>"
                       f'<path d="M{a - 4:.1f},{TOP - 9} L{a + 4:.1f},{TOP - 9} L{a:.1f},{TOP - 1} Z" fill="#d62728"/></g>')
    return out


def step_text(v: float) -> str:
    v = float(v)
    return str(int(v)) if v.is_integer() else f"{v:g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    span = hi - lo
    if span <= 0 or not math.isfinite(span):
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 12))
        v += step
    return ticks


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.1e}"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _y_axis(y0: float, y1: float, log_y: bool, sy: Scale, pw: int) -> list[str]:
    out = []
    if log_y:
        # decades inside what a float holds (a damaged store's 1e308 pads past it), at most about ten of them
        lo, hi = max(math.ceil(y0), -307), min(math.floor(y1), 307)
        every = max(1, math.ceil((hi - lo + 1) / 10))
        ticks = [float(e) for e in range(lo, hi + 1, every)] or [max(-307.0, min(307.0, y0))]
        values = [10 ** t for t in ticks]
    else:
        values = nice_ticks(y0, y1)
    for v in values:
        y = float(sy(v))
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{esc(fmt(v))}</text>')
    return out


def fmt_step(v: float) -> str:
    """Steps read as 250k and 1.5M rather than 2.5e+05."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def _x_axis(x0: float, x1: float, sx: Scale, ph: int) -> list[str]:
    out = []
    for v in nice_ticks(x0, x1, 8):
        if not float(v).is_integer():
            continue  # steps are whole numbers: a tick at step 2.5 would only confuse
        x = float(sx(v))
        anchor = "end" if x > WIDTH - RIGHT - 15 else "middle"
        out.append(f'<line x1="{x:.1f}" y1="{TOP + ph}" x2="{x:.1f}" y2="{TOP + ph + 4}" stroke="#999"/>'
                   f'<text x="{x:.1f}" y="{TOP + ph + 16}" text-anchor="{anchor}" class="tick">{esc(fmt_step(v))}</text>')
    return out


def _legend(series: list[Series]) -> list[str]:
    out = []
    x = LEFT
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        label = s.name if len(s.name) <= 40 else s.name[:39] + "…"
        dash = ' stroke-dasharray="6,4"' if s.dashed else ""
        out.append(f'<line x1="{x}" y1="14" x2="{x + 18}" y2="14" stroke="{color}" stroke-width="2"{dash}/>'
                   f'<text x="{x + 22}" y="18" class="legend">{esc(label)}</text>')
        x += 30 + 7 * len(label)
        if x > WIDTH - 120:
            break
    return out
