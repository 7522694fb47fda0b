"""A collective hang across ranks: where each rank is in the sequence of collectives, and which rank to blame.

    positions = read_positions(run_dir)          # {rank: {"op": "all_reduce", "seq": 1042, "inside": True, ...}}
    refine(diagnosis, snapshot, positions)       # the `collective` diagnosis now names positions and blame

The stacks say *which* collective each rank waits in; the probe's counters (probe/collectives.py, copied to
the store as `meta` `collectives.<rank>`) say *which one of them*. Together:

    rank 1 waits in broadcast #36 while rank 0 is in all_reduce #36
    rank 3 waits in all_reduce #1042 while ranks 0-2 are in #1043
    rank 2 is in no collective (its last: all_reduce #17, finished) while ranks 0, 1 wait in all_reduce #18

The rank to blame, in this order: a rank outside every collective while others wait (it never arrived:
its stack shows where it is instead); the smaller group of ranks sharing one position; between groups
of the same size, the one in a collective the others never called in that group (rank 1's first
broadcast against rank 0's 36th all-reduce), else the one behind (the lower number). Ranks that all sit in
the same collective name nobody: they wait for something outside the job (a dead peer, the network).

Proof for the stop policy (watchdog/stop.py): every rank waits inside a collective and they are not all
at the same one. None of them can complete, whatever the timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

META_PREFIX = "collectives."


def read_positions(run_dir: str | Path) -> dict[int, dict[str, Any]]:
    """Each rank's latest collective as the probe recorded it; {} without a store or without counters.

    A node's part of a run over nodes (RUN/node-<N>/, store/nodes.py) reads every node's ranks from the
    shared run folder: the hang on this node is compared with the ranks of the others."""
    try:
        from trainguard.store.nodes import node_dirs, node_of
        from trainguard.store.reader import RunReader

        base = Path(run_dir)
        if base.name == f"node-{node_of(base)}" and len(node_dirs(base.parent)) > 1:
            base = base.parent
        reader = RunReader(base)
        try:
            meta = reader.meta()
        finally:
            reader.close()
    except Exception:
        return {}  # no store (yet), or unreadable: the stacks alone still name the collectives
    out: dict[int, dict[str, Any]] = {}
    for key, value in meta.items():
        if key.startswith(META_PREFIX) and isinstance(value, dict) and value.get("seq") is not None:
            try:
                out[int(key[len(META_PREFIX):])] = value
            except ValueError:
                continue
    return out


def judge(positions: dict[int, dict[str, Any]], in_stack: dict[int, str | None]) -> dict[str, Any] | None:
    """Compare the ranks' positions. `in_stack`: rank -> the collective its stack waits in (None: none).

    Returns {"sentence", "blame" (a rank or None), "unrecoverable" (why, or None), "positions"} or None when
    there is nothing to compare (no counters)."""
    ranks = sorted(set(positions) | set(in_stack))
    if not positions or len(ranks) < 2:
        return None
    where: dict[int, tuple[str, int] | None] = {}
    for r in ranks:
        pos = positions.get(r)
        stack_op = in_stack.get(r, "?")
        inside = bool(pos and pos.get("inside")) if stack_op == "?" else stack_op is not None
        if inside and pos and pos.get("inside"):
            where[r] = (str(pos.get("op")), int(pos["seq"]))
        elif inside:
            where[r] = (str(stack_op), -1)  # in a collective the counters did not see (no probe on that rank)
        else:
            where[r] = None
    waiting = {r: w for r, w in where.items() if w is not None}
    outside = [r for r, w in where.items() if w is None]
    if not waiting:
        return None
    groups: dict[tuple[str, int], list[int]] = {}
    for r, w in waiting.items():
        groups.setdefault(w, []).append(r)
    blame: list[int] = []
    if outside:
        blame = outside
    elif len(groups) > 1:
        blame = _odd_group(groups, positions)
    sentence = _sentence(groups, outside, blame, positions)
    unrecoverable = None
    if not outside and len(groups) > 1:
        unrecoverable = f"the ranks wait in different collectives ({_list_positions(groups)}): none can complete"
    return {"sentence": sentence, "blame": blame[0] if len(blame) == 1 else None, "blamed": blame,
            "unrecoverable": unrecoverable,
            "positions": {str(r): _label(w) if w else "in no collective" for r, w in where.items()}}


def refine(diagnosis: Any, snap: Any, positions: dict[int, dict[str, Any]]) -> None:
    """Rewrite a `collective` diagnosis with the ranks' positions, the rank to blame and its stack."""
    from trainguard.watchdog import classify

    last = snap.samples[-1] if snap.samples else {}
    by_rank = {}
    for p in last.values():
        try:
            if p.rank is not None and not p.is_dataloader_worker and p.threads:
                by_rank[int(p.rank)] = p
        except ValueError:
            continue
    in_stack = {r: classify._collective_op(p.main_thread) if classify._in(p.main_thread, classify._COLLECTIVE_FILES)
                else None for r, p in by_rank.items()}
    verdict = judge(positions, in_stack)
    if verdict is None:
        return
    blamed = f" (rank {verdict['blame']} is out of step: its stack is shown)" if verdict["blame"] is not None else ""
    diagnosis.detail = verdict["sentence"] + blamed + "; " + diagnosis.detail
    diagnosis.extra["collective_positions"] = verdict["positions"]
    if verdict["unrecoverable"]:
        diagnosis.extra["unrecoverable"] = verdict["unrecoverable"]
    if verdict["blame"] is not None:
        diagnosis.extra["blamed_rank"] = verdict["blame"]
        proc = by_rank.get(verdict["blame"])
        if proc is not None and proc.main_thread is not None:
            frame = classify._innermost_user(proc.main_thread)
            diagnosis.where = classify._where(frame) or diagnosis.where
            diagnosis.frames = classify._frames(proc.main_thread)
            diagnosis.pid = proc.pid


def _odd_group(groups: dict[tuple[str, int], list[int]], positions: dict[int, dict[str, Any]]) -> list[int]:
    sizes = sorted(len(v) for v in groups.values())
    if sizes[0] < sizes[1]:
        return min(groups.values(), key=len)
    smallest = [k for k, v in groups.items() if len(v) == sizes[0]]
    # between equal groups: the one in a collective the others never called in that group
    novel = [k for k in smallest if all(_calls(positions, r, k[0]) == 0 for g, rs in groups.items() if g != k
                                         for r in rs)]
    if len(novel) == 1:
        return groups[novel[0]]
    seqs = sorted({k[1] for k in smallest})
    if len(seqs) > 1:
        return groups[min(smallest, key=lambda k: k[1])]  # the one behind
    return []


def _calls(positions: dict[int, dict[str, Any]], rank: int, op: str) -> int:
    ops = (positions.get(rank) or {}).get("ops") or {}
    return int(ops.get(op, 0) or 0)


def _sentence(groups: dict[tuple[str, int], list[int]], outside: list[int], blame: list[int],
              positions: dict[int, dict[str, Any]]) -> str:
    if outside:
        last = positions.get(outside[0]) or {}
        was = f" (its last: {_label((last['op'], last['seq']))}, finished)" if last.get("seq") else ""
        others = "; ".join(f"{_ranks(rs)} {'wait' if len(rs) > 1 else 'waits'} in {_label(k)}"
                           for k, rs in sorted(groups.items(), key=lambda kv: kv[1]))
        return f"{_ranks(outside)} {'are' if len(outside) > 1 else 'is'} in no collective{was} while {others}"
    if len(groups) == 1:
        (k, rs), = groups.items()
        return f"{_ranks(rs)} all wait in the same collective, {_label(k)}"
    first = tuple(blame) if blame else None
    ordered = sorted(groups.items(), key=lambda kv: (tuple(kv[1]) != first, kv[1]))
    (k0, r0), rest = ordered[0], ordered[1:]
    same_op = all(k[0] == k0[0] for k, _ in rest)
    tail = ", ".join(f"{_ranks(rs)} {'are' if len(rs) > 1 else 'is'} in {_label(k, with_op=not same_op)}"
                     for k, rs in rest)
    return f"{_ranks(r0)} {'wait' if len(r0) > 1 else 'waits'} in {_label(k0)} while {tail}"


def _label(pos: tuple[str, int], with_op: bool = True) -> str:
    op, seq = pos
    number = f"#{seq}" if seq >= 0 else "(not counted)"
    return f"{op} {number}" if with_op else number


def _list_positions(groups: dict[tuple[str, int], list[int]]) -> str:
    return "; ".join(f"{_ranks(rs)}: {_label(k)}" for k, rs in sorted(groups.items(), key=lambda kv: kv[1]))


def _ranks(rs: list[int]) -> str:
    rs = sorted(rs)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"ranks {rs[0]}\u2013{rs[-1]}"
    return "ranks " + ", ".join(str(r) for r in rs)
