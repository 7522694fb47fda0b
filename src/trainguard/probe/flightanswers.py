"""The flight-recorder responder: answers the watchdog's "what does the flight recorder know?" during a stall.

Until this process is one rank of several, the drain (probe/drain.py) answers at each pass. Once it is,
a thread of its own answers (`start`): the drain stacks and copies device values, and under NCCL a
collective that cannot complete wedges the GPU; the launches queued behind it fill the device's queue and
the next launch blocks, so a drain held there would leave the watchdog with no rank and no collective to
name. The answer launches nothing and waits for nothing on the device: NCCL's recorder queries its CUDA
events, which returns at once on a wedged GPU (benchmarks/nccl_wedged_read.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

from trainguard.contract import FLIGHT_ANSWER_PREFIX
from trainguard.probe import collectives, flightrec
from trainguard.probe.capturegate import GATE
from trainguard.probe.state import ProbeState
from trainguard.store.writer import StoreWriter

FLIGHT_POLL_S = 0.5  # seconds between looks for the watchdog's flight-recorder request, distributed runs


class FlightResponder:
    """Answers flight-recorder requests from the run folder, from the drain's passes or a thread of its own."""

    def __init__(self, state: ProbeState, writer: StoreWriter, run_dir: Path, rank: int) -> None:
        self.state = state
        self.writer = writer
        self.run_dir = run_dir
        self.rank = rank
        self.thread: threading.Thread | None = None  # answers the requests (distributed runs only)
        self.done = threading.Event()  # set once the last drain is over: the thread ends

    def start(self) -> None:
        """Once this process is one rank of several, a thread answers (the drain asks before each pass)."""
        if self.thread is not None or not flightrec.distributed():
            return
        thread = threading.Thread(target=self._loop, name="trainguard-flightrec", daemon=True)
        self.thread = thread
        thread.start()

    def _loop(self) -> None:
        """One stat every FLIGHT_POLL_S, an answer committed when asked. It goes on past the drain's end,
        until the last drain is over (`done`): that drain waits for the lock a drain held up by a wedged GPU
        never gives back, and then only this thread answers. None while a CUDA graph capture is open (the
        recorder's event queries could invalidate it). Its errors are logged once, never counted toward
        switching the guard off (a store it cannot write would do so in seconds)."""
        while not self.done.wait(FLIGHT_POLL_S):
            if GATE.capturing:
                continue
            try:
                self.answer(commit=True)
            except Exception as exc:
                self.state.selflog.once("flight recorder thread", f"flight recorder's answer failed: {exc!r}")

    def answer(self, commit: bool = False) -> None:
        """A stall: the watchdog asks what the flight recorder knows (one stat when it has not asked).
        `commit`: written to the store at once (the background thread, which commits, has stopped)."""
        asked = flightrec.asked(self.run_dir)
        if asked is not None:
            answer = flightrec.answer(asked, step=self.state.step_count + 1)
            # the counters as they are now: the background thread that copies them may be held (a wedged
            # GPU), and with the recorder off they are all the watchdog has
            answer["position"] = collectives.position()
            answer["attempt"] = self.writer.attempt  # (a restarted run's answers of an earlier attempt stay in meta)
            self.writer.set_meta(f"{FLIGHT_ANSWER_PREFIX}{self.rank}", answer)
            if commit:
                self.writer.flush()
