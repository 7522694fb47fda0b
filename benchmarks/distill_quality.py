"""Does distillation help? A student distilled from a trained teacher vs the same student on LM loss alone.

    python benchmarks/distill_quality.py [--teacher-steps 300] [--student-steps 150] [--seeds 0 1] [--out r.json]
        [--teacher-dir DIR] [--same-tokenizer] [--arms kd lm_only] [--set loss.kd.xtok=uld ...]

CPU, offline, one thread; about four minutes per seed on an idle core. Steps:
1. a Qwen2-shaped teacher (its own digit-splitting BPE) is trained with LM loss on the shipped corpus
   and saved as a local Hugging Face folder;
2. a Llama-shaped student (its own, different BPE) is trained by the recipe for the same number of
   optimizer steps twice, from the same initialisation and data order: with KD + hidden-state
   distillation from that teacher (the bundled config's KD settings; hidden-state weight --hidden-weight),
   and with LM loss alone (kd and hidden weights 0); repeated per --seeds (student init and data order);
3. held-out bits per byte of each (comparable across tokenizers) are printed as one JSON line.

`--same-tokenizer` gives the teacher the student's tokenizer (the upper bound of what KD can give here);
`--teacher-dir` keeps the trained teacher in a folder and reuses it when it is already there (the
teacher is deterministic: retrained, it gives the same bpb); `--set` overrides a dotted key of the
KD student's config (one variable at a time).
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
    ap.add_argument("--teacher-steps", type=int, default=300, help="LM-only optimizer steps of the teacher")
    ap.add_argument("--student-steps", type=int, default=150, help="optimizer steps of each student")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="student seeds (init and data order)")
    ap.add_argument("--hidden-weight", type=float, default=0.0, help="end weight of hidden-state distillation")
    ap.add_argument("--out", default=None, help="also write the JSON result to this path")
    ap.add_argument("--teacher-dir", default=None, help="reuse the teacher saved here (trained and saved if absent)")
    ap.add_argument("--same-tokenizer", action="store_true", help="the teacher uses the student's tokenizer")
    ap.add_argument("--student-teacher-tokenizer", action="store_true",
                    help="both arms' student uses the teacher's tokenizer settings (512 ids, digits split)")
    ap.add_argument("--arms", nargs="+", default=["kd", "lm_only"], choices=["kd", "lm_only"])
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="dotted override of the KD student's config, VALUE read as YAML (repeatable)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = yaml.safe_load(BUNDLED_CONFIG.read_text())
    base["config_dir"] = None
    base.pop("config_dir")
    base["data"]["eval_windows"] = 0  # the whole held-out file
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tdir = Path(args.teacher_dir) if args.teacher_dir else Path(tmp) / "teacher"
        tcfg = copy.deepcopy(base)
        tcfg["teacher"] = copy.deepcopy(TEACHER)
        if args.same_tokenizer:
            tcfg["teacher"].update(vocab_size=base["student"]["vocab_size"],
                                   split_digits=base["student"].get("split_digits", False))
        if (tdir / "bpb.json").is_file():
            teacher_bpb = json.loads((tdir / "bpb.json").read_text())["bpb"]
        else:
            teacher_bpb = train_teacher(tcfg, args.teacher_steps, tdir)
            (tdir / "bpb.json").write_text(json.dumps({"bpb": teacher_bpb}))
        t_teacher = time.time() - t0

        results: dict[str, list[dict]] = {"kd": [], "lm_only": []}
        arms = [(a, a == "kd") for a in args.arms]
        for seed, (name, kd_on) in ((s, m) for s in args.seeds for m in arms):
            d = copy.deepcopy(base)
            d["seed"] = seed
            d["teacher"] = {"path": str(tdir)}
            if args.student_teacher_tokenizer:
                d["student"].update(vocab_size=TEACHER["vocab_size"], split_digits=TEACHER["split_digits"])
            d["loss"]["hidden"].update(start=0.0, end=args.hidden_weight)
            d["train"].update(max_steps=args.student_steps, eval_every=args.student_steps,
                              save_every=args.student_steps, log_every=10**9, batch_size=16, grad_accum=1)
            d["optim"]["warmup_steps"] = 20
            if kd_on:
                for item in args.overrides:
                    key, _, value = item.partition("=")
                    node = d
                    *parents, leaf = key.split(".")
                    for part in parents:
                        node = node.setdefault(part, {})
                    node[leaf] = yaml.safe_load(value)
            else:
                d["loss"]["kd"].update(start=0.0, end=0.0)
                d["loss"]["hidden"].update(start=0.0, end=0.0)
            cfg = parse_config(d)
            r = train(cfg, run_dir=Path(tmp) / f"{name}-{seed}", verbose=False)
            results[name].append(r["evals"][-1])

    def mean(name: str, key: str) -> float | None:
        return sum(e[key] for e in results[name]) / len(results[name]) if results[name] else None

    def r4(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    out = {
        "benchmark": "distill_quality", "device": "cpu", "teacher_steps": args.teacher_steps,
        "student_steps": args.student_steps, "seeds": args.seeds, "hidden_weight": args.hidden_weight,
        "same_tokenizer": args.same_tokenizer, "student_teacher_tokenizer": args.student_teacher_tokenizer,
        "overrides": args.overrides,
        "teacher_bpb": round(teacher_bpb, 4),
        "student_kd_bpb": [round(e["bpb"], 4) for e in results["kd"]],
        "student_lm_only_bpb": [round(e["bpb"], 4) for e in results["lm_only"]],
        "mean_kd_bpb": r4(mean("kd", "bpb")), "mean_lm_only_bpb": r4(mean("lm_only", "bpb")),
        "kd_beats_lm_only_every_seed": all(k["bpb"] < m["bpb"] for k, m in zip(results["kd"], results["lm_only"]))
        if results["kd"] and results["lm_only"] else None,
        "align_ratio": round(results["kd"][0]["align_ratio"], 3) if results["kd"] else None,
        "seconds": round(time.time() - t0, 1), "teacher_seconds": round(t_teacher, 1),
    }
    line = json.dumps(out)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
