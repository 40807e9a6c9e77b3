"""The round a ``RoundBook`` is on: its phase, when it opened, its deadline, who it expects, what arrived.

``CurrentRound`` knows nothing of members or round numbers; the book (``rounds.book``) decides whom
it expects and when it closes. ``open`` starts it (``opened_at`` from the injected clock, the deadline
``timeout_s`` later), ``expect`` and ``release`` add a learner or stop waiting for one, ``settle``
empties it back to idle. ``opening`` counts the openings, so a timer can tell whether the round it
waits for is still the one open. Views are sorted ids (``members.ids.ordered``). No ray, no asyncio.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

from raytrain_seq.members.ids import LearnerId, ordered

__all__ = ["CurrentRound", "RoundPhase"]


class RoundPhase(Enum):
    """Where the current round stands in a ``RoundBook``: nobody sent it yet (IDLE), learners are
    arriving (OPEN), or close() accepted it and the caller averages it (CLOSING)."""

    IDLE = "idle"
    OPEN = "open"
    CLOSING = "closing"


class CurrentRound:
    """The round in progress: idle and empty, open (expected set, arrivals, deadline), or closing (the
    book's close() set ``phase``; its arrivals are averaged until the book settles it)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.phase, self.opening = RoundPhase.IDLE, 0
        self.opened_at: float | None = None
        self.deadline: float | None = None
        self.arrivals: dict[LearnerId, Any] = {}  # learner -> its payload, in the order they came
        self._expected: frozenset[LearnerId] = frozenset()

    @property
    def expected(self) -> list[LearnerId]:
        return ordered(self._expected)

    @property
    def arrived(self) -> list[LearnerId]:
        return ordered(self.arrivals)

    @property
    def missing(self) -> list[LearnerId]:
        return ordered(self._expected - set(self.arrivals))

    @property
    def first_payload(self) -> Any:
        """The payload of the open round's first arrival (None while idle)."""
        return next(iter(self.arrivals.values()), None)

    def expired(self) -> bool:
        return self.phase == RoundPhase.OPEN and self._clock() >= self.deadline

    def open(self, expected: Iterable[LearnerId], timeout_s: float) -> None:
        """The first arrival opens the round: it waits for ``expected`` until ``timeout_s`` from now."""
        self.phase, self.opening = RoundPhase.OPEN, self.opening + 1
        self._expected = frozenset(expected)
        self.opened_at = self._clock()
        self.deadline = self.opened_at + timeout_s

    def expect(self, learner: LearnerId) -> None:
        """Wait for ``learner`` too (it joined while the round is open)."""
        self._expected |= {learner}

    def release(self, learner: LearnerId) -> None:
        """Stop waiting for ``learner``; a payload it sent already stays."""
        if learner not in self.arrivals:
            self._expected -= {learner}

    def settle(self) -> None:
        """Back to idle and empty: the round finished, failed or was abandoned."""
        self.phase, self.opened_at, self.deadline = RoundPhase.IDLE, None, None
        self.arrivals, self._expected = {}, frozenset()
