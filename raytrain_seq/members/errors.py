"""The typed errors the averager answers its members with, each naming the learner, what it sent and
the fix.

``AveragerError`` is the base; a late, repeated or skipped-ahead round is a ``StaleRoundError``, a
disagreement on the world size (or an unregistered caller) a ``MembershipError``, a round with fewer
than ``min_learners`` arrivals an ``AveragingTimeoutError`` listing the missing ones, a round whose
merge a shard never answered a ``ShardUnavailableError``, and an averager that does not answer within a
learner's retry budget an ``AveragerUnavailableError``. Each keeps its
fields through pickling: Ray ships it from the averager's process to the learners' by class path, and
both sides run the same code.
"""

from __future__ import annotations

from typing import Any

from raytrain_seq.members.ids import LearnerId

__all__ = [
    "AveragerError",
    "AveragerUnavailableError",
    "AveragingTimeoutError",
    "MembershipError",
    "ShardUnavailableError",
    "StaleRoundError",
]


class AveragerError(RuntimeError):
    """Base of the typed errors. Each keeps its fields through pickling (Ray ships it to the learners)."""

    def __init__(self, **values: Any) -> None:
        self._fields = tuple(values)
        self.__dict__.update(values)
        super().__init__(self._message())

    def _message(self) -> str:
        raise NotImplementedError

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), tuple(getattr(self, name) for name in self._fields)


class AveragingTimeoutError(AveragerError):
    """Fewer than min_learners arrived in time; raised to the learners that did arrive."""

    def __init__(self, round: int, missing: Any, arrived: Any, timeout_s: float) -> None:
        super().__init__(round=round, missing=tuple(missing), arrived=tuple(arrived), timeout_s=timeout_s)

    def _message(self) -> str:
        return (
            f"averaging round {self.round} failed: only {list(self.arrived)} arrived within "
            f"{self.timeout_s:g} s of the first arrival; missing learners {list(self.missing)}. Rejoin "
            f"(join()) or restart them and resend round {self.round}, or lower min_learners"
        )


class StaleRoundError(AveragerError):
    """A learner sent a closed round (or one it was dropped from), repeated one, or skipped ahead."""

    def __init__(self, learner: LearnerId, sent_round: int, expected_round: int, detail: str = "") -> None:
        super().__init__(learner=learner, sent_round=sent_round, expected_round=expected_round, detail=detail)

    def _message(self) -> str:
        why = f" ({self.detail})" if self.detail else ""
        return (
            f"learner {self.learner!r} sent round {self.sent_round} but the averager expects round "
            f"{self.expected_round}{why}: call join() to resync from the latest averaged state"
        )


class MembershipError(AveragerError):
    """A caller disagrees on the world size, or it is not a registered learner."""

    def __init__(self, learner: LearnerId, sent_world_size: int, world_size: int, detail: str = "") -> None:
        super().__init__(
            learner=learner, sent_world_size=sent_world_size, world_size=world_size, detail=detail
        )

    def _message(self) -> str:
        why = self.detail or "callers disagree on the world size; start every learner with the same one"
        return f"learner {self.learner!r} sent world size {self.sent_world_size}, the averager's is {self.world_size}: {why}"


class AveragerUnavailableError(AveragerError):
    """The averager did not answer within the learner's retry budget (it died for good or hangs)."""

    def __init__(self, call: str, attempts: int, seconds: float, cause: str) -> None:
        super().__init__(call=call, attempts=attempts, seconds=seconds, cause=cause)

    def _message(self) -> str:
        return (
            f"the averager did not answer {self.call}() in {self.attempts} tries over {self.seconds:.0f} s "
            f"(last error: {self.cause}): it died past train.averager_max_restarts or its node is gone; "
            "raise --averager-max-restarts, or --resume the run from its latest checkpoint"
        )


class ShardUnavailableError(AveragerError):
    """A shard did not answer a call of a round's close (``dataplane.shard_calls.answers``): the round
    fails, and its learners rejoin and resend it."""

    def __init__(self, call: str, shard: int, detail: str) -> None:
        super().__init__(call=call, shard=shard, detail=detail)

    def _message(self) -> str:
        return (
            f"shard {self.shard} did not answer {self.call}: {self.detail}; the round fails and its learners "
            "resend it (Ray restarts a shard on another node when its node dies: if this repeats, "
            "`ray status` shows whether a node can host it)"
        )
