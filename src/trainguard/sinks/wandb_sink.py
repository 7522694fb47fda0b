"""The Weights & Biases sink: a W&B run beside the trainguard run.

Scalars go to the run's history at their optimizer step; each finding is a W&B alert (error findings at
level ERROR, the rest WARN) and the list of findings is `trainguard/findings` in the run's summary; the
final state is `trainguard/state` in the summary and the run's exit code. W&B's own settings apply
(`WANDB_MODE=offline`, `WANDB_PROJECT`, `WANDB_ENTITY`, `WANDB_DIR`, else the run folder); the sink's
value, if given, is the project.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DEFAULT_PROJECT = "trainguard"
EXIT_CODES = {"completed": 0}  # any other final state is a failed W&B run


class WandbSink:
    def __init__(self, run_dir: Path, project: str | None) -> None:
        import wandb
        from wandb.sdk import AlertLevel

        self._levels = AlertLevel  # from wandb.sdk, where wandb's type stubs declare it
        if os.environ.get("WANDB_MODE", "").lower() not in ("offline", "dryrun", "disabled") and \
                not wandb.login(prompt=False, verify=False):
            # Never wandb's interactive login: it would read the terminal from the watchdog's thread.
            raise RuntimeError("no W&B credentials: run `wandb login`, set WANDB_API_KEY, or WANDB_MODE=offline")
        meta = _meta(run_dir)
        self.run = wandb.init(
            project=project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, name=run_dir.name,
            dir=os.environ.get("WANDB_DIR") or str(run_dir), config={"trainguard": {"run_dir": str(run_dir.resolve()), **meta}},
            # console and system stats off: the training process is not this one, and the terminal is the run's
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        self.findings: list[dict[str, Any]] = []
        self._last_step = -1

    def scalars(self, step: int, values: dict[str, float], t: float) -> None:
        # W&B wants steps that never go back (a restart from a checkpoint repeats some): those rows are left out.
        if step < self._last_step:
            return
        self._last_step = step
        self.run.log(values, step=step)

    def finding(self, finding: dict[str, Any]) -> None:
        if finding.get("acked"):  # acknowledged (`trainguard ack`): shown in the summary, never an alert
            self.findings = [f for f in self.findings if f.get("code") != finding.get("code")]
            self.findings.append({**{k: finding.get(k) for k in ("code", "name", "severity", "step", "summary")},
                                  "acked": finding["acked"]})
            self.run.summary["trainguard/findings"] = self.findings
            return
        level = self._levels.ERROR if finding.get("severity") == "error" else self._levels.WARN
        text = finding.get("summary") or ""
        if finding.get("fix"):
            text += f"\nfix: {finding['fix']}"
        self.run.alert(title=f"{finding.get('code')} {finding.get('name')}", text=text, level=level,
                       wait_duration=0)
        self.findings.append({k: finding.get(k) for k in ("code", "name", "severity", "step", "summary", "where",
                                                          "fix") if finding.get(k) is not None})
        self.run.summary["trainguard/findings"] = self.findings

    def flush(self) -> None:
        pass  # wandb batches and sends on its own

    def close(self, status: dict[str, Any]) -> None:
        state = status.get("state", "unknown")
        self.run.summary["trainguard/state"] = state
        self.run.summary["trainguard/findings"] = self.findings
        self.run.finish(exit_code=EXIT_CODES.get(state, 1))


def _meta(run_dir: Path) -> dict[str, Any]:
    from trainguard.store.reader import RunReader

    with RunReader(run_dir) as reader:
        meta = reader.meta()
    return {k: meta[k] for k in ("command", "plan") if k in meta}


def open_sink(run_dir: Path, value: str | None) -> WandbSink:
    return WandbSink(run_dir, value)
