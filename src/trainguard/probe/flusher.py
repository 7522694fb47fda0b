"""The probe's background thread: resolves device copies into rows and commits them a few times a second.

Every FLUSH_INTERVAL it drains the finished device copies (probe/steps.py), takes a memory sample when no
step brought one (both deferred while a CUDA graph capture is open: probe/capturegate.py), commits the store (so a SIGKILL loses at most that fraction of a second), notes store
trouble in guard.log, and gives the standalone ending its turn (probe/alone.py: rules and status.json
when no watchdog owns them). It never dies of an error: a dead flusher would silently stop recording.
"""

from __future__ import annotations

import threading
from typing import Any

from trainguard.probe.capturegate import GATE
from trainguard.probe.pacing import begin_pass, breathe, pass_elapsed, resting
from trainguard.probe.steps import StepRecorder

# Seconds between commits: bounds what a SIGKILL can lose. Every wake of this thread has a fixed cost
# beside its rows (taking the interpreter lock back from the training thread, cold caches, a commit): at
# 0.2 s it was a third of the thread's CPU in a CPU-bound loop (issue 21); the watchdog looks every 0.5 s.
FLUSH_INTERVAL = 0.5
MIN_WAIT = 0.05  # seconds between the end of a pass and the next, however long the pass took


class Flusher:
    def __init__(self, steps: StepRecorder, ending: Any) -> None:
        self.steps = steps
        self.ending = ending
        self.stopping = threading.Event()  # the run is ending: the loop ends, paced work stops pausing
        steps.ending = self.stopping
        self._thread = threading.Thread(target=self._loop, name="trainguard-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Ends the loop (and waits up to `timeout` for its pass in progress); `None`: does not wait."""
        self.stopping.set()
        if timeout is not None:
            self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        s, w, stop = self.steps, self.steps._writer, self.stopping

        def pause() -> None:
            breathe(stop)

        wait = FLUSH_INTERVAL
        while not stop.wait(wait):
            # One pass, paced (probe/pacing.py): a pause may come between its parts and inside the long
            # ones, so no stretch of it holds the interpreter lock from the training thread for long.
            # The next pass begins FLUSH_INTERVAL after this one began (the pauses do not stretch the
            # commit interval, what a SIGKILL can lose), at least MIN_WAIT after this one ends.
            try:
                begin_pass()
                s.start_flight_answers()  # (before the drain, which a wedged GPU can hold)
                s.drain()
                pause()
                s.memory.background(s.step_count)
                w.flush(pause=pause)
                pause()
                self._log_store_trouble()
                self.ending.tick()
                resting()
            except Exception as exc:
                # Why not let it die: a dead flusher would silently stop recording the run.
                s.fail("background flush", exc)
            wait = max(MIN_WAIT, FLUSH_INTERVAL - pass_elapsed())

    def _log_store_trouble(self) -> None:
        w, log = self.steps._writer, self.steps._selflog
        if w.last_error and w.failed_flushes in (1, 10, 100, 1000):
            log.write(f"store not written ({w.failed_flushes} tries, rows kept for the next): {w.last_error}")
        for line in GATE.errors:
            log.once(line, line)
        if w.refused:
            log.once("store refused rows", f"store refused a row, dropped ({w.refused} so far; later "
                     f"ones only counted): {w.first_refusal}")
