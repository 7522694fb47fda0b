"""Readers of other tools' logs: each turns what it finds into the event dicts the rules consume.

    from trainguard.ingest.detect import open_source
    source = open_source("train.log")        # or trainer_state.json, metrics.csv, an output folder...
    for event in source.events: ...           # the same dicts `RunReader.iter_events()` yields

A reader never knows the rules and the rules never know the reader (DESIGN.md: same rules online and
offline). What only a log can tell (a traceback, a missing end, PyTorch's own warnings) is collected in
`source.facts` while the events are read; `trainguard.ingest.diagnose` turns both into findings.
"""
