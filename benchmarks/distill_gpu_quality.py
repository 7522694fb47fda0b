"""A real quality run on a GPU: a trained MoE teacher, then KD students (online and from the offline
cache) against an LM-only student, in bits per byte; and the cache's size, speed and verification.

    python benchmarks/distill_gpu_quality.py --out-dir OUT [--teacher-seconds 100] [--student-steps 300] \
        [--seeds 0 1 2] [--variants lm_only,kd_online,kd_cache] [--verify-shards 2]

Offline: the corpus is the text that ships with Python itself (the standard library's .py files,
sorted by path, the first --corpus-mb MB; the last 3% held out). Steps, all under the recipe's code:
1. tokenizers: a 4,096-id BPE with digits split for the teacher, a 2,048-id BPE for the student
   (different vocabularies: every KD here is cross-tokenizer);
2. a Qwen2-MoE teacher (8 experts, top-2) trained with LM loss for --teacher-seconds, bf16; saved as a
   Hugging Face folder; its held-out bits per byte measured;
3. the corpus tokenised and aligned once (the recipe's own `prepare`, pickled) and shared by every student;
4. three processes side by side, one per variant, each training the Llama student for the same optimizer
   steps, same init and data order per seed, seed after seed: LM only, KD online (teacher in memory),
   KD from the cache (teacher never loaded; that process first runs `build_cache` over the training
   windows, k = --k, then `verify_cache`); held-out bits per byte and the loop's tokens/s (outside
   evaluation) of each. The processes share the device and the host, so tokens/s here are under that
   contention (alike for the three variants): the cache's speed is measured by distill_cache_vs_online.py.
   `--variants kd_online,kd_cache` (or `online,cache`) runs only those processes.
Under the recipe's default (`loss.kd.partial: true`) the cache holds the partial rows too (format 2), so
online and cache students distil the same positions with the same targets.
One JSON object per stage is appended to OUT/quality.jsonl; the summary (per variant: bpb per seed, mean,
spread) is printed last. Students still running at --deadline are stopped; what finished is kept.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from trainguard.recipes.distill.build import train_tokenizer
from trainguard.recipes.distill.config import parse_config

TEACHER_BUILD = {"hidden_size": 384, "intermediate_size": 1024, "moe_intermediate_size": 384,
                 "shared_expert_intermediate_size": 768, "num_experts": 8, "num_experts_per_tok": 2,
                 "num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 2,
                 "max_position_embeddings": 1024, "experts_implementation": "grouped_mm"}
VARIANTS = ("lm_only", "kd_online", "kd_cache")
STUDENT_BUILD = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "max_position_embeddings": 1024}


def corpus(mb: float) -> tuple[str, str]:
    root = Path(os.__file__).parent
    parts, size = [], 0
    for p in sorted(root.rglob("*.py")):
        if "site-packages" in p.parts or "dist-packages" in p.parts:
            continue
        try:
            t = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(t)
        size += len(t)
        if size >= mb * 1e6:
            break
    text = "\n".join(parts)
    cut = int(len(text) * 0.97)
    return text[:cut], text[cut:]


def log(out: Path, record: dict, path: Path | None = None) -> None:
    line = json.dumps(record, default=str)
    print(line, flush=True)
    with (path or out / "quality.jsonl").open("a") as f:
        f.write(line + "\n")


def train_teacher(cfg_dict: dict, seconds: float, folder: Path, batch: int) -> dict:
    from trainguard.recipes.distill.build import load_model, load_tokenizer
    from trainguard.recipes.distill.data import eval_batches, prepare, read_text, train_batches, windows
    from trainguard.recipes.distill.train import lr_lambda

    cfg = parse_config(cfg_dict)
    text = read_text(cfg.resolve_path(cfg.data.train))
    tok = load_tokenizer("teacher", cfg.teacher, text)
    torch.manual_seed(0)
    dev = torch.device(cfg.device)  # cpu only for a smoke test of this script
    model = load_model("teacher", cfg.teacher, tok).to(dev)
    ex = prepare(windows(text, cfg.data.window_chars), tok, tok)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.1, betas=(0.9, 0.95), fused=True)
    est_steps = 100_000  # cosine sized by time: the LR follows the fraction of the time budget used
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(50, est_steps, 0.1))
    data = train_batches(ex, batch, 123, 0, 0, tok.bos_id, tok.bos_id)
    t0, steps, tokens = time.time(), 0, 0
    while time.time() - t0 < seconds:
        _, _, b = next(data)
        ids, mask = b["s_ids"].to(dev, non_blocking=True), b["s_mask"].to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        frac = (time.time() - t0) / seconds
        for g in opt.param_groups:  # time-based cosine after a 50-step warmup
            g["lr"] = 2e-3 * (min(1.0, (steps + 1) / 50)) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        opt.zero_grad(set_to_none=True)
        steps += 1
        tokens += int(b["s_mask"].sum())
    del sched
    if dev.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.time() - t0
    model.eval()
    eval_ex = prepare(windows(read_text(cfg.resolve_path(cfg.data.eval)), cfg.data.window_chars), tok, tok)
    nll, n_bytes = 0.0, 0
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
        for b in eval_batches(eval_ex, 32, tok.bos_id, tok.bos_id):
            logits = model(input_ids=b["s_ids"].to(dev), attention_mask=b["s_mask"].to(dev)).logits.float()
            nll += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), b["labels"].to(dev).flatten(),
                                                           reduction="sum"))
            n_bytes += b["n_bytes"]
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|bos|>"}))
    return {"stage": "teacher", "bpb": nll / math.log(2) / n_bytes, "steps": steps, "seconds": train_s,
            "tokens_per_s": tokens / train_s, "params": sum(p.numel() for p in model.parameters())}


def memoised_prepare(work: Path) -> None:
    """The recipe's `prepare` (tokenise both sides, align) done once per run and shared by every student.

    Keyed by the texts, both tokenizers, the alignment mode and whether partial positions are resolved
    (loss.kd.partial); pickled under `work`, so the processes
    of one run read what the first one made. Training itself is untouched: `train` gets the same
    examples it would have made.
    """
    import hashlib
    import pickle

    from trainguard.recipes.distill import train as train_mod
    from trainguard.recipes.distill.data import prepare

    def cached(texts: list[str], s_tok, t_tok, same_next: bool = False, partial=None):  # noqa: ANN001, ANN202
        h = hashlib.sha256()
        for part in (*texts, s_tok.backend.to_str(), t_tok.backend.to_str(), str(same_next), str(partial is not None)):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        path = work / f"prepared-{h.hexdigest()[:16]}.pkl"
        if path.is_file():
            return pickle.loads(path.read_bytes())
        ex = prepare(texts, s_tok, t_tok, same_next, partial)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(ex))
        os.replace(tmp, path)
        return ex

    train_mod.prepare = cached
    from trainguard.recipes.distill import cache_build

    cache_build.prepare = cached  # the build's partial rows: the same examples the students use


def run_students(variant: str, seeds: list[int], work: Path, out: Path, k: int, verify_shards: int = 2) -> None:
    """One process per variant: its students one after another (the cache variant builds the cache first)."""
    torch.set_num_threads(4)  # three of these share the host's cores
    memoised_prepare(work)
    base = json.loads((work / "base.json").read_text())
    record = out / f"quality-{variant}.jsonl"
    from trainguard.recipes.distill.train import train
    from trainguard.store.reader import RunReader

    cache_dir = work / "cache"
    if variant == "kd_cache":
        from trainguard.recipes.distill.cache_build import build_cache, verify_cache

        t0 = time.time()
        built = build_cache(parse_config(copy.deepcopy(base)), cache_dir, k=k, shard_windows=512,
                            run_dir=str(work / "cache-run"), verbose=False)
        built.update(stage="cache_build", seconds=time.time() - t0)
        log(out, built, record)
        if verify_shards:
            t0 = time.time()
            log(out, {"stage": "cache_verify", **verify_cache(parse_config(copy.deepcopy(base)), cache_dir,
                                                              shards=verify_shards), "seconds": time.time() - t0},
                record)
        with RunReader(built["run_dir"]) as reader:
            log(out, {"stage": "cache_guard", "state": reader.status()["state"],
                      "findings": [f"{f.code} {f.name}" for f in reader.findings()],
                      "steps": len(list(reader.steps()))}, record)
    graphed = True  # the teacher's top-k walk as a CUDA graph (the recipe's default on CUDA)
    for seed in seeds:
        d = copy.deepcopy(base)
        d["seed"] = seed
        if variant == "lm_only":
            d["loss"]["kd"].update(start=0.0, end=0.0)
        if variant == "kd_cache":
            d["data"]["teacher_cache"] = str(cache_dir)
        t0 = time.time()
        try:
            r = train(parse_config(d), run_dir=work / f"{variant}-{seed}", verbose=False)
        except Exception as exc:  # noqa: BLE001 - said in the record, then once more without the graph
            log(out, {"stage": "student_error", "variant": variant, "seed": seed, "graphed": graphed,
                      "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}, record)
            if not graphed:
                continue
            import trainguard.recipes.distill.train as train_mod

            train_mod.GraphedTargets = lambda *a, **kw: None  # the teacher's top-k walk launched eagerly
            graphed = False
            t0 = time.time()
            r = train(parse_config(d), run_dir=work / f"{variant}-{seed}-eager", verbose=False)
        with RunReader(r["run_dir"]) as reader:
            findings = [f"{f.code} {f.name}" for f in reader.findings()]
        log(out, {"stage": "student", "variant": variant, "seed": seed, "bpb": r["evals"][-1]["bpb"],
                  "tokens_per_s": r["tokens_per_s"], "train_seconds": r["train_seconds"],
                  "wall_seconds": time.time() - t0, "align_ratio": r["align_ratio_train"],
                  "vocab_overlap": r["vocab_overlap"], "findings": findings, "graphed": graphed}, record)


def summarize(out: Path) -> dict:
    rows = [json.loads(x) for x in (out / "quality.jsonl").read_text().splitlines()]
    students = [r for r in rows if r["stage"] == "student"]
    summary: dict = {"stage": "summary"}
    for name in ("lm_only", "kd_online", "kd_cache"):
        rs = sorted((r for r in students if r["variant"] == name), key=lambda r: r["seed"])
        if not rs:
            continue
        bpb = [r["bpb"] for r in rs]
        summary[name] = {"seeds": [r["seed"] for r in rs], "bpb": [round(x, 4) for x in bpb],
                         "mean_bpb": round(sum(bpb) / len(bpb), 4), "spread": round(max(bpb) - min(bpb), 4),
                         "tokens_per_s": round(sum(r["tokens_per_s"] for r in rs) / len(rs))}
    if "kd_cache" in summary and "kd_online" in summary:
        summary["cache_speedup"] = summary["kd_cache"]["tokens_per_s"] / max(1, summary["kd_online"]["tokens_per_s"])
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--corpus-mb", type=float, default=3.0)
    ap.add_argument("--teacher-seconds", type=float, default=100)
    ap.add_argument("--student-steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke test of the script)")
    ap.add_argument("--deadline", type=float, default=520, help="seconds from the start after which the "
                    "student processes are stopped (what they finished is kept and summarised)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="which students to train, comma-separated: lm_only (lm), kd_online (online), kd_cache (cache)")
    ap.add_argument("--verify-shards", type=int, default=2, help="cache shards recomputed with the teacher (0: none)")
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # child: one variant's students
    ap.add_argument("--work", default="/tmp/distill_quality", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out, work = Path(args.out_dir), Path(args.work)
    if args.variant:
        run_students(args.variant, args.seeds, work, out, args.k, args.verify_shards)
        return
    aliases = {"lm": "lm_only", "online": "kd_online", "cache": "kd_cache"}
    variants = [aliases.get(v.strip(), v.strip()) for v in args.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        sys.exit(f"distill_gpu_quality: --variants takes {', '.join(VARIANTS)} (or lm, online, cache), "
                 f"got {args.variants!r}")
    t_start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    import shutil
    import subprocess

    shutil.rmtree(work, ignore_errors=True)  # a fresh teacher each run: an old cache would be refused
    work.mkdir(parents=True)
    train_text, eval_text = corpus(args.corpus_mb)
    (work / "train.txt").write_text(train_text, encoding="utf-8")
    (work / "eval.txt").write_text(eval_text, encoding="utf-8")
    log(out, {"stage": "corpus", "train_bytes": len(train_text.encode()), "eval_bytes": len(eval_text.encode()),
              "source": str(Path(os.__file__).parent)})
    s_tok = train_tokenizer(train_text, 2048)
    s_tok.save(str(work / "student_tokenizer.json"))

    base = {
        "seed": 0, "device": args.device, "precision": "bf16" if args.device == "cuda" else "fp32",
        "teacher": {"arch": "qwen2_moe", "build": TEACHER_BUILD, "vocab_size": 4096, "split_digits": True},
        "student": {"arch": "llama", "build": STUDENT_BUILD, "tokenizer": str(work / "student_tokenizer.json"),
                    "bos": "<|bos|>"},
        "data": {"train": str(work / "train.txt"), "eval": str(work / "eval.txt"), "window_chars": 512,
                 "eval_windows": 0},
        # KD settings not named here (which positions, which remedy) are the recipe's defaults. Runs 3 and 4
        # predate loss.kd.partial; in run 5 the cache held aligned positions only (format 1); since format 2
        # the cache students distil the partial positions too, as the online ones do
        "loss": {"lm": 1.0, "kd": {"start": 0.1, "end": 0.7, "ramp": [0.0, 0.2], "top_k": args.k, "temperature": 1.0,
                                   "chunk": 1024},
                 "hidden": {"start": 0.0, "end": 0.0}},
        "optim": {"lr": 2.0e-3, "warmup_steps": min(20, args.student_steps - 1), "min_lr_ratio": 0.1},
        "train": {"batch_size": args.batch, "grad_accum": 1, "max_steps": args.student_steps,
                  "eval_every": args.student_steps, "save_every": args.student_steps, "log_every": 10**9},
    }
    tdir = work / "teacher"
    log(out, train_teacher(copy.deepcopy(base), args.teacher_seconds, tdir, args.batch))
    base["teacher"] = {"path": str(tdir)}
    (work / "base.json").write_text(json.dumps(base))
    # the corpus tokenised and aligned once, here, for every student of every variant
    t0 = time.time()
    memoised_prepare(work)
    from trainguard.recipes.distill import train as train_mod
    from trainguard.recipes.distill.build import load_tokenizer
    from trainguard.recipes.distill.data import read_text, windows

    cfg = parse_config(copy.deepcopy(base))
    text = read_text(cfg.resolve_path(cfg.data.train))
    st, tt = load_tokenizer("student", cfg.student, text), load_tokenizer("teacher", cfg.teacher, text)
    from trainguard.recipes.distill.partial import PartialMapper

    # LM-only students prepare without partial positions, KD students (online and cache) with them (loss.kd.partial)
    mappers = ([None] if "lm_only" in variants or not cfg.loss.kd.partial else []) + \
        ([PartialMapper(tt.token_bytes, st.token_bytes)] if cfg.loss.kd.partial else [])
    for path in (cfg.data.train, cfg.data.eval):
        for mapper in mappers:
            train_mod.prepare(windows(read_text(cfg.resolve_path(path)), cfg.data.window_chars), st, tt,
                              cfg.loss.kd.positions == "next_token", mapper)
    log(out, {"stage": "prepare", "seconds": time.time() - t0})

    # the three variants side by side, one process each (the host has cores to spare: these small
    # students are bound by the host, not the device); each variant's seeds run one after another
    procs = [subprocess.Popen([sys.executable, __file__, "--out-dir", str(out), "--work", str(work), "--variant", v,
                               "--k", str(args.k), "--verify-shards", str(args.verify_shards),
                               "--seeds", *map(str, args.seeds)])
             for v in variants]
    for p in procs:
        try:
            p.wait(timeout=max(1.0, args.deadline - (time.time() - t_start)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    with (out / "quality.jsonl").open("a") as f:
        for v in variants:
            part = out / f"quality-{v}.jsonl"
            if part.is_file():
                f.write(part.read_text())
    log(out, {**summarize(out), "seconds": time.time() - t_start})
    sys.exit(0)


if __name__ == "__main__":
    main()
