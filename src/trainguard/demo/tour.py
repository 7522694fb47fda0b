"""`trainguard demo`: the point of trainguard in about a minute, on a CPU.

    trainguard demo [--root DIR]

Three short runs, each a `trainguard run` of its own, started at once:

1. a healthy run (a tiny transformer LM): it completes and nothing is reported;
2. seed 002's failure: a scheduler stepped per micro-batch, so the LR sits at 0 from step 8 on;
3. seed 003's failure: a DataLoader worker stuck on one sample in the second epoch.

After each run the demo prints its findings with their evidence and fix, and at the end where each
run's report is. The scripts are copied next to the runs before they start, so the stacks and the
`where` of a finding point at a file the reader can open (the watchdog does not count frames inside an
installed package as the user's code).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import click

from trainguard.contract import ENV_RUN_DIR
from trainguard.rules.schedule import LrReachesZero
from trainguard.store.paths import new_run_dir, runs_root
from trainguard.store.status import read_status

EVIDENCE_SHOWN = 6  # evidence entries printed per finding; the report has them all
STACK_LINES_SHOWN = 8


@dataclass(frozen=True)
class DemoRun:
    title: str
    script: str
    args: tuple[str, ...] = ()
    stall_timeout: float | None = None
    stop_on: tuple[str, ...] = ()
    expects: tuple[str, ...] = ()  # file names inside the run folder the script must write
    note: str = ""


RUNS = (
    # One thread: the watchdog shares the CPU, and two threads on two busy cores wait on each other.
    DemoRun("a healthy run: a tiny transformer LM on the CPU, 30 optimizer steps", "train_tiny.py",
            args=("--steps", "30", "--grad-accum", "1", "--eval-every", "15", "--threads", "1",
                  "--out", "{run_dir}/demo-results.json"),
            expects=("demo-results.json",),
            note="expected: completed, no findings"),
    DemoRun("seed 002: the LR scheduler stepped once per micro-batch (grad accumulation 16)",
            "lr_per_microbatch.py", stop_on=(LrReachesZero.name,),
            note="expected: lr-reaches-zero within steps of the LR hitting 0, and the run stopped (--stop-on)"),
    DemoRun("seed 003: a DataLoader worker stuck on one sample in the second epoch", "stuck_worker.py",
            stall_timeout=3.0,
            note="expected: run-hung, cause dataloader-worker, the worker's stack (--stall-timeout 3)"),
)


@dataclass
class Outcome:
    run: DemoRun
    run_dir: Path
    exit_code: int
    seconds: float
    status: dict[str, Any] = field(default_factory=dict)


def run_tour(root: Path | None = None, echo: Any = click.echo) -> int:
    """Starts the three demo runs at once, each a `trainguard run` of its own, and shows each in turn.

    At once, not one after another: most of a demo run is waiting (Python and torch starting, the stall
    timeout running out, the stacks sampled two seconds apart), and three waits overlap where three in
    a row add up. Each run's terminal output is held and printed whole, in order, when it has ended.
    Returns 0 when each run ended as the demo expects, else 1.
    """
    root = Path(root) if root is not None else runs_root()
    scripts = _copy_scripts(root / "demo-scripts")
    t0 = time.time()
    started = [_start(demo, root, scripts) for demo in RUNS]
    echo(f"trainguard demo: {len(RUNS)} runs started under the watchdog, in {root}; each is shown when it ends")
    outcomes: list[Outcome] = []
    for i, (demo, run_dir, proc, terminal) in enumerate(started, 1):
        code = proc.wait()
        terminal.seek(0)
        echo("")
        echo(click.style(f"== {i}/{len(RUNS)}  {demo.title}", bold=True))
        echo(f"   {demo.note}")
        echo(terminal.read().decode(errors="replace").rstrip("\n"))
        terminal.close()
        outcome = Outcome(demo, run_dir, code, time.time() - t0, read_status(run_dir))
        outcomes.append(outcome)
        _show_evidence(outcome, echo)
    echo("")
    echo(click.style(f"== done in {time.time() - t0:.0f} s", bold=True))
    for o in outcomes:
        names = ", ".join(f["name"] for f in o.status.get("findings") or []) or "no findings"
        echo(f"   {o.status.get('state', '?'):<10} {names}")
        echo(f"              report: {o.run_dir / 'report.html'}")
    echo(f"   the demo's scripts: {scripts}   more: trainguard ls, trainguard status RUN, trainguard rules CODE")
    return 0 if all(_as_expected(o) for o in outcomes) else 1


def _start(demo: DemoRun, root: Path, scripts: Path) -> tuple[DemoRun, Path, subprocess.Popen, Any]:
    """`trainguard run --quiet ...` for one demo run; its terminal output goes to a temporary file."""
    run_dir = new_run_dir(f"demo-{Path(demo.script).stem}", root)
    watch = ["--run-dir", str(run_dir), "--quiet"]
    if demo.stall_timeout is not None:
        watch += ["--stall-timeout", str(demo.stall_timeout)]
    if demo.stop_on:
        watch += ["--stop-on", ",".join(demo.stop_on)]
    for name in demo.expects:
        watch += ["--expect", str(run_dir / name)]
    args = [a.replace("{run_dir}", str(run_dir)) for a in demo.args]
    command = [sys.executable, "-m", "trainguard.cli", "run", *watch, "--", sys.executable,
               str(scripts / demo.script), *args]
    terminal = tempfile.TemporaryFile()
    env = {k: v for k, v in os.environ.items() if k != ENV_RUN_DIR}
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.STDOUT, env=env)
    return demo, run_dir, proc, terminal


def _copy_scripts(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    package = resources.files("trainguard") / "demo"
    for demo in RUNS:
        shutil.copyfile(str(package / demo.script), dest / demo.script)
    return dest


def _show_evidence(o: Outcome, echo: Any) -> None:
    """The evidence behind each error (the supervisor has already printed each finding, where and fix)."""
    for f in o.status.get("findings") or []:
        evidence = {k: v for k, v in (f.get("evidence") or {}).items()
                    if v is not None and not k.endswith("_at") and k not in ("stacks", "frames")}
        if f.get("severity") != "error" or not evidence:
            continue
        echo(f"   evidence of {f.get('code')} {f.get('name')}:")
        for key, value in list(evidence.items())[:EVIDENCE_SHOWN]:
            echo(f"     {key}: {_short(value)}")
    for stack_file in sorted((o.run_dir / "stacks").glob("hang-*.txt"))[:1]:
        echo(f"   stacks: {stack_file}")
        for line in _stuck_lines(stack_file)[:STACK_LINES_SHOWN]:
            echo(f"     {line}")


def _stuck_lines(stack_file: Path) -> list[str]:
    """The lines of a stack dump that name the demo's own scripts: where each process waits."""
    lines = stack_file.read_text(errors="replace").splitlines()
    return [ln.strip() for ln in lines if "demo-scripts" in ln or ln.lstrip().startswith(("pid", "process", "=="))]


def _short(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _as_expected(o: Outcome) -> bool:
    names = {f.get("name") for f in o.status.get("findings") or []}
    state = o.status.get("state")
    if o.run.script == "train_tiny.py":
        return state == "completed" and not names
    if o.run.script == "lr_per_microbatch.py":
        return LrReachesZero.name in names
    return state == "hung" and any(f.get("cause") == "dataloader-worker" for f in o.status.get("findings") or [])
