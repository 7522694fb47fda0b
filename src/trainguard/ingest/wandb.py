"""A Weights & Biases run folder (`wandb/run-<date>-<id>/`, `wandb/latest-run/`), as its contract says.

`files/output.log` is the console: it is read by the text-log reader (its metrics, its traceback). The
summary (`files/wandb-summary.json`: each key's last value, `_step`, `_runtime`) and the config
(`files/config.yaml`: `epochs`, `num_epochs`... under `value:`) add what the console may not show: where
the run got to against its plan. The summary is rewritten while the run goes on, so it never proves an
end by itself; a summary with no metric at all is a run that never logged one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.ingest.events import Facts, Source, metrics_to_events, to_number
from trainguard.untrusted import load_json

MAX_SUMMARY_BYTES = 16 << 20
FORMAT = "wandb run folder"


def run_folder(p: Path) -> Path | None:
    """The run folder `p` is, or holds (`wandb/` with `latest-run` or `run-*`), if any."""
    def is_run(q: Path) -> bool:
        return (q / "files" / "wandb-summary.json").is_file() or (q / "files" / "output.log").is_file()

    if is_run(p):
        return p
    if p.name == "files" and is_run(p.parent):
        return p.parent
    base = p / "wandb" if (p / "wandb").is_dir() else p
    if is_run(base / "latest-run"):
        return base / "latest-run"
    try:
        runs = sorted(q for q in base.iterdir() if q.name.startswith(("run-", "offline-run-")) and is_run(q))
    except OSError:
        return None
    return runs[-1] if runs else None  # run-YYYYMMDD_HHMMSS-<id>: the name sorts by start time


def read_run(folder: Path) -> Source:
    from trainguard.ingest import formats, textlog
    from trainguard.ingest.plans import read_plan

    contract = formats.contract(FORMAT)
    files = folder / "files"
    summary = _summary(files / "wandb-summary.json")
    planned = read_plan(folder, contract)  # files/config.yaml: epochs / num_epochs ... under `value:`
    log = files / "output.log"
    if log.is_file() and not log.is_symlink():
        text = textlog.read_text_log(log)
        plan = {**text.plan, "parts_relation": "independent"}
        return Source(path=log, format=FORMAT, plan=plan, facts=text.facts, log_like=True,
                      events=_after_console(text.events, text.facts, summary, planned.length, planned.length_key))
    metrics = _metrics(summary)
    if not metrics:
        raise UserError(f"{folder}: a W&B run whose summary holds no metric ({', '.join(sorted(summary)) or 'empty'}) "
                        "and no output.log: the run never logged a training metric")
    facts = Facts(mtime=(files / "wandb-summary.json").stat().st_mtime)
    return Source(path=files / "wandb-summary.json", format=FORMAT, plan={"parts_relation": "independent"},
                  facts=facts, log_like=True,
                  events=_summary_events(summary, metrics, facts, planned.length, planned.length_key))


def _after_console(events: Iterator[dict[str, Any]], facts: Facts, summary: dict[str, Any], planned: int | None,
                   key: str | None) -> Iterator[dict[str, Any]]:
    last: int | None = None
    for event in events:
        if event.get("kind") == "step" and isinstance(event.get("step"), int):
            last = event["step"]
        yield event
    if facts.traceback is not None or facts.steps or facts.evals:
        _judge(summary, facts, planned, key, console=True, last_step=last)
        return
    # the console shows no metric the text reader knows: the summary's last values stand for the run
    metrics = _metrics(summary)
    if metrics:
        yield from _summary_events(summary, metrics, facts, planned, key)
    else:
        facts.ends_with = "unknown"


def _summary_events(summary: dict[str, Any], metrics: dict[str, float], facts: Facts, planned: int | None,
                    key: str | None) -> Iterator[dict[str, Any]]:
    step = to_number(summary.get("_step"))
    facts.lines += 1
    yield from metrics_to_events(int(step) if step is not None and 0 <= step < 1e15 else 0, metrics, facts)
    _judge(summary, facts, planned, key, console=False)


# the summary's keys that hold the step a loop reached (nanoGPT logs `iter`; the HF integration `train/global_step`)
SUMMARY_STEPS = ("iter", "step", "global_step", "train/global_step", "iteration")


def _judge(summary: dict[str, Any], facts: Facts, planned: int | None, key: str | None, *, console: bool,
           last_step: int | None = None) -> None:
    """The summary's `epoch` against the config's planned epochs, or the last step against its planned steps;
    silent when either is missing."""
    if planned and key and "epoch" not in key and facts.traceback is None:
        reached = last_step if last_step is not None else next(
            (int(v) for k in SUMMARY_STEPS if (v := to_number(summary.get(k))) is not None and 0 <= v < 1e15), None)
        if reached is not None:
            if reached + 1 >= planned:  # a loop over range(N) logs N - 1 last; nanoGPT's `iter_num > max_iters` N
                facts.completed = facts.completed or f"step {reached} reaches the {key} {planned} of config.yaml"
            elif not console or facts.completed is None:
                facts.ends_with = "step"
                facts.last_line = f"the run stops at step {reached} of the {key} {planned} config.yaml plans"
            return
    epoch = to_number(summary.get("epoch"))
    if planned and key and "epoch" in key and epoch is not None and epoch == epoch:
        if epoch >= planned or (epoch + 1 >= planned and _counts_from_zero(summary)):
            facts.completed = facts.completed or f"the W&B summary's epoch {epoch:g} reaches the {planned} epochs of config.yaml"
            return
        if not console or facts.completed is None:
            facts.ends_with = "step"
            facts.last_line = f"the W&B summary stops at epoch {epoch:g} of the {planned} epochs config.yaml plans"
            return
    if not console:
        facts.ends_with = "unknown"  # a summary alone says where the run was, not whether it was meant to end there


def _counts_from_zero(summary: dict[str, Any]) -> bool:
    epochs = summary.get("Epochs")
    return isinstance(epochs, list) and bool(epochs) and epochs[0] == 0


def _summary(path: Path) -> dict[str, Any]:
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_SUMMARY_BYTES:
            return {}
        data = load_json(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers that are metrics: not W&B's own `_step`/`_runtime`, not counts of the model."""
    out = {}
    for k, v in summary.items():
        if str(k).startswith("_") or str(k).lower() in ("epoch", "parameter_count", "params", "computation_count"):
            continue
        n = to_number(v) if not isinstance(v, (dict, list, str)) else None
        if n is not None:
            out[str(k)] = n
    return out
