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
    "ultralytics/0x90Vold__Plant-Disease-Detection__train2/results.csv":
        "miss: the args.yaml its verdict cites is not in the corpus folder; one row in warmup cannot show the plan",
    "ultralytics/Arthas1998__yolo_gas__exp2-New/results.csv":
        "miss (accept list in question): TG105 lr-restarts-at-resume names the restart (8.92e-4 -> 0.01 at epoch 25, "
        "cause jump-after-decay), the code for exactly this, but the verdict accepts only TG207/102/103/602/203",
    "tensorboard/Arthas1998__yolo_gas__exp2-New":
        "miss (accept list in question): TG105 lr-restarts-at-resume names the restart from the YOLO writer's x/lr0 "
        "tag (8.92e-4 -> 0.01 at epoch 25), but the verdict accepts only TG207/102/103/602/203",
    "ultralytics/AI23mani__Parking_space_dedction/results.csv":
        "miss: the args.yaml its verdict cites is not in the corpus folder; three rows, all in LR warmup, cannot show the plan",
    "ultralytics/1WangXT__Pipeline_Defect_Recognition__exp3/results.csv":
        "miss (verdict in question): mAP@0.5 rises 0.015 (epoch 4) -> 0.20 (epoch 154) with two one-epoch "
        "spikes (0.487 at 58, 0.453 at 76); no collapse and no failure mechanism in the file, only a weak model",
    "tensorboard/1WangXT__Pipeline_Defect_Recognition__exp3":
        "miss: an mAP collapse after a one-epoch peak while train loss falls: no rule judges an evaluation metric's fall yet",
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
