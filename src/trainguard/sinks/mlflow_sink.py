"""The MLflow sink: an MLflow run in the experiment `trainguard` (or the one named by the sink's value
after `@`, e.g. `mlflow=file:./mlruns@my-experiment`).

Scalars are metrics at their optimizer step (batched); each finding is a tag
`trainguard.finding.<CODE>` (its name and summary) and the whole list the artifact
`trainguard/findings.json`; the final state is the tag `trainguard.state` and the run's status
(FINISHED for a completed run, KILLED for a hung or stopped one, FAILED otherwise).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

DEFAULT_EXPERIMENT = "trainguard"
DEFAULT_URI = "file:./mlruns"
STATUS = {"completed": "FINISHED", "hung": "KILLED", "killed": "KILLED", "cut-off": "KILLED"}
MAX_TAG = 5000  # MLflow's limit on a tag's value
BATCH = 1000  # metrics per log_batch call


class MlflowSink:
    def __init__(self, run_dir: Path, uri: str | None, experiment: str | None) -> None:
        uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps its file store behind this switch (it prefers a database, which needs SQLAlchemy,
            # more than the skinny client has); a file store is what the user asked for here.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        found = self.client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else self.client.create_experiment(name)
        run = self.client.create_run(experiment_id, run_name=run_dir.name,
                                     tags={"trainguard.run_dir": str(run_dir.resolve())})
        self.run_id = run.info.run_id
        self.findings: list[dict[str, Any]] = []
        self.pending: list[Any] = []

    def scalars(self, step: int, values: dict[str, float], t: float) -> None:
        from mlflow.entities import Metric

        stamp = int((t or time.time()) * 1000)
        self.pending.extend(Metric(k, v, stamp, step) for k, v in values.items())

    def flush(self) -> None:
        # one request per BATCH metrics (a tracking server's limit is 1000 a call), not one per step
        while self.pending:
            self.client.log_batch(self.run_id, metrics=self.pending[:BATCH])
            del self.pending[:BATCH]

    def finding(self, finding: dict[str, Any]) -> None:
        at = f" at step {finding['step']}" if finding.get("step") is not None else ""
        text = f"{finding.get('name')} [{finding.get('severity')}]{at}: {finding.get('summary')}"
        if isinstance(finding.get("acked"), dict):
            text = f"(acknowledged by {finding['acked'].get('by')}) {text}"
        self.client.set_tag(self.run_id, f"trainguard.finding.{finding.get('code')}", text[:MAX_TAG])
        self.findings.append(finding)

    def close(self, status: dict[str, Any]) -> None:
        self.flush()
        state = status.get("state", "unknown")
        self.client.set_tag(self.run_id, "trainguard.state", state)
        # a JSON list: log_dict serialises any JSON value, though its annotation names a dict
        self.client.log_dict(self.run_id, self.findings, "trainguard/findings.json")  # type: ignore[arg-type]
        self.client.set_terminated(self.run_id, status=STATUS.get(state, "FAILED"))


def open_sink(run_dir: Path, value: str | None) -> MlflowSink:
    uri, _, experiment = (value or "").partition("@")
    return MlflowSink(run_dir, uri or None, experiment or None)
