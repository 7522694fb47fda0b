"""The standalone ending: what the probe owns when no watchdog does (a script run with plain `python`).

Chosen once, when the guard starts. Under `trainguard run` (and on every rank but 0) the watchdog owns
status.json and runs the health rules, and the probe's ending is `Watched`, which does nothing. A script
running alone gets `Alone`: the probe keeps status.json current, runs the health rules off the training
thread, and at the end names the state from what it saw (store/ending.py): finished, crashed, or left
without `finish()`.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from trainguard.contract import ENV_RULES, EVENT_FINDING
from trainguard.probe.pacing import breathe, paced
from trainguard.store.ending import Ending, ending_status, live_status
from trainguard.store.status import reserve_space, write_status
from trainguard.untrusted import printable

if TYPE_CHECKING:
    from trainguard.probe.core import Probe

STATUS_INTERVAL = 1.0  # seconds: status.json is rewritten at most this often when what it says changed
# ... and when only the progress changed (step, loss, LR), at most this often: each rewrite (JSON, a temp
# file renamed over the old) was the background thread's longest stretch of a second's work
PROGRESS_INTERVAL = 5.0
# Seconds between runs of the health rules when no watchdog runs them (and rows came). A pass finds the
# rules' state cold: at 1 s that made each row cost ~1.5x what it costs in a pass over 2 s of rows; a NaN
# is still in status.json ~2-3 s after its step (tests/test_rules.py).
RULES_INTERVAL = 2.0


class Watched:
    """A watchdog owns the run's ending (or this is not rank 0): nothing to do here."""

    rules: ProbeRules | None = None

    def start(self, plan: dict[str, Any]) -> None:
        pass

    def tick(self) -> None:
        pass

    def finished(self) -> None:
        pass

    def crashed(self, crash: dict[str, Any], frames: list[dict[str, Any]]) -> None:
        pass

    def interrupted(self) -> None:
        pass

    def exited(self) -> None:
        pass


class Alone:
    """A script running alone: status.json and the health rules are the probe's."""

    def __init__(self, steps: Probe, *, environ: Any, t0: float, attempt: int) -> None:
        from trainguard.store.owner import owner_record

        self.steps = steps
        self.rules: ProbeRules | None = None
        self._rules_on = environ.get(ENV_RULES, "1") != "0"
        self._owner = owner_record(steps.pid)  # status.json names its writer, so readers can tell it is gone
        self._last_status = 0.0
        self._written: tuple[Any, ...] | None = None  # what the last status.json said that readers act on
        self._said_progress: tuple[Any, ...] | None = None  # ... and the progress it showed
        self._findings_seen = 0  # findings added since the start (status.json's list changed)
        # The findings status.json lists, as the store's reader would give them: read from the store once
        # (a resumed run folder may hold some already), then kept up to date by the rules pass that adds
        # them. Why not read them back at every status write: opening the store and parsing every finding,
        # once a second, held the interpreter lock long enough to stall the training thread.
        self._status_findings: dict[tuple, Any] | None = None
        # what `trainguard ls` shows beside the state, as a `trainguard run` status.json says it
        self._command, self._started = list(sys.argv), t0
        reserve_space(steps.run_dir)  # the last status.json is written even if the run fills the disk
        self.notifier = _notifier(steps, environ)
        if attempt == 0:
            self._record_command(t0)

    def _record_command(self, t0: float) -> None:
        import getpass
        import os
        import platform

        w = self.steps.writer
        w.set_meta("command", sys.argv)
        w.set_meta("cwd", os.getcwd())
        w.set_meta("started", t0)
        w.set_meta("host", platform.node())
        w.set_meta("user", _safe(getpass.getuser))

    def start(self, plan: dict[str, Any]) -> None:
        """The run's plan is known: the health rules start (before the hooks: they may queue an event)."""
        if self._rules_on:
            self.rules = ProbeRules(self.steps, plan, on_found=self._found)
        try:
            self._fields()  # reads the findings a resumed run folder holds now, not in the first status write
        except Exception as exc:
            self.steps.selflog.error("status.json", exc)

    def _found(self, f: Any) -> None:
        if self.notifier is not None:
            self.notifier.finding(f.to_dict())  # queued only: the notifier's own threads send it
        if self._status_findings is not None:
            self._status_findings[(f.code, f.name, f.step, f.cause)] = f
        self._findings_seen += 1

    def tick(self) -> None:
        """The background thread's pass: the rules every RULES_INTERVAL when rows came, status.json when
        it would say something new (a finding, the phase: within a second; the progress: every few)."""
        now = time.time()
        if self.rules is not None and now - self.rules.last > RULES_INTERVAL and self.rules.pending():
            self.rules.run()
        if now - self._last_status <= STATUS_INTERVAL:
            return
        s = self.steps
        news = (self._findings_seen, s.phases.current, s.total_steps)
        progress = (s.summary.get("step", s.step_count), s.summary.get("loss"), s.summary.get("lr"))
        if news == self._written and (progress == self._said_progress or now - self._last_status < PROGRESS_INTERVAL):
            return
        breathe(s.ending)  # (after the rules pass: the write is a stretch of its own)
        try:
            self._write(live_status("running", **self._fields()), final=False, pause=lambda: breathe(s.ending))
            self._written, self._said_progress = news, progress
        except Exception as exc:
            # Why not the guard's fail: status.json is a summary beside the store; a folder that refuses
            # it (replaced by a directory, full) must not switch the recording off.
            s.selflog.error("status.json", exc)

    def finished(self) -> None:
        if self.rules is not None and not self.steps.state.disabled:
            self.rules.run(final=True)
        self._write(ending_status(Ending(probe_used=True, probe_finished=True), **self._fields()))

    def crashed(self, crash: dict[str, Any], frames: list[dict[str, Any]]) -> None:
        """An uncaught exception (`crash`: the crash event's data): the run crashed, and says where."""
        from trainguard.rules.crash import crash_finding

        finding = crash_finding(
            exception=crash["exception"], message=crash["message"], frames=frames, step=self.steps.step_count,
            phase=crash["phase"], elapsed=crash["elapsed"], phases_seen=crash["phases_seen"],
        )
        self._write(ending_status(Ending(crashed=True, exit_code=1, probe_used=True),
                                  **self._fields(findings=[finding.to_dict()])))

    def interrupted(self) -> None:
        """A KeyboardInterrupt (Ctrl-C) ended the script: killed by SIGINT, as the watchdog says of it, not a
        guard left unfinished."""
        import signal

        from trainguard.rules.ending import killed_finding

        s = self.steps
        if self.rules is not None and not s.state.disabled:
            self.rules.run(final=True)
        fields = self._fields()
        found = killed_finding(signal.SIGINT, step=s.step_count, oom={})
        fields["findings"].append({**found.to_dict(), "source": "probe"})
        self._write(ending_status(Ending(signal="SIGINT", probe_used=True), **fields))

    def exited(self) -> None:
        """Interpreter exit: a script that neither finished nor crashed left early (probe-not-finished)."""
        s = self.steps
        if s.finished:
            return
        if self.rules is not None and not s.state.disabled:
            self.rules.run(final=True)
        if not s.crashed:
            from trainguard.rules.ending import probe_not_finished

            fields = self._fields()
            # at interpreter exit: a normal exit by definition (os._exit never gets here)
            unfinished = probe_not_finished(s.step_count, total_steps=s.total_steps)
            fields["findings"].append(unfinished.to_dict())
            self._write(ending_status(Ending(probe_used=True, finish_forgotten=unfinished.severity != "error"),
                                      **fields))

    def _fields(self, findings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        s = self.steps
        if findings is None:
            if self._status_findings is None:
                from trainguard.store.reader import RunReader

                with RunReader(s.run_dir) as reader:
                    self._status_findings = {(f.code, f.name, f.step, f.cause): f for f in reader.findings()}
            findings = [f.to_dict() for f in list(self._status_findings.values())]  # a snapshot: list() is atomic
        return {"step": s.summary.get("step", s.step_count), "total_steps": s.total_steps,
                "phase": s.phases.current, "loss": s.summary.get("loss"), "lr": s.summary.get("lr"),
                "pid": s.pid, "updated": time.time(), "watched_by": "probe", "owner": self._owner,
                "command": self._command, "started": self._started,
                "findings": findings}

    def _write(self, status: Any, final: bool = True, pause: Any = None) -> None:
        self._last_status = time.time()
        write_status(self.steps.run_dir, status, final=final, pause=pause)
        if final and self.notifier is not None:
            notifier, self.notifier = self.notifier, None
            for f in status.get("findings") or []:  # the ending's own (a crash, a kill): sent once, by code
                notifier.finding(f)
            notifier.close(status)  # bounded (notify/notifier.py's CLOSE_WAIT): this is the script's end


def _notifier(steps: Probe, environ: Any) -> Any:
    """$TRAINGUARD_NOTIFY for a script running alone: the probe tells a person itself (notify/). A bad
    value never stops the script: it is logged once and the run goes on without notifications."""
    from trainguard.contract import ENV_NOTIFY, ENV_NOTIFY_END

    if not environ.get(ENV_NOTIFY, "").strip():
        return None
    try:
        from trainguard.notify.notifier import Notifier
        from trainguard.notify.targets import parse_targets

        targets = parse_targets([], env=environ.get(ENV_NOTIFY, ""))
        return Notifier(steps.run_dir, targets, notify_end=environ.get(ENV_NOTIFY_END, "") == "1")
    except Exception as exc:
        steps.selflog.error("notify", exc)
        return None


class ProbeRules:
    """The health rules in the probe, fed in memory with what it queues for the store (rules/live.py)."""

    def __init__(self, steps: Probe, plan: dict[str, Any], on_found: Any = None) -> None:
        from trainguard.rules.live import InboxRules

        self.steps = steps
        self._on_found = on_found  # told of each new finding (status.json's list)
        self.inbox: Any = InboxRules(plan, source="probe")
        steps.writer.tap = self.inbox.take
        self._lock = threading.Lock()  # the background thread and an exit path may both run them
        self.last = 0.0
        self.cpu = 0.0  # CPU seconds the probe's thread spent in the health rules

    def pending(self) -> bool:
        """Rows or events came since the last pass (a pass over nothing is skipped)."""
        inbox = self.inbox
        return inbox is not None and bool(inbox.inbox)

    def run(self, final: bool = False) -> None:
        """The health rules over what was queued since the last time; new findings become events."""
        with self._lock:
            if self.inbox is not None:
                self._run_locked(final)

    def _run_locked(self, final: bool) -> None:
        s, w = self.steps, self.steps.writer
        self.last = time.time()
        cpu0 = time.thread_time()
        try:
            stop = s.ending
            found = self.inbox.poll(through=(lambda batch: paced(batch, stop=stop)) if not final else None)
            if final:
                found += self.inbox.end()
                # what the rules cost this process, for the overhead budget (CPU seconds, all passes)
                # (and how many queued items the rules never saw: their inbox is bounded)
                w.set_meta(f"rules_cpu.{s.rank}", {
                    "cpu_s": round(self.cpu + time.thread_time() - cpu0, 4), "steps": s.step_count,
                    "inbox_dropped": self.inbox.dropped})
        except Exception as exc:
            # Why switch them off: a rules pass that raised once will raise at every pass. The store's
            # tap goes too, or rows would pile up in an inbox nobody reads.
            self.inbox = None
            w.tap = None
            s.fail("health rules (switched off)", exc)
            return
        self.cpu += time.thread_time() - cpu0
        for f in found:
            w.add_event(EVENT_FINDING, f.name, f.to_dict(), step=f.step)
            if self._on_found is not None:
                self._on_found(f)
            try:
                print(f"trainguard: {printable(f.one_line())}", file=sys.stderr, flush=True)
            except (OSError, ValueError):
                pass
        if found:
            w.flush()


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None
