"""A learner's side of the averager: retries, join, average, rejoin and re-seed, as decisions.

``AveragerClient`` owns every call a learner makes to the ``ParameterAverager`` and the latest averaged state
it holds (``held``: what re-seeds a restarted averager); its transport is injected (a fake in tests,
``runtime.transport.RayTransport``). An unreachable averager (``Unreachable``; one known ``away`` is not
called) is retried on the ``Backoff`` schedule, then ``AveragerUnavailableError``; a silent ``average`` is
never resent. A refused round (``StaleRoundError``, ``MembershipError``, ``AveragingTimeoutError``), or the
first after the averager was seen away, rejoins with ``held`` as the seed and returns a decision,
``Averaged(result)`` or ``Realigned(reply, first_missed)`` (the others went on; a live ``group`` sets the
world size sent); a rejoin that finds the same round still due resends it (at most ``max_rejoins`` times);
``average(defer=True)`` of an averager away gives ``Deferred`` at once (``answer_lost``: it died on the
round). States arrive as refs, read at once through the ``store``, so what it holds survives a dead averager.
Channels: a result's generation is linked in a background thread (``channels``) and sent through; a refusal,
join, deferral or failed write uses the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from raytrain_seq.dataplane.generations import ChannelEnds, Channelled, ChannelLost
from raytrain_seq.dataplane.payload import FlatPayload
from raytrain_seq.dataplane.stores import InProcessStore, ObjectStore, SlicesLost
from raytrain_seq.members.errors import AveragerError, AveragerUnavailableError
from raytrain_seq.members.ids import LearnerId
from raytrain_seq.members.retry import Backoff
from raytrain_seq.rounds.state import AveragedState, CheckpointHistory, JoinReply, RoundResult
from raytrain_seq.rounds.tally import TestTotals

logger = logging.getLogger(__name__)

__all__ = ["Averaged", "AveragerClient", "Deferred", "Realigned", "Transport", "Unreachable"]


class Unreachable(Exception):
    """The transport could not reach the averager; ``silent``: it timed out without an answer."""

    def __init__(self, detail: str, *, silent: bool = False) -> None:
        super().__init__(detail)
        self.silent = silent


class Transport(Protocol):
    """Calls a method of the averager and returns its answer; raises ``Unreachable`` when it cannot."""

    def __call__(self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class Averaged:
    """The round closed with this learner in it."""

    result: RoundResult


@dataclass(frozen=True)
class Realigned:
    """The others went on without this learner: continue from ``reply.state``."""

    reply: JoinReply
    first_missed: int
    """The first round averaged without this learner (its own refused round)."""


@dataclass(frozen=True)
class Deferred:
    """The averager was away (dead or restarting): train on, and send this round again later."""

    round: int
    answer_lost: bool = False
    """The round was sent and the averager died on it: it may have closed with it, its answer lost."""


class AveragerClient:
    """One learner's calls to the averager, with retries, and the averaged state it holds."""

    def __init__(
        self,
        transport: Transport,
        *,
        learner: LearnerId,
        world_size: int,
        incarnation: str,
        round_timeout_s: float,
        backoff: Backoff | None = None,
        max_rejoins: int = 3,
        sleep: Callable[[float], None] = time.sleep,
        store: ObjectStore | None = None,
        node: str | None = None,
        process: Any = None,
        channels: ChannelEnds | None = None,
        away: Callable[[], bool] | None = None,
    ) -> None:
        self.transport = transport
        self.learner, self.world_size, self.incarnation = learner, world_size, incarnation
        self.round_timeout_s = round_timeout_s
        self.backoff = backoff or Backoff()
        self.max_rejoins = max_rejoins
        self._sleep = sleep
        self.store = store or InProcessStore()
        self.node = node  # where this learner runs: the averager places its shard there
        self.process = process  # this learner's actor: the averager asks it to answer when it is late
        # This learner's ends of a channel generation (dataplane.generations), or None: always the store.
        self.channels = channels
        # Whether the averager is down now, asked without calling it (a call to a restarting actor fails
        # only after Ray's grace for the death): while it says so, a round that may be deferred is, at
        # once, and no call goes out.
        self.away = away
        self._deferred = False  # since the last round taken: an outage is logged once
        # ``away`` said so since the last join: the process this learner joined died, and a new one
        # knows no learner, so the next round rejoins before it is sent instead of being refused first.
        self._gone = False
        self._sent: list[Any] = []  # the last round's slices: put in the store if it must be resent
        self._linking: threading.Thread | None = None  # links a planned generation in the background
        self.shards = 1  # S, from the latest join
        self.held: AveragedState | None = None  # the latest averaged state: a restarted averager's seed
        self.next_round = 1
        self.batch_size: int | None = None  # B of the next round, known from the first join on

    # --------------------------------------------------------------------------------------- calls
    def call(
        self, method: str, *args: Any, timeout: float | None = None, retry: bool = True, **kwargs: Any
    ) -> Any:
        """The averager's answer to ``method``, retried while it cannot be reached (``retry``)."""
        delays, began = self.backoff.delays() if retry else [], time.monotonic()
        for attempt in range(len(delays) + 1):
            try:
                if retry and self._away():
                    # Not sent: a call to an averager known down fails only after Ray's grace for the
                    # death, and the pause below ends once it is back (``RayTransport.until_back``).
                    raise Unreachable("its actor is not alive")
                return self.transport(method, *args, timeout=timeout, **kwargs)
            except Unreachable as exc:
                silent_round = method == "average" and exc.silent
                if attempt == len(delays) or silent_round:
                    seconds = time.monotonic() - began
                    raise AveragerUnavailableError(method, attempt + 1, seconds, str(exc)) from exc
                if attempt & (attempt + 1) == 0:  # tries 1, 2, 4, 8, ...: a steady retry logs a few lines
                    logger.warning(
                        "learner %s: %s() failed (%s); retry %d/%d in %.1f s",
                        self.learner, method, exc, attempt + 1, len(delays), delays[attempt],
                    )  # fmt: skip
                self._sleep(delays[attempt])
        raise AssertionError("unreachable: the loop returns or raises")

    def join(self, seed: AveragedState | None = None) -> JoinReply:
        """(Re)join; offers ``seed`` (a state newer than the averager's is adopted by it)."""
        if self.channels is not None:
            self.channels.close()  # a join ends the averager's channel generation
        if seed is not None and seed.flat is not None:
            # Flat, its slices local arrays (a held state's are): a call pickles a numpy array as its
            # bytes but a tensor at a cost per tensor, which a restarted averager's rejoin would wait for.
            seed = seed.fetched(self._get)
        kwargs = {"incarnation": self.incarnation, "seed": seed}
        if self.node is not None:
            kwargs["node"] = self.node
        if self.process is not None:
            kwargs["process"] = self.process
        reply = self.call("join", self.learner, self.world_size, **kwargs)
        if reply.state.flat is not None:
            reply = replace(reply, state=reply.state.materialise(self._get))
        self.shards = reply.shards
        self._take(reply.state, reply.next_round, reply.group)
        self._gone = False
        return reply

    def start(self, checkpoint_seed: Callable[[], AveragedState | None]) -> JoinReply:
        """The first join of this learner process; an averager that holds nothing is seeded from
        ``checkpoint_seed()`` (the run's newest checkpoint that loads) when there is one."""
        reply = self.join()
        if reply.state.empty and not reply.ended:  # an ended reply carries no state
            seed = checkpoint_seed()
            if seed is not None and not seed.empty:
                logger.warning(
                    "learner %s: the averager holds no state; seeding it from checkpoint round %d",
                    self.learner, seed.round,
                )  # fmt: skip
                reply = self.join(seed=seed)
        return reply

    def average(
        self,
        params: Mapping[str, Any],
        optimizer_state: Mapping | None,
        *,
        stats: Mapping[str, float],
        position: Mapping | None,
        rows: int | None = None,
        defer: bool = False,
    ) -> Averaged | Realigned | Deferred:
        """Send this learner's next round (``rows``: the rows it has this epoch, the batch-size cap;
        ``defer``: an averager that is away gives ``Deferred`` instead of the retries); see the module
        docstring for the decisions."""
        sent = self.next_round
        if defer and (early := self.defers()) is not None:
            return early
        # Away now, at a round that is not deferred: the join waits for it (``call``), then the round.
        rejoin = self._gone or (not defer and self._away())
        for attempt in range(self.max_rejoins + 1):
            if rejoin:
                reply = self.join(seed=self.held)
                if reply.next_round != sent:
                    what = f"the others averaged rounds {sent}-{reply.state.round} without it"
                    if reply.took_part and reply.state.round == sent:
                        what = f"round {sent} closed with it before its answer was lost"
                    logger.warning(
                        "learner %s: %s; continuing from round %d", self.learner, what, reply.state.round
                    )
                    self._deferred = False
                    return Realigned(reply, sent)
                if attempt == self.max_rejoins:
                    break  # refused that many times in a row
                # The averager came back (or took us back) before this round: it is sent, through the
                # store, since a join ends the channel generation.
                params = self._through_store(params)
            try:
                result = self.call(
                    "average", self.learner, sent, self.world_size, params, optimizer_state,
                    stats=dict(stats), position=None if position is None else dict(position),
                    incarnation=self.incarnation, rows=rows, timeout=self.round_timeout_s, retry=not defer,
                )  # fmt: skip
            except AveragerUnavailableError as exc:
                cause = exc.__cause__
                if not defer or not isinstance(cause, Unreachable) or cause.silent:
                    raise  # a silent round may be in the averager's hands: never sent again
                return self._defer(sent, str(cause), answer_lost=True)
            except AveragerError as exc:  # StaleRoundError, MembershipError, AveragingTimeoutError
                logger.warning("learner %s: round %d refused (%s): rejoining", self.learner, sent, exc)
                rejoin = True
                continue
            if result.state.flat is not None:
                try:
                    result = replace(result, state=result.state.fetched(self._get))
                except (ChannelLost, SlicesLost) as exc:  # ended or died after the round closed: ask again
                    logger.warning("learner %s: round %d's slices were lost (%s): rejoining",
                                   self.learner, sent, exc)  # fmt: skip
                    return Realigned(self.join(seed=self.held), sent)
            self._take(result.state, result.state.round + 1, result.group)
            if result.channels is not None:
                self._link(result.channels)
            self._deferred = False
            return Averaged(result)
        raise RuntimeError(
            f"learner {self.learner}: round {sent} was refused {self.max_rejoins} times in a row after "
            "rejoining: the averager and this learner disagree on the group; see the averager's log"
        )

    def defers(self) -> Deferred | None:
        """The next round's ``Deferred`` when the averager is known to be down (``away``), else None:
        asked before the round's slices are put, which a deferred round would waste."""
        if self._away():
            return self._defer(self.next_round, "its actor is not alive")
        return None

    def up(self) -> bool:
        """Whether the averager is known to be up now (``away`` says it is not down); False when no
        ``away`` was given (nothing is known until a call)."""
        return self.away is not None and not self._away()

    def _away(self) -> bool:
        if self.away is not None and self.away():
            self._gone = True
            return True
        return False

    def _defer(self, round_: int, why: str, *, answer_lost: bool = False) -> Deferred:
        if not self._deferred:  # once an outage: its further deferrals are expected
            logger.warning("learner %s: the averager is away (%s): round %d deferred, training on",
                           self.learner, why, round_)  # fmt: skip
        self._deferred = True
        if self.channels is not None:
            # Its shards died with it: a write into their channels would wait for a reader.
            self.channels.close()
        return Deferred(round_, answer_lost)

    def report_validation_share(
        self, round: int, tallies: Mapping[str, Any], *, epoch: int, rows_cap: int | None = None
    ) -> bool:
        """Send this learner's share of round ``round``'s validation (``EvalResult.tallies``); whether the
        averager took it (it answers at once; B comes with a later round's result)."""
        args = (self.learner, round, dict(tallies), self.world_size)
        try:
            return bool(self.call("report_validation_share", *args, epoch=epoch, rows_cap=rows_cap))
        except AveragerUnavailableError:
            raise
        except AveragerError as exc:
            logger.warning("round %d: validation share not taken (%s)", round, exc)
            return False

    def report_test(self, tallies: Mapping[str, Any]) -> TestTotals:
        """Send this learner's test tallies (its shard of the test split); returns the group's sums."""
        return self.call("report_test", self.learner, dict(tallies), self.world_size)

    def checkpoint_contents(
        self, done: int, *, wait: bool = True
    ) -> tuple[AveragedState, CheckpointHistory] | None:
        """The averager's state and history for a checkpoint of round ``done``; an averager that
        restarted behind this learner is re-seeded first, so the checkpoint never holds older state.
        ``wait`` False: None at once when the averager is away (known down, or the call fails so)."""
        if not wait and self._away():
            return None
        try:
            state, history = self.call("checkpoint_contents", retry=wait)
        except AveragerUnavailableError as exc:
            if wait or not isinstance(exc.__cause__, Unreachable):
                raise
            return None
        if state.round < done and self.held is not None:
            self.join(seed=self.held)
            state, history = self.call("checkpoint_contents")
        return state.materialise(self._get), history

    # -------------------------------------------------------------------------------- the data plane
    def send(self, slices: list[Any]) -> tuple[Any, ...]:
        """The parts of this learner's next round: its slices written into the live channel generation
        (``Channelled`` markers), or put in the store when there is none or a write failed."""
        self._sent = list(slices)
        if self.channels is not None:
            parts = self.channels.write(self.next_round, slices, self.round_timeout_s)
            if parts is not None:
                return parts
        return tuple(self.store.put(part) for part in slices)

    def _through_store(self, params: Any) -> Any:
        """``params``, its channelled parts replaced by the store's: a round resent after a rejoin (which
        ended the generation) goes through the store."""
        if not isinstance(params, FlatPayload) or not any(isinstance(p, Channelled) for p in params.parts):
            return params
        return replace(params, parts=tuple(self.store.put(part) for part in self._sent))

    def _get(self, parts: list[Any]) -> list[Any]:
        """The arrays behind ``parts``: channelled ones read from the channels, the others from the store."""
        marked = [p for p in parts if isinstance(p, Channelled)]
        if not marked:
            return self.store.get(parts)
        if self.channels is None or len(marked) != len(parts):
            raise ChannelLost(f"learner {self.learner}: {len(marked)} of {len(parts)} parts are in channels")
        return self.channels.read(marked, self.round_timeout_s)

    def _link(self, plan: Any) -> None:
        """Link this learner to the channel generation ``plan`` (every member does, after the round that
        planned it), in a background thread: the control plane answers once every member has linked and
        the shards have opened theirs (seconds on a busy node), while this learner trains on; its rounds
        go through the store until then."""
        if self.channels is None or self.learner not in plan.members:
            return
        slices = list(self._sent)
        self._linking = threading.Thread(
            target=self._link_now, args=(plan, slices), name=f"link-{plan.generation}", daemon=True
        )
        self._linking.start()

    def _link_now(self, plan: Any, slices: list[Any]) -> None:
        try:
            link = self.channels.open(plan, slices)
            inputs = self.call("link", plan.generation, self.learner, link, timeout=self.round_timeout_s)
        except Exception:  # the thread's end: logged whole, and the rounds go on through the store
            logger.exception("learner %s: linking generation %d failed", self.learner, plan.generation)
            inputs = None
        if inputs is None:
            self.channels.close(plan.generation)
            return
        self.channels.attach(plan.generation, inputs, plan.index(self.learner))

    def wait_linked(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout``) for a link in progress; whether the rounds now go through channels."""
        if self._linking is not None:
            self._linking.join(timeout)
        return self.channels is not None and self.channels.generation is not None

    def _take(self, state: AveragedState, next_round: int, group: tuple | None = None) -> None:
        self.next_round, self.batch_size = next_round, state.batch_size
        self.held = None if state.empty else state
        if group is not None:  # a live group: its size is what this learner sends from now on
            self.world_size = len(group)
