"""A checkpoint's facts, read in the verifier's child process: what it holds and whether all of it is finite.

    facts = read_checkpoint("ckpt/step-500.pt")
    {"format": "torch", "files": [...], "tensors": 148, "elements": 124_439_808, "nonfinite": [...],
     "claimed_step": 500, "claimed_from": "iter_num", "fingerprint": "3f9a...", "error": None}

What is read, by format:
- a torch file: `torch.load(weights_only=True, map_location="cpu", mmap=True)`: the tensors stay in the
  file's pages (mapped, never copied), so memory does not grow with the checkpoint. A file that
  `weights_only` refuses (it pickles objects of the script's own classes) is *not verifiable*, not broken:
  trainguard never unpickles arbitrary objects;
- a safetensors file: the `safetensors` package, one tensor at a time;
- a folder (a Hugging Face `checkpoint-N`): its weight files (model*.safetensors, pytorch_model*.bin,
  adapter_model.*), the shards an index file names (a shard missing is unloadable), optimizer.pt, and the
  step from trainer_state.json. Other files (training_args.bin pickles a class) are left alone.

Each floating tensor is summed in float64 (one pass; a finite sum means every element is finite: no
float32, bf16 or fp16 value is large enough to overflow it); only a tensor whose sum is not finite is
counted element by element. The fingerprint hashes each tensor's name, shape, sum and a few sampled
elements: two checkpoints with the same fingerprint hold the same numbers, at a fraction of a full hash.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

MAX_LISTED = 12  # non-finite tensors named in the facts (the count covers all of them)
MAX_DEPTH = 12  # nesting walked in a checkpoint's dicts and lists
SAMPLES = 8  # elements per tensor in the fingerprint
# keys a checkpoint's top level names its optimizer step by (nanoGPT's iter_num, Lightning's global_step)
STEP_KEYS = ("global_step", "step", "iter_num", "iteration", "iter", "num_updates", "steps")
# "checkpoint-500" (Hugging Face), "global_step500" (DeepSpeed), "step_500", "step-500", "step=500" (Lightning)
_PATH_STEP = re.compile(r"(?:checkpoint-|global_step|(?<![a-z])step[-_=]?)(\d+)(?!\d)", re.I)
WEIGHT_FILES = re.compile(r"^(model|pytorch_model|adapter_model|diffusion_pytorch_model)([-.].*)?\.(safetensors|bin)$"
                          r"|^optimizer\.(pt|bin)$")


TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")


class Unverifiable(Exception):
    """The checkpoint cannot be judged (a format not understood, objects weights_only refuses): not broken."""


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The facts of one checkpoint (file or folder). Never raises: a failure is the facts' `error`."""
    p = Path(path)
    facts: dict[str, Any] = {"path": str(p), "format": None, "files": [], "tensors": 0, "elements": 0,
                             "nonfinite": [], "nonfinite_tensors": 0, "nonfinite_elements": 0,
                             "claimed_step": None, "claimed_from": None, "fingerprint": None,
                             "error": None, "unverifiable": None}
    digest = hashlib.blake2b(digest_size=16)
    try:
        if p.is_dir():
            _read_folder(p, facts, digest)
        elif p.is_file():
            _read_file(p, facts, digest)
        elif p.exists():
            raise Unverifiable(f"{p} is not a regular file or a folder")
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
    except Unverifiable as exc:
        facts["unverifiable"] = str(exc)[:500]
    except Exception as exc:  # whatever the loader says of a damaged file: the checkpoint is unloadable
        facts["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    if facts["claimed_step"] is None:
        m = _PATH_STEP.findall(p.name) or _PATH_STEP.findall(p.parent.name)
        if m:
            facts["claimed_step"], facts["claimed_from"] = int(m[-1]), "the path"
    facts["fingerprint"] = digest.hexdigest() if facts["tensors"] else None
    return facts


def _read_folder(folder: Path, facts: dict[str, Any], digest: Any) -> None:
    facts["format"] = "folder"
    state = folder / "trainer_state.json"
    if state.is_file() and state.stat().st_size < 64 << 20:
        try:
            step = json.loads(state.read_text()).get("global_step")
        except ValueError as exc:
            raise ValueError(f"trainer_state.json is not JSON: {exc}") from None
        if isinstance(step, int):
            facts["claimed_step"], facts["claimed_from"] = step, "trainer_state.json global_step"
    files = sorted(f for f in folder.iterdir() if f.is_file() and WEIGHT_FILES.match(f.name))
    for index in sorted(folder.glob("*.index.json")):
        try:
            weight_map = json.loads(index.read_text()).get("weight_map") or {}
        except ValueError as exc:
            raise ValueError(f"{index.name} is not JSON: {exc}") from None
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).is_file():
                raise FileNotFoundError(f"{index.name} names shard {shard}, which is missing")
    if not files:
        raise Unverifiable(f"no weight file trainguard reads in {folder} (model*.safetensors, "
                           "pytorch_model*.bin, optimizer.pt)")
    for f in files:
        _read_file(f, facts, digest, in_folder=True)
    facts["format"] = "folder"


def _read_file(path: Path, facts: dict[str, Any], digest: Any, in_folder: bool = False) -> None:
    facts["files"].append(path.name if in_folder else str(path))
    prefix = f"{path.name}:" if in_folder else ""
    if path.suffix == ".safetensors":
        facts["format"] = facts["format"] or "safetensors"
        _read_safetensors(path, facts, digest, prefix)
        return
    with open(path, "rb") as fh:
        head = fh.read(4)
    # torch.save writes a zip archive (PK...), or a pickle (0x80) in its legacy format: anything else is a
    # format trainguard does not read (numpy, JSON, a framework's own), not a broken checkpoint
    if not head.startswith((b"PK", b"\x80")):
        if not head and path.suffix in TORCH_SUFFIXES:
            raise EOFError(f"{path.name} is empty")
        raise Unverifiable(f"{path.name} is neither a torch file nor safetensors")
    facts["format"] = facts["format"] or "torch"
    import pickle

    import torch

    try:
        obj = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except pickle.UnpicklingError as exc:
        if "weights only" in str(exc).lower() or "weights_only" in str(exc):
            raise Unverifiable(f"{path.name} holds objects torch.load(weights_only=True) refuses (the script's "
                               f"own classes); trainguard does not unpickle them: {str(exc).splitlines()[0]}") from None
        raise
    except RuntimeError as exc:
        if "mmap" not in str(exc):
            raise
        # a file in torch's legacy (pre-zip) format cannot be mapped: read it whole
        obj = torch.load(path, weights_only=True, map_location="cpu")
    if not path.name.startswith("optimizer"):  # an optimizer's state says nothing of the model's step
        _claim(obj, facts)
    _walk(obj, prefix, facts, digest, 0)


def _read_safetensors(path: Path, facts: dict[str, Any], digest: Any, prefix: str) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        for key in STEP_KEYS:
            if facts["claimed_step"] is None and str(meta.get(key, "")).isdigit():
                facts["claimed_step"], facts["claimed_from"] = int(meta[key]), f"{key} in the metadata"
        for name in sorted(f.keys()):
            _tensor(prefix + name, f.get_tensor(name), facts, digest)


def _claim(obj: Any, facts: dict[str, Any]) -> None:
    """The step a checkpoint's own top level says it was saved at."""
    if facts["claimed_step"] is not None or not isinstance(obj, dict):
        return
    for key in STEP_KEYS:
        value: Any = obj.get(key)
        if hasattr(value, "numel") and value.numel() == 1:
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            facts["claimed_step"], facts["claimed_from"] = int(value), key
            return


def _walk(obj: Any, name: str, facts: dict[str, Any], digest: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        return
    if hasattr(obj, "dtype") and hasattr(obj, "numel"):
        _tensor(name, obj, facts, digest)
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            _walk(obj[key], f"{name}.{key}" if name and not name.endswith(":") else f"{name}{key}", facts, digest,
                  depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _walk(item, f"{name}.{i}" if name else str(i), facts, digest, depth + 1)


def _tensor(name: str, t: Any, facts: dict[str, Any], digest: Any) -> None:
    import torch

    n = t.numel()
    facts["tensors"] += 1
    facts["elements"] += n
    digest.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
    if n == 0:
        return
    flat = t.reshape(-1)
    if t.is_floating_point() or t.is_complex():
        try:
            total = torch.sum(flat if not t.is_complex() else torch.view_as_real(flat), dtype=torch.float64).item()
        except (RuntimeError, TypeError):  # a dtype the sum kernel lacks (float8): up-cast in slices
            total = sum(flat[i:i + (1 << 22)].double().sum().item() for i in range(0, n, 1 << 22))
        if not math.isfinite(total):
            bad = n - int(torch.isfinite(flat).sum().item()) if not t.is_complex() else n
            if bad:
                facts["nonfinite_tensors"] += 1
                facts["nonfinite_elements"] += bad
                if len(facts["nonfinite"]) < MAX_LISTED:
                    nans = int(torch.isnan(flat).sum().item()) if not t.is_complex() else None
                    facts["nonfinite"].append({"tensor": name, "nonfinite": bad, "nan": nans, "numel": n,
                                               "dtype": str(t.dtype).replace("torch.", "")})
        digest.update(repr(total).encode())
    idx = torch.linspace(0, n - 1, steps=min(SAMPLES, n)).long()
    digest.update(repr(flat[idx].tolist()).encode())
