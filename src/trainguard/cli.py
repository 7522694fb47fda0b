"""The `trainguard` command line.

    trainguard run [--run-dir DIR] [--stall-timeout S] [--expect PATH ...] -- CMD ...
    trainguard status [RUN]          trainguard ls
    trainguard rules [CODE-or-NAME]  trainguard demo
    trainguard report [RUN] [--print]  trainguard compare RUN_A RUN_B [--out DIR]
    trainguard export [RUN] --sink tensorboard|wandb|mlflow|prometheus[=VALUE]
    trainguard ack RUN CODE [--why TEXT]

Bad input (an unknown run, a command that does not exist, an unwritable folder, a mistyped option) is
one line on stderr and exit code 2, never a traceback. Heavy modules are imported inside the command that needs them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from trainguard import __version__
from trainguard.contract import ENV_AUTO, ENV_DEBUG, ENV_NOTIFY, ENV_NOTIFY_END, ENV_SINKS
from trainguard.errors import UserError
from trainguard.untrusted import printable


def echo(message: Any = "", err: bool = False) -> None:
    """click.echo with control characters neutralised: what trainguard prints quotes exception messages,
    phase names and paths from the run, and none of them may drive the reader's terminal."""
    click.echo(printable(message), err=err)


def _interrupted_guards() -> None:
    crashhook = sys.modules.get("trainguard.probe.crashhook")  # only where a guard was made in this process
    if crashhook is not None:
        crashhook.interrupted()


class _Group(click.Group):
    """Turns UserError into one line and exit 2; an internal error into one line and exit 70."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            echo(f"trainguard: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except click.UsageError as exc:
            # click's own form is three lines (usage, a hint, the error): bad input is one line here.
            where = exc.ctx.command_path if exc.ctx is not None else "trainguard"
            message = " ".join(exc.format_message().split())
            echo(f"trainguard: error: {message} (see {where} --help)", err=True)
            ctx.exit(exc.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except BrokenPipeError:
            # `trainguard rules | head`: the reader left; say nothing more (stdout is gone).
            try:
                sys.stdout = open(os.devnull, "w")
            except OSError:
                pass
            ctx.exit(0)
        except KeyboardInterrupt:
            _interrupted_guards()  # a guard of this process (the distillation recipe's) says it was interrupted
            echo("trainguard: interrupted", err=True)
            ctx.exit(130)
        except Exception as exc:
            if os.environ.get(ENV_DEBUG):
                raise
            echo(f"trainguard: internal error: {type(exc).__name__}: {exc} ({ENV_DEBUG}=1 shows the traceback)",
                       err=True)
            ctx.exit(70)


class _WrapsCommand(click.Command):
    """`run` and `preflight`: their arguments are another command line, passed through untouched.

    So that the wrapped command's own options reach it, click is told to leave unknown options alone,
    which would make a typo in one of ours (`--stall-timout 5`) the command to run. Ours come first, so
    a wrapped command that starts with an option is a typo: it is answered as click answers any unknown
    option, with the closest of ours.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        wrapped = ctx.params.get("command") or ()
        if wrapped and wrapped[0].startswith("-") and wrapped[0] != "-":
            import difflib

            name = wrapped[0].split("=", 1)[0]
            ours = [opt for param in self.get_params(ctx) for opt in param.opts
                    if opt.startswith("--") and opt != "--help"]
            raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(name, ours), ctx=ctx)
        return rest


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainguard")
def main() -> None:
    """trainguard keeps deep-learning training runs honest."""


def _run_help() -> str:
    from trainguard.exitcodes import run_help

    return ("Run COMMAND under the watchdog and tell its true final state.\n\n"
            "Exit codes (docs/exit-codes.md):\n\n\b\n" + run_help())


@main.command(cls=_WrapsCommand, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
              help=_run_help())
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run folder (default: a new one under ./trainguard-runs).")
@click.option("--stall-timeout", type=float, default=None,
              help="Seconds without progress before a stall is reported, with stacks and cause (default: "
                   "learned from the run itself, at least 60; 300 until the first optimizer step).")
@click.option("--hang-limit", "hang_limits", multiple=True, metavar="[PHASE=]SECONDS",
              help="Stop a stall that lasts this long even without proof that it is stuck (repeatable; "
                   "PHASE=SECONDS for one phase, 'startup' for the time before the first optimizer step). "
                   "Default: 5x the phase's own longest (at least 600 s); 1800 s for a phase never seen.")
@click.option("--expect", "expects", multiple=True, metavar="PATH",
              help="An artifact the command must write during the run (repeatable); missing or stale = failed.")
@click.option("--stop-on", default="", metavar="CODE-or-NAME,...",
              help="Stop the run when one of these findings appears (rule codes like TG101 or names like "
                   "lr-reaches-zero; see `trainguard rules`).")
@click.option("--fail-on", type=click.Choice(["error", "warning", "never"]), default="error", show_default=True,
              help="Exit 122 when the run completed but has unacknowledged findings of this severity or worse "
                   "(its health in status.json); 'never': the command's own exit code.")
@click.option("--on-hang", type=click.Choice(["kill", "wait", "restart"]), default="kill", show_default=True,
              help="What to do when a hang is proven (or a stall outlasts its limit): stop it, leave it alive "
                   "for inspection, or stop it and start it again from the newest reported checkpoint.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=3, show_default=True,
              help="With --on-hang restart: restarts at most (0 = never); a hang that repeats at the same "
                   "place stops restarting sooner.")
@click.option("--quiet", is_flag=True, help="Do not echo the command's output (it still goes to output.log).")
@click.option("--no-auto", is_flag=True,
              help="No automatic probe in the command's Python processes (stacks on a signal, torch's optimizer "
                   f"hooks); also {ENV_AUTO}=0.")
@click.option("--sink", "sinks", multiple=True, metavar="NAME[=VALUE]",
              help="Copy steps and findings to tensorboard, wandb, mlflow or prometheus as the run goes "
                   f"(repeatable; also {ENV_SINKS}=name,...). See `trainguard export --help`.")
@click.option("--notify", "notify", multiple=True, metavar="URL",
              help="Tell a person: https://... (a JSON POST), slack+https://... (or any hooks.slack.com URL), "
                   "mailto:ADDR (SMTP from TRAINGUARD_SMTP_*), exec:COMMAND (repeatable; also "
                   f"{ENV_NOTIFY}: targets separated by commas or spaces). Sent for a stall, a hang, a crash, a "
                   "kill, each error finding and a bad end; see docs/notify.md.")
@click.option("--notify-end", is_flag=True,
              help="Also send the end message of a run that completed healthy (a bad end is always sent).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run(run_dir: str | None, stall_timeout: float | None, hang_limits: tuple[str, ...], expects: tuple[str, ...],
        stop_on: str, fail_on: str, on_hang: str, max_restarts: int, quiet: bool, no_auto: bool,
        sinks: tuple[str, ...], notify: tuple[str, ...], notify_end: bool,
        command: tuple[str, ...]) -> None:
    from trainguard.watchdog.stop import parse_hang_limits
    from trainguard.watchdog.supervisor import RunOptions, Supervisor

    targets = _notify_targets(notify)
    options = RunOptions(
        command=list(command), run_dir=run_dir, stall_timeout=stall_timeout,
        hang_limits=parse_hang_limits(hang_limits), expects=list(expects),
        stop_on=_stop_on(stop_on), fail_on=fail_on, on_hang=on_hang, max_restarts=max_restarts,
        echo=not quiet, env=_auto_env(no_auto), notify=[t.shown for t in targets],
    )
    specs = _sink_specs(sinks)
    sup = Supervisor(options, monitors=_default_monitors(), report=_write_report)
    if not specs and not targets:
        sys.exit(sup.run())
    from trainguard.sinks.feed import LiveFeed

    extra: dict[str, Any] = {}
    if targets:
        from trainguard.notify.notifier import Notifier

        end = notify_end or os.environ.get(ENV_NOTIFY_END, "") == "1"
        from trainguard.watchdog.stall import RUN_STALLED

        extra["notify"] = Notifier(sup.run_dir, targets, notify_end=end, also=(RUN_STALLED.name,))
    feed = LiveFeed(sup.run_dir, specs, extra=extra).start()
    try:
        code = sup.run()
    except BaseException:
        feed.stop(wait=5)  # interrupted, or the watchdog failed: a short last pass, then out
        raise
    feed.stop()  # the last pass and the final state; bounded, and a sink's failure never changes `code`
    for name, why in feed.feed.failed.items():
        echo(f"trainguard: sink {name} was switched off: {why} (the run is unaffected)", err=True)
    for shown, why in getattr(extra.get("notify"), "failed", {}).items():
        echo(f"trainguard: notify {shown}: {why} (the run is unaffected; see guard.log)", err=True)
    sys.exit(code)


def _notify_targets(flags: tuple[str, ...]) -> list:
    from trainguard.notify.targets import parse_targets

    return parse_targets(flags)


def _sink_specs(flags: tuple[str, ...]) -> list:
    from trainguard.sinks import check_available, parse_specs

    specs = parse_specs(flags)
    check_available(specs)
    return specs


@main.command()
@click.argument("run", required=False)
@click.option("--sink", "sinks", multiple=True, metavar="NAME[=VALUE]",
              help="tensorboard[=LOGDIR], wandb[=PROJECT], mlflow[=URI[@EXPERIMENT]], prometheus[=FILE.prom|:PORT] "
                   f"(repeatable; also {ENV_SINKS}).")
def export(run: str | None, sinks: tuple[str, ...]) -> None:
    """Copy a stored run's steps, evaluations, findings and final state to the sinks (default: the newest run).

    tensorboard: event files in RUN/tensorboard (or LOGDIR/RUN_NAME); wandb: a W&B run (WANDB_MODE and
    WANDB_PROJECT apply), findings as alerts and in the summary; mlflow: a run in the experiment
    `trainguard` (MLFLOW_TRACKING_URI, else ./mlruns); prometheus: RUN/metrics.prom or an endpoint on :PORT.
    Exit codes: 0, 1 when a sink failed (the reason is in RUN/guard.log), 2 bad input.
    """
    from trainguard.sinks.feed import feed_once
    from trainguard.store.paths import resolve_run

    specs = _sink_specs(sinks)
    if not specs:
        raise UserError(f"no sink named: --sink tensorboard|wandb|mlflow|prometheus (or {ENV_SINKS})")
    path = resolve_run(run)
    held = feed_once(path, specs)
    for spec in specs:
        echo(f"{spec.name}: {'written' if spec.name in held else 'failed (see ' + str(path / 'guard.log') + ')'}")
    sys.exit(0 if len(held) == len(specs) else 1)


def _stop_on(text: str) -> list[str]:
    """--stop-on's rule codes or names, as the names findings carry; an unknown one is bad input (exit 2)."""
    from trainguard.catalog import lookup

    return [lookup(item).name for item in (s.strip() for s in text.split(",")) if item]


def _auto_env(no_auto: bool) -> dict[str, str]:
    """The bootstrap of the automatic probe for every Python process of the command (probe/auto.py)."""
    from trainguard.probe.auto import bootstrap_env

    return {ENV_AUTO: "0"} if no_auto else bootstrap_env()


def _write_report(run_dir: Path) -> tuple[Path, Path]:
    """report.md and report.html of a run that ended (imported only then: it is the heaviest room)."""
    from trainguard.report import write_report

    return write_report(run_dir)


def _default_monitors() -> list:
    """Monitors every `trainguard run` gets. Each family that can watch a live run adds itself here."""
    from trainguard.rules.live import RulesMonitor
    from trainguard.watchdog.ckptwatch import CheckpointWatch
    from trainguard.watchdog.liveoutput import OutputRulesMonitor, output_rules_enabled

    # the checkpoint verification first: the verdicts it records are read by the rules in the same poll
    return [CheckpointWatch(), RulesMonitor()] + ([OutputRulesMonitor()] if output_rules_enabled() else [])


@main.command(cls=_WrapsCommand, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--run-dir", type=click.Path(file_okay=False), help="Preflight folder (default: a new one under ./trainguard-runs).")
@click.option("--steps", type=int, default=4, show_default=True,
              help="Real optimizer steps before every periodic path is brought forward (at least 2).")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds each start of the script may take before the preflight stops it.")
@click.option("--quiet", is_flag=True, help="Do not echo the script's output (it still goes to output.log).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def preflight(run_dir: str | None, steps: int, timeout: float, quiet: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND in fast-forward: its rare paths, epoch boundary, checkpoint round trip and LR schedule.

    The script runs unmodified in a scratch folder: a few real steps, then every guard.due() path once,
    the loader iterated again, a second brief start resuming from the checkpoint it saved, the LR schedule
    simulated for the whole plan. Exit codes: 0 no error finding, 1 error findings, 2 bad input, 3 the
    script could not be fast-forwarded (no trainguard.watch): a few steps were checked, the rest is listed.
    """
    from trainguard.preflight.run import PreflightOptions
    from trainguard.preflight.run import preflight as run_preflight

    sys.exit(run_preflight(PreflightOptions(command=list(command), run_dir=run_dir, steps=steps, timeout=timeout,
                                            echo=not quiet)))


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--dataset-size", type=int, default=None, metavar="N",
              help="Training samples (else the config's dataset_size); needed to compute the run's length.")
@click.option("--fix", "do_fix", is_flag=True, help="Write a corrected config to --output and explain each change.")
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="Where --fix writes (never the input).")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON line: state, plan and findings.")
def check(config: str, dataset_size: int | None, do_fix: bool, output: str | None, as_json: bool) -> None:
    """Check a training CONFIG (JSON or YAML; Hugging Face or common names) before it runs.

    Exit codes: 0 no error finding (with --fix: in the corrected config), 1 error findings, 2 bad input.
    """
    from trainguard.preflight.check import run_check

    sys.exit(run_check(config, dataset_size=dataset_size, do_fix=do_fix, output=output, as_json=as_json,
                       echo=echo))


@main.command()
@click.argument("path")
@click.option("--json", "as_json", is_flag=True,
              help="JSON: a run folder's findings as a list; anything else's diagnosis as one object on one line.")
@click.option("--alive", is_flag=True,
              help="Also ask whether the run may still be going, from when the log was last written (without it, "
                   "no verdict depends on the file's modification time).")
@click.option("--verbose", "-v", is_flag=True, help="List each rule that could not run and the data it lacked.")
def diagnose(path: str, as_json: bool, alive: bool, verbose: bool) -> None:
    """Diagnose a run: a trainguard run folder (the health rules over its store, by path or name), or a
    run nobody watched: a log, an output folder (Hugging Face, Lightning, Ultralytics), a metrics file
    (CSV, JSON Lines, trainer_state.json) or TensorBoard event files. A folder of several runs (runs/exp1,
    runs/exp2; lightning_logs/version_0..N) is diagnosed run by run, the worst first.

    A run folder's diagnosis starts with how the run ended and lists the findings recorded while it ran
    (a crash and its root cause, a hang) with what the rules find now, each once.

    Exit codes: 0 no error finding, 1 at least one error finding, 2 bad input.
    """
    from pathlib import Path

    from trainguard.ingest.diagnose import diagnose_path, render
    from trainguard.store.paths import is_run_dir, resolve_run

    target = Path(path) if Path(path).exists() else resolve_run(path)
    if target.is_dir() and is_run_dir(target):
        _diagnose_run_folder(target, as_json, alive, verbose)
    from trainguard.ingest import runs

    if target.is_dir():  # a folder of several runs (runs/exp1, runs/exp2; version_0..N): each on its own
        several = runs.run_folders(target)
        if several:
            sys.exit(runs.report(target, several, as_json, alive, echo))
    try:
        d = diagnose_path(target, alive=alive)
    except UserError:
        # `runs/` holding one run (`runs/exp/`): that run, as if it had been named
        one = runs.single_run(target) if target.is_dir() else None
        if one is None:
            raise
        d = diagnose_path(one, alive=alive)
    if as_json:
        echo(json.dumps(d.to_dict(), default=str))
    else:
        for line in render(d, verbose):
            echo(line)
    sys.exit(1 if any(f.severity == "error" for f in d.findings) else 0)


def _probe_recorded(run_dir: Any) -> bool:
    from trainguard.store.reader import RunReader

    with RunReader(run_dir) as reader:
        return reader.step_count() > 0


def _diagnose_run_folder(run_dir: Any, as_json: bool, alive: bool, verbose: bool = False) -> None:
    """A run folder: how it ended and what it recorded while it ran (a crash with its root cause, a hang),
    with what the health rules find over its store now (or, for a run without the probe, what the log readers
    find in its output.log); a finding both give is shown once, as recorded."""
    from trainguard.findings import escalations_merged, merged, most_severe_first
    from trainguard.ingest.diagnose import diagnose_path, limits
    from trainguard.ingest.signs import LOG_ENDS_UNFINISHED
    from trainguard.rules.crash import RUN_CRASHED
    from trainguard.rules.diagnose import diagnose_run
    from trainguard.store.reader import RunReader
    from trainguard.store.status import read_status

    extra: list[str] = []
    st = read_status(run_dir)
    ended = st.get("state") in ("completed", "failed", "crashed", "killed", "cut-off") or bool(st.get("ended"))
    from trainguard.folderio import regular_or_missing

    # (a link or a FIFO planted as output.log: UserError, one line; never followed)
    if _probe_recorded(run_dir) or not regular_or_missing(run_dir / "output.log", "output.log"):
        found = diagnose_run(run_dir)
    else:  # a run without the probe: its captured output is all there is to re-read
        d = diagnose_path(run_dir / "output.log", ended=f"status.json: {st['state']}" if ended else None, alive=alive)
        found, extra = d.findings, limits(d, verbose)
    if ended:
        # the watchdog saw the ending: its word on it stands (a log's last traceback may be only the
        # consequence of a stop, or of another rank's failure)
        found = [f for f in found if f.code not in (RUN_CRASHED.code, LOG_ENDS_UNFINISHED.code)]
    with RunReader(run_dir) as reader:
        findings = most_severe_first(merged(reader.run_findings(), found))
    if as_json:
        # a rule's warning and its escalation are one finding, as the text and status.json show it
        echo(json.dumps(escalations_merged([f.to_dict() for f in findings]), indent=2, default=str))
    else:
        shown: dict[str, Any] = dict(st) if st else {"state": "unknown (no status.json)"}
        shown["findings"] = escalations_merged([f.to_dict() for f in findings])
        from trainguard.report.runlist import print_status

        print_status(run_dir, shown, echo)
        for line in extra:
            echo(line)
    sys.exit(1 if any(f.severity == "error" for f in findings) else 0)


@main.command()
@click.argument("run", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print status.json as it is.")
def status(run: str | None, as_json: bool) -> None:
    """Print a run's state, step and findings (default: the newest run)."""
    from trainguard.store.paths import resolve_run
    from trainguard.store.status import read_status

    path = resolve_run(run)
    st = read_status(path)  # a live state whose owner is gone comes back as `abandoned` (store/owner.py)
    if not st:
        raise UserError(f"{path} has no status.json yet")
    if as_json:
        echo(json.dumps(st, indent=2))
        return
    from trainguard.report.runlist import print_status

    print_status(path, st, echo)


@main.command()
@click.argument("run")
@click.argument("code")
@click.option("--why", default=None, metavar="TEXT", help="Why it is harmless here (kept with who and when).")
def ack(run: str, code: str, why: str | None) -> None:
    """Acknowledge finding CODE (a rule code like TG522, or its name) in RUN, while it runs or after.

    The watchdog no longer stops the run on it (--stop-on) nor fails the exit code for it, notifiers send
    nothing more for it, and status, status.json, the report and the sinks show it as acknowledged.
    Recorded in RUN/acks.jsonl with who and when.
    """
    from trainguard.catalog import lookup
    from trainguard.store.acks import add_ack
    from trainguard.store.paths import resolve_run

    rule = lookup(code)  # an unknown code is bad input, naming the closest
    path = resolve_run(run)
    try:
        record = add_ack(path, rule.code, rule.name, why)
    except OSError as exc:
        raise UserError(f"cannot record the acknowledgement in {path}: {exc.strerror or exc}") from None
    echo(f"{path}: {rule.code} {rule.name} acknowledged by {record['by']}"
         + (f": {record['why']}" if record["why"] else ""))


@main.command("ls")
@click.option("--root", type=click.Path(file_okay=False), default=None, help="Runs root (default ./trainguard-runs).")
def ls_runs(root: str | None) -> None:
    """List runs with their state, steps and start time."""
    from trainguard.report.runlist import print_runs

    print_runs(root, echo)


@main.command()
@click.argument("rule", required=False)
@click.option("--json", "as_json", is_flag=True, help="The same fields as JSON.")
def rules(rule: str | None, as_json: bool) -> None:
    """List the rule catalogue, or explain one rule by CODE or NAME."""
    from trainguard.catalog import CATALOG, lookup

    if rule is None:
        if as_json:
            echo(json.dumps([{"code": e.code, "name": e.name, "family": e.family, "severity": e.severity,
                                    "status": e.status, "summary": e.headline()} for e in CATALOG], indent=2))
            return
        for e in CATALOG:
            echo(f"{e.code}  {e.name:<28} {e.severity:<8} {e.family}")
        return
    e = lookup(rule)
    if as_json:
        echo(json.dumps({"code": e.code, "name": e.name, "family": e.family, "severity": e.severity,
                               "status": e.status, "since": e.since, "summary": e.headline(), "doc": e.doc()},
                              indent=2))
        return
    echo(f"{e.name} ({e.code})")
    echo(f"Family: {e.family}. Severity: {e.severity}. Status: {e.status} since {e.since}.")
    echo("")
    echo(e.headline())
    echo("")
    echo(e.doc())


@main.command()
@click.argument("run", required=False)
@click.option("--print", "to_terminal", is_flag=True, help="Also render the Markdown report in the terminal.")
def report(run: str | None, to_terminal: bool) -> None:
    """Write report.md and report.html into a run folder (default: the newest run)."""
    from trainguard.report import write_report
    from trainguard.store.paths import resolve_run

    md_path, html_path = write_report(resolve_run(run))
    if to_terminal:
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(printable(md_path.read_text(encoding="utf-8", errors="replace"))))
    echo(f"report: {html_path}")
    echo(f"report: {md_path}")


@main.command()
@click.argument("run_a")
@click.argument("run_b")
@click.option("--out", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Folder for comparison.json, comparison.md and comparison.html.")
@click.option("--warmup", type=int, default=None,
              help="Steps left out of the speed figures at the start of each run (default: 5%, at least 3).")
@click.option("--min-speedup", type=float, default=None, metavar="X",
              help="Exit 1 unless B is surely at least X times faster (the 95% interval's low end >= X).")
@click.option("--same-convergence", is_flag=True, help="Exit 1 unless convergence matches.")
@click.option("--repeat-a", "repeats_a", multiple=True, metavar="RUN",
              help="Another run of A's configuration (repeatable): the repeats' spread is the run-to-run variation.")
@click.option("--repeat-b", "repeats_b", multiple=True, metavar="RUN", help="Another run of B's configuration (repeatable).")
@click.option("--run-noise", type=float, default=None, metavar="FRACTION",
              help="The run-to-run variation of a run's median step time, as a relative sd measured before (0.05 = "
                   "5%), when there are no repeats. Without repeats or this, --min-speedup refuses to decide.")
def compare(run_a: str, run_b: str, out: str, warmup: int | None, min_speedup: float | None,
            same_convergence: bool, repeats_a: tuple[str, ...], repeats_b: tuple[str, ...],
            run_noise: float | None) -> None:
    """Compare RUN_B against RUN_A (the baseline): speed, convergence, findings.

    Exit codes: 0, or 1 when --min-speedup or --same-convergence is not met (with one run each and neither
    repeats nor --run-noise, --min-speedup cannot be decided: not met); 2 bad input.
    """
    from trainguard.report.compare import unmet, write_comparison
    from trainguard.store.paths import prepare_run_dir, resolve_run

    if warmup is not None and warmup < 0:
        raise UserError(f"--warmup must be 0 or more steps, got {warmup}")
    if run_noise is not None and not 0 <= run_noise < 1:
        raise UserError(f"--run-noise is a relative sd in [0, 1) (0.05 = 5%), got {run_noise}")
    paths, result = write_comparison(resolve_run(run_a), resolve_run(run_b), prepare_run_dir(out), warmup=warmup,
                                     repeats_a=[resolve_run(r) for r in repeats_a],
                                     repeats_b=[resolve_run(r) for r in repeats_b], run_noise=run_noise)
    echo(result["headline"])
    for p in paths:
        echo(f"comparison: {p}")
    problems = unmet(result, min_speedup=min_speedup, same_convergence=same_convergence)
    for text in problems:
        echo(f"compare: not met: {text}", err=True)
    if problems:
        sys.exit(1)


@main.command()
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="Folder for the demo's runs and scripts (default ./trainguard-runs).")
def demo(root: str | None) -> None:
    """Three short runs on the CPU under the watchdog: a healthy one and two of the seeds' failures caught.

    Exit codes: 0 when each run ended as the demo expects (healthy: completed and quiet; the failures:
    found), else 1.
    """
    from pathlib import Path

    from trainguard.demo.tour import run_tour

    sys.exit(run_tour(Path(root) if root else None))


def _add_recipes() -> None:
    # The recipe's command module is light (click only); it loads torch and transformers when it runs.
    from trainguard.recipes.distill.command import distill_command

    main.add_command(distill_command)


_add_recipes()

if __name__ == "__main__":
    main()
