"""Validation of the averaged model as one state machine (AAVG Algorithm 1, lines 13-21), plain Python.

Every m-th averaged round is validated and its accuracy decides B for the round after next
(``rounds.batch_rule``). The machine's state is a plain value, the latest validation round and its
phase (``Validation``): due, scoring by the learners, scoring by the evaluator, scored or missed. Its
transitions (``ValidationMachine.on``) take an event (a round averaged or closing, a learner joined or
dropped, a share, the evaluator's return, a timeout, a report, a restore) and return a ``Step``: the new
state and the actions for the shell (ask the learners, start the evaluator, wait for it, record a score or
a miss with its reason). Who scores is a policy (``LearnersScore``: each learner its share, summed in a
``ShareTally``; ``EvaluatorScores``: the evaluator on the averager's thread) that returns decisions,
never raises. Contract: a validation is scored at most once, and one not scored is recorded as missed
with its reason; scores of another round are ignored. A checkpoint keeps ``due``; ``Restored`` brings it
back. No asyncio, no Ray: ``runtime.averager`` runs the actions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from raytrain_seq.checks import check_number
from raytrain_seq.members.errors import StaleRoundError
from raytrain_seq.members.ids import LearnerId, check_learner
from raytrain_seq.rounds.position import EpochPosition
from raytrain_seq.rounds.settings import AveragerSettings
from raytrain_seq.rounds.tally import ShareTally
from raytrain_seq.training.eval_result import EvalResult

__all__ = [
    "AskLearners",
    "Averaged",
    "AwaitEvaluator",
    "Closing",
    "Decision",
    "EvaluatorReturned",
    "EvaluatorScores",
    "Ignored",
    "Joined",
    "LearnerDropped",
    "LearnersScore",
    "Missed",
    "NewGroup",
    "Phase",
    "Record",
    "Reported",
    "Reseeded",
    "Restored",
    "ShareArrived",
    "StartEvaluator",
    "Step",
    "TimedOut",
    "Validation",
    "ValidationMachine",
    "validation_near",
]


class Phase(Enum):
    """Where one validation round stands."""

    DUE = "due"  # its round was averaged (or restored); nobody scores it yet
    BY_LEARNERS = "scoring by learners"
    BY_EVALUATOR = "scoring by the evaluator"
    SCORED = "scored"
    MISSED = "missed"


@dataclass(frozen=True)
class Validation:
    """The machine's state: validation round ``round`` in ``phase``; ``reason``: why it was missed."""

    round: int
    phase: Phase
    reason: str | None = None

    @property
    def open(self) -> bool:
        """Not scored nor missed yet: a score of this round is still taken."""
        return self.phase in (Phase.DUE, Phase.BY_LEARNERS, Phase.BY_EVALUATOR)


# ------------------------------------------------------------------------------------------- events
@dataclass(frozen=True)
class Averaged:
    """Round ``round`` was averaged (its result is being handed out); ``position``: its state's."""

    round: int
    position: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Closing:
    """Round ``round``'s senders are in, before its result: the open validation is settled now (one
    round of lag). ``world_size``: the group's size, for a miss's reason."""

    round: int
    world_size: int


@dataclass(frozen=True)
class Joined:
    """A learner joins at the held state of round ``held`` (0: none yet), at ``position``."""

    held: int
    position: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class NewGroup:
    """Ray Train started a new learner group: the old group's shares are gone."""


@dataclass(frozen=True)
class LearnerDropped:
    """``learner`` was dropped from a round (it did not send it in time)."""

    learner: LearnerId


@dataclass(frozen=True)
class ShareArrived:
    """``learner``'s tallies of its share of round ``round``'s validation, of a group of ``world_size``."""

    learner: LearnerId
    round: int
    tallies: Mapping[str, Any]
    world_size: int
    epoch: int | None = None
    rows_cap: int | None = None


@dataclass(frozen=True)
class EvaluatorReturned:
    """The evaluator's ``scores`` of round ``round`` ({accuracy, sequences, top5_accuracy,
    mean_class_accuracy}), or the ``error`` it failed with."""

    round: int
    scores: Mapping[str, Any] | None = None
    error: str | None = None
    epoch: int | None = None
    rows_cap: int | None = None


@dataclass(frozen=True)
class Reported:
    """An accuracy of round ``round`` reported directly (``ParameterAverager.report_validation``)."""

    round: int
    accuracy: float
    learner: LearnerId = "validator"
    epoch: int | None = None
    val_size: int | None = None
    rows_cap: int | None = None
    metrics: Mapping[str, float] | None = None


@dataclass(frozen=True)
class TimedOut:
    """The evaluator's score of round ``round`` did not come in ``waited_s``."""

    round: int
    waited_s: float


@dataclass(frozen=True)
class Restored:
    """A checkpoint of round ``averaged`` was restored; ``due``: the validation it recorded as due."""

    averaged: int
    due: int | None = None


@dataclass(frozen=True)
class Reseeded:
    """A learner's newer state of round ``averaged`` replaced the averager's."""

    averaged: int


# ------------------------------------------------------------------------------------------ actions
@dataclass(frozen=True)
class AskLearners:
    """Ask the learners to score round ``round``, each its share (``RoundResult.validate``,
    ``JoinReply.validate``)."""

    round: int


@dataclass(frozen=True)
class StartEvaluator:
    """Start the evaluator on round ``round``'s state; ``after_test``: first wait for the test pass (the
    round ends training); ``epoch``: the state's epoch, for the record."""

    round: int
    after_test: bool = False
    epoch: int | None = None


@dataclass(frozen=True)
class AwaitEvaluator:
    """Wait at most ``timeout_s`` for the evaluator's score of round ``round`` (then ``TimedOut``)."""

    round: int
    timeout_s: float


@dataclass(frozen=True)
class Record:
    """Record accuracy ``accuracy`` of round ``round`` and tell the batch rule (``BatchRule.decide``)."""

    round: int
    accuracy: float
    learner: LearnerId
    epoch: int | None = None
    val_size: int | None = None
    rows_cap: int | None = None
    metrics: Mapping[str, float] | None = None


@dataclass(frozen=True)
class Missed:
    """Record round ``round``'s validation as missed, and why (B stays)."""

    round: int
    reason: str


@dataclass(frozen=True)
class Ignored:
    """A score of round ``round`` from ``source`` that counts for nothing, and why (to log)."""

    round: int
    source: LearnerId
    why: str


@dataclass(frozen=True)
class Step:
    """A transition's result: the new state, the actions for the shell, whether the event's score was
    taken, and a report refused (the caller's error, for the shell to raise)."""

    state: Validation | None
    actions: tuple[Any, ...] = ()
    taken: bool = True
    refused: Exception | None = None


# ----------------------------------------------------------------------------------------- policies
@dataclass(frozen=True)
class Decision:
    """A scoring policy's answer: the phase the open validation goes to, its actions, a miss's reason."""

    phase: Phase
    actions: tuple[Any, ...] = ()
    reason: str | None = None


class LearnersScore:
    """The learners score a validation, each its share on its device (GPU learners): a due round asks
    them; when the next round closes, shares that did not come will not come (each learner sends its
    share before its next round), so the validation is missed at once."""

    takes_shares = True

    def on_due(self, round: int, *, after_test: bool, epoch: int | None) -> Decision:
        return Decision(Phase.BY_LEARNERS, (AskLearners(round),))

    def on_join(self, validation: Validation, *, after_test: bool, epoch: int | None) -> Decision:
        """A learner joining at the due round's state scores its share of it too."""
        return Decision(Phase.BY_LEARNERS, (AskLearners(validation.round),))

    def on_closing(self, validation: Validation, tally: ShareTally, world_size: int) -> Decision:
        return Decision(
            Phase.MISSED, reason=f"{len(tally)} of {tally.world or world_size} learners' shares came"
        )


class EvaluatorScores:
    """The evaluator on the averager's thread scores a validation while the learners train on; the next
    round's result waits for its score at most ``timeout_s``. A due validation that nobody started (a
    restored one, its state not held) is missed when the next round closes."""

    takes_shares = False

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(check_number("timeout_s", timeout_s, 0.001, int | float))

    def on_due(self, round: int, *, after_test: bool, epoch: int | None) -> Decision:
        return Decision(Phase.BY_EVALUATOR, (StartEvaluator(round, after_test, epoch),))

    def on_join(self, validation: Validation, *, after_test: bool, epoch: int | None) -> Decision:
        """A restored due validation is started when a learner joins at its state; once only."""
        if validation.phase is Phase.DUE:
            return self.on_due(validation.round, after_test=after_test, epoch=epoch)
        return Decision(validation.phase)

    def on_closing(self, validation: Validation, tally: ShareTally, world_size: int) -> Decision:
        if validation.phase is Phase.BY_EVALUATOR:
            return Decision(Phase.BY_EVALUATOR, (AwaitEvaluator(validation.round, self.timeout_s),))
        return Decision(Phase.MISSED, reason="nobody scores it (the averager restarted or the run resumed)")


# ------------------------------------------------------------------------------------------ machine
@dataclass
class ValidationMachine:
    """One averager's validations: ``every`` (m; 0: never), the scoring ``policy``, ``end`` ({"epochs",
    "steps"}: where training ends, None: unknown), the state, the latest averaged round and the learners'
    shares of the open validation."""

    every: int
    policy: LearnersScore | EvaluatorScores
    end: Mapping[str, Any] | None = None
    state: Validation | None = None
    averaged: int = 0
    tally: ShareTally = field(default_factory=ShareTally)

    def __post_init__(self) -> None:
        check_number("validate_every", self.every, 0)

    @classmethod
    def from_settings(cls, settings: AveragerSettings, *, by_learners: bool) -> ValidationMachine:
        """The machine of an averager: the learners score (no evaluator), or the evaluator does."""
        end = None if settings.epochs is None else {"epochs": settings.epochs, "steps": settings.steps}
        policy = LearnersScore() if by_learners else EvaluatorScores(settings.timeout_s)
        return cls(settings.validate_every, policy, end)

    @property
    def due(self) -> int | None:
        """The round whose validation is open (what a checkpoint keeps), or None."""
        return self.state.round if self.state is not None and self.state.open else None

    def scoring(self, round: int) -> bool:
        """Whether the evaluator is scoring round ``round`` now."""
        return self.state == Validation(round, Phase.BY_EVALUATOR)

    def on(self, event: Any) -> Step:
        """The transition for ``event``: the new state (also kept) and the shell's actions."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"not a validation event: {type(event).__name__}")
        step = handler(self, event)
        self.state = step.state
        return step

    # ------------------------------------------------------------------------------- transitions
    def _averaged(self, event: Averaged) -> Step:
        self.averaged = event.round
        if not self.every or event.round % self.every:
            return Step(self.state)
        actions: tuple[Any, ...] = ()
        if self.state is not None and self.state.open:  # settled at every close: kept for the contract
            actions = (Missed(self.state.round, f"round {event.round} was due before it was scored"),)
        self.tally.clear()
        after_test, epoch = self._where(event.position)
        decision = self.policy.on_due(event.round, after_test=after_test, epoch=epoch)
        return Step(Validation(event.round, decision.phase), actions + decision.actions)

    def _closing(self, event: Closing) -> Step:
        state = self.state
        if state is None or not state.open:
            return Step(state)
        return self._decided(state, self.policy.on_closing(state, self.tally, event.world_size))

    def _joined(self, event: Joined) -> Step:
        state = self.state
        if state is None or not state.open or event.held == 0 or event.held != state.round:
            return Step(state)
        after_test, epoch = self._where(event.position)
        return self._decided(state, self.policy.on_join(state, after_test=after_test, epoch=epoch))

    def _new_group(self, event: NewGroup) -> Step:
        self.tally.clear()  # the new group scores its own shares, asked when it joins
        state = self.state
        if state is not None and state.phase is Phase.BY_LEARNERS:
            return Step(Validation(state.round, Phase.DUE))
        return Step(state)

    def _dropped(self, event: LearnerDropped) -> Step:
        state = self.state
        if state is None or not state.open or not self.policy.takes_shares:
            return Step(state)
        if event.learner in self.tally.shares:
            return Step(state)  # its share is in
        return self._miss(state, f"learner {event.learner!r} was dropped before its share came")

    def _share(self, event: ShareArrived) -> Step:
        check_learner(event.learner)
        check_number("round", event.round, 1)
        check_number("world_size", event.world_size, 1)
        EvalResult.from_tallies(event.tallies)  # bad tallies raise, whether or not the share is taken
        state = self.state
        if not self.policy.takes_shares or state is None or not state.open or state.round != event.round:
            why = "the evaluator scores validations" if not self.policy.takes_shares else "not due"
            return Step(state, (Ignored(event.round, event.learner, why),), taken=False)
        if self.tally.world != event.world_size:
            self.tally.clear()  # a group of another size splits the split otherwise
        if not self.tally.add(event.learner, event.tallies, event.world_size):
            return Step(state)
        total = self.tally.total()
        self.tally.clear()
        metrics = {"top5_accuracy": total.top5_accuracy, "mean_class_accuracy": total.mean_class_accuracy}
        record = Record(
            state.round, total.accuracy, "learners", event.epoch, total.sequences, event.rows_cap, metrics
        )
        return Step(Validation(state.round, Phase.SCORED), (record,))

    def _returned(self, event: EvaluatorReturned) -> Step:
        state = self.state
        if state is None or not state.open or state.round != event.round:
            why = "not due: it was missed, or a new group or a re-seed moved on"
            return Step(state, (Ignored(event.round, "evaluator", why),), taken=False)
        if event.error is not None:
            return self._miss(state, f"the evaluator failed: {event.error}")
        scores = dict(event.scores or {})
        try:
            accuracy = check_number("accuracy", scores.get("accuracy"), -math.inf, int | float)
        except (TypeError, ValueError) as error:
            return self._miss(state, f"the evaluator's scores are unusable: {error}")
        metrics = {k: scores[k] for k in ("top5_accuracy", "mean_class_accuracy") if k in scores}
        record = Record(
            state.round, accuracy, "evaluator", event.epoch, scores.get("sequences"), event.rows_cap, metrics
        )
        return Step(Validation(state.round, Phase.SCORED), (record,))

    def _reported(self, event: Reported) -> Step:
        check_number("accuracy", event.accuracy, -math.inf, int | float)
        check_number("round", event.round, 1)
        if not self.every or event.round % self.every:
            raise ValueError(
                f"round {event.round} is not a validation round (validate_every={self.every}): "
                "report only rounds r with r % validate_every == 0"
            )
        state = self.state
        if state is not None and state.open and state.round == event.round:
            record = Record(
                event.round, event.accuracy, event.learner, event.epoch, event.val_size, event.rows_cap,
                event.metrics,
            )  # fmt: skip
            return Step(Validation(event.round, Phase.SCORED), (record,))
        # Nothing open for it: the next validation round after the latest averaged one, e.g. 5, m=2 -> 6.
        due = self.due or -(-(self.averaged + 1) // self.every) * self.every
        why = (
            "its window closed or it was reported already"
            if event.round < due
            else "that round is not averaged yet"
        )
        return Step(state, taken=False, refused=StaleRoundError(event.learner, event.round, due, why))

    def _timed_out(self, event: TimedOut) -> Step:
        state = self.state
        if not self.scoring(event.round):
            return Step(state)
        return self._miss(state, f"not reported in {event.waited_s:g} s")

    def _restored(self, event: Restored) -> Step:
        """A checkpoint's validation comes back due (its scorer is gone); the checkpoint's history is
        the run's, so nothing is recorded here."""
        self.tally.clear()
        self.averaged = check_number("round", event.averaged, 0)
        return Step(None if event.due is None else Validation(event.due, Phase.DUE))

    def _reseeded(self, event: Reseeded) -> Step:
        self.tally.clear()
        self.averaged, state = event.averaged, self.state
        if state is None or not state.open:
            return Step(state)
        return self._miss(
            state, f"a learner re-seeded round {event.averaged}: round {state.round}'s state is gone"
        )

    # ----------------------------------------------------------------------------------- helpers
    def _decided(self, state: Validation, decision: Decision) -> Step:
        if decision.phase is Phase.MISSED:
            return self._miss(state, decision.reason or "no reason given")
        return Step(Validation(state.round, decision.phase), decision.actions)

    @staticmethod
    def _miss(state: Validation, reason: str) -> Step:
        return Step(Validation(state.round, Phase.MISSED, reason), (Missed(state.round, reason),))

    def ends_training(self, position: Mapping[str, Any] | None) -> bool:
        """Whether a state at ``position`` is the last one (False when the end is unknown)."""
        return self._where(position)[0]

    def _where(self, position: Mapping[str, Any] | None) -> tuple[bool, int | None]:
        """Whether a state at ``position`` ends training (its validation waits for the test pass), and
        its epoch."""
        if position is None:
            return False, None
        epoch = int(position.get("epoch", 0))
        if self.end is None:
            return False, epoch
        return EpochPosition.from_dict(position).ends_training(**self.end), epoch


_HANDLERS = {
    Averaged: ValidationMachine._averaged,
    Closing: ValidationMachine._closing,
    Joined: ValidationMachine._joined,
    NewGroup: ValidationMachine._new_group,
    LearnerDropped: ValidationMachine._dropped,
    ShareArrived: ValidationMachine._share,
    EvaluatorReturned: ValidationMachine._returned,
    Reported: ValidationMachine._reported,
    TimedOut: ValidationMachine._timed_out,
    Restored: ValidationMachine._restored,
    Reseeded: ValidationMachine._reseeded,
}


def validation_near(every: int, round: int) -> bool:
    """Whether a validation is near after round ``round`` with one every ``every`` rounds (m): the round is
    in the second half of its interval (m = 10: rounds 5-9 are near, 10-14 not; m = 1: every round; m = 0:
    none). A restarted averager builds its evaluator from there, half of m rounds before it is asked."""
    return bool(every) and round % every >= every // 2
