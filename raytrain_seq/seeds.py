"""The run's random streams: one numpy generator per (purpose, key), all drawn from the run's seed.

Every random choice that must come out the same on any worker, after any restart or resume, draws from a
stream named here: a video's partial augmentation (its computing epoch), a sequence's final augmentation
(its epoch, plan block and slot), an epoch's packing plan. A stream is ``default_rng([seed, TAG, *key])``,
so two streams never share draws and none depends on what ran before it. numpy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FINAL_STREAM", "PARTIAL_STREAM", "PLAN_STREAM", "final_rng", "partial_rng", "plan_seed"]

# Stream tags of the run's random streams. Nonzero because numpy's SeedSequence drops trailing zeros:
# default_rng([seed, 0]) IS default_rng(seed), so a zero tag would alias another stream of the run.
PARTIAL_STREAM = 0x50415254  # "PART": partial augmentation of (video id, computing epoch)
FINAL_STREAM = 0x46494E4C  # "FINL": final augmentation of (epoch, plan block, slot)
PLAN_STREAM = 0x504C414E  # "PLAN": packing seed of an epoch (or of an evaluation split)


def partial_rng(seed: int, video_id: int, epoch: int) -> np.random.Generator:
    """Generator of the partial augmentation of ``video_id`` computed in ``epoch`` (its computing epoch)."""
    return np.random.default_rng([seed, PARTIAL_STREAM, video_id, epoch])


def final_rng(seed: int, epoch: int, plan_index: int, slot: int) -> np.random.Generator:
    """Generator of the final augmentation of sequence ``slot`` of block ``plan_index`` of ``epoch``.

    ``plan_index`` is the block's position in the epoch's plan (before sharding), so a sequence gets
    the same crop whatever the world size.
    """
    return np.random.default_rng([seed, FINAL_STREAM, epoch, plan_index, slot])


def plan_seed(seed: int, key: int) -> int:
    """A packing seed (int in [0, 2**62)) for epoch ``key``; evaluation splits use negative keys."""
    # SeedSequence entropy must be >= 0: key -1 (val) -> 2**32 - 1 keeps it distinct from every epoch.
    state = np.random.SeedSequence([seed, PLAN_STREAM, key % 2**32]).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(2))
