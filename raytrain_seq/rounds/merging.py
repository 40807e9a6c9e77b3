"""``RoundMerge``: a closed round's mean, through the shard pool (flat payloads) or in process (tensors).

AAVG (Cong et al.) Algorithm 1 line 12 and Algorithm 2: the learners' weights become their weighted mean
(``averaging.average_states``) and their Adam moments are merged (``averaging.merge_adam_states``).
Payloads sent as tensors (a re-seed, direct callers) are merged here, in the caller's worker thread
(``tensors``); flat payloads (``dataplane.payload.FlatPayload``) are merged by the shard pool, slice i by
shard i, read from the object store or from the live channel generation (``flat``), and a learner whose
slices a shard cannot read is dropped from the round (``RoundBook.drop_unread``) and the others merged
again. The hub load of each round is recorded. ``result`` turns a closed round into its ``RoundResult``:
the mean, the batch size decided so far (the batch rule's), the run's clock, and the learners'
position settled against the latest state's (``rounds.position.settle_dict``: the rows of the layout's
ranks absent from the round are recorded as missed), dealt over the next group when a live group
changes at this close (``for_group``; ``rounds.group``). No Ray here: the pool is injected
(``InProcessShards`` in tests, ``runtime.shards.RayShards`` in a cluster).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from raytrain_seq.dataplane.channel_session import ChannelSession
from raytrain_seq.dataplane.extras import merge_extras
from raytrain_seq.dataplane.generations import Channelled
from raytrain_seq.dataplane.hub_load import HubLoad
from raytrain_seq.dataplane.payload import FlatPayload
from raytrain_seq.members.errors import StaleRoundError
from raytrain_seq.members.ids import LearnerId
from raytrain_seq.rounds.batch_rule import BatchRule
from raytrain_seq.rounds.book import RoundBook, RoundClose
from raytrain_seq.rounds.position import EpochPosition, settle_dict
from raytrain_seq.rounds.settings import AveragerSettings
from raytrain_seq.rounds.state import AveragedState, RoundResult

logger = logging.getLogger(__name__)

# Why a learner lost while its round merges is dropped (``RoundMerge.lost``), unless told otherwise.
LOST = "its process was lost while the round merged: its slices died with it"

__all__ = ["RoundMerge"]


class RoundMerge:
    """Merges closed rounds for an averager: its ``settings`` (which statistics to merge), shard ``pool``,
    round ``book`` (timeout, drops), channel session and hub load; for the round's result, the ``batch``
    rule (B), the run's clock ``elapsed``, the ``latest`` averaged state and the learners' ``rows_cap``."""

    def __init__(
        self,
        settings: AveragerSettings,
        *,
        pool: Any,
        book: RoundBook,
        channels: ChannelSession,
        loads: HubLoad,
        batch: BatchRule,
        elapsed: Callable[[], float],
        latest: Callable[[], AveragedState],
        rows_cap: Callable[[], int | None],
    ) -> None:
        self._settings, self._pool, self._book = settings, pool, book
        self._channels, self._loads = channels, loads
        self._batch, self._elapsed, self._latest, self._rows_cap = batch, elapsed, latest, rows_cap
        # The round the shards are merging and each learner's payload in it (``lost`` reads it), and the
        # learners lost while it runs, whose slices cannot be read, each with the reason it is dropped.
        self._merging: tuple[int, dict[LearnerId, FlatPayload]] | None = None
        self._lost: dict[LearnerId, str] = {}

    def lost(self, learner: LearnerId, why: str = LOST) -> tuple[int, FlatPayload] | None:
        """``learner``'s process died (or, ``why`` says, does not answer): the round being merged and
        its payload in it, whose slices the shards should stop waiting for (``ShardPool.forget``); None
        when it is not in a running merge."""
        if self._merging is None or learner not in self._merging[1]:
            return None
        self._lost.setdefault(learner, why)
        return self._merging[0], self._merging[1][learner]

    async def result(self, closed: RoundClose) -> tuple[RoundClose, RoundResult]:
        """The round's mean: the shards merge flat payloads (awaited), tensors are merged in a worker
        thread; either way the event loop keeps answering. Learners whose slices a shard could not read
        within the timeout are dropped and the others merged again: the close that was averaged is
        returned with the result."""
        params = optimizer_state = flat = None
        if isinstance(closed.present[0][1].params, FlatPayload):
            closed, flat = await self.flat(closed)
        arrivals = [arrival for _, arrival in closed.present]
        weights = [arrival.weight for arrival in arrivals]
        if flat is None:
            params, optimizer_state = await asyncio.to_thread(
                self.tensors, arrivals, weights, _uneven(closed)
            )
            self._loads.record(closed.round, [], in_process=(arrivals, params, optimizer_state))
        present = [learner for learner, _ in closed.present]
        state = AveragedState(
            round=closed.round,
            params=params,
            optimizer_state=optimizer_state,
            flat=flat,
            batch_size=self._batch.size,
            adaptive_state=self._batch.state_dict(),
            position=self._position(closed, arrivals, present),
            elapsed_s=self._elapsed(),
            source="live",
        )
        result = RoundResult(
            state=state,
            learners=tuple(present),
            dropped=closed.dropped,
            seconds=time.monotonic() - closed.opened_at,
            weights=tuple(weights),
            group=closed.group,
        )
        return closed, result

    def _position(self, closed: RoundClose, arrivals: list, present: list) -> dict | None:
        """The round's position: the furthest arrival's (most steps; a learner that deferred its round
        while the averager was away sends more), settled, and dealt over the next group when the group
        changes at this close. A learner of the same layout that stopped short of it (it sent before the
        others' deferred rounds) has the rows between recorded as missed; any other disagreement is
        logged."""
        if arrivals[0].position is None:
            return None
        # Live groups: the learners are slots, whose ranks are their places in the current group.
        ranks = present if self._book.live is None else self._book.live.ranks(present)
        sent = [EpochPosition.from_dict(a.position) for a in arrivals]
        furthest = max(range(len(sent)), key=lambda i: (sent[i].steps, -i))  # the first of the furthest
        ahead = sent[furthest]
        # Rounds are deferred only inside a layout (runtime.learner), so a learner short of the furthest
        # stands in its layout: rank -> the rows it did.
        short = {
            rank: p.rows_done for rank, p in zip(ranks, sent, strict=True)
            if p.layout == ahead.layout and p.rows_done < ahead.rows_done
        }  # fmt: skip
        positions = {json.dumps(a.position, sort_keys=True) for a in arrivals}
        if len(positions) > 1:
            logger.warning("averager: round %d learners disagree on the position (%s short of the furthest): %s",
                           closed.round, sorted(short) or "none", positions)  # fmt: skip
        # The rows of the layout's ranks absent from this round never reach an averaged state: the
        # position records them as missed, and the layout's end deals them again (rounds.position).
        settled = settle_dict(
            dict(arrivals[furthest].position), self._latest().position, ranks, self._rows_cap(), short=short
        )
        if closed.group is None:
            return settled
        gone = self._book.live.leaving_ranks()  # their blocks come last in the survivors' shards
        return EpochPosition.from_dict(settled).for_group(len(closed.group), gone).as_dict()

    def tensors(self, arrivals: list, weights: list[float], uneven: bool = False) -> tuple[dict, dict | None]:
        """The in-process arithmetic of payloads sent as tensors (the star's path)."""
        # Imported here: the flat path (shards) needs no torch, and a restarted averager loads none for it.
        from raytrain_seq.algorithms.averaging import average_states, merge_adam_states

        params = average_states(
            [a.params for a in arrivals], weights, merge_bn_stats=self._settings.merge_bn_stats
        )
        optimizer_state = None
        if arrivals[0].adam and self._settings.merge_moments:
            states = [a.optimizer_state for a in arrivals]
            optimizer_state = merge_adam_states(
                states, weights=weights, centred_pairs=self._settings.centred_pairs, furthest_step=uneven
            )
        return params, optimizer_state

    async def flat(self, closed: RoundClose) -> tuple[RoundClose, FlatPayload]:
        """The data plane: the shards merge the slices, read from the store or from the live channel
        generation's channels (this actor passes references or ``Channelled`` markers only), and write
        the result into the channels when every member sent through them. A learner whose slices a shard
        cannot read within the round's timeout, or finds lost, is dropped, and the others' slices are
        merged again (each try drops at least one learner, so this ends). A shard that lost the
        generation's channels (restarted) fails the round: its learners rejoin and resend it through
        the store."""
        self._lost = {}
        while True:
            payloads = [arrival.params for _, arrival in closed.present]
            weights = [arrival.weight for _, arrival in closed.present]
            extras = merge_extras([p.extras for p in payloads], furthest_step=_uneven(closed))
            marked = [p.parts[0] for p in payloads if isinstance(p.parts[0], Channelled)]
            write = len(marked) == len(payloads) and self._channels.book.accepts(
                marked[0].generation, [learner for learner, _ in closed.present]
            )
            timeout = self._book.timeout_s
            present = [learner for learner, _ in closed.present]
            self._merging = (closed.round, dict(zip(present, payloads, strict=True)))
            try:
                merged = await self._pool.merge(closed.round, payloads, weights, timeout, write=write)
            finally:
                self._merging = None
            if self._channels.book.live and not self._channels.book.keeps(
                present, len(marked), merged.channelled
            ):
                self._channels.end(f"round {closed.round}: a member is missing or left the channels")
            if merged.lost_channels:
                self._channels.end(f"round {closed.round}: a shard lost its channels (restarted)")
                raise StaleRoundError(
                    "group", closed.round, closed.round, "a shard lost the round's channels"
                )
            if not merged.unreadable:
                break
            unread = [closed.present[i][0] for i in sorted(merged.unreadable)]
            late = (
                f"its slices were lost or unreadable for {self._book.timeout_s:g} s (the learner owns them)"
            )
            reasons: dict[str, list[LearnerId]] = {}
            for learner in unread:
                reasons.setdefault(self._lost.get(learner, late), []).append(learner)
            for why, learners in reasons.items():
                closed = self._book.drop_unread(closed, learners, why)
                if closed.error is not None:
                    raise closed.error
        self._loads.record(closed.round, list(merged.loads))
        if merged.channelled:
            generation = self._channels.book.plan.generation
            parts = tuple(Channelled(generation, i, closed.round) for i in range(self._pool.count))
        else:
            parts = tuple(merged.parts)
            if write:  # a shard could not write: the learners read the store, and the generation ends
                self._channels.end(f"round {closed.round}: a shard's channel write failed")
        return closed, FlatPayload(payloads[0].layout, parts, extras)


def _uneven(closed: RoundClose) -> bool:
    """Whether the round's learners took different step counts (some deferred their rounds while the
    averager was away): the merge keeps the furthest's Adam step, as the round keeps its position."""
    return len({(arrival.position or {}).get("steps") for _, arrival in closed.present}) > 1
