"""A teacher cache is untrusted input: its manifest and every shard are checked before they are used.

A cache folder may be a copy cut short, a disk that flipped bits, or a folder someone handed over. What
the reader relies on is checked here, once per file, so that damage is one line (UserError, exit 2) that
names the file and the fix, never a traceback, a broadcast error deep in `verify`, or a loop over a
billion shards that a manifest's `n_windows` made up:

- the manifest: each field of the type and range `cache_build` writes; the shard count it implies is at
  most MAX_SHARDS (shard names have five digits) and `n_windows` at most the positions it claims;
- a shard: a regular file (no link), at most MAX_SHARD_FILE bytes, whose members decompress to at most
  MAX_SHARD_BYTES together (read from the zip's directory before anything is inflated: a zip bomb is
  refused unread); its arrays of the dtypes and shapes the format defines (offsets monotone from 0 to the
  row count, `ids` [R, k] below the teacher's width, the partial rows' lengths summing to their entries).
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.errors import UserError

MAX_SHARDS = 100_000  # shard-{i:05d}.npz
MAX_SHARD_FILE = 4 << 30  # bytes of one .npz on disk
MAX_SHARD_BYTES = 2 << 30  # bytes one shard decompresses to (the reader's MEMORY budget)
MAX_MANIFEST_BYTES = 64 << 20  # the teacher's tokenizer.json is in it: megabytes, never this
FIX = "rebuild it with `trainguard distill cache build` into a new folder"


def _bad(path: Path, why: str) -> UserError:
    return UserError(f"teacher cache: {path} is damaged ({why}); {FIX}")


def _int(m: dict[str, Any], key: str, path: Path, lo: int, hi: int, required: bool = True) -> None:
    v = m.get(key)
    if v is None and not required:
        return
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(path, f"{key} is {str(v)[:40]!r}, not a whole number in [{lo}, {hi}]")


def checked_manifest(m: Any, path: Path, readable: tuple[int, ...]) -> dict[str, Any]:
    """The manifest when every field a reader uses has its documented type and range; UserError otherwise."""
    if not isinstance(m, dict):
        raise _bad(path, f"a JSON object is expected, found {type(m).__name__}")
    if m.get("format") not in readable or isinstance(m.get("format"), bool):
        raise UserError(f"teacher cache: {path.parent} has format {str(m.get('format'))[:40]!r}, this version reads "
                        f"{' or '.join(map(str, readable))}")
    _int(m, "k", path, 1, 1 << 20)
    _int(m, "shard_windows", path, 1, 1 << 30)
    _int(m, "n_windows", path, 0, MAX_SHARDS * m["shard_windows"])
    _int(m, "positions", path, 0, 1 << 50, required=False)
    if m.get("positions") is None:
        m["positions"] = 0  # (a build of an older version may not have counted them: 0, unknown)
    _int(m, "teacher_width", path, 1, 1 << 31)
    _int(m, "window_chars", path, 1, 1 << 40)
    if isinstance(m.get("positions"), int) and m["positions"] and m["n_windows"] > m["positions"]:
        raise _bad(path, f"n_windows {m['n_windows']} is more than its {m['positions']} positions")
    t = m.get("temperature")
    if (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
        raise _bad(path, f"temperature is {str(t)[:40]!r}")
    fp = m.get("teacher_fingerprint")
    if (isinstance(fp, bool) or not isinstance(fp, (int, float)) or not math.isfinite(fp)):
        raise _bad(path, f"teacher_fingerprint is {str(fp)[:40]!r}")
    if not isinstance(m.get("text_sha256"), str):
        raise _bad(path, "text_sha256 is not text")
    for key in ("teacher_tokenizer", "precision"):
        if key in m and m[key] is not None and not isinstance(m[key], str):
            raise _bad(path, f"{key} is not text")
    p = m.get("partial")
    if p is not None:
        if not isinstance(p, dict) or not isinstance(p.get("student_tokenizer_sha256"), str) \
                or "kd_positions" not in p:
            raise _bad(path, "partial is not the object a build writes")
        _int(p, "rows", path / "partial", 0, 1 << 50)
        _int(p, "entries", path / "partial", 0, 1 << 50)
        _int(p, "max_ids", path / "partial", 0, 1 << 31, required=False)
    return m


def checked_members(path: Path, z: zipfile.ZipFile, need: tuple[str, ...]) -> None:
    """The zip's directory, before anything is inflated: the members a shard needs, and a total size that
    fits the memory budget (a zip bomb's header says how much it would take)."""
    names = {i.filename.removesuffix(".npy") for i in z.infolist()}
    missing = [n for n in need if n not in names]
    if missing:
        raise _bad(path, f"no {missing[0]} array in it")
    total = sum(i.file_size for i in z.infolist())
    if total > MAX_SHARD_BYTES:
        raise _bad(path, f"it decompresses to {total:,} bytes, more than a shard can be ({MAX_SHARD_BYTES:,})")


def _array(d: dict[str, np.ndarray], key: str, path: Path, ndim: int, kind: str) -> np.ndarray:
    a = d.get(key)
    if not isinstance(a, np.ndarray) or a.ndim != ndim or a.dtype.kind not in kind:
        got = "missing" if a is None else f"{getattr(a, 'dtype', '?')} with {getattr(a, 'ndim', '?')} dims"
        raise _bad(path, f"{key} is {got}, not a {ndim}-d array of {'integers' if 'i' in kind else 'numbers'}")
    return a


def _offsets(d: dict[str, np.ndarray], key: str, path: Path, windows: int, rows: int) -> None:
    o = _array(d, key, path, 1, "iu")
    if len(o) != windows + 1 or int(o[0]) != 0 or int(o[-1]) != rows or bool((np.diff(o.astype(np.int64)) < 0).any()):
        raise _bad(path, f"{key} does not run from 0 to {rows} over {windows} windows")


def checked_shard(d: dict[str, np.ndarray], path: Path, *, windows: int, k: int, width: int | None,
                  partial: bool) -> dict[str, np.ndarray]:
    """A shard's arrays when their dtypes and shapes are the format's; UserError otherwise. `windows`: how
    many windows this shard holds by the manifest."""
    ids = _array(d, "ids", path, 2, "iu")
    q = _array(d, "q", path, 2, "iu")
    if ids.shape[1] != k or q.shape != ids.shape:
        raise _bad(path, f"ids {ids.shape} and q {q.shape} are not [rows, k={k}]")
    if width is not None and ids.size and (int(ids.max()) >= width or int(ids.min()) < 0):
        raise _bad(path, f"a teacher id outside the teacher's {width} logits")
    _offsets(d, "offsets", path, windows, len(ids))
    nll = _array(d, "nll", path, 1, "fiu")
    if len(nll) != windows:
        raise _bad(path, f"nll has {len(nll)} values for {windows} windows")
    if partial:
        p_pos, p_len = _array(d, "p_pos", path, 1, "iu"), _array(d, "p_len", path, 1, "iu")
        p_ids, p_q = _array(d, "p_ids", path, 1, "iu"), _array(d, "p_q", path, 1, "iu")
        _offsets(d, "p_offsets", path, windows, len(p_pos))
        if len(p_len) != len(p_pos) or (p_len.size and int(p_len.min()) < 0) \
                or int(p_len.astype(np.int64).sum()) != len(p_ids) or len(p_q) != len(p_ids):
            raise _bad(path, "the partial rows' lengths do not add up to their entries")
    return d
