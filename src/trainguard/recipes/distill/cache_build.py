"""Writing and verifying the offline teacher cache (`cache.py` says what it holds), under the guard.

The build is a run like any other: `trainguard.watch` sees one step per shard with the teacher's LM
cross-entropy on it as the loss (a NaN teacher, a stall or a crash is caught and said as for training),
and phases mark loading and writing. Resume is by shards: finished ones are kept.
"""

from __future__ import annotations

import dataclasses
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
from trainguard.recipes.distill.cache import FORMAT, TeacherCache, quantize, quantize_flat, text_digest
from trainguard.recipes.distill.cache_lock import build_lock
from trainguard.recipes.distill.config import DistillConfig
from trainguard.recipes.distill.data import prepare, read_text, windows
from trainguard.recipes.distill.kd import teacher_targets
from trainguard.recipes.distill.losses import consistent_logprobs
from trainguard.recipes.distill.partial import PartialMapper
from trainguard.recipes.distill.tokenize_align import encode, token_lengths
from trainguard.recipes.distill.train import amp_policy, torch_device, write_run_report


def _setup(cfg: DistillConfig) -> tuple[Any, Any, list[list[int]], str, Any, Any]:
    device = torch_device(cfg.device)
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


# One window's partial rows (partial.py), in data.prepare's order: student positions, the teacher position
# of the last boundary before each, and the teacher ids consistent with the bytes read there.
Part = tuple[list[int], list[int], list[list[int]]]


def _partial_plan(cfg: DistillConfig, text: str, t_tok: Any, encoded: list[list[int]], on: bool,
                  pieces: list[str] | None = None) -> tuple[list[Part] | None, dict[str, Any] | None]:
    """The partial rows of every window for the config's student, as training prepares them, and their manifest
    entry; (None, None) when not `on`. `pieces`: other windows than the training text's (the eval text's; the
    tokenizers are still trained on `text`)."""
    if not on:
        return None, None
    s_tok = load_tokenizer("student", cfg.student, text)
    mapper = PartialMapper(t_tok.token_bytes, s_tok.token_bytes)
    exs = prepare((pieces if pieces is not None else windows(text, cfg.data.window_chars))[: len(encoded)], s_tok, t_tok,
                  cfg.loss.kd.positions == "next_token", mapper)
    if [e.teacher.ids for e in exs] != encoded:  # one tokenisation of the teacher's, or the rows would not line up
        raise UserError("cache: the teacher's tokenisation differs between the aligned and partial passes")
    plan = [([r[0] for r in e.partial or []], [r[1] for r in e.partial or []], [r[2] for r in e.partial or []])
            for e in exs]
    meta = {"student_tokenizer_sha256": text_digest(s_tok.backend.to_str()), "kd_positions": cfg.loss.kd.positions,
            "max_ids": mapper.max_ids, "rows": sum(len(p[0]) for p in plan),
            "entries": sum(len(t) for p in plan for t in p[2])}
    return plan, meta


@torch.no_grad()
def _partial_logprobs(h: torch.Tensor, head: Any, part: Part, temperature: float, chunk: int,
                      device: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids per row, teacher ids, conditioned log-probs) of one window's partial rows, from its hidden states h:
    `losses.consistent_logprobs`, the function the online student's targets come from."""
    _, q0, tids = part
    lens = np.array([len(t) for t in tids], dtype=np.uint16)
    if not tids:
        return lens, np.zeros(0, np.uint32), np.zeros(0, np.float32)
    K = int(lens.max())
    tid = torch.tensor([t + [-1] * (K - len(t)) for t in tids], dtype=torch.long, device=device)
    q = torch.tensor(q0, dtype=torch.long, device=device)
    lp = torch.cat([consistent_logprobs(h[q[i: i + chunk]], head, tid[i: i + chunk], temperature)
                    for i in range(0, len(q0), chunk)])
    real = tid >= 0  # row-major: each row's ids in the mapper's order
    return lens, tid[real].cpu().numpy().astype(np.uint32), lp[real].cpu().numpy()


@torch.no_grad()
def _teacher_rows(teacher: Any, seqs: list[list[int]], k: int, temperature: float, device: Any, amp: Any,
                  chunk: int, pad: int, parts: list[Part] | None = None
                  ) -> tuple[list[np.ndarray], list[np.ndarray], list[float], list[tuple[np.ndarray, ...]]]:
    """Top-k ids and tempered log-probs at every position with a next token, each window's NLL, and (with
    `parts`) each window's partial rows as `_partial_logprobs` gives them."""
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
        out_part: list[tuple[np.ndarray, ...]] = []
        for b, s in enumerate(seqs):
            n = len(s) - 1
            # identity map: "student" ids are teacher ids, so sid is the teacher's top-k in probability order
            t = teacher_targets(h[b, :n], head, identity, k, temperature, width, chunk)
            order = t.logp.argsort(-1, descending=True)  # the walk does not sort; the file is delta-coded
            out_ids.append(t.sid.gather(-1, order).cpu().numpy().astype(np.uint32))
            out_lp.append(t.logp.gather(-1, order).cpu().numpy())
            logits = head(h[b, :n]).float()
            nll.append(float(torch.nn.functional.cross_entropy(logits, ids[b, 1: n + 1], reduction="sum")))
            if parts is not None:
                out_part.append(_partial_logprobs(h[b], head, parts[b], temperature, chunk, device))
    return out_ids, out_lp, nll, out_part


# Keys a manifest gained after caches were first written: a build resuming an older cache does not hold
# their absence against it.
LATER_KEYS = ("windows_in_text", "teacher", "eval")


def build_cache(cfg: DistillConfig, out: str | os.PathLike, *, shard_windows: int = 256, k: int | None = None,
                max_windows: int | None = None, batch: int = 16, run_dir: str | None = None,
                stop_after_shards: int | None = None, verbose: bool = True) -> dict[str, Any]:
    if max_windows is not None and max_windows < 1:
        raise UserError(f"cache: max_windows must be >= 1, got {max_windows}")
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cache: cannot make the folder {folder}: {exc.strerror}") from None
    with build_lock(folder):  # before the teacher loads: a second build is refused at once
        return _build(cfg, folder, shard_windows=shard_windows, k=k, max_windows=max_windows, batch=batch,
                      run_dir=run_dir, stop_after_shards=stop_after_shards, verbose=verbose)


def _build(cfg: DistillConfig, folder: Path, *, shard_windows: int, k: int | None, max_windows: int | None,
           batch: int, run_dir: str | None, stop_after_shards: int | None, verbose: bool) -> dict[str, Any]:
    say = print if verbose else (lambda *a, **kw: None)
    k = k or cfg.loss.kd.top_k
    device, teacher, encoded, text, t_tok, amp = _setup(cfg)
    eval_text = read_text(cfg.resolve_path(cfg.data.eval))
    eval_pieces = windows(eval_text, cfg.data.window_chars)[: cfg.data.eval_windows or None]
    in_text = len(encoded)
    if max_windows:
        encoded = encoded[:max_windows]
    plan, partial_meta = _partial_plan(cfg, text, t_tok, encoded, bool(cfg.loss.kd.partial) and cfg.loss.kd.method == "kl")
    width = teacher.get_output_embeddings().weight.shape[0]
    if k >= width:
        raise UserError(f"cache: k={k} must be smaller than the teacher vocabulary ({width})")
    manifest = {
        "format": FORMAT, "k": k, "temperature": cfg.loss.kd.temperature, "window_chars": cfg.data.window_chars,
        "text_sha256": text_digest(text), "n_windows": len(encoded), "shard_windows": shard_windows,
        "teacher_fingerprint": ckpt.fingerprint(teacher), "teacher_width": width,
        "teacher_tokenizer": t_tok.backend.to_str(), "precision": cfg.precision, "partial": partial_meta,
        # N of M: a cache built with --max-windows holds the text's first N windows, by request
        "windows_in_text": in_text,
        # the config's teacher section, so a student whose own section differs is told (train.py)
        "teacher": dataclasses.asdict(cfg.teacher),
        # the teacher's targets on the evaluation windows too (eval.npz), so a cache student's evaluation
        # reports kd_topk on held-out text as an online one does
        "eval": {"text_sha256": text_digest(eval_text), "n_windows": len(eval_pieces)},
    }
    mf = folder / "manifest.json"
    if os.path.lexists(mf):
        old = TeacherCache(folder).manifest  # read as every reader does: damage is one line, not a traceback
        keys = [key for key in manifest if key != "positions" and old.get(key) != manifest[key]
                and (key in old or key not in LATER_KEYS)]
        if keys:
            raise UserError(f"cache: {folder} was built with another {keys[0]}; use a new folder")
        manifest["positions"] = old.get("positions", 0)
    else:
        manifest["positions"] = sum(len(s) - 1 for s in encoded)
        mf.write_text(json.dumps(manifest))
    n_shards = -(-len(encoded) // shard_windows)
    # the teacher is not trained here: its per-shard NLL is a measure of the text, flat by nature
    guard = trainguard.watch(teacher, total_steps=n_shards, run_dir=run_dir, name="distill-cache", learning=False,
                             config={"cache": str(folder), "k": k, "windows": len(encoded)})
    cache = TeacherCache(folder)
    if "eval" in manifest:
        _write_eval(cfg, cache, teacher, t_tok, text, eval_pieces, k, device, amp, batch, plan is not None, say)
    done = written = 0
    t0 = time.time()
    positions = 0
    with guard.phase("cache"):
        for i in range(n_shards):
            if cache.shard_path(i).is_file() and not cache.shard_readable(i):
                # cut short (a full disk, a copy interrupted): built again rather than read as done
                say(f"cache shard {i + 1}/{n_shards} is damaged: building it again")
                cache.shard_path(i).unlink()
            if cache.shard_path(i).is_file():
                done += 1
                guard.step(0.0)  # an existing shard counts as progress; its loss is not re-measured
                continue
            seqs = encoded[i * shard_windows: (i + 1) * shard_windows]
            ids, lps, nll, part = [], [], [], []
            for j in range(0, len(seqs), batch):
                w0 = i * shard_windows + j
                a, b_, c, d = _teacher_rows(teacher, seqs[j: j + batch], k, cfg.loss.kd.temperature, device, amp,
                                            cfg.loss.kd.chunk, t_tok.bos_id,
                                            None if plan is None else plan[w0: w0 + batch])
                ids += a
                lps += b_
                nll += c
                part += d
            rows = [len(x) for x in ids]
            mine = None if plan is None else plan[i * shard_windows: i * shard_windows + len(seqs)]
            _save_shard(cache.shard_path(i), ids, lps, nll, mine, part)
            written += 1
            positions += sum(rows)
            guard.step(sum(nll) / max(1, sum(rows)))
            if i == 0 or (i + 1) % 10 == 0 or i + 1 == n_shards:
                say(f"cache shard {i + 1}/{n_shards} | {positions / max(1e-9, time.time() - t0):.0f} positions/s")
            if stop_after_shards is not None and written >= stop_after_shards:
                break
    # summed before the guard hears the job is done: a failure here is the job's failure, not after it
    summary = {"folder": str(folder), "shards": n_shards, "written": written, "kept": done,
               "complete": cache.complete(), "bytes_per_position": round(cache.bytes_per_position(), 1),
               **_partial_sizes(cache),
               "positions_per_s": positions / max(1e-9, time.time() - t0), "run_dir": str(guard.run_dir)}
    guard.finish()
    if guard.run_dir:
        write_run_report(Path(guard.run_dir), say)  # the build is a run like any other: its report too
    return summary


def _save_shard(path: Path, ids: list[np.ndarray], lps: list[np.ndarray], nll: list[float], plan: list[Part] | None,
                part: list[tuple[np.ndarray, ...]]) -> None:
    """One shard's arrays (cache.py), written to a temporary name and renamed: never read half-written."""
    rows = [len(x) for x in ids]
    offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    arrays = {"offsets": offsets, "ids": np.concatenate(ids), "q": quantize(np.concatenate(lps)),
              "nll": np.asarray(nll, dtype=np.float32)}
    if plan is not None:  # format 2: the partial rows (cache.py)
        arrays.update(p_offsets=np.concatenate([[0], np.cumsum([len(p[0]) for p in plan])]).astype(np.int64),
                      p_pos=np.array([x for p in plan for x in p[0]], dtype=np.int32),
                      p_len=np.concatenate([x[0] for x in part]),
                      p_ids=np.concatenate([x[1] for x in part]),
                      p_q=quantize_flat(np.concatenate([x[2] for x in part])))
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)  # type: ignore[arg-type]  # numpy stubs: allow_pickle in **kwds
    os.replace(tmp, path)


def _write_eval(cfg: DistillConfig, cache: TeacherCache, teacher: Any, t_tok: Any, text: str, pieces: list[str],
                k: int, device: Any, amp: Any, batch: int, partial: bool, say: Any) -> None:
    """eval.npz: the teacher's targets on the evaluation windows, laid out as one shard (kept when there)."""
    view = cache.eval_view()
    if view is None or (view.has_shard(0) and view.shard_readable(0)):
        return
    lengths = token_lengths(t_tok)
    encoded = [encode(t_tok, w, lengths).ids for w in pieces]
    plan, _ = _partial_plan(cfg, text, t_tok, encoded, partial, pieces)
    ids, lps, nll, part = [], [], [], []
    for j in range(0, len(encoded), batch):
        a, b_, c, d = _teacher_rows(teacher, encoded[j: j + batch], k, cfg.loss.kd.temperature, device, amp,
                                    cfg.loss.kd.chunk, t_tok.bos_id, None if plan is None else plan[j: j + batch])
        ids += a
        lps += b_
        nll += c
        part += d
    _save_shard(view.shard_path(0), ids, lps, nll, plan, part)
    say(f"cache: the teacher's targets on {len(encoded)} evaluation windows written")


def _partial_sizes(cache: TeacherCache) -> dict[str, Any]:
    """Compressed bytes of the aligned entries per position and of the partial rows per row (format 2)."""
    if not cache.partial:
        return {}
    sizes = cache.member_bytes()
    part = sum(v for key, v in sizes.items() if key.startswith("p_"))
    return {"partial_rows": cache.partial["rows"], "partial_entries": cache.partial["entries"],
            "aligned_bytes_per_position": round((sum(sizes.values()) - part) / max(1, cache.manifest["positions"]), 1),
            "partial_bytes_per_row": round(part / max(1, cache.partial["rows"]), 1)}


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
    encoded = encoded[: cache.n_windows]
    plan, meta = _partial_plan(cfg, text, t_tok, encoded, cache.partial is not None)
    if cache.partial is not None and meta is not None and meta["student_tokenizer_sha256"] != cache.partial["student_tokenizer_sha256"]:
        raise UserError("cache verify: the config's student tokenizer is not the one the partial rows were built for")
    n_shards = -(-cache.n_windows // cache.shard_windows)
    rng = np.random.default_rng(seed)
    picks = sorted(rng.choice(n_shards, size=min(shards, n_shards), replace=False).tolist())
    worst, id_agree, rows = 0.0, 0, 0
    p_worst, p_rows, p_same = 0.0, 0, True
    for i in picks:
        w0 = i * cache.shard_windows
        seqs = encoded[w0: w0 + cache.shard_windows]
        ids, lps, _, part = _teacher_rows(teacher, seqs, cache.k, m["temperature"], device, amp, cfg.loss.kd.chunk,
                                          t_tok.bos_id, None if plan is None else plan[w0: w0 + len(seqs)])
        for w, (lens, pi, pv) in enumerate(part):  # partial rows: the same ids in the same order, values in the quantum
            _, c_len, c_ids, c_lp = cache.partial_window(w0 + w)
            same = np.array_equal(c_len, lens) and np.array_equal(c_ids, pi)
            p_same &= same
            p_rows += len(lens)
            if same:
                p_worst = max(p_worst, float(np.abs(c_lp - np.maximum(pv, -65535 / 1024)).max(initial=0.0)))
        for w, (fi, fl) in enumerate(zip(ids, lps)):
            ci, cl = cache.window(i * cache.shard_windows + w)
            if ci.shape != fi.shape:
                raise UserError(f"cache verify: window {i * cache.shard_windows + w} has {ci.shape[0]} positions "
                                f"in the cache, {fi.shape[0]} from the teacher")
            same = (ci == fi).all(-1)
            id_agree += int(same.sum())
            rows += len(same)
            worst = max(worst, float(np.abs(cl[same] - np.maximum(fl[same], -65535 / 1024)).max(initial=0.0)))
    eval_checked = 0
    view = cache.eval_view()  # the eval windows' targets (eval.npz): aligned entries recomputed too
    if view is not None and view.has_shard(0):
        eval_text = read_text(cfg.resolve_path(cfg.data.eval))
        if view.text_sha256 != text_digest(eval_text):
            raise UserError("cache verify: the config's eval text is not the one the cache was built from")
        lengths = token_lengths(t_tok)
        e_enc = [encode(t_tok, w, lengths).ids for w in windows(eval_text, cfg.data.window_chars)[: view.n_windows]]
        for j in range(0, len(e_enc), 16):
            ids, lps, _, _ = _teacher_rows(teacher, e_enc[j: j + 16], cache.k, m["temperature"], device, amp,
                                           cfg.loss.kd.chunk, t_tok.bos_id)
            for w, (fi, fl) in enumerate(zip(ids, lps)):
                ci, cl = view.window(j + w)
                if ci.shape != fi.shape:
                    raise UserError(f"cache verify: eval window {j + w} has {ci.shape[0]} positions in the cache, "
                                    f"{fi.shape[0]} from the teacher")
                same = (ci == fi).all(-1)
                id_agree += int(same.sum())
                rows += len(same)
                worst = max(worst, float(np.abs(cl[same] - np.maximum(fl[same], -65535 / 1024)).max(initial=0.0)))
                eval_checked += 1
    ok = worst <= 1.0 / 1024 + 1e-3 and id_agree >= 0.98 * rows and p_same and p_worst <= 1.0 / 1024 + 1e-3
    out = {"shards_checked": picks, "eval_windows_checked": eval_checked, "positions": rows, "ids_identical_share": id_agree / max(1, rows),
           "max_abs_logp_error": worst, "ok": ok}
    if plan is not None:
        out.update(partial_rows=p_rows, partial_ids_identical=p_same, partial_max_abs_logp_error=p_worst)
    return out


def cache_info(folder: str | os.PathLike) -> dict[str, Any]:
    cache = TeacherCache(folder)
    m = dict(cache.manifest)
    m.pop("teacher_tokenizer", None)
    n_shards = cache.n_shards
    missing = [i for i in range(n_shards) if not cache.has_shard(i)]
    done_windows = sum(cache.windows_in(i) for i in range(n_shards) if i not in missing)
    m.update(shards=n_shards, shards_done=n_shards - len(missing), complete=not missing,
             windows_done=done_windows, bytes_per_position=round(cache.bytes_per_position(), 1))
    if missing:  # unfinished: what is done, what is missing, and the one command that finishes it
        m.update(shards_missing=missing[:20] + (["..."] if len(missing) > 20 else []),
                 windows_missing=cache.n_windows - done_windows,
                 state=f"unfinished: {n_shards - len(missing)} of {n_shards} shards ({done_windows} of "
                       f"{cache.n_windows} windows) are written; run the same `trainguard distill cache build` "
                       "again to finish it")
    else:
        m["state"] = "complete"
    total = cache.windows_in_text
    if total is not None and total > cache.n_windows:
        m.update(partial_by_request=True, state=f"{m['state']}; holds {cache.n_windows} of the text's {total} "
                 "windows (built with --max-windows): students train on those windows only")
    m.update(_partial_sizes(cache))
    return m

