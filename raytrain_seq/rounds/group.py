"""Live groups: the learner group changes at a round's close, without restarting anyone.

A learner is identified by its *slot* (an int, stable for the run); the group is the sorted tuple of
the slots taking part, a learner's rank its index there and the world size its length (``place``).
``LiveGroup`` is the pending membership of a live ``RoundBook`` (``RoundBook(live=True)``): the members
``lost`` (their process died; they leave at the next close, and the open round stops waiting for them
at once) and the newcomers ``joining`` (they enter at the next close). The close that applies them
publishes the next group (``RoundClose.group``, then ``RoundResult.group``); the survivors continue
from that round's position, dealt over the new group (``rounds.position``: ``for_group``, ``resplit``).
``GroupChanges`` is the averager's asyncio side: a newcomer's join awaits the close that takes it in,
with no polling loop. No Ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from raytrain_seq.members.errors import MembershipError
from raytrain_seq.members.ids import LearnerId, ordered

__all__ = ["GroupChanges", "LiveGroup", "place"]


def place(group: tuple[LearnerId, ...], learner: LearnerId) -> tuple[int, int]:
    """(rank, world size) of ``learner`` in ``group``: its index and the group's length."""
    if learner not in group:
        raise ValueError(f"learner {learner!r} is not in the group {list(group)}: it was lost or replaced")
    return group.index(learner), len(group)


@dataclass
class LiveGroup:
    """The live membership bookkeeping of a round book (plain data; the book changes it).

    ``group`` is None while a generation's first group forms (the launched learners join; their ids
    are their ranks); the first close with every member in fixes it. ``deciding`` holds what the
    closing round decided: (next group, the lost it removes, the newcomers it adds), applied when the
    round finishes. ``admitted``: slot -> the incarnation a close took in (a waiting join checks it).
    """

    group: tuple[LearnerId, ...] | None = None
    lost: dict[LearnerId, str | None] = field(default_factory=dict)
    joining: dict[LearnerId, str | None] = field(default_factory=dict)
    deciding: tuple | None = None
    admitted: dict[LearnerId, str | None] = field(default_factory=dict)
    changes: int = 0

    @property
    def pending(self) -> bool:
        """Whether a change waits for the next close."""
        return bool(self.lost or self.joining)

    def ranks(self, learners: Iterable[LearnerId]) -> list:
        """The ranks of ``learners`` in the current group (while it forms, the ids themselves)."""
        if self.group is None:
            return list(learners)
        return [self.group.index(learner) for learner in learners]

    def leaving_ranks(self) -> tuple[int, ...]:
        """The ranks in the current group of the lost members the closing round removes (``deciding``;
        while the first group forms, their ids), sorted; () when no change is being decided."""
        if self.deciding is None:
            return ()
        return tuple(sorted(self.ranks(self.deciding[1])))

    def waiting(self, learner: LearnerId, incarnation: str | None) -> bool:
        """Whether this process of ``learner`` is a newcomer waiting for a close."""
        return learner in self.joining and self.joining[learner] == incarnation

    def next_group(self, members: Iterable[LearnerId]) -> tuple[LearnerId, ...]:
        """The group once the pending changes apply to ``members`` (the current ones)."""
        after = (set(members) - set(self.lost)) | set(self.joining)
        return tuple(ordered(after))


class GroupChanges:
    """Wakes the joins that wait for a group change (``changed``, called once one is applied)."""

    def __init__(self) -> None:
        self._next: asyncio.Future | None = None

    def changed(self) -> None:
        """A change was applied: every waiting join looks again."""
        future, self._next = self._next, None
        if future is not None and not future.done():
            future.set_result(None)

    async def admitted(self, live: LiveGroup, learner: LearnerId, incarnation: str | None) -> None:
        """Wait until a close takes this newcomer in; MembershipError when its join was given up (it was
        lost while waiting, or another process of its slot joined since)."""
        while live.waiting(learner, incarnation):
            if self._next is None:
                self._next = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._next)
        group = live.group or ()
        if learner not in group or live.admitted.get(learner) != incarnation or learner in live.lost:
            why = "its join was given up (it was lost, or another process of its slot joined)"
            raise MembershipError(learner, 0, len(group), why)
