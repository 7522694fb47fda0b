"""What the health rules cost per optimizer step, measured alone (no training to hide behind).

    python benchmarks/rules_cost.py               # 20,000 steps with 3 loss parts, evals, samples
    python benchmarks/rules_cost.py --steps 5000

Two figures, both CPU time of the thread that runs the rules, per optimizer step:
- engine: every rule fed a step row (with loss parts and weights) and the evaluations, memory samples
  and checkpoints a real run has, straight from memory: the probe's path when it runs the rules itself
  (its store writer hands them what it queues);
- live: the watchdog's path: rows committed to a real run store, then read back by `LiveRules.poll`
  (SQLite reads included) once per simulated second of 100 steps, in the watchdog's own process.

Divide by your step time for the share: at 30 ms a step, 30 us is 0.1%. Prints one JSON line.
A real run alone records the same figure for itself: meta "rules_cpu.<rank>" in its run.db.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

from trainguard.rules.engine import Engine
from trainguard.rules.live import LiveRules
from trainguard.store.reader import RunReader
from trainguard.store.writer import StoreWriter

PLAN = {"total_steps": 100_000, "grad_accum": 4, "sched_horizon": 100_000, "output_size": 50304}


def synthetic_run(steps: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    events: list[dict] = []
    t = 0.0
    for s in range(1, steps + 1):
        t += 0.03
        loss = 2.0 + 8.0 * math.exp(-s / 2000) + rng.gauss(0, 0.05)
        parts = {"kd": loss * 0.6, "lm": loss * 0.3, "feature": loss * 0.1}
        events.append({
            "kind": "step", "step": s, "t": t, "micro": 4 * s, "loss": loss, "lr": 3e-4, "rank": 0,
            "grad_norm": 1.0 if s % 10 == 0 else None, "update_ratio": 1e-3 if s % 10 == 0 else None,
            "nonfinite": 0, "step_time": 0.03 + rng.gauss(0, 0.001), "data_wait": 0.001, "loss_scale": None,
            "sched_epoch": s - 1, "parts": parts, "weights": {"kd": 1.0, "lm": 1.0, "feature": 1.0}, "extra": {},
        })
        if s % 33 == 0:
            events.append({"kind": "sample", "step": s, "t": t, "data": {"rss": 4e9}})
        if s % 500 == 0:
            events.append({"kind": "eval", "step": s, "t": t, "data": {"loss": loss + rng.random()}})
            events.append({"kind": "checkpoint", "step": s, "t": t, "data": {}})
    return events


def engine_cost(events: list[dict], steps: int) -> float:
    engine = Engine(PLAN)
    t0 = time.thread_time()
    found = engine.feed_all(events)
    spent = time.thread_time() - t0
    assert not [f for f in found if f.severity != "info"], [f.one_line() for f in found]
    return spent / steps


def live_cost(events: list[dict], steps: int) -> float:
    run_dir = Path(tempfile.mkdtemp(prefix="tg-rules-cost-"))
    writer = StoreWriter(run_dir)
    writer.set_meta("plan", PLAN)
    writer.flush()
    live = LiveRules()
    spent = 0.0
    with RunReader(run_dir) as reader:
        for i, ev in enumerate(events):
            if ev["kind"] == "step":
                writer.add_step(ev)
            else:
                writer.add_event(ev["kind"], None, ev["data"], step=ev["step"], t=ev["t"])
            if ev["kind"] == "step" and ev["step"] % 100 == 0 or i == len(events) - 1:
                writer.flush()
                t0 = time.thread_time()
                live.poll(reader)
                spent += time.thread_time() - t0
    writer.close()
    return spent / steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20_000)
    args = p.parse_args()
    events = synthetic_run(args.steps)
    engine_us = 1e6 * engine_cost(events, args.steps)
    live_us = 1e6 * live_cost(events, args.steps)
    print(json.dumps({"steps": args.steps, "rules": len(Engine(PLAN).rules),
                      "engine_us_per_step": round(engine_us, 1), "live_us_per_step": round(live_us, 1),
                      "share_of_30ms_step_pct": round(100 * live_us / 30_000, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
