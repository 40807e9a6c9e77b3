"""``TestPass``: the final test pass's shares, summed once every learner's is in (asyncio, no Ray).

Each learner scores its shard of the test split and reports its tallies; each report waits until the
``world_size`` learners' shares are in, at most ``timeout_s``, then gets the sums (of those that came,
with ``learners`` saying how many). A learner that reports again after a pass completed starts a new
pass (a restarted group tests again). ``tested`` is set once a pass completed: training is over, which
is when the averager scores the final round's validation (it takes no CPU from the test pass).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from raytrain_seq.checks import check_number
from raytrain_seq.members.ids import LearnerId, check_learner
from raytrain_seq.rounds.tally import ShareTally, TestTotals

logger = logging.getLogger(__name__)

__all__ = ["TestPass", "TestTotals"]  # TestTotals: what a pass answers (``rounds.tally``)


class TestPass:
    """The test pass's shares (a ``ShareTally``) and the waiting of the learners that reported them."""

    __test__ = False  # not a pytest test class

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.tally = ShareTally()
        self.tested = asyncio.Event()  # a pass completed: training is over
        self._done: asyncio.Event | None = None

    async def report(self, learner: LearnerId, tallies: Mapping[str, Any], world_size: int) -> TestTotals:
        """Take ``learner``'s tallies ({"correct", "sequences", "per_class": ...}); the sums once
        ``world_size`` learners reported or ``timeout_s`` passed."""
        check_learner(learner)
        check_number("world_size", world_size, 1)
        for key in ("correct", "sequences"):
            check_number(f"tallies[{key!r}]", tallies.get(key), 0)
        if self._done is None or (self._done.is_set() and learner in self.tally.shares):
            self.tally.clear()  # a new test pass (e.g. a restarted group)
            self._done = asyncio.Event()
        if self.tally.add(learner, tallies, world_size):
            self._done.set()
            self.tested.set()
        try:
            await asyncio.wait_for(self._done.wait(), self.timeout_s)
        except asyncio.TimeoutError:
            logger.warning(
                "averager: %d of %d learners reported their test tallies in %g s: summing those",
                len(self.tally), world_size, self.timeout_s,
            )  # fmt: skip
        return self.tally.totals()

    def totals(self) -> TestTotals | None:
        """The sums of the shares in, for the summary; None before any share."""
        return self.tally.totals() if self.tally else None
