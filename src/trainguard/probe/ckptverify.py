"""The probe's checkpoint verification, when no watchdog does it: each reported checkpoint is handed to a
verifier (checkpoints/verifier.py) whose child process reads it at low priority; the verdict becomes a
`checkpoint-check` event, which the probe's health rules (rules/checkpoints.py) turn into a finding.

Under `trainguard run` the watchdog verifies instead (watchdog/ckptwatch.py), outside the training
process; `TRAINGUARD_VERIFY=0` turns verification off. Made at the first reported checkpoint: a run that
saves none starts no thread.
"""

from __future__ import annotations

import os
from typing import Any

from trainguard.contract import ENV_VERIFY, ENV_WATCHDOG, EVENT_CHECKPOINT_CHECK

FINISH_WAIT = 60.0  # seconds `guard.finish()` waits for the last checkpoint's verification
EXIT_WAIT = 10.0  # ... and an interpreter exit without finish()


def enabled(environ: Any = os.environ) -> bool:
    return environ.get(ENV_VERIFY, "1") != "0" and not environ.get(ENV_WATCHDOG)


def make(writer: Any, selflog: Any, learning: bool) -> Any:
    """A verifier that records into this process's store."""
    from trainguard.checkpoints.verifier import Verifier

    def record(path: str, step: int | None, data: dict[str, Any]) -> None:
        writer.add_event(EVENT_CHECKPOINT_CHECK, path, data, step=step)

    return Verifier(record, learning=learning, log=selflog.write)
