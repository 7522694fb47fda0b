"""Downsampling curves for plots without hiding what matters: spikes and non-finite values.

Plain striding (every k-th point) of a million-step loss drops a one-step spike with probability
1 - 1/k, and a NaN with it. Here the x range is cut into buckets and each bucket keeps its minimum and
its maximum (in step order), so every extreme survives; non-finite values are kept apart as markers,
at most one per bucket and kind, so a single NaN among a million steps is still drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

BUCKETS = 600  # per curve; a plot is about 900 px wide, so this is finer than a pixel pair


@dataclass
class Series:
    """A curve ready to draw: finite points, plus where the value was NaN or infinite."""

    name: str
    x: np.ndarray
    y: np.ndarray
    nan_x: np.ndarray = field(default_factory=lambda: np.zeros(0))
    inf_x: np.ndarray = field(default_factory=lambda: np.zeros(0))
    n_source: int = 0
    dashed: bool = False
    step_like: bool = False  # draw as steps (a planned schedule), not as a line
    mean_x: np.ndarray | None = None  # per-bucket means when downsampled: the trend inside the min/max band
    mean_y: np.ndarray | None = None

    @property
    def empty(self) -> bool:
        return len(self.x) == 0 and len(self.nan_x) == 0 and len(self.inf_x) == 0


def downsample(name: str, x: np.ndarray, y: np.ndarray, present: np.ndarray | None = None,
               buckets: int = BUCKETS) -> Series:
    """Min and max of each of `buckets` x-buckets, plus NaN/inf markers; small inputs pass unchanged."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if present is not None:
        x, y = x[present], y[present]
    n = len(x)
    if n and np.any(np.diff(x) < 0):  # restarts rewind the step; the plot wants step order
        order = np.argsort(x, kind="stable")
        x, y = x[order], y[order]
    finite = np.isfinite(y)
    fx, fy = x[finite], y[finite]
    bad_x, bad_y = x[~finite], y[~finite]
    nan_x = bad_x[np.isnan(bad_y)]
    inf_x = bad_x[np.isinf(bad_y)]
    if n == 0:
        return Series(name, fx, fy, nan_x, inf_x, n_source=0)
    lo, hi = float(x[0]), float(x[-1])
    mean_x = mean_y = None
    if len(fx) > 2 * buckets:
        mean_x, mean_y = _means(fx, fy, lo, hi, buckets)
        fx, fy = _min_max(fx, fy, lo, hi, buckets)
    nan_x = _one_per_bucket(nan_x, lo, hi, buckets)
    inf_x = _one_per_bucket(inf_x, lo, hi, buckets)
    return Series(name, fx, fy, nan_x, inf_x, n_source=n, mean_x=mean_x, mean_y=mean_y)


def _means(x: np.ndarray, y: np.ndarray, lo: float, hi: float, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    bucket = _bucket_of(x, lo, hi, buckets)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    counts = np.diff(np.r_[starts, len(x)])
    return np.add.reduceat(x, starts) / counts, np.add.reduceat(y, starts) / counts


def _bucket_of(x: np.ndarray, lo: float, hi: float, buckets: int) -> np.ndarray:
    width = (hi - lo) / buckets if hi > lo else 1.0
    return np.minimum(((x - lo) / width).astype(np.int64), buckets - 1)


def _min_max(x: np.ndarray, y: np.ndarray, lo: float, hi: float, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    # x is sorted, so each bucket is one contiguous run of indices: reduce each run in one pass
    bucket = _bucket_of(x, lo, hi, buckets)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    ids = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(x)]))
    lows = np.minimum.reduceat(y, starts)[ids]
    highs = np.maximum.reduceat(y, starts)[ids]
    at_low = np.flatnonzero(y == lows)
    at_high = np.flatnonzero(y == highs)
    first_low = at_low[np.r_[True, ids[at_low][1:] != ids[at_low][:-1]]]
    first_high = at_high[np.r_[True, ids[at_high][1:] != ids[at_high][:-1]]]
    keep = np.unique(np.concatenate([first_low, first_high, [0, len(x) - 1]]))
    return x[keep], y[keep]


def _one_per_bucket(x: np.ndarray, lo: float, hi: float, buckets: int) -> np.ndarray:
    if len(x) <= buckets:
        return x
    bucket = _bucket_of(x, lo, hi, buckets)
    first = np.r_[True, bucket[1:] != bucket[:-1]]
    return x[first]


def summary(values: np.ndarray) -> dict[str, float | int | None]:
    """first, last, min, max and the count of non-finite values, for the markdown tables."""
    finite = values[np.isfinite(values)]
    return {
        "first": float(finite[0]) if len(finite) else None,
        "last": float(finite[-1]) if len(finite) else None,
        "min": float(finite.min()) if len(finite) else None,
        "max": float(finite.max()) if len(finite) else None,
        "nonfinite": int(len(values) - len(finite)),
    }
