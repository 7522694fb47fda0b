"""Which plots a run gets, built from whatever it recorded: a plot with no data is left out.

Loss and every loss part (and the weights when they change), LR as observed against the planned end
and preflight's simulated schedule, gradient norm and update ratio, throughput, data-wait share, memory,
evaluation metrics, and any other scalar the script logged. Every plot carries the findings' steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trainguard.contract import EVENT_DEVICE
from trainguard.findings import Finding
from trainguard.report.load import Column, RunData
from trainguard.report.series import Series, downsample
from trainguard.report.svg import SEVERITY_COLORS, Mark, Plot

MEMORY_WORDS = ("mem", "rss", "vram", "allocated", "reserved")
MAX_DEVICE_MARKS = 20  # device events drawn on the plots (all of them are in the timeline)
ORDER = ("loss", "contributions", "weights", "lr", "grad", "throughput", "data_wait", "memory", "memory_samples",
         "eval", "logged")
# ser(name, column, values=None): a column's curve by step, downsampled (None when nothing was recorded)
SeriesOf = Callable[..., "Series | None"]


def finding_marks(findings: list[Finding]) -> list[Mark]:
    marks = []
    for f in findings:
        if f.step is None:
            continue
        marks.append(Mark(step=float(f.step), label=f.code, kind="finding",
                          title=f"{f.code} {f.name} [{f.severity}] at step {f.step}: {f.summary}",
                          color=SEVERITY_COLORS.get(f.severity, "#6c757d")))
    return marks


def device_marks(events: list[dict[str, Any]]) -> list[Mark]:
    """What the GPUs and the kernel said (devices/), at the step the run was at: beside the loss, a NaN that
    follows an Xid reads as the hardware's. Faults in red, the rest grey; the first MAX_DEVICE_MARKS."""
    marks = []
    for e in events:
        d = e.get("data") if isinstance(e.get("data"), dict) else None
        if e.get("kind") != EVENT_DEVICE or d is None or not isinstance(e.get("step"), int):
            continue
        rank = e.get("rank")
        who = f" (rank {rank})" if isinstance(rank, int) and rank >= 0 else ""
        label = f"Xid {d['xid']}" if d.get("xid") is not None else str(d.get("what") or "device")
        marks.append(Mark(step=float(e["step"]), label=label, kind="device",
                          title=f"device at step {e['step']}{who}: {d.get('text') or label}",
                          color="#d62728" if d.get("serious") else "#8c564b"))
        if len(marks) >= MAX_DEVICE_MARKS:
            break
    return marks


def build_plots(data: RunData) -> list[Plot]:
    steps = data.columns.get("step")
    marks = finding_marks(data.findings)
    plots: list[Plot | None] = []  # None: a plot with nothing to draw, dropped below

    def ser(name: str, col: Column | None, y: np.ndarray | None = None) -> Series | None:
        if steps is None or col is None or not col.any:
            return None
        return downsample(name, steps.values, col.values if y is None else y, col.present)

    if steps is not None:
        x = steps.values
        plots.append(_plot("loss", "Loss and its parts", "loss",
                           [ser("loss", data.col("loss"))] + [ser(f"part {k}", c) for k, c in data.parts.items()]))
        weighted = [k for k in data.parts if k in data.weights]
        if weighted:
            # what each part contributes to the total (weight x part): an imbalance shows as one curve on top
            plots.append(_plot("contributions", "Weighted loss parts (weight x part)", "contribution",
                               [ser(f"{k} x weight", data.parts[k], data.parts[k].values * data.weights[k].values)
                                for k in weighted]))
        changing = {k: c for k, c in data.weights.items() if np.nanmax(c.values) != np.nanmin(c.values)}
        if changing:
            plots.append(_plot("weights", "Loss-part weights", "weight",
                               [ser(f"weight {k}", c) for k, c in changing.items()]))
        plots.append(_plot("grad", "Gradient norm and update-to-weight ratio", "norm / ratio",
                           [ser("grad norm", data.col("grad_norm")), ser("update ratio", data.col("update_ratio"))],
                           log_y=True))
        plots.append(_throughput(data, ser))
        st, dw = data.col("step_time"), data.col("data_wait")
        # a data wait that is exactly 0 everywhere was not measured (the loop did not use guard.batches)
        if st is not None and dw is not None and np.any(dw.values[dw.present] != 0):
            share = np.where(st.values > 0, dw.values / np.where(st.values > 0, st.values, 1), np.nan)
            plots.append(_plot("data_wait", "Share of step time spent waiting for data", "fraction",
                               [downsample("data wait / step time", x, np.clip(share, 0, 1), st.present & dw.present)],
                               log_y=False))
        mem = {k: c for k, c in data.extra.items() if any(w in k.lower() for w in MEMORY_WORDS)}
        if mem:
            plots.append(_plot("memory", "Host and device memory", "bytes / MB as logged",
                               [ser(k, c) for k, c in mem.items()]))
        other = {k: c for k, c in data.extra.items() if k not in mem}
        if other:
            plots.append(_plot("logged", "Other logged values", "value", [ser(k, c) for k, c in other.items()]))
    plots.append(_lr_plot(data, ser))  # outside the steps: preflight's simulated curve may be all there is
    plots += _memory_events(data)
    plots += _eval_plots(data)
    drawn = [p for p in plots if p is not None and not p.empty]
    drawn.sort(key=lambda p: ORDER.index(p.key) if p.key in ORDER else len(ORDER))
    marks += device_marks(data.events)
    marks += [Mark(step=float(step), label=f"restart {attempt}", kind="restart", color="#1f77b4",
                   title=f"attempt {attempt} resumed here, from step {step}") for attempt, step in data.restarts]
    for p in drawn:
        p.marks = list(p.marks) + marks
    return drawn


def _plot(key: str, title: str, y_label: str, series: Sequence[Series | None], log_y: bool | None = None) -> Plot | None:
    kept = [s for s in series if s is not None and not s.empty]
    return Plot(key, title, kept, y_label=y_label, log_y=log_y) if kept else None


def _lr_plot(data: RunData, ser: SeriesOf) -> Plot | None:
    series = [ser("LR observed", data.col("lr"))]
    if data.schedule:
        simulated = downsample("LR simulated by preflight", np.array(data.schedule["steps"]),
                               np.array(data.schedule["lr"]))
        simulated.dashed = True
        series.append(simulated)
    plot = _plot("lr", "Learning rate: observed against the plan", "LR", series, log_y=False)
    total = (data.meta.get("plan") or {}).get("total_steps")
    if plot is not None and total:
        plot.marks.append(Mark(step=float(total), label="planned end", kind="plan",
                               title=f"planned end of the run: step {total}", color="#555"))
        lr = data.col("lr")
        if lr is not None and "step" in data.columns:
            last = int(np.nanmax(data.columns["step"].values))
            plot.note = f"planned {total} steps; the run recorded LR up to step {last}"
    return plot


def _throughput(data: RunData, ser: SeriesOf) -> Plot | None:
    st = data.col("step_time")
    if st is None:
        return None
    per_step, unit = samples_per_step(data.meta)
    rate = np.where(st.values > 0, per_step / np.where(st.values > 0, st.values, 1), np.nan)
    return _plot("throughput", f"Throughput ({unit})", unit, [ser(unit, st, rate)], log_y=False)


def samples_per_step(meta: dict) -> tuple[float, str]:
    """What one optimizer step processes, from the plan or config when the script said so."""
    for source in (meta.get("plan") or {}, meta.get("config") or {}):
        if not isinstance(source, dict):
            continue
        for key, unit in (("tokens_per_step", "tokens/s"), ("samples_per_step", "samples/s")):
            if isinstance(source.get(key), (int, float)) and source[key] > 0:
                return float(source[key]), unit
        bs = source.get("batch_size")
        if isinstance(bs, (int, float)) and bs > 0:
            accum = (meta.get("plan") or {}).get("grad_accum") or 1
            return float(bs) * float(accum), "samples/s"
    return 1.0, "steps/s"


def _memory_events(data: RunData) -> list[Plot | None]:
    """The probe's memory samples (events 'sample'/'memory': rss and dev_* in bytes), in MiB by step."""
    evs = [e for e in data.events if isinstance(e["data"], dict) and e["step"] is not None
           and ((e["kind"] == "sample" and e["name"] == "memory") or e["kind"] in ("memory", "resources"))]
    if not evs:
        return []
    fields: dict[str, list[tuple[float, float]]] = {}
    for e in evs:
        for k, v in e["data"].items():
            if k in ("device", "dev_free") or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue  # a device index and the driver's free bytes are not curves anyone reads
            fields.setdefault(k, []).append((float(e["step"]), float(v) / 2**20))
    series = [downsample(f"{k} (MiB)", np.array([p[0] for p in pts]), np.array([p[1] for p in pts]))
              for k, pts in fields.items()]
    for s in series:
        s.dashed = s.name.startswith("dev_total")
    return [_plot("memory_samples", "Host and device memory", "MiB", series)]


def _eval_plots(data: RunData) -> list[Plot | None]:
    evals = [e for e in data.events if e["kind"] == "eval" and isinstance(e["data"], dict)]
    metrics: dict[str, list[tuple[float, float]]] = {}
    for e in evals:
        for k, v in e["data"].items():
            if e["step"] is None:
                continue
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                metrics.setdefault(k, []).append((float(e["step"]), float(v)))
            elif isinstance(v, str) and v in ("nan", "inf", "-inf"):
                metrics.setdefault(k, []).append((float(e["step"]), float(v)))
    if not metrics:
        return []
    series = [downsample(f"eval {k}", np.array([p[0] for p in pts]), np.array([p[1] for p in pts]))
              for k, pts in metrics.items()]
    return [_plot("eval", "Evaluation metrics", "metric", series, log_y=False)]
