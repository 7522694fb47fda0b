"""`trainguard check CONFIG`: what is wrong with a training config, before anything runs.

    trainguard check configs/train.yaml --dataset-size 400000
    trainguard check configs/train.json --fix --output configs/train.fixed.json

The plan is computed the way Hugging Face's Trainer does it: micro-batches per epoch =
ceil(samples / (batch size × devices)), optimizer steps per epoch = that // gradient accumulation (at
least 1), optimizer steps = max_steps when set, else steps per epoch × epochs. Every finding is in
optimizer steps. `--fix` writes a corrected copy (never the input) and explains each change; what it
cannot decide for the user (an implausible LR) stays a finding.

The plan is preflight/plan.py, the rules (TG611-TG619) preflight/configrules.py; here they are run, the
config is fixed, and the command prints what they found.
"""

from __future__ import annotations

import copy
import difflib
import math
from dataclasses import dataclass
from typing import Any

from trainguard.findings import Finding
from trainguard.preflight.config import Config, dump, set_dotted
from trainguard.preflight.configrules import (
    INTERVAL_DOMINATES_RUN,
    INTERVAL_EXCEEDS_RUN,
    MAX_STEPS_COUNTS_MICRO_BATCHES,
    MIN_INTERVAL,
    PATIENCE_SHARE,
    PATIENCE_TOO_SHORT,
    SCHEDULE_IGNORES_ACCUMULATION,
    SCHEDULE_LENGTH_MISMATCH,
    WARMUP_EXCEEDS_RUN,
    WARMUP_IGNORED,
    implausible,
    intervals,
    max_steps_counts_micro,
    patience,
    schedule_length,
    warmup,
    warmup_ignored,
)
from trainguard.preflight.plan import Plan, interval, plan_of

# -------------------------------------------------------------------------------------------------
# the checks (preflight/configrules.py), against the plan (preflight/plan.py)


def check(cfg: Config) -> tuple[Plan, list[Finding]]:
    plan = plan_of(cfg)
    out = implausible(cfg) + warmup_ignored(cfg) + max_steps_counts_micro(cfg, plan)
    steps = plan.optimizer_steps
    if steps:
        out += schedule_length(cfg, plan) + warmup(cfg, steps) + intervals(cfg, steps) + patience(cfg, steps)
    return plan, out


# -------------------------------------------------------------------------------------------------
# --fix


@dataclass
class Change:
    key: str
    old: Any
    new: Any
    why: str


def fix(cfg: Config, plan: Plan, findings: list[Finding]) -> tuple[dict[str, Any], list[Change]]:
    """A corrected copy of the config's data and the changes made, each with its reason."""
    data = copy.deepcopy(cfg.data)
    changes: list[Change] = []
    steps = plan.optimizer_steps
    names = {f.name for f in findings if f.severity in ("error", "warning")}
    g = cfg.get

    def change(name: str, new: Any, why: str) -> None:
        key = cfg.where[name]
        set_dotted(data, key, new)
        changes.append(Change(key, g(name), new, why))

    if WARMUP_IGNORED.name in names:
        change("scheduler", "constant_with_warmup", "the configured warmup only happens with a warmup schedule")
    if not steps:
        return data, changes
    if MAX_STEPS_COUNTS_MICRO_BATCHES.name in names and plan.micro_key:
        change(plan.micro_key, steps, f"the run makes {steps} optimizer steps ({plan.how}); max_steps counts"
                                   " optimizer steps, not micro-batches")
    old_sched = g("sched_steps")
    if names & {SCHEDULE_IGNORES_ACCUMULATION.name, SCHEDULE_LENGTH_MISMATCH.name} and old_sched \
            and plan.micro_key != "sched_steps":
        change("sched_steps", steps, f"the run makes {steps} optimizer steps ({plan.how}); the scheduler is"
                                     " stepped once per optimizer step")
    if WARMUP_EXCEEDS_RUN.name in names:
        share = 0.1
        if not old_sched and plan.max_steps_in_micro:
            old_sched = g("max_steps")  # the length the warmup was a share of
        if old_sched and g("warmup_steps") and g("warmup_steps") < 0.5 * old_sched:
            share = g("warmup_steps") / old_sched  # keep the share of the schedule the warmup was meant to be
        if g("warmup_steps"):
            change("warmup_steps", max(1, round(share * steps)),
                   f"{share:.0%} of the run's {steps} optimizer steps" + (
                       f", the share of the schedule it had ({g('warmup_steps')} of {old_sched})" if share != 0.1 else ""))
        else:
            change("warmup_ratio", 0.1, "10% of the run")
    new_eval = interval(cfg, "eval_steps", steps)
    for f in findings:
        if f.name not in (INTERVAL_EXCEEDS_RUN.name, INTERVAL_DOMINATES_RUN.name):
            continue
        name = "eval_steps" if cfg.where.get("eval_steps") in f.evidence else "save_steps"
        every = max(1, steps // 10) if f.name == INTERVAL_EXCEEDS_RUN.name else max(MIN_INTERVAL, steps // 10)
        if name == "save_steps" and new_eval and "eval_steps" not in {c.key for c in changes}:
            every = new_eval if new_eval <= steps else every
        change(name, every, f"{'eval' if name == 'eval_steps' else 'save'} about 10 times in {steps} steps")
        if name == "eval_steps":
            new_eval = every
    for f in findings:
        if f.name == PATIENCE_TOO_SHORT.name and new_eval:
            ramp = f.evidence.get("curriculum_ramp_steps")
            if ramp:
                new = math.ceil(ramp / new_eval) + g("patience")
                why = f"covers the curriculum's {ramp}-step ramp plus the original patience of {g('patience')}"
            else:
                new = math.ceil(PATIENCE_SHARE * steps / new_eval)
                why = f"covers {PATIENCE_SHARE:.0%} of the run"
            if new > g("patience"):
                change("patience", new, why)
    return data, changes


def diff_lines(cfg: Config, data: dict[str, Any], output: str) -> list[str]:
    before = dump(cfg.data, cfg.fmt).splitlines(keepends=True)
    after = dump(data, cfg.fmt).splitlines(keepends=True)
    return [ln.rstrip("\n") for ln in difflib.unified_diff(before, after, str(cfg.path), output)]


# -------------------------------------------------------------------------------------------------
# the command


def run_check(path: str, *, dataset_size: int | None, do_fix: bool, output: str | None,
              as_json: bool, echo: Any = print) -> int:
    """`trainguard check`: prints the plan and the findings; with --fix writes OUTPUT and checks it.

    Exit code: 0 when the config (with --fix: the corrected one) has no error finding, 1 otherwise.
    """
    import json
    from pathlib import Path

    from trainguard.errors import UserError
    from trainguard.findings import most_severe_first
    from trainguard.preflight.config import load_config

    if do_fix and not output:
        raise UserError("--fix needs --output NEW: the corrected config is written there, never over the input")
    if output and Path(output).resolve() == Path(path).resolve():
        raise UserError("--output must not be the input config: trainguard never rewrites your config")
    cfg = load_config(path, dataset_size=dataset_size)
    plan, findings = check(cfg)
    findings = most_severe_first(findings)
    _print_report(echo, cfg, plan, findings)
    report: dict[str, Any] = {"config": str(cfg.path), "plan": plan.__dict__,
                              "findings": [f.to_dict() for f in findings]}
    verdict = findings
    if do_fix and output:  # (a --fix without --output was refused above)
        data, changes = fix(cfg, plan, findings)
        out = Path(output)
        fmt = "json" if out.suffix.lower() == ".json" else "yaml"
        if fmt == "yaml" and cfg.fmt == "yaml":
            # YAML to YAML: the file's own text changed in place, its comments and layout kept
            from trainguard.preflight.yamlfix import rewrite

            before = cfg.path.read_text(encoding="utf-8")
            text = rewrite(before, [(c.key, c.new) for c in changes])
            diff = [ln.rstrip("\n") for ln in difflib.unified_diff(
                before.splitlines(keepends=True), text.splitlines(keepends=True), str(cfg.path), str(out))]
        else:
            text, diff = dump(data, fmt), diff_lines(cfg, data, str(out))
        try:
            out.write_text(text)
        except OSError as exc:
            raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
        for line in diff:
            echo(line)
        for c in changes:
            echo(f"fixed {c.key}: {c.old!r} -> {c.new!r}: {c.why}")
        fixed_cfg = load_config(out, dataset_size=dataset_size)
        fixed_plan, verdict = check(fixed_cfg)
        verdict = most_severe_first(verdict)
        echo(f"trainguard check: {out} (corrected): " + _counts(verdict))
        for f in verdict:
            echo(f"  {f.one_line()}")
        report["fixed"] = {"output": str(out), "changes": [c.__dict__ for c in changes],
                           "findings": [f.to_dict() for f in verdict]}
    failed = any(f.severity == "error" for f in verdict)
    report["state"] = "failed" if failed else "passed"
    severities = {f.severity for f in verdict}
    report["health"] = "error" if failed else "warning" if "warning" in severities else "ok"
    if as_json:
        echo(json.dumps(report, default=str))
    return 1 if failed else 0


def _counts(findings: list[Finding]) -> str:
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    return f"{errors} error(s), {warnings} warning(s)" if findings else "no findings"


def _print_report(echo: Any, cfg: Config, plan: Plan, findings: list[Finding]) -> None:
    unchecked = f" ({len(plan.unchecked)} check(s) not run)" if plan.unchecked else ""
    echo(f"trainguard check: {cfg.path}: {_counts(findings)}{unchecked}")
    if plan.optimizer_steps:
        echo(f"  plan: {plan.optimizer_steps} optimizer steps ({plan.how})")
    for note in plan.notes:
        echo(f"  note: {note}")
    for what in plan.unchecked:
        echo(f"  not checked: {what}")
    for f in findings:
        echo(f"  {f.one_line()}")
        if f.fix:
            echo(f"    fix: {f.fix}")
