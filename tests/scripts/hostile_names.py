"""A run whose every name is an attack on the report page: loss parts, weights, eval metrics, a phase,
a checkpoint, the config, output lines and the crash message all carry HTML and Markdown payloads.

Torch-free on purpose (the probe takes plain floats), so it runs in a fraction of a second.
"""
import math

import trainguard

PAYLOADS = [
    '<script>console.error("pwned-script")</script>',
    '"><img src=x onerror="console.error(\'pwned-img\')">',
    "</title></svg><script>console.error('pwned-svg')</script>",
    "[click](javascript:console.error('pwned-link'))",
    "' onmouseover='console.error(1)' x='",
]
P0, P1, P2, P3, P4 = PAYLOADS

guard = trainguard.watch(total_steps=40, name=P1, config={P0: P1, "note": P3})
with guard.phase(P2):
    for step in range(1, 31):
        base = 2.0 * math.exp(-step / 20)
        w = 0.5 if step < 15 else 0.8  # a weight schedule, so the weights get a plot of their own
        guard.step(base, parts={P0: base * w, P1: base * (1 - w), P4: 0.1}, weights={P0: w, P1: 1 - w})
        guard.log(**{P2: step * 0.1, f"mem {P4}": 100.0 + step})  # a logged scalar and a "memory" one
        if step % 10 == 0:
            guard.eval(**{P1: base, P3: 1 - base / 3})
            guard.checkpoint_saved(f"ckpt-{P0}.pt")
        print(f"step {step} {P0} {P1}", flush=True)
raise ValueError(f"{P0} {P1} {P2}")
