"""A learner's rows of an evaluation split, per share, assembled ahead on a thread and kept in memory.

``EvalRows(feed, uncropped)`` collects share ``(rank, world size)`` of a split from the feed
(``feed.eval_rows``) as CPU batches of 16. ``ahead`` starts that collection on a background thread while
training goes on (the feed's augmentation and the copy into rows, CPU work that would otherwise run after
training with nothing beside it), so that scoring at the end only runs the model; ``rows`` returns them,
from the cache when the share is unchanged, else from the thread started for that very share (raising
what it raised), else collected now. A group change gives another share, which is collected anew.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from raytrain_seq.training.staging import collate_stream

Share = tuple[int, int]  # (rank, world size) of the share; (0, 1) is the whole split
Rows = list[dict[str, torch.Tensor]]


class EvalRows:
    """The evaluation rows of one learner, per split: ``ahead``, ``pending``, ``rows``, ``free``.

    ``uncropped(split)`` says whether a split's rows stay uncropped (the test views are cut at scoring);
    ``marks[f"{split}_rows"]`` gets the ``time.time()`` each collection finished.
    """

    def __init__(self, feed: Any, *, uncropped: Callable[[str], bool], marks: dict[str, float]) -> None:
        self.feed, self.uncropped, self.marks = feed, uncropped, marks
        self._held: dict[str, tuple[Share, Rows]] = {}  # split -> the share it holds and its rows
        self._ahead: dict[str, tuple[Share, Future]] = {}  # split -> the share being assembled, its rows

    def ahead(self, split: str, share: Share) -> None:
        """Collect ``split``'s ``share`` on a background thread; ``rows`` waits for it."""
        future: Future = Future()

        def assemble() -> None:
            try:
                future.set_result(self._collect(split, share))
            except BaseException as exc:  # handed to rows(), which raises it in the learner's thread
                future.set_exception(exc)

        self._ahead[split] = (share, future)
        threading.Thread(target=assemble, name=f"{split}-rows", daemon=True).start()

    def pending(self, split: str) -> bool:
        """Whether ``split``'s assembly was started ahead and not taken yet."""
        return split in self._ahead

    def rows(self, split: str, share: Share) -> Rows:
        """``split``'s rows of ``share``: held, or the thread's for that share, or collected now."""
        if self._held.get(split, (None,))[0] != share:
            ahead_share, ahead = self._ahead.pop(split, (share, None))
            if ahead is not None and ahead_share == share:
                self._held[split] = (share, ahead.result())
            else:
                self._held[split] = (share, self._collect(split, share))
        return self._held[split][1]

    def free(self, split: str) -> None:
        """Forget ``split``'s held rows (scored once)."""
        self._held.pop(split, None)

    def _collect(self, split: str, share: Share) -> Rows:
        rows = collate_stream(self.feed.eval_rows(split, *share, uncropped=self.uncropped(split)))
        self.marks[f"{split}_rows"] = time.time()
        return rows
