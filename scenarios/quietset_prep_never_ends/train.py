"""Hang twin of quietset_prep_after_banner: after the banner, data preparation never ends (it spins for
shards never counted). No proof in start-up that it cannot end: reported at the stall timeout (fixed at 4 s
here for CI, 300 s in start-up by default) within 15 s, stopped when the stall outlasts its limit.
"""
import torch  # noqa: F401

print("preparing data (tokenising the corpus) ...", flush=True)
shards_ready = 0
while shards_ready < 8: shards_ready += 0  # noqa: E701  the planted hang (one line: where it spins is one place)
