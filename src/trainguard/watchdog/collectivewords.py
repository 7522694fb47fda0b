"""How a collective hang across ranks is said: each rank's position in words ("rank 1 waits in broadcast
#36 while rank 0 is in all_reduce #36"), for the counters' view and the flight recorder's (the judging is
watchdog/collectives.py's).
"""

from __future__ import annotations

from typing import Any

from trainguard.contract import DEFAULT_GROUP


def window_kind(w: dict[str, Any]) -> str:
    try:
        shown = ",".join("x".join(str(n) for n in s) for s in w.get("sizes") or [])
    except TypeError:
        shown = ""
    return f"{w.get('op')} [{shown}]"  # as probe/flightrec.kind_of writes the window's kinds


def flight_label(w: dict[str, Any]) -> str:
    g = "" if w.get("group") == DEFAULT_GROUP else f" of group {w.get('group')}"
    number = f"{w.get('op')} #{w.get('seq')}{g}"
    at = f" at {w['where']}" if w.get("where") else ""
    on = " on the device" if w.get("device") else ""
    if w.get("from") == "backward":
        what = "DDP's gradient all-reduce" if w.get("op") == "all_reduce" else f"a {w.get('op')} of the backward"
        whose = f"step {w['step']}'s backward" if isinstance(w.get("step"), int) else "backward"
        return f"{what} ({number}{on}, in {whose}{at})"
    if w.get("device") and not w.get("where"):
        # issued without a Python stack: from C++, as DDP's Reducer issues its gradient buckets on a GPU
        # (autograd runs a CUDA backward on a thread of its own; no step is named: the host ran on past it)
        return f"{number} on the device, issued from C++ (DDP's gradient all-reduce, or the like)"
    return number + at + on


def flight_sentence(ranks: list[int], waits: dict[int, dict[str, Any] | None], outside: list[int],
                     blame: list[int], missing: dict[int, list[int]], behind: dict[int, list[int]],
                     flight: dict[int, dict[str, Any]]) -> str:
    by_key: dict[tuple, list[int]] = {}
    for r in ranks:
        w = waits[r]
        if w:
            by_key.setdefault((w["group"], int(w["seq"]), w.get("op"), w.get("from")), []).append(r)
    first = set(blame)
    ordered = sorted(by_key.values(), key=lambda rs: (not (set(rs) & first), rs))
    parts = []
    for rs in ordered:
        w = waits[rs[0]]
        assert w is not None
        clause = f"{rank_list(rs)} {'wait' if len(rs) > 1 else 'waits'} in {flight_label(w)}"
        lost = sorted({x for r in rs for x in missing.get(r, [])})
        if lost:
            never = all(not ((flight[x].get("kinds") or {}).get(w["group"]) or {}).get(window_kind(w)) for x in lost)
            verb = "never called" if never else ("has not reached" if len(lost) == 1 else "have not reached")
            clause += f", which {rank_list(lost)} {verb}"
        parts.append(clause)
    text = "; ".join(parts)
    if outside:
        reach = sorted({x for r in behind for x in behind[r]} & set(outside))
        yet = " yet (behind: slow, or stuck where its stack shows)" if reach else ""
        text = f"{rank_list(outside)} {'are' if len(outside) > 1 else 'is'} in no collective{yet} while " + text
    return text


def sentence(groups: dict[tuple[str, int], list[int]], outside: list[int], blame: list[int],
              positions: dict[int, dict[str, Any]]) -> str:
    if outside:
        last = positions.get(outside[0]) or {}
        was = f" (its last: {position_label((last['op'], last['seq']))}, finished)" if last.get("seq") else ""
        others = "; ".join(f"{rank_list(rs)} {'wait' if len(rs) > 1 else 'waits'} in {position_label(k)}"
                           for k, rs in sorted(groups.items(), key=lambda kv: kv[1]))
        return f"{rank_list(outside)} {'are' if len(outside) > 1 else 'is'} in no collective{was} while {others}"
    if len(groups) == 1:
        (k, rs), = groups.items()
        return f"{rank_list(rs)} all wait in the same collective, {position_label(k)}"
    first = tuple(blame) if blame else None
    ordered = sorted(groups.items(), key=lambda kv: (tuple(kv[1]) != first, kv[1]))
    (k0, r0), rest = ordered[0], ordered[1:]
    same_op = all(k[0] == k0[0] for k, _ in rest)
    tail = ", ".join(f"{rank_list(rs)} {'are' if len(rs) > 1 else 'is'} in {position_label(k, with_op=not same_op)}"
                     for k, rs in rest)
    return f"{rank_list(r0)} {'wait' if len(r0) > 1 else 'waits'} in {position_label(k0)} while {tail}"


def position_label(pos: tuple[str, int], with_op: bool = True) -> str:
    op, seq = pos
    number = f"#{seq}" if seq >= 0 else "(not counted)"
    return f"{op} {number}" if with_op else number


def list_positions(groups: dict[tuple[str, int], list[int]]) -> str:
    return "; ".join(f"{rank_list(rs)}: {position_label(k)}" for k, rs in sorted(groups.items(), key=lambda kv: kv[1]))


def rank_list(rs: list[int]) -> str:
    rs = sorted(rs)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"ranks {rs[0]}\u2013{rs[-1]}"
    return "ranks " + ", ".join(str(r) for r in rs)
