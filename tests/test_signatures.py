"""The catalogue of failure signatures (rules/signatures.py), fed lines made from each writer's format.

Each signature's lines are written here from the text of the program that prints it (PyTorch's c10 and
ProcessGroupNCCL, the CUDA runtime, glibc's assert, bash and zsh, the kernel's OOM killer, slurmstepd, LSF,
Singularity, argparse, torchrun), then dressed the way real logs carry them: a rank prefix, a logging
timestamp, ANSI colours, CRLF line ends, a last line cut off without its newline. `trainguard diagnose`
of a log holding only such a line must name the state and cause, quote the line and its number.

    pytest tests/test_signatures.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.ingest.diagnose import diagnose_path
from trainguard.rules.signatures import SIGNATURES, STATES, Scanner, classify, match_line

pytestmark = pytest.mark.unit

# cause -> (state, lines made from the writer's format string)
CONTRACT: dict[str, tuple[str, list[str]]] = {
    "cuda-out-of-memory": ("crashed", [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.10 GiB of which 1.12 GiB is free.",
        "RuntimeError: CUDA out of memory. Tried to allocate 576.00 MiB (GPU 0; 22.17 GiB total capacity; 3.47 GiB "
        "already allocated; 153.81 MiB free; 3.60 GiB reserved in total by PyTorch)",
        "RuntimeError: CUDA error: out of memory",
        "[CUDA ERROR] cudaMalloc failed at alloc.cu:88: out of memory",
        "RuntimeError: CUDA driver error: out of memory",
    ]),
    "cuda-illegal-memory-access": ("crashed", [
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "torch.AcceleratorError: CUDA error: misaligned address",
    ]),
    "cuda-device-assert": ("crashed", [
        "RuntimeError: CUDA error: device-side assert triggered",
        "/opt/pytorch/aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
        "thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.",
    ]),
    "cudnn-error": ("crashed", ["RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"]),
    "cublas-error": ("crashed", [
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, "
        "&alpha, a, lda, b, ldb, &beta, c, ldc)`"]),
    "collective-timeout": ("crashed", [
        "[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=31, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600184 milliseconds before timing out."]),
    "nccl-error": ("crashed", [
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1",
        "RuntimeError: [Rank 0] NCCL communicator was aborted on rank 0.",
    ]),
    "segfault": ("crashed", [
        "Segmentation fault (core dumped)",
        "Fatal Python error: Segmentation fault",
        "train.sh: line 12: 48211 Segmentation fault      (core dumped) python train.py",
        "zsh: segmentation fault (core dumped)  python train.py",
        "*** SIGSEGV (@0x0) received by PID 4242 (TID 0x7f00) from PID 0; stack trace: ***",
    ]),
    "bus-error": ("crashed", ["Bus error (core dumped)", "Fatal Python error: Bus error"]),
    "native-exception": ("crashed", ["terminate called after throwing an instance of 'std::runtime_error'"]),
    "native-assert": ("crashed", ["python: ../src/loader.c:88: load_chunk: Assertion `n > 0' failed."]),
    "abort": ("crashed", ["Aborted (core dumped)", "Fatal Python error: Aborted"]),
    "oom-killer": ("killed", [
        "[ 4821.553190] Out of memory: Killed process 40822 (python) total-vm:8923144kB, anon-rss:511920kB, "
        "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:1244kB oom_score_adj:0",
        "[1234567.1] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,task=python,pid=42",
        "[1234567.2] oom_reaper: reaped process 42 (python), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
        "Memory cgroup out of memory: Killed process 42 (python) total-vm:100kB",
    ]),
    "killed": ("killed", [
        "Killed",
        "/var/spool/slurmd/job4242/slurm_script: line 21:  7915 Killed                  python train.py",
        "  traceback : Signal 9 (SIGKILL) received by PID 4242",
        "  exitcode  : -9 (pid: 4242)",
    ]),
    "terminated": ("killed", ["Terminated", "[rank: 2] Received SIGTERM: 15"]),
    "job-memory-limit": ("killed", [
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4242.batch. Some of your processes may have been "
        "killed by the cgroup out-of-memory handler.",
        "slurmstepd: error: Exceeded job memory limit",
        "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.",
    ]),
    "time-limit": ("cut-off", [
        "slurmstepd: error: *** JOB 4242 ON node17 CANCELLED AT 2024-05-18T12:04:20 DUE TO TIME LIMIT ***",
        "slurmstepd: error: *** STEP 4242.0 ON node17 CANCELLED AT 2024-05-18T12:04:20 DUE TO TIME LIMIT ***",
        "TERM_RUNLIMIT: job killed after reaching LSF run time limit.",
    ]),
    "preempted": ("cut-off", ["slurmstepd: error: *** JOB 4242 ON node17 CANCELLED AT 2024-05-18T12:04:20 DUE TO "
                              "PREEMPTION ***"]),
    "node-failure": ("cut-off", ["slurmstepd: error: *** JOB 4242 ON node17 CANCELLED AT 2024-05-18T12:04:20 DUE TO "
                                 "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"]),
    "cancelled": ("cut-off", ["slurmstepd: error: *** JOB 4242 ON node17 CANCELLED AT 2024-05-18T12:04:20 ***"]),
    "script-not-found": ("launch-failed", [
        "/usr/bin/python3: can't open file '/home/me/trian.py': [Errno 2] No such file or directory"]),
    "command-not-found": ("launch-failed", ["/var/spool/slurmd/job4242/slurm_script: line 9: torchrun: command not found"]),
    "container-failed": ("launch-failed", ["FATAL:   could not open image /scratch/me/img.sif: failed to retrieve path "
                                           "for /scratch/me/img.sif: lstat /scratch/me/img.sif: no such file or directory"]),
    "argparse-error": ("launch-failed", ["train.py: error: unrecognized arguments: --max_steps 2"]),
    "missing-module": ("launch-failed", ["ModuleNotFoundError: No module named 'flash_attn'",
                                         "ImportError: libcudart.so.12: cannot open shared object file: No such file "
                                         "or directory"]),
    "division-by-zero": ("crashed", ["ZeroDivisionError: float division by zero"]),
    "device-mismatch": ("crashed", ["RuntimeError: Expected all tensors to be on the same device, but found at least "
                                    "two devices, cuda:0 and cpu!"]),
    "permission-denied": ("crashed", ["PermissionError: [Errno 13] Permission denied: '/data/out/ckpt.pt'"]),
    "file-not-found": ("crashed", ["FileNotFoundError: [Errno 2] No such file or directory: 'configs/base.yaml'"]),
    "disk-full": ("crashed", ["OSError: [Errno 28] No space left on device"]),
    "host-out-of-memory": ("crashed", ["RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                                       "can't allocate memory: you tried to allocate 34359738368 bytes."]),
}

# how real logs carry a line: (name, how it is written to the file)
DRESS = [
    ("plain", lambda line: line + "\n"),
    ("rank prefix", lambda line: f"[rank3]: {line}\n"),
    ("timestamp", lambda line: f"2024-05-18 12:04:20,123 - {line}\n"),
    ("ansi colour", lambda line: f"\x1b[31m{line}\x1b[0m\n"),
    ("crlf", lambda line: line + "\r\n"),
    ("cut off", lambda line: line),  # the last line, its newline never written
]
CASES = [(cause, state, line) for cause, (state, lines) in CONTRACT.items() for line in lines]


@pytest.mark.parametrize(("cause", "state", "line"), CASES, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_a_line_is_read_as_its_signature(cause: str, state: str, line: str) -> None:
    sig = match_line(line)
    assert sig is not None and sig.cause == cause and sig.state == state, (line, sig)


@pytest.mark.parametrize("dress", DRESS, ids=[d[0] for d in DRESS])
@pytest.mark.parametrize(("cause", "state", "line"), [c for c in CASES if c[0] not in ("killed", "terminated", "abort")]
                         [::2], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None)
def test_diagnose_names_the_state_and_cause_of_a_log_of_only_that_line(tmp_path: Path, dress, cause, state,
                                                                       line) -> None:
    log = tmp_path / "job.err"
    log.write_bytes(("wandb: Tracking run with wandb version 0.16.3\n" + dress[1](line)).encode())
    d = diagnose_path(log)  # not refused: the log has no metrics, but it says how the run ended
    assert d.state == state
    # a scheduler's cut read from a log is TG503 run-killed with its cause (a node's failure TG711, as the live
    # watchdog names it), the rest TG501 crashed or TG503 killed
    expected = {"cut-off": "TG711" if cause == "node-failure" else "TG503"}.get(state)
    failure = [f for f in d.findings if f.code in ("TG501", "TG503", "TG552", "TG711")]
    assert failure and failure[0].cause == cause, [f.one_line() for f in d.findings]
    assert expected is None or failure[0].code == expected, failure[0].one_line()
    assert failure[0].evidence["line"] == 2 and "line 2" in failure[0].summary
    assert failure[0].fix
    if cause == "node-failure" and "ON node17" in line:
        assert failure[0].where == "node node17" and failure[0].evidence["lost_nodes"] == ["node17"]


def test_every_signature_is_declared_with_a_known_state_and_a_fix() -> None:
    assert {s.state for s in SIGNATURES} <= set(STATES)
    assert all(s.fix and s.meaning and s.cause for s in SIGNATURES)
    # each cause in the catalogue has a line here that reads as it (nothing declared and never tried)
    assert {s.cause for s in SIGNATURES if s.lines} - set(CONTRACT) <= {"dataloader-worker-killed",
                                                                      "unpicklable-checkpoint", "teardown-abort",
                                                                      "cuda-error"}


@pytest.mark.parametrize("line", [
    "Killed 3 enemies in level 2", "epoch 1 step 100 loss 2.31 memory: 3328", "INFO: Setting default device to cuda",
    "Sending process 32371 closing signal SIGTERM", "loss=0.5 ppl=1.6 (no segfaults today)",
    "   exitcode  : 0 (pid: 12)", "[I ProcessGroupNCCL.cpp:686] ProcessGroupNCCL initialization options: TIMEOUT(ms): 600000",
    # TensorFlow's and glog's warnings: the program goes on (TensorFlow falls back to the CPU and trains)
    "2021-03-04 10:11:12.345678: W tensorflow/stream_executor/platform/default/dso_loader.cc:55] Could not load "
    "dynamic library 'libcudart.so.10.0'; dlerror: libcudart.so.10.0: cannot open shared object file: No such file",
    "W0530 12:00:00.000000 4242 dso_loader.cc:55] Could not load dynamic library libcudnn.so.7: cannot open shared "
    "object file",
])
def test_ordinary_lines_are_no_failure(line: str) -> None:
    assert match_line(line) is None


def _scan(lines: list[str | tuple[str, int]]) -> Scanner:
    scan, rows = Scanner(), 0
    for n, item in enumerate(lines, 1):
        if isinstance(item, tuple):  # (a metric line, rows read once it is read)
            rows = item[1]
            continue
        scan.feed(n, item, rows)
    return scan


def test_the_first_failure_is_the_cause_and_later_lines_its_consequences() -> None:
    scan = _scan(["python: loader.c:88: load_chunk: Assertion `n > 0' failed.", "Aborted (core dumped)"])
    out = scan.outcome(0)
    assert [s.cause for s in out] == ["native-assert", "abort"]
    scan = _scan(["[ 1.0] Out of memory: Killed process 42 (python) total-vm:1kB, anon-rss:1kB", "Killed"])
    assert [s.cause for s in scan.outcome(0)] == ["oom-killer", "killed"]
    # a line that only says how a process ended is the cause only when nothing specific was printed
    scan = _scan(["Killed", "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***"])
    assert scan.outcome(0)[0].cause == "time-limit"


def test_a_cpp_what_line_names_the_cause_of_an_uncaught_exception() -> None:
    scan = _scan(["terminate called after throwing an instance of 'c10::Error'", "  what():  CUDA error: out of memory",
                  "Aborted (core dumped)"])
    first = scan.outcome(0)[0]
    assert first.cause == "cuda-out-of-memory" and "what():" in first.text and first.lineno == 1


def test_a_failure_the_run_went_on_from_is_no_failure_of_the_run() -> None:
    # a CUDA out-of-memory the framework caught and retried: many steps logged after it
    scan = _scan([("step 1", 1), "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", ("step 9", 9)])
    assert scan.outcome(9) == []
    # the same line with no step after it ended the run
    scan = _scan([("step 1", 1), "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"])
    assert scan.outcome(1)[0].cause == "cuda-out-of-memory"
    # a process's end is its end, whatever rows a buffer flushed after it
    scan = _scan([("step 1", 1), "Segmentation fault (core dumped)", ("step 40", 40)])
    assert scan.outcome(40)[0].cause == "segfault"
    # and nothing printed before a completion line failed the run
    scan = _scan(["Killed", "Training complete"])
    scan.feed(3, "bye", 0, completed=True)
    assert scan.outcome(0, completed=True) == []


def test_a_bare_exception_that_ends_the_output_is_the_crash() -> None:
    scan = _scan(["loading", "KeyError: 'warmup_steps'"])
    first = scan.outcome(0)[0]
    assert first.state == "crashed" and first.lineno == 2
    assert classify("AssertionError: batch size 30 != 32").cause == "assertion-failed"  # type: ignore[union-attr]
    # ...but not one in the middle of the output, followed by more lines
    assert _scan(["KeyError: 'x'", "a", "b", "c"]).outcome(0) == []


def test_a_log_with_metrics_and_a_failure_line_takes_its_state_from_the_line(tmp_path: Path) -> None:
    log = tmp_path / "train.out"
    log.write_text("".join(f"[epoch:{e}/1200] [loss:{1 / e:.4f}] [lr:0.01]\n" for e in range(1, 11)) + "Killed\n")
    d = diagnose_path(log)
    assert d.state == "killed" and d.steps == 10
    killed = next(f for f in d.findings if f.code == "TG503")
    assert killed.cause == "killed" and killed.evidence["line"] == 11 and killed.step == 10
    assert not any(f.name == "log-ends-unfinished" for f in d.findings)


def test_a_kernel_line_before_a_traceback_of_another_cause_is_the_cause(tmp_path: Path) -> None:
    log = tmp_path / "train.out"
    log.write_text("step 1 loss 2.0\n"
                   "[ 99.1] Out of memory: Killed process 77 (pt_data_worker) total-vm:9kB, anon-rss:9kB\n"
                   "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    for b in loader:\n"
                   "RuntimeError: DataLoader worker (pid(s) 77) exited unexpectedly\n")
    d = diagnose_path(log)
    first = next(f for f in d.findings if f.code in ("TG501", "TG503"))
    assert d.state == "killed" and first.cause == "oom-killer" and first.evidence["line"] == 2
    assert any("traceback" in c for c in first.evidence["consequences"])


def test_a_missing_module_at_import_is_a_failed_launch(tmp_path: Path) -> None:
    log = tmp_path / "job.err"
    log.write_text("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    import deepspeed\n"
                   "ModuleNotFoundError: No module named 'deepspeed'\n")
    d = diagnose_path(log)
    assert d.state == "launch-failed" and d.findings[0].cause == "missing-module"


def test_torchrun_summary_without_the_rank_traceback_says_how_the_rank_died(tmp_path: Path) -> None:
    # torchrun's own ChildFailedError traceback, then its summary: the rank's exit code -9 is the news
    log = tmp_path / "train.log"
    log.write_text("step 10 loss 2.1\nstep 20 loss 2.0\n"
                   "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 42) "
                   "of binary: /usr/bin/python3\n"
                   "Traceback (most recent call last):\n  File \"/usr/bin/torchrun\", line 8, in <module>\n"
                   "    sys.exit(main())\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
                   + "=" * 40 + "\ntrain.py FAILED\n" + "-" * 40 + "\nRoot Cause (first observed failure):\n[0]:\n"
                   "  time      : 2024-01-01_00:00:00\n  rank      : 0 (local_rank: 0)\n  exitcode  : -9 (pid: 42)\n"
                   "  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received by PID 42\n" + "=" * 40 + "\n")
    d = diagnose_path(log)
    killed = d.findings[0]
    assert d.state == "killed" and killed.code == "TG503" and killed.evidence["line"] == 3
    assert any("torchrun's summary" in c for c in killed.evidence["consequences"])


def test_a_traceback_ending_in_keyboardinterrupt_is_a_run_someone_stopped(tmp_path: Path) -> None:
    # Ctrl-C in a nanoGPT loop: Python's traceback ends `KeyboardInterrupt`; nothing in the code failed
    steps = "".join(f"iter {i}: loss {2.5 - i / 1000:.4f}, time 57.71ms, mfu 6.24%\n" for i in range(0, 1340, 10))
    stopped = steps + ('Traceback (most recent call last):\n  File "train.py", line 320, in <module>\n'
                       "    lossf = loss.item() * gradient_accumulation_steps\nKeyboardInterrupt\n")
    log = tmp_path / "train.log"
    log.write_text(stopped)
    d = diagnose_path(log)
    assert d.state == "killed" and [f.code for f in d.findings if f.severity == "error"] == ["TG503"]
    f = next(f for f in d.findings if f.code == "TG503")
    assert f.cause == "interrupted" and "Ctrl-C" in f.summary and f.where == "train.py:320 (<module>)"
    # its twin: a real exception in the same place is the code's crash; a handler's line that names the
    # interrupt is no failure of its own
    log.write_text(stopped.replace("KeyboardInterrupt\n", "RuntimeError: CUDA error: an illegal memory access\n"))
    assert diagnose_path(log).state == "crashed"
    assert match_line("KeyboardInterrupt received: saving a checkpoint before exiting") is None
