"""One catalogue of failure signatures: what a dying process prints, what it means, and what to change.

    from trainguard.rules.signatures import classify, Scanner
    classify("RuntimeError: CUDA error: out of memory")       # the Signature of a CUDA out-of-memory
    scan = Scanner()
    for n, line in enumerate(lines, 1):
        scan.feed(n, line, progress=rows_read_so_far)
    first = scan.outcome(progress=rows_read)                   # the first failure, or None

Most failures of a training run leave no Python traceback: the CUDA runtime's own error text, a C++
`terminate called ...` and `Aborted (core dumped)`, a shell's `Killed` or `Segmentation fault`, the
kernel's OOM killer, torchrun's failure summary, a job scheduler cutting the job off at its time limit,
a container that never started. Each entry here is one such signature, written from the text of the
program that prints it (PyTorch's c10 and ProcessGroupNCCL, the CUDA runtime, glibc's assert, bash,
the Linux OOM killer, slurmstepd, LSF's job report, Singularity/Apptainer), and says:
- the state it implies: `crashed` (the program failed by itself), `killed` (something outside ended it:
  the OOM killer, a signal), `cut-off` (its job scheduler ended it: time limit, preemption, a node
  lost, a cancellation) or `launch-failed` (the command never started training);
- the cause in words, and the fix for that cause.

Python exceptions read from a traceback are classified by the same entries (`classify`), so a CUDA
out-of-memory is one cause whether it came as `torch.OutOfMemoryError` in a traceback, as
`CUDA error: out of memory` in a C++ `what():` line, or as a bare last line. The watchdog's output
reader and `trainguard diagnose` both read through `Scanner`: the first failure is the cause, later
ones are its consequences, and a failure the run went on from (steps logged after it: a caught
out-of-memory that the framework retried) is no failure of the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

CRASHED, KILLED, CUT_OFF, LAUNCH_FAILED = "crashed", "killed", "cut-off", "launch-failed"
STATES = (CRASHED, KILLED, CUT_OFF, LAUNCH_FAILED)


@dataclass(frozen=True)
class Signature:
    """One failure signature: a pattern on a line (or on an exception's "Type: message"), and its meaning."""

    cause: str
    """Kebab-case cause label, e.g. "cuda-out-of-memory" (a finding's `cause`)."""
    pattern: re.Pattern[str]
    state: str
    """crashed | killed | cut-off | launch-failed."""
    meaning: str
    """The cause in words, as a finding's summary continues after the quoted line."""
    fix: str
    lines: bool = True
    """Matched on any line of output; False: only on an exception's "Type: message" (a traceback's last line,
    or a bare exception line that ends the output), where its words are unambiguous."""
    weak: bool = False
    """A line that only says how a process ended (an exit code, `Killed`, `Aborted`): the cause only when no
    specific signature was seen, since it usually follows one (`Aborted` after a failed assertion)."""


def _re(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


# A shell's job-status line for a child that died of a signal: bash `train.sh: line 12: 4567 Killed    python
# train.py`, zsh `zsh: segmentation fault (core dumped)  python train.py`, an interactive shell's bare `Killed`.
# The word stands alone: at the line's end or before the command, which the shell pads with spaces.
def _shell(words: str) -> re.Pattern[str]:
    return re.compile(r"^(?:\S+:\s+)?(?:line \d+:\s+)?(?:\[\d+\]\s*[+-]?\s+)?(?:\d+\s+)?(?:" + words
                      + r")(?:\s+\(core dumped\))?(?:\s{2,}\S.*)?\s*$", re.IGNORECASE)


_OOM_FIX = ("Lower the batch size or sequence length (keep the effective batch with gradient accumulation), use "
            "activation checkpointing or bf16; in evaluation, wrap in torch.no_grad(); look for tensors kept across "
            "steps (a loss appended to a list without .item() or .detach()); PYTORCH_CUDA_ALLOC_CONF="
            "expandable_segments:True helps when reserved memory is much larger than allocated.")
_HOST_OOM_FIX = ("Reduce host memory: fewer DataLoader workers or a smaller prefetch_factor, memory-mapped datasets "
                 "instead of in-memory ones, no per-step history kept on the host; or give the job more memory.")
_SEGV_FIX = ("Run with PYTHONFAULTHANDLER=1 (or `python -X faulthandler`) to get the Python frames of the crash; "
             "then update, pin or rebuild the native extension those frames enter (a custom CUDA/C++ op, a "
             "library built against another torch or CUDA version).")
_SCHED_FIX = ("Save checkpoints often enough to lose little, and resume from the last one; ")

SIGNATURES: tuple[Signature, ...] = (
    # -- the GPU ---------------------------------------------------------------------------------------
    # "device-side assert triggered", not "device-side assert": every CUDA error torch raises ends with
    # "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions", an out-of-memory too. The
    # kernel's own line (`Loss.cu:250: ...: block: [0,0,0], thread: [5,0,0] Assertion `t >= 0 && t <
    # n_classes` failed.`) comes first and names the operation.
    Signature("cuda-device-assert", _re(r"device-side assert triggered|cudaErrorAssert"
                                        r"|\.cuh?:\d+: .*block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\].*Assertion"),
              CRASHED, "a CUDA kernel's own check failed on the device (a device-side assert)",
              "Most often an index out of range: a class label outside [0, classes) in cross_entropy or nll_loss, "
              "a token id past the embedding's vocabulary, an index past the end in gather, scatter or "
              "index_select. Kernels run asynchronously, so the Python line shown is where the error surfaced, "
              "not the operation that failed: the kernel's own line (`Assertion ... failed`, with the kernel's "
              "file, e.g. Loss.cu) names it. Check the inputs where they are made (`assert 0 <= y.min() and "
              "y.max() < classes` on the CPU), or rerun with CUDA_LAUNCH_BLOCKING=1 to stop at the failing call. "
              "The process cannot go on after it (the CUDA context is lost; under NCCL the process group's "
              "watchdog aborts it)."),
    Signature("cuda-out-of-memory", _re(
        r"OutOfMemoryError|CUDA out of memory|HIP out of memory|CUDA error: out of memory|CUDA_ERROR_OUT_OF_MEMORY"
        r"|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
        r"|\[CUDA ERROR\].*out of memory|CUDA (?:driver )?error\b.{0,80}\bout of memory"
        r"|RESOURCE_EXHAUSTED: Out of memory|OOM when allocating tensor"),
              CRASHED, "the GPU ran out of memory", _OOM_FIX),
    Signature("cuda-illegal-memory-access", _re(
        r"an illegal memory access was encountered|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS"
        r"|misaligned address|unspecified launch failure|an illegal instruction was encountered"),
              CRASHED, "a CUDA kernel accessed memory it does not own (an illegal memory access)",
              "A kernel read or wrote out of bounds: usually a custom CUDA/Triton kernel or extension, indices "
              "past a tensor's end, or a tensor used after it was freed (a non-contiguous view handed to a "
              "kernel that assumes contiguous memory). Rerun with CUDA_LAUNCH_BLOCKING=1 to find the call, and "
              "with `compute-sanitizer python train.py` to find the access; update the extension or the driver."),
    Signature("cudnn-error", _re(r"CUDNN_STATUS_(?!ALLOC_FAILED)[A-Z_]+|cuDNN error"),
              CRASHED, "cuDNN failed inside a convolution or RNN kernel",
              "CUDNN_STATUS_NOT_INITIALIZED and CUDNN_STATUS_INTERNAL_ERROR often mean the GPU's memory is "
              "nearly full or the cuDNN, CUDA and driver versions do not match: check nvidia-smi for other "
              "processes, install the torch build made for your CUDA; CUDNN_STATUS_NOT_SUPPORTED: an input "
              "shape or dtype the kernel does not handle (try torch.backends.cudnn.enabled = False to confirm)."),
    Signature("cublas-error", _re(r"CUBLAS_STATUS_(?!ALLOC_FAILED)[A-Z_]+"),
              CRASHED, "cuBLAS failed inside a matrix multiplication",
              "CUBLAS_STATUS_EXECUTION_FAILED and CUBLAS_STATUS_NOT_INITIALIZED usually follow an earlier CUDA "
              "error (an index out of range on the device, memory nearly full): rerun with CUDA_LAUNCH_BLOCKING=1 "
              "to find the first failing call; CUBLAS_STATUS_INVALID_VALUE: a shape or dtype the call does not "
              "accept (a half-precision matmul with odd dimensions, an empty tensor)."),
    # -- the collectives -------------------------------------------------------------------------------
    Signature("collective-timeout", _re(
        r"Watchdog caught collective operation timeout|[Gg]loo.*[Tt]imed? ?out"
        r"|Timed out waiting|[Tt]ime ?out waiting for NCCL|Connection closed by peer|DistNetworkError|NCCL timeout"
        r"|(?:collective|NCCL|all[-_ ]?reduce|all[-_ ]?gather|broadcast|barrier).{0,80}time(?:d)?[ -]?out"),
              CRASHED, "a collective (all-reduce, broadcast, barrier) did not complete across the ranks",
              "A rank never joined it (ranks took different branches, one crashed or hung first, uneven data gave "
              "one rank an extra step) or the network between ranks failed. Look at the other ranks' output first: "
              "the rank that did not arrive shows the cause. Make every rank call the same collectives in the same "
              "order; TORCH_DISTRIBUTED_DEBUG=DETAIL checks it; a longer `timeout=` in `init_process_group` only "
              "helps when a rank is merely slow (a long checkpoint on rank 0)."),
    Signature("nccl-error", _re(
        r"NCCL error|nccl\w*Error|NCCL communicator was aborted|NCCL watchdog thread terminated|DistBackendError"
        r"|NCCL WARN .*(?:failure|[Ee]rror)|ncclSystemError|ncclInternalError|ncclUnhandledCudaError"
        r"|ncclRemoteError|ncclInvalidUsage|Some NCCL operations have failed or timed out"),
              CRASHED, "NCCL, the library that moves tensors between GPUs, failed",
              "'unhandled system error' and 'remote process exited': a rank or the network between nodes went "
              "away (look for the first rank that failed and why); 'unhandled cuda error': a CUDA error on one GPU "
              "(an out-of-memory, an illegal access) reached NCCL; 'invalid usage': ranks called different "
              "collectives or used one GPU twice. Rerun with NCCL_DEBUG=INFO to see which rank and link failed; "
              "check that every node has the same NCCL and driver versions and that NCCL_SOCKET_IFNAME names a "
              "network the nodes share."),
    # -- host memory, data loading ---------------------------------------------------------------------
    Signature("dataloader-worker-killed", _re(
        r"DataLoader worker \(pid\(?s?\)? ?[\d, ]+\) (?:exited unexpectedly|is killed by signal)"
        r"|unable to write to file </torch_|No space left on device.*(?:shm|pymp)|Unexpected bus error encountered in worker"),
              CRASHED, "a DataLoader worker process died",
              "Usually the OOM killer (host memory: workers x prefetch_factor x batch size, or a dataset that caches "
              "in each worker) or a full /dev/shm (Docker's default is 64 MB: run with --shm-size=8g or --ipc=host). "
              "Lower num_workers or prefetch_factor, share read-only data instead of copying it per worker, or "
              "`torch.multiprocessing.set_sharing_strategy('file_system')`."),
    Signature("unpicklable-checkpoint", _re(r"Can't pickle|cannot pickle|PicklingError|Can't get local object"),
              CRASHED, "an object pickle cannot save was in the checkpoint",
              "The checkpoint holds an object pickle cannot save (a lambda, a local function, a lock, an open file, "
              "a generator). Save state_dicts and plain data, not live objects; move the offending function to "
              "module level. `trainguard preflight` saves a checkpoint in the first minute to catch this before "
              "hours pass."),
    Signature("host-out-of-memory", _re(
        r"DefaultCPUAllocator: can't allocate|\bMemoryError\b|Cannot allocate memory|std::bad_alloc"
        r"|Unable to allocate [\d.]+ [KMGT]i?B for an array"),
              CRASHED, "the host (CPU) ran out of memory", _HOST_OOM_FIX),
    # -- the kernel's OOM killer and the schedulers' memory limits ---------------------------------------
    Signature("oom-killer", _re(r"Out of memory: Kill(?:ed)? process|Memory cgroup out of memory|invoked oom-killer"
                                r"|\boom-kill:|\boom_reaper: reaped process|Killed process \d+ \(.*total-vm"),
              KILLED, "the kernel's OOM killer ended the process: the host ran out of memory", _HOST_OOM_FIX),
    Signature("job-memory-limit", _re(
        r"oom[-_]kill events?(?:\(s\))? in|Exceeded (?:job|step) memory limit|exceeded memory limit \(\d+ > \d+\), being killed"
        r"|task \d+: Out Of Memory|TERM_MEMLIMIT|job killed after reaching LSF memory usage limit"),
              KILLED, "the job scheduler killed the job for exceeding its memory request (the cgroup's OOM killer)",
              "Request more memory for the job (SLURM: #SBATCH --mem=64G or --mem-per-cpu; LSF: -M / rusage[mem=]), "
              "or use less: fewer DataLoader workers or a smaller prefetch_factor, memory-mapped datasets instead "
              "of in-memory ones; `sacct -j JOBID -o MaxRSS,ReqMem` shows how close it came."),
    # -- the job scheduler -----------------------------------------------------------------------------
    Signature("time-limit", _re(r"CANCELLED AT \S+ DUE TO TIME LIMIT|TERM_RUNLIMIT|job killed after reaching LSF run time"
                                r"|DUE TO TIME LIMIT \*\*\*"),
              CUT_OFF, "its job scheduler stopped it at the job's time limit",
              _SCHED_FIX + "ask for more time (SLURM: #SBATCH --time=; LSF: -W), or split the run into jobs that "
                           "each resume from the last checkpoint (SLURM: --signal=USR1@120 gives the script two "
                           "minutes to save before the limit)."),
    Signature("preempted", _re(r"CANCELLED AT \S+ DUE TO PREEMPTION|TERM_PREEMPT|DUE TO JOB REQUEUE"),
              CUT_OFF, "its job scheduler preempted it for a job of higher priority",
              _SCHED_FIX + "submit to a partition or QOS that is not preempted, or make the job requeue itself "
                           "(SLURM: --requeue) and resume from its last checkpoint."),
    Signature("node-failure", _re(r"CANCELLED AT \S+ DUE TO NODE FAILURE|UNCORRECTABLE MEMORY ERROR AT"
                                  r"|TERM_HOST"),
              CUT_OFF, "a node of the job failed (the scheduler lost it, or its hardware reported an error)",
              _SCHED_FIX + "resubmit (excluding the node: SLURM --exclude=HOST) and tell the cluster's "
                           "administrators which node and when (the scheduler's log says why it failed)."),
    Signature("cancelled", _re(r"\*\*\* (?:JOB|STEP) \S+ (?:ON \S+ )?CANCELLED AT \S+ \*\*\*|TERM_OWNER|TERM_ADMIN"
                               r"|job killed by (?:owner|root|LSF administrator)"),
              CUT_OFF, "the job was cancelled (scancel or bkill, by its owner or an administrator) while it ran",
              "If nobody cancelled it on purpose, ask the scheduler who did (`sacct -j JOBID -o State,Reason`); "
              "a job cancelled by a dependency or a wrapper's timeout shows it there. Resume from the last "
              "checkpoint."),
    # -- native code -----------------------------------------------------------------------------------
    Signature("teardown-abort", _re(r"terminate called without an active exception"),
              CRASHED, "it aborted as its process ended (std::terminate without an exception: a C++ thread still "
                       "running at teardown)",
              "The training itself may have finished: check its last step and that its outputs were written. Free "
              "the model and optimizer before `dist.destroy_process_group()` and join your own threads before the "
              "script exits."),
    Signature("native-exception", _re(r"terminate called after throwing an instance of|terminate called recursively"),
              CRASHED, "a C++ exception nobody caught ended the process (std::terminate, then abort)",
              "Its `what():` line says what failed; it was thrown on a thread of a native library (a DataLoader "
              "pin-memory thread, NCCL's watchdog, a custom extension), where Python cannot catch it. Fix the "
              "cause it names; run with TORCH_SHOW_CPP_STACKTRACES=1 for where it was thrown."),
    Signature("native-assert", _re(r"(?:^|: )Assertion [`'].*[`'] failed\.?$|: Assertion `.*' failed"),
              CRASHED, "a C/C++ assertion failed in native code (then the process aborted)",
              "The assertion names the broken condition and its source file: usually a native extension or "
              "library fed an input it does not handle (a shape, a dtype, a device, a size). Find the call that "
              "feeds it with PYTHONFAULTHANDLER=1, and check its inputs there."),
    Signature("segfault", _re(r"(?i:segmentation fault)|\bSIGSEGV\b|[Ss]ignal 11\b|segmentation violation"),
              CRASHED, "a segmentation fault in native code (a CUDA/C++ extension, a driver, a library)", _SEGV_FIX),
    Signature("bus-error", _re(r"Bus error|\bSIGBUS\b|[Ss]ignal 7\b"),
              CRASHED, "a bus error: memory that was mapped went away (most often a full /dev/shm)",
              "Give shared memory room (Docker: --shm-size=8g or --ipc=host; a job's /dev/shm is limited by its "
              "memory request), lower num_workers, or `torch.multiprocessing.set_sharing_strategy('file_system')`;"
              " a memory-mapped file truncated while in use does the same."),
    Signature("abort", _re(r"Fatal Python error: Aborted|\bSIGABRT\b|[Ss]ignal 6\b"),
              CRASHED, "the process aborted (SIGABRT): a native library gave up", _SEGV_FIX, weak=True),
    Signature("abort", _shell(r"Aborted|abort"),
              CRASHED, "the process aborted (SIGABRT): a native library gave up", _SEGV_FIX, weak=True),
    Signature("killed", _re(r"\bSIGKILL\b|[Ss]ignal 9\b"),
              KILLED, "it was killed (SIGKILL), most often by the kernel's OOM killer",
              "Check `dmesg` (as root) or the scheduler's record (`sacct -j JOBID -o State,MaxRSS,ReqMem`) for the "
              "OOM killer; if it was, reduce host memory (DataLoader workers x prefetch, dataset caching, leaks) "
              "or ask for more. Otherwise find who sent the signal.", weak=True),
    Signature("killed", _shell(r"Killed"),
              KILLED, "it was killed (SIGKILL), most often by the kernel's OOM killer",
              "Check `dmesg` (as root) or the scheduler's record (`sacct -j JOBID -o State,MaxRSS,ReqMem`) for the "
              "OOM killer; if it was, reduce host memory (DataLoader workers x prefetch, dataset caching, leaks) "
              "or ask for more. Otherwise find who sent the signal.", weak=True),
    Signature("terminated", _re(r"\bSIGTERM\b|[Ss]ignal 15\b|Received SIGTERM"),
              KILLED, "it was terminated (SIGTERM): a job scheduler's preemption or time limit, or a person",
              "Find who sent it (the scheduler's record of the job); make the script save a checkpoint on SIGTERM "
              "and resume from it.", weak=True),
    Signature("terminated", _shell(r"Terminated"),
              KILLED, "it was terminated (SIGTERM): a job scheduler's preemption or time limit, or a person",
              "Find who sent it (the scheduler's record of the job); make the script save a checkpoint on SIGTERM "
              "and resume from it.", weak=True),
    Signature("interrupted", _re(r"^(?:[\w.]+\.)?KeyboardInterrupt\b"),
              KILLED, "it was interrupted (Ctrl-C, SIGINT): a person, a notebook's stop button or a launcher stopped it",
              "Nothing in the code to fix: it was stopped on purpose; resume from its last checkpoint if it should go "
              "on. If nobody stopped it, find who sent SIGINT (a launcher tearing the job down).", weak=True,
              lines=False),  # a traceback's exception only: a line that merely names it is often a handler's
    # -- failed launches -------------------------------------------------------------------------------
    Signature("script-not-found", _re(r"can't open file .*\[Errno 2\] No such file or directory"
                                      r"|^(?:/bin/)?(?:ba|z|)sh: (?:line \d+: )?\S+: No such file or directory$"
                                      r"|^\S+: line \d+: \S+: No such file or directory$"),
              LAUNCH_FAILED, "the script or program to run does not exist at that path",
              "Check the path and the working directory the job starts in (a scheduler starts jobs in the "
              "submission directory unless told otherwise: SLURM --chdir); use an absolute path."),
    Signature("command-not-found", _re(r"(?:^|: )command not found$|: not found$|Exited with exit code 127\."),
              LAUNCH_FAILED, "the command to run was not found (exit code 127)",
              "Activate the environment that provides it before the command (conda activate, module load, the "
              "virtual environment's bin/ on PATH), or call it by its full path."),
    Signature("container-failed", _re(r"^FATAL:\s{2,}\S"),
              LAUNCH_FAILED, "the container (Singularity/Apptainer) failed to start",
              "Its FATAL line names what is missing: an image, an overlay or a bind path that does not exist on this "
              "node, or one another job holds open; fix the path or the bind (--bind), then launch again."),
    Signature("argparse-error", _re(r"^\S+\.py: error: (?:argument|unrecognized arguments|the following arguments"
                                    r"|invalid choice|one of the arguments)"),
              LAUNCH_FAILED, "the script refused its command line (argparse exits 2)",
              "Fix the argument the error names (see the usage text above it in the log) and launch again."),
    Signature("missing-module", _re(r"^(?:[\w.]+\.)?(?:ModuleNotFoundError|ImportError): |No module named [\"']"
                                    r"|cannot open shared object file"),
              LAUNCH_FAILED, "a module or shared library it imports is not installed in this environment",
              "Install it in the environment the job runs in (pip/conda), or activate that environment in the job "
              "script; for `libcudart.so.N` / `libnccl.so` errors, install the torch build made for the CUDA the "
              "machine has (or load the CUDA module)."),
    # -- Python errors whose type says the cause (matched on an exception's "Type: message") ------------
    Signature("device-mismatch", _re(r"Expected all tensors to be on the same device|Expected .* to be on the same "
                                     r"device|is on (?:cpu|cuda:?\d*).{0,40}(?:but|while).{0,40}is on"),
              CRASHED, "tensors on different devices met in one operation",
              "Move the model and every input to one device: `model.to(device)` before the optimizer is built, and "
              "each batch (and any tensor made inside forward, e.g. masks and position ids) with "
              "`.to(device)`; use `torch.zeros(..., device=x.device)` rather than a default-device tensor."),
    Signature("division-by-zero", _re(r"^(?:[\w.]+\.)?ZeroDivisionError\b"),
              CRASHED, "a division by zero (an empty batch, dataset or count)",
              "The divisor counts something that was zero: an empty dataset or split, a batch filtered to "
              "nothing, a metric over no samples. Check the count before dividing and say why it is empty (the "
              "data path, a filter, drop_last with a dataset smaller than a batch)."),
    Signature("disk-full", _re(r"No space left on device|Disk quota exceeded|\[Errno 28\]|\[Errno 122\]"),
              CRASHED, "the disk (or the user's quota) filled up while it wrote",
              "Free space or write elsewhere: keep fewer checkpoints (save_total_limit), write checkpoints and "
              "caches (HF_HOME, TMPDIR) to a filesystem with room, check `df -h` and `quota` for the paths."),
    Signature("permission-denied", _re(r"^(?:[\w.]+\.)?PermissionError\b|\[Errno 13\] Permission denied"),
              CRASHED, "it may not read or write a path it needs (permission denied)",
              "Write outputs, checkpoints and logs under a directory this user owns (the job's working or scratch "
              "directory), or fix the path's permissions; a path like /etc, /var/log or another user's home is "
              "usually a default left in a config."),
    Signature("file-not-found", _re(r"^(?:[\w.]+\.)?FileNotFoundError\b|\[Errno 2\] No such file or directory"),
              CRASHED, "a file it needs does not exist at that path",
              "The path is relative to the working directory the job runs in, or names a dataset, config or "
              "checkpoint not copied to this machine: check the path the error quotes, make it absolute, or "
              "create the file first."),
    Signature("assertion-failed", _re(r"^(?:[\w.]+\.)?AssertionError\b"), CRASHED,
              "a Python assert in the code failed",
              "The assert's line (and its message) states the condition the data or configuration broke; print the "
              "values it compares, and fix where they are made.", lines=False),
    Signature("dtype-mismatch", _re(r"RuntimeError: .*(?:must have the same dtype|expected scalar type|dtype)"),
              CRASHED, "tensors of different dtypes met outside autocast",
              "Tensors of different dtypes met outside autocast (e.g. an fp16 teacher against an fp32 projector). "
              "Use one dtype policy for training and evaluation alike: run evaluation under the same autocast "
              "context, or cast the module to the input's dtype.", lines=False),
    Signature("none-operand", _re(r"TypeError: .*(?:NoneType|'None')|AttributeError: 'NoneType' object"),
              CRASHED, "a value that is None on this path was used as a number or object",
              "A value that is None on this path was used as a number or object. The path (often evaluation) gets "
              "an argument the training path always passes, e.g. `step`. Pass it, or guard the use; run "
              "`trainguard preflight` to reach such paths in the first minute.", lines=False),
    Signature("cuda-error", _re(r"CUDA error: |CUDA driver version is insufficient|no kernel image is available"
                                r"|cudaError\w+|CUDA_ERROR_\w+"),
              CRASHED, "the CUDA runtime reported an error",
              "The message names it: 'no kernel image is available' or 'the provided PTX was compiled with an "
              "unsupported toolchain' means the torch build does not match this GPU or driver (install the build "
              "for your CUDA version); 'invalid device ordinal' a GPU index past those visible "
              "(CUDA_VISIBLE_DEVICES); 'uncorrectable ECC error' or 'unknown error' a failing GPU (nvidia-smi -q, "
              "dmesg for Xid). Errors are reported asynchronously: rerun with CUDA_LAUNCH_BLOCKING=1."),
)

# How a process ended, by signal number, as launchers and schedulers write it (`exitcode : -9`,
# `Signal 9 (SIGKILL) received by PID 42`, `died with <Signals.SIGSEGV: 11>`, `return code = -11`).
_BY_CAUSE = {s.cause: s for s in SIGNATURES}
BY_SIGNAL = {9: _BY_CAUSE["killed"], 11: _BY_CAUSE["segfault"], 6: _BY_CAUSE["abort"], 7: _BY_CAUSE["bus-error"],
             15: _BY_CAUSE["terminated"]}
# torchrun's summary (`exitcode  : -9 (pid: 123)`), its log (`failed (exitcode: -11) local_rank: 0`),
# deepspeed's launcher (`exits with return code = -9`), mp.spawn (`process 0 terminated with signal SIGKILL`),
# LSF's report (`Exited with exit code 1.`, `Exited with signal termination: Killed`)
_EXIT_LINE = re.compile(r"\bexitcode\s*:\s*(-?\d+)|\(exitcode: (-?\d+)\)|exits with return code = (-?\d+)"
                        r"|Exited with exit code (\d+)\.|terminated with signal (SIG[A-Z]+)|died with <Signals\.SIG\w+: (\d+)>"
                        r"|Exited with signal termination: (\w+)|Received (\d+) death signal")
_SIGNAL_NAMES = {"SIGKILL": 9, "KILLED": 9, "SIGSEGV": 11, "SEGMENTATION": 11, "SIGABRT": 6, "ABORTED": 6,
                 "SIGBUS": 7, "SIGTERM": 15, "TERMINATED": 15}
EXITED = Signature("exit-code", _re(r"$^"), CRASHED, "a process of the job exited with an error code",
                   "Its own output says why: look above the exit line for its last error (a traceback, a CUDA "
                   "error), or in the file its stderr went to.", weak=True)

# where a line's text starts: torch's `[rank3]:`, torchrun's `[default0]:`, a timestamp, a logging level,
# dmesg's `[12973.443102]`, mpirun's `0: `
_PREFIX = re.compile(r"^(?:\[(?:rank|default|trainer|worker)\d+\]:\s?|\[\s*\d+\.\d+\]\s*|\d{1,4}:\s(?=\S)"
                     r"|\[?\d{4}-\d\d-\d\d[ T][\d:.,]+\]?\s*(?:-\s*)?|\[?(?:INFO|WARNING|WARN|ERROR|CRITICAL)\]?"
                     r"(?:\s*[:\-]\s*|\s+)(?=\S)|E\d{4} [\d:.]+\s+\d+ \S+\]\s)")
# the last line of a traceback, or a bare one: `RuntimeError: ...`, `torch.cuda.OutOfMemoryError: ...`, `MemoryError`
EXCEPTION_LINE = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Fault))(?::\s?(?P<msg>.*))?$")
# cheap first test: a line with none of these words is no signature's nor an exception's (most lines of a log
# are metrics). Plain substring tests: a case-insensitive regex of the same words cost 15 us a line, more
# than the rest of the reader; these cost under 2.
_TOKENS = ("rror", "egmentation", "Kill", "kill", "emory", "FATAL", "CANCEL", "bort", "erminat", "ssert", "TERM_",
           "xit", "ignal", "SIG", "not found", "No such", "can't open", "oom", "NCCL", "CUDA", "CUBLAS", "CUDNN",
           "shared object", "xceeded", "Permission", "uota", "space left", "imeout", "imed out", "ime out",
           "Exception", "Interrupt", "ault", "llocate", "RESOURCE_EXHAUSTED", "OOM", "Traceback")


# a native logger's information or warning line (TensorFlow/absl's `W tensorflow/.../dso_loader.cc:55] ...`,
# glog's `W0530 12:00:00.000 42 file.cc:55] ...`): the program says it goes on (TensorFlow without the CUDA
# library it could not load falls back to the CPU and trains), so no failure signature is read from it
_NATIVE_NOTICE = re.compile(r"^:?\s*(?:[IW]\s+[\w/.\-]+\.(?:cc|cpp|cu|h|hpp):\d+\]|[IW]\d{4} [\d:.]+\s+\d+ \S+:\d+\])\s")


def _may_match(line: str) -> bool:
    return any(token in line for token in _TOKENS)


def strip_prefix(line: str) -> str:
    """The text of a line without the prefixes launchers and loggers put before it (at most three)."""
    text = line.strip()
    for _ in range(3):
        m = _PREFIX.match(text)
        if m is None or m.end() == 0:
            break
        text = text[m.end():].lstrip()
    return text


def signature_of(cause: str | None) -> Signature | None:
    """The catalogue's entry for a cause label, or None."""
    return _BY_CAUSE.get(cause) if cause else None


def classify(text: str, *, lines_only: bool = False) -> Signature | None:
    """The first signature whose pattern matches `text` (an exception's "Type: message", or a line)."""
    for sig in SIGNATURES:
        if (sig.lines or not lines_only) and sig.pattern.search(text):
            return sig
    return None


def match_line(line: str) -> Signature | None:
    """The signature a line of output shows, or None (a line that only says an exit code or a signal
    number resolves to that signal's signature)."""
    if not _may_match(line):
        return None
    text = strip_prefix(line)
    if not text or "closing signal" in text or _NATIVE_NOTICE.match(text):
        return None  # (torchrun's "Sending process 42 closing signal SIGTERM" stops the others: a consequence)
    sig = classify(text, lines_only=True)
    if sig is not None:
        return sig
    m = _EXIT_LINE.search(text)
    if m is None:
        return None
    code = next(g for g in m.groups() if g is not None)
    if code.lstrip("-").isdigit():
        if len(code) > 12:  # no exit code or signal has this many digits (int() refuses past 4,300 of them)
            return EXITED
        n = int(code)
        if m.group(6) or m.group(8):  # died with <Signals.SIGKILL: 9>, torchrun's "Received 15 death signal"
            return BY_SIGNAL.get(n, EXITED)
        if n < 0:
            return BY_SIGNAL.get(-n, EXITED)
        if n > 128 and m.group(4):  # LSF: 137 = 128 + SIGKILL
            return BY_SIGNAL.get(n - 128, EXITED)
        return EXITED if n > 0 else None
    n = _SIGNAL_NAMES.get(code.upper().rstrip(","), 0)
    return BY_SIGNAL.get(n, EXITED)


@dataclass
class Sighting:
    """A signature seen on one line."""

    signature: Signature
    lineno: int
    text: str
    """The line as printed (prefixes kept, clipped), for the finding to quote."""
    progress: int
    """Metric rows read before it: rows read after it mean the run went on."""
    after_completion: bool = False
    """The log had said the run completed before this line."""
    terminal: bool = False
    """The line says a process ended (a signal, an abort, a cut-off, a launch that failed), not only that an
    error was raised: rows printed after it were buffered output flushed at the end, or another process's."""

    @property
    def cause(self) -> str:
        return self.signature.cause

    @property
    def state(self) -> str:
        return self.signature.state


@dataclass
class Scanner:
    """Reads a process's output line by line and keeps the failures it shows (bounded: the first few).

    `feed` each line with the count of metric rows read so far; `outcome` at the end gives the first failure
    that ended the run, with the later ones as its consequences. A C++ `what():` line and a torchrun
    summary's fields are read with the line before them.
    """

    keep: int = 20
    sightings: list[Sighting] = field(default_factory=list)
    last_exception: tuple[int, str, int] | None = None
    """The last bare exception line (`KeyError: 'x'`) and where: the failure when it ends the output."""
    meaningful_after: int = 0
    """Lines with text after that exception line."""
    first_traceback_at: int | None = None
    """Where the first `Traceback (most recent call last):` began."""
    _terminate: Sighting | None = None
    completed_at: int | None = None
    """The first line at which the log said the run completed."""

    def _completed_after(self, s: Sighting) -> bool:
        return self._completed_after_line(s.lineno)

    def _completed_after_line(self, lineno: int) -> bool:
        return self.completed_at is not None and self.completed_at > lineno

    def feed(self, lineno: int, line: str, progress: int = 0, completed: bool = False) -> Sighting | None:
        if completed and self.completed_at is None:
            self.completed_at = lineno  # (the line before this one said it: fed before this line is read)
        if not _may_match(line) and self._terminate is None:
            if line.strip():
                self.meaningful_after += 1
            return None
        text = strip_prefix(line)
        if not text or POWERSHELL_WRAPPING.match(text):
            return None
        self.meaningful_after += 1
        if self.first_traceback_at is None and text.startswith("Traceback (most recent call last)"):
            self.first_traceback_at = lineno
        em = EXCEPTION_LINE.match(text) if ("rror" in text or "Exception" in text or "ault" in text
                                            or "Interrupt" in text or "xit" in text) else None
        if em is not None:
            self.last_exception, self.meaningful_after = (lineno, text, progress), 0
        if self._terminate is not None:
            # `terminate called after throwing an instance of 'c10::Error'` then `  what():  CUDA error: ...`
            pending, self._terminate = self._terminate, None
            if text.startswith("what():"):
                inner = classify(text[7:].strip(), lines_only=True)
                if inner is not None:
                    pending.signature = inner
                pending.text = f"{pending.text} / {text}"[:300]
        sig = match_line(text)
        if sig is None:
            return None
        # a process's end whatever follows, except a refused launch: training rows after it are a later launch
        # of the command, fixed and run again into the same file (it is judged like a crash: by the rows after)
        seen = Sighting(sig, lineno, line.strip()[:300], progress, after_completion=completed,
                        terminal=sig.cause in TERMINAL or sig.state not in (CRASHED, LAUNCH_FAILED))
        if sig.cause == "native-exception":
            self._terminate = seen
        if len(self.sightings) < self.keep:
            self.sightings.append(seen)
        return seen

    def outcome(self, progress: int, *, traceback: bool = False, rows_order: bool = True,
                completed: bool = False) -> list[Sighting]:
        """The failures that ended the run, the cause first: the first specific signature (or, with none,
        the first line that only says how a process ended; or, with neither and no traceback, a bare
        exception line that ends the output). Empty when the output shows none, or when the run went on
        after each: a completion line came after it, or (an error a program may catch and go on from, a
        CUDA out-of-memory that the framework retried) metric rows were logged after it. `rows_order=False`:
        the rows' order against the failure lines says nothing (stdout and stderr read from two pipes).
        `completed`: the log said the run completed (on its last line, when no line was fed after it)."""
        if completed and self.completed_at is None:
            self.completed_at = 1 << 62
        fatal = [s for s in self.sightings if not s.after_completion and not self._completed_after(s)
                 and (s.terminal or not rows_order or progress - s.progress < 2)]
        if not fatal and not traceback and self.last_exception is not None and self.meaningful_after <= 2 \
                and progress - self.last_exception[2] < 2 and not self._completed_after_line(self.last_exception[0]):
            lineno, text, before = self.last_exception
            sig = classify(text) or _python_exception(text)
            fatal = [Sighting(sig, lineno, text[:300], before)]
        strong = [s for s in fatal if not s.signature.weak]
        if strong:
            first = strong[0]
            return [first] + [s for s in fatal if s is not first]
        return fatal


# Windows PowerShell's rendering of a native command's stderr in a captured log (`python train.py 2>&1 |
# Tee-Object log.txt`): its first stderr line wrapped as an ErrorRecord (`+ CategoryInfo : NotSpecified: (...)
# [], RemoteException`, `+ FullyQualifiedErrorId : NativeCommandError`, `At line:1 char:1`), and each empty
# stderr line as the bare type name `System.Management.Automation.RemoteException`. PowerShell's wrapping of
# ordinary output, never the program's failure
POWERSHELL_WRAPPING = re.compile(r"^(?:System\.Management\.Automation\.RemoteException|\+ (?:CategoryInfo|"
                                 r"FullyQualifiedErrorId)\s*:.*|At line:\d+ char:\d+)$")

# signatures of a process's end (beyond those whose state is not `crashed`): nothing runs on after these
TERMINAL = frozenset({"segfault", "bus-error", "abort", "native-exception", "native-assert", "teardown-abort",
                      "exit-code"})


def _python_exception(text: str) -> Signature:
    """A bare exception line of no known signature: the program crashed with that exception."""
    m = EXCEPTION_LINE.match(text)
    name = m.group("type").rsplit(".", 1)[-1] if m else "exception"
    return Signature("", _re(r"$^"), CRASHED, f"it raised {name} (the output has no traceback for it)",
                     "Read the exception and fix the code that raised it; run the script so that its stderr is kept "
                     "(the traceback above the last line names the file and line).", weak=True)


def exception_of(text: str) -> tuple[str, str] | None:
    """("RuntimeError", "CUDA error: ...") of a bare exception line, or None."""
    m = EXCEPTION_LINE.match(strip_prefix(text))
    if m is None:
        return None
    return m.group("type").rsplit(".", 1)[-1], (m.group("msg") or "").strip()
