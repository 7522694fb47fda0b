"""The run folder: one SQLite store (WAL) plus status.json, the single source of truth of a run.

Writers: the probe (one `StoreWriter` per process) and the watchdog. Readers: everything else.
"""

from trainguard.store.paths import new_run_dir, resolve_run, runs_root
from trainguard.store.reader import RunReader
from trainguard.store.status import read_status, write_status
from trainguard.store.writer import StoreWriter

__all__ = ["RunReader", "StoreWriter", "new_run_dir", "read_status", "resolve_run", "runs_root", "write_status"]
