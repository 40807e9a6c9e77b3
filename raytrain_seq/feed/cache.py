"""The refurbish cache's bookkeeping: which partial augmentation of each training video is current.

A cached copy is named by its video and its computing epoch (``partial_rng(seed, video, epoch)`` fixes its
bytes), so this module deals in plain ``(video id, computing epoch)`` keys and never holds an array or a
ref: the actor keeps its refs under these keys and drops every key ``live()`` no longer names. Epoch e
serves each video's copy computed in ``e - age(e)`` (``RefurbishSchedule``): each copy is reused r times,
and the renewals are balanced slices. ``missing(e)`` names the copies e still needs (launched, then
``record``ed as pending); ``activate(e)`` makes them current and keeps the newest ``keep`` epochs' maps for
the learners' reads (``keys``). A restarted feed asked for an epoch older than the newest it serves serves
it beside the newer one (``again``). Contract: an epoch's served map is a function of (ids, r, seed,
epoch) only, so a restart or a resume serves the same keys as the uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from raytrain_seq.algorithms.refurbish import RefurbishSchedule

__all__ = ["EpochNotServedError", "Key", "Launch", "RefurbishCache"]

Key = tuple[int, int | None]  # (video id, computing epoch; None: the evaluation cache)


class EpochNotServedError(ValueError):
    """Refs asked of an epoch the feed does not serve: not yet activated (``epoch_shard``), pruned, or
    the feed restarted since (its cache starts empty): the caller activates the epoch and asks again."""


@dataclass(frozen=True)
class Launch:
    """Partial augmentations to compute: ``videos`` in the learners' order, each for its computing epoch
    (None: evaluation) and, in training, ``renewal``: the epoch that recomputes it next (its copy leaves the
    cache then, so a task holds videos of one renewal epoch). ``epoch``: the served epoch (None: an
    evaluation split's); ``again``: a restarted feed's older epoch, served beside the newer one."""

    videos: tuple[int, ...]
    epochs: tuple[int | None, ...]
    renewal: tuple[int, ...] | None = None
    epoch: int | None = None
    again: bool = False

    def keys(self) -> list[Key]:
        """The cache keys of the launched copies, in order."""
        return list(zip(self.videos, self.epochs, strict=True))


class RefurbishCache:
    """Which copy of each training video is current, pending (launched for the next epoch) and served."""

    def __init__(self, train_ids: Sequence[int], schedule: RefurbishSchedule, keep: int) -> None:
        if len(train_ids) != schedule.num_samples:
            raise ValueError(f"{len(train_ids)} training ids for a schedule of {schedule.num_samples}")
        self._ids = [int(v) for v in train_ids]
        self._index = {video: k for k, video in enumerate(self._ids)}  # id -> schedule position
        self.schedule = schedule
        self.keep = keep
        self._current: dict[int, int] = {}  # video -> computing epoch of its copy, newest served epoch
        self._pending: dict[int, int] = {}  # the next epoch's recomputes, launched
        self._served: dict[int, dict[int, int]] = {}  # served epoch -> {video: computing epoch}

    def wanted(self, epoch: int) -> dict[int, int]:
        """Video id -> the computing epoch of the copy ``epoch`` serves (``epoch - age``)."""
        last = epoch - self.schedule.age(epoch)
        return dict(zip(self._ids, last.tolist(), strict=True))

    def renewal(self, videos: Sequence[int], epoch: int) -> list[int]:
        """The first epoch after ``epoch`` that recomputes each of ``videos``: when its copy leaves."""
        upcoming = np.full(len(self._ids), -1, dtype=np.int64)
        for later in range(epoch + self.schedule.reuse, epoch, -1):  # the earliest one is written last
            upcoming[self.schedule.is_fresh(later)] = later
        return [int(upcoming[self._index[v]]) for v in videos]

    @property
    def started(self) -> bool:
        """Whether an epoch was launched or served."""
        return bool(self._served or self._pending)

    @property
    def served_epochs(self) -> list[int]:
        return sorted(self._served)

    def is_older(self, epoch: int) -> bool:
        """Whether ``epoch`` is older than the newest served epoch."""
        return bool(self._served) and epoch < max(self._served)

    def missing(self, epoch: int, order: Sequence[int]) -> Launch:
        """The copies ``epoch`` needs that are neither current nor pending, in ``order``."""
        wanted = self.wanted(epoch)
        todo = [v for v in order if self._current.get(v) != wanted[v] and self._pending.get(v) != wanted[v]]
        return self._launch(todo, wanted, epoch, again=False)

    def again(self, epoch: int, order: Sequence[int]) -> Launch:
        """A restarted feed's older ``epoch``: the copies it needs that are not current, in ``order``."""
        wanted = self.wanted(epoch)
        todo = [v for v in order if self._current.get(v) != wanted[v]]
        return self._launch(todo, wanted, epoch, again=True)

    def _launch(self, todo: list[int], wanted: dict[int, int], epoch: int, *, again: bool) -> Launch:
        epochs = tuple(wanted[v] for v in todo)
        return Launch(tuple(todo), epochs, tuple(self.renewal(todo, epoch)), epoch, again)

    def record(self, launch: Launch) -> None:
        """``launch`` was started: the next epoch's copies are pending; an older epoch's is served."""
        if launch.again:
            self._served[launch.epoch] = self.wanted(launch.epoch)
            self._prune()
        else:
            self._pending.update(zip(launch.videos, launch.epochs, strict=True))

    def activate(self, epoch: int) -> int:
        """Make ``epoch`` the served epoch: its current copies are kept, its pending ones taken (every copy
        it needs was recorded); returns the copies recomputed."""
        current: dict[int, int] = {}
        recomputed = 0
        for video, want in self.wanted(epoch).items():
            if self._current.get(video) == want:
                current[video] = want
            else:
                current[video] = self._pending[video]
                recomputed += 1
        self._current, self._pending = current, {}
        self._served[epoch] = dict(current)
        self._prune()
        return recomputed

    def _prune(self) -> None:
        for old in sorted(self._served)[: -self.keep]:
            del self._served[old]

    def keys(self, ids: Sequence[int], epoch: int) -> list[Key]:
        """The keys of ``ids``' copies as served in ``epoch``; EpochNotServedError for an epoch not served
        (a restarted feed serves none until asked), ValueError for an id not in it."""
        table = self._served.get(epoch)
        if table is None:
            raise EpochNotServedError(
                f"epoch {epoch} is not served (served: {sorted(self._served)}): call epoch_shard({epoch}, "
                f"...) first; only the newest {self.keep} epochs are kept"
            )
        missing = [i for i in ids if i not in table]
        if missing:
            raise ValueError(
                f"video ids {missing[:5]} are not in the cache of epoch {epoch}: use a shard's ids"
            )
        return [(i, table[i]) for i in ids]

    def live(self) -> set[Key]:
        """Every key a current, pending or served copy has: the refs the actor must keep."""
        live = set(self._current.items()) | set(self._pending.items())
        for table in self._served.values():
            live.update(table.items())
        return live
