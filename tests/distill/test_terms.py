"""The curriculum (failure 8), normalised hidden-state distillation (failures 5, 6), eval/train parity (9)."""

from __future__ import annotations

import pytest
import torch

from trainguard.recipes.distill.config import LossConfig
from trainguard.recipes.distill.curriculum import Curriculum, ramp
from trainguard.recipes.distill.losses import hidden_loss, layer_pairs


def test_ramp_is_linear_half_way_is_the_midpoint():
    assert ramp(0.1, 0.7, 0.0, 0.2, 0.1) == pytest.approx(0.4)  # not 6.7% of the target half-way
    assert ramp(0.1, 0.7, 0.0, 0.2, 0.0) == 0.1 and ramp(0.1, 0.7, 0.0, 0.2, 0.9) == 0.7
    assert ramp(0.0, 1.0, 0.5, 0.5, 0.49) == 0.0 and ramp(0.0, 1.0, 0.5, 0.5, 0.5) == 1.0


def test_every_term_has_a_scheduled_weight_and_lm_never_leaves():
    cur = Curriculum.from_config(LossConfig(), total_steps=100)
    for step in range(0, 100, 7):
        w = cur.weights(step)
        assert set(w) == {"lm", "kd", "hidden", "routing", "balance"} and w["lm"] == 1.0
    assert cur.weights(10)["kd"] == pytest.approx(0.4) and cur.ramp_end_step == 20


def test_layer_pairs_by_relative_depth():
    assert layer_pairs([0.5, 1.0], 30, 24) == [(15, 12), (30, 24)]
    assert layer_pairs([0.1], 3, 2) == [(1, 1)]


@pytest.mark.parametrize("norm", ["cosine", "standardize"])
def test_hidden_loss_is_bounded_whatever_the_scale(norm):
    torch.manual_seed(0)
    proj = torch.nn.Linear(8, 16, bias=False)
    s, t = torch.randn(32, 8), torch.randn(32, 16)
    with torch.no_grad():
        small = float(hidden_loss(s, t, proj, norm)) / 32
        big = float(hidden_loss(s * 1000, t * 200, proj, norm)) / 32
    bound = 2.0 if norm == "cosine" else 4.0
    assert small <= bound and big <= bound + 1e-4
    assert big == pytest.approx(small, rel=1e-3)  # scale-free: raw MSE would grow 10^5-fold


def test_hidden_target_is_fixed_and_projection_goes_student_to_teacher():
    proj = torch.nn.Linear(4, 6, bias=False)
    s = torch.randn(5, 4, requires_grad=True)
    t = torch.randn(5, 6, requires_grad=True)
    hidden_loss(s, t, proj, "cosine").backward()
    assert t.grad is None and s.grad is not None and proj.weight.grad is not None


def test_eval_kd_uses_the_training_top_k_and_full_kl_separately(make_cfg):
    from trainguard.recipes.distill.build import load_model, load_tokenizer
    from trainguard.recipes.distill.data import eval_batches, prepare, read_text, windows
    from trainguard.recipes.distill.evaluate import evaluate
    from trainguard.recipes.distill.losses import KDSpec
    from trainguard.recipes.distill.vocab_map import build_vocab_map

    cfg = make_cfg()
    text = read_text(cfg.resolve_path(cfg.data.train))
    s_tok, t_tok = load_tokenizer("student", cfg.student, text), load_tokenizer("teacher", cfg.teacher, text)
    torch.manual_seed(0)
    student, teacher = load_model("student", cfg.student, s_tok), load_model("teacher", cfg.teacher, t_tok)
    teacher.eval()
    vmap = build_vocab_map(t_tok.token_bytes, s_tok.token_bytes, t_tok.vocab_size)
    ex = prepare(windows(text, 120)[:6], s_tok, t_tok)
    V_t = teacher.get_output_embeddings().weight.shape[0]

    def run(k: int) -> dict:
        spec = KDSpec(vmap, k, 2.0, 64, [], "cosine")
        return evaluate(student, teacher, torch.nn.ModuleList(), eval_batches(ex, 3, s_tok.bos_id, t_tok.bos_id),
                        spec, torch.no_grad, "cpu")

    small, full = run(8), run(V_t)
    assert small["kl_full"] == pytest.approx(full["kl_full"], rel=1e-5)  # the full KL does not depend on k
    assert full["kd_topk"] == pytest.approx(full["kl_full"], rel=1e-5)  # k = V: top-k KD is the full KL
    assert small["kd_topk"] != pytest.approx(small["kl_full"], rel=1e-3)  # and both are reported, not mixed
