"""``Arrivals``: the checks of one learner's round before it joins the round, and the time it waited.

A sender of round n is checked in two steps. ``check_sender`` (its id and rows) fails it before any time
is counted; ``admit`` checks it against the round book (``RoundBook.check``: a stale or unknown sender
is refused), takes its ``rows`` as the batch-size rule's cap (from a sender of the open round only: a
refused sender's rows may be those of another layout), checks its payload (``rounds.state.check_payload``)
and that a flat payload has one part per shard and no Adam moments when moments are not merged, and that
its model and optimizer match the round's first arrival's, so that a mismatch fails only that learner
(the round goes on without it) rather than the arithmetic failing the whole round.

``mark_closed`` notes when a round closed (its last arrival or its deadline); ``timed`` gives a sender's
seconds in the call and the part of them spent waiting for the others, e.g. a learner that arrived at
t=2 in a round that closed at t=5 and got its result at t=6 spent 4 s, 3 of them waiting. Plain Python.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from raytrain_seq.checks import check_number
from raytrain_seq.dataplane.payload import FlatPayload
from raytrain_seq.members.ids import LearnerId, check_learner
from raytrain_seq.rounds.book import RoundBook
from raytrain_seq.rounds.state import Arrival, check_payload

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["Arrivals"]

# A late sender of a recent round may still be in its call: the close times of this many rounds are kept.
_KEPT_CLOSES = 8


class Arrivals:
    """Admits the senders of a round book's rounds: ``shards``, the parts a flat payload must have;
    ``merge_moments``, whether Adam moments may travel; ``clock``, seconds (``time.monotonic``)."""

    def __init__(
        self,
        book: RoundBook,
        *,
        shards: int,
        merge_moments: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._book, self._shards, self._merge_moments, self._clock = book, shards, merge_moments, clock
        self.rows_cap: int | None = None  # the rows a learner has per epoch, sent with the rounds
        self._closed_at: dict[int, float] = {}  # round -> when it closed (its last arrival or deadline)

    @staticmethod
    def check_sender(learner: LearnerId, rows: int | None) -> None:
        """The checks that count no time: the learner's id and its rows."""
        check_learner(learner)
        if rows is not None:
            check_number("rows", rows, 1)

    def admit(
        self,
        learner: LearnerId,
        round: int,
        world_size: int,
        params: Mapping[str, Tensor] | FlatPayload,
        optimizer_state: Mapping | None,
        stats: Mapping[str, float] | None,
        weight: float,
        position: Mapping | None,
        incarnation: str | None,
        rows: int | None,
    ) -> Arrival:
        """The checked arrival of ``learner``'s round ``round``; raises what refuses it (see the doc)."""
        self._book.check(learner, round, world_size, incarnation)
        if rows is not None:
            self.rows_cap = int(rows)
        arrival = check_payload(params, optimizer_state, stats, weight, position)
        if isinstance(params, FlatPayload) and len(params.parts) != self._shards:
            raise ValueError(
                f"learner {learner!r} sent {len(params.parts)} parts for {self._shards} shards: "
                "split the buffers into JoinReply.shards slices"
            )
        if isinstance(params, FlatPayload) and params.layout.moments and not self._merge_moments:
            raise ValueError(
                f"learner {learner!r} sent Adam moments but merge_moments=False: send the weights only "
                "(the AAVG2 ablation keeps each learner's own moments)"
            )
        first = self._book.current.first_payload
        if first is not None and (arrival.signature, arrival.adam) != (first.signature, first.adam):
            raise ValueError(
                f"learner {learner!r} sent params (keys, shapes, dtypes) or an optimizer kind that differ "
                "from the round's first learner's: every learner must run the same model and optimizer"
            )
        return arrival

    def mark_closed(self, round: int) -> None:
        """Round ``round`` closed now: the end of its senders' wait for the others."""
        self._closed_at[round] = self._clock()

    def timed(self, round: int, start: float) -> tuple[float, float]:
        """(seconds in the call, seconds of them waiting for the others) of a sender of ``round`` that
        called at ``start``; a round not closed (refused, failed) counts no waiting."""
        end = self._clock()
        waiting = min(max(0.0, self._closed_at.get(round, start) - start), end - start)
        while len(self._closed_at) > _KEPT_CLOSES:
            del self._closed_at[min(self._closed_at)]
        return end - start, waiting

    def now(self) -> float:
        return self._clock()
