"""The averaging round's bytes through shared-memory channels, for a group whose membership holds still.

A store round makes new objects and passes references every round (docs/ARCHITECTURE.md, "What a round
costs beyond its bytes"); a channel (``ray.experimental.channel``) is a buffer its writer overwrites in
place. Once a group averaged a round with every member present, the control plane plans a *generation*
for that membership: learner m writes slice i into its channel to shard i; shard i writes its merged
slice into one channel every member reads; a ``Channelled`` marker names such a part in the round's
messages. Anything that changes who takes part (a drop, a join, a refused round, a shard that lost its
channels) ends the generation, and rounds go through the store until the next full round plans another.
Old channels are never closed (closing one mid-read crashes a raylet, ray-project/ray#63229); every read
and write is bounded by the round's timeout. A buffer lives until its maker exits, so early ends are
capped at ``max_ended`` a run ("Measurements behind the code"). Opt-in (``train.averager_channels``): a
node lost while channels link aborts the processes linking to it (a RAY_CHECK in Ray's core worker).
``ChannelBook`` is the control plane's policy (it returns decisions); ``ChannelEnds`` a learner's side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from raytrain_seq.members.ids import LearnerId

__all__ = ["ChannelBook", "ChannelEnds", "ChannelLost", "ChannelPlan", "Channelled", "Link"]


@dataclass(frozen=True)
class Channelled:
    """A part that travelled through generation ``generation``'s channels, not the object store: in a
    learner's payload, its slice for this position's shard (``writer``: the learner's member index); in
    a round's result, shard ``writer``'s merged slice. A channel carries ``(round, part)``: a reader
    checks that it read the round it was told of, so channels that fell out of step end the generation
    instead of merging the wrong round."""

    generation: int
    writer: int
    round: int


@dataclass(frozen=True)
class ChannelPlan:
    """A generation to link: its members in order and the shards every member writes to."""

    generation: int
    members: tuple[LearnerId, ...]
    shards: tuple[tuple[Any, str], ...]
    """Per shard, (its actor handle, its node id): the reader of each member's channel to it."""

    def index(self, learner: LearnerId) -> int:
        """``learner``'s member index (its channels' position in every shard's inputs)."""
        return self.members.index(learner)


@dataclass(frozen=True)
class Link:
    """What one member brings to its generation: its channel to each shard, and itself as a reader."""

    outputs: tuple[Any, ...]
    """Its channel to shard i at i."""
    reader: tuple[Any, str]
    """(its actor handle, its node id): a reader of every shard's merged slices."""
    nbytes: tuple[int, ...]
    """The bytes of its slice i (every member's are alike): the size of shard i's channel."""


@dataclass
class ChannelBook:
    """The control plane's channel generations: at most one planned or live at a time."""

    enabled: bool
    generation: int = 0
    plan: ChannelPlan | None = None
    links: dict[LearnerId, Link] = field(default_factory=dict)
    inputs: tuple[Any, ...] | None = None
    """Once live: shard i's channel of merged slices at i."""
    failed: int = 0
    """Generations ended before or while they were used (a drop, a join, a lost shard)."""
    max_ended: int = 3
    """After this many ended generations no more are planned (each leaves its buffers in the store)."""
    used: bool = False
    """A round of the live generation went through its channels."""

    @property
    def live(self) -> bool:
        return self.plan is not None and self.inputs is not None

    def propose(
        self,
        members: Sequence[LearnerId],
        expected: Sequence[LearnerId],
        dropped: Sequence[LearnerId],
        flat: bool,
        world_size: int,
    ) -> bool:
        """Whether the round just closed (``members`` averaged, ``dropped`` left out, ``expected``: the
        learners the group waits for, ``world_size`` of them when none is missing) should plan a
        generation: channels are on, no generation exists, the round was flat and the whole group took
        part (a group short of a dropped member would end it again when that one rejoins)."""
        return (
            self.enabled
            and self.failed < self.max_ended
            and self.plan is None
            and flat
            and not dropped
            and len(members) == world_size
            and sorted(map(repr, members)) == sorted(map(repr, expected))
        )

    def start(self, members: Sequence[LearnerId], shards: Sequence[tuple[Any, str]]) -> ChannelPlan:
        """Plan the next generation for ``members`` (in the round's order)."""
        self.generation += 1
        self.plan = ChannelPlan(self.generation, tuple(members), tuple(shards))
        self.links, self.inputs = {}, None
        return self.plan

    def link(self, generation: int, learner: LearnerId, link: Link) -> str:
        """Record a member's link: "refused" (not this generation's member, or the generation ended),
        "waiting" (others still to link) or "complete" (the last one: the control plane opens the shards'
        channels now)."""
        plan = self.plan
        if plan is None or plan.generation != generation or learner not in plan.members or self.live:
            return "refused"
        if len(link.outputs) != len(plan.shards):
            raise ValueError(
                f"learner {learner!r} linked {len(link.outputs)} channels for {len(plan.shards)} shards: "
                "open one channel to each shard of the plan"
            )
        self.links[learner] = link
        return "complete" if len(self.links) == len(plan.members) else "waiting"

    def shard_inputs(self) -> list[list[Any]]:
        """Per shard i, every member's channel to it in member order (what shard i reads)."""
        plan = self.plan
        return [[self.links[m].outputs[i] for m in plan.members] for i in range(len(plan.shards))]

    def readers(self) -> list[tuple[Any, str]]:
        """Every member as a reader of the shards' merged slices, in member order."""
        return [self.links[m].reader for m in self.plan.members]

    def opened(self, generation: int, inputs: Sequence[Any]) -> bool:
        """The shards' channels of generation ``generation`` are open: it is live, unless it ended meanwhile."""
        if self.plan is None or self.plan.generation != generation:
            return False
        self.inputs = tuple(inputs)
        return True

    def accepts(self, generation: int, present: Sequence[LearnerId]) -> bool:
        """Whether a round whose ``present`` learners sent channelled parts of ``generation`` may have its
        merged slices written into the channels: the generation is live and every member is present
        (a member left out would never read them, and the shards' next write would wait for it)."""
        return (
            self.live
            and self.plan.generation == generation
            and sorted(map(repr, present)) == sorted(map(repr, self.plan.members))
        )

    def keeps(self, present: Sequence[LearnerId], channelled: int, written: bool) -> bool:
        """Whether the live generation survives a round that closed with ``present`` (``channelled`` of
        them sent through its channels; ``written``: its merged slices went into them). It ends when a
        member is missing, or when a member that used the channels sends through the store (its write
        failed). A round in which some members have not attached yet (they link in the background) while
        the others already sent through the channels keeps it: the shards read what was written, wrote
        nothing, and every channel is where it was. E.g. members (0, 1), 0 attached, 1 not yet: the
        round merges 0's channel and 1's objects, and the next round goes through both channels."""
        if not self.live:
            return False
        if sorted(map(repr, present)) != sorted(map(repr, self.plan.members)):
            return False
        if written:
            self.used = True
            return True
        return channelled == 0 or not self.used

    def end(self) -> int | None:
        """End the planned or live generation (its channels are left as they are: see the module
        docstring); which one ended, or None when there was none."""
        if self.plan is None:
            return None
        generation = self.plan.generation
        self.failed += 1 if self.live or self.links else 0
        self.plan, self.links, self.inputs, self.used = None, {}, None, False
        return generation


class ChannelEnds(Protocol):
    """A learner's ends of a generation's channels (``runtime.channels.RayChannelEnds``)."""

    generation: int | None
    """The live generation this learner is linked to, or None (its rounds go through the store)."""

    def open(self, plan: ChannelPlan, slices: Sequence[Any]) -> Link:
        """Make this learner's channel to each shard of ``plan``, sized for ``slices`` (its slices)."""

    def attach(self, generation: int, inputs: Sequence[Any], member: int) -> bool:
        """The generation is live: ``inputs[i]`` is shard i's channel of merged slices; False when this
        learner has moved on since it opened ``generation`` (a rejoin closed it): nothing attached."""

    def write(self, round: int, slices: Sequence[Any], timeout_s: float) -> tuple[Channelled, ...] | None:
        """Write round ``round``'s slice i to shard i; the parts to send, or None when not linked or a
        write failed (the link is dropped: the caller puts the slices in the store instead)."""

    def read(self, parts: Sequence[Channelled], timeout_s: float) -> list[Any]:
        """The merged slices behind ``parts`` (views into the channels, valid until this learner's
        next read of them); raises ``ChannelLost`` when the generation ended."""

    def close(self, generation: int | None = None) -> None:
        """Forget the generation (only ``generation``, when given and still this learner's): the next
        rounds go through the store until another is linked."""


class ChannelLost(RuntimeError):
    """A generation's channel failed or timed out under a learner, or held another round: its round
    goes through the store."""
