#!/bin/sh
# A new user's DDP job over NCCL on 2 GPUs, under `trainguard run`: the bug (a `dist.barrier()` under
# `if rank == 0:`) with a 20 s stall timeout, then the same job without it at the defaults.
#   sh benchmarks/newuser_nccl/run.sh OUT_FOLDER      (from the repository root, 2 CUDA GPUs)
# Writes bug_run.txt, bug_status.txt, healthy_run.txt, healthy_status.txt into OUT_FOLDER.
OUT=${1:?an output folder}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src" OUT_DIR=/tmp/newuser_out
TG="python3 -m trainguard"
L="python3 -m torch.distributed.run --standalone --nproc_per_node=2"
timeout 170 $TG run --run-dir /tmp/runs/bug --stall-timeout 20 -- $L benchmarks/newuser_nccl/train.py --bug > "$OUT/bug_run.txt" 2>&1
echo "EXIT=$?" >> "$OUT/bug_run.txt"
$TG status /tmp/runs/bug > "$OUT/bug_status.txt" 2>&1
timeout 200 $TG run --run-dir /tmp/runs/healthy -- $L benchmarks/newuser_nccl/train.py > "$OUT/healthy_run.txt" 2>&1
echo "EXIT=$?" >> "$OUT/healthy_run.txt"
$TG status /tmp/runs/healthy > "$OUT/healthy_status.txt" 2>&1
