"""``ValidationRunner``: runs what the averager's validation machine decides (asyncio, no Ray).

``rounds.validation.ValidationMachine`` decides; this part does: it records a score (the batch rule
decides B, the history keeps it) or a miss, starts the injected validator on a task of the averager's
loop and hands its return back to the machine, and waits for it at most ``timeout_s`` when the next round
closes (one round of lag) or when the run's summary settles. The round that ends training is scored
after the test pass. ``act`` returns whether the learners are asked to score a validation themselves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from raytrain_seq.dataplane.generations import Channelled
from raytrain_seq.rounds.batch_rule import BatchRule
from raytrain_seq.rounds.book import RoundBook, RoundClose
from raytrain_seq.rounds.events import RunHistory
from raytrain_seq.rounds.held_state import HeldState
from raytrain_seq.rounds.state import AveragedState
from raytrain_seq.rounds.test_pass import TestPass
from raytrain_seq.rounds.validation import (
    AskLearners,
    AwaitEvaluator,
    Closing,
    EvaluatorReturned,
    Ignored,
    LearnerDropped,
    Missed,
    Record,
    StartEvaluator,
    Step,
    TimedOut,
    ValidationMachine,
)

logger = logging.getLogger(__name__)

__all__ = ["ValidationRunner"]

Validator = Callable[[AveragedState], Awaitable[Mapping[str, float]]]


class ValidationRunner:
    """The actions of ``machine``, run for the averager (its module docstring)."""

    def __init__(
        self,
        machine: ValidationMachine,
        *,
        validator: Validator | None,
        batch: BatchRule,
        history: RunHistory,
        book: RoundBook,
        test: TestPass,
        held: HeldState,
        rows_cap: Callable[[], int | None],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task],
    ) -> None:
        self.machine, self._validator = machine, validator
        self._batch, self._history, self._book, self._test = batch, history, book, test
        self._held, self._rows_cap, self._spawn = held, rows_cap, spawn
        self._scoring: tuple[int, asyncio.Task] | None = None  # the evaluator's task and its round

    def act(self, step: Step, state: AveragedState | None = None) -> bool:
        """Run the validation machine's actions (``state``: the one a started evaluator scores); whether
        the learners are asked to score. ``AwaitEvaluator`` is left to the caller, which awaits."""
        for action in step.actions:
            if isinstance(action, StartEvaluator):
                self._scoring = (action.round, self._spawn(self._score(action, state)))
            elif isinstance(action, Record):
                decided = self._batch.decide(
                    action.accuracy, val_size=action.val_size, rows_cap=action.rows_cap
                )
                self._history.record_validation(
                    action.round, action.accuracy, batch_size=decided.size, grew=decided.grew,
                    epoch=action.epoch, metrics=action.metrics,
                )  # fmt: skip
            elif isinstance(action, Missed):
                size = self._batch.size
                self._history.record_missed_validation(action.round, size, reason=action.reason)
                logger.warning("averager: validation of round %d missed (%s); B stays %d",
                               action.round, action.reason, size)  # fmt: skip
            elif isinstance(action, Ignored):
                log = logger.warning if action.source == "evaluator" else logger.info
                log(
                    "averager: %r's validation of round %d not taken (%s)",
                    action.source,
                    action.round,
                    action.why,
                )
        return any(isinstance(action, AskLearners) for action in step.actions)

    async def settle(self, closed: RoundClose) -> None:
        """Before a round's result: the open validation is settled (one round of lag). The learners'
        shares came before this round or will not come; the evaluator's score is waited for at most
        ``timeout_s``; a validation nobody scores is missed at once."""
        for learner in closed.dropped:
            self.act(self.machine.on(LearnerDropped(learner)))
        step = self.machine.on(Closing(closed.round, self._book.world_size))
        self.act(step)
        for action in step.actions:
            if isinstance(action, AwaitEvaluator):
                await self.await_score(action.round, action.timeout_s)

    async def settle_last(self) -> None:
        """Wait (at most ``timeout_s``) for a validation the evaluator is still scoring: at the run's end
        no next round waits for the final round's accuracy."""
        if self._scoring is not None and self.machine.scoring(self._scoring[0]):
            await self.await_score(self._scoring[0], self._book.timeout_s)

    async def await_score(self, round: int, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for the evaluator's task of ``round``; then it is missed if unscored."""
        if self._scoring is not None and self._scoring[0] == round:
            await asyncio.wait({self._scoring[1]}, timeout=timeout_s)
        if self.machine.scoring(round):
            self.act(self.machine.on(TimedOut(round, timeout_s)))

    async def _score(self, action: StartEvaluator, state: AveragedState) -> None:
        """Have the validator score ``state`` and hand its return to the machine; the learners go on
        meanwhile. The round that ends training is scored after the test pass (docs/ARCHITECTURE.md, "Validation")."""
        if action.after_test:
            try:
                await asyncio.wait_for(self._test.tested.wait(), self._book.timeout_s)
            except asyncio.TimeoutError:  # the learners stopped before testing: score it now
                logger.warning("averager: no test pass in %g s after the last round", self._book.timeout_s)
        scores = error = None
        try:
            if state.flat is not None and isinstance(state.flat.parts[0], Channelled):
                state, _ = await asyncio.shield(self._held.reading)  # the round's slices, from the channels
            scores = dict(await self._validator(state))
        except Exception as exc:  # a failed evaluation is a missed validation, at once
            logger.error("averager: the evaluator failed on round %d: %r; B stays", action.round, exc)
            error = repr(exc)
        returned = EvaluatorReturned(
            action.round, scores, error, epoch=action.epoch, rows_cap=self._rows_cap()
        )
        self.act(self.machine.on(returned))

    def validator_error(self) -> str | None:
        """Why the validator could not score anything (its ``error()``); None when it could or is none."""
        error = getattr(self._validator, "error", None)
        return error() if error is not None else None
