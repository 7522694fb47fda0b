"""Root cause first without a probe: which process failed first, read from a multi-process run's output.

The fixtures are written here in the shapes torch prints (torchrun's `[rankN]:` prefixes, its summary with
and without `@record`, an older torch without prefixes, `mp.spawn`); the zoo runs the real thing under
`trainguard run --no-auto` (scenarios/rank_fails_first_torchrun_noprobe and its healthy twin).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tgtest import run_trainguard

from trainguard.rules.firstfailure import first_failure_finding, read_failures


def _tb(frames: list[tuple[str, int, str, str]], exc: str, prefix: str = "") -> list[str]:
    out = [f"{prefix}Traceback (most recent call last):"]
    for file, line, fn, code in frames:
        out += [f'{prefix}  File "{file}", line {line}, in {fn}', f"{prefix}    {code}"]
    return out + [f"{prefix}{exc}"]


VALUE_ERROR = _tb([("/job/train.py", 40, "<module>", "x, y = get_batch(step)"),
                   ("/job/train.py", 21, "get_batch", "raise ValueError(bad)")],
                  "ValueError: shard 3: expected 32 features per row, got 31")
PEER_CLOSED = _tb([("/job/train.py", 44, "<module>", "loss.backward()"),
                   ("/venv/lib/python3.11/site-packages/torch/_tensor.py", 623, "backward", "torch.autograd.backward(")],
                  "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:41234")
LAUNCHER = _tb([("/venv/bin/torchrun", 8, "<module>", "sys.exit(main())"),
                ("/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", 269, "launch_agent",
                 "raise ChildFailedError(")],
               "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")


def _summary(root_rank: int, *, exitcode: int = 1, traceback: list[str] | None = None) -> list[str]:
    out = ["============================================================", "train.py FAILED",
           "------------------------------------------------------------", "Failures:", "  <NO_OTHER_FAILURES>",
           "------------------------------------------------------------", "Root Cause (first observed failure):",
           "[0]:", "  time      : 2026-11-26_14:19:55", "  host      : node-3",
           f"  rank      : {root_rank} (local_rank: {root_rank})", f"  exitcode  : {exitcode} (pid: 4242)"]
    if traceback:
        out += ["  error_file: /tmp/torchelastic_x/attempt_0/1/error.json", f"  traceback : {traceback[0]}"]
        out += ["    " + line for line in traceback[1:-1]] + ["  " + traceback[-1], "  "]
    else:
        out += ["  error_file: <N/A>",
                "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"]
    return out + ["============================================================"]


def _prefixed(rank: int, lines: list[str]) -> list[str]:
    return [f"[rank{rank}]: {line}" for line in lines]


def test_torchrun_prefixed_names_the_first_rank_not_the_last_traceback() -> None:
    lines = (["W1126 14:19:44.944000 2539 torch/distributed/run.py:874] *****"]
             + _prefixed(1, VALUE_ERROR) + _prefixed(0, PEER_CLOSED)
             + ["W1126 14:19:55.629000 2539 api.py:1028] Sending process 2567 closing signal SIGTERM"]
             + LAUNCHER + _summary(1))
    f = first_failure_finding(lines, step=5, elapsed=20.0)
    assert f is not None
    assert f.exception == "ValueError" and f.where == "/job/train.py:21 (get_batch)"
    assert f.summary.startswith("rank 1 failed first: ValueError: shard 3")
    assert f.evidence["rank"] == 1 and f.evidence["pid"] == 4242 and f.evidence["rank_exit_code"] == 1
    assert f.evidence["root_cause_by"] == "torchrun's root cause (first observed failure)"
    assert f.evidence["consequences"] == [
        "rank 0: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:41234"]


def test_a_consequence_printed_first_is_not_the_cause_when_torchrun_named_the_lowest_rank() -> None:
    # With no error file, two failures seen in the same poll tie and torchrun names the lowest rank: rank 0,
    # whose traceback reached the output first, died of its peer; rank 1's ValueError is the cause.
    lines = _prefixed(0, PEER_CLOSED) + _prefixed(1, VALUE_ERROR) + LAUNCHER + _summary(0)
    f = first_failure_finding(lines, step=None, elapsed=None)
    assert f is not None and f.exception == "ValueError" and f.evidence["rank"] == 1
    assert "torchrun named rank 0, whose failure reads as a consequence" in f.evidence["root_cause_by"]
    assert "pid" not in f.evidence  # torchrun's pid was rank 0's
    assert f.evidence["consequences"][0].startswith("rank 0: RuntimeError")


def test_interleaved_ranks_are_told_apart_by_their_prefixes() -> None:
    a, b = _prefixed(1, VALUE_ERROR), _prefixed(0, PEER_CLOSED)
    lines = [x for pair in zip(a, b) for x in pair] + a[len(b):] + b[len(a):] + LAUNCHER + _summary(1)
    failures = read_failures(lines)
    assert [(f.rank, f.traceback.exception) for f in failures.failures] == [(1, "ValueError"), (0, "RuntimeError")]
    assert first_failure_finding(lines, step=None, elapsed=None).where == "/job/train.py:21 (get_batch)"


def test_older_torch_without_prefixes_uses_the_order_and_skips_consequences() -> None:
    # torch before the `[rankN]:` prefixes: the tracebacks come unlabelled, in the order they were printed
    lines = PEER_CLOSED + VALUE_ERROR + ["ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1)"] \
        + LAUNCHER + _summary(1)
    f = first_failure_finding(lines, step=None, elapsed=None)
    assert f is not None and f.exception == "ValueError"
    assert "not a consequence" in f.evidence["root_cause_by"] and len(f.evidence["consequences"]) == 1


def test_record_puts_the_root_cause_traceback_in_the_summary_only() -> None:
    # the ranks' own output went to log files (torchrun --redirects 3 --log-dir ...): only the summary is left
    lines = LAUNCHER + _summary(1, traceback=VALUE_ERROR)
    f = first_failure_finding(lines, step=None, elapsed=None)
    assert f is not None and f.exception == "ValueError" and f.where == "/job/train.py:21 (get_batch)"
    assert f.evidence["rank"] == 1 and f.evidence["consequences"] == []


def test_a_summary_without_any_traceback_still_names_the_rank() -> None:
    f = first_failure_finding(LAUNCHER + _summary(3, exitcode=-9), step=None, elapsed=None)
    assert f is not None and f.evidence["rank"] == 3 and f.evidence["rank_exit_code"] == -9
    assert f.summary.startswith("rank 3 failed first: ChildFailedError: exit code -9; its traceback is not in the output")
    assert "record" in f.summary


def test_mp_spawn_names_the_process_it_reports() -> None:
    lines = (_tb([("/job/spawn.py", 9, "<module>", "mp.spawn(work, nprocs=2)"),
                  ("/venv/lib/python3.11/site-packages/torch/multiprocessing/spawn.py", 211, "join",
                   "raise ProcessRaisedException(msg, error_index, failed_process.pid)")],
                 "torch.multiprocessing.spawn.ProcessRaisedException: ")
             + ["", "-- Process 1 terminated with the following error:"] + VALUE_ERROR)
    f = first_failure_finding(lines, step=None, elapsed=None)
    assert f is not None and f.exception == "ValueError" and f.evidence["rank"] == 1


def test_one_process_keeps_its_last_traceback() -> None:
    # a handled error logged with its traceback, then the crash: one process, so the last one is the crash
    handled = _tb([("/job/train.py", 12, "load_cache", "open(path)")], "FileNotFoundError: cache.pt")
    f = first_failure_finding(handled + ["cache missing, rebuilding"] + VALUE_ERROR, step=7, elapsed=None)
    assert f is not None and f.exception == "ValueError" and "rank" not in f.evidence


def test_a_chained_exception_is_one_failure_of_its_rank() -> None:
    chain = _tb([("/job/data.py", 30, "read", "decode(row)")], "UnicodeDecodeError: 'utf-8' codec can't decode") \
        + ["", "During handling of the above exception, another exception occurred:", ""] + VALUE_ERROR
    lines = _prefixed(1, chain) + _prefixed(0, PEER_CLOSED) + LAUNCHER + _summary(1)
    failures = read_failures(lines)
    assert [(f.rank, f.traceback.exception) for f in failures.failures] == [(1, "ValueError"), (0, "RuntimeError")]
    assert first_failure_finding(lines, step=None, elapsed=None).exception == "ValueError"


def test_no_traceback_no_finding() -> None:
    assert first_failure_finding(["step 1 loss 2.0", "Killed"], step=1, elapsed=None) is None


def test_unlabelled_tracebacks_of_a_launcher_of_ones_own() -> None:
    # ranks started with subprocess.Popen: no prefixes, no summary; rank 0's peer error came last
    f = first_failure_finding(VALUE_ERROR + PEER_CLOSED, step=None, elapsed=None)
    assert f is not None and f.exception == "ValueError" and f.evidence["rank"] is None
    assert f.summary.startswith("a process (its rank is not in the output) failed first: ValueError")
    assert f.evidence["consequences"] == [
        "a process: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:41234"]


RANK_FAILS = """
import datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(100):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    if rank == 1 and i == 20:
        raise ValueError("bad batch shape on rank 1")
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step(); opt.zero_grad()
    if rank == 0:
        print(f"step {i} loss {loss.item():.4f}", flush=True)
"""

LAUNCH = """
import os, socket, subprocess, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
procs = [subprocess.Popen([sys.executable, sys.argv[1]], env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2",
         "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for r in range(2)]
sys.exit(max(p.wait() for p in procs))
"""


def test_real_ranks_of_a_launcher_of_ones_own_without_the_probe(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(RANK_FAILS)
    (tmp_path / "launch.py").write_text(LAUNCH)
    run_dir = tmp_path / "run"
    out = run_trainguard("run", "--no-auto", "--run-dir", str(run_dir), "--", sys.executable,
                         str(tmp_path / "launch.py"), str(tmp_path / "train.py"), timeout=240)
    assert out.returncode == 1, out.stderr[-3000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "crashed"
    crash = next(f for f in status["findings"] if f["code"] == "TG501")
    assert crash["exception"] == "ValueError" and "bad batch shape on rank 1" in crash["summary"], crash
    assert crash["where"].startswith(str(tmp_path / "train.py") + ":11"), crash["where"]
    assert any("Connection closed by peer" in c for c in crash["evidence"]["consequences"]), crash["evidence"]


def test_diagnose_of_a_torchrun_log_names_the_first_failure(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("\n".join(["step 1 loss 2.31", "step 2 loss 2.20"] + _prefixed(1, VALUE_ERROR)
                             + _prefixed(0, PEER_CLOSED) + LAUNCHER + _summary(1)) + "\n")
    out = run_trainguard("diagnose", str(log), "--json")
    assert out.returncode in (0, 1), out.stderr
    crash = next(f for f in json.loads(out.stdout)["findings"] if f["code"] == "TG501")
    assert crash["exception"] == "ValueError" and crash["evidence"]["rank"] == 1, crash
    assert crash["source"] == "diagnose" and crash["evidence"]["consequences"][0].startswith("rank 0: RuntimeError")


def test_a_rank_that_aborts_as_its_process_ends_is_told_as_a_teardown_abort_not_a_lost_traceback() -> None:
    # PyTorch 2.13's gloo now and then aborts a DDP rank at exit, after its last step ("terminate called
    # without an active exception"): no Python error, exit code -6. It was told "its traceback is not in the
    # output: decorate the entry point with @record", which cannot help.
    lines = (["W1129 02:48:27.100000 1177 torch/distributed/run.py:851] *****"]
             + [f"step {s} loss {30 + s % 7:.4f}" for s in range(35, 41)]
             + ["terminate called without an active exception",
                "W1129 02:48:28.163000 1177 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
                "1185 closing signal SIGTERM",
                "E1129 02:48:28.179000 1177 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: "
                "-6) local_rank: 0 (pid: 1184) of binary: /venv/bin/python"]
             + LAUNCHER + _summary(0, exitcode=-6))
    f = first_failure_finding(lines, step=40, elapsed=4.1)
    assert f is not None and f.evidence["rank"] == 0 and f.evidence["rank_exit_code"] == -6
    assert f.summary.startswith("rank 0 failed first: abort: aborted as its process ended"), f.summary
    assert "pytorch/pytorch#190489" in f.summary and "at step 40" in f.summary
    assert "may have finished" in f.fix and "destroy_process_group" in f.fix and "@record" not in f.summary
    # a rank that aborted after throwing keeps its own words (NCCL's watchdog, gloo's enforce)
    thrown = [line.replace("terminate called without an active exception",
                           "terminate called after throwing an instance of 'gloo::EnforceNotMet'") for line in lines]
    f = first_failure_finding(thrown, step=40, elapsed=4.1)
    assert f is not None and "as its process ended" not in f.summary and f.summary.startswith("rank 0 failed first: EnforceNotMet")
