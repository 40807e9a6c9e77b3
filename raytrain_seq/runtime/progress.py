"""A progress line with ETA on the driver while the learners train: ``RunProgress``.

The driver spends a run inside ``DataParallelTrainer.fit()``; this thread polls the averager's summary (the
latest averaged round's epoch position) and the feed's plan sizes every ``interval_s`` and moves a tqdm
bar whose unit is an epoch: epoch 3 with 40 of 160 rows taken by each learner shows 3.25 of 10, and
tqdm's rate gives the ETA. A run ended by ``train.steps`` counts steps instead (``steps=N``: the
position's run-wide step count out of N), since its epochs are not known ahead. The bar goes to stderr
(a job's log); the learners still log each round.

The two readers are injected (``position()`` -> the averager summary's position dict or None,
``rows(epoch, world_size)`` -> rows per learner or None), so the arithmetic is tested without Ray; a
reader that fails is logged once and the bar keeps its last value (progress must never stop a run).
"""

from __future__ import annotations

import logging
import math
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["RunProgress", "averager_position_reader", "epochs_done", "feed_rows_reader"]


def epochs_done(position: Mapping[str, Any] | None, rows_per_learner: int | None) -> float:
    """Epochs completed, with the running epoch's fraction: e.g. epoch 3, 40 of 160 rows -> 3.25.

    A layout history (the epoch began under another group size) counts its rows at this layout's size;
    the fraction is capped below 1 (the epoch is done only when the position moves to the next one).
    """
    if not position:
        return 0.0
    epoch = float(position.get("epoch", 0))
    rows = int(position.get("rows_done", 0) or 0)
    if not rows or not rows_per_learner:
        return epoch
    return epoch + min(rows / rows_per_learner, 0.999)


class RunProgress:
    """A daemon thread that moves a tqdm bar of epochs until ``close()``."""

    def __init__(
        self,
        epochs: int,
        *,
        position: Callable[[], Mapping[str, Any] | None],
        rows: Callable[[int, int], int | None],
        interval_s: float = 10.0,
        stream: Any = None,
        steps: int | None = None,
    ) -> None:
        from tqdm import tqdm

        self.epochs, self._position, self._rows, self.interval_s = epochs, position, rows, interval_s
        self.steps = steps
        total, unit = (epochs, "epoch") if steps is None else (steps, "step")
        self.bar = tqdm(
            total=total, unit=unit, desc="training", file=stream or sys.stderr, dynamic_ncols=True
        )
        self.bar.bar_format = (
            "{desc}: {n:.2f}/{total} " + unit + "s |{bar}| {elapsed} elapsed, ETA {remaining}"
        )
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="run-progress", daemon=True)

    def start(self) -> RunProgress:
        self._thread.start()
        return self

    def poll(self) -> float:
        """Read the position once and move the bar; returns the epochs done (the bar's value)."""
        try:
            position = self._position()
            if self.steps is not None:
                done = min(float((position or {}).get("steps", 0) or 0), float(self.steps))
                if not math.isclose(done, self.bar.n):
                    self.bar.update(done - self.bar.n)
                return done
            rows = None
            if position and position.get("world_size"):
                rows = self._rows(int(position["epoch"]), int(position["world_size"]))
            done = min(epochs_done(position, rows), float(self.epochs))
        except Exception as exc:  # a progress bar must not stop a run: log it once and keep the last value
            if not self._warned:
                logger.warning("progress: cannot read the run's position (%s); the bar stays", exc)
                self._warned = True
            return self.bar.n
        if not math.isclose(done, self.bar.n):
            self.bar.update(done - self.bar.n)
        return done

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.interval_s + 5)
        self.bar.close()


def feed_rows_reader(feed: Any) -> Callable[[int, int], int | None]:
    """``rows(epoch, world_size)`` from the feed's stats: ceil(blocks of the epoch's plan / learners)."""
    import ray

    def rows(epoch: int, world_size: int) -> int | None:
        epochs = ray.get(feed.stats.remote()).epochs
        packing = epochs.get(epoch, {}).get("packing")  # FeedReport.epochs: int keys
        return -(-packing["blocks"] // world_size) if packing else None

    return rows


def averager_position_reader(averager: Any) -> Callable[[], Mapping[str, Any] | None]:
    """``position()`` from the averager's summary: where the latest averaged round left the epoch."""
    import ray

    return lambda: ray.get(averager.summary.remote()).position
