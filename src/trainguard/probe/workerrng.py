"""DataLoader workers that start with the same random state (the `workers-share-rng` contract).

A Dataset that keeps its own generator (`self.rng = np.random.default_rng(0)`, a `random.Random`, a
`torch.Generator`) is copied into every worker as it is, so every worker draws the same numbers; and
with workers that are not persistent, every epoch draws them again. PyTorch reseeds only the global
`random`, `torch` and NumPy generators in each worker (NumPy's since pytorch/pytorch#56488), and a
`worker_init_fn` that seeds the global NumPy generator with a constant undoes even that.

The probe chains the loader's `worker_init_fn` (the user's runs first, unchanged). In each worker the
chained part records a fingerprint of every generator the dataset's code reaches, with the first few
numbers each would draw (drawn from a copy: the user's stream is not touched), in a small JSON file in
the run folder. The probe's background thread compares the files: two workers, or two epochs, whose
generator starts in the same state draw the same augmentations.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from trainguard.errors import UserError

MAX_EPOCHS = 4  # loader iterations (epochs) whose workers are fingerprinted; the bug shows in the first two
MAX_FILES = 256


class FingerprintInit:
    """A `worker_init_fn`: the user's own, then a fingerprint of the worker's generators (never raises)."""

    def __init__(self, user_fn: Any, folder: str) -> None:
        self.user_fn = user_fn
        self.folder = folder

    def __call__(self, worker_id: int) -> None:
        if self.user_fn is not None:
            self.user_fn(worker_id)
        try:
            record(worker_id, self.folder)
        except Exception:
            pass  # the worker is the user's: a fingerprint that fails must not cost it its data


def wrap(iterable: Any, reports: Reports) -> None:
    """Chains the fingerprint into a DataLoader with workers, for the first few epochs."""
    from torch.utils.data import DataLoader

    if not isinstance(iterable, DataLoader) or not iterable.num_workers:
        return
    fn = iterable.worker_init_fn
    original = fn.user_fn if isinstance(fn, FingerprintInit) else fn
    if reports.done or reports.epochs >= MAX_EPOCHS:
        if fn is not original:
            iterable.worker_init_fn = original  # enough seen: later workers start exactly as the user wrote
        return
    if iterable.persistent_workers and getattr(iterable, "_iterator", None) is not None:
        return  # persistent workers already started: they are not started again
    iterable.worker_init_fn = FingerprintInit(original, str(reports.folder))
    reports.epochs += 1


def record(worker_id: int, folder: str) -> None:
    """In a worker: the fingerprint of each generator its dataset can reach, written as one JSON file."""
    import torch

    info = torch.utils.data.get_worker_info()
    if info is None:
        return
    dataset = info.dataset
    names = code_names(dataset)
    rngs: dict[str, Any] = {}
    for path, owner, attr, gen in generators(dataset):
        if attr in code_names(owner) or owner is dataset and attr in names:
            rngs[path] = {"type": type(gen).__name__, "state": _state_hash(gen), "draws": _peek(gen)}
    if "random" in names:  # the per-sample code calls np.random.* or random.*: the global generators count
        np = sys.modules.get("numpy")
        if np is not None:
            rngs["numpy.random (global)"] = {"type": "RandomState", "state": _digest(np.random.get_state()),
                                             "draws": _peek_numpy_global(np)}
        import random

        rngs["random (global)"] = {"type": "Random", "state": _digest(random.getstate()),
                                   "draws": _peek(_copy_random(random))}
    base = int(info.seed) - int(worker_id)  # the same for every worker of one loader iteration (epoch)
    from trainguard.folderio import subdir, write_atomic

    folder_path = subdir(folder)  # a real folder of the run, never a link planted in its place
    write_atomic(folder_path / f"worker-{base}-{worker_id}.json",
                 json.dumps({"worker": worker_id, "workers": int(info.num_workers), "base_seed": base,
                             "pid": os.getpid(), "dataset": type(dataset).__name__, "rngs": rngs}))


def generators(obj: Any, path: str = "dataset", depth: int = 0) -> list[tuple[str, Any, str, Any]]:
    """(path, owner, attribute, generator) for each random generator held by `obj` or objects it holds."""
    out: list[tuple[str, Any, str, Any]] = []
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict):
        return out
    for attr, value in list(attrs.items())[:200]:
        if is_generator(value):
            out.append((f"{path}.{attr}", obj, attr, value))
        elif depth < 2:
            children = value if isinstance(value, (list, tuple)) else [value]
            for i, child in enumerate(children[:20]):
                if _walkable(child):
                    sub = f"{path}.{attr}" + (f"[{i}]" if children is value else "")
                    out.extend(generators(child, sub, depth + 1))
    return out


def is_generator(value: Any) -> bool:
    import random

    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, (np.random.Generator, np.random.RandomState)):
        return True
    if isinstance(value, random.Random):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Generator)


def _walkable(value: Any) -> bool:
    if value is None or isinstance(value, (str, bytes, int, float, bool, dict, type)):
        return False
    module = type(value).__module__ or ""
    return hasattr(value, "__dict__") and not module.startswith(("torch", "numpy", "builtins"))


def code_names(obj: Any) -> set[str]:
    """Names the methods of `obj`'s class (but `__init__`) read: where a generator is used, not just built."""
    names: set[str] = set()
    for cls in type(obj).__mro__:
        if cls is object or (cls.__module__ or "").startswith("torch."):
            continue
        for attr, fn in vars(cls).items():
            if attr == "__init__":
                continue
            code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
            if code is not None:
                _collect(code, names)
    return names


def _collect(code: Any, names: set[str]) -> None:
    names.update(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            _collect(const, names)


def _state(gen: Any) -> Any:
    import random

    if isinstance(gen, random.Random):
        return gen.getstate()
    if hasattr(gen, "bit_generator"):
        return gen.bit_generator.state
    if hasattr(gen, "get_state"):
        state = gen.get_state()
        return state.numpy().tobytes() if hasattr(state, "numpy") else state
    return None


def _state_hash(gen: Any) -> str:
    return _digest(_state(gen))


def _digest(state: Any) -> str:
    return hashlib.sha1(pickle.dumps(state)).hexdigest()[:16]


def _peek(gen: Any, n: int = 3) -> list[float]:
    """The next `n` numbers `gen` will draw, drawn from a copy."""
    import random

    if isinstance(gen, random.Random):
        twin = random.Random()
        twin.setstate(gen.getstate())
        return [round(twin.random(), 6) for _ in range(n)]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(gen, torch.Generator):
        twin = torch.Generator(device=gen.device)
        twin.set_state(gen.get_state())
        return [round(v, 6) for v in torch.rand(n, generator=twin, device=gen.device).tolist()]
    twin = copy.deepcopy(gen)
    draw = twin.random(n) if hasattr(twin, "random") else twin.random_sample(n)
    return [round(float(v), 6) for v in draw]


def _peek_numpy_global(np: Any, n: int = 3) -> list[float]:
    twin = np.random.RandomState()
    twin.set_state(np.random.get_state())
    return [round(float(v), 6) for v in twin.random_sample(n)]


def _copy_random(random: Any) -> Any:
    twin = random.Random()
    twin.setstate(random.getstate())
    return twin


class Reports:
    """The parent's side: reads the workers' files and finds two that start from the same state."""

    def __init__(self, run_dir: str | Path) -> None:
        self.folder = Path(run_dir) / "workers"
        self.epochs = 0
        self.done = False
        self.records: list[dict[str, Any]] = []
        self.read: set[str] = set()

    def compare(self) -> dict[str, Any] | None:
        if self.done or not self.epochs or not self.folder.is_dir() or self.folder.is_symlink():
            return None
        for path in sorted(self.folder.glob("worker-*.json"))[:MAX_FILES]:
            if path.name in self.read:
                continue
            try:
                from trainguard.folderio import read_capped

                rec = json.loads(read_capped(path, 1 << 20, "worker record"))  # no link, no FIFO, capped
                if not isinstance(rec, dict):
                    raise ValueError("not a record")
                self.records.append(rec)
                self.read.add(path.name)
            except (OSError, ValueError, UserError):
                continue  # being written: read at the next look
        epochs: dict[int, int] = {}
        seen: dict[int, int] = {}  # files read per epoch
        for rec in self.records:
            epochs.setdefault(rec["base_seed"], len(epochs) + 1)
            seen[rec["base_seed"]] = seen.get(rec["base_seed"], 0) + 1
        first: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {}
        across_epochs = None
        for rec in self.records:
            for gen_path, gen in rec["rngs"].items():
                key = (gen_path, gen["state"])
                who = {"worker": rec["worker"], "epoch": epochs[rec["base_seed"]], "draws": gen["draws"]}
                if key not in first:
                    first[key] = (who, rec)
                    continue
                a, a_rec = first[key]
                found = {
                    "generator": gen_path, "type": gen["type"], "dataset": rec.get("dataset"),
                    "first": a, "second": who, "across": "workers" if a["epoch"] == who["epoch"] else "epochs",
                    "workers_seen": len(self.records),
                }
                if found["across"] == "workers":
                    self.done = True
                    return found
                # Two epochs alike is said only once the first of them has been read whole: where its
                # workers are alike too, that is the cause to name (a file still being written under load
                # once made the same-workers bug read as same-epochs).
                if across_epochs is None and seen[a_rec["base_seed"]] >= int(a_rec.get("workers") or 0):
                    across_epochs = found
        if across_epochs is not None:
            self.done = True
        return across_epochs
