"""The notifier: a sink (sinks/__init__.py's surface) that tells a person, by webhook, chat, e-mail or a
command, when a run needs one.

    trainguard run --notify https://hooks.slack.com/services/... --notify mailto:me@lab.org -- python train.py
    TRAINGUARD_NOTIFY=exec:/usr/local/bin/page-me python train.py      # watch() alone, no watchdog

Sent for: a stall (TG509 run-stalled), a hang stopped (TG502), a crash with its first failing rank (TG501), a
kill (TG503), an expectation failed (TG504/TG505), each other error finding, and the run's end with its
true state (a healthy completed run's end only with --notify-end). Each code is sent once per run; at most
RATE_MAX messages per RATE_WINDOW seconds besides the end, which counts those held back. A finding
acknowledged (`trainguard ack`) before its message leaves is not sent.

It never blocks training, nor the watchdog: `finding` and `close` only queue; each target has its own
daemon thread (a hung webhook never delays the e-mail), each attempt is bounded (send.TIMEOUT), a failure
that may pass is retried with back-off (RETRIES), a target's first failure is written once to guard.log
(its URL masked), and `close` waits at most CLOSE_WAIT seconds for the queues to drain.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from trainguard.notify import message, send
from trainguard.notify.targets import Target, scrub
from trainguard.store.acks import read_acks

RATE_MAX = 6  # finding messages (to every target alike) in RATE_WINDOW seconds; more are counted in the end
RATE_WINDOW = 600.0
RETRIES = 3  # attempts of one message to one target
BACKOFF = 1.0  # seconds before the second attempt, doubled before each next
CLOSE_WAIT = 15.0  # seconds `close` waits for what is queued to leave
QUEUE_MAX = 100  # messages waiting per target; beyond, new ones are dropped (and logged once)


class Notifier:
    def __init__(self, run_dir: Path, targets: list[Target], *, notify_end: bool = False,
                 close_wait: float = CLOSE_WAIT, also: tuple[str, ...] = ()) -> None:
        """`also`: names of warnings a person must hear of (the watchdog's run-stalled: the run may be
        stuck); an error is always sent."""
        self.run_dir = Path(run_dir)
        self.also = also
        self.targets = list(targets)
        self.notify_end = notify_end
        self.close_wait = close_wait
        self._sent_codes: set[str] = set()
        self._times: list[float] = []
        self.held_back = 0
        self._logged: set[str] = set()
        self._lock = threading.Lock()
        self.failed: dict[str, str] = {}  # a target (masked) -> why a message to it was not delivered
        self._workers = [_Worker(self, t) for t in self.targets]  # last: their threads start at once

    # -- the sink's surface -------------------------------------------------------------------------------

    def scalars(self, step: int, values: dict[str, float], t: float) -> None:
        pass

    def flush(self) -> None:
        pass

    def finding(self, finding: dict[str, Any]) -> None:
        code = finding.get("code")
        if not code or finding.get("acked"):
            return
        if finding.get("severity") != "error" and finding.get("name") not in self.also:
            return
        with self._lock:
            if code in self._sent_codes:
                return  # once per code per run (a warning that became an error was sent as the warning)
            self._sent_codes.add(code)
            now = time.time()
            self._times = [t for t in self._times if now - t < RATE_WINDOW]
            if len(self._times) >= RATE_MAX:
                self.held_back += 1
                return
            self._times.append(now)
        self._queue(("finding", dict(finding)))

    def close(self, status: dict[str, Any]) -> None:
        """The end message (unless the run completed healthy and --notify-end was not given), then a
        bounded wait for everything queued to leave."""
        from trainguard.store.acks import mark_acked
        from trainguard.store.status import health_of

        status = dict(status)
        status["findings"] = mark_acked([f for f in status.get("findings") or [] if isinstance(f, dict)],
                                        read_acks(self.run_dir))
        status["health"] = health_of(status)  # (a probe's ending has none yet; an ack may have changed it)
        healthy = status.get("state") == "completed" and status.get("health") == "ok"
        if self.notify_end or not healthy:
            self._queue(("end", dict(status)))
        deadline = time.time() + self.close_wait
        for w in self._workers:
            w.stop()
        for w in self._workers:
            w.thread.join(max(0.0, deadline - time.time()))
        # one line per target: one already said to be failing is not said again as left behind, and one said
        # as left behind is not said again when its tries end later (its key is taken here, under the lock)
        with self._lock:
            late = [w.target.shown for w in self._workers
                    if w.thread.is_alive() and f"failed {w.target.shown}" not in self._logged]
            self._logged.update(f"failed {shown}" for shown in late)
        if late:
            self.log("late", f"still sending after {self.close_wait:.0f} s, left behind: {', '.join(late)}")

    # -- the workers' side ----------------------------------------------------------------------------------

    def _queue(self, item: tuple[str, dict[str, Any]]) -> None:
        for w in self._workers:
            w.put(item)

    def render(self, item: tuple[str, dict[str, Any]]) -> dict[str, Any] | None:
        """The message for a queued item, made when it leaves: an ack that came meanwhile still counts."""
        kind, data = item
        if kind == "end":
            return message.end_message(data, run_dir=self.run_dir, held_back=self.held_back)
        if data.get("code") in read_acks(self.run_dir):
            return None
        from trainguard.store.status import read_status

        try:
            state = str(read_status(self.run_dir).get("state") or "running")
        except Exception:  # a damaged status.json: the message goes without the state
            state = "unknown"
        return message.finding_message(data, run_dir=self.run_dir, state=state)

    def log(self, kind: str, text: str) -> None:
        """One line in guard.log per kind of failure: a receiver that is down is said once, not per message."""
        with self._lock:
            if kind in self._logged:
                return
            self._logged.add(kind)
        try:
            from trainguard.folderio import open_append

            with os.fdopen(open_append(self.run_dir / "guard.log"), "a") as fh:
                fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} notify {scrub(text, self.targets)}\n")
        except OSError:
            pass


_STOP: tuple[str, dict[str, Any]] = ("stop", {})


class _Worker:
    """One target's queue and thread: delivers in order, retries with back-off, never raises."""

    def __init__(self, owner: Notifier, target: Target) -> None:
        self.owner = owner
        self.target = target
        self.q: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(QUEUE_MAX)
        self.thread = threading.Thread(target=self._loop, name=f"trainguard-notify-{target.kind}", daemon=True)
        self._closing = threading.Event()
        self.thread.start()

    def put(self, item: tuple[str, dict[str, Any]]) -> None:
        try:
            self.q.put_nowait(item)
        except queue.Full:
            self.owner.log(f"full {self.target.shown}", f"{self.target.shown}: {QUEUE_MAX} messages waiting; "
                                                         "newer ones dropped")

    def stop(self) -> None:
        self._closing.set()
        try:
            self.q.put_nowait(_STOP)
        except queue.Full:
            pass  # the thread is stuck behind a full queue; the join's deadline leaves it behind

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is _STOP:
                return
            try:
                msg = self.owner.render(item)
                if msg is not None:
                    self._deliver(msg)
            except Exception as exc:
                # Why never raise: a notifier is a courtesy; the run and its verdict come first.
                self.owner.log(f"error {self.target.shown}", f"{self.target.shown}: {type(exc).__name__}: {exc}")

    def _failed(self, why: str) -> None:
        why = scrub(why, self.owner.targets)
        self.owner.failed.setdefault(self.target.shown, why)
        self.owner.log(f"failed {self.target.shown}", f"{self.target.shown}: {why}")

    def _deliver(self, msg: dict[str, Any]) -> None:
        delay = BACKOFF
        for attempt in range(1, RETRIES + 1):
            try:
                send.deliver(self.target, msg)
                return
            except send.Retry as exc:
                if attempt == RETRIES:
                    self._failed(f"not delivered after {RETRIES} attempts: {exc}")
                    return
            except Exception as exc:
                self._failed(f"not delivered: {exc}")
                return
            # at the end of the run, a wait that would outlast the close is not worth it: the next try now
            self._closing.wait(delay)
            delay *= 2
