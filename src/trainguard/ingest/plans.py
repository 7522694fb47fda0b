"""Where a framework writes its plan, read: the planned length and patience from a contract's plan files.

A plan file is YAML (Ultralytics `args.yaml`, YOLOv5 `opt.yaml`, Lightning `hparams.yaml`, W&B
`config.yaml` with its `{value: ...}` wrappers) or an OpenMMLab Python config (`config.py`), which is
parsed, never run: module-level `name = <number>` and `name = dict(key=<number>, ...)` assignments only.
A file that cannot be read states no plan (the readers then say less, never fail).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.ingest.events import to_number
from trainguard.ingest.formats import FormatContract

MAX_PLAN_BYTES = 1 << 20  # a plan file larger than this is not one


@dataclass(frozen=True)
class Plan:
    """A planned length (in the contract's step unit), a patience, and where each was read."""

    length: int | None = None
    length_key: str | None = None
    patience: int | None = None
    source: str | None = None  # the file name the plan came from

    def says(self) -> str:
        return f"{self.source} {self.length_key}={self.length}" if self.length else "no plan"


def read_plan(folder: Path, contract: FormatContract | None) -> Plan:
    """The first of the contract's plan files in `folder` that states a planned length (or patience)."""
    if contract is None or not contract.plan_files:
        return Plan()
    for pattern in contract.plan_files:
        for path in sorted(folder.glob(pattern)):
            values = load_plan_file(path)
            if not values:
                continue
            key, length = _first(values, contract.plan_keys)
            _, patience = _first(values, contract.patience_keys)
            if length is not None or patience is not None:
                return Plan(length=length, length_key=key, patience=patience, source=path.name)
    return Plan()


def load_plan_file(path: Path) -> dict[str, Any]:
    """A plan file's keys and values (nested dicts kept), {} when it cannot be read."""
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_PLAN_BYTES:
            return {}
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    if path.suffix == ".py":
        return _python_config(text)
    from trainguard.untrusted import load_yaml

    try:
        data = load_yaml(text)
    except Exception:  # YAML the writer's own loader would refuse too, a tag safe_load does not know, an alias bomb
        return {}
    return _unwrap(data) if isinstance(data, dict) else {}


def _unwrap(data: dict[str, Any]) -> dict[str, Any]:
    """W&B's config.yaml holds each key as `{desc: ..., value: X}`: X is the value."""
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and "value" in v and set(v) <= {"value", "desc"}:
            v = v["value"]
        out[str(k)] = v
    return out


def _first(values: dict[str, Any], keys: tuple[str, ...]) -> tuple[str | None, int | None]:
    for key in keys:
        node: Any = values
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        n = to_number(node)
        if n is not None and 0 < n < 1e12 and n == int(n):
            return key, int(n)
    return None, None


def _python_config(text: str) -> dict[str, Any]:
    """Module-level literal assignments of an mmengine-style config, with `dict(...)` calls as dicts."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return {}
    names: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _literal(node.value, names)
            if value is not None:
                names[node.targets[0].id] = value
    return names


def _literal(node: ast.AST, names: dict[str, Any], depth: int = 0) -> Any:
    if depth > 8:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
        return node.value
    if isinstance(node, ast.Name):  # `max_epochs=max_epochs`: a name assigned above
        return names.get(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return {kw.arg: _literal(kw.value, names, depth + 1) for kw in node.keywords if kw.arg}
    if isinstance(node, ast.Dict):
        return {k.value: _literal(v, names, depth + 1) for k, v in zip(node.keys, node.values)
                if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return None
