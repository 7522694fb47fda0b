"""The phases a run is in ("train", "eval", "save"...), as `guard.phase(name)` marks them.

A stack, because phases nest (an evaluation inside training); `seen` counts each name's entries; the
phase an exception left is remembered, because a `with guard.phase(...)` block is already left when the
crash hook runs.
"""

from __future__ import annotations


class Phases:
    def __init__(self) -> None:
        self.stack: list[str] = []
        self.seen: dict[str, int] = {}
        self._raised: tuple[BaseException, list[str]] | None = None  # an exception and the phases it left

    @property
    def current(self) -> str | None:
        return self.stack[-1] if self.stack else None

    def begin(self, name: str) -> int:
        """Enters `name`; returns how many times it was entered so far (this one included)."""
        self.stack.append(name)
        self.seen[name] = self.seen.get(name, 0) + 1
        return self.seen[name]

    def end(self, name: str) -> None:
        if self.stack and self.stack[-1] == name:
            self.stack.pop()

    def left_by(self, exc: BaseException) -> None:
        """`exc` is leaving the innermost phase: remember where it was raised (the first phase it leaves)."""
        if self._raised is None or self._raised[0] is not exc:
            self._raised = (exc, list(self.stack))

    def at(self, exc: BaseException) -> list[str]:
        """The phases `exc` was raised in (those open now, if it left none)."""
        if self._raised is not None and self._raised[0] is exc:
            return self._raised[1]
        return list(self.stack)
