"""Students from the offline teacher cache against students with the teacher in memory: bpb and tokens/s.

    nice -n 10 python benchmarks/distill_cache_vs_online.py [--teacher-steps 120] [--student-steps 120] \
        [--seeds 0 1] [--out r.json]

CPU, one thread, offline. The point is the teacher/student compute ratio: the cache saves the teacher's
forward, so its speed-up is bounded by (student step + teacher forward) / student step, and it only shows
when both models are large enough for their matrix products, not per-operation overheads, to set the
time. Here (stated in the output, 2 x matmul parameters per token, attention scores left out):
a Qwen2 teacher of hidden 256, 6 layers (its own 512-id BPE with digits split) and a Llama student of
hidden 128, 2 layers (its own 400-id BPE): the teacher's forward is about 11x the student's (21x with
--teacher-layers 12). For scale,
the seeds' shapes (distill_topk_memory.py: a Qwen2-MoE teacher of hidden 1024, 24 layers, top-2 of 8
experts plus a shared one, vocabulary 151,936, into SmolLM-135M) are about 2.7x, where no cache can
reach 3x: (3 + 2.7) / 3 = 1.9x at most.

Steps: the teacher is trained with LM loss (distill_quality.train_teacher), the cache is built from it
(`build_cache`, k = the KD top-k), then per seed the same student (same init and data order) is trained
by the recipe twice: KD online and KD from the cache. Held-out bits per byte (the whole eval file) and
the loop's tokens/s (outside evaluation) of each, as one JSON line.

Under the recipe's default (`loss.kd.vocab_map: merge`, `loss.kd.partial: true`) both students distil the
aligned positions and those inside a teacher token; the cache (format 2) stores the latter's conditioned
teacher log-probs too, and `--verify-shards` of it are recomputed with the teacher (`verify_cache`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from distill_quality import train_teacher  # noqa: E402

from trainguard.recipes.distill import BUNDLED_CONFIG  # noqa: E402
from trainguard.recipes.distill.config import parse_config  # noqa: E402

TEACHER = {"arch": "qwen2", "vocab_size": 512, "split_digits": True,
           "build": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}}
STUDENT_BUILD = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "max_position_embeddings": 512}


def matmul_params(hidden: int, inter: int, layers: int, heads: int, kv_heads: int, vocab: int) -> int:
    """Weights a token is multiplied by in one forward (q, k, v, o, gated MLP, output head)."""
    head_dim = hidden // heads
    attn = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    return layers * (attn + 3 * hidden * inter) + hidden * vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher-steps", type=int, default=120)
    ap.add_argument("--student-steps", type=int, default=120)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--teacher-layers", type=int, default=6, help="the teacher's depth (6: ~11x the student's "
                    "forward; 12: ~21x)")
    ap.add_argument("--verify-shards", type=int, default=1, help="cache shards recomputed with the teacher (0: none)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--work", default=None, help="keep the teacher and the cache here (reused when present)")
    ap.add_argument("--variants", default="online,cache", help="comma-separated students per seed: online, cache "
                    "(both under the recipe's default), online-old (the old cross-tokenizer default: strict map, "
                    "aligned positions only; to settle the default against the new one on the same teacher)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = yaml.safe_load(BUNDLED_CONFIG.read_text())
    base.pop("config_dir", None)
    base["data"]["eval_windows"] = 0
    base["student"]["build"] = dict(STUDENT_BUILD)
    base["loss"]["hidden"].update(start=0.0, end=0.0)
    base["train"].update(max_steps=args.student_steps, eval_every=args.student_steps, save_every=args.student_steps,
                         log_every=10**9, batch_size=16, grad_accum=1)
    base["optim"]["warmup_steps"] = 20
    TEACHER["build"]["num_hidden_layers"] = args.teacher_layers
    tb, sb = TEACHER["build"], STUDENT_BUILD
    t_flops = 2 * matmul_params(tb["hidden_size"], tb["intermediate_size"], tb["num_hidden_layers"],
                                tb["num_attention_heads"], tb["num_key_value_heads"], TEACHER["vocab_size"])
    s_flops = 2 * matmul_params(sb["hidden_size"], sb["intermediate_size"], sb["num_hidden_layers"],
                                sb["num_attention_heads"], sb["num_key_value_heads"], base["student"]["vocab_size"])
    from trainguard.recipes.distill.cache_build import build_cache
    from trainguard.recipes.distill.train import train

    t0 = time.time()
    result: dict = {"benchmark": "distill_cache_vs_online", "device": "cpu", "threads": 1,
                    "teacher_flops_per_token": t_flops, "student_flops_per_token": s_flops,
                    "teacher_over_student_forward": round(t_flops / s_flops, 2),
                    "bound_on_speedup": round((3 * s_flops + t_flops) / (3 * s_flops), 2),
                    "teacher_steps": args.teacher_steps, "student_steps": args.student_steps, "seeds": args.seeds}
    with tempfile.TemporaryDirectory() if not args.work else contextlib.nullcontext(args.work) as tmp:
        tdir = Path(tmp) / "teacher"
        saved = tdir / "bpb.json"
        if saved.is_file():  # --work: the teacher of an earlier run, trained identically (CPU, seed 0)
            result.update(json.loads(saved.read_text()), teacher_reused=True)
        else:
            tcfg = copy.deepcopy(base)
            tcfg["teacher"] = copy.deepcopy(TEACHER)
            result["teacher_bpb"] = train_teacher(tcfg, args.teacher_steps, tdir)
            result["teacher_seconds"] = round(time.time() - t0, 1)
            saved.write_text(json.dumps({k: result[k] for k in ("teacher_bpb", "teacher_seconds")}))
        base["teacher"] = {"path": str(tdir)}
        tc = time.time()
        variants = args.variants.split(",")
        if "cache" in variants:
            built = build_cache(parse_config(copy.deepcopy(base)), Path(tmp) / "cache", k=base["loss"]["kd"]["top_k"],
                                shard_windows=512, run_dir=str(Path(tmp) / "cache-run"), verbose=False)
            result["cache_build"] = {"shards": built["shards"], "seconds": round(time.time() - tc, 1),
                                     **{k: v for k, v in built.items() if k in ("bytes_per_position", "positions_per_s")
                                        or k.startswith(("partial_", "aligned_"))}}
        cfg0 = parse_config(copy.deepcopy(base))
        result["kd"] = {"vocab_map": cfg0.loss.kd.vocab_map, "partial": cfg0.loss.kd.partial, "top_k": cfg0.loss.kd.top_k}
        if args.verify_shards and "cache" in variants:
            from trainguard.recipes.distill.cache_build import verify_cache

            tv = time.time()
            result["cache_verify"] = {**verify_cache(cfg0, Path(tmp) / "cache", shards=args.verify_shards),
                                      "seconds": round(time.time() - tv, 1)}
        print(json.dumps({k: result[k] for k in ("cache_build", "kd", "cache_verify") if k in result}), flush=True)
        for seed in args.seeds:
            for name in variants:
                d = copy.deepcopy(base)
                d["seed"] = seed
                if name == "online-old":
                    d["loss"]["kd"].update(vocab_map="strict", partial=False)
                if name == "cache":
                    d["data"]["teacher_cache"] = str(Path(tmp) / "cache")
                shutil.rmtree(Path(tmp) / f"{name}-{seed}", ignore_errors=True)  # never a resume of an old one
                r = train(parse_config(d), run_dir=Path(tmp) / f"{name}-{seed}", verbose=False)
                result.setdefault(name, []).append({"seed": seed, "bpb": r["evals"][-1]["bpb"],
                                                    "tokens_per_s": r["tokens_per_s"],
                                                    "tokens_per_cpu_s": r["tokens_per_cpu_s"],
                                                    "train_seconds": round(r["train_seconds"], 1),
                                                    "train_cpu_seconds": round(r["train_cpu_seconds"], 1)})
                print(json.dumps({name: result[name][-1]}), flush=True)
    on, ca = result.get("online", []), result.get("cache", [])
    if "online-old" in result and on:
        old = result["online-old"]
        result["bpb_new_minus_old_default_per_seed"] = [o["bpb"] - x["bpb"] for o, x in zip(on, old)]
    result["speedup_per_seed"] = [round(c["tokens_per_s"] / o["tokens_per_s"], 2) for o, c in zip(on, ca)]
    # per CPU second of the process: on a shared machine wall-clock speed follows the neighbours' load
    result["speedup_per_cpu_s_per_seed"] = [round(c["tokens_per_cpu_s"] / o["tokens_per_cpu_s"], 2)
                                           for o, c in zip(on, ca)]
    result["bpb_cache_minus_online_per_seed"] = [c["bpb"] - o["bpb"] for o, c in zip(on, ca)]
    result["online_seed_spread"] = (max(o["bpb"] for o in on) - min(o["bpb"] for o in on)) if on else None
    result["seconds"] = round(time.time() - t0, 1)
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
