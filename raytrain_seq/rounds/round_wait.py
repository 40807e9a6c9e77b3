"""``RoundWait``: the open round's future and its deadline timer, for the averager (asyncio, no Ray).

Every sender of a round awaits one future (``future``); the round's first arrival opens it and starts a
timer that closes the round at the book's deadline, ``timeout_s`` after that arrival (``open``). A round
closes when every expected learner arrived or at the deadline (``start_close``, which hands the book's
``RoundClose`` and the future to the averager's ``close``); a round the book moved past (a new group, a
re-seed) fails its waiting senders with a ``StaleRoundError``, so they rejoin (``fail``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from raytrain_seq.members.errors import StaleRoundError
from raytrain_seq.rounds.arrivals import Arrivals
from raytrain_seq.rounds.book import RoundBook, RoundClose
from raytrain_seq.rounds.current_round import RoundPhase

__all__ = ["RoundWait"]


class RoundWait:
    """The future the open round's senders await and the timer that closes the round (module docstring)."""

    def __init__(
        self,
        book: RoundBook,
        arrivals: Arrivals,
        *,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task],
        close: Callable[[RoundClose, asyncio.Future], Coroutine[Any, Any, None]],
    ) -> None:
        self._book, self._arrivals, self._spawn, self._close = book, arrivals, spawn, close
        self.future: asyncio.Future | None = None  # the open (or closing) round's; None between rounds
        self._timer: asyncio.Task | None = None

    def open(self) -> None:
        """The round's first arrival: a new future, and the timer of the book's deadline."""
        self.future = asyncio.get_running_loop().create_future()
        self._timer = self._spawn(self._expire(self._book.current.opening, self._book.current.deadline))

    async def _expire(self, opening: int, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        if self._book.current.phase is RoundPhase.OPEN and self._book.current.opening == opening:
            self.start_close()

    def start_close(self) -> None:
        """Close the open round now: its timer stops and the averager's ``close`` runs on a task."""
        self._arrivals.mark_closed(self._book.round)
        if self._timer is not None and self._timer is not asyncio.current_task():
            self._timer.cancel()
        self._timer = None
        self._spawn(self._close(self._book.close(), self.future))

    def fail(self, why: str) -> None:
        """Hand the open round's waiting senders a StaleRoundError (they rejoin); the book moved on."""
        if self._timer is not None:
            self._timer.cancel()
        future, self._timer, self.future = self.future, None, None
        if future is not None and not future.done():
            future.set_exception(StaleRoundError("group", self._book.round, self._book.round, why))
