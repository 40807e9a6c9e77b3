"""``ValidationSchedule``: when the averaged model of a validation round is scored, and what waits for it.

AAVG (Cong et al., Algorithm 2, lines 13-21) validates the averaged model every m rounds and lets the
accuracy decide the batch size. Here round r's accuracy decides B for the round after r+1, so that
validation stays off the learners' path (one round of lag against the paper). Who scores it: the injected
``validator`` (an evaluator beside the averager reads the state while the learners train round r+1; the
result of round r+1 waits for its report at most ``timeout_s``), or, without one, the learners: round r's
result asks them to (``RoundResult.validate``), each sends its share before round r+1, and a share missing
when round r+1 closes makes the validation a missed one at once (``ValidationGate.take_share``). A
validation due that nobody can score (a restored state's) is started by the evaluator when the state is
held, asked of the joining learners, or missed at once. The round that ends training is scored only once
the test pass is in (``tested``), so that it takes no CPU from it.

The decisions are the gate's (``rounds.validation``) and the round book's (``rounds.book``); this class
does the waiting with asyncio (no Ray): one future per due validation, resolved by its report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from raytrain_seq.checks import check_number
from raytrain_seq.dataplane.generations import Channelled
from raytrain_seq.members.errors import StaleRoundError
from raytrain_seq.members.ids import LearnerId, check_learner
from raytrain_seq.rounds.book import RoundBook
from raytrain_seq.rounds.events import RunHistory
from raytrain_seq.rounds.position import EpochPosition
from raytrain_seq.rounds.state import AveragedState, RoundResult
from raytrain_seq.rounds.validation import ValidationGate

logger = logging.getLogger(__name__)

__all__ = ["ValidationSchedule"]

Validator = Callable[[AveragedState], Awaitable[Mapping[str, float]]]


class ValidationSchedule:
    """The due validation's scoring and report, for an averager's ``book``, ``gate`` and ``history``.

    validator: scores a state off the learners' path (None: the learners score their shares).
    end: ``{"epochs", "steps"}`` where training ends (None: unknown, no round is the last).
    tested: set once the test pass is in. spawn: runs a coroutine as a task the owner keeps. latest: the
    owner's latest averaged state. local_copy: the owner's task reading the latest round's slices into its process (for a state
    whose slices are in channels). rows_cap: the rows one learner has in the current layout.
    """

    def __init__(
        self,
        validator: Validator | None,
        *,
        book: RoundBook,
        gate: ValidationGate,
        history: RunHistory,
        end: Mapping[str, Any] | None,
        tested: asyncio.Event,
        spawn: Callable[[Any], asyncio.Task],
        latest: Callable[[], AveragedState],
        local_copy: Callable[[], asyncio.Task | None],
        rows_cap: Callable[[], int | None],
    ) -> None:
        self.validator = validator
        self._book, self._gate, self._history = book, gate, history
        self._end, self._tested, self._spawn = end, tested, spawn
        self._latest, self._local_copy, self._rows_cap = latest, local_copy, rows_cap
        self.future: asyncio.Future | None = None  # the due validation's report (its B)

    def forget(self) -> None:
        """A restored state: the future is made when a round waits for its due validation."""
        self.future = None

    def after_round(self, result: RoundResult) -> RoundResult:
        """Start scoring a closed round that is due for validation; the result asks the learners to
        score their shares when they are the ones who score it."""
        if self._book.validation_due is None:
            return result
        self.future = asyncio.get_running_loop().create_future()
        if self._book.validation_due == result.state.round:
            if self.validator is not None:
                self._spawn(self._validate(result.state))
            else:  # the learners score it, each its share, before they send the next round
                self._gate.new_pass()
                result = dataclasses.replace(result, validate=True)
        return result

    def on_join(self, state: AveragedState) -> bool:
        """A learner joins at ``state``: the evaluator starts a due validation it can score; returns
        whether the learners score it instead (a resumed run's last round)."""
        due = self._book.validation_due
        if due is not None and self.validator is not None and self.future is None:
            self.start_restored()  # scored while the group trains its first round
        return self.validator is None and due is not None and due == state.round and not state.empty

    async def await_due(self) -> None:
        """Before a round's result: the due validation's report, waited for only while it is being scored
        (the evaluator: at most ``timeout_s``). Learners send their shares before this round, so shares
        missing now will not come; a validation nobody scores is missed at once."""
        due = self._book.validation_due
        if due is None:
            return
        if self.validator is None:
            self._miss(due, self._gate.missing(self._book.world_size))
            return
        if self.future is None and not self.start_restored():
            self._miss(due, "nobody scores it (the averager restarted or the run resumed)")
            return
        try:
            await asyncio.wait_for(asyncio.shield(self.future), self._book.timeout_s)
        except (asyncio.TimeoutError, Exception) as exc:
            if not isinstance(exc, asyncio.TimeoutError):
                logger.warning("averager: validation of round %d failed (%r)", due, exc)
            self._miss(due, f"not reported in {self._book.timeout_s:g} s")

    def start_restored(self) -> bool:
        """A validation due in a restored state (a --resume, or Ray restarted the averager): the evaluator
        scores the latest state when it is the one due; whether it started."""
        due, state = self._book.validation_due, self._latest()
        if self.validator is None or due is None or state.round != due or state.empty:
            return False
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
            self._spawn(self._validate(state))
        return True

    async def report(
        self,
        round: int,
        accuracy: float,
        learner: LearnerId,
        epoch: int | None,
        *,
        val_size: int | None,
        rows_cap: int | None,
        metrics: Mapping[str, float] | None,
    ) -> int:
        """Round ``round``'s validation accuracy: the gate decides B, the history records it, and the
        round waiting for it goes on. Returns B."""
        check_number("accuracy", accuracy, -math.inf, int | float)
        self._book.report_validation(round, learner)
        decided = self._gate.decide(accuracy, val_size=val_size, rows_cap=rows_cap)
        self._history.record_validation(
            round, accuracy, batch_size=decided.size, grew=decided.grew, epoch=epoch, metrics=metrics
        )
        if self.future is not None and not self.future.done():
            self.future.set_result(decided.size)
        return decided.size

    async def report_share(
        self,
        learner: LearnerId,
        round: int,
        tallies: Mapping[str, Any],
        world_size: int,
        *,
        epoch: int | None,
        rows_cap: int | None,
    ) -> bool:
        """One learner's share; once the group's shares are in, their sum is reported. Whether taken."""
        check_learner(learner)
        check_number("round", round, 1)
        check_number("world_size", world_size, 1)
        share = self._gate.take_share(learner, round, tallies, world_size, due=self._book.validation_due)
        if not share.taken:
            logger.info(
                "averager: learner %r's validation share of round %d not taken (not due)", learner, round
            )
            return False
        if share.total is None:
            return True
        total = share.total
        await self.report(
            round,
            total.accuracy,
            learner="learners",
            epoch=epoch,
            val_size=total.sequences,
            rows_cap=rows_cap if rows_cap is not None else self._rows_cap(),
            metrics={"top5_accuracy": total.top5_accuracy, "mean_class_accuracy": total.mean_class_accuracy},
        )
        return True

    async def settle(self) -> None:
        """Wait (at most ``timeout_s``) for a validation the evaluator is still scoring: at the run's end
        no next round waits for the final round's accuracy, and the summary should hold it."""
        future = self.future
        if self.validator is None or future is None or future.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(future), self._book.timeout_s)
        except asyncio.TimeoutError:
            logger.warning("averager: round %s's validation not scored in %g s: the summary goes without it",
                           self._book.validation_due, self._book.timeout_s)  # fmt: skip
        except Exception as error:  # _validate logged the failure; this says what the summary lacks
            logger.warning("averager: round %s's validation failed (%r): the summary goes without it",
                           self._book.validation_due, error)  # fmt: skip

    def validator_error(self) -> str | None:
        """Why the validator could not score anything (its ``error()``); None when it could or is none."""
        error = getattr(self.validator, "error", None)
        return error() if error is not None else None

    def _miss(self, due: int, why: str) -> None:
        """Give the due validation up: B stays, and the history records the miss."""
        self._book.miss_validation()
        size = self._gate.size
        self._history.record_missed_validation(due, size)
        logger.warning("averager: validation of round %d missed (%s); B stays %d", due, why, size)

    async def _validate(self, state: AveragedState) -> None:
        """Have the validator score round ``state.round`` and report it; the learners go on meanwhile.
        The round that ends training is scored after the test pass (see the module docstring)."""
        epoch = None if state.position is None else int(state.position.get("epoch", 0))
        if self._ends_training(state):
            try:
                await asyncio.wait_for(self._tested.wait(), self._book.timeout_s)
            except asyncio.TimeoutError:  # the learners stopped before testing: score it now
                logger.warning("averager: no test pass in %g s after the last round", self._book.timeout_s)
        try:
            if state.flat is not None and isinstance(state.flat.parts[0], Channelled):
                state, _ = await asyncio.shield(self._local_copy())  # the round's slices, from the channels
            scores = dict(await self.validator(state))
        except Exception as exc:
            # The round after waits for this report: a failed evaluation is a missed one, at once.
            logger.error("averager: the evaluator failed on round %d: %r; B stays", state.round, exc)
            if self.future is not None and not self.future.done():
                self.future.set_exception(exc)
            return
        try:
            await self.report(
                state.round,
                scores["accuracy"],
                learner="evaluator",
                epoch=epoch,
                val_size=scores["sequences"],
                rows_cap=self._rows_cap(),
                metrics={k: scores[k] for k in ("top5_accuracy", "mean_class_accuracy")},
            )
        except StaleRoundError as exc:  # a new group or a re-seed moved on: this report decides nothing
            logger.warning("averager: validation of round %d not taken (%s)", state.round, exc)

    def _ends_training(self, state: AveragedState) -> bool:
        if self._end is None or state.position is None:
            return False
        return EpochPosition.from_dict(state.position).ends_training(**self._end)
