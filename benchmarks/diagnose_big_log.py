"""How `trainguard diagnose` copes with a big log: time and peak memory (RSS) for a generated log.

    python benchmarks/diagnose_big_log.py --mb 1024        # a 1 GB log (default 200 MB)
    python benchmarks/diagnose_big_log.py --mb 50 --keep /tmp/big.log

The log mixes what real ones hold: `step N loss=... lr=...` lines, tqdm redraws, Hugging Face dict lines,
eval lines and noise, and ends in a traceback. The diagnosis runs in a child process so its peak RSS is
its own (`ru_maxrss` of the child); flat memory means the peak does not grow with the log's size.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import json, sys, time
from trainguard.ingest.diagnose import diagnose_path
t0 = time.perf_counter()
d = diagnose_path(sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - t0, "steps": d.steps, "lines": d.lines,
                  "findings": [f.name for f in d.findings]}))
"""


def write_log(path: Path, megabytes: int) -> int:
    target = megabytes << 20
    step = 0
    written = 0
    with open(path, "w") as f:
        while written < target:
            chunk = []
            for _ in range(2000):
                step += 1
                lr = 3e-4 * min(1.0, step / 1000)
                chunk.append(f"step {step} loss={2.5 / (1 + step / 5e4):.4f} lr={lr:.3e} grad_norm=1.{step % 97:02d}\n")
                if step % 10 == 0:
                    chunk.append(f" 12%|#2        | {step}/10000000 [01:00<07:00, 9.1it/s, loss=2.31, lr={lr:.2e}]\r")
                if step % 50 == 0:
                    chunk.append(f"{{'loss': '{2.4:.3f}', 'grad_norm': '1.1', 'learning_rate': '{lr:.3e}', 'epoch': '0.01'}}\n")
                if step % 1000 == 0:
                    chunk.append(f"[Eval] loss: {2.0 + 1 / step:.4f} accuracy: 0.5\n")
                if step % 333 == 0:
                    chunk.append("INFO some noise from a data loader worker: shard 17 opened\n")
            text = "".join(chunk)
            f.write(text)
            written += len(text)
        f.write('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    main()\n'
                "RuntimeError: mat1 and mat2 must have the same dtype, but got Half and Float\n")
    return step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=200, help="log size in MiB (default 200)")
    p.add_argument("--keep", help="write the log here and keep it (default: a temp file, removed)")
    a = p.parse_args()
    path = Path(a.keep) if a.keep else Path(tempfile.mkstemp(suffix=".log")[1])
    try:
        t0 = time.perf_counter()
        steps = write_log(path, a.mb)
        size = path.stat().st_size
        print(f"wrote {size / 2**20:.0f} MiB, {steps:,} steps in {time.perf_counter() - t0:.1f} s", flush=True)
        proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            return 1
        import json

        r = json.loads(proc.stdout.strip().splitlines()[-1])
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
        print(f"diagnosed {r['lines']:,} lines, {r['steps']:,} steps in {r['seconds']:.1f} s "
              f"({size / 2**20 / r['seconds']:.1f} MiB/s); peak RSS {peak:.0f} MiB; findings: {', '.join(r['findings'])}")
    finally:
        if not a.keep:
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
