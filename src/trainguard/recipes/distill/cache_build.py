"""Writing and verifying the offline teacher cache (`cache.py` says what it holds), under the guard.

The build is a run like any other: `trainguard.watch` sees one step per shard with the teacher's LM
cross-entropy on it as the loss (a NaN teacher, a stall or a crash is caught and said as for training),
and phases mark loading and writing. Resume is by shards: finished ones are kept.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import trainguard
from trainguard.errors import UserError
from trainguard.recipes.distill import checkpoint as ckpt
from trainguard.recipes.distill.build import body_and_head, load_model, load_tokenizer
from trainguard.recipes.distill.cache import FORMAT, TeacherCache, quantize, text_digest
from trainguard.recipes.distill.config import DistillConfig
from trainguard.recipes.distill.data import read_text, windows
from trainguard.recipes.distill.kd import teacher_targets
from trainguard.recipes.distill.tokenize_align import encode, token_lengths
from trainguard.recipes.distill.train import amp_policy


def _setup(cfg: DistillConfig) -> tuple[Any, Any, list[list[int]], str, Any, Any]:
    device = torch.device("cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    text = read_text(cfg.resolve_path(cfg.data.train))
    t_tok = load_tokenizer("teacher", cfg.teacher, text)
    torch.manual_seed(cfg.seed)  # a random-init teacher is built exactly as `train` builds it
    teacher = load_model("teacher", cfg.teacher, t_tok)
    t_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]
    teacher.to(device=device, dtype=t_dtype).eval().requires_grad_(False)
    lengths = token_lengths(t_tok)
    encoded = [encode(t_tok, w, lengths).ids for w in windows(text, cfg.data.window_chars)]
    return device, teacher, encoded, text, t_tok, amp_policy(device, cfg.precision)


@torch.no_grad()
def _teacher_rows(teacher: Any, seqs: list[list[int]], k: int, temperature: float, device: Any, amp: Any,
                  chunk: int, pad: int) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
    """Top-k ids and tempered log-probs at every position with a next token, and each window's NLL."""
    body, head = body_and_head(teacher)
    width = head.weight.shape[0]
    identity = torch.arange(width, device=device)
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, : len(s)] = 1
    ids, mask = ids.to(device), mask.to(device)
    with amp():
        h = body(input_ids=ids, attention_mask=mask).last_hidden_state
        out_ids, out_lp, nll = [], [], []
        for b, s in enumerate(seqs):
            n = len(s) - 1
            # identity map: "student" ids are teacher ids, so sid is the teacher's top-k in probability order
            t = teacher_targets(h[b, :n], head, identity, k, temperature, width, chunk)
            order = t.logp.argsort(-1, descending=True)  # the walk does not sort; the file is delta-coded
            out_ids.append(t.sid.gather(-1, order).cpu().numpy().astype(np.uint32))
            out_lp.append(t.logp.gather(-1, order).cpu().numpy())
            logits = head(h[b, :n]).float()
            nll.append(float(torch.nn.functional.cross_entropy(logits, ids[b, 1: n + 1], reduction="sum")))
    return out_ids, out_lp, nll


def build_cache(cfg: DistillConfig, out: str | os.PathLike, *, shard_windows: int = 256, k: int | None = None,
                max_windows: int | None = None, batch: int = 16, run_dir: str | None = None,
                stop_after_shards: int | None = None, verbose: bool = True) -> dict[str, Any]:
    say = print if verbose else (lambda *a, **kw: None)
    k = k or cfg.loss.kd.top_k
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    device, teacher, encoded, text, t_tok, amp = _setup(cfg)
    if max_windows:
        encoded = encoded[:max_windows]
    width = teacher.get_output_embeddings().weight.shape[0]
    if k >= width:
        raise UserError(f"cache: k={k} must be smaller than the teacher vocabulary ({width})")
    manifest = {
        "format": FORMAT, "k": k, "temperature": cfg.loss.kd.temperature, "window_chars": cfg.data.window_chars,
        "text_sha256": text_digest(text), "n_windows": len(encoded), "shard_windows": shard_windows,
        "teacher_fingerprint": ckpt.fingerprint(teacher), "teacher_width": width,
        "teacher_tokenizer": t_tok.backend.to_str(), "precision": cfg.precision,
    }
    mf = folder / "manifest.json"
    if mf.is_file():
        old = json.loads(mf.read_text())
        keys = [key for key in manifest if key != "positions" and old.get(key) != manifest[key]]
        if keys:
            raise UserError(f"cache: {folder} was built with another {keys[0]}; use a new folder")
        manifest["positions"] = old.get("positions", 0)
    else:
        manifest["positions"] = sum(len(s) - 1 for s in encoded)
        mf.write_text(json.dumps(manifest))
    n_shards = -(-len(encoded) // shard_windows)
    guard = trainguard.watch(teacher, total_steps=n_shards, run_dir=run_dir, name="distill-cache",
                             config={"cache": str(folder), "k": k, "windows": len(encoded)})
    cache = TeacherCache(folder)
    done = written = 0
    t0 = time.time()
    positions = 0
    with guard.phase("cache"):
        for i in range(n_shards):
            if cache.shard_path(i).is_file():
                done += 1
                guard.step(0.0)  # an existing shard counts as progress; its loss is not re-measured
                continue
            seqs = encoded[i * shard_windows: (i + 1) * shard_windows]
            ids, lps, nll = [], [], []
            for j in range(0, len(seqs), batch):
                a, b_, c = _teacher_rows(teacher, seqs[j: j + batch], k, cfg.loss.kd.temperature, device, amp,
                                         cfg.loss.kd.chunk, t_tok.bos_id)
                ids += a
                lps += b_
                nll += c
            rows = [len(x) for x in ids]
            offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
            tmp = cache.shard_path(i).with_suffix(".tmp.npz")
            np.savez_compressed(tmp, offsets=offsets, ids=np.concatenate(ids), q=quantize(np.concatenate(lps)),
                                nll=np.asarray(nll, dtype=np.float32))
            os.replace(tmp, cache.shard_path(i))
            written += 1
            positions += sum(rows)
            guard.step(sum(nll) / max(1, sum(rows)))
            if i == 0 or (i + 1) % 10 == 0 or i + 1 == n_shards:
                say(f"cache shard {i + 1}/{n_shards} | {positions / max(1e-9, time.time() - t0):.0f} positions/s")
            if stop_after_shards is not None and written >= stop_after_shards:
                break
    guard.finish()
    return {"folder": str(folder), "shards": n_shards, "written": written, "kept": done,
            "complete": cache.complete(), "bytes_per_position": round(cache.bytes_per_position(), 1),
            "positions_per_s": positions / max(1e-9, time.time() - t0), "run_dir": str(guard.run_dir)}


def verify_cache(cfg: DistillConfig, folder: str | os.PathLike, shards: int = 2, seed: int = 0) -> dict[str, Any]:
    """Recomputes `shards` random shards with the teacher: the ids must be the same sets (up to ties at
    the k-th value) and every log-prob within the quantisation step."""
    cache = TeacherCache(folder)
    device, teacher, encoded, text, t_tok, amp = _setup(cfg)
    m = cache.manifest
    if m["text_sha256"] != text_digest(text):
        raise UserError("cache verify: the config's training text is not the one the cache was built from")
    if abs(m["teacher_fingerprint"] - ckpt.fingerprint(teacher)) > 1e-6 * max(1.0, abs(m["teacher_fingerprint"])):
        raise UserError("cache verify: the config's teacher is not the one the cache was built from")
    n_shards = -(-cache.n_windows // cache.shard_windows)
    rng = np.random.default_rng(seed)
    picks = sorted(rng.choice(n_shards, size=min(shards, n_shards), replace=False).tolist())
    worst, id_agree, rows = 0.0, 0, 0
    for i in picks:
        seqs = encoded[i * cache.shard_windows: (i + 1) * cache.shard_windows]
        ids, lps, _ = _teacher_rows(teacher, seqs, cache.k, m["temperature"], device, amp, cfg.loss.kd.chunk, t_tok.bos_id)
        for w, (fi, fl) in enumerate(zip(ids, lps)):
            ci, cl = cache.window(i * cache.shard_windows + w)
            if ci.shape != fi.shape:
                raise UserError(f"cache verify: window {i * cache.shard_windows + w} has {ci.shape[0]} positions "
                                f"in the cache, {fi.shape[0]} from the teacher")
            same = (ci == fi).all(-1)
            id_agree += int(same.sum())
            rows += len(same)
            worst = max(worst, float(np.abs(cl[same] - np.maximum(fl[same], -65535 / 1024)).max(initial=0.0)))
    ok = worst <= 1.0 / 1024 + 1e-3 and id_agree >= 0.98 * rows
    return {"shards_checked": picks, "positions": rows, "ids_identical_share": id_agree / max(1, rows),
            "max_abs_logp_error": worst, "ok": ok}


def cache_info(folder: str | os.PathLike) -> dict[str, Any]:
    cache = TeacherCache(folder)
    m = dict(cache.manifest)
    m.pop("teacher_tokenizer", None)
    n_shards = -(-cache.n_windows // cache.shard_windows)
    m.update(shards=n_shards, shards_done=sum(cache.shard_path(i).is_file() for i in range(n_shards)),
             complete=cache.complete(), bytes_per_position=round(cache.bytes_per_position(), 1))
    return m

