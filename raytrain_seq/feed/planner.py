"""The feed's planner: the decisions of ``runtime.feed.BlockFeed``, in plain values and without Ray.

It says which partial augmentations to launch and when (``prefetch``, ``again``, ``eval_launch``: a
``Launch`` of video ids and computing epochs), is told what was launched (``launched``), serves an epoch
(``activate``), and answers which rows each learner reads (``train_shard``, ``eval_shard``: ``EpochShard``
block specs) and which cached copies a learner's ids name (``keys``: ``(video, computing epoch)``; the
actor keeps its refs under them and drops every key ``live()`` no longer names). It holds ids, epochs,
plans and counters, never an object ref. Contract: the shards, the launches and the keys are functions
of the config, the geometry and the calls, so two planners of one seed agree, and a restarted one
(``restarted=True``: nothing cached) serves every epoch the same rows from the same computing epochs;
what it recomputes for a learner that asks from inside an epoch comes from that learner's block on first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_seq.algorithms.refurbish import RefurbishSchedule
from raytrain_seq.data.geometry import Geometry, ModelSpec
from raytrain_seq.feed.cache import Key, Launch, RefurbishCache
from raytrain_seq.feed.plans import EVAL_KEYS, SPLITS, FeedPlans
from raytrain_seq.feed.report import EpochCounts, FeedFacts, FeedTally, RestartLog
from raytrain_seq.outputs.reports import FeedReport
from raytrain_seq.parts import FeedSettings
from raytrain_seq.rows.assembly import BlockSpec, EpochShard, consumption_order

__all__ = ["FeedPlanner", "check_int", "check_rank"]


def check_int(value: Any, name: str, minimum: int, fix: str) -> int:
    """``value`` as an int >= ``minimum``; ValueError naming it and the fix."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}: {fix}")
    return int(value)


def check_rank(rank: Any, world_size: Any) -> tuple[int, int]:
    """``(rank, world_size)`` checked: ints, world size >= 1, rank in 0 .. world_size - 1."""
    world_size = check_int(world_size, "world_size", 1, "pass the number of learners")
    rank = check_int(rank, "rank", 0, f"pass a rank in 0..{world_size - 1}")
    if rank >= world_size:
        raise ValueError(f"rank {rank} >= world_size {world_size}: pass a rank in 0..{world_size - 1}")
    return rank, world_size


class FeedPlanner:
    """Plans, the refurbish cache's bookkeeping, the evaluation splits, the counters and the restart log
    of one feed process (``restarted``: Ray restarted it, so nothing it had is cached)."""

    def __init__(
        self, settings: FeedSettings, geometry: Geometry, *, keep: int, restarted: bool = False
    ) -> None:
        self._settings = settings
        self.t_max, self.max_sequences = geometry.t_max, geometry.max_sequences
        self.channels = geometry.channels
        self._class_names = list(geometry.class_names)
        catalogs = geometry.catalogs
        train = catalogs["train"]
        # Video id -> cached frames (the catalog length), every split: sizes the objects tasks return.
        self.frames = {
            int(v): int(n)
            for split in SPLITS
            for v, n in zip(catalogs[split].ids, catalogs[split].lengths, strict=True)
        }
        self._kept_frames = int(train.lengths.sum())
        data = settings.data
        schedule = RefurbishSchedule(len(train), reuse=data.reuse, seed=data.seed)
        self.cache = RefurbishCache(train.ids.tolist(), schedule, keep)
        self.plans = FeedPlans(
            catalogs, self.t_max, packing=data.packing, eval_strategy=geometry.eval_strategy, seed=data.seed,
            schedule=schedule, keep=keep,
        )  # fmt: skip
        self._eval_videos = {split: catalogs[split].ids.tolist() for split in EVAL_KEYS}
        self._eval_ids: set[int] = set()
        self.tally = FeedTally(
            FeedFacts(
                videos={split: len(catalogs[split]) for split in SPLITS}, skipped=tuple(geometry.skipped),
                flow_method=geometry.flow_method, flow_once=data.stream == "flow", t_max=self.t_max,
                max_sequences=self.max_sequences, reuse=data.reuse,
            )
        )  # fmt: skip
        self.restarted = restarted

    # ---------------------------------------------------------------------------- training epochs
    @property
    def fresh(self) -> bool:
        """Whether nothing was launched or served yet and the process is no restart: ``start`` may launch."""
        return not (self.cache.started or self.restarted)

    def prefetch(self, epoch: int, world_size: int, first: Sequence[int] = ()) -> Launch | None:
        """The recompute ``epoch`` will need, in its learners' order after ``first`` (``upcoming``); None
        once it is served."""
        if epoch in self.cache.served_epochs:
            return None
        return self.cache.missing(epoch, _first(first, self.plans.order(epoch, world_size)))

    def upcoming(self, epoch: int, world_size: int, history: tuple, block: int) -> list[int]:
        """The videos of the layout of ``world_size`` learners (after ``history``'s) from each learner's
        block ``block`` on, in the order they need them: what a learner reading its block ``block`` after
        a restart needs first. Its layout's learners step together (a round's K steps each, B blocks a
        step), so its block stands for all of theirs: with 2 learners of 6 blocks and ``block`` 4, blocks
        4 and 5 of both, in ``consumption_order``."""
        specs = self.plans.plan(epoch, world_size, history)[1]
        return consumption_order([rank_specs[block:] for rank_specs in specs])

    def serving(self, epoch: int) -> str:
        """How ``epoch`` is served: "served" (already), "again" (a restarted feed's older epoch, beside the
        newer) or "next"; ValueError for an older epoch otherwise (its learners lag too far)."""
        if epoch in self.cache.served_epochs:
            return "served"
        if self.cache.is_older(epoch):
            if self.restarted:
                return "again"
            # Serving an older epoch again would overwrite the newer epochs' cache under their learners.
            raise ValueError(
                f"epoch {epoch} is older than the served epochs {self.cache.served_epochs}: learners must not "
                f"lag more than {self.cache.keep - 1} epoch(s) behind; raise keep_epochs or restart the feed "
                "to resume"
            )
        return "next"

    def again(self, epoch: int, world_size: int, first: Sequence[int] = ()) -> Launch:
        """A restarted feed's older ``epoch``: the copies not cached, launched on their own, ``first``'s
        first."""
        return self.cache.again(epoch, _first(first, self.plans.order(epoch, world_size)))

    def launched(self, launch: Launch, world_size: int | None = None) -> None:
        """``launch`` was started (``world_size``: the group an ``again`` launch serves)."""
        if launch.epoch is None:
            self._eval_ids.update(launch.videos)
            return
        self.cache.record(launch)
        if launch.again:
            counts = self._counts(launch.epoch, world_size, len(launch.videos))
            self.tally.epochs.setdefault(launch.epoch, counts)

    def activate(self, epoch: int, world_size: int) -> EpochCounts:
        """Serve ``epoch`` (its copies launched already): current copies kept, pending ones taken."""
        counts = self._counts(epoch, world_size, self.cache.activate(epoch))
        self.tally.epochs[epoch] = counts
        return counts

    def _counts(self, epoch: int, world_size: int, recomputed: int) -> EpochCounts:
        stats = self.plans.packing_stats(epoch, world_size)
        return EpochCounts.of(recomputed, self.cache.schedule.num_samples, self._kept_frames, stats)

    def train_shard(self, epoch: int, rank: int, world_size: int, history: tuple = ()) -> EpochShard:
        """Learner ``rank``'s blocks of the served ``epoch`` under ``history``'s layouts."""
        specs = self.plans.plan(epoch, world_size, history)[1][rank]
        counts = self.tally.epochs[epoch]
        return self._shard("train", epoch, rank, world_size, specs, counts.recomputed, counts.reused)

    # ---------------------------------------------------------------------------- evaluation splits
    def eval_launch(self, split: str) -> Launch | None:
        """Pack ``split`` and name its videos' one copy each (epoch None), once; None after the first."""
        if not self.plans.pack_eval(split):
            return None
        videos = tuple(self._eval_videos[split])
        return Launch(videos, (None,) * len(videos))

    def eval_shard(self, split: str, rank: int, world_size: int) -> EpochShard:
        """Learner ``rank``'s blocks of the packed ``split``: centre crop, no flip."""
        specs = self.plans.eval_specs(split, world_size)[rank]
        return self._shard(split, None, rank, world_size, specs, len(self._eval_videos[split]), 0)

    def _shard(
        self, split: str, epoch: int | None, rank: int, world_size: int, specs: Sequence[BlockSpec],
        recomputed: int, reused: int,
    ) -> EpochShard:  # fmt: skip
        data = self._settings.data
        return EpochShard(
            split=split, epoch=epoch, rank=rank, world_size=world_size, blocks=tuple(specs), t_max=self.t_max,
            max_sequences=self.max_sequences, crop=data.crop, channels=self.channels, seed=data.seed,
            center=epoch is None, recomputed=recomputed, reused=reused, size=data.cache_size,
        )  # fmt: skip

    # ---------------------------------------------------------------------------- reads and reports
    def keys(self, ids: Sequence[int], epoch: int | None) -> list[Key]:
        """The cache keys of ``ids`` as served in ``epoch`` (None: the evaluation cache)."""
        if epoch is not None:
            return self.cache.keys(ids, epoch)
        missing = [i for i in ids if i not in self._eval_ids]
        if missing:
            raise ValueError(f"video ids {missing[:5]} are not in the cache of epoch None: use a shard's ids")
        return [(i, None) for i in ids]

    def live(self) -> set[Key]:
        """The training keys whose refs the actor keeps (evaluation keys are kept for the run)."""
        return self.cache.live()

    def model_spec(self) -> ModelSpec:
        """What the learners' model must take."""
        return ModelSpec(
            num_classes=len(self._class_names),
            in_channels=self.channels,
            class_names=tuple(self._class_names),
        )

    def report(
        self, infos: Sequence[dict[str, Any]], *, ids: bool, tasks_pending: int, actor_cpu_s: float
    ) -> FeedReport:
        """``stats()``'s report, the finished tasks' ``infos`` added to the counters."""
        self.tally.add(infos)
        log = self.restart_log()
        restarts = log.read() if log is not None else []
        return self.tally.report(
            ids=ids, tasks_pending=tasks_pending, actor_cpu_s=actor_cpu_s, restarts=restarts
        )

    def restart_log(self) -> RestartLog | None:
        """The run's restart log in its run folder; None for a config with no run name (a feed a test or a
        bench starts outside a run has no folder, so its restarts are only logged)."""
        if self._settings.run_dir is None:
            return None
        return RestartLog(Path(self._settings.run_dir))


def _first(first: Sequence[int], order: Sequence[int]) -> list[int]:
    """``order`` with the videos of ``first`` moved ahead, in ``first``'s order: [5, 2] first in
    [1, 2, 3, 5] gives [5, 2, 1, 3]."""
    if not first:
        return list(order)
    ahead = dict.fromkeys(first)
    return [*ahead, *(video for video in order if video not in ahead)]
