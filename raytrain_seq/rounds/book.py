"""The policy of an AAVG averaging round, in plain Python: who is expected, who came, who is dropped.

``RoundBook`` keeps the round number and the members; ``current`` (``rounds.current_round``) holds the
arrivals and a deadline ``timeout_s`` after the first one. The round closes when every expected learner
arrived and at least ``quorum`` (world size less the dropped) did, or at the deadline, when the missing
are dropped with a recorded reason (``dropped_log``); so are those whose payload could not be read
(``drop_unread``). A late, repeated or skipped-ahead round is a ``StaleRoundError``, a world-size
disagreement a ``MembershipError``, fewer than ``min_learners`` arrivals an ``AveragingTimeoutError``
(``members.errors``). The clock is injected, so tests need no cluster; ``runtime.averager`` wraps the book.
Elastic groups: every learner process joins with a fresh ``incarnation``, so the first join of a new
process under a known id (or with another world size) starts a new generation: the old group's open
round is abandoned, members and world size replaced, old incarnations refused. A learner joining
mid-round takes part in the open round, which can keep the others waiting up to ``timeout_s``. Live
groups (``live=True``, ``rounds.group``): a loss (``lose``) or a newcomer changes it at the next close.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raytrain_seq.checks import check_number
from raytrain_seq.members.errors import AveragingTimeoutError, MembershipError, StaleRoundError
from raytrain_seq.members.ids import LearnerId, check_learner, ordered
from raytrain_seq.rounds.current_round import CurrentRound, RoundPhase
from raytrain_seq.rounds.group import LiveGroup

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------- bookkeeping
@dataclass(frozen=True)
class RoundClose:
    """What closing a round decided: who is averaged (with payloads), who was dropped, or the error."""

    round: int
    present: tuple[tuple[LearnerId, Any], ...]
    dropped: tuple[LearnerId, ...]
    opened_at: float
    error: AveragingTimeoutError | None = None
    group: tuple[LearnerId, ...] | None = None
    """Live groups: the group after this round (None: unchanged), applied when it finishes."""


class RoundBook:
    """Who is expected, who arrived, the open round and its deadline, who was dropped and why.

    Round n goes "idle" (nobody sent it yet) -> "open" (the first arrival set the expected set to the
    active members and deadline = first arrival + timeout_s) -> "closing" (close() accepted it; the
    caller averages) -> finish() -> round n+1 "idle". A learner that joins while n is open starts from
    round n-1's state and is expected in n; one that joins while n is closing takes part from n+1.
    ``current`` (a ``CurrentRound``) holds round n's phase, opening, deadline, expected set and arrivals
    (``current.phase``, ``current.missing``, ...); the book keeps the number ``round`` and the members.
    Rounds start at 1 as in Algorithm 1. ``sink`` receives every membership record as it is logged.
    ``live``: group changes wait for a round's close (``rounds.group``; ``live`` holds them, else None).
    No ray, no asyncio; the clock is injected.
    """

    def __init__(
        self,
        world_size: int,
        *,
        timeout_s: float,
        min_learners: int = 1,
        clock: Callable[[], float] = time.monotonic,
        sink: Callable[[dict[str, Any]], None] | None = None,
        live: bool = False,
    ) -> None:
        self.world_size = check_number("world_size", world_size, 1)
        self.timeout_s = float(check_number("timeout_s", timeout_s, 0.001, int | float))
        self.min_learners = check_number("min_learners", min_learners, 1)
        if min_learners > world_size:
            raise ValueError(f"min_learners {min_learners} > world_size {world_size}: lower min_learners")
        self._sink = sink
        self.round, self.generation = 1, 0
        self.current = CurrentRound(clock)
        self.restarted = False  # set by an averager that came back from a crash: its first group rejoins
        self._active: set[LearnerId] = set()
        self._pending: set[LearnerId] = set()
        self._gone: set[LearnerId] = set()
        self._dropped: dict[LearnerId, dict[str, Any]] = {}
        self.incarnations: dict[LearnerId, str] = {}  # this generation's learners -> their processes' ids
        self._retired: set[str] = set()
        self.dropped_log: list[dict[str, Any]] = []
        self.membership_log: list[dict[str, Any]] = []
        self.live = LiveGroup() if live else None

    @property
    def dropped(self) -> dict[LearnerId, str]:
        """Learners dropped and not rejoined -> the reason."""
        return {learner: record["reason"] for learner, record in self._dropped.items()}

    @property
    def quorum(self) -> int:
        """Arrivals a round needs before it may close early: the world less the dropped and the departed."""
        lost = set(self.live.lost) - set(self._dropped) - self._gone if self.live is not None else ()
        return max(1, self.world_size - len(self._dropped) - len(self._gone) - len(lost))

    @property
    def complete(self) -> bool:
        current = self.current
        return (
            current.phase == RoundPhase.OPEN and not current.missing and len(current.arrivals) >= self.quorum
        )

    def next_round_for(self, learner: LearnerId) -> int:
        """The round this learner sends next: the open (or idle) one, or the one after a closing one."""
        return self.round + 1 if self.current.phase == RoundPhase.CLOSING else self.round

    def _log_member(
        self, event: str, learner: LearnerId | None, detail: str = "", change: bool = False
    ) -> None:
        """Record a membership event; ``change`` marks one that changes how many learners train."""
        record = {"time": time.time(), "round": self.round, "event": event, "learner": learner}
        record.update(detail=detail, learners=self.quorum, change=change, generation=self.generation)
        self.membership_log.append(record)
        if self._sink is not None:
            self._sink(record)

    def regroup(self, world_size: int) -> list[LearnerId]:
        """Start a new generation of ``world_size`` learners; returns the open round's abandoned senders.

        The round number stays (the new group sends the round the old one could not finish); the old
        members, drops and incarnations are forgotten, and the old incarnations refused from now on.
        """
        if self.current.phase == RoundPhase.CLOSING:
            raise RuntimeError(f"round {self.round} is being averaged: regroup after finish()")
        check_number("world_size", world_size, max(1, self.min_learners))
        abandoned = self.abandon()
        old, first = self.world_size, self.generation == 0
        self._retired |= set(self.incarnations.values())
        self._active, self._pending, self._gone, self._dropped, self.incarnations = (
            set(),
            set(),
            set(),
            {},
            {},
        )
        self.world_size, self.generation = world_size, self.generation + 1
        if self.live is not None and not first:
            # A live book regroups only for its first group, and keeps its LiveGroup then: a newcomer
            # whose join came first waits in it (its join awaits that object) for the group's first close.
            self.live = LiveGroup()
        if first:
            why = "learners rejoined the restarted averager" if self.restarted else "learners started"
        else:
            how = (
                "fewer: a learner or its node was lost" if world_size < old else "more: the cluster has room"
            )
            how = how if world_size != old else "as many: a learner failed"
            why = f"Ray Train restarted the learner group with {how} ({old} -> {world_size})"
        if abandoned:
            why += f"; round {self.round} from {abandoned} abandoned"
        self._log_member("group", None, why, change=True)
        return abandoned

    def abandon(self) -> list[LearnerId]:
        """Give up the open round (its senders are gone or its base was superseded); keeps its number."""
        if self.current.phase == RoundPhase.CLOSING:
            raise RuntimeError(f"round {self.round} is being averaged: it cannot be abandoned")
        abandoned = self.current.arrived if self.current.phase == RoundPhase.OPEN else []
        self._settle()
        return abandoned

    def join(self, learner: LearnerId, world_size: int | None = None, incarnation: str | None = None) -> int:
        """Register (or re-register) a learner; returns the round it must send next.

        With an ``incarnation`` (one id per learner process) the first join of a new group regroups.
        Live, once the first group joined: a newcomer, or a new process of a member (the old one is then
        lost), waits in ``live.joining`` for the next close; it returns the earliest round it can send.
        """
        check_learner(learner)
        if incarnation is not None and incarnation in self._retired:
            why = "its learner group was replaced by a newer one; this process should exit"
            raise MembershipError(learner, world_size or self.world_size, self.world_size, why)
        if _starts_group(self, learner, world_size, incarnation):
            self.regroup(world_size or self.world_size)
        if self.live is not None and _joins_later(
            self, learner, incarnation, launched=world_size is not None
        ):
            return self.round + (2 if self.current.phase == RoundPhase.CLOSING else 1)
        formed = self.live is not None and self.live.group is not None  # live: the reply gives the size
        if world_size is not None and world_size != self.world_size and not formed:
            raise MembershipError(learner, world_size, self.world_size)
        members = self._active | self._pending
        if learner not in members and len(members) >= self.world_size:
            why = f"the group is full with {ordered(members)}; call set_world_size() first to grow it"
            raise MembershipError(learner, len(members) + 1, self.world_size, why)
        returning = learner in self._dropped or learner in self._gone
        event = "rejoin" if learner in members or returning else "join"
        self._dropped.pop(learner, None)
        self._gone.discard(learner)
        if incarnation is not None:
            self.incarnations[learner] = incarnation
        if self.current.phase == RoundPhase.CLOSING and learner not in self.current.arrivals:
            self._pending.add(learner)  # the round is being averaged without it: it takes part in the next
        else:
            self._active.add(learner)
            if self.current.phase == RoundPhase.OPEN:
                self.current.expect(learner)  # it starts from round n-1's state, so it can send round n
        self._log_member(event, learner, change=returning)
        return self.next_round_for(learner)

    def lose(self, learner: LearnerId, incarnation: str | None = None) -> bool:
        """Live: ``learner``'s process died. The open round stops waiting for it at once (a payload it
        sent stays averaged, its rows of the round become missed) and it leaves the group at the next
        close; a waiting newcomer is forgotten; a launched learner that never joined the forming group
        is not waited for. Returns whether anything changed: an unknown learner, one lost already, or an
        ``incarnation`` other than the known one (already replaced) changes nothing."""
        if self.live is None:
            raise RuntimeError("lose() needs a live round book: RoundBook(..., live=True)")
        live, members = self.live, _members(self)
        known = self.incarnations.get(learner)
        deciding = live.deciding is not None and learner in live.deciding[2]  # the closing round takes it in
        if learner in live.joining and incarnation in (None, live.joining[learner]) and not deciding:
            gone = live.joining.pop(learner)
            if gone is not None:
                self._retired.add(gone)
            self._log_member("lose", learner, "a newcomer was lost while it waited")
            _apply_if_idle(self)
            return True
        if deciding and incarnation in (None, live.joining[learner]):
            known = live.joining[learner]
        elif learner in members and learner not in live.lost:
            if incarnation is not None and known is not None and known != incarnation:
                return False
        elif live.group is None and learner not in members | set(live.lost):
            if len(members | set(live.lost)) >= self.world_size:
                return False
            known = incarnation  # a launched learner that never joined the forming group
        else:
            return False
        live.lost[learner] = known
        if known is not None:
            self._retired.add(known)
        self.current.release(learner)
        self._log_member("lose", learner, "its process was lost: it leaves at the next close")
        _apply_if_idle(self)
        return True

    def leave(self, learner: LearnerId) -> None:
        """Remove a learner for good (scale-down); an open round stops waiting for it."""
        if learner not in self._active | self._pending | set(self._dropped):
            raise ValueError(f"learner {learner!r} is not registered: there is nothing to remove")
        self._active.discard(learner)
        self._pending.discard(learner)
        self._dropped.pop(learner, None)
        self._gone.add(learner)
        self.current.release(learner)
        self._log_member("leave", learner, change=True)

    def set_world_size(self, world_size: int) -> None:
        """Resize the group; from now on callers must send this world size."""
        check_number("world_size", world_size, max(1, self.min_learners))
        members = self._active | self._pending
        if len(members) > world_size:
            raise ValueError(
                f"world_size {world_size} < {len(members)} registered learners {ordered(members)}: "
                "call leave() for the learners that go first"
            )
        old, self.world_size, self._gone = self.world_size, world_size, set()
        self._log_member("world_size", None, f"{old} -> {world_size}", change=True)

    def check(self, learner: LearnerId, round: int, world_size: int, incarnation: str | None = None) -> None:
        """Raise the typed error that arrive() would raise, changing nothing."""
        check_learner(learner)
        check_number("round", round, 1)
        if world_size != self.world_size:
            raise MembershipError(learner, world_size, self.world_size)
        if incarnation is not None and self.incarnations.get(learner, incarnation) != incarnation:
            why = "another process of this learner joined since (its group was restarted)"
            raise MembershipError(learner, world_size, self.world_size, why)
        if self.live is not None and learner in self.live.lost:
            why = "it was lost: this process should exit (a new process of its slot may join)"
            raise MembershipError(learner, world_size, self.world_size, why)
        if learner in self._dropped:
            record = self._dropped[learner]
            why = f"it was dropped from round {record['round']}: {record['reason']}"
            raise StaleRoundError(learner, round, self.round, why)
        if learner not in self._active | self._pending:
            raise MembershipError(
                learner, world_size, self.world_size, "it is not registered: call join() first"
            )
        if self.current.phase == RoundPhase.CLOSING or learner in self._pending:
            why = f"round {self.round} is still being averaged and this learner takes part from the next one"
            raise StaleRoundError(learner, round, self.round + 1, why)
        if round != self.round:
            why = "that round is closed" if round < self.round else "it skipped ahead"
            raise StaleRoundError(learner, round, self.round, why)
        if learner in self.current.arrivals:
            raise StaleRoundError(learner, round, round + 1, "it already sent this round")

    def arrive(
        self,
        learner: LearnerId,
        round: int,
        world_size: int,
        payload: Any = None,
        incarnation: str | None = None,
    ) -> bool:
        """Record that a learner sent round `round`; returns True when the round may close (complete)."""
        self.check(learner, round, world_size, incarnation)
        if self.current.phase == RoundPhase.IDLE:
            lost = set(self.live.lost if self.live is not None else ())
            self.current.open(self._active - lost, self.timeout_s)
        self.current.arrivals[learner] = payload
        return self.complete

    def close(self, silent: str | None = None) -> RoundClose:
        """Close the open round (complete, or past its deadline): drop the missing, check min_learners.

        ``silent``: the round closes before its deadline because no missing learner's process answered
        (``RoundWait``'s probes), and this is why they are dropped. On success the book is "closing"
        until finish(); on failure it is idle again at the same round, with the missing dropped, so
        those present can resend it once enough learners are back.
        """
        if self.current.phase != RoundPhase.OPEN:
            raise RuntimeError(
                f"round {self.round} is {self.current.phase.value}, not open: there is nothing to close"
            )
        if not self.complete and not self.current.expired() and silent is None:
            raise RuntimeError(f"round {self.round} is waiting for {self.current.missing} until its deadline")
        missing = self.current.missing
        reason = f"did not send round {self.round} within {self.timeout_s:g} s of the first arrival"
        for learner in missing:
            _drop(self, learner, reason if silent is None or self.current.expired() else silent)
        present = self.current.arrived
        if len(present) < self.quorum:
            logger.warning(
                "averager: round %d closes with %d of %d learners: the others never joined this group",
                self.round, len(present), self.world_size,
            )  # fmt: skip
        if len(present) < self.min_learners:
            absent = ordered(set(missing) | set(self._dropped))
            error = AveragingTimeoutError(self.round, absent, present, self.timeout_s)
            logger.warning("averager: %s", error)
            closed = RoundClose(self.round, (), tuple(missing), self.current.opened_at, error)
            self._settle()
            return closed
        self.current.phase = RoundPhase.CLOSING
        pairs = tuple((learner, self.current.arrivals[learner]) for learner in present)
        return RoundClose(self.round, pairs, tuple(missing), self.current.opened_at, group=_decide(self))

    def drop_unread(self, closed: RoundClose, learners: Any, reason: str) -> RoundClose:
        """While closing: drop ``learners``, whose payloads arrived but could not be read, and return the
        round's close without them (an error, as close() gives one, when fewer than min_learners remain).
        The book stays "closing" either way: finish() follows, not ok on an error."""
        if self.current.phase != RoundPhase.CLOSING or closed.round != self.round:
            raise RuntimeError(
                f"round {closed.round} is not the one closing (round {self.round} is {self.current.phase.value})"
            )
        gone = set(learners)
        for learner in ordered(gone):
            _drop(self, learner, reason)
        present = tuple(pair for pair in closed.present if pair[0] not in gone)
        dropped = (*closed.dropped, *ordered(gone - set(closed.dropped)))
        if len(present) < self.min_learners:
            arrived = [learner for learner, _ in present]
            error = AveragingTimeoutError(self.round, ordered(set(dropped)), arrived, self.timeout_s)
            logger.warning("averager: %s", error)
            return RoundClose(self.round, (), dropped, closed.opened_at, error)
        return RoundClose(self.round, present, dropped, closed.opened_at, group=closed.group)

    def finish(self, ok: bool = True) -> None:
        """After close(): ok advances to the next round; not ok keeps it."""
        if self.current.phase != RoundPhase.CLOSING:
            raise RuntimeError(f"round {self.round} is {self.current.phase.value}: call close() first")
        if ok:
            self.round += 1
            if self.live is not None and self.live.deciding is not None:
                self._apply_group()
        elif self.live is not None:
            self.live.deciding = None  # the changes wait for the round's next close
        self._settle()

    def _apply_group(self) -> None:
        """Live: the group ``live.deciding`` holds takes over: its lost leave, its newcomers enter."""
        live = self.live
        group, lost, joining = live.deciding
        live.deciding = None
        for learner in lost:
            self._active.discard(learner)
            self._pending.discard(learner)
            self._dropped.pop(learner, None)
            self.incarnations.pop(learner, None)
            live.lost.pop(learner, None)
        for learner, incarnation in joining.items():
            if live.joining.get(learner) == incarnation:
                del live.joining[learner]
            self._active.add(learner)
            if incarnation is not None:
                self.incarnations[learner] = incarnation
            live.admitted[learner] = incarnation
        old, self.world_size, live.group = self.world_size, len(group), group
        live.changes += 1
        why = f"{ordered(lost)} lost, {ordered(joining)} joined: group {list(group)} ({old} -> {len(group)})"
        self._log_member("group", None, why, change=True)

    def _settle(self) -> None:
        self.current.settle()
        self._active |= self._pending
        self._pending = set()

    def restore(self, last_round: int, dropped_log: Any = None) -> None:
        """Continue after `last_round` (a checkpoint's, or a re-seeding learner's); members are kept."""
        if self.current.phase != RoundPhase.IDLE:
            raise RuntimeError(
                f"round {self.round} is {self.current.phase.value}: restore only an idle averager"
            )
        self.round = check_number("round", last_round, 0) + 1
        if dropped_log is not None:
            self.dropped_log = [dict(record) for record in dropped_log]
        self._log_member("restore", None, f"from round {last_round}")


def _drop(book: RoundBook, learner: LearnerId, reason: str) -> None:
    record = {"round": book.round, "learner": learner, "reason": reason, "time": time.time()}
    book._dropped[learner] = record
    book._active.discard(learner)
    book.dropped_log.append(record)
    book._log_member("drop", learner, reason, change=True)
    logger.warning("averager: dropped learner %r from round %d: %s", learner, book.round, reason)


def _starts_group(
    book: RoundBook, learner: LearnerId, world_size: int | None, incarnation: str | None
) -> bool:
    """Whether this join is the first of a new learner group (Ray Train started or restarted one). Live:
    only the first group (or the learners rejoining a restarted averager), started by a launched learner
    (it sends its group's size; a newcomer sends none); later changes are live."""
    if incarnation is None:
        return False
    if book.live is not None:
        return book.generation == 0 and world_size is not None
    known = book.incarnations.get(learner)
    resized = world_size is not None and world_size != book.world_size
    return book.generation == 0 or resized or (known is not None and known != incarnation)


def _joins_later(book: RoundBook, learner: LearnerId, incarnation: str | None, *, launched: bool) -> bool:
    """Live: whether this join waits for the next close (then it is queued in ``live.joining``): a
    newcomer, or a new process of a member (whose old one is lost). A member's own process rejoining
    (a realignment), or a launched learner (``launched``: it sent its group's size) while the first group
    forms, joins at once. A newcomer's join can come before the launched learners' (its process was
    built first): it waits too, never taking a launched learner's place in the forming group."""
    live = book.live
    if book.generation == 0 and (launched or incarnation is None):
        return False
    members = _members(book)
    if learner in members and learner not in live.lost:
        known = book.incarnations.get(learner)
        if incarnation is None or known is None or known == incarnation:
            return False
        book.lose(learner, known)
    elif (
        launched
        and live.group is None
        and learner not in members | set(live.lost) | set(live.joining)
        and len(book._active | book._pending | set(live.lost)) < book.world_size
    ):
        return False  # a launched learner of the forming first group
    old = live.joining.get(learner)
    if old is not None and old != incarnation:
        book._retired.add(old)  # an earlier process of this slot that was still waiting
    live.joining[learner] = incarnation
    book._log_member("join", learner, "waits for the next round's close")
    _apply_if_idle(book)
    return True


def _members(book: RoundBook) -> set[LearnerId]:
    return book._active | book._pending | set(book._dropped)


def _decide(book: RoundBook) -> tuple[LearnerId, ...] | None:
    """Live, at a close: the next group when changes are pending (kept in ``live.deciding`` until the
    round finishes), else None; a first group complete with nothing pending fixes its ranks."""
    live = book.live
    if live is None:
        return None
    members = _members(book)
    if live.group is None and not live.pending and len(members) == book.world_size:
        live.group = tuple(ordered(members))
    group = live.next_group(members) if live.pending else ()
    if not group:
        return None  # nothing pending, or nobody left: the driver decides
    live.deciding = (group, frozenset(live.lost), dict(live.joining))
    return group


def _apply_if_idle(book: RoundBook) -> None:
    """Live: apply the pending changes at once when no round is open and no member is left to send
    one (every sender was lost): the newcomers then start from the latest state."""
    live = book.live
    if book.current.phase != RoundPhase.IDLE or book.generation == 0 or not live.pending:
        return
    if (book._active | book._pending) - set(live.lost):
        return
    group = live.next_group(_members(book))
    if group:
        live.deciding = (group, frozenset(live.lost), dict(live.joining))
        book._apply_group()
