"""The probe's API-contract checks (probe/contracts.py) in real torch loops: quiet on the legitimate
patterns that look like the bugs (gradient accumulation, LBFGS closures, clipping, GANs with two
optimizers, zeroed rather than freed gradients, a frozen backbone), loud on the bugs; and the
cross-rank rule (TG701) fed every rank's events by the engine.

Each scenario of the zoo (scenarios/contract_*, scenarios/example_*) runs the same checks end to end
under `trainguard run`; these are the cases too many to give a scenario each.

Run: pytest tests/test_contracts.py
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import trainguard
from trainguard.rules.engine import Engine
from trainguard.store.reader import RunReader


def _contracts(run_dir: Path) -> dict[str, dict]:
    with RunReader(run_dir) as reader:
        return {e["name"]: e["data"] for e in reader.events("contract") if e["name"] != "param-checksum"}


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(16, 8)
    return x, x.sum(1, keepdim=True)


def test_accumulation_clipping_and_zeroed_grads_are_quiet(workdir: Path) -> None:
    model, accum = _net(), 4
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt, total_steps=12, grad_accum=accum, run_dir=workdir / "run")
    for step in range(12):
        for _ in range(accum):
            x, y = _batch()
            (nn.functional.mse_loss(model(x), y) / accum).backward()
            guard.step(torch.tensor(1.0))
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # in-place on .grad before the step
        opt.step()
        opt.zero_grad(set_to_none=step % 2 == 0)  # zeroed on odd steps, freed on even ones
    guard.finish()
    assert _contracts(workdir / "run") == {}


def test_missing_zero_grad_is_found_with_the_parameter_named(workdir: Path) -> None:
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt, total_steps=6, run_dir=workdir / "run")
    for _ in range(6):
        x, y = _batch()
        nn.functional.mse_loss(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # clipping must not pass for a reset
        opt.step()
        guard.step(torch.tensor(1.0))
    guard.finish()
    found = _contracts(workdir / "run")["grads-never-reset"]
    assert found["param"] in ("0.weight", "2.weight") and found["steps"][:2] == [2, 3]


def test_zero_grad_every_other_step_is_found(workdir: Path) -> None:
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt, total_steps=8, run_dir=workdir / "run")
    for step in range(8):
        x, y = _batch()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step % 2:
            opt.zero_grad()  # a misplaced `if`: every second step sums two batches
        guard.step(torch.tensor(1.0))
    guard.finish()
    assert "grads-never-reset" in _contracts(workdir / "run")


def test_zero_grad_dropped_late_is_found_within_a_sample(workdir: Path) -> None:
    # Past its first steps the probe follows the gradients on a few consecutive steps from each sampled
    # one: a second stage of the loop that forgets zero_grad from step 25 on is found by step 32.
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt, total_steps=40, run_dir=workdir / "run")
    for step in range(1, 41):
        x, y = _batch()
        if step < 25:
            opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        guard.step(torch.tensor(1.0))
    guard.finish()
    with RunReader(workdir / "run") as reader:
        events = [e for e in reader.events("contract") if e["name"] == "grads-never-reset"]
    assert len(events) == 1 and 25 <= events[0]["step"] <= 32
    assert min(events[0]["data"]["steps"]) >= 25  # no window before the last zero_grad


def test_lbfgs_closure_and_gan_with_two_optimizers_are_quiet(workdir: Path) -> None:
    model = _net().double()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    guard = trainguard.watch(model, opt, total_steps=4, run_dir=workdir / "lbfgs")
    x, y = (t.double() for t in _batch())
    for _ in range(4):
        def closure():
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        guard.step(opt.step(closure))
    guard.finish()
    assert _contracts(workdir / "lbfgs") == {}

    net_d, net_g = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(), nn.Linear(8, 1)), nn.Linear(2, 4)
    opt_d, opt_g = torch.optim.Adam(net_d.parameters()), torch.optim.Adam(net_g.parameters())
    guard = trainguard.watch(net_d, opt_d, total_steps=6, run_dir=workdir / "gan")
    bce = nn.BCEWithLogitsLoss()
    for _ in range(6):
        net_d.zero_grad()
        real = torch.randn(8, 4)
        err_real = bce(net_d(real).squeeze(1), torch.ones(8))
        err_real.backward()
        fake = net_g(torch.randn(8, 2))
        err_fake = bce(net_d(fake.detach()).squeeze(1), torch.zeros(8))
        err_fake.backward()
        opt_d.step()
        net_g.zero_grad()
        bce(net_d(fake).squeeze(1), torch.ones(8)).backward()  # also adds to D's gradients, reset next round
        opt_g.step()
        guard.step(err_real + err_fake)
    guard.finish()
    assert _contracts(workdir / "gan") == {}


def test_a_gradient_freed_or_replaced_by_one_that_reuses_its_id_is_a_reset(workdir: Path) -> None:
    # Freed on even steps, replaced by new zeros on odd ones (both resets): the new zeros reuse the freed
    # tensor's id (CPython hands its memory straight back) and, after a freed window whose gradient was
    # stolen from backward, its version counter too. Only the object itself tells them apart.
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt, total_steps=12, run_dir=workdir / "run")
    reused = 0
    for step in range(12):
        for p in model.parameters():
            if step % 2:
                old = id(p.grad)
                p.grad = None
                p.grad = torch.zeros_like(p)
                reused += id(p.grad) == old
            else:
                p.grad = None
        x, y = _batch()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        guard.step(torch.tensor(1.0))
    guard.finish()
    assert reused  # the case is the one meant: ids were reused
    assert _contracts(workdir / "run") == {}


def test_accumulation_without_zero_grad_counts_every_backward_pass(workdir: Path) -> None:
    model, accum = _net(), 3
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt, total_steps=5, grad_accum=accum, run_dir=workdir / "run")
    for _ in range(5):
        for _ in range(accum):
            x, y = _batch()
            (nn.functional.mse_loss(model(x), y) / accum).backward()
            guard.step(torch.tensor(1.0))
        opt.step()
    guard.finish()
    found = _contracts(workdir / "run")["grads-never-reset"]
    assert found["steps"] == [2, 3] and found["backward_passes"] >= 2 * accum + 1 and found["grad_accum"] == accum


def test_a_reset_is_seen_wherever_the_loop_puts_zero_grad(workdir: Path) -> None:
    # Before the forward (decided by the forward's pre-hook: no call from backward), between the forward
    # and backward() (decided by the first backward pass), or after the step; dropped from step 8 on,
    # found whichever it was.
    for place in ("before-forward", "before-backward", "after-step"):
        model, accum = _net(), 2
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        run = workdir / place
        guard = trainguard.watch(model, opt, total_steps=14, grad_accum=accum, run_dir=run)
        for step in range(1, 15):
            for micro in range(accum):
                x, y = _batch()
                if step < 8 and micro == 0 and place == "before-forward":
                    opt.zero_grad(set_to_none=step % 2 == 0)
                loss = nn.functional.mse_loss(model(x), y) / accum
                if step < 8 and micro == 0 and place == "before-backward":
                    opt.zero_grad(set_to_none=step % 2 == 0)
                loss.backward()
                guard.step(loss)
            opt.step()
            if step < 8 and place == "after-step":
                opt.zero_grad(set_to_none=step % 2 == 0)
        guard.finish()
        found = _contracts(run)
        assert set(found) == {"grads-never-reset"}, place
        assert min(found["grads-never-reset"]["steps"]) >= 8, place


def test_gradients_of_the_parameters_taken_with_autograd_grad_add_nothing(workdir: Path) -> None:
    # A gradient-norm penalty: torch.autograd.grad(loss, params) runs the parameters' tensor hooks but adds
    # nothing to .grad. Zeroed in place after it, before backward(): a reset, quiet; never zeroed: found.
    for zeroed in (True, False):
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        run = workdir / f"run-{zeroed}"
        guard = trainguard.watch(model, opt, total_steps=6, run_dir=run)
        for _ in range(6):
            x, y = _batch()
            loss = nn.functional.mse_loss(model(x), y)
            grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
            penalty = sum(g.pow(2).sum() for g in grads)
            if zeroed:
                opt.zero_grad(set_to_none=False)
            (loss + 0.1 * penalty).backward()
            opt.step()
            guard.step(loss)
        guard.finish()
        found = _contracts(run)
        assert (found == {}) if zeroed else (set(found) == {"grads-never-reset"})


def test_the_watched_gradient_moves_on_when_its_parameter_is_frozen(workdir: Path) -> None:
    # The largest parameter is followed; frozen at step 4 (its gradient freed), it gets no backward pass
    # again: another parameter is followed from then on, and a zero_grad dropped at step 10 is found.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt, total_steps=16, run_dir=workdir / "run")
    for step in range(1, 17):
        if step == 4:
            model[0].weight.requires_grad_(False)
            model[0].weight.grad = None
        if step < 10:
            opt.zero_grad()
        x, y = _batch()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        guard.step(torch.tensor(1.0))
    guard.finish()
    found = _contracts(workdir / "run")
    assert set(found) == {"grads-never-reset"} and found["grads-never-reset"]["param"] != "0.weight"
    assert min(found["grads-never-reset"]["steps"]) >= 10


def test_the_automatic_probe_finds_gradients_never_reset(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from trainguard.probe.auto import bootstrap_env

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(bootstrap_env(env))
    env.update(TRAINGUARD_RUN_DIR=str(tmp_path / "run"), TRAINGUARD_WATCHDOG="1")
    code = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(8):
    for _ in range(2):  # accumulation, without guard.step: the probe counts the backward passes itself
        model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()  # and no zero_grad
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    found = _contracts(tmp_path / "run")["grads-never-reset"]
    assert found["backward_passes"] >= 4 and len(found["steps"]) == 2


def test_frozen_backbone_with_grads_freed_is_quiet_and_zeroed_is_found(workdir: Path) -> None:
    for set_to_none in (True, False):
        model = _net()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        run = workdir / f"run-{set_to_none}"
        guard = trainguard.watch(model, opt, total_steps=10, run_dir=run)
        for step in range(10):
            if step == 4:
                model[0].requires_grad_(False)
            x, y = _batch()
            opt.zero_grad(set_to_none=set_to_none)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            guard.step(torch.tensor(1.0))
        guard.finish()
        found = _contracts(run)
        if set_to_none:
            assert found == {}
        else:
            assert sorted(found["frozen-params-updated"]["names"]) == ["0.bias", "0.weight"]


def test_a_freeze_between_sampled_steps_is_found_at_its_step(workdir: Path) -> None:
    # Past its first steps the probe reads a few evenly spaced parameters each step and scans them all
    # only every `stats_every` steps, or when one of those changes: a freeze at step 23 (between the
    # samples at 20 and 30) that reaches one of them is found at step 23, one that does not by step 30.
    cases = {  # what is frozen at step 23 -> (contract, tensors frozen or None)
        "the head, gradients zeroed": ("frozen-params-updated", ["19.bias", "19.weight"]),
        "a middle layer, gradients zeroed": ("frozen-params-updated", ["3.bias", "3.weight"]),
        "everything, gradients freed": ("step-updates-nothing", None),
    }
    for case, (contract, names) in cases.items():
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(19)], nn.Linear(8, 1))  # 40 tensors
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        run = workdir / case.replace(" ", "-").replace(",", "")
        guard = trainguard.watch(model, opt, total_steps=40, run_dir=run)
        frozen = {"the head": model[19], "a middle layer": model[3], "everything": model}[case.split(",")[0]]
        for step in range(1, 36):
            if step == 23:
                frozen.requires_grad_(False)
            x, y = _batch()
            opt.zero_grad(set_to_none=case.endswith("freed"))
            loss = nn.functional.mse_loss(model(x), y)
            if not loss.requires_grad:
                loss.requires_grad_(True)  # the "fix" for backward()'s error that makes the steps no-ops
            loss.backward()
            opt.step()
            guard.step(loss)
        guard.finish()
        with RunReader(run) as reader:
            events = {e["name"]: e for e in reader.events("contract")}
        assert set(events) == {contract}, case
        found = events[contract]
        if names is not None:
            assert sorted(found["data"]["names"]) == names, case
        if case.startswith("a middle layer"):  # 6 and 7 of 40 tensors: not sentinels, found by the sample
            assert 23 <= found["step"] <= 30, case
        else:
            assert found["step"] == 23, case


def test_eval_with_model_eval_is_quiet_and_without_is_found(workdir: Path) -> None:
    for calls_eval in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.1), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        run = workdir / f"run-{calls_eval}"
        guard = trainguard.watch(model, opt, total_steps=4, run_dir=run)
        for _ in range(4):
            model.train()
            x, y = _batch()
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            guard.step(torch.tensor(1.0))
            if calls_eval:
                model.eval()
            with guard.phase("eval"), torch.no_grad():
                model(torch.randn(32, 8))
        guard.finish()
        found = _contracts(run)
        if calls_eval:
            assert found == {}
        else:
            assert found["eval-in-train-mode"]["modules"] == ["1 (BatchNorm1d)", "2 (Dropout)"]


def test_replicas_rule_compares_every_rank_and_names_the_parameter() -> None:
    def checksum(rank: int, step: int, sums: list[float]) -> dict:
        return {"kind": "contract", "name": "param-checksum", "rank": rank, "step": step,
                "data": {"rank": rank, "names": ["fc.weight", "fc.bias"], "sums": sums}}

    engine = Engine({})
    same = engine.feed_all([checksum(0, 1, [1.5, 0.25]), checksum(1, 1, [1.5, 0.25])])
    assert [f.name for f in same] == []
    found = engine.feed_all([checksum(1, 10, [1.5, 0.26]), checksum(0, 10, [1.5, 0.25])])
    assert [f.code for f in found] == ["TG701"]
    assert found[0].evidence["param"] == "fc.bias" and found[0].evidence["ranks"] == [0, 1]
    # other ranks' events reach only the rules that compare ranks: a rank-1 crash is not rank 0's finding
    assert engine.feed({"kind": "contract", "name": "grads-never-reset", "rank": 1, "step": 3,
                        "data": {"param": "w", "steps": [2, 3]}}) == []


def test_grad_scaler_on_the_cpu_without_autocast_is_left_alone(workdir: Path) -> None:
    # On CUDA a GradScaler without autocast is fp16 forgotten (scenario contract_autocast_missing_cuda);
    # on the CPU it is a deliberate choice (the zoo's quiet_grad_scaler), and autocast inside is quiet too.
    for autocast in (False, True):
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu")
        run = workdir / f"run-{autocast}"
        guard = trainguard.watch(model, opt, total_steps=5, scaler=scaler, run_dir=run)
        for _ in range(5):
            x, y = _batch()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = nn.functional.mse_loss(model(x).float(), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            guard.step(loss)
        guard.finish()
        assert _contracts(run) == {}


class _Jitter(torch.utils.data.Dataset):
    """Points with noise from a generator the dataset owns (seeded once, in the parent)."""

    def __init__(self) -> None:
        import numpy as np

        self.x = torch.randn(64, 4)
        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i] + float(self.rng.normal())


def test_one_worker_restarted_each_epoch_repeats_its_draws(workdir: Path) -> None:
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(_Jitter(), batch_size=16, num_workers=1)
    guard = trainguard.watch(model, opt, total_steps=8, run_dir=workdir / "run")
    for _ in range(2):
        for xb in guard.batches(loader):
            opt.zero_grad()
            model(xb).pow(2).mean().backward()
            opt.step()
            guard.step(torch.tensor(1.0))
    guard.finish()
    found = _contracts(workdir / "run")["workers-share-rng"]
    assert found["across"] == "epochs" and found["generator"] == "dataset.rng"
    assert found["first"]["epoch"] == 1 and found["second"]["epoch"] == 2
    assert found["first"]["draws"] == found["second"]["draws"]
    assert loader.worker_init_fn is not None  # chained for the first epochs only: the user's (None) comes back
    guard2 = trainguard.watch(model, opt, total_steps=8, run_dir=workdir / "run2")
    guard2.contracts.workers.epochs = 4
    list(guard2.batches(loader))
    assert loader.worker_init_fn is None
    guard2.finish()


def test_a_batch_of_one_squeezed_is_found_and_kept_or_always_unbatched_is_quiet(workdir: Path) -> None:
    def run(name: str, last: str) -> dict[str, dict]:
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        guard = trainguard.watch(model, opt, total_steps=6, run_dir=workdir / name)
        for step in range(6):
            rows = 1 if step == 5 else 16
            if last == "unbatched":  # an actor-critic acting on one state at a time: (8,) from the start
                x = torch.randn(8)
            else:
                x = torch.randn(rows, 1, 8).squeeze() if last == "squeezed" else torch.randn(rows, 1, 8).squeeze(1)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            guard.step(loss)
        guard.finish()
        return _contracts(workdir / name)

    found = run("squeezed", "squeezed")
    assert found["batch-dim-lost"]["input_shape"] == [8] and found["batch-dim-lost"]["usual_shape"] == [16, 8]
    assert run("kept", "kept") == {}
    assert run("unbatched", "unbatched") == {}


def test_a_batch_of_one_squeezed_that_makes_the_forward_raise_is_named(workdir: Path) -> None:
    # Batch norm refuses the unbatched input: the forward raises, and the check (in the forward mark's
    # post-hook, called for raising forwards too) still names the lost dimension behind the error.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt, total_steps=6, run_dir=workdir / "run")
    raised = None
    for step in range(6):
        x = torch.randn(1 if step == 5 else 16, 1, 8).squeeze()
        try:
            loss = model(x).pow(2).mean()
        except (ValueError, RuntimeError) as exc:
            raised = exc
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        guard.step(loss)
    guard.finish()
    assert raised is not None
    found = _contracts(workdir / "run")["batch-dim-lost"]
    assert found["input_shape"] == [8] and found["usual_shape"] == [16, 8]


def test_workers_alike_are_named_before_epochs_alike_even_when_a_worker_file_comes_late(workdir: Path) -> None:
    """Under load one worker's file was still being written when the next epoch's were read: the two
    epochs' worker 0 matched first and the same-workers bug was named same-epochs."""
    import json

    from trainguard.probe.workerrng import Reports

    reports = Reports(workdir)
    reports.epochs = 2
    folder = workdir / "workers"
    folder.mkdir()
    same = {"dataset.rng": {"type": "Generator", "state": "abc", "draws": [0.6, 0.2]}}

    def write(base: int, worker: int) -> None:
        (folder / f"worker-{base}-{worker}.json").write_text(json.dumps(
            {"worker": worker, "workers": 2, "base_seed": base, "pid": 1, "dataset": "D", "rngs": same}))

    write(100, 0)
    write(200, 0)  # epoch 2's first worker, while epoch 1's worker 1 is not written yet
    assert reports.compare() is None
    write(100, 1)
    found = reports.compare()
    assert found is not None and found["across"] == "workers"
    assert {found["first"]["worker"], found["second"]["worker"]} == {0, 1}


def _loader(batches: int, rows: int = 16, last_rows: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A loader's batches as guard.batches sees them: (x, y) of `rows` rows, the last of `last_rows`."""
    torch.manual_seed(1)
    out = []
    for i in range(batches):
        n = last_rows if last_rows is not None and i == batches - 1 else rows
        x = torch.randn(n, 1, 8)
        out.append((x, x.sum((1, 2)).unsqueeze(1)))
    return out


def _counted_pre_hook(model: nn.Module, guard) -> list[bool]:
    """Wraps the contract checks' forward pre-hook in the model's hook dictionary and returns the list
    each call appends the model's mode to."""
    hooks = model._forward_pre_hooks
    key = next(k for k, fn in hooks.items() if getattr(fn, "__self__", None) is guard.contracts)
    hook = hooks[key]
    calls: list[bool] = []

    def counted(*args):
        calls.append(args[0].training)
        return hook(*args)

    hooks[key] = counted
    return calls


def test_with_guard_batches_a_batch_of_one_mid_window_is_still_looked_at(workdir: Path) -> None:
    # the epoch's last batch has one row and comes third in its accumulation window: every training
    # forward is looked at (taking the pre-hook out for a window's later forwards was tried for issue 21
    # and left: a batch of one a prefetcher, a squeezing collate or a split hides from the loader is missed)
    model, accum = _net(), 4
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt, total_steps=12, grad_accum=accum, run_dir=workdir / "run")
    for i, (x, _) in enumerate(guard.batches(_loader(47, last_rows=1)), start=1):
        loss = model(x.squeeze()).pow(2).mean()  # the bug: squeeze() takes the batch dimension of one row
        (loss / accum).backward()
        guard.step(loss)
        if i % accum == 0:
            opt.step()
            opt.zero_grad()
    guard.finish()
    found = _contracts(workdir / "run")["batch-dim-lost"]
    assert found["input_shape"] == [8] and found["usual_shape"] == [16, 8]


def test_with_guard_batches_an_evaluation_after_a_step_is_looked_at(workdir: Path) -> None:
    # no phase, no due(): an evaluation in training mode after an optimizer step is found, and each of its
    # forwards is progress
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    guard = trainguard.watch(model, opt, total_steps=20, grad_accum=2, run_dir=workdir / "run")
    calls = _counted_pre_hook(model, guard)
    for i, (x, y) in enumerate(guard.batches(_loader(40)), start=1):
        (nn.functional.mse_loss(model(x.squeeze(1)), y) / 2).backward()
        guard.step(torch.tensor(1.0))
        if i % 2:
            continue
        opt.step()
        opt.zero_grad()
        if i == 30:  # step 15, not a sampled one
            seen, ticks = len(calls), guard.state.ticks
            with torch.no_grad():  # the model left in training mode: the bug
                for _ in range(5):
                    model(torch.randn(32, 8))
            assert len(calls) - seen == 5 and guard.state.ticks - ticks == 5
    guard.finish()
    assert _contracts(workdir / "run")["eval-in-train-mode"]["modules"] == ["1 (Dropout)"]


def test_outputs_and_batches_the_checks_cannot_read_leave_the_loop_alone(workdir: Path) -> None:
    # a nested tensor as a batch (no sizes) and as the model's output on sampled steps: the checks that
    # read shapes give up, said in guard.log, and the loop trains as it would unguarded
    class Scorer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 1)

        def forward(self, x):  # a nested batch in, a nested tensor of per-sample scores out
            return torch.nested.as_nested_tensor([self.lin(t).squeeze(-1) for t in x.unbind()])

    torch.manual_seed(0)
    model = Scorer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = trainguard.watch(model, opt, total_steps=12, run_dir=workdir / "run")
    data = [torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)]) for _ in range(12)]
    for x in guard.batches(data):
        loss = sum(t.sum() for t in model(x).unbind())
        loss.backward()
        guard.step(loss)
        opt.step()
        opt.zero_grad()
    guard.finish()
    with RunReader(workdir / "run") as reader:
        assert [r["step"] for r in reader.steps()] == list(range(1, 13))
