"""The Prometheus sink: the run's state, progress and findings as Prometheus metrics.

By default a textfile (`RUN/metrics.prom`, for node_exporter's textfile collector: point it at the
file or copy it there), rewritten atomically after each pass over the store (every 2 s); `prometheus=/path/file.prom` picks the
file, `prometheus=:9464` serves the same metrics over HTTP on 127.0.0.1 (this machine only) instead, for as
long as `trainguard run` lives; `prometheus=0.0.0.0:9464` (or any `HOST:PORT`) serves them on that address.

    trainguard_run_state{run="...",state="running"} 1        one series, the current state
    trainguard_step{run="..."} 1234
    trainguard_loss{run="..."} 2.31                             also lr, grad_norm
    trainguard_finding{run="...",code="TG101",name="lr-reaches-zero",severity="error",step="8"} 1
    trainguard_findings{run="...",severity="error"} 1
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GAUGED = ("loss", "lr", "grad_norm")


class PrometheusSink:
    def __init__(self, run_dir: Path, textfile: Path | None, address: tuple[str, int] | None) -> None:
        from prometheus_client import CollectorRegistry, Gauge

        self.run = run_dir.name
        self.textfile = textfile
        self.registry = CollectorRegistry()
        self.state = Gauge("trainguard_run_state", "The run's state (1 for the current one).", ["run", "state"],
                           registry=self.registry)
        self.step = Gauge("trainguard_step", "The last optimizer step recorded.", ["run"], registry=self.registry)
        self.values = {name: Gauge(f"trainguard_{name}", f"The last step's {name}.", ["run"], registry=self.registry)
                       for name in GAUGED}
        self.finding_series = Gauge("trainguard_finding", "One series per finding (1; 0 once acknowledged by `trainguard ack`).",
                                    ["run", "code", "name", "severity", "step"], registry=self.registry)
        self.counts = Gauge("trainguard_findings", "Findings so far, by severity.", ["run", "severity"],
                            registry=self.registry)
        for severity in ("error", "warning", "info"):
            self.counts.labels(self.run, severity).set(0)
        self._set_state("running")
        self.server = None
        if address is not None:
            from prometheus_client import start_http_server

            self.server, _ = start_http_server(address[1], addr=address[0], registry=self.registry)
        self._write()

    def _set_state(self, state: str) -> None:
        self.state.clear()
        self.state.labels(self.run, state).set(1)

    def scalars(self, step: int, values: dict[str, float], t: float) -> None:
        if any(k.startswith("eval/") for k in values):
            return
        self.step.labels(self.run).set(step)
        for name, gauge in self.values.items():
            if name in values:
                gauge.labels(self.run).set(values[name])

    def flush(self) -> None:
        self._write()  # once per pass over the store, not once per step

    def finding(self, finding: dict[str, Any]) -> None:
        step = finding.get("step")
        self.finding_series.labels(self.run, str(finding.get("code")), str(finding.get("name")),
                                   str(finding.get("severity")), "" if step is None else str(step)
                                   ).set(0 if finding.get("acked") else 1)  # 0: acknowledged (`trainguard ack`)
        if not finding.get("acked"):
            self.counts.labels(self.run, str(finding.get("severity"))).inc()

    def close(self, status: dict[str, Any]) -> None:
        self._set_state(status.get("state", "unknown"))
        self._write()
        # An HTTP endpoint keeps serving the final state until `trainguard run` exits (its thread is a daemon).

    def _write(self) -> None:
        if self.textfile is not None:
            from prometheus_client import write_to_textfile

            write_to_textfile(str(self.textfile), self.registry)  # atomic: a temporary file renamed


def open_sink(run_dir: Path, value: str | None) -> PrometheusSink:
    if value and not value.endswith(".prom") and ":" in value:
        host, _, port = value.rpartition(":")
        # `:PORT` serves this machine only: a run's metrics name its command, paths and findings, which are
        # not for the whole network unless the user names an address (`0.0.0.0:PORT`, a host's own address)
        return PrometheusSink(run_dir, None, (host.strip("[]") or "127.0.0.1", int(port)))
    return PrometheusSink(run_dir, Path(value) if value else run_dir / "metrics.prom", None)
