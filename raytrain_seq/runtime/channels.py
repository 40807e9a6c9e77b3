"""A learner's ends of a channel generation on Ray (``dataplane.generations`` says when and why).

``RayChannelEnds`` makes the learner's channel to each shard (a channel is made by its writer), keeps the
shards' channels of merged slices once the generation is live, writes a round's slices and reads the
merged ones. A channel is a ``BufferedSharedMemoryChannel``: the learner's to a shard has one buffer (the
shard drops its views of round r when its merge returns, before the learner writes round r + 1), a
shard's to the learners two (a learner still holds round r's views, its ``held`` state, while the shard
writes round r + 1, and a buffer is free for a write only once every reader has let go of its last
value). Any channel error ends the learner's link: its round goes through the object store instead.
ray is imported only inside the methods.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from raytrain_seq.dataplane.generations import Channelled, ChannelLost, ChannelPlan, Link
from raytrain_seq.dataplane.merge import part_nbytes

logger = logging.getLogger(__name__)

__all__ = ["INPUT_BUFFERS", "OUTPUT_BUFFERS", "RayChannelEnds", "channel_slack", "for_readers", "read_round"]

# A learner's channel to a shard: one buffer (see the module docstring); a shard's to the learners: two.
INPUT_BUFFERS = 1
OUTPUT_BUFFERS = 2


def channel_slack(nbytes: int) -> int:
    """A channel's size for a value of ``nbytes`` array bytes: room for Ray's header and the dict's pickle
    (a value larger than its channel makes the writer resize it, a round trip to every reader)."""
    return nbytes + (1 << 20)


def for_readers(channel: Any) -> Any:
    """A copy of a ``BufferedSharedMemoryChannel`` this process writes, for its readers, without this
    process's actor handle in it. Why: a process that unpickles an actor handle loads that actor's class,
    and a learner's class loads torch: a shard that read its members' channels loaded torch, seconds of one
    CPU with the GIL held, stalling the merge of the round beside it (docs/ARCHITECTURE.md, "Measurements behind the code"). A reader never uses the writer's handle (Ray's ``Channel`` keeps it for the writer's own
    registration), so the copy leaves it out. Ray's private fields: pinned by tests/test_channels.py."""
    import copy

    stripped = copy.copy(channel)  # Ray's reduce: a new object over the same buffers
    stripped._buffers = [copy.copy(buffer) for buffer in channel._buffers]
    for buffer in stripped._buffers:
        buffer._writer = None
    return stripped


def read_round(channel: Any, round: int, timeout_s: float | None) -> Any:
    """The part of round ``round`` read from ``channel`` (which carries ``(round, part)``); ChannelLost
    when it holds another round (the channel's readers fell out of step)."""
    got, part = channel.read(timeout=timeout_s)
    if got != round:
        raise ChannelLost(f"a channel held round {got} where round {round} was expected")
    return part


class RayChannelEnds:
    """``ChannelEnds`` of a learner running in a Ray actor (the learners are: runtime/fleet.py)."""

    def __init__(self) -> None:
        self.generation: int | None = None
        self._outputs: list[Any] = []
        self._inputs: list[Any] = []
        self._planned: int | None = None
        self._member = 0
        # The client links in a background thread (``AveragerClient._link``) while its rounds close it.
        self._lock = threading.Lock()

    def open(self, plan: ChannelPlan, slices: Sequence[Any]) -> Link:
        import ray
        from ray.experimental.channel.shared_memory_channel import BufferedSharedMemoryChannel
        from ray.experimental.channel.utils import get_self_actor

        me = get_self_actor()
        if me is None:
            raise RuntimeError(
                "channels need the learner to run in a Ray actor (as runtime/fleet.py runs it)"
            )
        sizes = tuple(part_nbytes(part) for part in slices)
        outputs = [
            BufferedSharedMemoryChannel(me, [shard], INPUT_BUFFERS, channel_slack(size))
            for shard, size in zip(plan.shards, sizes, strict=True)
        ]
        with self._lock:
            self.generation, self._inputs = None, []
            self._outputs, self._planned = outputs, plan.generation
        node = ray.get_runtime_context().get_node_id()
        return Link(outputs=tuple(for_readers(c) for c in outputs), reader=(me, node), nbytes=sizes)

    def attach(self, generation: int, inputs: Sequence[Any], member: int) -> bool:
        with self._lock:
            if generation != self._planned:
                return False
            # The generation last: a round that sees it sees the rest.
            self._inputs, self._member, self.generation = list(inputs), member, generation
            return True

    def write(self, round: int, slices: Sequence[Any], timeout_s: float) -> tuple[Channelled, ...] | None:
        from ray.exceptions import RayChannelError

        with self._lock:
            generation, outputs, member = self.generation, self._outputs, self._member
        if generation is None:
            return None
        try:
            for channel, part in zip(outputs, slices, strict=True):
                channel.write((round, part), timeout=timeout_s)
        except RayChannelError as exc:  # a timeout (its reader is gone or stuck) or a failed channel
            logger.warning("generation %d: a channel write failed (%r): this round goes through the store",
                           generation, exc)  # fmt: skip
            self.close(generation)
            return None
        return tuple(Channelled(generation, member, round) for _ in slices)

    def read(self, parts: Sequence[Channelled], timeout_s: float) -> list[Any]:
        from ray.exceptions import RayChannelError

        with self._lock:
            generation, inputs = self.generation, self._inputs
        if generation is None or any(p.generation != generation for p in parts):
            raise ChannelLost(f"the merged slices are in generation {parts[0].generation}, not linked here")
        try:
            return [read_round(inputs[part.writer], part.round, timeout_s) for part in parts]
        except (RayChannelError, ChannelLost) as exc:
            self.close(generation)
            raise ChannelLost(f"a merged slice could not be read: {exc!r}") from exc

    def close(self, generation: int | None = None) -> None:
        with self._lock:
            if generation is not None and generation != self._planned:
                return  # a newer generation is this learner's now
            self.generation, self._planned = None, None
            self._outputs, self._inputs = [], []
