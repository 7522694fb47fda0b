"""The live one-line status on a terminal: step, loss, LR, it/s, ETA, health.

Only when stderr is a terminal; the line is cleared before any output of the command is echoed, and
redrawn at the next poll, so it never tears the command's own lines.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any


class StatusLine:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._shown = False
        self._rate_from: tuple[float, int] | None = None

    def clear(self) -> None:
        if self.enabled and self._shown:
            try:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            self._shown = False

    def show(self, state: Any, options: Any, timeout: float, findings: list, run_dir: Any = None) -> None:
        if not self.enabled:
            return
        acked: Any = ()
        if findings and run_dir is not None:  # `trainguard ack` while it runs: not an open error on the line
            from trainguard.store.acks import read_acks

            acked = read_acks(run_dir)
        text = render(state, timeout, findings, self._rate(state), acked)
        try:
            sys.stderr.write("\r\x1b[K" + text[:200])
            sys.stderr.flush()
            self._shown = True
        except (OSError, ValueError):
            self.enabled = False

    def _rate(self, state: Any) -> float | None:
        if state.step is None:
            return None
        now = time.time()
        if self._rate_from is None:
            self._rate_from = (now, state.step)
            return None
        t0, s0 = self._rate_from
        if now - t0 < 1.0 or state.step <= s0:
            return None
        return (state.step - s0) / (now - t0)


def render(state: Any, timeout: float, findings: list, rate: float | None, acked: Any = ()) -> str:
    """The live line; `acked`: the codes acknowledged, counted apart from the open errors and warnings."""
    last = state.reader.last_step() if state.reader is not None else None
    total = (state.reader.meta().get("plan") or {}).get("total_steps") if state.reader is not None else None
    # what the command printed (watchdog/liveoutput.py) stands in for what the probe did not measure
    printed = state.scratch.get("output") or {} if hasattr(state, "scratch") else {}
    step = state.step if state.step is not None else printed.get("step")
    loss = last.get("loss") if last and last.get("loss") is not None else printed.get("loss")
    lr = last.get("lr") if last and last.get("lr") is not None else printed.get("lr")
    parts = ["[trainguard]"]
    if step is not None:
        parts.append(f"step {step}" + (f"/{total}" if total else ""))
    if loss is not None:
        parts.append(f"loss {_fmt(loss)}")
    if lr is not None:
        parts.append(f"lr {lr:.2e}" if isinstance(lr, float) else f"lr {lr}")
    if rate:
        parts.append(f"{rate:.1f} it/s")
        if total and step is not None:
            parts.append(f"ETA {_eta((total - step) / rate)}")
    if state.phase:
        parts.append(f"[{state.phase}]")
    errors = sum(1 for f in findings if f.severity == "error" and f.code not in acked)
    warns = sum(1 for f in findings if f.severity == "warning" and f.code not in acked)
    n_acked = sum(1 for f in findings if f.code in acked)
    parts.append(("healthy" if not (errors or warns) else f"{errors} error(s) {warns} warning(s)")
                 + (f" ({n_acked} acknowledged)" if n_acked else ""))
    return "  ".join(parts)


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
