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


# -- layers ------------------------------------------------------------------------------------------
# Each room (a subpackage or a top-level module of trainguard) imports only rooms of lower layers, and
# itself. Rooms of one layer do not import each other. Lazy imports inside functions count too.
LAYERS: list[list[str]] = [
    ["errors"],  # the one exception a user sees as a one-line message
    ["untrusted", "contract", "folderio", "exitcodes"],  # what crosses rooms; how untrusted text and run folders are read; the exit codes
    ["findings"],  # what a finding is, how a rule is declared, the data rules read
    # the run folder: run.db, status.json, the guard's own log; checkpoints read in a child process; what
    # the GPUs and the kernel say (issue 37)
    ["store", "checkpoints", "devices"],
    ["rules"],  # judgments over events: the health rules and their engine, crashes read from tracebacks
    ["ingest"],  # logs and metric files turned into the same events
    ["notify"],  # a finding told to a person (webhook, chat, e-mail, a command): the watchdog's feed and a probe alone
    ["probe", "watchdog"],  # in the training process / around it: they meet only through the store
    ["__init__"],  # the public face: trainguard.watch()
    ["preflight"],  # runs the script under the watchdog with the probe fast-forwarding
    ["catalog"],  # every rule's declaration, imported from where it is found
    ["report", "sinks"],  # what a finished or live run is shown as
    ["integrations", "recipes", "demo"],  # trainguard used by others: Lightning, HF, our own recipes
    ["cli"],  # the commands
    ["__main__"],
]
# Upward imports kept on purpose, and why
UPWARD_ALLOWED: dict[tuple[str, str], str] = {
    ("probe", "__init__"): "the package's version, a constant the face defines (importing any module runs it)",
    ("watchdog", "__init__"): "the package's version, a constant the face defines (importing any module runs it)",
}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, src: Path = SRC) -> list[tuple[str, int]]:
    """Modules of trainguard this file imports, anywhere in it (top level or inside a function)."""
    rel = path.relative_to(src.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base == "trainguard":  # `from trainguard import untrusted` names a module, not the face
                for alias in node.names:
                    sub = src / alias.name
                    out.append((f"trainguard.{alias.name}" if sub.is_dir() or sub.with_suffix(".py").is_file()
                                else "trainguard", node.lineno))
            else:
                out.append((base, node.lineno))
    return [(m, line) for m, line in out if m == "trainguard" or m.startswith("trainguard.")]


def upward_imports(src: Path = SRC) -> list[str]:
    layer = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).with_suffix("")
        me = _room(".".join(rel.parts))
        for module, line in _imports(path, src):
            other = _room(module)
            if other == me or (me, other) in UPWARD_ALLOWED:
                continue
            if me not in layer or other not in layer:
                found.append(f"{path.relative_to(src)}:{line} {module}: room {me if me not in layer else other} has no layer")
            elif layer[other] >= layer[me]:
                found.append(f"{path.relative_to(src)}:{line} imports {module} ({me} -> {other})")
    return found


def test_imports_point_down_the_layers() -> None:
    found = upward_imports()
    assert not found, "\n".join(found)


def test_the_layer_check_sees_a_lazy_upward_import(tmp_path: Path) -> None:
    # the check itself can fail: a rule that reaches up into the watchdog inside a function is caught
    (tmp_path / "trainguard" / "rules").mkdir(parents=True)
    (tmp_path / "trainguard" / "rules" / "late.py").write_text(
        "from trainguard.findings import Finding\n\ndef f():\n    from trainguard.watchdog import stall\n")
    (tmp_path / "trainguard" / "rules" / "rel.py").write_text("from ..report import build\n")
    found = upward_imports(tmp_path / "trainguard")
    assert found == ["rules/late.py:4 imports trainguard.watchdog (rules -> watchdog)",
                     "rules/rel.py:1 imports trainguard.report (rules -> report)"], found
