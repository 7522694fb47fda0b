"""Where does the teacher's signal go across tokenizers? Positions and probability mass that survive mapping.

    python benchmarks/distill_xtok_mass.py --teacher-dir DIR [--windows 200] [--top-k 64] [--vocab-map merge]

DIR is a teacher saved by `distill_quality.py --teacher-dir` (model + tokenizer.json). The student's
tokenizer is trained exactly as the benchmark trains it (the bundled config's). Over held-out windows:

- positions: the share of student positions with a target that are aligned (same bytes read on both
  sides), and among those the share whose next token also ends at a teacher token boundary;
- mass: at aligned positions, the teacher's probability (full vocabulary, T = 1) on teacher ids that map
  to a student id (`vocab_map`), and on the mapped ids inside its top-k;
- target: how often the student's actual next token is a mapped id at all, how often the mapped teacher
  top-1 is the student's next token, and the teacher's mean probability of the student's next token
  through the map against the same probability by the chain rule over the teacher tokens that spell it
  (where the student token ends on a teacher boundary);
- partial (`loss.kd.partial`): at unaligned positions, the teacher's distribution at the last boundary
  conditioned on the bytes read since (partial.py): the mass that maps, and how often its top-1 is right.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import yaml

from trainguard.recipes.distill import BUNDLED_CONFIG
from trainguard.recipes.distill.build import load_tokenizer
from trainguard.recipes.distill.config import parse_config
from trainguard.recipes.distill.data import prepare, read_text, windows
from trainguard.recipes.distill.partial import PartialMapper
from trainguard.recipes.distill.vocab_map import build_vocab_map


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher-dir", required=True)
    ap.add_argument("--windows", type=int, default=200, help="held-out windows read (0 = all)")
    ap.add_argument("--top-k", type=int, default=64)
    ap.add_argument("--vocab-map", default="strict", choices=["strict", "merge"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    base = yaml.safe_load(BUNDLED_CONFIG.read_text())
    base["teacher"] = {"path": args.teacher_dir}
    cfg = parse_config(base)
    train_text = read_text(cfg.resolve_path(cfg.data.train))
    t_tok = load_tokenizer("teacher", cfg.teacher, train_text)
    s_tok = load_tokenizer("student", cfg.student, train_text)
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher_dir).eval()
    V_t = teacher.get_output_embeddings().weight.shape[0]
    vmap = build_vocab_map(t_tok.token_bytes, s_tok.token_bytes, V_t, mode=args.vocab_map)
    V_s = len(s_tok.token_bytes)
    bins = torch.where(vmap >= 0, vmap, V_s)  # merge: several teacher ids share a student id
    mapped_ids = vmap >= 0
    ex = prepare(windows(read_text(cfg.resolve_path(cfg.data.eval)), cfg.data.window_chars), s_tok, t_tok,
                 partial=PartialMapper(t_tok.token_bytes, s_tok.token_bytes))
    n_part = 0
    part_mass = part_right = 0.0
    if args.windows:
        ex = ex[: args.windows]
    n_pos = n_al = n_next = 0
    mass = mass_k = 0.0
    tgt_mapped = top1_right = 0
    p_map = p_chain = 0.0
    n_chain = 0
    with torch.no_grad():
        for e in ex:
            logits = teacher(input_ids=torch.tensor([e.teacher.ids])).logits[0].float()
            logp = logits.log_softmax(-1)
            n_pos += len(e.student.ids) - 1
            t_at_end = {end: q for q, end in enumerate(e.teacher.ends)}
            for p, q0, tids, sids in e.partial or []:
                n_part += 1
                lp = logp[q0, tids]
                cond = (lp - torch.logsumexp(lp, 0)).exp()
                sid_t = torch.tensor(sids)
                part_mass += float(cond[sid_t >= 0].sum())
                student_p = torch.zeros(V_s + 1).scatter_add_(0, torch.where(sid_t >= 0, sid_t, V_s), cond)[:V_s]
                part_right += int(student_p.argmax()) == e.student.ids[p + 1]
            for p, q in e.pairs:
                n_al += 1
                lp = logp[q]
                pr = lp.exp()
                mass += float(pr[mapped_ids].sum())
                top = lp.topk(args.top_k)
                mass_k += float(top.values.exp()[mapped_ids[top.indices]].sum())
                s_next = e.student.ids[p + 1]
                if bool((vmap == s_next).any()):
                    tgt_mapped += 1
                student_p = torch.zeros(V_s + 1).scatter_add_(0, bins, pr)[:V_s]
                p_map += float(student_p[s_next])
                top1_right += int(student_p.argmax()) == s_next
                end = e.student.ends[p + 1]
                if end in t_at_end:  # the student's next token is spelled by teacher tokens q+1..q'
                    n_next += 1
                    q2 = t_at_end[end]
                    chain = sum(float(logp[j, e.teacher.ids[j + 1]]) for j in range(q, q2))
                    p_chain += math.exp(chain)
                    n_chain += 1
    out = {
        "vocab_map": args.vocab_map, "windows": len(ex), "student_positions": n_pos, "aligned_share": round(n_al / n_pos, 4),
        "aligned_next_token_on_teacher_boundary_share": round(n_next / max(1, n_al), 4),
        "teacher_mass_on_mapped_ids": round(mass / n_al, 4),
        f"teacher_mass_on_mapped_ids_in_top{args.top_k}": round(mass_k / n_al, 4),
        "mapped_teacher_ids": int(mapped_ids.sum()), "teacher_vocab": V_t,
        "student_target_is_mapped_share": round(tgt_mapped / n_al, 4),
        "mapped_teacher_top1_is_student_target_share": round(top1_right / n_al, 4),
        "teacher_p_of_student_target_through_map_mean": round(p_map / n_al, 4),
        "teacher_p_of_student_target_by_chain_rule_mean": round(p_chain / max(1, n_chain), 4),
        "partial_share_of_student_positions": round(n_part / n_pos, 4),
        "partial_conditioned_mass_on_mapped_ids": round(part_mass / max(1, n_part), 4),
        "partial_top1_is_student_target_share": round(part_right / max(1, n_part), 4),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
