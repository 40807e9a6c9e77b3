"""Each step's CPU cost on the job's feed (``bench/refurbish.py``'s spread table), and two orders to set it beside.

Revamper keeps every step's CPU equal by giving each mini-batch the same share of fresh samples; the
job's mini-batches are packed blocks, so the feed composes its plan cache-aware and orders each
learner's blocks with ``rows.assembly.spread_fresh`` instead. Measured on the same videos:
- ``served_steps``: the job's own steps, ``BlockFeed``'s plans and shards (its tasks replaced by
  placeholders) for every epoch >= 1, cut into steps of ``batch`` blocks;
- ``unbalanced_steps``: the same plan without the cache-aware composition, by ``spread_fresh`` alone or
  in the plan's order;
- ``composed_steps``: the paper's ``RefurbishSchedule.compose`` mini-batches of as many videos.
A step's cost is the measured CPU of its fresh videos' partial augmentations
(``data.task_bodies.augment_videos``, thread CPU) plus its blocks' assembly and crop and flip (``RowCost``):
the work each step puts on the cluster, the quantity the paper keeps constant.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np
import torch

from raytrain_seq.algorithms.augment import final_augment_batch
from raytrain_seq.algorithms.packing import pack
from raytrain_seq.algorithms.refurbish import RefurbishSchedule
from raytrain_seq.config import Config
from raytrain_seq.data.geometry import Geometry
from raytrain_seq.data.sources import source_kwargs
from raytrain_seq.data.task_bodies import augment_videos
from raytrain_seq.parts import Parts
from raytrain_seq.rows.assembly import BlockSpec, EpochShard, assemble_rows, plan_specs, shard_items
from raytrain_seq.seeds import plan_seed

Step = tuple[int, tuple[BlockSpec, ...]]  # (epoch, the blocks of one learner's step)


def job_feed(config: Config, geometry: Geometry | None = None):
    """The job's ``BlockFeed`` in this process, its partial-augmentation tasks replaced by placeholders,
    and its geometry (``feed_geometry``: catalogs, t_max, max_sequences), which it was built from."""
    from raytrain_seq.runtime.feed import BlockFeed, feed_geometry

    geometry = geometry if geometry is not None else feed_geometry(config.data, warn=False)
    placeholders = lambda videos, epochs, renewal=None: [None for _ in videos]  # noqa: E731
    return BlockFeed(Parts.of(config).feed, geometry=geometry, launch=placeholders), geometry


def _cut(epoch: int, blocks: Sequence[BlockSpec], batch: int) -> list[Step]:
    """Full steps of ``batch`` blocks: 10 blocks at batch 4 -> blocks 0-3 and 4-7 (8-9 left out)."""
    return [(epoch, tuple(blocks[lo : lo + batch])) for lo in range(0, len(blocks) - batch + 1, batch)]


def served_steps(feed, epochs: int, world_size: int, batch: int) -> list[Step]:
    """Every learner's steps of epochs 1 .. epochs - 1 in the order the job's feed serves its blocks."""
    return [
        step
        for epoch in range(1, epochs)
        for rank in range(world_size)
        for step in _cut(epoch, feed.epoch_shard(epoch, rank, world_size).blocks, batch)
    ]


def unbalanced_steps(
    config: Config, geometry: Geometry, epochs: int, world_size: int, batch: int, *, spread: bool
) -> list[Step]:
    """The same epochs' steps from the feed's plan (``pack`` with the epoch's ``plan_seed``) WITHOUT the
    cache-aware composition (``assembly.cache_aware_plan``): each learner's blocks ordered by
    ``spread_fresh`` (``spread``: the job's feed before issue 44) or in the plan's order (no cache
    awareness at all)."""
    train = geometry.catalogs["train"]
    schedule = RefurbishSchedule(len(train), reuse=config.data.reuse, seed=config.data.seed)
    out = []
    for epoch in range(1, epochs):
        seed = plan_seed(config.data.seed, epoch)
        plan = pack(train.lengths, geometry.t_max, strategy=config.data.packing, seed=seed)
        fresh = schedule.is_fresh(epoch) if spread else None
        for blocks in plan_specs(plan, world_size, train.ids.tolist(), train.labels.tolist(), fresh):
            out += _cut(epoch, blocks, batch)
    return out


def composed_steps(config: Config, geometry: Geometry, epochs: int, videos_per_step: int) -> list[Step]:
    """Revamper's cache-aware mini-batches of ``videos_per_step`` videos (full ones) for epochs >= 1, each
    then packed on its own ("optimal", the run's t_max) into the blocks a learner would assemble."""
    train = geometry.catalogs["train"]
    ids, lengths = train.ids.tolist(), train.lengths.tolist()
    schedule = RefurbishSchedule(len(ids), reuse=config.data.reuse, seed=config.data.seed)
    out = []
    for epoch in range(1, epochs):
        for batch in schedule.compose(epoch, videos_per_step):
            if len(batch) < videos_per_step:
                continue
            plan = pack([lengths[i] for i in batch], geometry.t_max, strategy="optimal", seed=epoch)
            blocks = tuple(
                BlockSpec(ids=tuple(ids[batch[i]] for i in b.ids), starts=b.starts, lengths=b.lengths,
                          offsets=b.offsets, labels=(0,) * len(b.ids), plan_index=k)
                for k, b in enumerate(plan.blocks)
            )  # fmt: skip
            out.append((epoch, blocks))
    return out


def partial_costs(config: Config, ids: Sequence[int]) -> tuple[dict[int, float], dict[int, np.ndarray]]:
    """Per video, the CPU seconds of its partial augmentation (the feed task's body, epoch 1's draw,
    timed in this thread) and the array it made (what the cache holds and the rows are assembled from)."""
    data, source = config.data, source_kwargs(config.data)
    seconds, arrays = {}, {}
    for video in ids:
        began = time.thread_time()
        arrays[video] = augment_videos(
            source, [video], [1], data.seed, data.cache_size, data.augment_cost, data.augment_cost_per_frame
        )[0]
        seconds[video] = time.thread_time() - began
    return seconds, arrays


class RowCost:
    """CPU seconds of one block's row: ``assemble_rows`` as a learner's row stream runs it (uncropped, the
    crop drawn per sequence), then the learner's crop and flip (``final_augment_batch``); the least of
    ``repeats`` timings (other work on a shared machine only ever adds to one), kept per block layout
    (its lengths, starts and offsets: the videos in it do not change the work)."""

    def __init__(self, config: Config, arrays: dict, t_max: int, bound: int, repeats: int = 3) -> None:
        self._config, self._arrays, self._t_max, self._bound, self._repeats = (
            config,
            arrays,
            t_max,
            bound,
            repeats,
        )
        self._seconds: dict[tuple, float] = {}

    def __call__(self, block: BlockSpec) -> float:
        key = (block.lengths, block.starts, block.offsets)
        if key not in self._seconds:
            self._seconds[key] = min(self._time(block) for _ in range(self._repeats))
        return self._seconds[key]

    def _time(self, block: BlockSpec) -> float:
        c = self._config
        shard = EpochShard(
            split="train", epoch=1, rank=0, world_size=1, blocks=(block,), t_max=self._t_max,
            max_sequences=self._bound, crop=c.data.crop, channels=3, seed=c.data.seed, center=False,
            recomputed=0, reused=0, size=c.data.cache_size,
        )  # fmt: skip
        items = shard_items(shard)
        fmt = dataclasses.replace(shard.row_format, final_on_learner=True)
        began = time.thread_time()
        batch = {key: np.stack([item[key] for item in items]) for key in items[0]}
        rows = assemble_rows(batch, self._arrays, fmt)
        final_augment_batch(
            torch.from_numpy(rows["frames"]), starts=rows["starts"], lengths=rows["lengths"], tops=rows["tops"],
            lefts=rows["lefts"], flips=rows["flips"], crop=c.data.crop, flow=False,
        )  # fmt: skip
        return time.thread_time() - began


def step_costs(steps: Sequence[Step], partial: dict[int, float], row_cost, fresh_of) -> dict[str, np.ndarray]:
    """Per step: CPU seconds (its fresh videos' partial augmentations + ``row_cost`` of each of its blocks),
    fresh videos and videos. ``fresh_of(epoch)`` is the set of video ids recomputed in that epoch."""
    cpu, fresh, videos = [], [], []
    for epoch, blocks in steps:
        new = fresh_of(epoch)
        ids = [v for block in blocks for v in block.ids]
        cpu.append(sum(partial[v] for v in ids if v in new) + sum(row_cost(block) for block in blocks))
        fresh.append(sum(v in new for v in ids))
        videos.append(len(ids))
    return {"cpu": np.array(cpu), "fresh": np.array(fresh), "videos": np.array(videos)}


def spread(values: np.ndarray) -> dict[str, float]:
    """std/mean, p95/median and max/median of per-step CPU seconds ({} without steps)."""
    if values.size == 0 or values.mean() <= 0:
        return {}
    median = float(np.median(values))
    return {
        "cv": float(values.std() / values.mean()),
        "p95_median": float(np.percentile(values, 95) / median),
        "max_median": float(values.max() / median),
    }
