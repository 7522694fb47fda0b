"""The verifier's child process: `python -m trainguard.checkpoints.verify PATH` prints one JSON line.

Started by checkpoints/verifier.py, never by hand (though it can be, to check a checkpoint now). It lowers
its own priority first (nice 19, idle I/O class where the system allows), keeps to one CPU thread and
sees no GPU, so a verification competes with the training for nothing it needs: the parent bounds its
time and its anonymous memory, and kills it past either.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time


def lower_priority() -> None:
    """Nice 19 and the idle I/O class: the training's threads and its data loaders go first. On Linux the
    child also dies with its parent (a verifier whose run was killed has no one to tell)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    try:
        os.nice(19)
    except OSError:
        pass
    try:
        import psutil

        psutil.Process().ionice(psutil.IOPRIO_CLASS_IDLE)
    except Exception:  # not Linux, or not permitted: the CPU priority alone
        pass


def _own_peak_rss_mb() -> float:
    """This image's peak resident memory. VmHWM first: getrusage's ru_maxrss survives exec, so a verifier
    started from a big training process would report the trainer's peak as its own."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m trainguard.checkpoints.verify PATH", file=sys.stderr)
        return 2
    lower_priority()
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    from trainguard.checkpoints.read import read_checkpoint

    facts = read_checkpoint(argv[0])
    facts["seconds"] = round(time.perf_counter() - t0, 3)
    facts["cpu_s"] = round(time.process_time() - cpu0, 3)
    facts["peak_rss_mb"] = _own_peak_rss_mb()
    sys.stdout.write(json.dumps(facts, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
