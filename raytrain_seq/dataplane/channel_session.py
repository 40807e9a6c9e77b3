"""``ChannelSession``: the averager's side of the channel generations, with the waiting (asyncio, no Ray).

``dataplane.generations.ChannelBook`` decides (plan a generation after a full round through the store,
accept a round's channelled parts, end a generation on a drop, a join or a lost shard). This class adds
what needs an event loop: the members' links gathered until every member has linked (then the shards
open their channels, and every waiting member gets their inputs, or None: its rounds go through the
store), the end of a generation waking the members still waiting, and the averager's own reads of a
round's merged slices from the channels, in order and off the event loop.

Injected: ``pool`` (the shard pool: ``targets``, ``open_channels``), ``self_reader`` (the averager as a
reader of a shard's channel: its handle and node) and ``read_round`` (reads one round's value from a
channel input), so the whole session runs with fakes in a test.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from raytrain_seq.dataplane.generations import ChannelBook, Channelled, ChannelPlan, Link
from raytrain_seq.members.ids import LearnerId

logger = logging.getLogger(__name__)

__all__ = ["ChannelSession"]


class ChannelSession:
    """A ``ChannelBook`` (``book``) and the links, opening, ending and reads of its generations."""

    def __init__(
        self,
        book: ChannelBook,
        *,
        pool: Any,
        timeout_s: float,
        self_reader: Callable[[], tuple[Any, str]],
        read_round: Callable[[Any, int, float], Any],
    ) -> None:
        self.book = book
        self._pool, self._timeout_s = pool, timeout_s
        self._self_reader, self._read_round = self_reader, read_round
        self._linked = asyncio.Event()
        self._reads = asyncio.Lock()  # a channel's values are read in order, once each

    async def plan(
        self,
        members: Sequence[LearnerId],
        expected: Sequence[LearnerId],
        dropped: Sequence[LearnerId],
        flat: bool,
        world_size: int,
    ) -> ChannelPlan | None:
        """A generation for the members of a round that every member took part in through the store
        (``ChannelBook.propose``), or None."""
        if not self.book.propose(members, expected, dropped, flat, world_size):
            return None
        plan = self.book.start(members, await self._pool.targets())
        self._linked = asyncio.Event()
        return plan

    async def link(self, generation: int, learner: LearnerId, link: Link) -> list[Any] | None:
        """A member's channels for ``generation``; once every member has linked, the shards open theirs:
        returns shard i's channel of merged slices at i, or None when the generation ended (or not every
        member linked within the timeout): the learner's rounds go through the store."""
        decision = self.book.link(generation, learner, link)
        if decision == "refused":
            return None
        if decision == "complete":
            await self._open(generation, link.nbytes)
        else:
            try:
                await asyncio.wait_for(self._linked.wait(), self._timeout_s)
            except asyncio.TimeoutError:
                self.end(f"not every member linked generation {generation}")
        plan = self.book.plan
        if plan is None or plan.generation != generation or not self.book.live:
            return None
        return list(self.book.inputs)

    async def _open(self, generation: int, nbytes: int) -> None:
        """The shards open the generation's channels (the members' and this actor as readers)."""
        book, event = self.book, self._linked
        readers = [*book.readers(), self._self_reader()]
        try:
            inputs = await self._pool.open_channels(
                generation, book.shard_inputs(), readers, nbytes, timeout_s=self._timeout_s
            )
        except Exception as exc:
            logger.error("averager: opening generation %d's channels failed: %r", generation, exc)
            self.end(f"generation {generation} could not be opened")
        else:
            if book.opened(generation, inputs):
                logger.info("averager: channel generation %d is live (%d members)",
                            generation, len(book.plan.members))  # fmt: skip
        event.set()

    def end(self, why: str) -> None:
        """End the planned or live generation: the rounds go through the store until the next full round
        plans another (its channels are not closed: ``dataplane.generations`` says why)."""
        generation = self.book.end()
        self._linked.set()
        if generation is None:
            return
        logger.warning("averager: channel generation %d ends (%s)", generation, why)
        if self.book.failed == self.book.max_ended:
            logger.warning(
                "averager: %d channel generations ended early: the rounds go through the object store from "
                "now on (each generation's buffers stay in the store until its processes exit)",
                self.book.failed,
            )

    async def read(self, parts: Sequence[Channelled]) -> list[Any]:
        """A round's merged slices from the live generation's channels, in a worker thread."""
        async with self._reads:
            inputs, timeout = self.book.inputs, self._timeout_s
            return await asyncio.to_thread(
                lambda: [self._read_round(inputs[p.writer], p.round, timeout) for p in parts]
            )

    def report(self) -> dict[str, Any]:
        """For the summary: generations planned, whether the last is live, and how many ended early (a
        drop, a join, a shard restarted: their rounds went through the store)."""
        book = self.book
        return {
            "enabled": book.enabled,
            "generations": book.generation,
            "live": book.live,
            "ended": book.failed,
        }
