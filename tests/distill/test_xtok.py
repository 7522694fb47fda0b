"""Cross-tokenizer KD losses (xtok.py): hand-computed cases, invariances, gradients, the recipe's switches."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainguard.errors import UserError
from trainguard.recipes.distill.kd import TeacherTargets
from trainguard.recipes.distill.losses import mapped_top1, renormalized
from trainguard.recipes.distill.xtok import TeacherToStudent, gold_rows, kl_rows, sorted_l1, uld_rows, xtok_kd


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor([probs]).log()


def test_uld_is_the_l1_of_sorted_probabilities_padded_with_zeros():
    # teacher 3 ids, student 2: sorted [.5 .3 .2] against [.6 .4 0] -> .1 + .1 + .2
    loss = uld_rows(_logits([0.2, 0.5, 0.3]), _logits([0.4, 0.6]), k=8, temperature=1.0)
    assert loss.item() == pytest.approx(0.4, abs=1e-6)
    # top-1 only: |.5 - .6| on the kept entry, |.5 - .4| between the remaining masses
    assert uld_rows(_logits([0.2, 0.5, 0.3]), _logits([0.4, 0.6]), k=1, temperature=1.0).item() == pytest.approx(0.2, abs=1e-6)


def test_uld_ignores_which_id_holds_which_probability():
    torch.manual_seed(0)
    zt, zs = torch.randn(5, 40) * 2, torch.randn(5, 30) * 2
    base = uld_rows(zt, zs, k=64, temperature=1.0)
    perm_t, perm_s = torch.randperm(40), torch.randperm(30)
    assert torch.allclose(uld_rows(zt[:, perm_t], zs[:, perm_s], k=64, temperature=1.0), base, atol=1e-6)
    # the same multiset of probabilities in another vocabulary (padded ids of probability 0) is distance 0
    same = torch.cat([zt[:, perm_t], torch.full((5, 7), -1e9)], dim=-1)
    assert uld_rows(zt, same, k=64, temperature=1.0).abs().max().item() < 1e-6
    assert sorted_l1(torch.ones(1, 3) / 3, torch.ones(1, 3) / 3, k=2).item() == pytest.approx(0.0, abs=1e-7)


def test_gold_is_kl_on_matched_ids_plus_sorted_l1_on_the_unmatched_rest():
    # teacher ids 0, 1 map to student ids 1, 0; teacher id 2 and student id 2 are unmatched
    vmap = torch.tensor([1, 0, -1])
    pt, qs = [0.5, 0.3, 0.2], [0.25, 0.25, 0.5]
    want = 0.5 * math.log(0.5 / 0.25) + 0.3 * math.log(0.3 / 0.25) + abs(0.2 - 0.5)
    assert gold_rows(_logits(pt), _logits(qs), vmap, k=8, temperature=1.0).item() == pytest.approx(want, abs=1e-6)
    # a student that copies the teacher through the map is at distance 0
    assert gold_rows(_logits(pt), _logits([0.3, 0.5, 0.2]), vmap, k=8, temperature=1.0).item() == pytest.approx(0, abs=1e-6)


def test_kl_rows_is_the_tempered_kl_times_t_squared_and_zero_on_a_match():
    torch.manual_seed(1)
    zt, zs, T = torch.randn(4, 9), torch.randn(4, 9), 2.0
    ref = F.kl_div((zs / T).log_softmax(-1), (zt / T).log_softmax(-1), log_target=True, reduction="none").sum(-1) * T * T
    assert torch.allclose(kl_rows(zt, zs, T), ref, atol=1e-6)
    assert kl_rows(zt, zt, T).abs().max().item() < 1e-6


@pytest.mark.parametrize("method", ["uld", "gold", "t2s"])
def test_gradients_reach_the_student_and_the_target_stays_fixed(method):
    torch.manual_seed(2)
    N, Vs, Vt, Hs, Ht = 6, 12, 15, 4, 5
    s_logits = torch.randn(N, Vs, requires_grad=True)
    t_hidden = torch.randn(N, Ht)
    t_logits = torch.randn(N, Vt)
    head = torch.randn(Vs, Hs, requires_grad=True)
    t2s = TeacherToStudent(Ht, Hs)
    vmap = torch.tensor([i if i < 10 else -1 for i in range(Vt)])
    labels = torch.randint(0, Vs, (N,))
    kd, proj_ce = xtok_kd(method, s_logits, labels, t_logits=t_logits, t_hidden=t_hidden, t2s=t2s,
                          s_head_weight=head, vocab_map=vmap, k=8, temperature=1.0)
    kd.backward(retain_graph=True)
    assert s_logits.grad is not None and torch.isfinite(s_logits.grad).all() and s_logits.grad.abs().sum() > 0
    assert head.grad is None  # the student's head is read, never trained, by the teacher's projection
    if method == "t2s":
        assert t2s.proj.weight.grad is None  # KD's target is detached: the student cannot pull it
        proj_ce.backward()
        assert t2s.proj.weight.grad is not None and t2s.proj.weight.grad.abs().sum() > 0
        assert head.grad is None
    else:
        assert proj_ce.item() == 0.0


def test_correct_only_keeps_rows_where_the_teachers_top1_is_the_students_next_token():
    vmap = torch.tensor([1, 0, -1])
    t_logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 5.0]])  # row 0: top-1 maps to student 1; row 1: unmapped top
    s_logits = torch.zeros(2, 3)
    all_rows, _ = xtok_kd("uld", s_logits, torch.tensor([1, 1]), t_logits=t_logits, vocab_map=vmap, k=3)
    kept, _ = xtok_kd("uld", s_logits, torch.tensor([1, 1]), t_logits=t_logits, vocab_map=vmap, k=3,
                      correct_only=True)
    # row 1's best mapped id is teacher 0 or 1 (tied at 0.0): argmax picks teacher 0 -> student 1 == label
    only0, _ = xtok_kd("uld", s_logits, torch.tensor([1, 0]), t_logits=t_logits, vocab_map=vmap, k=3,
                       correct_only=True)
    row0 = uld_rows(t_logits[:1], s_logits[:1], 3, 1.0).item()
    assert kept.item() == pytest.approx(all_rows.item()) and only0.item() == pytest.approx(row0)


def test_renormalized_targets_sum_to_one_without_a_tail_and_top1_is_the_best_mapped_id():
    logp = torch.tensor([[math.log(0.4), math.log(0.2), 0.0]])
    t = TeacherTargets(sid=torch.tensor([[3, 1, 7]], dtype=torch.int32), logp=logp,
                       mapped=torch.tensor([[True, True, False]]), tail=torch.tensor([math.log(0.4)]))
    r = renormalized(t)
    assert torch.where(r.mapped, r.logp.exp(), 0.0).sum().item() == pytest.approx(1.0)
    assert r.logp[0, 0].exp().item() == pytest.approx(2 / 3) and torch.isinf(r.tail).all()
    assert mapped_top1(t).tolist() == [3]


@pytest.mark.parametrize("over, needle", [
    ({"loss__kd__method": "wasserstein"}, "loss.kd.method must be one of kl, uld, gold, t2s"),
    ({"loss__kd__method": "uld", "loss__kd__renormalize": True}, "renormalize applies to method kl only"),
    ({"loss__kd__method": "t2s", "data__teacher_cache": "/x", "loss__hidden__end": 0.0},
     "teacher_cache holds mapped top-k targets for method kl"),
])
def test_unknown_or_impossible_kd_combinations_are_one_line_errors(make_cfg, over, needle):
    with pytest.raises(UserError) as info:
        make_cfg(**over)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_merge_map_sends_each_teacher_id_to_the_student_token_read_first():
    from trainguard.recipes.distill.vocab_map import build_vocab_map

    teacher = [b"a", b" the", b" there", b" th", None]
    student = [b"a", b" th", b" the"]
    # ' there' is not a student token: a student reading ' there...' reads ' the' first
    assert build_vocab_map(teacher, student, 6, mode="merge").tolist() == [0, 2, 2, 1, -1, -1]
    # strict: only "a" has the same extensions on both sides
    assert build_vocab_map(teacher, student, 6, mode="strict").tolist()[:4] == [0, -1, -1, -1]
    # a student ' then' that the teacher lacks: the teacher's ' the' and ' th' no longer say which token comes
    student2 = [*student, b" then"]
    assert build_vocab_map(teacher, student2, 5, mode="merge").tolist() == [0, -1, 2, -1, -1]
    with pytest.raises(ValueError):
        build_vocab_map(teacher, student, 5, mode="nearest")


def test_merged_targets_sum_shared_ids_and_kd_is_the_kl_of_the_merged_distributions():
    from trainguard.recipes.distill.kd import sparse_kd, teacher_targets
    from trainguard.recipes.distill.losses import merge_duplicates

    torch.manual_seed(3)
    Vt, Vs, N = 9, 5, 4
    vmap = torch.tensor([0, 0, 1, 2, 2, 2, 3, -1, -1])  # many-to-one; student id 4 and teacher 7, 8 unmatched
    zt, zs = torch.randn(N, Vt) * 2, torch.randn(N, Vs) * 2
    t = merge_duplicates(teacher_targets(zt, lambda h: h, vmap, Vt, 1.0, Vs, chunk=2), Vs)
    assert int(t.mapped.sum(-1).max()) == 4  # four distinct student ids
    pt = zt.softmax(-1)
    merged = torch.zeros(N, Vs + 1).scatter_add_(-1, torch.where(vmap >= 0, vmap, Vs).expand(N, -1), pt)
    # the student's side of the same partition: its 4 mapped ids, and id 4 joins the tail bin
    qs = zs.softmax(-1)
    q_bins = torch.cat([qs[:, :4], qs[:, 4:].sum(-1, keepdim=True)], -1)
    p_bins = torch.cat([merged[:, :4], merged[:, 4:].sum(-1, keepdim=True)], -1)
    want = (p_bins * (p_bins.log() - q_bins.log())).sum(-1)
    assert torch.allclose(sparse_kd(zs, t, 1.0), want, atol=1e-5)


def test_span_ends_and_chain_log_probs_add_the_teacher_tokens_that_spell_the_students_next_token():
    from trainguard.recipes.distill.losses import span_logprobs
    from trainguard.recipes.distill.tokenize_align import Encoded, align, span_ends

    student = Encoded(ids=[0, 5, 6], ends=[0, 4, 6], n_bytes=6)  # 'abcd' 'ef'
    teacher = Encoded(ids=[0, 7, 8, 9], ends=[0, 2, 4, 6], n_bytes=6)  # 'ab' 'cd' 'ef'
    pairs = align(student, teacher)
    assert pairs == [(0, 0), (1, 2)]
    assert span_ends(student, teacher, pairs) == [2, 3]  # 'abcd' = teacher tokens 1..2; 'ef' = token 3
    lp = torch.tensor([[-0.1, -0.2, -0.3, 0.0], [-1.0, -2.0, -3.0, 0.0]])  # two rows of 4 teacher positions
    got = span_logprobs(lp, torch.tensor([0, 2, 4 + 0]), torch.tensor([2, 3, 4 + 3]))
    assert torch.allclose(got, torch.tensor([-0.3, -0.3, -6.0]))


def test_chain_targets_put_the_chain_probability_on_the_next_token_and_keep_a_distribution():
    from trainguard.recipes.distill.losses import chain_targets

    Vs = 10
    sid = torch.tensor([[1, 2], [1, 2], [1, 2]], dtype=torch.int32)
    logp = torch.tensor([[0.5, 0.2]] * 3).log()
    t = TeacherTargets(sid, logp, torch.ones(3, 2, dtype=torch.bool), torch.tensor([0.3] * 3).log())
    star = torch.tensor([1, 3, 1])  # row 0: the next token is mapped (p 0.5); row 1: it is not; row 2: no span
    out = chain_targets(t, star, torch.tensor([0.8, 0.8, 0.8]).log(), torch.tensor([True, True, False]), Vs)
    p = torch.where(out.mapped, out.logp.exp(), 0.0)
    total = p.sum(-1) + out.tail.exp()
    assert torch.allclose(total, torch.ones(3), atol=1e-6)
    # row 0: 0.8 on id 1 (extra column), id 2 and the tail scaled by 0.2 / 0.5
    assert out.sid[0].tolist() == [Vs, 2, 1] and torch.allclose(p[0], torch.tensor([0.0, 0.08, 0.8]), atol=1e-6)
    assert out.tail[0].exp().item() == pytest.approx(0.12, abs=1e-6)
    # row 1: id 3 was nowhere: everything else scaled by 0.2
    assert out.sid[1].tolist() == [1, 2, 3] and torch.allclose(p[1], torch.tensor([0.1, 0.04, 0.8]), atol=1e-6)
    # row 2: unchanged, the extra column unmapped
    assert torch.allclose(p[2, :2], torch.tensor([0.5, 0.2])) and not out.mapped[2, 2] and out.sid[2, 2] == Vs


def test_partial_positions_condition_the_teacher_on_the_bytes_read_inside_its_token():
    from trainguard.recipes.distill.partial import PartialMapper, partial_positions

    teacher = [b" th", b" the", b" then", b" there", b"a", None]
    student = [b" th", b"e", b"ere", b"en", b"a"]
    m = PartialMapper(teacher, student)
    # after ' th': ' the' says 'e' (the student's 'ere' and 'en' are ' there' and ' then', both ruled out by the
    # teacher's ' the'), ' then' says 'en', ' there' says 'ere', ' th' itself ends here: tail
    assert m.resolve(b" th") == ([0, 1, 2, 3], [-1, 1, 3, 2])
    # a student 'ew' the teacher has no ' thew' for: after ' th', the teacher's ' the' no longer says 'e'
    m2 = PartialMapper(teacher, [*student, b"ew"])
    assert m2.resolve(b" th")[1] == [-1, -1, 3, 2]
    # student ' th' | 'ere' against teacher ' there': student position 1 (after ' th') ends inside it
    text = b" there a"
    rows = partial_positions([0, 3, 6, 8], [0, 6, 8], {0, 2}, text)
    assert rows == [(1, 0, b" th")]


def test_partial_targets_are_the_conditioned_teacher_distribution_with_the_rest_in_the_tail():
    from trainguard.recipes.distill.losses import partial_targets

    z = torch.tensor([[0.0, math.log(2.0), math.log(3.0), math.log(4.0), 5.0]])  # teacher id 4 is inconsistent
    tid = torch.tensor([[0, 1, 2, 3]])
    sid = torch.tensor([[-1, 1, 3, 2]])
    t = partial_targets(z, lambda h: h, tid, sid, 1.0, student_vocab=6)
    p = torch.where(t.mapped, t.logp.exp(), 0.0)
    assert torch.allclose(p, torch.tensor([[0.0, 0.2, 0.3, 0.4]]), atol=1e-6)
    assert t.tail.exp().item() == pytest.approx(0.1, abs=1e-6) and t.sid[0].tolist() == [6, 1, 3, 2]


def test_the_cross_tokenizer_defaults_change_nothing_with_one_tokenizer(toks):
    from trainguard.recipes.distill.data import prepare
    from trainguard.recipes.distill.partial import PartialMapper
    from trainguard.recipes.distill.vocab_map import build_vocab_map

    t_tok, s_tok = toks
    same = build_vocab_map(t_tok.token_bytes, t_tok.token_bytes, t_tok.vocab_size, mode="merge")
    normal = [i for i, b in enumerate(t_tok.token_bytes) if b is not None]
    assert same[normal].tolist() == normal  # merge is the identity
    text = ["Zoë said: 12345 ¿qué? the theory of everything 2025"]
    one = prepare(text, t_tok, t_tok, partial=PartialMapper(t_tok.token_bytes, t_tok.token_bytes))[0]
    assert one.partial == [] and len(one.pairs) == len(one.student.ids) - 1  # every position aligned, none partial
    two = prepare(text, s_tok, t_tok, partial=PartialMapper(t_tok.token_bytes, s_tok.token_bytes))[0]
    # across tokenizers every student position with a target is either aligned or inside a teacher token
    assert len(two.pairs) + len(two.partial) == len(two.student.ids) - 1 and two.partial
