"""The offline teacher cache: the teacher runs once over the corpus; students train from its top-k.

    trainguard distill cache build CONFIG --out DIR      # resumable: finished shards are kept
    trainguard distill cache verify DIR CONFIG           # recompute shards with the teacher and compare
    trainguard distill cache info DIR
    # then, in the student's config:  data: {teacher_cache: DIR}  (the teacher is never loaded)

What is stored: for every position of the teacher's own tokenisation of every training window (so
any student tokenizer aligns against it later, by byte offsets, exactly as online), the teacher's
top-k ids and tempered log-probs. Per shard of `shard_windows` windows, one `.npz` (zlib):
- `offsets` [W+1]: the rows of each window;
- `ids` [R, k] uint32, in descending order of probability;
- `q` [R, k] uint16: -log p in steps of 1/`QSCALE` nat (resolution 0.001 nat, floor at -64 nats),
  delta-coded along k (the sequence is monotone, so the deltas are small and zlib squeezes them);
- `nll` [W]: the teacher's LM cross-entropy per window, in nats (what the guard watched).

Format 2 adds, when the build's config has `loss.kd.partial` on (the default), what an online student
distils at its positions inside a teacher token (`partial.py`, `losses.consistent_logprobs`): for each such
student position, in `data.prepare`'s order, the teacher's distribution at the last boundary conditioned
on the bytes read, over every consistent teacher id (up to `PartialMapper.max_ids`), not a top-k:
- `p_offsets` [W+1]: the partial rows of each window; `p_pos` [Rp]: each row's student position;
- `p_len` [Rp]: consistent ids per row; `p_ids` [E] uint32 and `p_q` [E] uint16 (-log p in steps of
  1/`QSCALE` nat, absolute: the ids keep the mapper's order, which the reader lays them out in).
Which student positions fall inside a teacher token depends on the student's tokenizer, so these rows
serve only the student tokenizer they were built with (its SHA-256 is in the manifest, checked).
A format-1 cache (aligned entries only) still serves students with `loss.kd.partial: false`.
`manifest.json` holds what makes a cache valid for a run (teacher fingerprint and tokenizer, k,
temperature, window size, the training text's SHA-256); a build refuses to extend a cache made with
anything else. Each shard is written to a temporary name and renamed, so a killed build resumes at the
first missing shard and never reads half a file.

Loading maps teacher ids to student ids with the student's own vocabulary map and recomputes the tail
(1 - mapped mass): exactly the `TeacherTargets` the online path makes, up to the 0.001-nat quantisation.
"""

from __future__ import annotations

import hashlib
import os
import stat
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.errors import UserError
from trainguard.folderio import open_fd, read_capped
from trainguard.recipes.distill.cache_valid import (
    FIX,
    MAX_MANIFEST_BYTES,
    MAX_SHARD_FILE,
    checked_manifest,
    checked_members,
    checked_shard,
)
from trainguard.untrusted import json_problem, load_json

QSCALE = 1024.0
MEMORY = 2 << 30  # bytes of decompressed shards kept in memory by a reader
QMAX = 65535
FORMAT = 2  # 2: partial rows beside the aligned entries
READABLE = (1, 2)  # format 1 still serves students with loss.kd.partial off (check_partial refuses it otherwise)


def quantize(logp: np.ndarray) -> np.ndarray:
    """[R, k] descending log-probs -> uint16 deltas of -logp * QSCALE (first column absolute)."""
    q = np.clip(np.rint(-logp.astype(np.float64) * QSCALE), 0, QMAX).astype(np.int64)
    q = np.maximum.accumulate(q, axis=1)  # keep it monotone after rounding (ties may reorder by a step)
    d = np.diff(q, axis=1, prepend=0)
    return d.astype(np.uint16)


def dequantize(d: np.ndarray) -> np.ndarray:
    return -(np.cumsum(d.astype(np.int64), axis=1).astype(np.float32) / QSCALE)


def quantize_flat(logp: np.ndarray) -> np.ndarray:
    """Log-probs in any order -> uint16 -logp * QSCALE (absolute, floor at -64 nats)."""
    return np.clip(np.rint(-logp.astype(np.float64) * QSCALE), 0, QMAX).astype(np.uint16)


def dequantize_flat(q: np.ndarray) -> np.ndarray:
    return -(q.astype(np.float32) / QSCALE)


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class TeacherCache:
    """A built cache, read shard by shard (decompressed shards stay in memory up to `MEMORY` bytes)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        mf = self.folder / "manifest.json"
        if not self.folder.is_dir():
            raise UserError(f"teacher cache: {self.folder} is not a folder")
        if not os.path.lexists(mf):
            raise UserError(f"teacher cache: no manifest.json in {self.folder}")
        # no link followed, no FIFO, capped; every field checked (cache_valid.py): damage is one line
        raw = read_capped(mf, MAX_MANIFEST_BYTES, "manifest.json")
        try:
            data = load_json(raw)
        except ValueError as exc:  # a JSONDecodeError, a UnicodeDecodeError, nesting too deep
            raise UserError(f"teacher cache: {mf} is not valid JSON ({json_problem(exc)}); {FIX}") from None
        self.manifest = checked_manifest(data, mf, READABLE)
        self.format = int(self.manifest["format"])
        self.partial: dict[str, Any] | None = self.manifest.get("partial")  # None: aligned entries only
        self.k = int(self.manifest["k"])
        self.shard_windows = int(self.manifest["shard_windows"])
        self.n_windows = int(self.manifest["n_windows"])
        total = self.manifest.get("windows_in_text")  # absent before caches said N of M
        self.windows_in_text: int | None = total if isinstance(total, int) and not isinstance(total, bool) else None
        width = self.manifest.get("teacher_width")
        self.width: int | None = width if isinstance(width, int) else None
        self._shards: dict[int, dict[str, np.ndarray]] = {}

    def shard_path(self, i: int) -> Path:
        return self.folder / f"shard-{i:05d}.npz"

    def eval_view(self) -> _EvalView | None:
        """The teacher's targets on the evaluation windows (`eval.npz`, one shard of the same layout), read
        as a cache of its own; None for a cache built before manifests had them."""
        e = self.manifest.get("eval")
        if not (isinstance(e, dict) and isinstance(e.get("n_windows"), int) and isinstance(e.get("text_sha256"), str)
                and e["n_windows"] >= 1):
            return None
        view = _EvalView.__new__(_EvalView)
        view.__dict__.update(self.__dict__)
        view.n_windows = view.shard_windows = e["n_windows"]
        view.text_sha256 = e["text_sha256"]
        view._shards = {}
        return view

    @property
    def n_shards(self) -> int:
        return -(-self.n_windows // self.shard_windows)

    def has_shard(self, i: int) -> bool:
        """Shard i is there as a regular file (a link in its place is not: lstat)."""
        try:
            return stat.S_ISREG(os.lstat(self.shard_path(i)).st_mode)
        except OSError:
            return False

    def complete(self) -> bool:
        return all(self.has_shard(i) for i in range(self.n_shards))

    def windows_in(self, i: int) -> int:
        return max(0, min(self.shard_windows, self.n_windows - i * self.shard_windows))

    def _shard(self, i: int) -> dict[str, np.ndarray]:
        if i not in self._shards:
            p = self.shard_path(i)
            if not os.path.lexists(p):
                raise UserError(f"teacher cache: {p} is missing; finish the build with `trainguard distill cache build`")
            need = ("offsets", "ids", "q", "nll") + (("p_offsets", "p_pos", "p_len", "p_ids", "p_q") if self.partial else ())
            try:
                with os.fdopen(open_fd(p, "cache shard"), "rb") as fh:
                    if os.fstat(fh.fileno()).st_size > MAX_SHARD_FILE:
                        raise UserError(damaged(p, ValueError("larger than a shard can be")))
                    with zipfile.ZipFile(fh) as zf:
                        checked_members(p, zf, need)  # before anything is inflated: a zip bomb stays unread
                    fh.seek(0)
                    with np.load(fh, allow_pickle=False) as z:
                        d = {k: z[k] for k in z.files}
            except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, NotImplementedError,
                    zlib.error, MemoryError) as exc:
                raise UserError(damaged(p, exc)) from None
            checked_shard(d, p, windows=self.windows_in(i), k=self.k, width=self.width, partial=bool(self.partial))
            if "p_len" in d:  # where each partial row's entries start
                d["p_start"] = np.concatenate([[0], np.cumsum(d["p_len"], dtype=np.int64)])
            self._shards[i] = d
            # Shuffled batches touch every shard: re-reading one per batch made cache students 2.8x slower
            # than online ones (measured). Keep decompressed shards up to a memory budget, oldest out first.
            while len(self._shards) > 1 and sum(a.nbytes for d in self._shards.values() for a in d.values()) > MEMORY:
                self._shards.pop(next(iter(self._shards)))
        return self._shards[i]

    def preload(self) -> int:
        """Decompresses shards in order while they fit the memory budget; returns how many are held.

        Done before the loop: decompression is not paid inside it, and the reader's memory does not
        grow shard by shard over the first epoch while the student trains."""
        for i in range(-(-self.n_windows // self.shard_windows)):
            self._shard(i)
            held = sum(a.nbytes for d in self._shards.values() for a in d.values())
            if 0 not in self._shards or held + held / len(self._shards) > MEMORY:
                break  # full: the budget pushed the first out, or the next shard of about the mean size would
        return len(self._shards)

    def window(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n_t, k] uint32, log-probs [n_t, k] float32) for every teacher position of window w."""
        s = self._shard(w // self.shard_windows)
        j = w % self.shard_windows
        a, b = s["offsets"][j], s["offsets"][j + 1]
        return s["ids"][a:b], dequantize(s["q"][a:b])

    def partial_window(self, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(student positions [r], ids per row [r], teacher ids [e], conditioned log-probs [e]) of window w's
        partial rows, in `data.prepare`'s order."""
        s = self._shard(w // self.shard_windows)
        if "p_len" not in s:
            raise UserError(f"teacher cache: {self.folder} holds no partial rows")
        j = w % self.shard_windows
        a, b = s["p_offsets"][j], s["p_offsets"][j + 1]
        e0, e1 = s["p_start"][a], s["p_start"][b]
        return s["p_pos"][a:b], s["p_len"][a:b], s["p_ids"][e0:e1], dequantize_flat(s["p_q"][e0:e1])

    def shard_readable(self, i: int) -> bool:
        """Whether shard i's file opens as a whole archive (a copy cut short, a full disk: it does not)."""
        try:
            with os.fdopen(open_fd(self.shard_path(i), "cache shard"), "rb") as fh, zipfile.ZipFile(fh) as z:
                checked_members(self.shard_path(i), z, ())
                return z.testzip() is None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError, zlib.error, UserError):
            return False

    def member_bytes(self) -> dict[str, int]:
        """Compressed bytes on disk per stored array, summed over the shards (a .npz is a zip)."""
        out: dict[str, int] = {}
        for p in self._shard_files():
            try:
                with os.fdopen(open_fd(p, "cache shard"), "rb") as fh, zipfile.ZipFile(fh) as z:
                    for info in z.infolist():
                        name = info.filename.removesuffix(".npy")
                        out[name] = out.get(name, 0) + info.compress_size
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError) as exc:
                raise UserError(damaged(p, exc)) from None
        return out

    def _shard_files(self) -> list[Path]:
        """The shards the manifest names that are there as regular files (links are not followed)."""
        return [self.shard_path(i) for i in range(self.n_shards) if self.has_shard(i)]

    def bytes_per_position(self) -> float:
        size = sum(os.lstat(p).st_size for p in self._shard_files())
        return size / max(1, int(self.manifest.get("positions", 0) or 0))


class _EvalView(TeacherCache):
    """The evaluation windows' targets: one shard, `eval.npz`, beside the training shards."""

    text_sha256: str

    def shard_path(self, i: int) -> Path:
        return self.folder / "eval.npz"


def damaged(path: Path, exc: BaseException) -> str:
    return (f"teacher cache: {path} is damaged ({type(exc).__name__}: {exc}); run `trainguard distill cache build` "
            "with the same arguments again: it rebuilds damaged shards")


def targets_for(cache: TeacherCache, picks: list[tuple[int, list[int]]], vocab_map: np.ndarray, top_k: int,
                student_vocab: int) -> Any:
    """`TeacherTargets` for (window, teacher positions) picks, rows in pick order (collate's s_pos order)."""
    import torch

    from trainguard.recipes.distill.kd import TeacherTargets

    ids, logp = [], []
    for w, qs in picks:
        wi, wl = cache.window(w)
        ids.append(wi[qs, :top_k])
        logp.append(wl[qs, :top_k])
    if not ids:
        e = torch.zeros((0, top_k))
        return TeacherTargets(e.to(torch.int32), e, e.bool(), torch.zeros(0))
    ids_np, logp_np = np.concatenate(ids), np.concatenate(logp)
    sid = vocab_map[ids_np.astype(np.int64)]
    mapped = sid >= 0
    lp = np.where(mapped, logp_np, 0.0).astype(np.float32)
    inside = np.where(mapped, np.exp(logp_np.astype(np.float64)), 0.0).sum(-1)
    with np.errstate(divide="ignore"):
        tail = np.log1p(-np.minimum(inside, 1.0)).astype(np.float32)
    return TeacherTargets(torch.from_numpy(np.where(mapped, sid, student_vocab).astype(np.int32)),
                          torch.from_numpy(lp), torch.from_numpy(mapped), torch.from_numpy(tail))


def partial_logp_for(cache: TeacherCache, picks: list[tuple[int, int]], tid: Any) -> Any:
    """[R, K] float32 conditioned log-probs of a batch's partial rows, laid out like its `part_tid` [R, K]
    (-1 padding; -inf there): picks are (window, partial rows) per example, in collate's order."""
    import torch

    tid_np = tid.numpy()
    R, K = tid_np.shape
    lens, ids, logp = [], [], []
    for w, n in picks:
        if not n:
            continue
        pos, ln, pi, pv = cache.partial_window(w)
        if len(pos) != n:
            raise UserError(f"data.teacher_cache: window {w} has {len(pos)} partial rows in the cache, {n} here: "
                            "it was built for another student tokenisation; rebuild it with this config")
        lens.append(ln)
        ids.append(pi)
        logp.append(pv)
    out = np.full((R, K), -np.inf, dtype=np.float32)
    if lens:
        ln_all = np.concatenate(lens).astype(np.int64)
        ids_all = np.concatenate(ids)
        rows = np.repeat(np.arange(len(ln_all)), ln_all)
        cols = np.arange(len(ids_all)) - np.repeat(np.cumsum(ln_all) - ln_all, ln_all)
        if len(ln_all) != R or ln_all.max(initial=0) > K or not np.array_equal(tid_np[rows, cols], ids_all) \
                or int((tid_np >= 0).sum()) != len(ids_all):
            raise UserError("data.teacher_cache: its partial rows name other teacher ids than this run's: it was "
                            "built for another student tokenisation; rebuild it with this config")
        out[rows, cols] = np.concatenate(logp)
    return torch.from_numpy(out)


def check_partial(cache: TeacherCache, cfg: Any, student_tokenizer: str) -> None:
    """With loss.kd.partial on, the cache must hold partial rows, built for this student's tokenizer.

    Refused rather than switched off: a cache student without them distils fewer positions than an online
    one and came out measurably worse (benchmarks/distill.md, run 5); the fix is one command or one line."""
    p = cache.partial
    if p is None:
        why = "format 1" if cache.format == 1 else "built with loss.kd.partial off"
        raise UserError(f"data.teacher_cache: {cache.folder} holds aligned positions only ({why}) and loss.kd.partial "
                        "is on: rebuild it with `trainguard distill cache build` or set loss.kd.partial: false")
    if p["student_tokenizer_sha256"] != text_digest(student_tokenizer):
        raise UserError(f"data.teacher_cache: {cache.folder}'s partial rows were built for another student tokenizer: "
                        "rebuild it with this config or set loss.kd.partial: false")
    if p["kd_positions"] != cfg.loss.kd.positions:
        raise UserError(f"data.teacher_cache: partial rows built with loss.kd.positions={p['kd_positions']}, "
                        f"the config says {cfg.loss.kd.positions}")


def check_cache(cache: TeacherCache, cfg: Any, train_text: str) -> None:
    """A cache serves a run only for the same text, windows and temperature, and only when complete."""
    m = cache.manifest
    if m["text_sha256"] != text_digest(train_text):
        raise UserError(f"data.teacher_cache: {cache.folder} was built from another training text")
    if m["window_chars"] != cfg.data.window_chars:
        raise UserError(f"data.teacher_cache: built with window_chars={m['window_chars']}, "
                        f"the config says {cfg.data.window_chars}")
    if abs(m["temperature"] - cfg.loss.kd.temperature) > 1e-9:
        raise UserError(f"data.teacher_cache: built at temperature {m['temperature']}, "
                        f"the config says {cfg.loss.kd.temperature}")
    if not cache.complete():
        done = sum(cache.has_shard(i) for i in range(cache.n_shards))
        raise UserError(f"data.teacher_cache: {cache.folder} is unfinished ({done} of {cache.n_shards} shards "
                        "written); finish it by running the same `trainguard distill cache build` again")
