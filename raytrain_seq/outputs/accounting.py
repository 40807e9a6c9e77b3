"""Per-epoch accounting of the training videos the learners actually trained, checked against the plan.

Why: after faults and re-splits, "every training video trained exactly once per epoch" must be proven
from what the learners did, not assumed from the plan. Each learner sends, with each averaging round's
stats, the count, sum and sum of squares of the video ids of the rows it trained since its last round,
under per-epoch keys (``ids_e3_count`` ...). The averager sums round stats per learner only for the
rounds it averaged, so rows trained but lost with a killed learner (then re-trained by the new group)
count once, and rows of a learner dropped from a round do not count at all. ``per_epoch`` folds the
learners' totals back into ``{epoch: {count, sum, sumsq}}``; ``checksum`` gives the same triple for the
epoch's plan, so a missing, repeated or foreign id shows as a difference.

Trade-off: three numbers per epoch instead of the id lists keep the round payload and summary.json
small; a missing id and a repeated one could cancel in the count and the sum, but not also in the sum
of squares unless the ids are chosen to, which a fault does not do. Plain Python; no ray.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["checksum", "per_epoch", "round_stats"]

_KEY = re.compile(r"^ids_e(\d+)_(count|sum|sumsq)$")


def checksum(ids: Iterable[int]) -> dict[str, int]:
    """``{count, sum, sumsq}`` of video ids (each occurrence counts)."""
    values = [int(i) for i in ids]
    return {"count": len(values), "sum": sum(values), "sumsq": sum(v * v for v in values)}


def round_stats(epoch: int, ids: Iterable[int]) -> dict[str, float]:
    """A round's stats entries for the video ids trained in ``epoch`` since the last round (-1 = padding
    and filler slots, left out). Floats, as round stats are; exact below 2**53."""
    total = checksum(i for i in ids if int(i) >= 0)
    return {f"ids_e{int(epoch)}_{key}": float(value) for key, value in total.items()}


def per_epoch(learners: Mapping[Any, Mapping[str, float]]) -> dict[int, dict[str, int]]:
    """``{epoch: {count, sum, sumsq}}`` summed over the learners' round totals (the averager's summary)."""
    out: dict[int, dict[str, int]] = {}
    for totals in learners.values():
        for key, value in totals.items():
            match = _KEY.match(str(key))
            if match:
                entry = out.setdefault(int(match.group(1)), {"count": 0, "sum": 0, "sumsq": 0})
                entry[match.group(2)] += round(value)
    return dict(sorted(out.items()))
