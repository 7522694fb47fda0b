"""The TensorBoard sink: event files TensorBoard (and anything that reads them) opens as a run.

Scalars keep the store's names (`loss`, `lr`, `grad_norm`, `loss/kd`, `eval/loss`...) under `trainguard/`;
each finding is a text summary `trainguard/findings` at its step (so it lines up with the curves), and the
final state a text summary `trainguard/state`. Written with TensorBoard's own event file writer and
protos, so neither torch nor TensorFlow is loaded for it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

PREFIX = "trainguard/"


class TensorBoardSink:
    def __init__(self, logdir: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir = logdir
        logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(logdir), filename_suffix=".trainguard")
        self._last_step = 0

    def _add(self, summary: Any, step: int, t: float | None = None) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self._writer.add_event(Event(wall_time=t or time.time(), step=step, summary=summary))

    def scalars(self, step: int, values: dict[str, float], t: float) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=PREFIX + k, simple_value=v) for k, v in values.items()])
        self._add(summary, step, t)
        self._last_step = max(self._last_step, step)

    def finding(self, finding: dict[str, Any]) -> None:
        from tensorboard.plugins.text.summary_v2 import text_pb

        step = finding.get("step")
        self._add(text_pb(PREFIX + "findings", markdown(finding)), step if step is not None else self._last_step,
                  finding.get("t"))
        self._writer.flush()  # a finding is worth seeing now, not at the next buffer flush

    def flush(self) -> None:
        self._writer.flush()

    def close(self, status: dict[str, Any]) -> None:
        from tensorboard.plugins.text.summary_v2 import text_pb

        state = status.get("state", "unknown")
        names = ", ".join(f"{f.get('code')} {f.get('name')}" for f in status.get("findings") or []) or "no findings"
        step = status.get("step")
        if step is None:
            step = self._last_step
        self._add(text_pb(PREFIX + "state", f"**{state}** at step {step}: {names}"), step)
        self._writer.close()


def markdown(finding: dict[str, Any]) -> str:
    """One finding as the short Markdown TensorBoard's text tab renders."""
    at = f" at step {finding['step']}" if finding.get("step") is not None else ""
    lines = [f"**{finding.get('code')} {finding.get('name')}** [{finding.get('severity')}]{at}: {finding.get('summary')}"]
    if isinstance(finding.get("acked"), dict):
        lines.append(f"acknowledged by {finding['acked'].get('by')}: {finding['acked'].get('why') or ''}")
    if finding.get("where"):
        lines.append(f"where: `{finding['where']}`")
    for key, value in list((finding.get("evidence") or {}).items())[:8]:
        lines.append(f"- {key}: `{value}`")
    if finding.get("fix"):
        lines.append(f"fix: {finding['fix']}")
    return "\n\n".join(lines)


def open_sink(run_dir: Path, value: str | None) -> TensorBoardSink:
    # A log dir given by the user holds many runs: this one goes into its own sub-folder, named as the run.
    logdir = Path(value) / run_dir.name if value else run_dir / "tensorboard"
    return TensorBoardSink(logdir)
