"""The feed: reads a run folder's new steps, evaluations and findings and hands them to the sinks.

`feed_once` copies a finished run in one pass (`trainguard export`); `LiveFeed` does the same every few
seconds in a thread while `trainguard run` watches, then a last pass with the final status.json.
The feed owns every sink's errors: a sink that raises is recorded once in guard.log and dropped, so a
dashboard that is down never changes a run's verdict.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from trainguard.sinks import Sink, SinkSpec, open_sink
from trainguard.store.acks import read_acks
from trainguard.store.printed import printed_rows
from trainguard.store.reader import RunReader
from trainguard.store.status import read_status

POLL_SECONDS = 2.0
CLOSE_WAIT_SECONDS = 60.0  # at the end, how long `trainguard run` waits for the sinks to finish writing
STEP_COLUMNS = ("loss", "lr", "grad_norm", "update_ratio", "step_time", "data_wait", "loss_scale", "nonfinite")


def step_scalars(row: dict[str, Any]) -> dict[str, float]:
    """A step row's numbers as flat scalar names (`loss`, `lr`, `loss/kd`, `weight/kd`...).

    Non-finite values are kept: a NaN loss is exactly what a dashboard must show.
    """
    out: dict[str, float] = {}
    for col in STEP_COLUMNS:
        value = row.get(col)
        if isinstance(value, (int, float)):
            out[col] = float(value)
    for prefix, parts in (("loss", row.get("parts")), ("weight", row.get("weights"))):
        for name, value in (parts or {}).items():
            if isinstance(value, (int, float)):
                out[f"{prefix}/{name}"] = float(value)
    return out


def eval_scalars(event: dict[str, Any]) -> dict[str, float]:
    data = event.get("data") or {}
    metrics = data.get("metrics", data) if isinstance(data, dict) else {}
    return {f"eval/{k}": float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


class Feed:
    """Reads what is new in a run folder since the last call and passes it on to the open sinks."""

    def __init__(self, run_dir: Path, specs: list[SinkSpec], extra: dict[str, Sink] | None = None) -> None:
        """`extra`: sinks already open, by name (the notifiers, which `--notify` opens, not `--sink`)."""
        self.run_dir = Path(run_dir)
        self.sinks: dict[str, Sink] = dict(extra or {})
        self._specs = list(specs)
        self._rowid = 0
        self._event_id = 0
        self._printed_rowid = 0
        self._probe_loss = False  # a probe row carried a loss: the printed one is never sent beside it
        self._findings_seen: set[tuple] = set()
        self._unacked: dict[str, dict[str, Any]] = {}  # code -> a finding sent before any ack of it
        self._reader: RunReader | None = None
        self.failed: dict[str, str] = {}  # sink name -> why it was switched off

    def _open(self) -> None:
        for spec in self._specs:
            self._guarded(spec.name, lambda spec=spec: self.sinks.__setitem__(spec.name, open_sink(spec, self.run_dir)))
        self._specs = []

    def poll(self) -> None:
        if self._specs:
            self._open()
        if not self.sinks:
            return
        if self._reader is None:
            self._reader = RunReader(self.run_dir)
        reader = self._reader
        for row in reader.steps(since_rowid=self._rowid):
            self._rowid = row["rowid"]
            if row.get("rank") not in (0, None):
                continue  # rank 0 speaks for the run; the store keeps every rank for the rules
            values = step_scalars(row)
            self._probe_loss = self._probe_loss or "loss" in values or any(k.startswith("loss/") for k in values)
            if values:
                self._each(lambda s, row=row, values=values: s.scalars(int(row["step"]), values, row["t"]))
        self._printed()
        for event in reader.events(since_id=self._event_id):
            self._event_id = event["id"]
            if event["kind"] == "eval" and event.get("step") is not None:
                values = eval_scalars(event)
                if values:
                    self._each(lambda s, e=event, v=values: s.scalars(int(e["step"]), v, e["t"]))
            elif event["kind"] == "finding" and isinstance(event.get("data"), dict):
                self._finding(event["data"])
        for finding in read_status(self.run_dir).get("findings") or []:
            self._finding(finding)  # findings only status.json holds (a watchdog that could not write the store)
        self._each(lambda s: s.flush())

    def _printed(self) -> None:
        """The metrics `trainguard run` read from the command's output (store/printed.py): only what no
        probe measured was kept there, and none of it is sent once a probe row carried a loss."""
        for row in printed_rows(self.run_dir, since_rowid=self._printed_rowid):
            self._printed_rowid = row["rowid"]
            if self._probe_loss:
                continue
            values = step_scalars(row)
            if values:
                self._each(lambda s, row=row, values=values: s.scalars(int(row["step"]), values, row["t"]))

    def close(self) -> None:
        """The last pass: what is left in the store, then each sink's final state."""
        self.poll()
        acks = read_acks(self.run_dir)  # acknowledged after it was sent: each sink shows it so, once
        for code in [c for c in self._unacked if c in acks]:
            data = {**self._unacked.pop(code), "acked": acks[code]}
            self._each(lambda s, data=data: s.finding(data))
        status = read_status(self.run_dir)
        self._each(lambda s: s.close(status))
        self.sinks.clear()
        if self._reader is not None:
            self._reader.close()

    def _finding(self, data: dict[str, Any]) -> None:
        key = (data.get("code"), data.get("name"), data.get("step"), data.get("cause"))
        if key in self._findings_seen or not data.get("code"):
            return
        self._findings_seen.add(key)
        ack = read_acks(self.run_dir).get(data["code"])  # acknowledged already: the sinks show it so
        if ack is not None:
            data = {**data, "acked": ack}
        else:
            self._unacked.setdefault(data["code"], data)
        self._each(lambda s: s.finding(data))

    def _each(self, call: Any) -> None:
        for name, sink in list(self.sinks.items()):
            if not self._guarded(name, lambda sink=sink: call(sink)):
                self.sinks.pop(name, None)

    def _guarded(self, name: str, call: Any) -> bool:
        try:
            call()
            return True
        except Exception as exc:
            # Why swallow: a sink is a copy for people's dashboards; the run and its verdict come first.
            _guard_log(self.run_dir, f"sink {name} failed and was switched off: {type(exc).__name__}: {exc}")
            self.failed.setdefault(name, f"{type(exc).__name__}: {exc}")
            return False


def feed_once(run_dir: Path, specs: list[SinkSpec]) -> list[str]:
    """Copies a run folder to the sinks in one pass; returns the names of the sinks that held to the end."""
    feed = Feed(run_dir, specs)
    feed.close()
    return [spec.name for spec in specs if spec.name not in feed.failed]


class LiveFeed:
    """A Feed polled from a daemon thread while a run lives; `stop()` makes the last pass, bounded."""

    def __init__(self, run_dir: Path, specs: list[SinkSpec], extra: dict[str, Sink] | None = None) -> None:
        self.feed = Feed(run_dir, specs, extra)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainguard-sinks", daemon=True)

    def start(self) -> LiveFeed:
        self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            while not self._stop.wait(POLL_SECONDS):
                self.feed.poll()
        except Exception as exc:
            _guard_log(self.feed.run_dir, f"sink feed failed: {type(exc).__name__}: {exc}")
        finally:
            try:
                self.feed.close()
            except Exception as exc:
                _guard_log(self.feed.run_dir, f"sink feed failed at the end: {type(exc).__name__}: {exc}")

    def stop(self, wait: float = CLOSE_WAIT_SECONDS) -> None:
        self._stop.set()
        self._thread.join(wait)
        if self._thread.is_alive():
            _guard_log(self.feed.run_dir, f"sinks still writing after {wait:.0f} s; left behind")


def _guard_log(run_dir: Path, text: str) -> None:
    try:
        from trainguard.folderio import open_append

        with os.fdopen(open_append(Path(run_dir) / "guard.log"), "a") as fh:
            fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} sinks {text}\n")
    except OSError:
        pass

