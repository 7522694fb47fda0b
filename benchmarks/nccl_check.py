"""Issue 17's checks on one host with two GPUs, over NCCL, in one command that fits one device call.

    PYTHONPATH=$PWD/src python3 benchmarks/nccl_check.py --out DIR     # 2+ CUDA devices, trainguard not installed
    PYTHONPATH=$PWD/src python benchmarks/nccl_check.py --dry-run --out DIR   # the same code paths over gloo, CPU

What it runs, in this order (the overhead first: it needs the GPUs alone and a known share of the time;
the scenarios then share the rest, two at a time, each bounded):
1. overhead: benchmarks/ranks_overhead.py --device cuda: two ranks, DDP over NCCL, GPT-2 small's shape in
   bf16, guarded (G) against unguarded (U) and a second unguarded copy (C, the control) in one job; G/U and
   C/U as ratios with their 95% intervals; holds when it measured (>= 10 rounds), G's blocks made no
   host-device synchronisation, and the guarded run has no finding. Whether the ratio is within the 1 %
   budget is said (`within_budget`), not a condition: this is the measurement.
2. healthy: scenarios/torchrun_ddp_healthy over NCCL under `trainguard run` (bf16 autocast; the loop under
   `torch.cuda.set_sync_debug_mode("error")` from step 3 on): holds when the zoo's expectations hold
   (completed, exit 0, no finding, the report says so), run.db's `steps` has every step of each rank (by
   its `rank` column), and guard.log is empty (a sync in the guard raises there and is logged, not raised
   into the loop; any other error of the guard's own is a defect in a healthy run too).
3. the failure scenarios over NCCL, each as its expect.yaml says for NCCL (`nccl:` block, scenarios/zoo.py):
   torchrun_ddp_extra_collective (rank 0 alone all-reduces on a metrics group, rank 1 skips it: a hang that
   names rank 0 and the all-reduce, stopped on proof; also: the stacks of every rank saved, each rank's
   flight-recorder answer and which recorders gave it), torchrun_ddp_nan (rank 1's NaN named as the
   origin), torchrun_ddp_crash (a device-side assert on rank 1: cause cuda-device-assert, rank 1),
   torchrun_ddp_desync (the replicas drift: grad-norms-differ, replicas-diverged), torchrun_ddp_straggler
   (rank 1 named, from its device's idle time before the all-reduce).

Prints one JSON line per item; writes --out/summary.json (every item, the environment), --out/runs.tar.gz
(each scenario's scratch folder with its run folder: status, report, stacks, output; at most ~15 MiB)
and --out/overhead.json. Exit 0 only when every check holds. A scenario that misbehaves is cut at its
timeout and reported; whatever happens, the summary is written before the total budget (--budget) ends.
--dry-run: the same over gloo on the CPU, the scenarios' gloo expectations, a short overhead arm on two
CPU ranks (for checking the harness, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "scenarios"))
import zoo  # noqa: E402  (scenarios/zoo.py: runs a scenario, judges its expect.yaml)

HANG = "torchrun_ddp_extra_collective"
FAILURES = [HANG, "torchrun_ddp_crash", "torchrun_ddp_nan", "torchrun_ddp_desync", "torchrun_ddp_straggler"]
HEALTHY = "torchrun_ddp_healthy"
STEPS_HEALTHY = 40  # the healthy scenario's steps (its train.py)
SCENARIO_TIMEOUT = 150.0  # seconds one scenario may take, at most (its expect.yaml may say less)
LANES = 2  # scenarios at once (two ranks each, on the same two GPUs)
MAX_TAR = 15 << 20  # runs.tar.gz stays under the 16 MiB a returned file may have
RESERVE = 15.0  # seconds kept at the end for the summary and the archive


class Clock:
    """The command's whole budget: what is left of it, and a share of it for one part."""

    def __init__(self, budget: float) -> None:
        self.end = time.monotonic() + budget

    def left(self) -> float:
        return self.end - time.monotonic() - RESERVE


def say(item: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(item, default=str), flush=True)
    return item


# -------------------------------------------------------------------------------------------------
# the environment


def environment(backend: str) -> dict[str, Any]:
    """What the machine is, and that trainguard runs from the source tree (not installed)."""
    probe = ("import json, os, torch; import torch.distributed as d; print(json.dumps({'torch': torch.__version__, "
             "'cuda': torch.version.cuda, 'devices': torch.cuda.device_count(), "
             "'names': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "
             "'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None, "
             "'nccl_dump': hasattr(torch._C._distributed_c10d, '_dump_nccl_trace')}))")
    env: dict[str, Any] = {"backend": backend, "python": sys.version.split()[0], "cpu_count": os.cpu_count(),
                           "vars": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                                   "NVSHMEM_DISABLE_NVLS", "TORCH_FR_BUFFER_SIZE",
                                                                   "TORCH_NCCL_TRACE_BUFFER_SIZE", "PYTHONPATH")}}
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        env.update(json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"torch_error": out.stderr[-800:]})
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        env["torch_error"] = repr(exc)
    cli = subprocess.run([sys.executable, "-m", "trainguard.cli", "--version"], capture_output=True, text=True,
                         timeout=60)
    env["trainguard_cli"] = (cli.stdout or cli.stderr).strip()[-300:]
    env["trainguard_from"] = subprocess.run([sys.executable, "-c", "import trainguard; print(trainguard.__file__)"],
                                            capture_output=True, text=True, timeout=60).stdout.strip()
    return env


# -------------------------------------------------------------------------------------------------
# 1. the overhead


def overhead(out: Path, clock: Clock, dry_run: bool, seconds: float) -> dict[str, Any]:
    result_file = out / "overhead.json"
    if dry_run:
        cmd = [sys.executable, str(HERE / "ranks_overhead.py"), "--ranks", "2", "--rounds", "3", "--block", "5",
               "--gap", "0.1", "--out", str(result_file)]
        limit = min(clock.left(), 240.0)
    else:
        # torchrun, CUDA, NCCL and three GPT-2-sized models take ~30-60 s before the first timed round
        cmd = [sys.executable, str(HERE / "ranks_overhead.py"), "--device", "cuda", "--ranks", "2", "--rounds", "400",
               "--block", "8", "--gap", "0.3", "--seconds", str(round(seconds)), "--out", str(result_file)]
        limit = min(clock.left(), seconds + 120.0)
    t0 = time.monotonic()
    item: dict[str, Any] = {"item": "overhead", "command": " ".join(cmd[1:])}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(30.0, limit))
        item["exit_code"], tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        item["exit_code"], tail = None, f"timed out after {limit:.0f} s\n{_text(exc.stdout)}{_text(exc.stderr)}"[-3000:]
    item["seconds"] = round(time.monotonic() - t0, 1)
    got = _read_json(result_file)
    if got is None:
        item.update(ok=False, problems=["no result written"], output_tail=tail)
        return say(item)
    g, c = got.get("guarded_over_unguarded") or {}, got.get("control_over_unguarded") or {}
    syncs = (got.get("sync_warnings_rank0") or {}).get("G", 0)
    problems = []
    if (got.get("rounds") or 0) < (2 if dry_run else 10):
        problems.append(f"only {got.get('rounds')} rounds")
    if syncs:
        problems.append(f"{syncs} host-device synchronisation(s) in the guarded blocks")
    if got.get("guarded_run_findings"):
        problems.append(f"findings on the guarded run: {got['guarded_run_findings']}")
    ci = g.get("ci95_bootstrap") or [None, None]
    item.update(ok=not problems, problems=problems, ratio=g.get("ratio"), ci95=ci, control=c.get("ratio"),
                control_ci95=c.get("ci95_bootstrap"), rounds=got.get("rounds"), ms_per_step=got.get("ms_per_step"),
                guard_step_ms_on_thread=got.get("guard_step_ms_on_thread_rank0"),
                probe_thread_cpu_ms_per_step=got.get("probe_thread_cpu_ms_per_step_rank0"),
                within_budget=bool(ci[0] is not None and ci[0] <= 1.01), sync_warnings=got.get("sync_warnings_rank0"))
    if problems:
        item["output_tail"] = tail
    return say(item)


# -------------------------------------------------------------------------------------------------
# 2 and 3. the scenarios


def scenario(name: str, backend: str, keep: Path, clock: Clock) -> dict[str, Any]:
    """One scenario through the zoo (its expectations for `backend`), and what its run folder holds."""
    limit = min(SCENARIO_TIMEOUT, clock.left())
    if limit < 20:
        return say({"item": name, "ok": False, "problems": ["not run: no time left in the budget"]})
    try:
        r = zoo.run_scenario(name, keep=str(keep), backend=backend, timeout=limit)
    except Exception as exc:  # the harness itself failed on this one: said, and the others still run
        return say({"item": name, "ok": False, "problems": [f"the zoo failed: {exc!r}"]})
    folder = keep / (name if backend == "gloo" else f"{name}.{backend}")
    item: dict[str, Any] = {"item": name, "ok": r.ok and not r.skipped, "expected": r.expected, "got": r.got,
                            "detect": r.detect, "seconds": round(r.seconds, 1), "problems": list(r.problems),
                            "skipped": r.skipped}
    first = _findings(r.status)
    item["findings"] = [{k: f.get(k) for k in ("code", "name", "severity", "cause", "where", "step", "summary")}
                        for f in first]
    run = folder / "run"
    item["guard_log"] = _guard_log(run)
    if name == HEALTHY:
        rows = _rows_per_rank(run)
        item["steps_per_rank"] = rows
        if rows != {0: STEPS_HEALTHY, 1: STEPS_HEALTHY}:
            item["problems"].append(f"run.db steps per rank {rows}, expected {STEPS_HEALTHY} for each of ranks 0, 1")
        synced = [line for line in item["guard_log"] if "synchroniz" in line.lower()]
        if synced:
            item["problems"].append(f"the guard synchronised host and device: {synced[:3]}")
        elif item["guard_log"]:  # fail-open errors of the guard's own: in a healthy run, each one is a defect
            item["problems"].append(f"guard.log is not empty: {item['guard_log'][:3]}")
    if name == HANG:
        hang = next((f for f in first if f.get("name") == "run-hung"), {})
        item["hang"] = _hang_details(run, hang)
        if not item["hang"]["stacks_of_every_rank"]:
            item["problems"].append(f"the saved stacks do not hold every rank: {item['hang']['stack_ranks']}")
    if r.problems or not r.ok:
        item["output_tail"] = r.output[-2500:]
    item["ok"] = not item["problems"] and not r.skipped
    return say(item)


def _findings(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in status.get("findings") or [] if isinstance(f, dict)]


def _rows_per_rank(run: Path) -> dict[int, int]:
    try:
        con = sqlite3.connect(f"file:{run / 'run.db'}?mode=ro", uri=True)
        try:
            return {int(r): int(n) for r, n in con.execute("SELECT rank, COUNT(*) FROM steps GROUP BY rank")}
        finally:
            con.close()
    except (sqlite3.Error, TypeError, ValueError):
        return {}


def _guard_log(run: Path) -> list[str]:
    try:
        return (run / "guard.log").read_text(errors="replace").splitlines()[:40]
    except OSError:
        return []


def _hang_details(run: Path, hang: dict[str, Any]) -> dict[str, Any]:
    """The hang's evidence, and what the run folder kept of it: the stacks file of every rank, the ranks'
    flight-recorder answers (which recorders answered; 'unavailable' where none could)."""
    ev = hang.get("evidence") or {}
    saved = _read_json((run / ev["stacks_file"]).with_suffix(".json")) if ev.get("stacks_file") else None
    last = ((saved or {}).get("samples") or [{}])[-1]
    ranks = sorted({int(p["rank"]) for p in last.values() if p.get("rank") is not None and any(
        t.get("main") and t.get("frames") for t in p.get("threads") or [])})
    flight: dict[str, Any] = {}
    try:
        con = sqlite3.connect(f"file:{run / 'run.db'}?mode=ro", uri=True)
        try:
            for key, value in con.execute("SELECT key, value FROM meta WHERE key LIKE 'flightrec.%'"):
                answer = json.loads(value) if isinstance(value, str) else {}
                flight[key] = {"recorders": answer.get("recorders"), "unavailable": bool(answer.get("unavailable")),
                               "active": [f"{a.get('group')}#{a.get('seq')} {a.get('op')} device={a.get('device')} "
                                          f"{a.get('where') or a.get('from')}" for a in answer.get("active") or []]}
        finally:
            con.close()
    except (sqlite3.Error, ValueError) as exc:
        flight["error"] = repr(exc)
    return {"summary": hang.get("summary"), "where": hang.get("where"), "blamed_rank": ev.get("blamed_rank"),
            "positions": ev.get("collective_positions"), "unrecoverable": ev.get("unrecoverable"),
            "stopped_because": ev.get("stopped_because"), "stacks_file": ev.get("stacks_file"),
            "stack_ranks": ranks, "stacks_of_every_rank": ranks == [0, 1], "flight_recorder": flight}


# -------------------------------------------------------------------------------------------------
# the archive, the summary


def archive(keep: Path, out: Path) -> dict[str, Any]:
    """The scenarios' scratch folders as runs.tar.gz; the reports' HTML left out first if it grows too big."""
    target = out / "runs.tar.gz"
    for leave_out in ((), (".html",), (".html", ".db", ".db-wal", ".db-shm")):
        skipped = (".pt", ".bin", ".safetensors", *leave_out)
        with tarfile.open(target, "w:gz") as tar:
            tar.add(keep, arcname="runs", filter=lambda ti, skipped=skipped: None if ti.name.endswith(skipped) else ti)
        if target.stat().st_size <= MAX_TAR:
            return {"file": target.name, "bytes": target.stat().st_size, "left_out": list(leave_out)}
    target.unlink()
    return {"file": None, "why": "over 15 MiB even without the reports and databases"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for summary.json, overhead.json and runs.tar.gz")
    p.add_argument("--budget", type=float, default=520.0, help="seconds the whole command may take")
    p.add_argument("--overhead-seconds", type=float, default=140.0, help="seconds of timed overhead rounds")
    p.add_argument("--dry-run", action="store_true", help="the same code paths over gloo on the CPU")
    p.add_argument("--only", default="", help="comma-separated: overhead,healthy,failures (default: all)")
    args = p.parse_args()
    clock = Clock(args.budget)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keep = Path(os.environ.get("TMPDIR", "/tmp")) / f"nccl-check-{os.getpid()}"
    keep.mkdir(parents=True, exist_ok=True)
    backend = "gloo" if args.dry_run else "nccl"
    only = set(filter(None, args.only.split(","))) or {"overhead", "healthy", "failures"}
    t0 = time.monotonic()
    env = say({"item": "environment", **environment(backend)})
    items: list[dict[str, Any]] = []
    if backend == "nccl" and (env.get("devices") or 0) < 2:
        items.append(say({"item": "devices", "ok": False, "problems": [f"needs 2 CUDA devices, found {env.get('devices')}"]}))
    else:
        if "overhead" in only:
            try:
                items.append(overhead(out, clock, args.dry_run, args.overhead_seconds))
            except Exception as exc:
                items.append(say({"item": "overhead", "ok": False, "problems": [f"the harness failed: {exc!r}"]}))
        names = list(FAILURES) if "failures" in only else []
        if "healthy" in only:
            names.insert(1 if names else 0, HEALTHY)  # beside the hang, the longest; the straggler, timed, last
        with ThreadPoolExecutor(max_workers=LANES) as pool:
            items += list(pool.map(lambda n: scenario(n, backend, keep, clock), names))
    summary = {"ok": bool(items) and all(i.get("ok") for i in items), "seconds": round(time.monotonic() - t0, 1),
               "environment": env, "items": items,
               "failed": [i["item"] for i in items if not i.get("ok")]}
    try:
        summary["archive"] = archive(keep, out)
    except Exception as exc:  # the summary matters more than the archive
        summary["archive"] = {"file": None, "why": repr(exc)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    say({"item": "summary", "ok": summary["ok"], "failed": summary["failed"], "seconds": summary["seconds"]})
    return 0 if summary["ok"] else 1


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _text(b: Any) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


if __name__ == "__main__":
    sys.exit(main())
