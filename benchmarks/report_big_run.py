"""How long `trainguard report` takes on a run of a million steps.

    python benchmarks/report_big_run.py                  # 1,000,000 steps, prints the timing
    python benchmarks/report_big_run.py --steps 200000 --keep /tmp/big

The run folder is synthesized directly with SQLite, as the probe would have written it: one row per
step with loss, two loss parts and their weights, LR (warmup + cosine), grad norm, update ratio, step
time and data wait; an evaluation every 5,000 steps, a checkpoint every 50,000, phases, a finding, and
status.json. One step has a loss spike (x40) and one a NaN loss: the report's plots must show both.
The figures reported are the wall and CPU time of the `trainguard report` command (a fresh process,
imports included); the target is under 10 s of wall time. On a shared, loaded machine the wall time
is inflated by waiting for a core: the CPU time and the load average printed beside it tell how much.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from trainguard.findings import Finding
from trainguard.store.schema import STEP_COLUMNS, connect
from trainguard.store.status import write_status

SPIKE_STEP_FRACTION = 0.37
NAN_STEP_FRACTION = 0.81


def synthesize(run_dir: Path, steps: int, *, spike_step: int | None = None, nan_step: int | None = None,
               seed: int = 0) -> dict[str, int]:
    """Write a `steps`-step run folder; returns the planted steps {"spike": .., "nan": ..}."""
    run_dir.mkdir(parents=True, exist_ok=True)
    spike = spike_step if spike_step is not None else int(steps * SPIKE_STEP_FRACTION)
    nan = nan_step if nan_step is not None else int(steps * NAN_STEP_FRACTION)
    rng = np.random.default_rng(seed)
    s = np.arange(1, steps + 1)
    t0 = 1.7e9
    step_time = 0.05 + 0.005 * rng.random(steps)
    t = t0 + np.cumsum(step_time)
    loss = 2.0 + 3.0 * np.exp(-s / (steps / 8)) + 0.05 * rng.standard_normal(steps)
    loss[spike - 1] *= 40
    kd, lm = 0.6 * loss, 0.4 * loss
    warm = max(1, steps // 100)
    lr = np.where(s < warm, 3e-4 * s / warm, 3e-4 * 0.5 * (1 + np.cos(np.pi * np.minimum(1, (s - warm) / (steps - warm)))))
    grad = 1.0 + 0.2 * rng.random(steps)
    upd = 1e-3 * (1 + 0.1 * rng.random(steps))
    wait = 0.002 * rng.random(steps)
    loss_text: list[float | str] = loss.tolist()
    loss_text[nan - 1] = "nan"
    kd_l, lm_l = kd.tolist(), lm.tolist()
    parts = [f'{{"kd": {a!r}, "lm": {b!r}}}' for a, b in zip(kd_l, lm_l)]
    parts[nan - 1] = '{"kd": NaN, "lm": NaN}'
    weights = '{"kd": 0.5, "lm": 0.5}'
    col = {"attempt": 0, "rank": 0, "micro": None, "nonfinite": 0, "loss_scale": None, "sched_epoch": None,
           "extra": None}
    conn = connect(run_dir)
    conn.execute("PRAGMA synchronous=OFF")
    per_col = {"step": s.tolist(), "t": t.tolist(), "loss": loss_text, "lr": lr.tolist(), "grad_norm": grad.tolist(),
               "update_ratio": upd.tolist(), "step_time": step_time.tolist(), "data_wait": wait.tolist(),
               "parts": parts}
    rows = zip(*[per_col[c] if c in per_col else [col[c]] * steps if c != "weights" else [weights] * steps
                 for c in STEP_COLUMNS])
    with conn:
        conn.executemany(f"INSERT INTO steps ({', '.join(STEP_COLUMNS)}) VALUES ({', '.join('?' * len(STEP_COLUMNS))})",
                         rows)
        meta = {"command": ["python", "train_big.py"], "cwd": "/tmp", "host": "bench", "started": t0,
                "label": "train_big", "plan": {"total_steps": steps, "grad_accum": 1, "optimizer": "AdamW"},
                "probe.0": {"python": "3.11", "torch": "2.13.0", "trainguard": "0.1.0"},
                "watchdog": {"trainguard": "0.1.0", "python": "3.11", "expects": []}}
        conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                         [(k, json.dumps(v)) for k, v in meta.items()])
        events = [(t0, 0, -1, 1, None, "run", "start", json.dumps({"pid": 1, "attempt": 0})),
                  (t0, 0, 0, 1, 0, "phase", "train", json.dumps({"edge": "begin", "nth": 1}))]
        for k in range(5000, steps + 1, 5000):
            tk = float(t[k - 1])
            events.append((tk, 0, 0, 1, k, "phase", "eval", json.dumps({"edge": "begin", "nth": k // 5000})))
            events.append((tk + 1, 0, 0, 1, k, "eval", None, json.dumps({"loss": 2.1 + 3 * math.exp(-k / (steps / 8))})))
            events.append((tk + 1, 0, 0, 1, k, "phase", "eval", json.dumps({"edge": "end", "seconds": 1.0})))
            if k % 50000 == 0:
                events.append((tk + 2, 0, 0, 1, k, "checkpoint", f"ckpt-{k}.pt", json.dumps({"bytes": 2**27})))
        finding = Finding(code="TG301", name="nonfinite-loss", severity="warning", step=nan, t=float(t[nan - 1]) + 0.5,
                          summary=f"the loss became NaN at step {nan}", evidence={"loss": "nan", "step": nan},
                          fix="Lower the LR or enable gradient clipping.", source="rules")
        events.append((finding.t, 0, -1, 1, nan, "finding", finding.name, json.dumps(finding.to_dict())))
        events.append((float(t[-1]), 0, 0, 1, steps, "phase", "train", json.dumps({"edge": "end", "seconds": float(t[-1] - t0)})))
        events.append((float(t[-1]) + 1, 0, -1, 1, None, "run", "end", json.dumps({"state": "completed", "exit_code": 0})))
        conn.executemany("INSERT INTO events (t, attempt, rank, pid, step, kind, name, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         sorted(events))
    conn.close()
    write_status(run_dir, {"state": "completed", "step": steps, "total_steps": steps, "exit_code": 0, "started": t0,
                           "ended": float(t[-1]) + 1, "watched_by": "watchdog", "findings": [finding.to_dict()]})
    return {"spike": spike, "nan": nan}


def time_report(run_dir: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one `trainguard report` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trainguard.cli", "report", str(run_dir)], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"trainguard report failed ({proc.returncode}): {proc.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--keep", help="write the run folder here and keep it")
    args = parser.parse_args()
    run_dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tg-big-")) / "run"
    if args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)  # synthesizing into an old run would add to its steps
    try:
        t0 = time.perf_counter()
        planted = synthesize(run_dir, args.steps)
        synth = time.perf_counter() - t0
        seconds, cpu = time_report(run_dir)
        size = (run_dir / "report.html").stat().st_size
        print(f"synthesized {args.steps:,} steps in {synth:.1f} s; planted spike at step {planted['spike']}, "
              f"NaN at step {planted['nan']}")
        print(f"trainguard report: {seconds:.2f} s wall, {cpu:.2f} s CPU (target < 10 s); "
              f"report.html {size / 1024:.0f} KiB; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        return 0 if seconds < 10 else 1
    finally:
        if not args.keep:
            shutil.rmtree(run_dir.parent, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
