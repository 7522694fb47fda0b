"""Reading what trainguard did not write: files a user points it at, and text that reaches a terminal.

Every reader goes through these few guards, so a hostile or damaged input is one line and exit 2, never
a traceback, a hang or a memory blow-up:
- `regular_file` refuses a FIFO, a device or a socket where a file is expected (reading a FIFO that no
  one writes never returns);
- `load_json` turns nesting too deep for Python and integers too long to convert into a ValueError
  that reads well, like any other malformed JSON;
- `load_yaml` is PyYAML's safe loader with a cap on what aliases expand to (a 772-byte YAML of nested
  aliases stands for 9^9 values) and a refusal of recursive aliases;
- `printable` neutralises control characters (terminal escape sequences, bells, backspaces, carriage
  returns) in text that trainguard prints: an exception message or a phase name must not drive the
  terminal of the person reading it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from trainguard.errors import UserError

MAX_YAML_VALUES = 1_000_000  # values a config may stand for once its aliases are expanded
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """`path` when it is a regular file (or a link to one); UserError otherwise, in one line."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise UserError(f"{p}: no such {what}") from None
    except OSError as exc:
        raise UserError(f"cannot read {p}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        raise UserError(f"{p} is {kind}, not a regular {what}: trainguard reads only regular files")
    return p


def load_json(text: str | bytes) -> Any:
    """json.loads, with the two ways valid-looking JSON breaks Python turned into a plain ValueError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested deeper than can be read") from None
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise
        # int('9' * 5000) inside the decoder: "Exceeds the limit (4300 digits) for integer string conversion"
        raise ValueError(f"a number too long to read ({str(exc).split(':')[0]})") from None


def json_problem(exc: ValueError) -> str:
    """What went wrong, from any ValueError json raised (a JSONDecodeError has a position, others do not)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
    return str(exc)


def load_yaml(text: str) -> Any:
    """yaml.safe_load with aliases capped (MAX_YAML_VALUES once expanded) and recursion refused.

    Raises yaml.YAMLError for malformed YAML and ValueError for what it refuses.
    """
    import yaml

    _flow_depth_ok(text)
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise ValueError("nested deeper than can be read") from None
    _expanded_size(data)
    return data


MAX_FLOW_DEPTH = 500  # brackets open at once; PyYAML's scanner slows down quadratically with this depth


def _flow_depth_ok(text: str) -> None:
    """Refuses `[[[[...` thousands deep before PyYAML spends seconds scanning it (counts brackets in quoted
    text too: a config with hundreds of brackets open inside a string is no config)."""
    if text.count("[") + text.count("{") <= MAX_FLOW_DEPTH:
        return
    depth = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > MAX_FLOW_DEPTH:
                raise ValueError("nested deeper than can be read")
        elif ch in "]}" and depth:
            depth -= 1


def _expanded_size(data: Any) -> int:
    """How many values `data` stands for with every shared (aliased) part counted each time it appears.

    Computed over distinct objects only (memoised by identity), so a billion-value alias bomb costs as
    much as its few hundred bytes; a cycle (an alias inside its own anchor) is refused."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    # iterative post-order walk: a deep document must not exhaust Python's stack here either
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        obj, done = stack.pop()
        if not isinstance(obj, (dict, list)):
            continue
        key = id(obj)
        children = list(obj.keys()) + list(obj.values()) if isinstance(obj, dict) else obj
        if done:
            open_.discard(key)
            total = 1 + sum(sizes.get(id(c), 1) if isinstance(c, (dict, list)) else 1 for c in children)
            if total > MAX_YAML_VALUES:
                raise ValueError(f"its aliases expand to more than {MAX_YAML_VALUES:,} values (an alias bomb?)")
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in open_:
            raise ValueError("an alias refers to the value that contains it (recursive YAML)")
        open_.add(key)
        stack.append((obj, True))
        for c in children:
            if isinstance(c, (dict, list)):
                if id(c) in open_:
                    raise ValueError("an alias refers to the value that contains it (recursive YAML)")
                stack.append((c, False))
    return sizes.get(id(data), 1)


def printable(text: Any) -> str:
    """`text` with control characters shown as escapes (\\x1b, \\r, \\u202e), newlines and tabs kept."""
    s = str(text)
    if not _CONTROL.search(s):
        return s
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), s)
