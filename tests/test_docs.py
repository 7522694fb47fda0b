"""The docs: the README fits a screen or three, the MkDocs site builds with --strict (a broken link or a
nav entry without its page fails), and every excerpt of real output in README.md and docs/ is what its
command prints today (docs/generate.py --check), the exit-code table included.

    PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist -q tests/test_docs.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tgtest import ROOT

pytestmark = pytest.mark.process


def test_the_readme_fits_in_200_lines_and_says_what_a_newcomer_needs_first() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for needed in ("./dev demo", "./dev test", "about 40 minutes on 2 cores", 'pip install -e "/path/to/trainguard[torch]"',
                   "*Sees:*", "*Cannot see:*", "60 s", "exits 122"):
        assert needed in text, needed
    assert text.index("pip install -e") < text.index('pip install "trainguard[torch]"')  # a checkout first
    # the Quick start itself shows the exit code that tells, and how to get the command's own back
    quick = text[text.index("## Quick start"):text.index("\n## ", text.index("## Quick start") + 1)]
    for needed in ("exits 122", "--fail-on never", "echo $?"):
        assert needed in quick, needed
    script = re.search(r"trainguard run -- \.venv/bin/python (\S+); echo \$\?", quick)
    assert script and (ROOT / script.group(1)).is_file(), quick  # a script of this checkout, as written
    assert "exit_code: 122" in (ROOT / script.group(1)).with_name("expect.yaml").read_text()  # the zoo runs it


def test_the_generated_excerpts_are_what_the_commands_print() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    from trainguard.exitcodes import markdown_table

    assert markdown_table() in (ROOT / "docs" / "exit-codes.md").read_text()


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "notify" / "index.html").is_file()
    assert "122" in (tmp_path / "site" / "exit-codes" / "index.html").read_text()
