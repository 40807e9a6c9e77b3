"""``RoundWait``: the open round's future and its deadline timer, for the averager (asyncio, no Ray).

Every sender of a round awaits one future (``future``); the round's first arrival opens it and starts a
timer that closes the round at the book's deadline, ``timeout_s`` after that arrival (``open``). A round
closes when every expected learner arrived or at the deadline (``start_close``, which hands the book's
``RoundClose`` and the future to the averager's ``close``); a round the book moved past (a new group, a
re-seed) fails its waiting senders with a ``StaleRoundError``, so they rejoin (``fail``). With a
``probe``, each missing learner's process is asked to answer within ``probe_s``, first
``FIRST_PROBE_S`` after the round opened, then every ``probe_s``; when none of the missing answers, the
round closes without them (``_probe_missing``), and while a closed round merges, a sender that does not
answer is dropped from it (``probe_merging``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from raytrain_seq.checks import check_number
from raytrain_seq.members.errors import StaleRoundError
from raytrain_seq.members.ids import LearnerId
from raytrain_seq.rounds.arrivals import Arrivals
from raytrain_seq.rounds.book import RoundBook, RoundClose
from raytrain_seq.rounds.current_round import RoundPhase

__all__ = ["FIRST_PROBE_S", "RoundWait"]

# An open round's first probe goes out this soon after its first arrival (``probe_s`` when that is
# shorter). A group in lockstep sends within a small fraction of it, so a complete round asks nobody;
# a stopped learner is dropped about ``probe_s`` after the round opened, not two ``probe_s`` (the first
# probe a whole ``probe_s`` late). Figures: docs/ARCHITECTURE.md, "Measurements behind the code".
FIRST_PROBE_S = 0.05


class RoundWait:
    """The future the open round's senders await and the timer that closes the round (module docstring)."""

    def __init__(
        self,
        book: RoundBook,
        arrivals: Arrivals,
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task],
        close: Callable[[RoundClose, asyncio.Future], Coroutine[Any, Any, None]],
        probe: Callable[[LearnerId, float], Awaitable[bool | None]] | None = None,
        probe_s: float = 0.0,
    ) -> None:
        self._book, self._arrivals, self._spawn, self._close = book, arrivals, spawn, close
        self.future: asyncio.Future | None = None  # the open (or closing) round's; None between rounds
        self._timer: asyncio.Task | None = None
        # Whether a learner's process answered within the seconds given: False = it did not (or it is
        # dead), None = no process of it is known, so there is nothing to ask and the round waits.
        self._probe, self._probe_s = probe, float(check_number("probe_s", probe_s, 0.0, int | float))

    def open(self) -> None:
        """The round's first arrival: a new future, the timer of the book's deadline, and the probes."""
        self.future = asyncio.get_running_loop().create_future()
        opening = self._book.current.opening
        self._timer = self._spawn(self._expire(opening, self._book.current.deadline))
        if self._probe is not None and self._probe_s > 0:
            self._spawn(self._probe_missing(opening))

    def _is_open(self, opening: int) -> bool:
        return self._book.current.phase is RoundPhase.OPEN and self._book.current.opening == opening

    async def _expire(self, opening: int, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        if self._is_open(opening):
            self.start_close()

    async def _probe_missing(self, opening: int) -> None:
        """While the round is open (``FIRST_PROBE_S`` after it opened, then every ``probe_s``), probe the
        missing learners' processes; when none answers within ``probe_s``, close the round without them.

        Why: a process that cannot answer (stopped, in a paused VM, on a node cut off from the head)
        would hold the others until the deadline, while a slow learner answers from another thread and
        is waited for. E.g. probe_s 0.5, timeout_s 60: a frozen learner is dropped 0.55 s after the
        round's first arrival (the first probe at 0.05 s, unanswered by 0.55 s), not 60 s; a learner
        whose process is unknown is waited for until the deadline.
        """
        pause = min(FIRST_PROBE_S, self._probe_s)
        while True:
            await asyncio.sleep(pause)
            pause = self._probe_s
            missing = self._book.current.missing
            if not self._is_open(opening) or not missing:
                return
            answers = await asyncio.gather(*(self._probe(learner, self._probe_s) for learner in missing))
            if not self._is_open(opening):
                return
            silent = {learner for learner, answer in zip(missing, answers, strict=True) if answer is False}
            waiting = set(self._book.current.missing)
            if waiting and silent >= waiting:
                self.start_close(
                    f"its process did not answer within {self._probe_s:g} s while round "
                    f"{self._book.round} waited for it (stopped, or its node cut off)"
                )
                return

    async def probe_merging(
        self, learners: list[LearnerId], silent: Callable[[LearnerId, str], None]
    ) -> None:
        """While a closed round merges (cancel it when the merge ends): every ``probe_s``, probe the
        processes of ``learners``, who sent the round; each that does not answer goes to ``silent`` once,
        with the reason. Why: a stopped learner's slices cannot be read (it owns them), so the shards
        would wait for them until the round's timeout."""
        left = list(learners)
        why = (
            f"its process did not answer within {self._probe_s:g} s while round {self._book.round} "
            "merged: its slices cannot be read (stopped, or its node cut off)"
        )
        while left and self._probe is not None and self._probe_s > 0:
            await asyncio.sleep(self._probe_s)
            answers = await asyncio.gather(*(self._probe(learner, self._probe_s) for learner in left))
            for learner, answer in zip(left, answers, strict=True):
                if answer is False:
                    silent(learner, why)
            left = [learner for learner, answer in zip(left, answers, strict=True) if answer is not False]

    def start_close(self, silent: str | None = None) -> None:
        """Close the open round now: its timer stops and the averager's ``close`` runs on a task.
        ``silent``: why the missing are dropped before the deadline (``RoundBook.close``)."""
        self._arrivals.mark_closed(self._book.round)
        if self._timer is not None and self._timer is not asyncio.current_task():
            self._timer.cancel()
        self._timer = None
        self._spawn(self._close(self._book.close(silent), self.future))

    def fail(self, why: str) -> None:
        """Hand the open round's waiting senders a StaleRoundError (they rejoin); the book moved on."""
        if self._timer is not None:
            self._timer.cancel()
        future, self._timer, self.future = self.future, None, None
        if future is not None and not future.done():
            future.set_exception(StaleRoundError("group", self._book.round, self._book.round, why))
