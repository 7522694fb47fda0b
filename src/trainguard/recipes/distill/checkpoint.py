"""Checkpoints as plain dicts: everything needed to continue exactly where a run stopped.

`last.pt` is rewritten every `save_every` optimizer steps and at the end; `best.pt` at each better
evaluation. A checkpoint holds the student, the projections, optimizer, scheduler, scaler, RNG states,
the optimizer step, the data position (epoch, index), the early-stopping state, both tokenizers (so a
resumed run tokenises identically) and a fingerprint of the frozen teacher (so it is the same teacher).
Writes go to a temporary file and are renamed into place: a kill mid-write never leaves half a file.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch

from trainguard.errors import UserError


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@torch.no_grad()
def fingerprint(model: Any) -> float:
    """A cheap checksum of a frozen model's weights (float64 sum of |w| over every tensor)."""
    return float(sum(p.detach().double().abs().sum() for p in model.parameters()))


def save(path: Path, state: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"resume: no checkpoint at {p}")
    # weights_only=True: a checkpoint is data (tensors, numbers, text, RNG states); unpickling arbitrary
    # objects from a file in a run folder would run whatever code its author put there. A file that needs
    # more is refused in one line.
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for a refused object; RuntimeError, EOFError for a damaged file
        raise UserError(f"resume: cannot load {p} as a checkpoint of plain data ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); resume from a checkpoint this "
                        f"recipe wrote") from None


def check_compatible(state: dict[str, Any], teacher_print: float) -> None:
    """A checkpoint resumes only against the same teacher (the student's targets depend on it)."""
    saved = state.get("teacher_fingerprint")
    if saved is not None and abs(saved - teacher_print) > 1e-6 * max(1.0, abs(saved)):
        raise UserError(f"resume: the teacher differs from the checkpoint's (weights checksum "
                        f"{teacher_print:.6g} vs {saved:.6g}); resume with the same teacher config and seed")
