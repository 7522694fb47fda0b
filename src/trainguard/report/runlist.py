"""What `trainguard status` and `trainguard ls` print of runs: a run's status.json as lines, and the list of
runs as a table. The commands (cli.py) read their arguments and hand them here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from trainguard.errors import UserError


def print_status(path: Any, st: dict, echo: Callable[[str], None]) -> None:
    """`trainguard status`: the run's state, step, health, nodes, ranks and findings, a line each."""
    from trainguard.store.ending import how_it_exited
    from trainguard.store.status import health_counts, shown_state

    state = shown_state(st)
    line = f"{path}: {state}"
    # a hung run still live (--on-hang wait) has no exit yet; one that ended was stopped by trainguard
    how = how_it_exited(st.get("state") if st.get("ended") else None, st.get("exit_code"), st.get("signal"))
    if how:
        line += f" ({how})"
    if st.get("step") is not None:
        line += f", step {st['step']}" + (f"/{st['total_steps']}" if st.get("total_steps") else "")
    if st.get("phase"):
        line += f", phase {st['phase']}"
    line += f"; health {health_counts(st)}"  # beside the state: a completed run may still be unhealthy
    echo(line)
    if st.get("state_note"):
        echo(f"  note: {st['state_note']}")
    if isinstance(st.get("nodes"), dict):  # a run over nodes (store/nodes.py): each node's part
        echo("  nodes: " + "; ".join(f"node {n} {v.get('state')}" + (f" at step {v['step']}" if v.get("step") is not None
                                                                      else "") for n, v in st["nodes"].items()))
    ranks = ranks_line(path)
    if ranks:
        echo(ranks)
    findings = st.get("findings") or []
    if not findings:
        echo("  no findings")
    for f in findings:
        at = f" at step {f['step']}" if f.get("step") is not None else ""
        on = f" (node {f['node']})" if f.get("node") is not None else ""
        echo(f"  {f.get('code')} {f.get('name')} [{f.get('severity')}]{at}{on}: {f.get('summary')}")
        if isinstance(f.get("acked"), dict):
            ack = f["acked"]
            echo(f"    acknowledged by {ack.get('by')}" + (f": {ack['why']}" if ack.get("why") else ""))
        if f.get("where"):
            echo(f"    where: {f['where']}")
        if f.get("fix"):
            echo(f"    fix: {f['fix']}")


def ranks_line(path: Any) -> str | None:
    """'  ranks: node 0 (gpu-a): 0 at step 40, 1 at step 40; node 1 (gpu-b): 2 at step 38 ...' for a run of
    several ranks: where each rank ran and how far it got (its heartbeat, else its last row)."""
    from trainguard.store.reader import RunReader

    with RunReader(path) as reader:
        info = reader.ranks()
        if len(info) < 2:
            return None
        steps: dict[int, int] = {}
        for beat in reader.heartbeats():
            if isinstance(beat.get("step"), int) and isinstance(beat.get("rank"), int):
                steps[beat["rank"]] = max(steps.get(beat["rank"], 0), beat["step"])
        for rank in set(info) - set(steps):  # no heartbeat with a step (a rank aborted before its flush)
            last = reader.last_step_of(rank)
            if last is not None:
                steps[rank] = last
    by_node: dict[tuple[int, str], list[str]] = {}
    for rank, r in sorted(info.items()):
        at = f" at step {steps[rank]}" if rank in steps else " (no step recorded)"
        by_node.setdefault((r["node"], r["host"]), []).append(f"{rank}{at}")
    return "  ranks: " + "; ".join(f"node {node} ({host}): {', '.join(ranks)}"
                                   for (node, host), ranks in sorted(by_node.items()))


def print_runs(root: str | None, echo: Callable[[str], None]) -> None:
    """`trainguard ls`: the runs under ROOT with their state, health, step, findings, start, job and command
    (a table on a terminal, plain aligned columns when piped)."""
    from rich.console import Console
    from rich.table import Table

    from trainguard.store.paths import list_runs, runs_root
    from trainguard.store.status import read_status, shown_state

    runs = list_runs(root)
    if not runs:
        echo(f"no runs under {root or runs_root()}")
        return
    header: tuple[str, ...] = ("run", "state", "health", "step", "findings", "started", "command")
    rows: list[tuple[str, ...]] = []
    for path in runs:
        try:
            st = read_status(path)
        except UserError:
            st = {"state": "unreadable"}
        started = st.get("started")
        try:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if started else ""
        except (OverflowError, OSError, ValueError):  # a damaged status.json's time, past what a clock holds
            when = "?"
        cmd = " ".join(st.get("command") or [])
        rows.append((path.name, shown_state(st), st.get("health", ""), str(st.get("step", "")),
                     finding_counts(st.get("findings")), when, job_of(st), cmd))
    header = header[:-1] + ("job", header[-1])
    if not any(r[-2] for r in rows):  # no run under a job scheduler: no job column
        header = header[:-2] + header[-1:]
        rows = [r[:-2] + r[-1:] for r in rows]
    if not sys.stdout.isatty():
        # Piped or redirected: every name whole (a script greps it, or passes it to `status`), no cut.
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
        for r in [header, *rows]:
            echo("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1])
        return
    table = Table(box=None)
    for col in header:
        table.add_column(col, no_wrap=col == "run")
    for r in rows:
        table.add_row(*r[:-1], r[-1][:50])
    Console(width=max(100, Console().width)).print(table)


def job_of(st: Any) -> str:
    """`ls`'s job column: the scheduler's job ("slurm 4182", "+1" per requeue, how the scheduler ended it)."""
    sched = st.get("scheduler") if isinstance(st, dict) else None
    if not isinstance(sched, dict) or not sched.get("job_id"):
        return ""
    text = f"{sched.get('name', 'job')} {sched['job_id']}"
    if isinstance(sched.get("restarts"), int) and sched["restarts"] > 0:
        text += f" +{sched['restarts']}"
    if sched.get("ended_by"):
        text += f" ({sched['ended_by']})"
    return str(text)


def finding_counts(findings: Any) -> str:
    """`ls`'s findings column: open errors and warnings apart, then those acknowledged ("2E 1W 1ack"), blank
    when there are none. An acknowledged error is not counted as an error: the health beside it says ok."""
    found = [f for f in findings or [] if isinstance(f, dict)]
    errors = sum(f.get("severity") == "error" and not f.get("acked") for f in found)
    warnings = sum(f.get("severity") == "warning" and not f.get("acked") for f in found)
    acked = sum(bool(f.get("acked")) for f in found)
    return " ".join(p for p in (f"{errors}E" if errors else "", f"{warnings}W" if warnings else "",
                                f"{acked}ack" if acked else "") if p)
