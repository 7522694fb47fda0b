"""Checkpoints verified while the run goes on: does the newest one load, hold finite values, and belong to
the step it claims? (issue 37)

    read.py      the child's side: open a checkpoint (a torch file, a safetensors file, a Hugging Face
                 folder, sharded index files) and return its facts: tensors, non-finite counts, the step it
                 claims, a fingerprint. Imports torch and safetensors; only ever runs in the child.
    verify.py    `python -m trainguard.checkpoints.verify PATH`: the child process (low priority, one
                 thread, no GPU), which prints the facts as one JSON line.
    judge.py     the facts, the step the run was at and the previous verified checkpoint -> a verdict
                 (verified, poisoned, unloadable, step-mismatch, unchanged, unverified). Pure.
    verifier.py  the parent's side: a thread that starts one child at a time, bounded in time and memory,
                 fail-open, and records each verdict as a `checkpoint-check` event.
    resume.py    which checkpoint a restart may resume from: the newest verified one.

The probe verifies the checkpoints its script reports when no watchdog runs; under `trainguard run` the
watchdog verifies them (and files it saw written that look like checkpoints), outside the training process.
"""
