"""A learner's view of the feed actor: its model spec, its epochs' block rows, an evaluation split's rows.

``LearnerFeed`` runs in the learner's process (and in the evaluator and fusion): a persistent
``rows.stream.RowStream`` per learner borrows each epoch's cached arrays from the ``BlockFeed`` actor
(``runtime.feed``) in one call and assembles uint8 rows at the cache size, leaving the crop and flip to
the learner's device. While the feed actor restarts, calls are retried with bounded backoff, and rows
whose arrays the dead feed owned are borrowed again from the restarted one (it recomputes them with
the same seeds). The learner loop takes this object through its constructor, so tests hand it a fake.

``shard_dataset`` is the other view of a shard: a Ray Data dataset whose tasks assemble the rows with the
crop on the CPU, for a consumer that wants Ray Data (no runtime path uses it; the feed's tests read rows
through it).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from raytrain_seq.checks import check_number
from raytrain_seq.data.geometry import ModelSpec
from raytrain_seq.feed.cache import EpochNotServedError
from raytrain_seq.members.retry import Backoff
from raytrain_seq.rounds.position import parse_history
from raytrain_seq.rows.assembly import BlockRowStream, EpochShard, RowFormat, assemble_rows, shard_items
from raytrain_seq.rows.stream import EpochRows, RowStream
from raytrain_seq.runtime.feed import FeedUnavailableError
from raytrain_seq.runtime.partial_tasks import fetch_arrays

logger = logging.getLogger(__name__)

__all__ = ["FEED_BACKOFF", "LearnerFeed", "shard_dataset"]

# While Ray restarts a killed feed, its calls fail and the arrays it owned are lost: retried this long, at
# most a second apart (as the averager client's), so that a restarted feed is found at most a second
# after it takes calls again, however long its restart took.
FEED_BACKOFF = Backoff(base_s=0.25, cap_s=1.0, budget_s=120.0)


class LearnerFeed:
    """A learner's view of the feed actor: its model spec, the block rows of its epochs, and the rows of
    an evaluation split (the learner loop takes this object, so tests can hand it a fake).

    Training rows come from one persistent ``RowStream`` per learner: a thread in the learner's process
    asks the feed for each epoch's shard (block specs) and, in one call, the ObjectRefs of its cached
    arrays, then copies the arrays out of the object store into uint8 rows at the cache size; the crop
    and flip are left to the learner's device (``augment.final_augment_batch``). It runs ahead into the
    next epoch, so no epoch starts with a dataset's start-up; a learner that must start elsewhere (a
    realignment) gets a new stream at that position.
    """

    def __init__(
        self,
        handle: Any,
        *,
        epochs: int | None = None,
        blocks_per_batch: int = 4,
        depth: int = 4,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
        get: Callable[..., Any] | None = None,
    ) -> None:
        self.handle = handle
        # How objects are read: ray.get; an asyncio actor's thread passes runtime.off_loop.off_loop_get.
        self._get = get
        self._epochs = epochs
        if (
            isinstance(blocks_per_batch, bool)
            or not isinstance(blocks_per_batch, int)
            or blocks_per_batch < 1
        ):
            raise ValueError(f"blocks_per_batch must be an int >= 1, got {blocks_per_batch!r}: use e.g. 4")
        self._blocks_per_batch = blocks_per_batch
        self._depth = depth
        self._stream: RowStream | None = None
        self._where: tuple[int, int] | None = None  # the stream's (rank, world size)
        self._backoff = backoff or FEED_BACKOFF
        self._sleep = sleep
        self.recoveries = 0  # feed calls or reads that failed and succeeded again after a backoff

    def _retry(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``, retried with bounded backoff while the feed actor is down or its arrays are lost."""
        import ray.exceptions

        # EpochNotServedError: a feed restarted between a shard's epoch_shard and its refs serves no
        # epoch yet; the retry activates the epoch again (``_batches``).
        lost = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, EpochNotServedError)
        delays = self._backoff.delays()
        for attempt in range(len(delays) + 1):
            try:
                result = call()
            except lost as exc:
                if attempt == len(delays):
                    raise FeedUnavailableError(
                        f"the feed actor did not answer {what} after {attempt + 1} tries over "
                        f"{sum(delays):.0f} s (last error: {type(exc).__name__}): it died more than "
                        "train.feed_max_restarts times or its node is gone; raise train.feed_max_restarts "
                        "or look at the head node's log"
                    ) from exc
                logger.warning(
                    "feed: %s failed (%s); retrying in %.1f s", what, type(exc).__name__, delays[attempt]
                )
                self._sleep(delays[attempt])
                continue
            self.recoveries += attempt > 0
            return result
        raise AssertionError("unreachable: the loop returns or raises")

    def get(self, refs: Any) -> Any:
        """The objects of ``refs`` through the getter this feed was given (``ray.get`` by default)."""
        if self._get is not None:
            return self._get(refs)
        import ray

        return ray.get(refs)

    def model_spec(self) -> ModelSpec:
        return self._retry("model_spec", lambda: self.get(self.handle.model_spec.remote()))

    def _source(self, rank: int, world_size: int):
        def source(epoch: int, history: tuple, skip: int):
            def activate(read: int = 0):
                # A restarted feed recomputes the epoch from this learner's next block on first: the
                # shard's block ``skip + read`` (``read`` of the rest assembled).
                call = self.handle.epoch_shard.remote(
                    epoch, rank, world_size, history=history, from_block=skip + read
                )
                return self.get(call)

            full = self._retry(f"epoch_shard({epoch})", activate)
            # The first `skip` rows were trained (and averaged) before: only the rest is assembled.
            shard = dataclasses.replace(full, blocks=full.blocks[skip:])
            return len(full.blocks), self._batches(shard, activate)

        return source

    def _batches(self, shard: EpochShard, activate: Callable[..., Any]) -> Iterator[dict[str, np.ndarray]]:
        """The shard's rows; ``activate(read)`` makes the feed serve the shard's epoch (or split) again,
        which a restarted feed needs before it can lend refs: it then recomputes the arrays the dead one
        owned, from the shard's block ``read`` on first."""
        fmt = dataclasses.replace(shard.row_format, final_on_learner=True)
        items = shard_items(shard)

        def borrow(ids: list[int], again: bool, read: int = 0) -> dict[int, Any]:
            if again:
                activate(read)
            return dict(zip(ids, self.get(self.handle.refs.remote(ids, shard.epoch)), strict=True))

        # One actor call per epoch: the refs are borrowed for the whole shard, so a later epoch's cache
        # swap in the feed cannot take the arrays away from under this epoch.
        ids, first = shard.video_ids, [True]

        def borrow_all() -> dict[int, Any]:
            again, first[0] = not first[0], False  # a retry: the feed may have restarted since activate()
            return borrow(ids, again)

        refs = self._retry("refs", borrow_all) if ids else {}
        for lo in range(0, len(items), self._blocks_per_batch):
            part = items[lo : lo + self._blocks_per_batch]
            batch = {key: np.stack([item[key] for item in part]) for key in part[0]}
            need = sorted({i for item in part for i in item["ids"].tolist() if i >= 0})
            left = sorted({i for item in items[lo:] for i in item["ids"].tolist() if i >= 0})
            tries = [0]

            def read(need=need, left=left, tries=tries, at=lo) -> dict[int, np.ndarray]:
                # After a failure the feed restarted: borrow new refs for every row not assembled yet.
                if tries[0]:
                    refs.update(borrow(left, True, at))
                tries[0] += 1
                return dict(zip(need, fetch_arrays([refs[i] for i in need], get=self.get), strict=True))

            arrays = self._retry(f"the arrays of epoch {shard.epoch}", read) if need else {}
            yield assemble_rows(batch, arrays, fmt)

    def epoch_rows(
        self,
        epoch: int,
        rank: int,
        world_size: int,
        *,
        history: Sequence = (),
        skip: int = 0,
        ahead: bool = True,
    ) -> tuple[EpochRows | None, int]:
        """This learner's rows of ``epoch`` after the first ``skip`` (trained before a restart), and how
        many rows its shard has in all; the stream is None when nothing is left. ``ahead`` False: the next
        epoch is not read ahead (``RowStream.epoch_rows``)."""
        history = parse_history(history)
        # The stream reads the next epoch ahead with the rank and world size it was opened with: a group
        # that changed at an epoch's end (a learner joined or left there) needs a new one, or this learner
        # would train its old share (rank 0 of 1: every row) while the others train theirs.
        where = (rank, world_size)
        if self._stream is None or self._where != where or not self._stream.continues(epoch, history, skip):
            if self._stream is not None:
                self._stream.close()
            epochs = self._epochs if self._epochs is not None else epoch + 1
            self._stream = RowStream(
                self._source(rank, world_size), epoch=epoch, epochs=epochs, history=history, skip=skip,
                depth=self._depth,
            )  # fmt: skip
            self._where = where
        view, rows = self._stream.epoch_rows(epoch, ahead=ahead)
        if skip >= rows:
            view.take(1)  # nothing left: read the epoch's end, so the stream goes on to the next epoch
            return None, rows
        return view, rows

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def eval_rows(
        self, split: str, rank: int = 0, world_size: int = 1, *, uncropped: bool = False
    ) -> BlockRowStream:
        """The rows of learner ``rank``'s share of the ``split`` ("val" or "test") evaluation blocks (all of
        them by default), centre-cropped, assembled here like the training rows (a Ray Data dataset would
        pay its start-up for a copy and a crop). ``uncropped``: the cached frames whole, for multi-view
        testing (``evaluation.evaluate(views=...)`` cuts the views on the learner's device)."""

        def activate():
            return self.get(self.handle.eval_shard.remote(split, rank, world_size))

        return self.rows_of(self._retry(f"eval_shard({split!r})", activate), uncropped=uncropped)

    def rows_of(self, shard: EpochShard, *, uncropped: bool = False) -> BlockRowStream:
        """The rows of an evaluation ``shard`` (``feed.eval_shard``), centre-cropped or ``uncropped``."""

        # A restarted feed serves the split again (all of it, ``read`` aside) before it lends refs.
        def activate(read: int = 0):
            return self.get(self.handle.eval_shard.remote(shard.split, shard.rank, shard.world_size))

        if uncropped:
            shard = dataclasses.replace(shard, center=False)
        return BlockRowStream(_Batches(self._batches(shard, activate)))


class _Batches:
    """An iterator of row batches in the shape ``BlockRowStream`` reads (Ray Data's ``iter_batches``)."""

    def __init__(self, batches: Iterator[dict[str, np.ndarray]]) -> None:
        self._batches = batches

    def iter_batches(self, **_: Any) -> Iterator[dict[str, np.ndarray]]:
        return self._batches


def _assemble_batch(batch: dict[str, np.ndarray], feed, fmt: RowFormat) -> dict[str, np.ndarray]:
    """map_batches UDF: borrow the cached arrays from the feed, then assemble the rows."""
    import ray

    ids = np.unique(batch["ids"][batch["ids"] >= 0]).tolist()
    arrays = (
        dict(zip(ids, fetch_arrays(ray.get(feed.refs.remote(ids, fmt.epoch))), strict=True)) if ids else {}
    )
    return assemble_rows(batch, arrays, fmt)


def shard_dataset(shard: EpochShard, feed, *, batch_size: int = 8, num_cpus: float = 1.0):
    """The learner's ``ray.data.Dataset`` of block rows for ``shard``, in the shard's block order.

    ``batch_size`` blocks are assembled per task: each Ray Data task has a fixed start-up cost, so a
    few blocks a task amortise it while keeping the first rows close.
    ``preserve_order`` is set in this dataset's own DataContext so the cache-aware order survives.
    """
    import ray
    from ray.data import DataContext

    if not isinstance(shard, EpochShard):
        raise TypeError(
            f"shard_dataset needs an EpochShard from feed.epoch_shard, got {type(shard).__name__}"
        )
    check_number("batch_size", batch_size, 1)  # blocks assembled per Ray Data task
    context = DataContext.get_current().copy()
    context.execution_options.preserve_order = True
    with DataContext.current(context):
        items = ray.data.from_items(
            shard_items(shard), override_num_blocks=max(1, math.ceil(len(shard.blocks) / batch_size))
        )
        return items.map_batches(
            _assemble_batch,
            fn_kwargs={"feed": feed, "fmt": shard.row_format},
            batch_size=batch_size,
            batch_format="numpy",
            num_cpus=num_cpus,
        )
