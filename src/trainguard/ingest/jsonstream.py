"""One JSON object read key by key, with one of its lists read item by item: bounded memory.

A Hugging Face `trainer_state.json` is one object whose `log_history` list holds every log call of the
run (a long run's file passes 100 MB; `json.load` held 775 MB for a 139 MB one). `members(path, key)`
yields the object's other members whole, and the list's items one at a time, each decoded by the
standard library's `JSONDecoder.raw_decode` from a window of the file; the window never holds more than a
block and the item being decoded.

    for name, value in members(path, "log_history"):   # ("max_steps", 1000) ... ("log_history[]", {...})

Malformed JSON raises ValueError (a `json.JSONDecodeError` with its position where json gives one),
never a RecursionError.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 1 << 20
MAX_VALUE = 64 << 20  # characters one member or item may span: a larger one is no log record
ITEM = "[]"  # suffix of the name an item of the streamed list is yielded under
_WS = re.compile(r"[ \t\r\n]*")
_DECODER = json.JSONDecoder()


class _Window:
    """Decoded text of the file from `pos` on, refilled a block at a time."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.offset = 0  # characters dropped from the front of buf so far (for error positions)

    def more(self) -> bool:
        if self.eof:
            return False
        block = self.f.read(BLOCK)
        if self.pos > BLOCK:  # drop what was consumed
            self.offset += self.pos
            self.buf, self.pos = self.buf[self.pos:], 0
        if not block:
            self.eof = True
            self.buf += self.dec.decode(b"", final=True)
            return True
        self.buf += self.dec.decode(block)
        return True

    def peek(self) -> str:
        """The next non-blank character ("" at the end of the file), not consumed."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]  # `*` always matches
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def expect(self, chars: str) -> str:
        ch = self.peek()
        if not ch or ch not in chars:
            raise self.error(f"expected one of {chars!r}")
        self.pos += 1
        return ch

    def value(self) -> Any:
        """The next JSON value, decoded whole."""
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if len(self.buf) - self.pos > MAX_VALUE:
                    raise ValueError(f"one value longer than {MAX_VALUE >> 20} MiB") from None
                if self.more():
                    continue  # the value runs past the window: read on
                raise self.error("malformed or truncated value") from None
            except RecursionError:
                raise ValueError("nested deeper than can be read") from None
            if end >= len(self.buf) and not self.eof and self.more():
                continue  # a number may go on in the next block
            self.pos = end
            return obj

    def error(self, msg: str) -> json.JSONDecodeError:
        return json.JSONDecodeError(msg, self.buf, self.pos)


def members(path: Path, stream: str) -> Iterator[tuple[str, Any]]:
    """(name, value) for each member of the top-level object; the items of list `stream` one by one, as
    (`stream` + "[]", item); a `stream` that is not a list is yielded whole."""
    with open(path, "rb") as f:
        w = _Window(f)
        w.expect("{")
        if w.peek() == "}":
            return
        while True:
            name = w.value()
            if not isinstance(name, str):
                raise w.error("expected a member name")
            w.expect(":")
            if name == stream and w.peek() == "[":
                w.pos += 1
                if w.peek() == "]":
                    w.pos += 1
                else:
                    while True:
                        yield name + ITEM, w.value()
                        if w.expect(",]") == "]":
                            break
            else:
                yield name, w.value()
            if w.expect(",}") == "}":
                return
