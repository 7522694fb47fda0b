"""What a message says: one finding, or a run's end, with everything a person needs to act without
opening a terminal first: the state, the step, the cause, where, the fix, the host and the run folder.

    {"event": "finding", "title": "trainguard: train-0412 TG301 nonfinite-loss at step 37 on gpu-a",
     "state": "running", "step": 37, "code": "TG301", "name": "nonfinite-loss", "severity": "error",
     "summary": "...", "cause": null, "cause_label": null, "where": "train.py:88", "fix": "...", "rank": null,
     "host": "gpu-a", "run_dir": "/data/runs/train-0412", "text": "the same, as lines a person reads"}

The JSON body of a webhook is this dict; Slack gets `text`; an e-mail has `title` as its subject and
`text` as its body; an exec: hook gets the JSON on stdin.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from trainguard.untrusted import printable

MAX_FIELD = 2000  # characters of any one text field: a finding's summary quotes exception messages


def finding_message(finding: dict[str, Any], *, run_dir: Path, state: str) -> dict[str, Any]:
    step = finding.get("step")
    rank = _rank(finding)
    at = f" at step {step}" if step is not None else ""
    on = f" (rank {rank})" if rank is not None else ""
    msg = _base("finding", run_dir, state, step)
    msg.update({k: _text(finding.get(k)) for k in ("code", "name", "severity", "summary", "where", "fix")})
    msg.update(_cause(finding))
    msg["rank"] = rank
    msg["title"] = f"trainguard: {run_dir.name} {finding.get('code')} {finding.get('name')}{at}{on} on {msg['host']}"
    msg["text"] = _lines(msg, head=f"{finding.get('code')} {finding.get('name')} [{finding.get('severity')}]{at}{on}: "
                                   f"{msg['summary']}")
    return msg


def end_message(status: dict[str, Any], *, run_dir: Path, held_back: int = 0) -> dict[str, Any]:
    """The run's true final state, its health and the findings that make it (acknowledged ones apart)."""
    state = str(status.get("state") or "unknown")
    step = status.get("step")
    msg = _base("end", run_dir, state, step)
    findings = [f for f in status.get("findings") or [] if isinstance(f, dict)]
    # the most severe open finding first (an error before the warning it grew from), then the earliest
    open_ = sorted((f for f in findings if not f.get("acked") and f.get("severity") in ("error", "warning")),
                   key=lambda f: (f.get("severity") != "error", f["step"] if isinstance(f.get("step"), int) else -1))
    first = open_[0] if open_ else {}
    msg.update({"health": status.get("health"), "exit_code": status.get("exit_code"), "signal": status.get("signal"),
                "code": first.get("code"), "name": first.get("name"), "severity": first.get("severity"),
                "summary": _text(first.get("summary")), **_cause(first),
                "where": _text(first.get("where")), "fix": _text(first.get("fix")), "rank": _rank(first),
                "findings": [f"{f.get('code')} {f.get('name')} [{f.get('severity')}]" for f in open_][:20],
                "acknowledged": [f"{f.get('code')} {f.get('name')}" for f in findings if f.get("acked")],
                "held_back": held_back})
    how = (f" ({status['signal']})" if status.get("signal") else
           f" (exit code {status['exit_code']})" if status.get("exit_code") not in (None, 0) else "")
    at = f" at step {step}" if step is not None else ""
    msg["title"] = f"trainguard: {run_dir.name} {state}{how}{at}, health {status.get('health')} on {msg['host']}"
    head = f"run {state}{how}{at}; health {status.get('health')}"
    if first:
        head += (f"; the most severe of {len(open_)} open finding(s): {first.get('code')} {first.get('name')} "
                 f"[{first.get('severity')}]: {msg['summary']}")
    if held_back:
        head += f"; {held_back} message(s) held back by the rate limit"
    msg["text"] = _lines(msg, head=head)
    return msg


def _base(event: str, run_dir: Path, state: str, step: Any) -> dict[str, Any]:
    return {"event": event, "state": state, "step": step if isinstance(step, int) else None,
            "host": platform.node(), "run_dir": str(Path(run_dir).resolve())}


def _lines(msg: dict[str, Any], head: str) -> str:
    lines = [f"trainguard: {head}"]
    if msg.get("cause"):
        lines.append(f"cause: {msg['cause']}")
    if msg.get("where"):
        lines.append(f"where: {msg['where']}")
    if msg.get("fix"):
        lines.append(f"fix: {msg['fix']}")
    lines.append(f"host: {msg['host']}  run folder: {msg['run_dir']}")
    return "\n".join(lines)


# A finding's `cause` is a short label (rules/, watchdog/classify.py): most read as words once their dashes
# are spaces ("dataloader-worker"); these few say nothing alone, so a person gets their meaning.
CAUSE_WORDS = {
    "rate": "non-finite values at more than 1% of the steps: no longer an accident",
    "zeroed": "a loss part clamped to exactly 0 (a non-finite value hidden?)",
    "eval": "a non-finite evaluation loss",
}


def _cause(finding: dict[str, Any]) -> dict[str, str | None]:
    """`cause`: what a person reads; `cause_label`: the rule's own label, for a program to match on."""
    label = finding.get("cause")
    if not isinstance(label, str) or not label:
        return {"cause": None, "cause_label": None}
    return {"cause": _text(CAUSE_WORDS.get(label, label.replace("-", " "))), "cause_label": _text(label)}


def _rank(finding: dict[str, Any]) -> int | None:
    """The rank a finding names as its origin (a crash's first failing rank, a hang's blamed one)."""
    ev = finding.get("evidence") if isinstance(finding.get("evidence"), dict) else {}
    for key in ("rank", "origin_rank", "blamed_rank"):
        value = ev.get(key) if ev else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    ranks = ev.get("origin_ranks") if ev else None
    if isinstance(ranks, list) and ranks and isinstance(ranks[0], int):
        return ranks[0]
    return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return printable(str(value))[:MAX_FIELD]
