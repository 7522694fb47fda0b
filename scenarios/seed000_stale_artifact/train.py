"""Seed 000, stale variant: the results file exists, but from an earlier run; this run never rewrote it."""
import os
import time

old = time.time() - 3600
if not os.path.exists("results.json"):
    open("results.json", "w").write("{}\n")
os.utime("results.json", (old, old))  # left over from yesterday's run
time.sleep(1.5)
print("Training complete", flush=True)
