"""Rendering a page in headless Chromium (Debian's `chromium`) the way a person would open it.

`render(path)` loads the file twice, once to dump the DOM after load and once for a screenshot, with
console logging on; it returns the DOM, every console message the page produced (script output, CSP
violations, failed loads) and the screenshot's path. A fresh profile per call, nothing from the network.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"  # gitignored; CI can keep it
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--hide-scrollbars"]
_CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (?P<msg>.*)$")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Rendered:
    dom: str
    console: list[str]
    screenshot: Path | None


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="tg-chromium-") as profile:
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout)


def render(page: Path, screenshot: Path | None = None, size: tuple[int, int] = (1100, 2600),
           timeout: float = 90) -> Rendered:
    url = page.resolve().as_uri()
    dumped = _run(["--dump-dom", url], timeout)
    console = [m["msg"] for line in dumped.stderr.splitlines() if (m := _CONSOLE.search(line))]
    shot = None
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        taken = _run([f"--window-size={size[0]},{size[1]}", f"--screenshot={screenshot}", url], timeout)
        console += [m["msg"] for line in taken.stderr.splitlines() if (m := _CONSOLE.search(line))]
        shot = screenshot if screenshot.is_file() else None
    return Rendered(dumped.stdout, console, shot)
