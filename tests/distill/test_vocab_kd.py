"""Vocabulary overlap by exact strings (failures 1, 4) and sparse top-k KD (exactness, chunking, NaN-free)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainguard.recipes.distill.build import token_bytes_table
from trainguard.recipes.distill.kd import sparse_kd, teacher_targets
from trainguard.recipes.distill.vocab_map import build_vocab_map


def test_vocab_map_pairs_identical_strings_never_index_i_to_i(toks):
    t_tok, s_tok = toks
    vmap = build_vocab_map(t_tok.token_bytes, s_tok.token_bytes, t_tok.vocab_size + 7)  # + padded rows
    mapped = (vmap >= 0).nonzero().squeeze(-1).tolist()
    assert len(mapped) > 200
    for tid in mapped:
        assert t_tok.token_bytes[tid] == s_tok.token_bytes[int(vmap[tid])]
    assert len(set(vmap[mapped].tolist())) == len(mapped)  # one-to-one
    assert (vmap[t_tok.vocab_size:] == -1).all()  # padded embedding rows never map
    # index i is never assumed to mean the same token on both sides (digit splitting shifts the ids)
    assert sum(int(vmap[tid]) != tid for tid in mapped) > 10


def test_same_tokenizer_maps_every_id_to_itself(toks):
    t_tok, _ = toks
    vmap = build_vocab_map(t_tok.token_bytes, t_tok.token_bytes, t_tok.vocab_size)
    normal = [i for i, b in enumerate(t_tok.token_bytes) if b is not None]
    assert vmap[normal].tolist() == normal


def test_space_markers_are_normalised_between_byte_level_and_sentencepiece():
    from tokenizers import Tokenizer, decoders, models

    bl = Tokenizer(models.WordLevel({"Ġthe": 0, "the": 1, "Ġ": 2, "<unk>": 3}, unk_token="<unk>"))
    bl.decoder = decoders.ByteLevel()
    sp = Tokenizer(models.WordLevel({"▁the": 0, "<0x20>": 1, "the": 2, "<unk>": 3}, unk_token="<unk>"))
    sp.decoder = decoders.Metaspace()
    b_bytes, s_bytes = token_bytes_table(bl), token_bytes_table(sp)
    assert b_bytes[0] == s_bytes[0] == b" the" and s_bytes[1] == b" "
    assert build_vocab_map(b_bytes, s_bytes, 4).tolist()[:3] == [0, 2, 1]


def _identity_head(h):
    return h


def test_topk_equals_full_vocab_kl_when_k_is_the_vocabulary():
    torch.manual_seed(0)
    V, N, T = 50, 13, 2.0
    zt, zs = torch.randn(N, V) * 3, torch.randn(N, V) * 3
    tt = teacher_targets(zt, _identity_head, torch.arange(V), V, T, V, chunk=4)
    ours = sparse_kd(zs, tt, T)
    ref = F.kl_div(F.log_softmax(zs / T, -1), F.log_softmax(zt / T, -1), log_target=True, reduction="none").sum(-1) * T**2
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_cross_vocab_kd_is_kl_of_the_partition_with_tail():
    torch.manual_seed(1)
    Vt, Vs, N, T, k = 40, 30, 6, 1.5, 12
    vmap = torch.full((Vt,), -1)
    perm = torch.randperm(Vs)[:20]
    vmap[torch.randperm(Vt)[:20]] = perm  # 20 shared strings, at unrelated indices
    zt, zs = torch.randn(N, Vt) * 2, torch.randn(N, Vs) * 2
    tt = teacher_targets(zt, _identity_head, vmap, k, T, Vs, chunk=5)
    ours = sparse_kd(zs, tt, T)
    pt, qs = F.softmax(zt / T, -1), F.softmax(zs / T, -1)
    for n in range(N):  # brute force: bins = mapped ids among the teacher's top-k, plus one tail bin
        top = zt[n].topk(k).indices
        kl, pm, qm = 0.0, 0.0, 0.0
        for tid in top.tolist():
            if vmap[tid] >= 0:
                p, q = pt[n, tid], qs[n, vmap[tid]]
                kl += p * (p.log() - q.log())
                pm, qm = pm + p, qm + q
        kl += (1 - pm) * (torch.log(1 - pm) - torch.log(1 - qm))
        torch.testing.assert_close(ours[n], kl * T**2, rtol=1e-4, atol=1e-5)
    assert (ours >= -1e-6).all()


def test_kd_chunking_changes_nothing_and_gradients_stay_finite():
    torch.manual_seed(2)
    V, N = 64, 37
    zt = torch.randn(N, V) * 4
    zs = torch.randn(N, V, requires_grad=True)
    a = teacher_targets(zt, _identity_head, torch.arange(V), V, 1.0, V, chunk=5)
    b = teacher_targets(zt, _identity_head, torch.arange(V), V, 1.0, V, chunk=1000)
    assert torch.equal(a.sid, b.sid) and torch.allclose(a.logp, b.logp)
    assert torch.isneginf(a.tail).all()  # k = V, all mapped: no tail
    loss = sparse_kd(zs, a, 1.0).sum()
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(zs.grad).all()


def test_kd_is_zero_when_student_matches_teacher():
    torch.manual_seed(3)
    z = torch.randn(5, 20)
    tt = teacher_targets(z, _identity_head, torch.arange(20), 8, 2.0, 20, chunk=2)
    assert sparse_kd(z.clone(), tt, 2.0).abs().max() < 1e-5
