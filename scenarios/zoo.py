"""The failure zoo: every failure trainguard claims to catch, as a small runnable script, plus healthy twins.

    python scenarios/zoo.py                 # run them all, print the table
    python scenarios/zoo.py seed001_eval_typeerror healthy_instrumented
    python scenarios/zoo.py --list
    python scenarios/zoo.py --backend nccl  # the scenarios that also run over NCCL, one GPU a rank

Each scenario is a folder `scenarios/<name>/` holding the script(s) and `expect.yaml`:

    summary: what it plants          issue: the issue number it belongs to
    mode: run                        run (trainguard run) | preflight | check | diagnose | distill | nodes
    nodes: 2                         nodes mode: simulated nodes on localhost, each `trainguard run` wrapping its
    nproc: 2                           torchrun (--nnodes, --node_rank, a c10d rendezvous on 127.0.0.1) under run/
    kill_node: 1                     nodes mode: SIGKILL this node's watchdog and torchrun agent ...
    kill_after_step: 15                ... once it has trained this many steps; then wait for `findings` on the others
    args: [--stall-timeout, "5"]     trainguard options before `--`
    command: [python, train.py]      the command ("python" means this interpreter)
    cwd: proj                        the folder of the scenario's copy the command runs from (default: its top)
    state: crashed                   the final state expected (run mode)
    exit_code: 1                     trainguard's exit code expected (optional)
    findings: [run-crashed]          finding names that must appear
    absent: [run-hung]               finding names that must not appear
    quiet: false                     true: no warning or error at all (healthy twins)
    cause: none-operand              cause expected on the first finding named (optional)
    where: "train.py:31"             text expected in that finding's `where` (optional)
    says: "rank 0 waits in"          text expected in that finding's summary (optional)
    step: 200                        step expected on that finding (optional)
    rank: 1                          rank that finding names as its origin (optional: evidence rank / origin_ranks /
                                     blamed_rank, a hang's rank to blame)
    onset_step: 100                  step where the planted problem starts (optional: latency in steps)
    found_within: 15                 a stall's first finding named must come within its stall timeout +
                                     this many seconds after the last progress (optional: latency in time)
    requires: cuda                   run only where CUDA is available (reported as skipped elsewhere)
    timeout: 120                     seconds the scenario may take
    nccl:                            the scenario also runs over NCCL (`--backend nccl`: its scripts read
      cause: cuda-device-assert        TRAINGUARD_ZOO_BACKEND=nccl, one GPU a rank); the keys given here
                                       replace those above for that run, written down, never loosened
                                       silently (`nccl: {}`: the same expectations)

The scenario runs in a scratch copy of its folder, so whatever it writes never lands in the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


@dataclass
class Result:
    name: str
    expected: str
    got: str
    ok: bool
    seconds: float
    detect: str = ""
    problems: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    output: str = ""
    skipped: bool = False


def scenario_names() -> list[str]:
    return sorted(p.name for p in HERE.iterdir() if (p / "expect.yaml").is_file())


def load_expect(name: str) -> dict[str, Any]:
    return yaml.safe_load((HERE / name / "expect.yaml").read_text()) or {}


BACKENDS = ("gloo", "nccl")  # gloo: as the scripts are written (CPU); nccl: TRAINGUARD_ZOO_BACKEND=nccl
ENV_BACKEND = "TRAINGUARD_ZOO_BACKEND"
# what a backend's block may replace: the expectations and how the scenario is run, not what it is
OVERRIDABLE = {"state", "exit_code", "findings", "absent", "quiet", "cause", "where", "says", "step", "rank",
               "onset_step", "found_within", "timeout", "args", "command"}


def expectations(name: str, backend: str = "gloo") -> dict[str, Any]:
    """A scenario's expect.yaml as it holds for `backend`: over gloo as written, over NCCL with its `nccl:`
    block's keys in place of the ones they name. A scenario without that block does not run over NCCL."""
    exp = {k: v for k, v in load_expect(name).items() if k not in BACKENDS}
    if backend == "gloo":
        return exp
    over = load_expect(name).get(backend)
    if not isinstance(over, dict):
        raise ValueError(f"{name} does not run over {backend}: its expect.yaml has no `{backend}:` block")
    unknown = sorted(set(over) - OVERRIDABLE)
    if unknown:
        raise ValueError(f"{name}: `{backend}:` may replace {', '.join(sorted(OVERRIDABLE))}; not {', '.join(unknown)}")
    return {**exp, **over}


def backend_names(backend: str) -> list[str]:
    """The scenarios that run over `backend` (every one over gloo)."""
    return [n for n in scenario_names() if backend == "gloo" or isinstance(load_expect(n).get(backend), dict)]


def _trainguard() -> list[str]:
    return [sys.executable, "-m", "trainguard.cli"]


def _command(exp: dict[str, Any]) -> list[str]:
    cmd = exp.get("command") or ["python", "train.py"]
    return [sys.executable if c == "python" else str(c) for c in cmd]


def run_scenario(name: str, keep: str | None = None, backend: str = "gloo", timeout: float | None = None) -> Result:
    """Runs one scenario in a scratch copy and judges it; `timeout` (seconds) shortens its expect.yaml's."""
    exp = expectations(name, backend)
    if timeout is not None:
        exp["timeout"] = min(float(exp.get("timeout", 120)), timeout)
    mode = exp.get("mode", "run")
    if exp.get("requires") == "cuda" and not _cuda_devices():
        return Result(name, "needs CUDA", "skipped (no CUDA here)", True, 0.0, skipped=True)
    if backend == "nccl" and _cuda_devices() < 2:
        return Result(name, "needs 2 CUDA devices (nccl)", f"skipped ({_cuda_devices()} here)", True, 0.0,
                      skipped=True)
    work = Path(tempfile.mkdtemp(prefix=f"zoo-{name}-"))
    shutil.copytree(HERE / name, work, dirs_exist_ok=True)
    run_dir = work / "run"
    args = [str(a) for a in exp.get("args", [])]
    if mode == "nodes":
        t0 = time.time()
        rc, out = _run_nodes(exp, work, run_dir, args)
        from trainguard.store.status import read_status

        status = read_status(run_dir) if run_dir.is_dir() else {}  # the nodes' parts merged (store/nodes.py)
        subprocess.run(_trainguard() + ["report", str(run_dir)], capture_output=True, timeout=120)
        result = judge(name, exp, rc, status, time.time() - t0, out)
        result.problems += _check_nodes(exp, run_dir) + (check_report(run_dir, status, quiet=bool(exp.get("quiet")))
                                                         if rc is not None else [])
        result.ok = not result.problems
        _kill_left_in(work)
        shutil.rmtree(work, ignore_errors=True)
        return result
    if mode == "run":
        cmd = _trainguard() + ["run", "--quiet", "--run-dir", str(run_dir)] + args + ["--"] + _command(exp)
    elif mode == "preflight":
        cmd = _trainguard() + ["preflight", "--run-dir", str(run_dir)] + args + ["--"] + _command(exp)
    else:  # check, diagnose, distill, ...: `trainguard MODE ARGS...`, run folder where the mode has one
        cmd = _trainguard() + [mode] + args
    env = dict(os.environ)
    env.pop("TRAINGUARD_RUN_DIR", None)
    env["TRAINGUARD_RUNS_ROOT"] = str(work / "runs")
    env.pop(ENV_BACKEND, None)
    if backend != "gloo":
        env[ENV_BACKEND] = backend
    # torchrun's static rendezvous listens on 29500 unless told otherwise: two torchrun scenarios side by
    # side (pytest -n 2) would take the same port. PET_MASTER_PORT is torchrun's own default for it.
    env.setdefault("PET_MASTER_PORT", str(_free_port()))
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=work / str(exp.get("cwd") or "."), env=env, capture_output=True, text=True,
                              timeout=float(exp.get("timeout", 120)))
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = None, f"scenario timed out after {exp.get('timeout', 120)} s\n{exc.stdout or ''}{exc.stderr or ''}"
        _kill_left_in(work)
    seconds = time.time() - t0
    status = _read_json(run_dir / "status.json") or _read_json(work / "status.json") or {}
    if not status and mode != "run":
        status = _parse_json_output(out)
    result = judge(name, exp, rc, status, seconds, out)
    if mode == "run" and rc is not None:
        result.problems += check_report(run_dir, status, quiet=bool(exp.get("quiet")))
        result.ok = not result.problems
    if keep:
        dest = Path(keep) / (name if backend == "gloo" else f"{name}.{backend}")
        shutil.rmtree(dest, ignore_errors=True)
        # links kept as links: a preflight's scratch folder links back into the scenario's own folder
        shutil.copytree(work, dest, symlinks=True, ignore=shutil.ignore_patterns("*.pt", "*.bin", "*.safetensors"))
    shutil.rmtree(work, ignore_errors=True)
    return result


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_nodes(exp: dict[str, Any], work: Path, run_dir: Path, args: list[str]) -> tuple[int | None, str]:
    """Simulated nodes on localhost: one `trainguard run` per node around its torchrun, one rendezvous.
    Returns the first node's exit code (None when the scenario timed out) and every node's output."""
    import psutil

    port = _free_port()
    n, nproc = int(exp.get("nodes", 2)), int(exp.get("nproc", 2))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["TRAINGUARD_RUNS_ROOT"] = str(work / "runs")
    logs = [work / f"node-{i}.out" for i in range(n)]
    procs = []
    for i in range(n):
        torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={n}", f"--node_rank={i}",
                    f"--nproc_per_node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                    "--rdzv-id=zoo"]
        cmd = _trainguard() + ["run", "--quiet", "--run-dir", str(run_dir)] + args + ["--"] + torchrun + \
            [str(c) for c in (exp.get("command") or ["train.py"])]
        with open(logs[i], "w") as fh:
            procs.append(subprocess.Popen(cmd, cwd=work, env=env, stdout=fh, stderr=subprocess.STDOUT))
        if i == 0:  # node 0's agent hosts the rendezvous store (the first to bind the port): up before the others
            _wait_listening(port, time.time() + 120)
    deadline = time.time() + float(exp.get("timeout", 240))
    rc: int | None = None
    try:
        victim = exp.get("kill_node")
        if victim is not None:
            while time.time() < deadline and (_node_step(run_dir / f"node-{victim}") or 0) < exp.get("kill_after_step", 10):
                time.sleep(1)
            agent = [c for c in psutil.Process(procs[victim].pid).children()
                     if "torch.distributed.run" in " ".join(c.cmdline())]
            for p in [psutil.Process(procs[victim].pid), *agent]:
                p.kill()  # the node's watchdog and agent, gone at once (its ranks are orphans: killed at the end)
            want = set(exp.get("findings") or [])
            while time.time() < deadline and not all(want <= _node_findings(run_dir / f"node-{i}")
                                                      for i in range(n) if i != victim):
                time.sleep(1)
            for i, p in enumerate(procs):
                if i != victim and p.poll() is None:
                    p.terminate()  # the survivors' watchdogs stop their commands and write their final state
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.time()))
        rc = procs[0].returncode if victim != 0 else procs[-1].returncode
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return rc, "".join(f"--- node {i} ---\n{log.read_text(errors='replace')[-3000:]}" for i, log in enumerate(logs))


def _wait_listening(port: int, until: float) -> None:
    import socket

    while time.time() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)


def _node_step(node_dir: Path) -> int | None:
    from trainguard.store.reader import RunReader

    try:
        with RunReader(node_dir) as reader:
            return max((b["step"] for b in reader.heartbeats() if b["step"] is not None), default=None)
    except Exception:
        return None


def _node_findings(node_dir: Path) -> set[str]:
    return {f.get("name") for f in (_read_json(node_dir / "status.json") or {}).get("findings") or []}


def _check_nodes(exp: dict[str, Any], run_dir: Path) -> list[str]:
    """Every node wrote its part, and the parts read back as one run with every rank."""
    from trainguard.store.reader import RunReader

    n, nproc = int(exp.get("nodes", 2)), int(exp.get("nproc", 2))
    missing = [i for i in range(n) if not (run_dir / f"node-{i}" / "run.db").is_file()]
    if missing:
        return [f"no part of node(s) {missing} under {run_dir}"]
    with RunReader(run_dir) as reader:
        ranks = {r["rank"] for r in reader.steps()}
    want = set(range(n * nproc))
    if ranks != want:
        return [f"the merged run holds ranks {sorted(ranks)}, expected {sorted(want)}"]
    return _check_merged_report(run_dir)


def _check_merged_report(run_dir: Path) -> list[str]:
    """The merged report says what the nodes' parts checked: the cross-rank rules and TG711 (node-lost)
    were checked (a new-user review found them 'not checked | needs more than one rank' on four ranks), and
    every node's command and ending is shown, not only node 0's."""
    from trainguard.report.build import build_report
    from trainguard.store.nodes import node_dirs

    report = build_report(run_dir)
    unchecked = [f"{c.code} ({c.detail})" for c in report.checks
                 if c.code in ("TG701", "TG705", "TG711") and c.result == "not checked"]
    shown = {key for key, _ in report.environment}
    missing = [f"node {i}" for i in range(len(node_dirs(run_dir))) if f"node {i}" not in shown]
    return ([f"the merged report did not check {', '.join(unchecked)}"] if unchecked else []) + \
        ([f"the merged report does not show {', '.join(missing)}"] if missing else [])


def _kill_left_in(work: Path) -> None:
    """After a timeout only `trainguard` was killed: the command runs in a session of its own and would live
    on (a planted busy loop burning a core for the rest of the suite). Kill what still runs in the folder."""
    import psutil

    for proc in psutil.process_iter(["pid", "cwd"]):
        try:
            cwd = proc.info["cwd"] or ""
            if cwd == str(work) or cwd.startswith(str(work) + os.sep):
                proc.kill()
        except (psutil.Error, OSError):
            continue


_devices: list[int] = []


def _cuda_devices() -> int:
    """CUDA devices here, asked once (in a child: torch is heavy). Scenarios with `requires: cuda` need one,
    a run over NCCL two."""
    if not _devices:
        probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
        try:
            out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
            _devices.append(int(out.stdout.strip() or 0) if out.returncode == 0 else 0)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            _devices.append(0)
    return _devices[0]


def check_report(run_dir: Path, status: dict[str, Any], quiet: bool = False) -> list[str]:
    """The report `trainguard run` wrote must tell what status.json tells: each finding's code, name, cause
    and evidence, its step marked on the plots; a quiet run's report says it found nothing and what it
    checked."""
    md_path, html_path = run_dir / "report.md", run_dir / "report.html"
    if not md_path.is_file() or not html_path.is_file():
        return ["no report.md/report.html in the run folder"]
    md = md_path.read_text().replace("\\", "")  # undo Markdown escapes for plain-text matching
    page = html_path.read_text()
    has_plots = 'class="plot"' in page
    problems = []
    findings = status.get("findings") or []
    for f in findings:
        label = f"{f.get('code')} {f.get('name')}"
        if label not in md or label not in page:
            problems.append(f"report does not name finding {label}")
        missing = [k for k in (f.get("evidence") or {}) if k not in md]
        if missing:
            problems.append(f"report leaves out the evidence {', '.join(missing)} of {label}")
        if f.get("cause") and f["cause"] not in md:
            problems.append(f"report does not give the cause {f['cause']} of {label}")
        if f.get("step") is not None and has_plots and f'class="mark finding" data-step="{f["step"]}"' not in page:
            problems.append(f"report's plots do not mark {label} at step {f['step']}")
    loud = [f for f in findings if f.get("severity") != "info"]  # quiet: no warning or error; info may be there
    said = "No findings" in md if not findings else "No errors;" in md
    if quiet and (loud or not said or "| passed |" not in md):
        problems.append("a quiet run's report must say 'No findings' (or 'No errors' beside info) and list what passed")
    return problems


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _parse_json_output(out: str) -> dict[str, Any]:
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return {}


def judge(name: str, exp: dict[str, Any], rc: int | None, status: dict[str, Any], seconds: float, out: str) -> Result:
    problems: list[str] = []
    findings = status.get("findings") or []
    names = [f.get("name") for f in findings]
    want_state = exp.get("state")
    # a preflight's verdict (passed, incomplete, failed) is a field beside the state (store/status.py's shown_state)
    got_state = status.get("preflight_outcome") or status.get("state", "?")
    if rc is None:
        problems.append("timed out")
    if want_state and got_state != want_state:
        problems.append(f"state {got_state}, expected {want_state}")
    if "exit_code" in exp and rc != exp["exit_code"]:
        problems.append(f"exit code {rc}, expected {exp['exit_code']}")
    for want in exp.get("findings") or []:
        if want not in names:
            problems.append(f"missing finding {want}")
    for unwanted in exp.get("absent") or []:
        if unwanted in names:
            problems.append(f"unexpected finding {unwanted}")
    if exp.get("quiet"):
        loud = [f"{f.get('name')}[{f.get('severity')}]" for f in findings if f.get("severity") in ("warning", "error")]
        if loud:
            problems.append("not quiet: " + ", ".join(loud))
    # "the first finding named": the first name in expect.yaml's list, as found in the run
    named = [[f for f in findings if f.get("name") == want] for want in exp.get("findings") or []]
    first = min(next((fs for fs in named if fs), []), default=None, key=_detected_at)
    if exp.get("cause") and (first is None or first.get("cause") != exp["cause"]):
        problems.append(f"cause {first.get('cause') if first else None}, expected {exp['cause']}")
    if exp.get("where") and (first is None or exp["where"] not in (first.get("where") or "")):
        problems.append(f"where {first.get('where') if first else None}, expected to contain {exp['where']}")
    if exp.get("says") and (first is None or exp["says"] not in (first.get("summary") or "")):
        problems.append(f"summary {first.get('summary') if first else None!r}, expected to contain {exp['says']!r}")
    if "rank" in exp:
        ev = (first or {}).get("evidence") or {}
        named_ranks = ([ev["rank"]] if isinstance(ev.get("rank"), int) else
                       [ev["blamed_rank"]] if isinstance(ev.get("blamed_rank"), int) else list(ev.get("origin_ranks") or []))
        if named_ranks != [exp["rank"]]:
            problems.append(f"rank(s) named {named_ranks}, expected [{exp['rank']}]")
    if "step" in exp and (first is None or first.get("step") != exp["step"]):
        problems.append(f"step {first.get('step') if first else None}, expected {exp['step']}")
    detect = _detect(exp, first, status)
    late = _too_late(exp, first, status) or _found_late(exp, first)
    if late:
        problems.append(late)
    expected = want_state or ("quiet" if exp.get("quiet") else "")
    if exp.get("findings"):
        expected += " " + ",".join(exp["findings"])
    got = got_state + (" " + ",".join(n for n in names if n) if names else "")
    return Result(name, expected.strip(), got, not problems, seconds, detect, problems, status, out[-4000:])


# Issue 4's latency budget, in optimizer steps after the onset: these within 20 steps; eval-metrics-frozen
# at the third identical evaluation (its scenarios check the step); every other rule within 5% of the
# planned run or 200 steps, whichever is smaller.
FAST_RULES = {"lr-reaches-zero", "nonfinite-loss", "nonfinite-grad", "weights-not-updating"}
UNBUDGETED = {"eval-metrics-frozen", "eval-loss-rising"}  # judged at evaluations (their scenarios check the step)
# Issue 20's contracts are checked where the code runs: within the sampling gap (stats_every, 10 steps).
CONTRACT_RULES = {"step-updates-nothing", "frozen-params-updated", "grads-never-reset", "eval-in-train-mode",
                  "eval-before-train-init", "autocast-runs-fp32", "loss-broadcasts-batch", "replicas-diverged",
                  "workers-share-rng", "batch-dim-lost"}


def latency_budget(name: str, total_steps: Any) -> int | None:
    if name in UNBUDGETED:
        return None
    if name in CONTRACT_RULES:
        return 10
    if name in FAST_RULES:
        return 20
    if isinstance(total_steps, int) and total_steps > 0:
        return min(200, int(0.05 * total_steps))
    return 200


def _too_late(exp: dict[str, Any], first: dict[str, Any] | None, status: dict[str, Any]) -> str | None:
    """A health rule that found its problem, but later than issue 4 allows."""
    if first is None or exp.get("onset_step") is None or first.get("source") not in ("rules", "probe", "diagnose"):
        return None
    at = (first.get("evidence") or {}).get("detected_step", first.get("step"))
    budget = latency_budget(first.get("name", ""), status.get("total_steps"))
    if budget is None or not isinstance(at, (int, float)):
        return None
    # a rule that does not judge the run's first steps (memory-creep's warm-up, where a healthy process
    # grows) starts its clock where it starts judging, the `judged_from` step in its evidence
    late = at - max(exp["onset_step"], (first.get("evidence") or {}).get("judged_from") or 0)
    return f"{first.get('name')} detected {late} steps after onset, budget {budget}" if late > budget else None


def _found_late(exp: dict[str, Any], first: dict[str, Any] | None) -> str | None:
    """A stall found, but later than its stall timeout + `found_within` seconds after the last progress."""
    if exp.get("found_within") is None or first is None:
        return None
    ev = first.get("evidence") or {}
    if not all(isinstance(ev.get(k), (int, float)) for k in ("detected_at", "last_progress_at", "stall_timeout")):
        return f"{first.get('name')} carries no detection time to check found_within against"
    after = ev["detected_at"] - ev["last_progress_at"]
    budget = ev["stall_timeout"] + float(exp["found_within"])
    if after > budget:
        return (f"{first.get('name')} found {after:.1f} s after the last progress, later than the stall timeout"
                f" {ev['stall_timeout']:g} s + {exp['found_within']} s")
    return None


def _detected_at(f: dict[str, Any]) -> float:
    at = (f.get("evidence") or {}).get("detected_step", f.get("step"))
    return at if isinstance(at, (int, float)) else float("inf")


def _detect(exp: dict[str, Any], first: dict[str, Any] | None, status: dict[str, Any]) -> str:
    if first is None:
        return ""
    if (status.get("preflight") or {}).get("seconds") is not None:
        return f"{status['preflight']['seconds']:.1f} s (whole preflight)"
    ev = first.get("evidence") or {}
    if "detected_at" in ev and "last_progress_at" in ev:
        return f"{ev['detected_at'] - ev['last_progress_at']:.1f} s after last progress"
    # the health rules say where a problem starts (step) and when they were sure (detected_step)
    at = ev.get("detected_step", first.get("step"))
    if exp.get("onset_step") is not None and at is not None:
        budget = latency_budget(first.get("name", ""), status.get("total_steps"))
        within = f", budget {budget}" if budget is not None else ""
        judged = ev.get("judged_from") or 0
        if judged > exp["onset_step"]:
            return f"step {at} (onset {exp['onset_step']}, judged from {judged}, +{at - judged}{within})"
        return f"step {at} (onset {exp['onset_step']}, +{at - exp['onset_step']}{within})"
    if first.get("t") and status.get("ended"):
        return f"{max(0.0, status['ended'] - first['t']):.1f} s"
    return "at exit" if status.get("ended") else ""


def print_table(results: list[Result]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="trainguard scenario zoo")
    for col in ("scenario", "expected", "got", "detect", "secs", "ok"):
        table.add_column(col, overflow="fold")
    for r in results:
        table.add_row(r.name, r.expected, r.got, r.detect, f"{r.seconds:.1f}", "ok" if r.ok else "FAIL")
    console = Console(width=160)
    console.print(table)
    for r in results:
        if not r.ok:
            console.print(f"[bold]{r.name}[/bold]: " + "; ".join(r.problems))


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the scenario zoo and print its table.")
    parser.add_argument("names", nargs="*", help="scenarios to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--jobs", type=int, default=2, help="scenarios run at once")
    parser.add_argument("--keep", help="copy each scenario's scratch folder (run folder included) here")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    parser.add_argument("--table", metavar="FILE",
                        help="print the table from a results file the tests wrote (TRAINGUARD_ZOO_RESULTS)")
    parser.add_argument("--backend", choices=BACKENDS, default="gloo",
                        help="nccl: the scenarios whose expect.yaml has a `nccl:` block, over NCCL, one GPU a rank")
    args = parser.parse_args()
    if args.table:
        rows = [json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()]
        print_table([Result(r["name"], r["expected"], r["got"], r["ok"], r["seconds"], r["detect"],
                            skipped=r.get("skipped", False)) for r in sorted(rows, key=lambda r: r["name"])])
        return 0 if all(r["ok"] for r in rows) else 1
    names = args.names or backend_names(args.backend)
    unknown = [n for n in names if n not in scenario_names()]
    if unknown:
        print(f"zoo: unknown scenario(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    elsewhere = [n for n in names if n not in backend_names(args.backend)]
    if elsewhere:
        print(f"zoo: not run over {args.backend} (no `{args.backend}:` block): {', '.join(elsewhere)}", file=sys.stderr)
        return 2
    if args.list:
        for n in names:
            print(f"{n:40} {load_expect(n).get('summary', '')}")
        return 0
    # Scenarios that need the GPU run one at a time: they share one device, and some fill it on purpose.
    gpu = threading.Lock()

    def run_one(name: str) -> Result:
        if load_expect(name).get("requires") != "cuda" and args.backend == "gloo":
            return run_scenario(name, args.keep)
        with gpu:
            return run_scenario(name, args.keep, args.backend)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(run_one, names))
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ | {"output": r.output[-1000:]} for r in results], indent=2, default=str))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
