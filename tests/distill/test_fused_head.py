"""The fused student head (LM CE + sparse KD, hand-written gradients) against plain autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainguard.recipes.distill.fused_head import head_losses
from trainguard.recipes.distill.kd import GraphedTargets, TeacherTargets, sparse_kd, teacher_targets


def _case(seed: int, T: float, k: int):
    g = torch.Generator().manual_seed(seed)
    M, H, Vs, Vt, Ht = 23, 12, 40, 55, 10
    h = torch.randn(M, H, generator=g, dtype=torch.float64)
    w = torch.randn(Vs, H, generator=g, dtype=torch.float64) * 0.7
    labels = torch.randint(0, Vs, (M,), generator=g)
    labels[[2, 9, 17]] = -100  # padding rows
    vmap = torch.full((Vt,), -1)
    vmap[torch.randperm(Vt, generator=g)[:30]] = torch.randperm(Vs, generator=g)[:30]
    head_t = torch.nn.Linear(Ht, Vt, bias=False).double()
    with torch.no_grad():
        head_t.weight.copy_(torch.randn(Vt, Ht, generator=g, dtype=torch.float64))
    rows = torch.tensor([0, 1, 3, 4, 5, 8, 10, 11, 12, 15, 16, 20, 22])  # aligned student rows
    tt = teacher_targets(torch.randn(len(rows), Ht, generator=g, dtype=torch.float64), head_t, vmap, k, T, Vs, chunk=4,
                         tile=16)
    return h, w, labels, rows, tt, Vs


@pytest.mark.parametrize("T,k", [(1.0, 8), (2.0, 8), (1.5, 55)])
def test_fused_head_matches_autograd_losses_and_gradients(T, k):
    h, w, labels, rows, tt, Vs = _case(int(T * 10) + k, T, k)
    M = h.shape[0]
    has = torch.zeros(M, dtype=torch.bool)
    has[rows] = True
    sid = torch.full((M, tt.sid.shape[1]), Vs, dtype=torch.int32)
    logp = torch.zeros(M, tt.sid.shape[1], dtype=torch.float64)
    mapped = torch.zeros(M, tt.sid.shape[1], dtype=torch.bool)
    tail = torch.full((M,), float("-inf"), dtype=torch.float64)
    sid[rows], logp[rows], mapped[rows], tail[rows] = tt.sid, tt.logp.double(), tt.mapped, tt.tail.double()

    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    ce, kd = head_losses(h1, w1, labels, has, sid, logp, mapped, tail, T, chunk=5)
    (0.3 * ce + 0.8 * kd).backward()

    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    z = h2 @ w2.T
    ce_ref = F.cross_entropy(z, labels, reduction="sum", ignore_index=-100)
    kd_ref = sparse_kd(z[rows], TeacherTargets(tt.sid, tt.logp.double(), tt.mapped, tt.tail.double()), T).sum()
    (0.3 * ce_ref + 0.8 * kd_ref).backward()

    torch.testing.assert_close(ce.double(), ce_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kd.double(), kd_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-4, atol=1e-6)


def test_streamed_teacher_targets_equal_the_whole_row_top_k():
    """Tiles of 16 columns with a running top-k give the same ids, log-probs and tail as one topk."""
    torch.manual_seed(4)
    Vt, Vs, N, H, k, T = 300, 200, 37, 8, 24, 1.7
    head = torch.nn.Linear(H, Vt, bias=False)
    vmap = torch.full((Vt,), -1)
    vmap[torch.randperm(Vt)[:150]] = torch.randperm(Vs)[:150]
    x = torch.randn(N, H) * 3
    streamed = teacher_targets(x, head, vmap, k, T, Vs, chunk=5, tile=16)
    with torch.no_grad():
        z = head(x) / T
    lse = torch.logsumexp(z, -1, keepdim=True)
    top, idx = z.topk(k, -1)
    sid = vmap[idx]
    # the same entries, in any order (the walk does not sort): compare rows sorted by log-prob
    order = streamed.logp.argsort(-1)
    want = torch.where(sid >= 0, top - lse, 0.0)
    torch.testing.assert_close(streamed.logp.gather(-1, order), want.sort(-1).values)
    assert torch.equal(streamed.sid.long().sort(-1).values, torch.where(sid >= 0, sid, Vs).sort(-1).values)
    masked = z.scatter(-1, idx, torch.where(sid >= 0, float("-inf"), top))
    torch.testing.assert_close(streamed.tail, (torch.logsumexp(masked, -1, keepdim=True) - lse).squeeze(-1),
                               rtol=1e-5, atol=1e-5)
    # the working set is one tile, not the row: at most chunk x tile logits at once
    assert streamed.sid.dtype == torch.int32 and streamed.nbytes() == N * k * (4 + 4 + 1) + N * 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only: graph replay and bf16 autocast")
def test_cuda_graph_targets_and_bf16_fused_head_match_the_eager_reference():
    torch.manual_seed(5)
    dev = torch.device("cuda")
    Vt, Vs, N, H, k = 5000, 3000, 700, 64, 64
    head = torch.nn.Linear(H, Vt, bias=False).to(dev, torch.bfloat16)
    vmap = torch.full((Vt,), -1, device=dev)
    vmap[torch.randperm(Vt, device=dev)[:2500]] = torch.randperm(Vs, device=dev)[:2500]
    x = torch.randn(N, H, device=dev, dtype=torch.bfloat16) * 2
    eager = teacher_targets(x, head, vmap, k, 1.0, Vs, chunk=256, kernel=False)
    kernel = teacher_targets(x, head, vmap, k, 1.0, Vs, chunk=256, kernel=True)
    # the Triton walk selects the same values (ties may pick other ids of equal value)
    torch.testing.assert_close(kernel.logp.sort(-1).values, eager.logp.sort(-1).values)
    eager = kernel
    graphed = GraphedTargets(head, vmap, k, 1.0, Vs, chunk=256)
    for n in (N, N - 37):  # two padded sizes, the second replayed from the first's graph
        got = graphed(x[:n])
        assert torch.equal(got.sid, eager.sid[:n]) and torch.equal(got.mapped, eager.mapped[:n])
        torch.testing.assert_close(got.logp, eager.logp[:n])
        views = graphed(x[:n], clone=False)  # the step's form: the graph's own outputs, copied by the caller
        assert torch.equal(views.sid, got.sid) and torch.equal(views.logp, got.logp)
    hs = torch.randn(N, 48, device=dev, requires_grad=True)
    w = (torch.randn(Vs, 48, device=dev) * 0.2).requires_grad_()
    labels = torch.randint(0, Vs, (N,), device=dev)
    has = torch.ones(N, dtype=torch.bool, device=dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ce, kd = head_losses(hs, w, labels, has, eager.sid, eager.logp, eager.mapped, eager.tail, 1.0, chunk=256)
    (ce + kd).backward()
    h2, w2 = hs.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    z = (h2.bfloat16() @ w2.bfloat16().T).float()
    ref = F.cross_entropy(z, labels, reduction="sum") + sparse_kd(z, eager, 1.0).sum()
    ref.backward()
    torch.testing.assert_close(ce + kd, ref, rtol=1e-3, atol=1e-2)
    assert (hs.grad - h2.grad).norm() / h2.grad.norm() < 2e-2 and (w.grad - w2.grad).norm() / w2.grad.norm() < 2e-2


_KERNEL_CHECK = r"""
import torch
from trainguard.recipes.distill import topk_triton as tt
torch.manual_seed(0)
N, V, k, T = 6, 5000, 64, 1.3
full = (torch.randn(N, V) * 3).to(torch.bfloat16)
full[:, 100:400] = full[:, 100:101]  # a run of tied values across the k-th place
run_val, run_id = torch.empty((N, k), dtype=torch.bfloat16), torch.empty((N, k), dtype=torch.int32)
m, s = torch.full((N,), float("-inf")), torch.zeros(N)
tile = 700
for lo in range(0, V, tile):
    tt.merge_tile(full[:, lo:lo + tile].contiguous(), lo, run_val, run_id, m, s, 1 / T, k, lo == 0)
assert torch.equal(full.float().topk(k, -1).values.sort(-1).values, run_val.float().sort(-1).values)
assert torch.equal(full.float().gather(-1, run_id.long()), run_val.float())
assert all(len(set(r.tolist())) == k for r in run_id)
assert ((m + s.log()) - torch.logsumexp(full.float() / T, -1)).abs().max() < 1e-5
print("ok")
"""


def test_triton_top_k_merge_is_exact_in_the_interpreter():
    """The kernel (run by Triton's CPU interpreter): exactly the top-k values, ids that point at them,
    no id twice even across a run of ties at the k-th place, and the log-sum-exp of the whole row."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _KERNEL_CHECK], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
