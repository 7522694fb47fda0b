"""Does distillation help? A student distilled from a trained teacher vs the same student on LM loss alone.

    python benchmarks/distill_quality.py [--teacher-steps 600] [--student-steps 300] [--out result.json]

CPU, offline, about two minutes on one core. Steps:
1. a Qwen2-shaped teacher (its own digit-splitting BPE) is trained with LM loss on the shipped corpus
   and saved as a local Hugging Face folder;
2. a Llama-shaped student (its own, different BPE) is trained by the recipe for the same number of
   optimizer steps twice, from the same initialisation and data order: with KD + hidden-state
   distillation from that teacher, and with LM loss alone (kd and hidden weights 0);
3. held-out bits per byte of each (comparable across tokenizers) are printed as one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import tempfile
import time
from pathlib import Path

import torch
import yaml

from trainguard.recipes.distill import BUNDLED_CONFIG
from trainguard.recipes.distill.build import load_model, load_tokenizer
from trainguard.recipes.distill.config import parse_config
from trainguard.recipes.distill.data import eval_batches, prepare, read_text, train_batches, windows
from trainguard.recipes.distill.train import lr_lambda, train

TEACHER = {"arch": "qwen2", "vocab_size": 512, "split_digits": True,
           "build": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}}


def train_teacher(cfg_dict: dict, steps: int, out: Path) -> float:
    """LM-only training of the teacher; saves model + tokenizer to `out`; returns its held-out bpb."""
    cfg = parse_config(cfg_dict)
    text = read_text(cfg.resolve_path(cfg.data.train))
    tok = load_tokenizer("teacher", cfg.teacher, text)
    torch.manual_seed(0)
    model = load_model("teacher", cfg.teacher, tok)
    ex = prepare(windows(text, cfg.data.window_chars), tok, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(20, steps, 0.1))
    data = train_batches(ex, 16, 123, 0, 0, tok.bos_id, tok.bos_id)
    for _ in range(steps):
        _, _, b = next(data)
        # Hugging Face shifts labels itself: pass the inputs (pads masked), not the recipe's shifted labels
        labels = b["s_ids"].masked_fill(b["s_mask"] == 0, -100)
        loss = model(input_ids=b["s_ids"], attention_mask=b["s_mask"], labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    eval_ex = prepare(windows(read_text(cfg.resolve_path(cfg.data.eval)), cfg.data.window_chars), tok, tok)
    nll, n_bytes = 0.0, 0
    with torch.no_grad():
        for b in eval_batches(eval_ex, 16, tok.bos_id, tok.bos_id):
            logits = model(input_ids=b["s_ids"], attention_mask=b["s_mask"]).logits
            nll += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), reduction="sum"))
            n_bytes += b["n_bytes"]
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(out)
    tok.backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|bos|>"}))
    return nll / math.log(2) / n_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher-steps", type=int, default=600, help="LM-only optimizer steps of the teacher")
    ap.add_argument("--student-steps", type=int, default=300, help="optimizer steps of each student")
    ap.add_argument("--out", default=None, help="also write the JSON result to this path")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = yaml.safe_load(BUNDLED_CONFIG.read_text())
    base["config_dir"] = None
    base.pop("config_dir")
    base["data"]["eval_windows"] = 0  # the whole held-out file
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tdir = Path(tmp) / "teacher"
        tcfg = copy.deepcopy(base)
        tcfg["teacher"] = copy.deepcopy(TEACHER)
        teacher_bpb = train_teacher(tcfg, args.teacher_steps, tdir)
        t_teacher = time.time() - t0

        results = {}
        for name, kd_on in (("kd", True), ("lm_only", False)):
            d = copy.deepcopy(base)
            d["teacher"] = {"path": str(tdir)}
            d["train"].update(max_steps=args.student_steps, eval_every=args.student_steps,
                              save_every=args.student_steps, log_every=10**9, batch_size=16, grad_accum=1)
            d["optim"]["warmup_steps"] = 20
            if not kd_on:
                d["loss"]["kd"].update(start=0.0, end=0.0)
                d["loss"]["hidden"].update(start=0.0, end=0.0)
            cfg = parse_config(d)
            r = train(cfg, run_dir=Path(tmp) / name, verbose=False)
            results[name] = r["evals"][-1]
    out = {
        "benchmark": "distill_quality", "device": "cpu", "teacher_steps": args.teacher_steps,
        "student_steps": args.student_steps, "teacher_bpb": round(teacher_bpb, 4),
        "student_kd_bpb": round(results["kd"]["bpb"], 4), "student_lm_only_bpb": round(results["lm_only"]["bpb"], 4),
        "student_kd_ppl": round(results["kd"]["perplexity"], 3),
        "student_lm_only_ppl": round(results["lm_only"]["perplexity"], 3),
        "kd_beats_lm_only": results["kd"]["bpb"] < results["lm_only"]["bpb"],
        "align_ratio": round(results["kd"]["align_ratio"], 3),
        "seconds": round(time.time() - t0, 1), "teacher_seconds": round(t_teacher, 1),
    }
    line = json.dumps(out)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
