"""`diagnose` on the artifacts that real runs left in public repositories, graded against a verdict judged
by reading each file (`../shared/real-logs/expected.json` and `expected-*.json`; sources and reasons in its
SOURCES.md).

The corpus is read in place, never copied into the project, and its files' modification times are left
alone: no verdict may depend on them. A healthy file must get no warning or error; a failed run must get
one of the findings its entry accepts (or, where the entry says so, a one-line refusal); nothing may be
refused that is not accepted as a refusal, and nothing may raise. Skipped where the corpus is absent.

Run: pytest tests/test_real_logs.py            (about 2 minutes)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.errors import UserError
from trainguard.ingest.diagnose import diagnose_path

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "real-logs"
# expected.json and every expected-*.json beside it (the corpus grows by dated files), as run.py grades them
EXPECTED = sorted(CORPUS.glob("expected*.json")) if CORPUS.is_dir() else []
ITEMS = [item for f in EXPECTED for item in json.loads(f.read_text())["items"]]
SEVERE = {"warning", "error"}

# Items still wrong, each with the mechanism it lacks (a verdict is never fitted to one file). strict: an
# item that turns right must leave this list.
STILL_WRONG = {
    "textlog/Kozmosa__EMCAD-TOM500__train.out":
        "miss: text log: 300 steps, 10 evals, state completed; no findings",
    "textlog/abhinavagarwalla__swav-cifar10__train.log":
        "false-alarm: text log: 1164 steps, 0 evals, state completed; TG204 loss-not-decreasing [warning] at step 1",
    "textlog/linskybing__LLM__zero_3_offload.out":
        "false-alarm: text log: 100 steps, 0 evals, state completed; TG204 loss-not-decreasing [warning] at step 1",
    "textlog/JunyiJ__PostTraining-LLM-Small__ppo_20251228_2.log":
        "false-alarm: text log: 110 steps, 0 evals, state completed; TG521 log-flood [warning] at step 1",
    "textlog/HojinSohn__Fine-Tuning-Bert-StockPrediction__train-lr25.out":
        "miss: text log: 4 steps, 1 evals, state unfinished; TG531 log-ends-unfinished [info] at step 4",
    "textlog/JunyiJ__PostTraining-LLM-Small__train_grpo_gemma2_3.log":
        "false-alarm: text log: 8 steps, 0 evals, state completed; TG521 log-flood [warning] at step 1",
    "hf/Tanisha-anshu__OpenAi-Whisper-small-Braj/trainer_state.json":
        "miss: five train rows rising 1.24 -> 2.16 -> 1.79 and an eval loss rising: too few rows for loss-diverging's window (rule-level, not the reader)",
    "ultralytics/0x90Vold__Plant-Disease-Detection__train2/results.csv":
        "miss: the args.yaml its verdict cites is not in the corpus folder; one row in warmup cannot show the plan",
    "ultralytics/Arthas1998__yolo_gas__exp2-New/results.csv":
        "miss: a resumed run whose LR schedule restarts (8.9e-4 -> 0.01) as mAP halves: no rule names a schedule restart yet",
    "tensorboard/Arthas1998__yolo_gas__exp2-New":
        "miss: a resumed run whose LR schedule restarts (8.9e-4 -> 0.01) as mAP halves: no rule names a schedule restart yet",
    "ultralytics/AI23mani__Parking_space_dedction/results.csv":
        "miss: the args.yaml its verdict cites is not in the corpus folder; three rows, all in LR warmup, cannot show the plan",
    "hf/aaghaazkhan__law-llm/trainer_state.json":
        "miss: a mis-scaled train loss (285 at step 100, 16x the eval loss): initial-loss-off needs the vocabulary size, which trainer_state.json does not hold",
    "keras/ElsanzioKE__deepfake-detector/training_log.csv":
        "miss: 7 epochs at ln 2: fewer than the 16 rows loss-not-decreasing needs; the planned 10 epochs live in the script only",
    "ultralytics/1WangXT__Pipeline_Defect_Recognition__exp3/results.csv":
        "miss: an mAP collapse after a one-epoch peak while train loss falls: no rule judges an evaluation metric's fall yet",
    "csv/Aaryan004__Pothole_Detection_Model_RCNNs__output-metrics.json":
        "miss: a first total_loss of 86 (30x a detectron2 start): initial-loss-off needs NUM_CLASSES, not in metrics.json; the TG401 it accepts fired only on windowed medians read as a sum",
    "tensorboard/1WangXT__Pipeline_Defect_Recognition__exp3":
        "miss: an mAP collapse after a one-epoch peak while train loss falls: no rule judges an evaluation metric's fall yet",
    "lightning/GeorgTenzing__EEG_Classification__EEGClassifier/version_19":
        "miss: 13 epochs at ln 6: fewer than the 16 rows loss-not-decreasing needs",
    # issue 34: a Slurm cut in a log is TG552 cut-by-scheduler, the code the live watchdog gives the same event
    # (was TG503 run-killed); the corpus's entries still accept only TG503 for these three: the corpus's
    # accept lists need TG552 (shared/real-logs is read-only here). Each is named cut-off correctly.
    "crash/jshe2304__smilesVAE__job.err":
        "miss by the corpus's accept list: state cut-off, TG552 cut-by-scheduler (the entry accepts TG503)",
    "textlog/FalsoMoralista__FGDCC__slurm-2566.out":
        "miss by the corpus's accept list: state cut-off, TG552 cut-by-scheduler (the entry accepts TG503)",
    "crash/Shark-NLP__DiffuSeq__err_43357390.err":
        "miss by the corpus's accept list: state cut-off, TG552 cut-by-scheduler (the entry accepts TG503)",
}


def grade(item: dict) -> tuple[str, str]:
    """("right" | "false-alarm" | "miss" | "unreadable", what diagnose said), as the corpus's run.py grades."""
    try:
        d = diagnose_path(CORPUS / item["path"])
    except UserError as exc:
        if item["expect"] == "failure" and item.get("accept_exit2"):
            return "right", f"refused: {exc}"
        return "unreadable", str(exc)
    severe = [f for f in d.findings if f.severity in SEVERE]
    said = f"{d.format}, {d.steps} steps, {d.evals} evals, {d.state}: " + (
        "; ".join(f"{f.code} {f.name} [{f.severity}] at {f.step}" for f in d.findings) or "no findings")
    json.dumps(d.to_dict(), default=str)  # what --json prints must serialise
    if item["expect"] == "healthy":
        return ("false-alarm" if severe else "right"), said
    accept = set(item.get("accept", []))
    return ("right" if any(f.code in accept or f.name in accept for f in severe) else "miss"), said


def _param(item: dict) -> object:
    reason = STILL_WRONG.get(item["path"])
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(item, marks=marks, id=item["path"][-70:])


@pytest.mark.skipif(not ITEMS, reason=f"the real-logs corpus is not at {CORPUS}")
@pytest.mark.parametrize("item", [_param(i) for i in ITEMS])
def test_real_artifact_gets_its_verdict(item: dict) -> None:
    verdict, said = grade(item)
    assert verdict == "right", f"{verdict}: expected {item['expect']} ({item['why'][:160]}); diagnose said {said}"


@pytest.mark.skipif(not ITEMS, reason=f"the real-logs corpus is not at {CORPUS}")
def test_verdicts_do_not_depend_on_when_the_file_was_written() -> None:
    """The same file read 'now' and a year later: the same findings (TG531 once graded by file age)."""
    for item in ITEMS:
        path = CORPUS / item["path"]
        try:
            a = diagnose_path(path, now=1.7e9)
            b = diagnose_path(path, now=1.7e9 + 365 * 86400)
        except UserError:
            continue
        assert [(f.name, f.severity, f.summary) for f in a.findings] == \
            [(f.name, f.severity, f.summary) for f in b.findings], item["path"]
