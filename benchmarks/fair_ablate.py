"""`fair_overhead.py` with parts of the probe switched off in the guarded arm: a diagnosis of where its cost
comes from, not a figure of the product (the probe is changed in memory, for this process only).

    ABLATE=bg python benchmarks/fair_ablate.py --arm cpu --rounds 36 --out r.json

ABLATE holds any of: `bg` (the background thread idles: rows are never drained, stored or judged), `step`
(guard.step does nothing), `mem` (no memory samples on the training thread), `keep` (guard.step's values
detached by the caller), `opt` (the optimizer hooks, the contract checks' included, do nothing but count).
"""
import os
import runpy
import sys
from pathlib import Path

what = os.environ.get("ABLATE", "")
if "bg" in what:  # the background thread idles (rows never drained)
    import trainguard.probe.drain as dr
    def _loop(self):
        self.stopping.wait()
    dr.Drain._loop = _loop
if "step" in what:
    import trainguard.probe.steps as st
    st.StepRecorder.step = lambda self, *a, **k: None
if "mem" in what:
    import trainguard.probe.samples as sa
    sa.MemorySampler.on_step = lambda self, rec: None
if "keep" in what:  # detach the values guard.step keeps (references to graph-holding tensors)
    import trainguard.probe.steps as st
    orig = st.StepRecorder.step
    def step(self, loss, parts=None, weights=None):
        def d(v):
            return v.detach() if hasattr(v, "detach") else v

        return orig(self, d(loss), {k: d(v) for k, v in parts.items()} if parts else parts, weights)
    st.StepRecorder.step = step
if "opt" in what:
    import trainguard.probe.opthooks as oh
    oh.OptimizerHooks.pre = lambda self, *a: None
    def post(self, optimizer, args, kwargs):
        self.state.opt_steps += 1
    oh.OptimizerHooks.post = post
sys.argv = ["fair_overhead.py"] + sys.argv[1:]
runpy.run_path(str(Path(__file__).with_name("fair_overhead.py")), run_name="__main__")
