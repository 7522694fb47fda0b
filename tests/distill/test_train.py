"""End-to-end distillation on the CPU under the guard, and the numbers it reports.

Covers: the guard sees every part with its weight (failures 8, 11), the LR schedule in optimizer steps
(failure 7), perplexity and bpb against a direct Hugging Face computation (failure 10), exact resume,
one dtype policy in training and evaluation (failure 12), early stopping, no dense V x V (failure 4).
"""

from __future__ import annotations

import math

import pytest
import torch

from trainguard.recipes.distill import checkpoint as ckpt
from trainguard.recipes.distill.build import load_model, load_tokenizer
from trainguard.recipes.distill.data import prepare, read_text, windows
from trainguard.recipes.distill.train import lr_lambda, train
from trainguard.store.reader import RunReader


def test_run_completes_under_the_guard_with_no_finding(shared_run):
    with RunReader(shared_run["run_dir"]) as reader:
        status = reader.status()
        steps = list(reader.steps())
        evals = reader.events("eval")
        findings = reader.findings()
    assert status["state"] == "completed" and status["findings"] == [] and findings == []
    assert [r["step"] for r in steps] == list(range(1, 9))
    for row in steps:
        # every part is reported with the weight it carries; LM is always there and never zero-weighted
        assert set(row["parts"]) == set(row["weights"]) == {"lm", "kd", "hidden"}
        assert row["weights"]["lm"] == 1.0 and row["parts"]["lm"] > 0
        assert all(math.isfinite(v) for v in row["parts"].values())
        assert 0 < row["extra"]["align_ratio"] <= 1
        assert row["lr"] > 0
    assert len(evals) == 2 and {"perplexity", "bpb", "kd_topk", "kl_full"} <= set(evals[-1]["data"])
    assert all(math.isfinite(x) for x in shared_run["losses"]) and len(shared_run["losses"]) == 8


def test_schedule_is_sized_and_stepped_in_optimizer_steps(shared_run):
    state = ckpt.load(f"{shared_run['run_dir']}/last.pt")
    cfg = shared_run["cfg"]
    assert state["step"] == cfg.train.max_steps
    assert state["scheduler"]["last_epoch"] == cfg.train.max_steps  # once per optimizer step, not per micro
    f = lr_lambda(cfg.optim.warmup_steps, cfg.train.max_steps, cfg.optim.min_lr_ratio)
    assert f(0) > 0 and f(cfg.optim.warmup_steps) == pytest.approx(1.0)
    assert f(cfg.train.max_steps - 1) == pytest.approx(cfg.optim.min_lr_ratio)  # the last step still learns
    with RunReader(shared_run["run_dir"]) as reader:
        lrs = [r["lr"] for r in reader.steps()]
    assert lrs[-1] == pytest.approx(cfg.optim.lr * f(cfg.train.max_steps - 1))


def test_perplexity_and_bpb_agree_with_a_direct_computation(shared_run):
    cfg = shared_run["cfg"]
    state = ckpt.load(f"{shared_run['run_dir']}/last.pt")
    train_text = read_text(cfg.resolve_path(cfg.data.train))
    s_tok = load_tokenizer("student", cfg.student, train_text, state["tokenizers"]["student"])
    t_tok = load_tokenizer("teacher", cfg.teacher, train_text, state["tokenizers"]["teacher"])
    student = load_model("student", cfg.student, s_tok)
    student.load_state_dict(state["student"])
    student.eval()
    texts = windows(read_text(cfg.resolve_path(cfg.data.eval)), cfg.data.window_chars)[: cfg.data.eval_windows]
    nll, tokens = 0.0, 0
    with torch.no_grad():
        for ex in prepare(texts, s_tok, t_tok):  # one window at a time, Hugging Face's own loss
            ids = torch.tensor([ex.student.ids])
            n = ids.shape[1] - 1
            nll += float(student(input_ids=ids, labels=ids).loss) * n
            tokens += n
    n_bytes = sum(len(t.encode()) for t in texts)
    last = shared_run["evals"][-1]
    assert last["perplexity"] == pytest.approx(math.exp(nll / tokens), rel=1e-4)
    assert last["bpb"] == pytest.approx(nll / math.log(2) / n_bytes, rel=1e-4)
    assert last["tokens"] == tokens


def test_resume_continues_with_the_same_losses(make_cfg, tmp_path):
    cfg = make_cfg(train__max_steps=6, train__eval_every=3, train__save_every=100)
    whole = train(cfg, run_dir=tmp_path / "whole", verbose=False)
    first = train(cfg, run_dir=tmp_path / "cut", stop_after=3, verbose=False)
    rest = train(cfg, run_dir=tmp_path / "resumed", resume=first["last"], verbose=False)
    assert first["step"] == 3 and rest["step"] == 6
    torch.testing.assert_close(torch.tensor(first["losses"] + rest["losses"]), torch.tensor(whole["losses"]),
                               rtol=1e-6, atol=1e-6)
    assert rest["evals"][-1]["bpb"] == pytest.approx(whole["evals"][-1]["bpb"], rel=1e-6)


def test_resume_refuses_a_different_teacher(make_cfg, shared_run, tmp_path):
    from trainguard.errors import UserError

    cfg = make_cfg(seed=7)
    with pytest.raises(UserError, match="teacher differs"):
        train(cfg, run_dir=tmp_path, resume=shared_run["last"], verbose=False)


def test_bf16_policy_trains_and_evaluates_with_the_same_autocast(make_cfg, tmp_path):
    # seed 004: an fp16 teacher against an fp32 projector failed only in evaluation, outside autocast
    cfg = make_cfg(precision="bf16", train__max_steps=3, train__eval_every=3)
    result = train(cfg, run_dir=tmp_path, verbose=False)
    ev = result["evals"][-1]
    assert all(math.isfinite(ev[k]) for k in ("perplexity", "bpb", "kd_topk", "kl_full", "hidden"))


def test_early_stopping_after_patience_evaluations_without_progress(make_cfg, tmp_path):
    cfg = make_cfg(optim__lr=1.0e-12, optim__proj_lr=1.0e-12, train__max_steps=8, train__eval_every=1,
                   train__patience=2, loss__kd__ramp=[0.0, 0.0], loss__hidden__ramp=[0.0, 0.0])
    result = train(cfg, run_dir=tmp_path, verbose=False)
    assert result["stopped_early"] and result["step"] == 3  # best at 1, then 2 evaluations without progress


def test_no_dense_vocab_to_vocab_parameters_and_bounded_first_step(shared_run):
    cfg = shared_run["cfg"]
    state = ckpt.load(f"{shared_run['run_dir']}/last.pt")
    proj_shapes = [tuple(v.shape) for v in state["proj"].values()]
    assert proj_shapes == [(cfg.teacher.build["hidden_size"], cfg.student.build["hidden_size"])] * 2
    with RunReader(shared_run["run_dir"]) as reader:
        first = next(iter(reader.steps()))
    # no random V x V projector: the first step's KD and hidden terms are already small and bounded
    assert first["parts"]["kd"] < 1.0 and first["parts"]["hidden"] <= 2.0


def test_nan_is_never_clamped_away(make_cfg):
    from trainguard.recipes.distill.data import collate
    from trainguard.recipes.distill.losses import KDSpec, forward_losses

    cfg = make_cfg()
    text = read_text(cfg.resolve_path(cfg.data.train))
    s_tok = load_tokenizer("student", cfg.student, text)
    t_tok = load_tokenizer("teacher", cfg.teacher, text)
    student, teacher = load_model("student", cfg.student, s_tok), load_model("teacher", cfg.teacher, t_tok)
    with torch.no_grad():
        student.get_output_embeddings().weight[0, 0] = float("nan")
    batch = collate(prepare(["some text 12"], s_tok, t_tok), s_tok.bos_id, t_tok.bos_id)
    spec = KDSpec(torch.arange(t_tok.vocab_size).clamp(max=s_tok.vocab_size - 1), 8, 2.0, 16, [], "cosine")
    out = forward_losses(student, teacher, torch.nn.ModuleList(), batch, spec, with_hidden=False)
    assert torch.isnan(out["lm_sum"]) and torch.isnan(out["kd_sum"])  # the guard sees it; nothing hides it
