"""The MoE teacher's routing distilled (routing feature loss, Switch load balance), every term through
the curriculum and to the guard, and the student-aware router's collapse caught by TG811."""

from __future__ import annotations

import math

import pytest
import torch

import trainguard
from trainguard.recipes.distill.routing import StudentRouter, load_balance, routing_kl
from trainguard.store.reader import RunReader


def test_recipe_distils_the_teachers_routing_through_the_curriculum_under_the_guard(make_cfg, tmp_path):
    from trainguard.recipes.distill.train import train

    cfg = make_cfg(loss__routing={"start": 0.0, "end": 0.5, "ramp": [0.0, 0.5], "depth": 0.5},
                   loss__balance={"start": 0.1, "end": 0.1})
    r = train(cfg, run_dir=tmp_path / "run", verbose=False)
    with RunReader(r["run_dir"]) as reader:
        rows = list(reader.steps())
        experts = reader.events("experts")
        status, findings = reader.status(), reader.findings()
    assert status["state"] == "completed" and findings == []  # a healthy router is quiet
    for row in rows:
        assert {"routing", "balance"} <= set(row["parts"]) and {"routing", "balance"} <= set(row["weights"])
        assert math.isfinite(row["parts"]["routing"]) and row["parts"]["routing"] >= 0
        assert 0.99 <= row["parts"]["balance"] <= 4.0  # Switch loss: 1 when even, E when one expert takes all
        assert row["weights"]["balance"] == pytest.approx(0.1)
    # the routing weight follows the linear ramp like every other term
    assert rows[0]["weights"]["routing"] == 0.0 and rows[-1]["weights"]["routing"] == pytest.approx(0.5)
    assert experts and len(experts[0]["data"]["load"]) == 4  # the teacher's 4 experts, loads reported


def test_routing_without_an_moe_teacher_is_refused_in_one_line(make_cfg, tmp_path):
    from trainguard.errors import UserError
    from trainguard.recipes.distill.train import train

    cfg = make_cfg(teacher__arch="llama", teacher__build={"hidden_size": 32, "intermediate_size": 64,
                                                          "num_hidden_layers": 2, "num_attention_heads": 4},
                   loss__routing={"start": 0.1, "end": 0.1})
    with pytest.raises(UserError, match="mixture-of-experts teacher"):
        train(cfg, run_dir=tmp_path / "run", verbose=False)


def test_balance_needs_routing(make_cfg):
    from trainguard.errors import UserError

    with pytest.raises(UserError, match="loss.balance"):
        make_cfg(loss__balance={"start": 0.01, "end": 0.01})


def test_routing_terms_are_a_true_kl_and_the_switch_loss():
    t = torch.randn(50, 6)
    assert float(routing_kl(t.clone(), t)) == pytest.approx(0.0, abs=1e-5)
    assert float(routing_kl(torch.zeros(50, 6), t)) > 0
    spread = torch.nn.functional.one_hot(torch.arange(60) % 6, 6).float() * 20  # token i prefers expert i % 6
    even, load = load_balance(spread, 1)
    collapsed, load_c = load_balance(torch.tensor([[20.0, 0, 0, 0, 0, 0]]).repeat(60, 1), 1)
    assert even == pytest.approx(1.0, rel=1e-3) and load.tolist() == [10] * 6
    assert collapsed == pytest.approx(6.0, rel=1e-3) and load_c.tolist() == [60, 0, 0, 0, 0, 0]


def _router_run(tmp_path, planted: bool) -> list[str]:
    """A real loop: a student-aware router trained on the teacher-routing KL and the load-balance term,
    its loads reported with guard.experts. Planted: the router's bias pinned to expert 0 (frozen)."""
    torch.manual_seed(0)
    E, H = 8, 16
    router = StudentRouter(H, E)
    teacher_router = torch.nn.Linear(H, E)  # a teacher that spreads tokens over its experts
    if planted:
        with torch.no_grad():
            router.proj.bias[0] = 30.0
        router.proj.bias.requires_grad_(False)
        router.proj.weight.requires_grad_(False)
    params = [p for p in router.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params or [torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
    guard = trainguard.watch(router, opt, total_steps=30, run_dir=tmp_path / ("planted" if planted else "healthy"))
    for _ in range(30):
        h = torch.randn(256, H)
        logits = router(h)
        with torch.no_grad():
            target = teacher_router(h)
        kl = routing_kl(logits, target) / h.shape[0]
        balance, load = load_balance(logits, 1)
        loss = kl + 0.01 * balance
        if loss.requires_grad:
            loss.backward()
        guard.experts(load, layer="student_router")
        guard.step(loss.detach(), parts={"routing": kl.detach(), "balance": balance.detach()},
                   weights={"routing": 1.0, "balance": 0.01})
        opt.step()
        opt.zero_grad(set_to_none=True)
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        return [f.code for f in reader.findings()]


def test_a_collapsed_router_is_caught_and_a_healthy_one_is_quiet(tmp_path):
    assert "TG811" in _router_run(tmp_path, planted=True)
    assert "TG811" not in _router_run(tmp_path, planted=False)
