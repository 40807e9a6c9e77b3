"""The policy of an AAVG averaging round, in plain Python: who is expected, who came, who is dropped.

``RoundBook`` keeps the round number, the members, the arrivals and a deadline ``timeout_s`` after the
first arrival; when everyone expected has arrived, or the deadline passes, the round closes and the
missing learners are dropped with a recorded reason (``dropped_log``). Callers must agree on the round
and on the world size; a late, repeated or skipped-ahead round is a ``StaleRoundError`` naming the
learner, a disagreement on the world size a ``MembershipError``, and a round with fewer than
``min_learners`` arrivals an ``AveragingTimeoutError`` listing the missing ones. The errors are
picklable (they cross Ray's process boundary intact). The clock is injectable, so the whole policy is
unit-tested without a cluster or an event loop; ``raytrain_seq.dist.averager`` wraps it in an actor.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

Learner = str | int


# ------------------------------------------------------------------------------------------------ errors
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

    def __init__(self, learner: Learner, sent_round: int, expected_round: int, detail: str = "") -> None:
        super().__init__(learner=learner, sent_round=sent_round, expected_round=expected_round, detail=detail)

    def _message(self) -> str:
        why = f" ({self.detail})" if self.detail else ""
        return (
            f"learner {self.learner!r} sent round {self.sent_round} but the averager expects round "
            f"{self.expected_round}{why}: call join() to resync from the latest averaged state"
        )


class MembershipError(AveragerError):
    """A caller disagrees on the world size, or it is not a registered learner."""

    def __init__(self, learner: Learner, sent_world_size: int, world_size: int, detail: str = "") -> None:
        super().__init__(
            learner=learner, sent_world_size=sent_world_size, world_size=world_size, detail=detail
        )

    def _message(self) -> str:
        why = self.detail or "callers disagree on the world size; start every learner with the same one"
        return f"learner {self.learner!r} sent world size {self.sent_world_size}, the averager's is {self.world_size}: {why}"


def check_learner(learner: Any) -> None:
    if isinstance(learner, bool) or not isinstance(learner, str | int):
        raise TypeError(f"learner must be a str or int id, got {learner!r}: pass e.g. the learner's rank")


def check_number(name: str, value: Any, low: float, kind: Any = int) -> Any:
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value) and value >= low
    if not ok:
        what = "an int" if kind is int else "a number"
        raise ValueError(
            f"{name} must be {what} >= {low:g}, got {value!r}: pass a finite value of at least {low:g}"
        )
    return value


def _order(learners: Any) -> list[Learner]:
    """Sorted ids (ints before strs): a round's result never depends on the order of arrival."""
    return sorted(learners, key=lambda x: (isinstance(x, str), x))


# ----------------------------------------------------------------------------------------- bookkeeping
@dataclass(frozen=True)
class RoundClose:
    """What closing a round decided: who is averaged (with payloads), who was dropped, or the error."""

    round: int
    present: tuple[tuple[Learner, Any], ...]
    dropped: tuple[Learner, ...]
    opened_at: float
    error: AveragingTimeoutError | None = None


class RoundBook:
    """Who is expected, who arrived, the open round and its deadline, who was dropped and why.

    Round n goes "idle" (nobody sent it yet) -> "open" (the first arrival froze the expected set to the
    active members and set deadline = first arrival + timeout_s) -> "closing" (close() accepted it; the
    caller averages) -> finish() -> round n+1 "idle". A learner that joins while n is open is pending and
    takes part from n+1. Rounds start at 1 as in Algorithm 1. No ray, no asyncio; the clock is injected.
    """

    def __init__(
        self,
        world_size: int,
        *,
        timeout_s: float,
        min_learners: int = 1,
        validate_every: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.world_size = check_number("world_size", world_size, 1)
        self.timeout_s = float(check_number("timeout_s", timeout_s, 0.001, int | float))
        self.min_learners = check_number("min_learners", min_learners, 1)
        if min_learners > world_size:
            raise ValueError(f"min_learners {min_learners} > world_size {world_size}: lower min_learners")
        self.validate_every = check_number("validate_every", validate_every, 0)
        self._clock = clock
        self.round, self.phase, self.opening = 1, "idle", 0
        self.opened_at: float | None = None
        self.deadline: float | None = None
        self.validation_due: int | None = None
        self._active: set[Learner] = set()
        self._pending: set[Learner] = set()
        self._expected: frozenset[Learner] = frozenset()
        self._arrivals: dict[Learner, Any] = {}
        self._dropped: dict[Learner, dict[str, Any]] = {}
        self.dropped_log: list[dict[str, Any]] = []
        self.membership_log: list[dict[str, Any]] = []

    @property
    def expected(self) -> list[Learner]:
        return _order(self._expected)

    @property
    def arrived(self) -> list[Learner]:
        return _order(self._arrivals)

    @property
    def missing(self) -> list[Learner]:
        return _order(self._expected - set(self._arrivals))

    @property
    def dropped(self) -> dict[Learner, str]:
        """Learners dropped and not rejoined -> the reason."""
        return {learner: record["reason"] for learner, record in self._dropped.items()}

    @property
    def first_payload(self) -> Any:
        """The payload of the open round's first arrival (None while idle)."""
        return next(iter(self._arrivals.values()), None)

    @property
    def complete(self) -> bool:
        return self.phase == "open" and not self.missing

    def expired(self) -> bool:
        return self.phase == "open" and self._clock() >= self.deadline

    def next_round_for(self, learner: Learner) -> int:
        """The round this learner sends next: one not expected in the open round waits for the one after."""
        return self.round + 1 if self.phase != "idle" and learner not in self._expected else self.round

    def _log_member(self, event: str, learner: Learner | None, detail: str = "") -> None:
        record = {"time": time.time(), "round": self.round, "event": event, "learner": learner}
        self.membership_log.append({**record, "detail": detail})

    def join(self, learner: Learner, world_size: int | None = None) -> int:
        """Register (or re-register) a learner; returns the round it must send next."""
        check_learner(learner)
        if world_size is not None and world_size != self.world_size:
            raise MembershipError(learner, world_size, self.world_size)
        members = self._active | self._pending
        if learner not in members and len(members) >= self.world_size:
            why = f"the group is full with {_order(members)}; call set_world_size() first to grow it"
            raise MembershipError(learner, len(members) + 1, self.world_size, why)
        event = "rejoin" if learner in members or learner in self._dropped else "join"
        self._dropped.pop(learner, None)
        if self.phase == "idle" or learner in self._arrivals:
            self._active.add(learner)
        else:  # a restarted learner must not hold up the round it can no longer send
            self._expected -= {learner}
            self._active.discard(learner)
            self._pending.add(learner)
        self._log_member(event, learner)
        return self.next_round_for(learner)

    def leave(self, learner: Learner) -> None:
        """Remove a learner for good (scale-down); an open round stops waiting for it."""
        if learner not in self._active | self._pending | set(self._dropped):
            raise ValueError(f"learner {learner!r} is not registered: there is nothing to remove")
        self._active.discard(learner)
        self._pending.discard(learner)
        self._dropped.pop(learner, None)
        if learner not in self._arrivals:
            self._expected -= {learner}
        self._log_member("leave", learner)

    def set_world_size(self, world_size: int) -> None:
        """Resize the group; from now on callers must send this world size."""
        check_number("world_size", world_size, max(1, self.min_learners))
        members = self._active | self._pending
        if len(members) > world_size:
            raise ValueError(
                f"world_size {world_size} < {len(members)} registered learners {_order(members)}: "
                "call leave() for the learners that go first"
            )
        self._log_member("world_size", None, f"{self.world_size} -> {world_size}")
        self.world_size = world_size

    def check(self, learner: Learner, round: int, world_size: int) -> None:
        """Raise the typed error that arrive() would raise, changing nothing."""
        check_learner(learner)
        check_number("round", round, 1)
        if world_size != self.world_size:
            raise MembershipError(learner, world_size, self.world_size)
        if learner in self._dropped:
            record = self._dropped[learner]
            why = f"it was dropped from round {record['round']}: {record['reason']}"
            raise StaleRoundError(learner, round, self.round, why)
        if learner not in self._active | self._pending:
            raise MembershipError(
                learner, world_size, self.world_size, "it is not registered: call join() first"
            )
        if self.phase == "closing" or learner in self._pending:
            why = f"round {self.round} is still being averaged and this learner takes part from the next one"
            raise StaleRoundError(learner, round, self.round + 1, why)
        if round != self.round:
            why = "that round is closed" if round < self.round else "it skipped ahead"
            raise StaleRoundError(learner, round, self.round, why)
        if learner in self._arrivals:
            raise StaleRoundError(learner, round, round + 1, "it already sent this round")

    def arrive(self, learner: Learner, round: int, world_size: int, payload: Any = None) -> bool:
        """Record that a learner sent round `round`; returns True when every expected learner is in."""
        self.check(learner, round, world_size)
        if self.phase == "idle":
            self.phase, self.opening = "open", self.opening + 1
            self._expected = frozenset(self._active)
            self.opened_at = self._clock()
            self.deadline = self.opened_at + self.timeout_s
        self._arrivals[learner] = payload
        return self.complete

    def _drop(self, learner: Learner, reason: str) -> None:
        record = {"round": self.round, "learner": learner, "reason": reason, "time": time.time()}
        self._dropped[learner] = record
        self._active.discard(learner)
        self.dropped_log.append(record)
        self._log_member("drop", learner, reason)
        logger.warning("averager: dropped learner %r from round %d: %s", learner, self.round, reason)

    def close(self) -> RoundClose:
        """Close the open round (complete, or past its deadline): drop the missing, check min_learners.

        On success the book is "closing" until finish(); on failure it is idle again at the same round,
        with the missing dropped, so those present can resend it once enough learners are back.
        """
        if self.phase != "open":
            raise RuntimeError(f"round {self.round} is {self.phase}, not open: there is nothing to close")
        if not self.complete and not self.expired():
            raise RuntimeError(f"round {self.round} is waiting for {self.missing} until its deadline")
        missing = self.missing
        for learner in missing:
            self._drop(
                learner, f"did not send round {self.round} within {self.timeout_s:g} s of the first arrival"
            )
        present = self.arrived
        if len(present) < self.min_learners:
            absent = _order(set(missing) | set(self._dropped))
            error = AveragingTimeoutError(self.round, absent, present, self.timeout_s)
            logger.warning("averager: %s", error)
            closed = RoundClose(self.round, (), tuple(missing), self.opened_at, error)
            self._settle()
            return closed
        self.phase = "closing"
        pairs = tuple((learner, self._arrivals[learner]) for learner in present)
        return RoundClose(self.round, pairs, tuple(missing), self.opened_at)

    def finish(self, ok: bool = True) -> None:
        """After close(): ok advances to the next round (and marks a validation due); not ok keeps it."""
        if self.phase != "closing":
            raise RuntimeError(f"round {self.round} is {self.phase}: call close() first")
        if ok:
            if self.validate_every and self.round % self.validate_every == 0:
                self.validation_due = self.round
            self.round += 1
        self._settle()

    def _settle(self) -> None:
        self.phase, self.opened_at, self.deadline = "idle", None, None
        self._arrivals, self._expected = {}, frozenset()
        self._active |= self._pending
        self._pending = set()

    def report_validation(self, round: int, learner: Learner = "validator") -> None:
        """Accept the validation of `round`, which must be the one due (Algorithm 1 line 13: n % m == 0)."""
        check_number("round", round, 1)
        if not self.validate_every or round % self.validate_every:
            raise ValueError(
                f"round {round} is not a validation round (validate_every={self.validate_every}): "
                "report only rounds r with r % validate_every == 0"
            )
        if self.validation_due == round:
            self.validation_due = None
            return
        # Nothing due: the next validation round at or after the open one, e.g. round 5, m=2 -> 6.
        due = self.validation_due or -(-self.round // self.validate_every) * self.validate_every
        why = (
            "its window closed or it was reported already"
            if round < due
            else "that round is not averaged yet"
        )
        raise StaleRoundError(learner, round, due, why)

    def miss_validation(self) -> int | None:
        """Give up on the due validation (its reporter stalled); returns the round that was due."""
        due, self.validation_due = self.validation_due, None
        return due

    def restore(self, last_round: int, validation_due: int | None, dropped_log: Any) -> None:
        """Continue after `last_round` (a checkpoint's); members are kept (a restarted actor has none)."""
        if self.phase != "idle":
            raise RuntimeError(f"round {self.round} is {self.phase}: restore only an idle averager")
        self.round = check_number("round", last_round, 0) + 1
        self.validation_due = validation_due
        self.dropped_log = [dict(record) for record in dropped_log]
        self._log_member("restore", None, f"from round {last_round}")


# ------------------------------------------------------------------------------------------ the actor
