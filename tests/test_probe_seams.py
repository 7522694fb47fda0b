"""The probe's parts meet through narrow, public seams: no part reaches into another's private fields.

A private field is a name with one leading underscore that some class in src/trainguard/probe/ defines
(assigned as `self._x = ...`, or a method `def _x`). Reading or writing `other._x` for any `other` that is
not `self` (or `cls`) is a reach into another object's insides: the probe state (probe/state.py), the
hand-off (probe/handoff.py) and the parts' public attributes are the seams instead. Torch's own private
names (`tensor._version`, `torch._foreach_norm`) are no part of the probe and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PROBE = Path(__file__).resolve().parents[1] / "src" / "trainguard" / "probe"
# Files allowed some reaches, with how many (none now: probe/contracts.py, cut into a hook dispatcher and
# families of checks in issue 35, reads the guard through its public names).
ALLOWED: dict[str, int] = {}


def _private_names(trees: dict[str, ast.AST]) -> set[str]:
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in ast.walk(node):
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                        names.add(item.name)
                    elif (isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store)
                          and isinstance(item.value, ast.Name) and item.value.id == "self" and _private(item.attr)):
                        names.add(item.attr)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def reaches(trees: dict[str, ast.AST]) -> dict[str, list[str]]:
    """Per file: each `other._x` (other not self/cls, `_x` a probe class's private name), as "line: text"."""
    names = _private_names(trees)
    found: dict[str, list[str]] = {}
    for file, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in names):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            found.setdefault(file, []).append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def _trees(folder: Path) -> dict[str, ast.AST]:
    return {p.name: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.py"))}


def test_no_part_of_the_probe_reaches_into_anothers_private_fields() -> None:
    found = reaches(_trees(PROBE))
    over = {f: lines for f, lines in found.items() if len(lines) > ALLOWED.get(f, 0)}
    assert not over, f"private fields reached across objects: {over}"


def test_the_check_sees_a_reach_through_any_expression(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("class A:\n    def __init__(self):\n        self._n = 0\n        self.b = B()\n")
    (tmp_path / "b.py").write_text("class B:\n    def _tick(self):\n        self._n = 1\n\n"
                                   "def use(a, t):\n    a._n += 1\n    a.b._tick()\n    return t._version\n")
    found = reaches(_trees(tmp_path))
    assert found == {"b.py": ["6: a._n", "7: a.b._tick"]}  # `t._version`: no probe class defines it
