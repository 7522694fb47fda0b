"""TG205 initial-loss-off from what a log's format says about its losses (rules/lossscale.py).

- A Hugging Face Trainer's `eval_loss` is its training loss's own function (`prediction_step` calls
  `compute_loss`): a training loss several times it, to the end, is a scaled log (transformers 4.46-4.47
  logged the loss times the accumulation steps, huggingface/transformers#35204). Tried on a real Trainer.
- detectron2's `loss_cls` is a mean softmax cross-entropy and `loss_rpn_cls` a binary one
  (its fast_rcnn.py and rpn.py): neither starts far above ln(classes), ln 2 for the binary one, or ln of
  a million whatever the classes. Files written here from JSONWriter's contract (one object per 20
  iterations, each loss the median of its last 20 values).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainguard.ingest.detect import open_source
from trainguard.ingest.diagnose import diagnose_source


def _d2_rows(first: dict[str, float], *, warmup: bool, rows: int = 40) -> list[dict]:
    out = []
    for i in range(rows):
        it = 19 + 20 * i
        lr = 0.001 * (0.001 + 0.999 * min(1.0, it / 1000)) if warmup else 0.001
        fade = 0.7 ** i
        parts = {k: v * fade + 0.3 * (1 - fade) for k, v in first.items()}
        out.append({"iteration": it, "lr": lr, "total_loss": sum(parts.values()), "time": 0.5,
                    "data_time": 0.01, "eta_seconds": 0.5 * (799 - it), **parts})
    return out


def _diagnose_jsonl(tmp_path: Path, rows: list[dict]) -> list:
    path = tmp_path / "metrics.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [f for f in diagnose_source(open_source(path)).findings if f.code == "TG205"]


@pytest.mark.unit
def test_a_detectron2_objectness_loss_that_starts_far_above_ln2_in_warmup_is_a_broken_start(tmp_path: Path) -> None:
    found = _diagnose_jsonl(tmp_path, _d2_rows({"loss_cls": 9.0, "loss_box_reg": 4.0, "loss_rpn_cls": 6.0,
                                                "loss_rpn_loc": 3.0}, warmup=True))
    assert len(found) == 1 and found[0].cause == "cross-entropy-part"
    assert found[0].evidence["field"] == "loss_rpn_cls" and found[0].step == 19
    assert "in the warm-up" in found[0].summary and "ln(2)" in found[0].summary


@pytest.mark.unit
def test_a_detectron2_start_near_its_uniform_guess_is_quiet(tmp_path: Path) -> None:
    assert not _diagnose_jsonl(tmp_path, _d2_rows({"loss_cls": 1.4, "loss_box_reg": 0.9, "loss_rpn_cls": 0.69,
                                                   "loss_rpn_loc": 0.4}, warmup=True))


@pytest.mark.unit
def test_a_loss_that_rises_after_a_sane_first_row_at_full_lr_is_not_the_initialisation(tmp_path: Path) -> None:
    rows = _d2_rows({"loss_cls": 1.4, "loss_box_reg": 0.9, "loss_rpn_cls": 0.69, "loss_rpn_loc": 0.4},
                    warmup=False)
    for r, cls in zip(rows[1:3], (60.0, 90.0)):  # an LR far too high: the update's fault, loss-diverged's to say
        r["loss_cls"] = cls
    assert not _diagnose_jsonl(tmp_path, rows)


def _trainer_state(tmp_path: Path, pairs: list[tuple[float, float]]) -> Path:
    history = []
    for i, (train, ev) in enumerate(pairs, 1):
        history += [{"step": 10 * i, "epoch": i / 10, "loss": train, "learning_rate": 1e-4, "grad_norm": 1.0},
                    {"step": 10 * i, "epoch": i / 10, "eval_loss": ev, "eval_runtime": 1.0}]
    state = {"log_history": history, "global_step": 10 * len(pairs), "max_steps": 10 * len(pairs),
             "logging_steps": 10, "eval_steps": 10}
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state))
    return path


@pytest.mark.unit
def test_a_first_logged_mean_over_the_falling_start_is_not_a_scaled_loss(tmp_path: Path) -> None:
    # the first training row averages steps 1-10, from ln(V) down: several times the evaluation at step 10
    path = _trainer_state(tmp_path, [(6.0, 1.0), (1.3, 0.9), (1.0, 0.85), (0.95, 0.8), (0.9, 0.8)])
    assert not [f for f in diagnose_source(open_source(path)).findings if f.code == "TG205"]


@pytest.mark.unit
def test_a_training_loss_that_stays_a_multiple_of_the_evaluation_loss_is_said(tmp_path: Path) -> None:
    path = _trainer_state(tmp_path, [(40.0, 4.0), (20.0, 2.1), (15.0, 1.6), (14.0, 1.5), (13.5, 1.45)])
    found = [f for f in diagnose_source(open_source(path)).findings if f.code == "TG205"]
    assert len(found) == 1 and found[0].cause == "above-eval" and found[0].step == 10
    assert [p["step"] for p in found[0].evidence["pairs"]] == [30, 40, 50]


TRAINER = textwrap.dedent('''
    import sys, torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    scaled = sys.argv[2] == "scaled"
    torch.manual_seed(0)
    seq = torch.arange(32) % 16
    data = [{"input_ids": (seq + i) % 16, "labels": (seq + i) % 16} for i in range(64)]

    class Logged(Trainer):
        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            # what transformers 4.46-4.47 logged: the micro-batches' losses summed, not divided
            return loss * self.args.gradient_accumulation_steps if scaled else loss

    model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=32, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(sys.argv[1], max_steps=40, per_device_train_batch_size=2, gradient_accumulation_steps=8,
                             learning_rate=3e-3, logging_steps=5, eval_strategy="steps", eval_steps=5,
                             save_strategy="steps", save_steps=40, report_to=[], use_cpu=True, disable_tqdm=True)
    Logged(model=model, args=args, train_dataset=data, eval_dataset=data[:16]).train()
''')


@pytest.mark.process
@pytest.mark.parametrize("variant", ["scaled", "healthy"])
def test_a_real_trainer_whose_logged_loss_is_scaled_by_accumulation_is_named_and_its_twin_is_quiet(
        tmp_path: Path, variant: str) -> None:
    pytest.importorskip("transformers")
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    subprocess.run([sys.executable, str(script), str(tmp_path / "out"), variant], check=True, capture_output=True,
                   timeout=300, cwd=tmp_path)
    state = tmp_path / "out" / "checkpoint-40" / "trainer_state.json"
    found = [f for f in diagnose_source(open_source(state)).findings if f.severity in ("warning", "error")]
    if variant == "healthy":
        assert found == []
    else:
        assert [(f.code, f.cause) for f in found] == [("TG205", "above-eval")]
        assert 6 < found[0].evidence["ratios"][-1] < 10  # the 8 accumulation steps, give or take the gap
