"""The shape of the code, checked: each finding code declared once, and imports pointing one way.

A finding code ("TG502") and its name ("run-hung") are written in src/ exactly once, in the rule's
declaration (a `Code(...)` beside the function that builds its findings, or a rule class's
`code, name, severity = ...`); everything else imports the declaration. Docstrings and comments may
mention codes in prose; a string literal that is exactly a code or a name is a hand-quoted copy.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from trainguard.catalog import CATALOG

SRC = Path(__file__).resolve().parents[1] / "src" / "trainguard"
CODE = re.compile(r"TG\d{3}")


def _literals(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(string, line, is it a declaration) for every string literal outside docstrings."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    declared = set()
    for node in ast.walk(tree):
        # Code("TG503", "run-killed", ...)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Code":
            declared.update(id(a) for a in node.args[:2])
        # class LossSpike(Rule): code, name, severity = "TG207", "loss-spike", "warning"
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
                and [getattr(t, "id", None) for t in node.targets[0].elts][:2] == ["code", "name"]
                and isinstance(node.value, ast.Tuple)):
            declared.update(id(v) for v in node.value.elts[:2])
    return [(node.value, node.lineno, id(node) in declared) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def _mentions() -> dict[str, list[tuple[str, bool]]]:
    names = {e.name for e in CATALOG}
    found: dict[str, list[tuple[str, bool]]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        for text, line, is_decl in _literals(ast.parse(path.read_text(encoding="utf-8"))):
            if CODE.fullmatch(text) or text in names:
                found[text].append((f"{path.relative_to(SRC)}:{line}", is_decl))
    return found


def test_each_finding_code_and_name_is_written_once_as_its_declaration() -> None:
    found = _mentions()
    problems = []
    for entry in CATALOG:
        for key in (entry.code, entry.name):
            places = found.pop(key, [])
            decls = [where for where, is_decl in places if is_decl]
            copies = [where for where, is_decl in places if not is_decl]
            if len(decls) != 1 or copies:
                problems.append(f"{key}: declared at {decls or 'nowhere'}; quoted by hand at {copies}")
    # a code literal that no catalogue entry declares is a rule the catalogue does not list
    problems += [f"{key}: not in the catalogue, at {[w for w, _ in places]}" for key, places in found.items()
                 if CODE.fullmatch(key)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_hand_quoted_code(tmp_path: Path) -> None:
    # the check itself can fail: a second literal of a code is seen, a declaration is told apart
    source = 'X = Code("TG999", "made-up", "error")\ndef f():\n    """TG999 in prose is fine."""\n    return "TG999"\n'
    literals = [(t, is_decl) for t, _, is_decl in _literals(ast.parse(source)) if CODE.fullmatch(t)]
    assert literals == [("TG999", True), ("TG999", False)] or sorted(literals) == [("TG999", False), ("TG999", True)]


# importlib used on purpose, and why (never for the project's own modules)
IMPORTLIB_ALLOWED = {
    "recipes/distill/command.py": "checks that third-party libraries of the distill extra are installed",
}


def test_no_importlib_lookups_of_the_project() -> None:
    # the project's modules are imported by name, where a reader (and the layer check) sees them
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = node.func if isinstance(node, ast.Call) else None
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            if name in ("import_module", "__import__") and rel not in IMPORTLIB_ALLOWED:
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders
