"""A learner's persistent row stream: one producer thread walks the epochs ahead of training.

A dataset per epoch would put task start-up on every epoch's critical path. ``RowStream`` is started
once, at a position (epoch, layout history, rows already trained), and produces the rows of that epoch
and every later one, in order, into a bounded queue; the learner opens one ``EpochRows`` view per epoch
and takes any number of rows at a time (B may grow between rounds). Rows come from an injected
``source(epoch, history, skip) -> (rows in the shard, iterator of row batches)``
(``runtime.learner_feed.LearnerFeed`` in a run); plans are pure functions of the epoch, so the producer
runs up to one epoch ahead (the feed keeps two epochs' caches) and ``depth`` batches ahead within one.
A stream only continues straight on; a learner realigned elsewhere closes it and starts another
(``continues(epoch, history, skip)`` says whether it can serve a position). A producer's error is raised
in the consumer's ``take``, never dropped. Nothing here imports ray.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from raytrain_seq.rows.assembly import RowBuffer

logger = logging.getLogger(__name__)

__all__ = ["EpochRows", "RowStream", "Source"]

Source = Callable[[int, tuple[tuple[int, int], ...], int], tuple[int, Iterator[Mapping[str, np.ndarray]]]]

_POLL_S = 0.1  # how often a blocked producer looks at the stop flag
_CLOSE_WAIT_S = 5 * _POLL_S  # a producer between rows sees the stop flag well within this


class EpochRows(RowBuffer):
    """One epoch of a ``RowStream``: ``take(n)`` -> the next n rows (fewer at the end), None when done.

    ``wait_seconds`` is the time the consumer was blocked on the producer (the learner's data wait);
    ``rows`` and ``frames`` (useful frames, padding excluded) what it took.
    """

    def __init__(self, stream: RowStream, epoch: int) -> None:
        super().__init__()
        self._stream, self.epoch = stream, epoch

    def _pull(self) -> None:
        began = time.perf_counter()
        try:
            kind, payload = self._stream.get()
        finally:
            self.wait_seconds += time.perf_counter() - began
        if kind == "end":
            self.done = True
            self._stream.ended(self.epoch)
        elif kind == "rows":
            self._append(payload)
        else:
            raise RuntimeError(f"row stream: {kind!r} inside epoch {self.epoch}: the producer lost its order")


class RowStream:
    """Rows of every epoch from ``epoch`` (its first ``skip`` rows under ``history`` left out) to
    ``epochs - 1``, produced by one thread into a queue of at most ``depth`` batches."""

    def __init__(
        self,
        source: Source,
        *,
        epoch: int,
        epochs: int,
        history: tuple = (),
        skip: int = 0,
        depth: int = 4,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}: queue e.g. 4 batches")
        self._source = source
        self._start = (int(epoch), tuple(history), int(skip))
        self._epochs = int(epochs)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._gate = threading.Condition()
        self._opened = int(epoch) - 1  # the newest epoch the consumer opened
        self._next: tuple[int, tuple, int] | None = self._start  # the position a new view must ask for
        self._view: EpochRows | None = None
        self._thread = threading.Thread(target=self._produce, name="row-stream", daemon=True)
        self._thread.start()

    @property
    def producing(self) -> bool:
        """Whether the producer thread is still running (it ends after the last epoch, an error or close)."""
        return self._thread.is_alive()

    # ------------------------------------------------------------------------------------ producer
    def _put(self, item: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        epoch, history, skip = self._start
        try:
            while epoch < self._epochs and not self._stop.is_set():
                with self._gate:
                    # One epoch ahead at most: the feed serves the cache of the newest two epochs.
                    while self._opened < epoch - 1 and not self._stop.is_set():
                        self._gate.wait(_POLL_S)
                if self._stop.is_set():
                    return
                total, batches = self._source(epoch, history, skip)
                if not self._put(("epoch", (epoch, total))):
                    return
                for batch in batches:
                    if not self._put(("rows", batch)):
                        return
                if not self._put(("end", epoch)):
                    return
                epoch, history, skip = epoch + 1, (), 0
        except BaseException as error:  # handed to the consumer, which raises it in take()
            if self._stop.is_set():  # closed while in its source: nobody reads this stream any more
                logger.info("row stream: a closed stream's producer ended with %r", error)
                return
            logger.exception("row stream: the producer failed at epoch %d", epoch)
            self._put(("error", error))

    # ------------------------------------------------------------------------------------ consumer
    def get(self) -> tuple[str, Any]:
        """The next item; raises the producer's error."""
        while True:
            if not self.producing and self._queue.empty():
                raise RuntimeError("row stream: the producer ended without finishing the epoch")
            try:
                kind, payload = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if kind == "error":
                raise payload
            return kind, payload

    def ended(self, epoch: int) -> None:
        self._next = (epoch + 1, (), 0) if epoch + 1 < self._epochs else None

    def continues(self, epoch: int, history: tuple = (), skip: int = 0) -> bool:
        """Whether this stream's next rows are those of ``(epoch, history, skip)``."""
        at_boundary = self._view is None or self._view.done
        return at_boundary and self._next == (epoch, tuple(history), skip)

    def epoch_rows(self, epoch: int, *, ahead: bool = True) -> tuple[EpochRows, int]:
        """The view of ``epoch`` (the next one of the stream) and the rows of its whole shard. ``ahead``
        False: the producer reads the epoch after only once that one is opened (a learner that went on
        into ``epoch`` on a guess: reading the next would make the feed drop the epoch before, which the
        averager may still send a learner back to)."""
        if self._next is None or self._next[0] != epoch or not (self._view is None or self._view.done):
            raise ValueError(
                f"row stream: epoch {epoch} asked, the stream continues at {self._next}: close it and start "
                "a new RowStream at the position"
            )
        with self._gate:
            self._opened = max(self._opened, epoch if ahead else epoch - 1)
            self._gate.notify_all()
        view = EpochRows(self, epoch)
        began = time.perf_counter()
        kind, payload = self.get()
        view.wait_seconds += time.perf_counter() - began
        if kind != "epoch" or payload[0] != epoch:
            raise RuntimeError(f"row stream: expected the start of epoch {epoch}, got {kind!r} {payload!r}")
        self._view = view
        self._next = None  # until the view ends
        return view, payload[1]

    def close(self, timeout: float = _CLOSE_WAIT_S) -> None:
        """Stop the producer; a learner realigned elsewhere waits at most ``timeout`` for it. One blocked
        in its source (a read of objects on a lost node lasts until Ray calls them lost) is a daemon
        thread left to end: it stops at its next row, and nobody reads what it yields or raises."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)
        if self.producing:
            logger.warning(
                "row stream: the producer is still in its source after %.0f s; left to end", timeout
            )
