"""A log's bytes as UTF-8, whatever Unicode encoding its writer used.

Windows PowerShell 5's `>`, `Out-File` and `Tee-Object` write UTF-16LE with a byte-order mark (`FF FE`), every
ASCII character followed by a NUL byte: read as bytes, such a log looks binary and its lines do not split on
`\\n`. A log that starts with a UTF-16 (or UTF-32) mark is decoded by it and handed on re-encoded as UTF-8,
so the readers that split lines on bytes read it as any other log. Every other file passes through as is.
"""

from __future__ import annotations

import codecs
import io
from pathlib import Path
from typing import BinaryIO

# the marks a writer puts first; UTF-32's before UTF-16's, whose LE mark is UTF-32 LE's first two bytes
_MARKS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
          (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def wide_encoding(head: bytes) -> str | None:
    """The codec a byte-order mark at the start of `head` names (`utf-16-le`: the mark itself then decodes to
    U+FEFF), for UTF-16 and UTF-32; None for anything else."""
    for mark, name in _MARKS:
        if head.startswith(mark):
            return name
    return None


class _AsUtf8:
    """`read(n)` over a wide-encoded file: about n bytes of its text, as UTF-8."""

    def __init__(self, raw: BinaryIO, encoding: str) -> None:
        self.text = io.TextIOWrapper(raw, encoding=encoding, errors="replace", newline="")
        if self.text.read(1) != "\ufeff":  # (the mark is no character of the log's text)
            self.text.seek(0)
        self.pending = b""

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            out, self.pending = self.pending + self.text.read().encode("utf-8"), b""
            return out
        while len(self.pending) < n:
            chunk = self.text.read(max(1, n // 2))
            if not chunk:
                break
            self.pending += chunk.encode("utf-8")
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def close(self) -> None:
        self.text.close()

    def __enter__(self) -> _AsUtf8:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def unit(encoding: str) -> int:
    """The bytes of one code unit of a wide encoding: a tail read from any offset is cut to a multiple of it."""
    return 4 if encoding.startswith("utf-32") else 2


def open_utf8(path: Path) -> BinaryIO | _AsUtf8:
    """The file opened for `read(n)` of bytes: as it is, or re-encoded as UTF-8 when a UTF-16/32 mark starts it."""
    raw = open(path, "rb")  # noqa: SIM115 (the caller's `with` closes it)
    encoding = wide_encoding(raw.read(4))
    raw.seek(0)
    return raw if encoding is None else _AsUtf8(raw, encoding)
