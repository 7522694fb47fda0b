"""Hang twin of quietset_prep_after_banner: after the banner, the data preparation never ends (it waits,
spinning, for a shard count that is never reached). There is no proof in start-up that it cannot end, so
the stall is reported at the stall timeout and the run is stopped when it outlasts its limit.
"""
import torch  # noqa: F401

print("preparing data (tokenising the corpus) ...", flush=True)
shards_ready = 0
while shards_ready < 8:  # the planted hang: nothing ever increments it
    shards_ready += 0
