"""Which printed lines show the run moving, and which only show it failing or dying.

    lines = ProgressLines()
    lines.feed("step 12 loss 0.41")                         # True: progress
    lines.feed("Traceback (most recent call last):")        # False, and so is the rest of the traceback

A line printed by a script without the probe is a sign that it works, and the stall detector counts it
(watchdog/stall.py). Not every line: when a stalled run is interrupted, or one of its processes fails, the
processes print while they die (tracebacks, `KeyboardInterrupt`, torchrun's "Sending process 32371 closing
signal SIGTERM" and its failure summary, gloo's "terminate called after throwing ..."). Counted as progress,
that output ended the stall of a new user's collective mismatch as "progress resumed: slow, not hung" the
moment they pressed Ctrl-C. Warnings are not progress either: a library that warns from a thread of its own
says nothing about the training loop.

What is left out, line by line: a failure signature of the one catalogue (rules/signatures.py: a CUDA error
printed by C++, `Segmentation fault`, the OOM killer, a scheduler's cancellation), a Python traceback from
its header to its exception line (chained ones too), Python's `warnings` lines (`file.py:12: UserWarning: ...` and the source line under it), glog-style lines
of level W, E or F (torch.distributed's launcher and c10d log this way, bracketed or not), a C++ abort
(`terminate called`, `what():`) or exception trace (`Exception raised from ...`, `frame #4: ...`), and torchrun's failure summary. Torch's `[rank1]:` prefix is read through. Output that comes
after a signal was sent is never progress whatever it says: the supervisor stops counting it (see
`Supervisor._observe`).
"""

from __future__ import annotations

import re

from trainguard.rules.signatures import match_line

# torch prefixes each line of a rank's output (`[rank1]: ...`), torchrun's --tee `[default1]: ...`
_RANK_PREFIX = re.compile(r"^\[(?:rank|default|trainer|worker)\d+\]:\s?")
# glog: `W1126 16:35:32.062000 32339 torch/distributed/...] text` (the level, then MMDD and the time)
# and c10d's C++ form `[W1126 19:11:23.692403231 socket.cpp:494] [c10d] ...` (a store's socket timing out)
_GLOG_NOT_INFO = re.compile(r"^(?:[WEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ |\[[WEF]\d{4} \d\d:\d\d:\d\d\.\d+ \S+:\d+\])")
# Python's warnings module: `path/file.py:12: UserWarning: text`
_PY_WARNING = re.compile(r"^\S.*:\d+: [A-Z]\w*Warning: ")
_PY_WARNING_SOURCE = re.compile(r"^\s+warnings\.warn\(")
# the exception line that ends a traceback (the same shape `rules.crash` reads)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Fault|[A-Z]\w*)(?::|$)")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_DYING = re.compile(
    r"^(?:terminate called after throwing|\s+what\(\):|Aborted \(core dumped\)|Segmentation fault"
    r"|Killed$|Terminated$|Fatal Python error:|Exception raised from \S+ at |frame #\d+: |<omitting python frames>)"
    r"|Sending process \d+ closing signal|Received \d+ death signal|got signal: ?\d+")
# torchrun's summary of the failure: a rule of `=` or `-`, the script "FAILED", the failures and their fields
_SUMMARY = re.compile(r"^(?:={10,}|-{10,}|\S+ FAILED$|Failures:$|<NO_OTHER_FAILURES>$|Root Cause \(first observed"
                      r"|\[\d+\]:$|\s+(?:time|host|rank|exitcode|error_file|traceback)\s*:)")


class ProgressLines:
    """One stream's lines, read in order: `feed` says whether a line shows the run moving."""

    def __init__(self) -> None:
        self._in_traceback = False

    def feed(self, line: str) -> bool:
        text = _RANK_PREFIX.sub("", line.rstrip("\n"), count=1)
        stripped = text.strip()
        if not stripped:
            return False
        if self._in_traceback:
            # inside a traceback every line is indented but the exception line, which ends it; any other
            # unindented line ends it too (never stuck deaf on a traceback whose end looks unusual)
            if text[:1].isspace():
                return False
            self._in_traceback = False
            if _EXCEPTION_LINE.match(stripped):
                return False
        if stripped.startswith("Traceback (most recent call last)"):
            self._in_traceback = True
            return False
        return not (stripped.startswith(_CHAINED) or _GLOG_NOT_INFO.match(text) or _PY_WARNING.match(text)
                    or _PY_WARNING_SOURCE.match(text) or _DYING.search(text) or _SUMMARY.match(text)
                    or _exception_alone(stripped) or match_line(stripped) is not None)

    def peek(self, line: str) -> bool:
        """Whether an unfinished line (a progress bar being drawn) shows progress, without moving the state."""
        saved = self._in_traceback
        moving = self.feed(line)
        self._in_traceback = saved
        return moving


def _exception_alone(line: str) -> bool:
    """`KeyboardInterrupt`, `ValueError: bad batch` outside a traceback (a launcher quotes it): not progress."""
    head = line.split(":", 1)[0]
    return bool(_EXCEPTION_LINE.match(line)) and head.endswith(("Error", "Exception", "Interrupt", "Exit", "Warning"))
