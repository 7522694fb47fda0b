"""How `trainguard diagnose` copes with a big log: time and peak memory (RSS) for generated logs of given sizes.

    python benchmarks/diagnose_big_log.py --mb 100 500 1024 --out benchmarks/results/diagnose_big_log.json
    python benchmarks/diagnose_big_log.py --mb 50 --keep /tmp/big.log     # write the log and keep it
    python benchmarks/diagnose_big_log.py --mb 200 --no-rules             # the readers' own cost

Each log is written to a temporary file (`--tmp`, default /tmp) and removed afterwards. It mixes what a
real one holds: a `step N loss=... lr=... grad_norm=...` line per step, tqdm redraws (carriage returns,
`loss=`/`lr=` in the postfix, the run's total in the bar), Hugging Face dict lines, eval lines and eval
dicts, checkpoint lines, PyTorch warnings and other noise. The schedule is a warmup then a cosine decay
to 10% over the log's own step count; the loss falls fast, then slowly, with noise. One loss spike is
planted at 60% of the run (so the rules must still be working deep into the log), and the log ends in a
traceback.

`trainguard diagnose PATH --json` runs as a child process: wall and CPU time from `os.wait4`, the peak
RSS (`ru_maxrss`) of that child alone, and, polled every second with psutil, its RSS against how far
into the file it has read (from /proc's file offset): flat memory means the RSS stays put as the offset
grows, and the peak does not grow with the log's size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TRACEBACK = ('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    main()\n'
             "RuntimeError: mat1 and mat2 must have the same dtype, but got Half and Float\n")
WARNING = ("/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:557: UserWarning: This "
           "DataLoader will create 8 worker processes in total. Our suggested max number of worker in current "
           "system is 4, which is smaller than what this DataLoader is going to create.\n")


# -- the log ------------------------------------------------------------------------------------------

def lr_at(step: int, total: int, peak: float = 3e-4, warmup: int = 2000) -> float:
    """Linear warmup, then cosine decay to 10% of the peak at `total`."""
    if step < warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def log_lines(step: int, total: int, rng: random.Random, spike_at: int) -> str:
    """What one optimizer step prints."""
    loss = 2.0 + 6.0 * math.exp(-step / 150) + 1.0 * math.exp(-step / (0.2 * total)) + rng.gauss(0, 0.03)
    if step == spike_at:
        loss *= 4  # the planted spike
    lr = lr_at(step, total)
    out = [f"step {step} loss={loss:.4f} lr={lr:.3e} grad_norm={1.0 + 0.2 * rng.random():.3f}\n"]
    if step % 10 == 0:
        pct = 100 * step // total
        out.append(f"{pct:3d}%|{'#' * (pct // 10):<10}| {step}/{total} [1:02:03<9:08:07, 9.12it/s, "
                   f"loss={loss:.3g}, lr={lr:.2e}]\r")
    if step % 50 == 0:
        out.append(f"{{'loss': {loss:.4f}, 'grad_norm': {1.1 + 0.1 * rng.random():.4f}, 'learning_rate': {lr:.4e}, "
                   f"'epoch': {step / 10000:.2f}}}\n")
    if step % 1000 == 0:
        ev = loss - 0.1 + rng.gauss(0, 0.01)
        out.append(f"[Eval] step {step} loss: {ev:.4f} accuracy: {0.9 - 0.1 * ev / 8 + rng.gauss(0, 0.003):.4f}\n")
    if step % 5000 == 0:
        out.append(f"{{'eval_loss': {loss - 0.1:.4f}, 'eval_runtime': 12.3, 'eval_samples_per_second': 81.2, "
                   f"'epoch': {step / 10000:.2f}}}\n")
        out.append(f"Saving model checkpoint to out/checkpoint-{step}\n")
    if step % 777 == 0:
        out.append(WARNING)
    if step % 333 == 0:
        out.append(f"INFO worker 3: opened shard {step // 333 % 128} of 128\n")
    return "".join(out)


def write_log(path: Path, megabytes: float, seed: int = 0) -> int:
    """Writes about `megabytes` MiB; returns the number of steps (the schedule spans exactly those)."""
    target = int(megabytes * 2**20)
    # bytes per step, sampled where the step numbers have their typical length (a few rounds, since
    # that length depends on the total)
    rng = random.Random(seed)
    total = 10**6
    for _ in range(3):
        at = int(0.6 * total)
        sample = sum(len(log_lines(at + i, total, rng, -1)) for i in range(20000)) / 20000
        total = max(1000, int(target / sample))
    rng = random.Random(seed)
    with open(path, "w") as f:
        chunk: list[str] = []
        for step in range(1, total + 1):
            chunk.append(log_lines(step, total, rng, int(0.6 * total)))
            if len(chunk) == 5000:
                f.write("".join(chunk))
                chunk = []
        f.write("".join(chunk))
        f.write(TRACEBACK)
    return total


# -- the measurement ----------------------------------------------------------------------------------

def diagnose(path: Path, rules: bool) -> dict:
    """`trainguard diagnose PATH --json` in a child: its times, peak RSS and RSS against bytes read."""
    import psutil

    cmd = [sys.executable, "-m", "trainguard", "diagnose", str(path), "--json"]
    if not rules:  # the readers alone: no CLI flag for that, so the library call
        cmd = [sys.executable, "-c", "import json, sys; from trainguard.ingest.diagnose import diagnose_path; "
               "print(json.dumps(diagnose_path(sys.argv[1], rules=False).to_dict(), default=str))", str(path)]
    size = path.stat().st_size
    with tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
        trace: list[tuple[float, float, float]] = []  # (seconds, share of the file read, RSS MiB)
        done = threading.Event()

        def poll() -> None:
            proc = psutil.Process(child.pid)
            while not done.wait(1.0):
                try:
                    rss = proc.memory_info().rss / 2**20
                    pos = max((f.position for f in proc.open_files() if f.path == str(path)), default=None)
                except (psutil.Error, OSError):
                    continue
                if pos is not None:
                    trace.append((round(time.perf_counter() - t0, 1), round(pos / size, 4), round(rss, 1)))

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        stderr = child.stderr.read()
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage, not all children's
        wall = time.perf_counter() - t0
        done.set()
        poller.join()
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode not in (0, 1):  # 1: an error finding (the planted crash), not a failure
            raise SystemExit(f"diagnose failed ({child.returncode}): {stderr[-2000:]}")
        out.seek(0)
        report = json.loads(out.read().strip().splitlines()[-1])
    return {"wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # KiB on Linux
            "rss_trace": _thin(trace, 12), "report": report}


def _thin(trace: list, n: int) -> list:
    if len(trace) <= n:
        return trace
    return [trace[round(i * (len(trace) - 1) / (n - 1))] for i in range(n)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, nargs="+", default=[200], help="log sizes in MiB (default 200)")
    p.add_argument("--tmp", default="/tmp", help="folder for the generated logs (default /tmp)")
    p.add_argument("--keep", help="write the (single) log here and keep it")
    p.add_argument("--no-rules", action="store_true", help="the readers alone, without the health rules")
    p.add_argument("--out", help="also write the results as JSON to this file")
    a = p.parse_args()
    results = []
    for mb in a.mb:
        path = Path(a.keep) if a.keep else Path(tempfile.mkstemp(suffix=".log", dir=a.tmp)[1])
        try:
            t0 = time.perf_counter()
            steps = write_log(path, mb)
            size = path.stat().st_size
            print(f"wrote {size / 2**20:.0f} MiB, {steps:,} steps in {time.perf_counter() - t0:.0f} s", flush=True)
            r = diagnose(path, rules=not a.no_rules)
        finally:
            if not a.keep:
                path.unlink(missing_ok=True)
        rep = r.pop("report")
        row = {"mib": round(size / 2**20, 1), "lines": rep["lines"], "steps": rep["steps"], "evals": rep["evals"],
               **{k: r[k] for k in ("wall_s", "cpu_s", "peak_rss_mib")},
               "mib_per_s_wall": round(size / 2**20 / r["wall_s"], 2),
               "mib_per_s_cpu": round(size / 2**20 / max(r["cpu_s"], 1e-9), 2),
               "findings": [f"{f['name']}@{f['step']}" for f in rep["findings"]],
               "rss_trace_s_share_mib": r["rss_trace"]}
        results.append(row)
        what = "readers only" if a.no_rules else "readers + health rules"
        print(f"{what}: {row['mib']:.0f} MiB, {row['lines']:,} lines, {row['steps']:,} steps: {row['wall_s']} s wall "
              f"({row['mib_per_s_wall']} MiB/s), {row['cpu_s']} s CPU ({row['mib_per_s_cpu']} MiB/s); peak RSS "
              f"{row['peak_rss_mib']} MiB; findings: {', '.join(row['findings'])}", flush=True)
        print(f"  RSS (s, share read, MiB): {row['rss_trace_s_share_mib']}", flush=True)
    if a.out:
        meta = {"benchmark": "diagnose_big_log", "rules": not a.no_rules, "python": platform.python_version(),
                "cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg(), "machine": platform.machine()}
        Path(a.out).write_text(json.dumps({**meta, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
