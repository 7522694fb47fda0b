"""Regenerates the excerpts of real output in README.md and docs/*.md from the commands that print them.

    python docs/generate.py           # rewrite every generated block
    python docs/generate.py --check   # exit 1 and name the blocks that drifted (tests/test_docs.py runs it)

A block is written between two markers; what is inside is the command's output, never typed by hand:

    <!-- generated: trainguard rules TG301 -->            (a fenced text block of its stdout)
    <!-- generated lines=3: trainguard diagnose PATH -->  (its first 3 lines only)
    <!-- generated raw: python -m trainguard.exitcodes --> (its stdout as Markdown, e.g. a table)
    ...
    <!-- /generated -->

`trainguard` and `python` run this interpreter's trainguard and Python, from the repository root, with a
fixed terminal width so that help text wraps the same everywhere.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- generated(?P<opts>[^:]*): (?P<cmd>.+?) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)


def files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def output(cmd: str, opts: str) -> str:
    argv = shlex.split(cmd)
    if argv[0] == "trainguard":
        # as the installed `trainguard` script, so that help text names it so
        argv = [sys.executable, "-c", "from trainguard.cli import main; main(prog_name='trainguard')", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("TRAINGUARD_RUN_DIR", None)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    text = done.stdout.replace(str(ROOT) + os.sep, "")
    lines = [line.rstrip() for line in text.splitlines()]
    limit = re.search(r"lines=(\d+)", opts)
    if limit:
        lines = lines[: int(limit.group(1))]
    if "raw" in opts:
        return "\n".join(lines) + "\n"
    return "```text\n" + "\n".join(lines) + "\n```\n"


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + output(m.group("cmd"), m.group("opts")) + m.group(5), text)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    drifted = []
    for path in files():
        old = path.read_text()
        new = regenerate(old)
        if new != old:
            drifted.append(str(path.relative_to(ROOT)))
            if not check:
                path.write_text(new)
    if check and drifted:
        print(f"generated output drifted in {', '.join(drifted)}: run python docs/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
