"""The replay's pruning bound: a rate no measurement of a bucket's ``SampledRate`` can exceed.

Why: at scale only buckets that can go over their quota are replayed (analytics/replay.py's
docstring derives the bound from quota/rate.py). These functions take values summed per time slot
and give, per group (a bucket), that bound; plain numpy, no Spark, so they are tested on their own.
"""

from __future__ import annotations

import math
from typing import Any

from quota.rate import QuotaWindow


def sliding_peaks(groups: Any, slots: Any, values: Any, span: int) -> dict[int, float]:
    """Per group, the largest sum of ``values`` over ``span`` consecutive slot indexes.

    Vectorised (numpy): rows sorted by (group, slot), prefix sums, and for each row the first row
    of its group no more than ``span - 1`` slots before it. Slots need not be distinct or dense.
    """
    import numpy as np

    g = np.asarray(groups, dtype=np.int64)
    if g.size == 0:
        return {}
    s = np.asarray(slots, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    order = np.lexsort((s, g))
    g, s, v = g[order], s[order] - s.min(), v[order]
    stride = int(s.max()) + span + 1  # keeps every search inside its own group
    key = g * stride + s
    csum = np.concatenate(([0.0], np.cumsum(v)))
    lo = np.searchsorted(key, key - (span - 1), side="left")
    hi = np.searchsorted(key, key, side="right")  # rows of the same slot count together
    sums = csum[hi] - csum[lo]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(g)) + 1))
    peaks = np.maximum.reduceat(sums, starts)
    return {int(k): float(p) for k, p in zip(g[starts], peaks, strict=True)}


def rate_bound(
    groups: Any,
    slots: Any,
    values: Any,
    window: QuotaWindow,
    slot_ms: float,
    steps: int = 8,
    shift_ms: float = 0.0,
) -> dict[int, float]:
    """Per group, a rate (per second) that no measurement of its SampledRate can exceed, given the
    values recorded per slot (slot index = floor(time / slot_ms)).

    Why (quota/rate.py): when measured at ``now``, the live samples started at s0 > now - num*size
    (older ones are purged) and hold only values recorded in [s0, now], and the window divided by
    is at least max(now - s0, (num - 1) * size, 1 ms). [s0, now] touches k consecutive slots with
    now - s0 > (k - 2) * slot_ms and k <= ceil(num * size / slot_ms) + 1. So the rate is at most
    max over k of (largest sum over k consecutive slots) / max((k - 2) * slot_ms, (num - 1) * size,
    1 ms). Taking values back (a throttled fetch) only lowers the truth.

    ``shift_ms``: the values were slotted by a time up to ``shift_ms`` before the one they were
    recorded at (a fetch slotted by its send, charged at its response). What was recorded in
    [s0, now] was then slotted in [s0 - shift, now]: k slots with now - s0 > (k - 2) * slot_ms -
    shift, k <= ceil((num * size + shift) / slot_ms) + 1, the same bound with those.
    """
    last = math.ceil((window.num * window.size_ms + shift_ms) / slot_ms - 1e-9) + 1
    floor_ms = max(window.max_value_factor_ms, 1.0)
    first = min(last, max(1, math.floor((floor_ms + shift_ms) / slot_ms + 1e-9) + 2))
    # Up to ``first`` every k has the floor as denominator; past it, check ``steps`` spans of k,
    # each at its largest k (the largest sum) over its smallest k's denominator: never below.
    checks = sorted({first, *(first + math.ceil((last - first) * i / steps) for i in range(1, steps + 1))})
    out: dict[int, float] = {}
    previous = 0
    for k in checks:
        smallest = previous + 1
        per_second = 1000.0 / max((smallest - 2) * slot_ms - shift_ms, floor_ms)
        for group, peak in sliding_peaks(groups, slots, values, k).items():
            out[group] = max(out.get(group, 0.0), peak * per_second)
        previous = k
    return out


def shifted_rate_bound(
    groups: Any, slots: Any, values: Any, shifts: Any, window: QuotaWindow, slot_ms: float
) -> dict[int, float]:
    """``rate_bound`` with each group's own shift: the largest of its rows' ``shifts`` (ms),
    rounded up to whole slots so that groups of the same rounded shift are bounded together."""
    import numpy as np

    g = np.asarray(groups, dtype=np.int64)
    if g.size == 0:
        return {}
    shift = np.nan_to_num(np.asarray(shifts, dtype=np.float64), nan=0.0)
    per_group = np.zeros(int(g.max()) + 1)
    np.maximum.at(per_group, g, shift)
    classes = np.ceil(per_group / slot_ms - 1e-9).astype(np.int64)
    row_class = classes[g]
    s, v = np.asarray(slots, dtype=np.int64), np.asarray(values, dtype=np.float64)
    out: dict[int, float] = {}
    for c in np.unique(row_class):
        mask = row_class == c
        out.update(rate_bound(g[mask], s[mask], v[mask], window, slot_ms, shift_ms=float(c) * slot_ms))
    return out
