"""A folder that holds several runs (`runs/` with `exp1/`, `exp2/`; `lightning_logs/version_0..N`): each
run found and diagnosed on its own, the worst first.

    trainguard diagnose runs/            one section per run, the worst state first
    trainguard diagnose runs/ --json     {"path", "format": "several runs", "state": the worst, "runs": [...]}

What one run is, per its writer:
- TensorBoard (`tensorboard/backend/event_processing`: `EventMultiplexer.AddRunsFromDirectory` over
  `io_wrapper.GetLogdirSubdirectories`): a run is one directory that holds event files directly. The event
  files of one directory are one run: `DirectoryWatcher` reads them in name order as one stream (a restart's
  new file continues it; out-of-order steps purge the later ones). So several event files in one folder
  stay one run here too. One exception, for the Keras callback: its `train/` and `validation/` writers (and
  `eval/`, `test/`) are two directories of one fit, read together as their parent.
- Lightning: each `version_N` is one logger's folder (one `Trainer` fit).
- Any other sub-folder that is a run by its own files (a Hugging Face output dir, an Ultralytics
  `runs/detect/train2`, an mmengine work dir...).
A folder that is a run by its own files (`trainer_state.json`, `results.csv`, event files directly in it...)
is one run, whatever its sub-folders hold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.ingest.diagnose import Diagnosis

_VERSION = re.compile(r"^version_(\d+)$")
# files that make a folder a run of its own, as `detect._open_dir` reads it
OWN_FILES = ("trainer_state.json", "metrics.csv", "results.csv", "results.txt", "args.yaml", "opt.yaml",
             "scalars.json", "vis_data/scalars.json", "trainer_log.jsonl", "logging.jsonl", "metrics.json",
             "files/wandb-summary.json")
# the Keras TensorBoard callback's writers of one fit (`<log_dir>/train`, `<log_dir>/validation`)
WRITER_DIRS = ("train", "validation", "val", "eval", "test")
# worst first: how a run ended, from the most to the least in need of a look
STATE_ORDER = ("crashed", "killed", "cut-off", "launch-failed", "unfinished", "unknown", "unreadable", "completed")


def own_run(folder: Path) -> bool:
    """Whether the folder is a run by its own files (not by what its sub-folders hold)."""
    from trainguard.ingest.tensorboard import PATTERN

    try:
        return _own_files(folder) or any(p.is_file() for p in folder.glob(PATTERN))
    except OSError:
        return False


def _own_files(folder: Path) -> bool:
    """Whether the folder holds a run's metrics or plan files of its own (event files aside)."""
    from trainguard.ingest import hf

    try:
        return any((folder / name).is_file() for name in OWN_FILES) or hf.find_state(folder) is not None
    except OSError:
        return False


def run_folders(folder: Path) -> list[Path]:
    """The runs a folder holds when it holds several (each a folder, in name order); [] when it is one run
    (or none: then the single-run readers say what they found)."""
    found = _runs_below(folder)
    return found if len(found) >= 2 else []


def single_run(folder: Path) -> Path | None:
    """The one run below a folder that is not a run itself (`runs/` holding only `exp/`), for when the
    single-run readers find nothing in the folder itself; None when there is not exactly one."""
    found = _runs_below(folder)
    return found[0] if len(found) == 1 else None


def _runs_below(folder: Path) -> list[Path]:
    if _VERSION.match(folder.name) or own_run(folder):
        return []
    try:
        base = folder / "lightning_logs" if (folder / "lightning_logs").is_dir() else folder
        versions = sorted((int(m.group(1)), q) for q in base.iterdir() if q.is_dir() and (m := _VERSION.match(q.name)))
        if len(versions) >= 2:
            return [q for _, q in versions]
        found = [q for q in sorted(folder.iterdir()) if q.is_dir() and not q.is_symlink() and own_run(q)]
        for root in _event_roots(folder):
            if root != folder and not any(root == f or f in root.parents for f in found):
                found.append(root)
    except OSError:
        return []
    return sorted(found)


def _event_roots(folder: Path) -> list[Path]:
    """The directories holding event files directly (TensorBoard's runs), a fit's writer folders folded."""
    from trainguard.ingest.tensorboard import event_files

    dirs = {p.parent for p in event_files(folder)}
    roots = set()
    for d in dirs:
        siblings = [s for s in dirs if s.parent == d.parent and s.name in WRITER_DIRS]
        folded = d.name in WRITER_DIRS and len(siblings) >= 2 and not _own_files(d)
        roots.add(d.parent if folded else d)
    return sorted(roots)


def diagnose_runs(folder: Path, runs: list[Path], alive: bool = False) -> list[Diagnosis | tuple[Path, str]]:
    """Each run's diagnosis (or, for a run that cannot be read, its path and the one-line reason), the
    worst state first, then by name."""
    from trainguard.errors import UserError
    from trainguard.ingest.diagnose import diagnose_path

    out: list[Diagnosis | tuple[Path, str]] = []
    for run in runs:
        try:
            out.append(diagnose_path(run, alive=alive))
        except UserError as exc:
            out.append((run, str(exc)))
    return sorted(out, key=_rank)


def _rank(d: Diagnosis | tuple[Path, str]) -> tuple[int, int, str]:
    """How it ended, then its most severe finding, then its name."""
    if not isinstance(d, Diagnosis):
        return STATE_ORDER.index("unreadable"), 0, str(d[0])
    state = STATE_ORDER.index(d.state) if d.state in STATE_ORDER else len(STATE_ORDER)
    return state, -max((f.rank for f in d.findings), default=-1), str(d.path)


def worst_state(results: list[Diagnosis | tuple[Path, str]]) -> str:
    first = results[0]
    return first.state if isinstance(first, Diagnosis) else "unreadable"


def to_dict(folder: Path, results: list[Diagnosis | tuple[Path, str]]) -> dict[str, Any]:
    runs = [d.to_dict() if isinstance(d, Diagnosis) else {"path": str(d[0]), "state": "unreadable", "error": d[1]}
            for d in results]
    return {"path": str(folder), "format": "several runs", "state": worst_state(results), "runs": runs}


def report(folder: Path, runs: list[Path], as_json: bool, alive: bool, echo: Callable[[str], Any]) -> int:
    """Prints each run's diagnosis, the worst first; the exit code: 1 when any run has an error finding (a
    folder none of whose runs can be read is refused, exit 2, as one such run is)."""
    from trainguard.errors import UserError
    from trainguard.ingest.diagnose import limits, render

    results = diagnose_runs(folder, runs, alive=alive)
    if not any(isinstance(d, Diagnosis) for d in results):  # nothing read: bad input, as one run's refusal is
        first = results[0]
        assert not isinstance(first, Diagnosis)
        raise UserError(f"{folder}: none of its {len(results)} runs could be read (the first, {first[0].name}: "
                        f"{first[1]})")
    if as_json:
        echo(json.dumps(to_dict(folder, results), default=str))
    else:
        echo(f"{folder}: {len(results)} runs, each diagnosed on its own (worst state first: {worst_state(results)})")
        for d in results:
            echo("")
            if isinstance(d, Diagnosis):  # the rules that could not run: once, by `diagnose` on one run
                lines = render(d, verbose=True)
                for line in lines[:len(lines) - len(limits(d, verbose=True))] + [f"  note: {n}" for n in d.notes]:
                    echo(line)
            else:
                echo(f"{d[0]}: not read: {d[1]}")
        echo("")
        echo("(the rules each run's data could not feed: `trainguard diagnose` on that run alone)")
    return 1 if any(isinstance(d, Diagnosis) and any(f.severity == "error" for f in d.findings) for d in results) else 0
