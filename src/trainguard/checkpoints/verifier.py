"""The parent's side of checkpoint verification: one low-priority child at a time, bounded, fail-open.

    verifier = Verifier(record=lambda path, step, data: writer.add_event(EVENT_CHECKPOINT_CHECK, ...))
    verifier.submit(path, at_step=500, rank=0)     # cheap: a deque append, from any thread
    verifier.settle(timeout=60)                    # at the end: let the last one finish (bounded)

`submit` never blocks the caller. A thread of its own (started at the first checkpoint) takes the newest
request, starts `python -m trainguard.checkpoints.verify PATH` (checkpoints/verify.py: nice 19, one thread,
no GPU), watches its anonymous memory every POLL seconds and kills it past MAX_ANON_MB or TIMEOUT, and
hands the verdict (checkpoints/judge.py) to `record`. Requests that pile up while one runs keep only the
newest few: the newest checkpoint is the one a restart needs. A failure of the verifier itself is an
`unverified` verdict with the reason, never an exception in the caller.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.checkpoints.judge import series, verdict

TIMEOUT = 600.0  # seconds one verification may take (a 1 GB checkpoint takes a few: see the report)
MAX_ANON_MB = 4096  # anonymous memory of the child; the checkpoint's own pages are mapped, not counted
POLL = 0.2
MAX_PENDING = 4  # requests kept while one runs (the oldest go first)
STABLE_WAIT = 0.5  # a file whose size still changes is read again after this
REWRITTEN_SLACK = 2.0  # seconds a file's mtime may pass its report's time (clocks, a close after the report)


class Verifier:
    def __init__(self, record: Callable[[str, int | None, dict[str, Any]], None], *, learning: bool = True,
                 python: str | None = None, timeout: float = TIMEOUT, max_anon_mb: float = MAX_ANON_MB,
                 log: Callable[[str], None] | None = None) -> None:
        self.record = record
        self.learning = learning
        self.python = python or sys.executable
        self.timeout = timeout
        self.max_anon_mb = max_anon_mb
        self.log = log or (lambda text: None)
        self._pending: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_PENDING)
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._child: subprocess.Popen | None = None
        self._last_ok: dict[str, dict[str, Any]] = {}  # series -> the data of its last verified check
        # path -> ((mtime, size), whether its step was checked) at its last verification
        self._seen: dict[str, tuple[tuple[float, int], bool]] = {}
        self.results: list[dict[str, Any]] = []  # every verdict recorded (bounded), newest last

    def submit(self, path: str | os.PathLike[str], at_step: int | None, *, rank: int = 0, reported: bool = True,
               step_checked: bool = True, t: float | None = None) -> None:
        """`t`: when the checkpoint was reported (default now): a file rewritten since belongs to a later report."""
        with self._lock:  # (with the thread's "nothing left": a request never slips between the two)
            self._idle.clear()
            self._pending.append({"path": str(path), "at_step": at_step, "rank": rank, "reported": reported,
                                  "step_checked": step_checked, "t": t if t is not None else time.time()})
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="trainguard-ckpt-verify", daemon=True)
            self._thread.start()
        self._wake.set()

    def settle(self, timeout: float) -> bool:
        """Waits (at most `timeout` s) until nothing is pending or running; True when all were verified."""
        if self._thread is None:
            return True
        return self._idle.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()

    # -- the thread ----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            while self._pending and not self._stop.is_set():
                request = self._pending.popleft()
                try:
                    self._verify(request)
                except Exception as exc:
                    # Why not die: a dead verifier thread would leave every later checkpoint unverified in silence.
                    self.log(f"checkpoint verification failed for {request['path']}: {exc!r}")
            with self._lock:
                if not self._pending:
                    self._idle.set()

    def _verify(self, request: dict[str, Any]) -> None:
        path = request["path"]
        stamp = _stamp(path)
        if stamp is None:
            return  # gone already (a rotation deleted it): nothing a restart could use
        if request["reported"] and stamp[0] > request["t"] + REWRITTEN_SLACK:
            # rewritten since it was reported (a fixed path saved again, last.pt): what it holds now is a later
            # step's, whose own report follows; judging it by this report's step would be wrong
            return
        seen = self._seen.get(path)
        if seen is not None and seen[0] == stamp and (seen[1] or not request["step_checked"]):
            return  # not rewritten since it was verified (as thoroughly): the same checkpoint reported again
        while True:  # a file still growing is being written: read it once it stands still
            time.sleep(STABLE_WAIT if request["reported"] is False else 0.0)
            again = _stamp(path)
            if again == stamp or again is None:
                break
            stamp = again
        facts, how = self._run_child(path)
        if _stamp(path) != stamp:
            if not request["reported"] and request.get("tries", 0) < 2:
                # a file nobody reported changed while it was read (the save was not over): read it again later
                self._pending.append({**request, "tries": request.get("tries", 0) + 1})
            # a reported one was rewritten while it was read: what was read is not this report's (a later
            # report of it follows)
            return
        key = series(path)
        # a file nobody reported may be anything the run saves (a cache, a vocabulary): only whether it loads
        # and holds finite values is judged, never its step or whether it changed
        previous = self._last_ok.get(key) if request["reported"] else None
        status, why = verdict(facts, at_step=request["at_step"], previous=previous, learning=self.learning,
                              step_checked=request["step_checked"]) if facts is not None else ("unverified", how)
        self._seen[path] = (stamp, bool(request["step_checked"]))
        if status == "unverified" and not request["reported"]:
            return  # a file nobody called a checkpoint, in a format trainguard does not read: not one to tell of
        data = {**(facts or {"path": path}), "path": path, "at_step": request["at_step"], "rank": request["rank"],
                "reported": request["reported"], "status": status, "why": why, "bytes": stamp[1],
                "previous": previous.get("path") if previous else None,
                "last_verified": (self._newest_ok() or {}).get("path")}
        if status == "verified":
            self._last_ok[key] = {"path": path, "at_step": request["at_step"], "fingerprint": data.get("fingerprint"),
                                  "t": time.time()}
        self.results = [*self.results[-63:], data]
        self.record(path, request["at_step"], data)

    def _newest_ok(self) -> dict[str, Any] | None:
        return max(self._last_ok.values(), key=lambda d: d["t"], default=None)

    def _run_child(self, path: str) -> tuple[dict[str, Any] | None, str]:
        """(facts, "") or (None, why it could not be verified)."""
        src = str(Path(__file__).resolve().parents[2])  # the folder trainguard is imported from
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "TRAINGUARD_AUTO": "0", "TRAINGUARD_DISABLE": "1",
               "PYTHONPATH": os.pathsep.join([src, *[p for p in [os.environ.get("PYTHONPATH")] if p]])}
        t0 = time.time()
        try:
            child = self._child = subprocess.Popen(
                [self.python, "-m", "trainguard.checkpoints.verify", path], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as exc:
            return None, f"the verifier could not start ({exc.strerror or exc})"
        peak_anon = 0.0
        why = ""
        try:
            while child.poll() is None:
                if self._stop.wait(POLL):
                    why = "the run ended before the verification did"
                    break
                anon = _anon_mb(child.pid)
                peak_anon = max(peak_anon, anon or 0.0)
                if anon is not None and anon > self.max_anon_mb:
                    why = f"the verifier passed its memory limit ({anon:.0f} MB > {self.max_anon_mb:.0f} MB)"
                    break
                if time.time() - t0 > self.timeout:
                    why = f"the verification took longer than {self.timeout:.0f} s"
                    break
            if child.poll() is None:
                child.kill()
            out, err = child.communicate(timeout=10)
        finally:
            self._child = None
        if why:
            return None, why
        line = (out or b"").decode("utf-8", "replace").strip().splitlines()
        try:
            facts = json.loads(line[-1]) if line else None
        except ValueError:
            facts = None
        if not isinstance(facts, dict):
            tail = (err or b"").decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            return None, f"the verifier failed (exit {child.returncode}): {tail[0][:300]}"
        facts["wall_s"] = round(time.time() - t0, 3)
        facts["peak_anon_mb"] = round(peak_anon, 1)
        return facts, ""


def _stamp(path: str) -> tuple[float, int] | None:
    """(newest mtime, total size) of a file or a folder's files; None when it is gone."""
    p = Path(path)
    try:
        if p.is_dir():
            files = [f.stat() for f in p.iterdir() if f.is_file()]
            return (max((s.st_mtime for s in files), default=0.0), sum(s.st_size for s in files))
        if not p.is_file():
            return None  # a FIFO, a device, a socket: nothing to read (a FIFO's open would block)
        st = p.stat()
        return (st.st_mtime, st.st_size)
    except OSError:
        return None


def _anon_mb(pid: int) -> float | None:
    """The process's resident anonymous memory (RssAnon): what it allocated, not the file pages it maps."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
