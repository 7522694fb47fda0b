"""A stall, diagnosed: take the stacks, save them and name the cause (stall.py builds the findings from it).

    result = diagnose_stall(run_dir, pid, attempt=0)
    result.moving       # True: the run is writing or reading steadily (a slow checkpoint), not stuck
    hang_finding(stall, result)   # watchdog/stall.py builds the finding from what this found

The supervisor calls this once per stall; everything heavy (py-spy, psutil, the kernel log) lives below.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.contract import ENV_PY_SPY
from trainguard.watchdog import classify, collectives, stacks

SAMPLES = 2  # two samples tell stuck from spinning; each more costs `INTERVAL` seconds of latency
INTERVAL = 2.0


@dataclass
class StallDiagnosis:
    snapshot: stacks.Snapshot
    diagnosis: classify.Diagnosis
    stacks_file: str | None
    io_bytes_moved: int

    @property
    def starting(self) -> list[int]:
        """Processes still importing and moving (spawned workers starting up): slow, not stuck."""
        return classify.starting_up(self.snapshot)

    @property
    def cpu_percent(self) -> float:
        """CPU % of the whole process tree, the highest over the samples (a blocked tree is near 0)."""
        return max((sum(p.cpu_percent or 0.0 for p in sample.values()) for sample in self.snapshot.samples),
                   default=0.0)

    @property
    def tree_io(self) -> tuple[int, int]:
        """Bytes written and read so far by the processes of the run (last sample): across looks, a wait
        that moves data (a download, a save) is not stuck."""
        last = self.snapshot.samples[-1] if self.snapshot.samples else {}
        return (sum(p.io_bytes or 0 for p in last.values()), sum(p.read_bytes or 0 for p in last.values()))

    @property
    def moving(self) -> bool:
        """The run wrote steadily during the sampling window while waiting (on a file, in a sleep, or where
        no stack could say): a slow save, not a hang. A lock, a collective or a busy loop never counts."""
        return self.io_bytes_moved >= classify.IO_MOVING_BYTES and self.diagnosis.cause in ("io", "sleep", "unknown")

    def process_summary(self) -> dict[str, Any]:
        root = self.snapshot.last(self.snapshot.root_pid)
        if root is None:
            return {"pid": self.snapshot.root_pid}
        pids = self.snapshot.pids()
        cpu = sum(s.cpu_percent or 0.0 for s in self.snapshot.samples[-1].values())
        # Under "cpu_percent" the summary adds "busy"/"idle"; a named cause says more (a device-sync wait
        # spins the CPU, yet it is not a busy loop), so then the total goes in as plain evidence.
        key = "cpu_percent" if self.diagnosis.cause == "unknown" else "tree_cpu_percent"
        return {"pid": root.pid, key: round(cpu, 1), "status": root.status, "rss_mb": root.rss_mb,
                "processes": len(pids)}

    def evidence(self) -> dict[str, Any]:
        d = self.diagnosis
        last = self.snapshot.samples[-1] if self.snapshot.samples else {}
        ev: dict[str, Any] = {
            "frames": d.frames,
            "stuck_pid": d.pid,
            "stacks_file": self.stacks_file,
            "stack_sources": {str(p.pid): p.source or f"none ({p.error})" for p in last.values()},
            "per_process": [
                {"pid": p.pid, "role": "dataloader-worker" if p.is_dataloader_worker else "process",
                 "cpu_percent": p.cpu_percent, "state": p.status, "rss_mb": p.rss_mb, "wchan": p.wchan}
                for p in last.values()
            ],
            "sampling_seconds": round(self.snapshot.seconds, 1),
            "io_bytes_during_sampling": self.io_bytes_moved,
        }
        ev.update({k: v for k, v in d.extra.items() if v is not None})
        if self.snapshot.gpu:
            ev["gpu"] = self.snapshot.gpu
        if self.snapshot.kernel.get("matches"):
            ev["kernel_log"] = self.snapshot.kernel["matches"]
        return ev


def diagnose_stall(run_dir: Path, pid: int, *, attempt: int | str = 0, samples: int = SAMPLES,
                   interval: float = INTERVAL) -> StallDiagnosis:
    asked = collectives.ask(run_dir)  # each rank's probe answers from its flight recorder while we sample
    snap = stacks.collect(pid, run_dir, samples=samples, interval=interval)
    try:
        txt = stacks.save(snap, Path(run_dir) / "stacks", attempt)
        stacks_file = str(txt.relative_to(run_dir))
    except OSError:
        stacks_file = None
    flight = _flight_answers(run_dir, asked, snap)
    diag = classify.diagnose(snap, collectives.flight_waits(snap, flight))
    if diag.cause == "collective":  # which call of the sequence each rank is in, and the rank to blame
        collectives.refine(diag, snap, collectives.read_positions(run_dir, asked), flight,
                           collectives.answered(run_dir, asked))
    if diag.cause == "dataloader-worker" and diag.extra.get("sample_index") is None and diag.pid:
        diag.extra["sample_index"], why = _sample_index_by_py_spy(diag.pid)
        if diag.extra["sample_index"] is not None:
            diag.detail += f", sample index {diag.extra['sample_index']}"
        elif why:
            # say why the index is missing: the stacks came from the signal dump, which has no locals
            diag.extra["sample_index_unread"] = f"{why}; the stacks came from the signal dump, which has no locals"
    return StallDiagnosis(snap, diag, stacks_file, classify.io_moving(snap))


FLIGHT_WAIT = 1.0  # seconds to wait, past the sampling, for ranks whose answer is not in the store yet


def _flight_answers(run_dir: Path, asked: float | None, snap: stacks.Snapshot) -> dict[int, dict[str, Any]]:
    """The ranks' flight-recorder answers (probe/flightrec.py). A probe answers within a flush (0.5 s) of
    the request and the sampling takes seconds, so they are in; a rank without a probe never answers:
    wait at most FLIGHT_WAIT for stragglers, then judge without them."""
    if asked is None:
        return {}
    ranks = {r for r in collectives.trainers_by_rank(snap)}
    deadline = time.monotonic() + FLIGHT_WAIT
    while True:
        got = collectives.read_flight(run_dir, asked)
        if ranks <= set(got) or time.monotonic() >= deadline or not got:
            return got
        time.sleep(0.2)


def _sample_index_by_py_spy(pid: int) -> tuple[str | None, str | None]:
    """The signal dump has no local variables; py-spy (where it has ptrace rights) reads the index.
    Returns (index, why not)."""
    spy = stacks.find_py_spy()
    if spy is None:
        return None, f"py-spy is not installed (or {ENV_PY_SPY}=0)"
    threads, why = stacks.py_spy_dump(pid, spy)
    sample = stacks.ProcSample(pid=pid, threads=threads)
    return classify.sample_index(sample), why
