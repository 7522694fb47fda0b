"""The health rules on what the command prints, as it prints it: `trainguard run` on a script nobody changed.

    monitor = OutputRulesMonitor()      # one of the supervisor's monitors (see watchdog/supervisor.py)

Each poll reads what `output.log` gained since the last one (the tee writes it; reading the file keeps
this module out of the tee's way) and parses it with the very reader `trainguard diagnose` uses on a
saved log (`ingest.textlog`): tqdm bars, `iter N: loss X`, `step N | loss X | lr Y`, Hugging Face dict
lines, eval lines, PyTorch's own warnings. The events go to a rules engine of their own, restricted, as
diagnose's is, to the rules a log can feed.

No double counting with the probe. The probe's numbers are measured, the printed ones are rounded, late
and sometimes averaged, so where the probe measures a field the printed one is dropped:
- `trainguard.watch` in the script: its rows and evals are the run's; printed metrics are not fed;
- the automatic probe (the bootstrap's optimizer hooks, no change to the script): it measures LR,
  gradient norm and non-finite gradients but never sees the loss, so the printed loss, loss parts and
  evaluations are fed, the printed LR and gradient norm are not;
- no probe at all: everything printed is fed.
PyTorch's printed warnings (TG151) are reported in every case: no probe sees them.

The latest printed step, loss and LR go into `state.scratch["output"]` for the status line. What the
probe does not measure (the same split as above) is also kept in run.db's `printed` table
(store/printed.py), so the report, the sinks and `trainguard compare` have the loss of such a run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from trainguard.contract import ENV_OUTPUT_RULES
from trainguard.findings import Finding
from trainguard.ingest.events import Facts
from trainguard.ingest.textlog import _LineParser, iter_lines
from trainguard.rules.signatures import Sighting
from trainguard.store.printed import PrintedLog

MAX_READ = 1 << 20  # bytes read per poll (~0.2 s of parsing): a flood is caught up over several polls, never at once
PROBE_FIELDS = ("lr", "grad_norm", "nonfinite")  # what the automatic probe measures better than a print


class _Chunk:
    """The bytes one poll read, as the file-like object `iter_lines` reads from."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        return out


class OutputRulesMonitor:
    """Feeds the printed output of the command to the health rules (see the module docstring)."""

    def __init__(self) -> None:
        self.offset = 0
        self.partial = b""  # the unfinished last line of the previous read
        self.facts = Facts()
        self.parser = _LineParser(self.facts)
        self.lineno = 0
        self.engine: Any = None
        self.warned: set[str] = set()
        self.latest: dict[str, Any] = {}
        self.probe: str | None = None  # None (none seen yet) | "auto" | "watch"
        self.printed: PrintedLog | None = None

    def poll(self, state: Any) -> list[Finding]:
        events = self._read(Path(state.run_dir) / "output.log", state.now)
        # After reading: a line printed after the probe started is only read once the probe's start is
        # in the store (the probe flushes it before the script goes on), so the mode is never too late.
        self._probe_kind(state)
        state.scratch["output"] = dict(self.latest)
        found = self._warnings()
        feed = [e for e in (self._keep(e) for e in events) if e is not None]
        self._store(state, feed)
        if self.probe is None and feed and self.parser.step:
            # without the probe the watchdog's line count is this engine's (log-flood); with it, the
            # probe-fed rules count lines against the probe's steps
            feed.append({"kind": "output", "name": None, "step": self.parser.step, "t": state.now,
                         "data": {"lines": state.output_lines}})
        if feed:
            engine = self._engine()
            if engine is not None:
                found += [self._mark(f) for f in engine.feed_all(feed)]
        return found

    def finish(self, state: Any) -> list[Finding]:
        """After the process ended: the last lines it printed, then the rules' end-of-run checks."""
        found = self.poll(state)
        # a multi-line record still open (OLMo's `[step=N/M]` and its indented lines) ends with the process:
        # nothing more will be printed after it
        last = [e for e in (self._keep(e) for e in self.parser.close_block()) if e is not None]
        if last:
            for e in last:
                e["t"] = e.get("t") or state.now
            self._store(state, last)
            engine = self._engine()
            if engine is not None:
                found += [self._mark(f) for f in engine.feed_all(last)]
        if self.printed is not None:
            self.printed.close()
        if self.engine is not None and self.probe != "watch":
            found += [self._mark(f) for f in self.engine.end()]
        return found

    def _store(self, state: Any, feed: list[dict[str, Any]]) -> None:
        """Keeps the printed step metrics no probe measures (already filtered by `_keep`) in run.db."""
        steps = [e for e in feed if e.get("kind") == "step" and isinstance(e.get("step"), int)]
        if not steps:
            return
        if self.printed is None:
            self.printed = PrintedLog(state.run_dir)
        for row in steps:
            self.printed.add(row, attempt=getattr(state, "attempt", 0) or 0)
        self.printed.flush()

    # -- reading ----------------------------------------------------------------------------------

    def _read(self, path: Path, now: float) -> list[dict[str, Any]]:
        from trainguard.errors import UserError
        from trainguard.folderio import open_fd

        try:  # never through a link planted in its place, never a FIFO
            with os.fdopen(open_fd(path, "output.log"), "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(MAX_READ)
        except (OSError, UserError):
            return []
        if not data:
            return []
        self.offset += len(data)
        data = self.partial + data
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut < 0 and len(data) < MAX_READ:
            self.partial = data  # no line finished yet
            return []
        self.partial, data = (data[cut + 1:], data[:cut + 1]) if cut >= 0 else (b"", data)
        events: list[dict[str, Any]] = []
        for line in iter_lines(_Chunk(data), self.facts):
            self.lineno += 1
            for ev in self.parser.feed(self.lineno, line):
                if ev.get("t") is None:
                    ev["t"] = now  # read live: the time it was printed, to the poll
                events.append(ev)
                if ev.get("kind") == "step":
                    self.latest = {"step": ev["step"], "loss": ev.get("loss", self.latest.get("loss")),
                                   "lr": ev.get("lr") if ev.get("lr") is not None else self.latest.get("lr")}
        return events

    def _probe_kind(self, state: Any) -> None:
        if self.probe == "watch":
            return
        for e in state.reader.events("probe"):
            if e.get("name") == "start":
                self.probe = "auto" if (e.get("data") or {}).get("auto") else "watch"
                if self.probe == "watch":
                    return

    # -- what is fed ------------------------------------------------------------------------------

    def _keep(self, ev: dict[str, Any]) -> dict[str, Any] | None:
        if self.probe == "watch":
            return None  # the script's own guard measures all of it
        if ev.get("kind") != "step" or self.probe is None:
            return ev
        row = dict(ev)
        for key in PROBE_FIELDS:
            row[key] = None
        if row.get("loss") is None and not row.get("parts"):
            return None  # nothing left the probe does not say better
        return row

    def _engine(self) -> Any:
        if self.engine is None:
            from trainguard.ingest.diagnose import starved
            from trainguard.rules.engine import Engine

            plan = {"total_steps": self.parser.plan_total} if self.parser.plan_total else {}
            self.engine = Engine(plan, source="output")
            # the rules no printed line can ever feed are left out, as diagnose leaves them out of a log
            idle = starved(self.engine, plan)
            self.engine.rules = [r for r in self.engine.rules if r not in idle]
        return self.engine

    def _warnings(self) -> list[Finding]:
        from trainguard.ingest import signs

        found = []
        for lineno, name in self.facts.warnings:
            if name == signs.SCHEDULER_BEFORE_OPTIMIZER.name and name not in self.warned:
                self.warned.add(name)
                count = sum(1 for _, n in self.facts.warnings if n == name)
                found.append(self._mark(signs.scheduler_before_optimizer("output.log", lineno, count)))
        return found

    @staticmethod
    def _mark(f: Finding) -> Finding:
        f.evidence.setdefault("read_from", "the command's printed output (output.log)")
        if f.t is None:
            f.t = time.time()
        return f


TAIL = 1 << 20  # bytes of output.log read at the end for the failure it printed


def printed_failures(path: Path, tail: int = TAIL) -> list[Sighting]:
    """The failures the command printed without a traceback, the cause first (rules/signatures.py: a CUDA
    error from C++, `Killed`, a segfault, a scheduler's cancellation), read from the end of output.log with
    the reader `diagnose` uses; [] when there is none or the file cannot be read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - tail))
            data = fh.read(tail)
    except OSError:
        return []
    facts = Facts()
    parser = _LineParser(facts)
    for lineno, line in enumerate(iter_lines(_Chunk(data), facts), 1):
        parser.feed(lineno, line)
    # stdout and stderr reach output.log through two pipes: a row printed after the failure may land before it
    return facts.signs.outcome(facts.steps + facts.evals, traceback=facts.traceback is not None, rows_order=False,
                               completed=facts.completed is not None)


def output_rules_enabled() -> bool:
    """`TRAINGUARD_OUTPUT_RULES=0` turns the printed-output rules off (the probe-fed rules stay)."""
    return os.environ.get(ENV_OUTPUT_RULES, "1") != "0"
