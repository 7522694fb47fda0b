"""A collective hang across ranks: where each rank is in the sequence of collectives, and which rank to blame.

    positions = read_positions(run_dir)          # {rank: {"op": "all_reduce", "seq": 1042, "inside": True, ...}}
    refine(diagnosis, snapshot, positions)       # the `collective` diagnosis now names positions and blame

The stacks say *which* collective each rank waits in; the probe's counters (probe/collectives.py, copied to
the store as `meta` `collectives.<rank>`) say *which one of them*. On a stall the watchdog also asks each
rank's probe for its flight recorder (`ask`, probe/flightrec.py, `meta` `flightrec.<rank>`), which holds
the collectives issued from C++ as well: DDP's gradient all-reduce inside `loss.backward()`, where the
stack shows only the backward. Where every rank answered, `judge_flight` compares them; else `judge`
compares the counters. Together:

    rank 0 waits in all_reduce #1 of group 1 at train.py:63, which rank 1 never called; rank 1 waits in
    DDP's gradient all-reduce (all_reduce #19, in backward at train.py:57), which rank 0 has not reached

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

import os
from pathlib import Path
from typing import Any

from trainguard.contract import COLLECTIVES_REQUEST, DEFAULT_GROUP, FLIGHT_ANSWER_PREFIX
from trainguard.watchdog import collectivewords as words

META_PREFIX = "collectives."
FLIGHT_PREFIX = FLIGHT_ANSWER_PREFIX
# what a rank inside backward without a flight-recorder answer waits in, as far as its stack can tell
UNSEEN_BACKWARD = ("the gradient collectives issued inside backward (DDP's all-reduce, FSDP's reduce-scatter; by its "
                   "stack: its flight recorder gave no answer)")


def read_positions(run_dir: str | Path, asked: float | None = None) -> dict[int, dict[str, Any]]:
    """Each rank's latest collective as the probe recorded it; {} without a store or without counters.
    With `asked`, the time of the watchdog's request: the counters a rank sent with its answer replace the
    copy its background thread made (that thread may be held behind a wedged GPU, its copy from before the
    hang), whether or not its flight recorder is on.

    A node's part of a run over nodes (RUN/node-<N>/, store/nodes.py) reads every node's ranks from the
    shared run folder: the hang on this node is compared with the ranks of the others."""
    out = {r: v for r, v in _by_rank(run_dir, META_PREFIX).items() if v.get("seq") is not None}
    for r, answer in _fresh_answers(run_dir, asked).items():
        pos = answer.get("position")
        if isinstance(pos, dict) and pos.get("seq") is not None:
            out[r] = pos
        else:  # its probe made no counted call (the copy is an earlier attempt's, or none)
            out.pop(r, None)
    return out


def answered(run_dir: str | Path, asked: float | None) -> set[int]:
    """The ranks that answered the request made at `asked`, with their flight recorder on or off: each has
    a probe, and the counters it sent are this stall's."""
    return set(_fresh_answers(run_dir, asked))


def _fresh_answers(run_dir: str | Path, asked: float | None) -> dict[int, dict[str, Any]]:
    if asked is None:
        return {}
    return {r: v for r, v in _by_rank(run_dir, FLIGHT_PREFIX).items()
            if isinstance(v.get("request"), (int, float)) and v["request"] >= asked - 1e-6}


def ask(run_dir: str | Path) -> float | None:
    """Asks every rank's probe for its flight recorder's view (probe/flightrec.py): touches the request
    file; returns its time, which the answers carry. None when the folder cannot be written."""
    from trainguard.folderio import open_append, subdir

    try:  # a link planted in place of the folder or the file is refused, never followed
        path = subdir(Path(run_dir) / "stacks") / COLLECTIVES_REQUEST
        fd = open_append(path)
        try:
            os.utime(fd)
            return os.fstat(fd).st_mtime
        finally:
            os.close(fd)
    except OSError:
        return None


def read_flight(run_dir: str | Path, asked: float | None) -> dict[int, dict[str, Any]]:
    """The ranks' answers to the request made at `asked` (older answers are another stall's)."""
    return {r: v for r, v in _fresh_answers(run_dir, asked).items() if not v.get("unavailable")}


def _by_rank(run_dir: str | Path, prefix: str) -> dict[int, dict[str, Any]]:
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
        if key.startswith(prefix) and isinstance(value, dict):
            try:
                out[int(key[len(prefix):])] = value
            except ValueError:
                continue
    return out


def judge(positions: dict[int, dict[str, Any]], in_stack: dict[int, str | None],
          in_backward: set[int] | None = None, answered: set[int] | None = None,
          recorder_on: bool = False) -> dict[str, Any] | None:
    """Compare the ranks' positions. `in_stack`: rank -> the collective its stack waits in (None: none).
    `in_backward`: ranks whose stack is inside autograd's backward, where DDP all-reduces in C++: without
    their flight recorder's answer nobody knows whether they wait there, so they are not blamed.
    `answered`: the ranks whose counters are this stall's (sent with their answer, `read_positions`): only
    between them does a rank with fewer calls count as out of step when nobody waits (`_out_of_step`).
    `recorder_on`: some rank's flight recorder answered.

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
        return _out_of_step(positions, ranks, in_backward or set(), answered or set(), recorder_on)
    groups: dict[tuple[str, int], list[int]] = {}
    for r, w in waiting.items():
        groups.setdefault(w, []).append(r)
    unseen = [r for r in outside if r in (in_backward or set())]
    blame: list[int] = []
    if outside:
        blame = [r for r in outside if r not in unseen]
    elif len(groups) > 1:
        blame = _odd_group(groups, positions)
    sentence = words.sentence(groups, [r for r in outside if r not in unseen], blame, positions)
    if unseen:
        others = "; ".join(f"{words.rank_list(rs)} {'wait' if len(rs) > 1 else 'waits'} in {words.position_label(k)}"
                           for k, rs in sorted(groups.items(), key=lambda kv: kv[1]))
        sentence = (f"{words.rank_list(unseen)} {'are' if len(unseen) > 1 else 'is'} inside backward, where DDP's gradient "
                    "all-reduce is not seen without the flight recorder (TORCH_FR_BUFFER_SIZE), while "
                    + (others if not blame else sentence))
    unrecoverable = None
    if not outside and len(groups) > 1:
        unrecoverable = f"the ranks wait in different collectives ({words.list_positions(groups)}): none can complete"
    return {"sentence": sentence, "blame": blame[0] if len(blame) == 1 else None, "blamed": blame,
            "unrecoverable": unrecoverable,
            "positions": {str(r): words.position_label(w) if w else "in no collective" for r, w in where.items()}}


def judge_flight(flight: dict[int, dict[str, Any]], now: dict[int, str | None],
                 lines: dict[int, set[str]] | None = None,
                 positions: dict[int, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """Compare the ranks by what their flight recorders hold (every collective, DDP's and FSDP's too).

    `flight`: rank -> the probe's answer (probe/flightrec.py); `now`: rank -> where its main thread is:
    "python" (inside a torch.distributed call), "backward" (inside autograd's backward), None (elsewhere).
    Returns what `judge` returns, or None when a rank with a stack gave no answer (the counters judge).

    Proof, the whole of it: every rank waits in a collective and none of these collectives can complete,
    because for each a member of its group never reaches it. A rank blocked in a torch.distributed call
    issues nothing more; a rank inside backward may still issue gradient buckets on the groups it is
    already all-reducing in (DDP's next bucket), nothing else before its backward returns, which needs
    its all-reduce to complete. A rank elsewhere may still arrive (a straggler): never proof.

    `lines`: rank -> the user's lines in its sampled stack (`train.py:63`); where given, a recorded
    collective is the one the rank waits in only when it was issued from one of them (a rank inside
    `new_group()` or `destroy_process_group()` with an earlier async all-reduce still in flight waits in
    neither as far as this can tell).

    `now` may also say "device": the host waits for its GPU (`.item()`, a synchronize, the probe's last
    drain). Under NCCL that is where a hang shows: a collective returns at once and runs on the device,
    the host runs on until it needs a result. Such a rank waits in its oldest collective still in flight
    on the device (the device runs them in order), and reaches nothing queued behind it: its host, waiting
    for the device, issues nothing more. The assumption: a collective issued from Python and still in flight
    holds up the device's later work, as a call without `async_op=True` does (the compute stream waits for
    it). An `async_op=True` collective on another group that nothing has waited on yet holds up nothing (each
    group has a stream of its own); the recorder does not say which kind an entry was, so a rank with one in
    flight while its device runs slowly through another group's collective for longer than the stall
    timeout would read as proof. Left so: that is rare, and the kind it would cost (the metric all-reduce
    under `if rank == 0`, once its group's communicator exists) is the common hang over NCCL.

    `positions`: the probe's counters (`read_positions`). A rank blocked in a torch.distributed call that
    its recorder does not hold yet waits where its counter says: NCCL records a collective only once the
    group's communicator exists, and the first call on a group made lazily (no `device_id` bound) waits
    for the other ranks inside that communicator's set-up.
    """
    ranks = sorted(now)
    if len(ranks) < 2 or any(r not in flight for r in ranks):
        return None
    members: dict[str, list[int]] = {}
    for r in ranks:
        for g, rs in (flight[r].get("members") or {}).items():
            members.setdefault(g, rs)
    waits: dict[int, dict[str, Any] | None] = {}
    for r in ranks:
        if now[r] == "device":
            wait = device_wait(flight[r])
        else:
            mine = [a for a in flight[r].get("active") or [] if now[r] is not None and a.get("from") == now[r]
                    and (lines is None or _line_of(a.get("where")) in lines.get(r, set()))]
            # blocked in a call: its newest; inside backward: the oldest bucket it waits for
            wait = (mine[0] if now[r] == "python" else min(mine, key=lambda a: a.get("seq", 0))) if mine else None
            counted = (positions or {}).get(r) or {}
            if wait is None and now[r] == "python" and counted.get("inside") and counted.get("seq") is not None:
                wait = {"group": counted.get("group"), "seq": int(counted["seq"]), "op": counted.get("op"),
                        "from": "python", "where": None, "sizes": None}
        if wait is not None and isinstance(flight[r].get("step"), int):
            wait = {**wait, "step": flight[r]["step"]}
        waits[r] = wait
    if not any(waits.values()):
        return None

    def enqueued(r: int, g: str) -> int:
        return int(((flight[r].get("groups") or {}).get(g) or {}).get("enqueued", 0) or 0)

    def completed(r: int, g: str) -> int:
        return int(((flight[r].get("groups") or {}).get(g) or {}).get("completed", 0) or 0)

    def reaches(x: int, w: dict[str, Any]) -> bool | None:
        g, seq = w["group"], int(w["seq"])
        if g in members and x not in members[g]:
            return True  # not its group
        mine = waits.get(x)
        if now[x] == "device" and mine is not None:
            # its device is stuck in `mine`: it reaches that one and what it completed, not what is queued
            # behind it nor what its host (waiting for the device) would issue next
            return (mine["group"], int(mine["seq"])) == (g, seq) or completed(x, g) >= seq
        if enqueued(x, g) >= seq:
            return True
        if mine is None:
            return None  # outside any collective: it may still get there
        if now[x] == "backward" and any(a.get("group") == g for a in flight[x].get("active") or []
                                        if a.get("from") == "backward"):
            return None  # its backward may issue more buckets on that group
        return False

    missing = {r: [x for x in ranks if x != r and reaches(x, w) is False] for r, w in waits.items() if w}
    behind = {r: [x for x in ranks if x != r and reaches(x, w) is None] for r, w in waits.items() if w}
    outside = [r for r in ranks if waits[r] is None]
    keys: dict[tuple, list[int]] = {}
    for r, w in waits.items():
        if w:
            keys.setdefault((w["group"], int(w["seq"]), w.get("op"), w.get("from")), []).append(r)
    same_seq_other_op = any(k1[:2] == k2[:2] and k1[2] != k2[2] for k1 in keys for k2 in keys if k1 != k2)
    unrecoverable = None
    if not outside and (all(missing[r] for r in missing) or same_seq_other_op):
        unrecoverable = ("every rank waits in a collective that another rank of its group, itself blocked in one, "
                         "never reaches: none can complete" if not same_seq_other_op else
                         "the ranks wait in different collectives at the same number of one group: none can complete")

    def novel(r: int) -> bool:  # a kind of collective the other members never made in that group
        w = waits[r]
        if w is None:
            return False
        kind = words.window_kind(w)
        return all(not ((flight[x].get("kinds") or {}).get(w["group"]) or {}).get(kind)
                   for x in ranks if x != r and (w["group"] not in members or x in members[w["group"]]))

    blame: list[int] = []
    if outside:
        blame = outside
    elif unrecoverable:
        odd = [r for r in waits if novel(r)]
        if not odd or len(odd) == len(waits):
            odd = [r for r, w in waits.items() if w and w.get("from") == "python"]  # DDP's all-reduce is every step's
            if len(odd) == len(waits):
                odd = []
        blame = odd if 0 < len(odd) < len(ranks) else []

    sentence = words.flight_sentence(ranks, waits, outside, blame, missing, behind, flight)
    return {"sentence": sentence, "blame": blame[0] if len(blame) == 1 else None, "blamed": blame,
            "unrecoverable": unrecoverable, "straggling": outside if not unrecoverable and outside else [],
            "positions": {str(r): words.flight_label(w) if w else "in no collective" for r, w in waits.items()},
            "waits": waits}


def device_wait(answer: dict[str, Any]) -> dict[str, Any] | None:
    """The collective a rank's device waits in: its oldest one run by the device and still in flight (the
    device runs them in order, so the others are queued behind it), or None."""
    mine = [a for a in answer.get("active") or [] if a.get("device")]
    return min(mine, key=lambda a: (a.get("t") or 0.0, a.get("seq", 0))) if mine else None


def _line_of(where: Any) -> str | None:
    """`/tmp/x/train.py:63 (<module>)` -> `train.py:63`: the recorder's and the stack's paths of one file
    may differ (relative, resolved), its name and line do not."""
    if not isinstance(where, str) or ":" not in where:
        return None
    path, _, rest = where.partition(" (")[0].rpartition(":")
    return f"{Path(path).name}:{rest}"


def user_lines(t: Any) -> set[str]:
    """The user's lines in a thread's stack, as `_line_of` writes them."""
    from trainguard.rules.crash import is_user_frame

    return {f"{Path(f.file).name}:{f.line}" for f in (t.frames if t is not None else []) if is_user_frame(f.file)}


def refine(diagnosis: Any, snap: Any, positions: dict[int, dict[str, Any]],
           flight: dict[int, dict[str, Any]] | None = None, answered: set[int] | None = None) -> None:
    """Rewrite a `collective` diagnosis with the ranks' positions, the rank to blame and its stack: from
    the flight recorders' answers where every rank gave one, else from the probe's counters (`answered`:
    the ranks whose counters came with their answer, `judge`)."""
    from trainguard.watchdog import classify

    by_rank = trainers_by_rank(snap)
    in_stack = {r: classify._collective_op(p.main_thread) if classify._in(p.main_thread, classify._COLLECTIVE_FILES)
                else None for r, p in by_rank.items()}
    flight = flight or {}
    now = {r: now_of(p.main_thread, flight.get(r)) for r, p in by_rank.items()}
    verdict = judge_flight(flight, now, {r: user_lines(p.main_thread) for r, p in by_rank.items()}, positions)
    if verdict is not None and any(now[r] == "device" and where_now(p.main_thread) == "backward"
                                   for r, p in by_rank.items()):
        # a host inside backward may still be launching (a slow device, not a wedged one): named, never proof
        verdict["unrecoverable"] = None
    if verdict is None:
        verdict = judge(positions, in_stack, {r for r, p in by_rank.items() if where_now(p.main_thread) == "backward"},
                        answered, recorder_on=bool(flight))
    if verdict is None:
        return
    blamed = f" (rank {verdict['blame']} is out of step: its stack is shown)" if verdict["blame"] is not None else ""
    diagnosis.detail = verdict["sentence"] + blamed + "; " + diagnosis.detail
    diagnosis.extra["collective_positions"] = verdict["positions"]
    if verdict["unrecoverable"]:
        diagnosis.extra["unrecoverable"] = verdict["unrecoverable"]
    elif verdict.get("straggling"):
        diagnosis.fix = classify.FIXES["collective-straggler"]
    if verdict["blame"] is not None:
        diagnosis.extra["blamed_rank"] = verdict["blame"]
        proc = by_rank.get(verdict["blame"])
        if proc is not None and proc.main_thread is not None:
            frame = classify._innermost_user(proc.main_thread)
            diagnosis.where = classify._where(frame) or diagnosis.where
            diagnosis.frames = classify._frames(proc.main_thread)
            diagnosis.pid = proc.pid
        issued = (verdict.get("waits") or {}).get(verdict["blame"]) or {}
        if verdict.get("where"):  # the extra call the counters saw (the rank's stack has moved on)
            diagnosis.where = verdict["where"]
            diagnosis.extra["host_waits_at"] = classify._where(classify._innermost_user(
                proc.main_thread if proc is not None else None))
        elif issued.get("device") and issued.get("where"):
            # its host waits elsewhere (its stack, kept in `frames`); the collective's own line is the place
            diagnosis.where = issued["where"]
            diagnosis.extra["host_waits_at"] = classify._where(classify._innermost_user(
                proc.main_thread if proc is not None else None))


def flight_waits(snap: Any, flight: dict[int, dict[str, Any]]) -> dict[int, str]:
    """Ranks that wait in a collective their Python stack does not show, known from their flight recorder
    (rank -> what), for classify: a main thread inside backward while a collective the backward issued has
    not completed (DDP's gradient all-reduce), or one that waits for its device while a collective the
    device runs has not (NCCL: the host waits in `.item()` or `guard.finish()`, the device in the collective;
    or inside backward, `now_of`). A rank of several inside backward that gave no answer is taken at its stack's word (UNSEEN_BACKWARD):
    never proof, since nothing says which all-reduce it waits in."""
    out = {}
    ranks = trainers_by_rank(snap)
    for r, p in ranks.items():
        now = now_of(p.main_thread, flight.get(r))
        if now == "device":
            w = device_wait(flight.get(r) or {})
            if w is not None:
                out[r] = words.flight_label(w)
            continue
        if now != "backward":
            continue
        if r not in flight:
            innermost = p.main_thread.frames[-1].file if p.main_thread and p.main_thread.frames else ""
            if len(ranks) > 1 and "torch/autograd/" in innermost:
                # No answer (its probe's threads are held, or its recorder is off): a rank of several held in
                # autograd's engine for the whole stall waits in what DDP (or FSDP) issues there, or for a
                # device such a collective has wedged; not on an event, a lock or a queue of its own (a new
                # user's DDP job over NCCL was told "deadlock" with advice on lock order). A user's own
                # backward or hook waiting inside it (innermost frame not autograd's) is that wait, for classify.
                out[r] = UNSEEN_BACKWARD
            continue
        mine = _issued_by_backward(flight.get(r) or {}, user_lines(p.main_thread))
        if mine:
            w = min(mine, key=lambda a: a.get("seq", 0))
            out[r] = "DDP's gradient all-reduce" if w.get("op") == "all_reduce" else f"{w.get('op')} (in backward)"
    return out


def now_of(t: Any, answer: dict[str, Any] | None) -> str | None:
    """`where_now`, read against the rank's flight-recorder answer: a host inside backward whose recorder holds
    no collective its backward issued from a line of its stack, but collectives its device runs still in
    flight, waits for its device ("device"). That is NCCL: DDP's buckets are issued from C++ with no Python
    line, return at once and run on the GPU; a collective that cannot complete wedges the device and the
    host, launching behind it, blocks inside backward. A new user's DDP job (a `dist.barrier()` under `if
    rank == 0:`) showed both ranks so, and was read as a deadlock."""
    now = where_now(t)
    if now != "backward" or not answer:
        return now
    if _issued_by_backward(answer, user_lines(t)):
        return now
    return "device" if device_wait(answer) is not None else now


def _issued_by_backward(answer: dict[str, Any], lines: set[str]) -> list[dict[str, Any]]:
    """The answer's collectives in flight that the rank's backward issued from a line of its stack (`lines`)."""
    return [a for a in answer.get("active") or [] if a.get("from") == "backward" and _line_of(a.get("where")) in lines]


def where_now(t: Any) -> str | None:
    """Where a rank's main thread is, for comparing with its flight recorder: "python" (inside a
    torch.distributed collective), "backward" (inside autograd's backward), "device" (waiting for its GPU:
    classify.waits_for_device), None (elsewhere)."""
    from trainguard.watchdog import classify

    if t is None:
        return None
    if classify._in(t, classify._COLLECTIVE_FILES):
        return "python"
    if any("torch/autograd/" in f.file for f in t.frames):
        return "backward"
    if classify.waits_for_device(t):
        return "device"
    return None


def trainers_by_rank(snap: Any) -> dict[int, Any]:
    last = snap.samples[-1] if snap.samples else {}
    by_rank = {}
    for p in last.values():
        try:
            if p.rank is not None and not p.is_dataloader_worker and p.threads:
                by_rank[int(p.rank)] = p
        except ValueError:
            continue
    return by_rank


def _out_of_step(positions: dict[int, dict[str, Any]], ranks: list[int], in_backward: set[int], answered: set[int],
                 recorder_on: bool) -> dict[str, Any] | None:
    """No rank waits in a collective its Python code called, yet some ranks made a call the others never
    made. Under NCCL that is how a call only some ranks make shows with the flight recorder off: the call
    returns at once (the device runs it), pairs with another collective on the other ranks (the gradient
    all-reduce of their next backward), and every host then sits inside backward or waits for its device.
    Only between ranks whose counters came with their answer to this stall's request (a rank without a
    probe made calls nobody counted; a copy from before a wedged GPU is behind), and only on the group of
    their latest calls. A rank ahead by a call of a kind the others also make is ordinary: under NCCL a
    host runs ahead of its device. Never proof: nothing says which collective each device waits in."""
    if len(ranks) < 2 or not set(ranks) <= answered:
        return None
    groups = {str(p.get("group") or DEFAULT_GROUP) for p in positions.values()}
    if len(groups) != 1:
        return None
    (group,) = groups
    if group != DEFAULT_GROUP and any(r not in positions for r in ranks):
        return None  # a rank without calls may not even be a member of that group
    made = {r: int((positions.get(r) or {}).get("seq") or 0) for r in ranks}
    top = max(made.values())
    ahead = [r for r in ranks if made[r] == top]
    behind = [r for r in ranks if made[r] < top]
    op, where = str(positions[ahead[0]].get("op")), positions[ahead[0]].get("where")
    if not behind or any(_calls(positions, r, op) for r in behind):
        return None
    # the side that is fewer is the odd one: ranks that made an extra call, or a rank that skipped one
    blame = ahead if len(ahead) <= len(behind) else behind
    of_group = "" if group == DEFAULT_GROUP else f" of group {group}"
    sentence = (f"no rank waits in a collective its Python code called, but {words.rank_list(ahead)} made "
                f"{words.position_label((op, top))}{of_group}{f' at {where}' if where else ''}, a call {words.rank_list(behind)} never made")
    if in_backward & set(ranks):
        sentence += ("; inside backward, a collective the backward issues (DDP's gradient all-reduce, or the like) "
                     "pairs with it and waits for a partner that never comes")
        if not recorder_on:
            sentence += " (the flight recorder, TORCH_FR_BUFFER_SIZE, would name it)"
    return {"sentence": sentence, "blame": blame[0] if len(blame) == 1 else None, "blamed": blame,
            "unrecoverable": None, "where": where if blame == ahead and len(ahead) == 1 else None,
            "positions": {str(r): f"{made[r]} call(s)" + (f", last {words.position_label((str(positions[r].get('op')), made[r]))}"
                                                         if r in positions else "") for r in ranks}}


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
