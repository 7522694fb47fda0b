"""KD at student positions that end inside a teacher token (loss.kd.partial), by conditioning on the bytes read.

A student position whose context ends at byte E inside a teacher token has no teacher position with the
same context (`tokenize_align` leaves it out: 28% of positions in benchmarks/distill_quality.py). The
teacher still knows its next bytes: at the last teacher boundary before E (position q0, at byte a) it
gives a distribution over whole teacher tokens; the student has also read c = text[a:E]. Conditioned on
c, only teacher ids whose text starts with c and is longer than c remain; each then says the text
continues with its remainder r (its bytes after c), so the student reads next the longest student token
r starts with -- unless some student token longer than r starts with r and c + that token is no teacher
token (the teacher's id would not rule it out: ambiguous). Ambiguous ids, and the id whose text is c
itself (its continuation is the next teacher step's business), go to the tail. The result has the
`kd.TeacherTargets` form, so the same sparse KD and fused head distil it.

Which teacher ids survive and where they go depends only on c, so it is resolved once per distinct c
while the data is prepared (`PartialMapper`); at training time it costs one gather of the teacher's
log-probs at q0.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class PartialMapper:
    teacher_bytes: list[bytes | None]
    student_bytes: list[bytes | None]
    max_ids: int = 256  # consistent teacher ids kept per prefix (longest-first would need probabilities)
    _cache: dict[bytes, tuple[list[int], list[int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.t_sorted = sorted((b, i) for i, b in enumerate(self.teacher_bytes) if b)
        self.t_keys = [b for b, _ in self.t_sorted]
        self.t_set = set(self.t_keys)
        self.s_ids: dict[bytes, int] = {}
        for i, b in enumerate(self.student_bytes):
            if b and b not in self.s_ids:
                self.s_ids[b] = i
        self.s_sorted = sorted(self.s_ids)

    def _student_of(self, c: bytes, r: bytes) -> int:
        lo = bisect.bisect_left(self.s_sorted, r)
        for x in self.s_sorted[lo:]:
            if not x.startswith(r):
                break
            if x != r and c + x not in self.t_set:
                return -1  # the student could read past r where the teacher's id does not say
        for n in range(len(r), 0, -1):
            sid = self.s_ids.get(r[:n])
            if sid is not None:
                return sid
        return -1

    def resolve(self, c: bytes) -> tuple[list[int], list[int]]:
        """(teacher ids whose text starts with c, the student id each means next or -1 for the tail)."""
        hit = self._cache.get(c)
        if hit is not None:
            return hit
        lo = bisect.bisect_left(self.t_keys, c)
        t_ids, s_ids = [], []
        for b, tid in self.t_sorted[lo:]:
            if not b.startswith(c):
                break
            t_ids.append(tid)
            s_ids.append(-1 if b == c else self._student_of(c, b[len(c):]))
            if len(t_ids) >= self.max_ids:
                break
        self._cache[c] = (t_ids, s_ids)
        return t_ids, s_ids


def partial_positions(student_ends: list[int], teacher_ends: list[int], aligned: set[int],
                      text: bytes) -> list[tuple[int, int, bytes]]:
    """(student position p, teacher position q0, bytes c read since q0) for unaligned positions with a target."""
    out = []
    for p in range(1, len(student_ends) - 1):
        if p in aligned:
            continue
        e = student_ends[p]
        q0 = bisect.bisect_left(teacher_ends, e) - 1  # the last teacher boundary before e
        out.append((p, q0, text[teacher_ends[q0]:e]))
    return out
