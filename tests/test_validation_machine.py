"""The validation state machine (``rounds.validation``) without Ray: every state reachable, each
transition's result, a validation never scored twice nor lost (a missed one is recorded with its reason),
event sequences as a table (learners scoring, a learner dropped mid-scoring, the evaluator failing or
succeeding, a resume from a checkpoint at each state), and the averager running the machine's actions
in process (``ParameterAverager`` with a fake evaluator)."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from averager_fixtures import local_averager

from raytrain_seq.members.errors import StaleRoundError
from raytrain_seq.rounds.position import EpochPosition
from raytrain_seq.rounds.settings import AveragerSettings
from raytrain_seq.rounds.validation import (
    AskLearners,
    Averaged,
    AwaitEvaluator,
    Closing,
    EvaluatorReturned,
    EvaluatorScores,
    Ignored,
    Joined,
    LearnerDropped,
    LearnersScore,
    Missed,
    NewGroup,
    Phase,
    Record,
    Reported,
    Reseeded,
    Restored,
    ShareArrived,
    StartEvaluator,
    TimedOut,
    Validation,
    ValidationMachine,
    validation_near,
)

UNUSABLE = (
    "the evaluator's scores are unusable: "
    "accuracy must be a number >= -inf, got None: pass a finite value of at least -inf"
)
SCORES = {"accuracy": 0.5, "sequences": 10, "top5_accuracy": 1.0, "mean_class_accuracy": 0.25}
NOBODY = "nobody scores it (the averager restarted or the run resumed)"


def _tallies(correct: int, sequences: int = 10, label: int = 0) -> dict:
    return {"correct": correct, "sequences": sequences, "per_class": {str(label): [correct, sequences]},
            "top5_correct": sequences, "confusion": {f"{label},{label}": correct}}  # fmt: skip


def _machine(by: str, state: Validation | None = None, *, every: int = 1, averaged: int = 0, end=None):
    policy = LearnersScore() if by == "learners" else EvaluatorScores(timeout_s=30.0)
    return ValidationMachine(every, policy, end, state=state, averaged=averaged)


def _outcomes(actions) -> list[tuple]:
    """The records and misses among actions, as (round, what)."""
    out = []
    for a in actions:
        if isinstance(a, Record):
            out.append((a.round, "scored"))
        elif isinstance(a, Missed):
            out.append((a.round, "missed"))
    return out


# ------------------------------------------------------------------------------------- transitions
def V(round_: int, phase: Phase, reason: str | None = None) -> Validation:
    return Validation(round_, phase, reason)


DUE, LEARN, EVAL = Phase.DUE, Phase.BY_LEARNERS, Phase.BY_EVALUATOR
RECORD_EVAL = Record(1, 0.5, "evaluator", 3, 10, 40, {"top5_accuracy": 1.0, "mean_class_accuracy": 0.25})

# (scorers, state before, event) -> (state after, actions)
TRANSITIONS = [
    ("learners", None, Averaged(1), V(1, LEARN), (AskLearners(1),)),
    ("evaluator", None, Averaged(1, {"epoch": 2}), V(1, EVAL), (StartEvaluator(1, False, 2),)),
    ("learners", V(1, Phase.SCORED), Averaged(2), V(2, LEARN), (AskLearners(2),)),
    ("learners", V(1, LEARN), Closing(2, 2), V(1, Phase.MISSED, "0 of 2 learners' shares came"),
     (Missed(1, "0 of 2 learners' shares came"),)),
    ("learners", V(1, DUE), Closing(2, 3), V(1, Phase.MISSED, "0 of 3 learners' shares came"),
     (Missed(1, "0 of 3 learners' shares came"),)),
    ("evaluator", V(1, EVAL), Closing(2, 2), V(1, EVAL), (AwaitEvaluator(1, 30.0),)),
    ("evaluator", V(1, DUE), Closing(2, 2), V(1, Phase.MISSED, NOBODY), (Missed(1, NOBODY),)),
    ("learners", V(1, Phase.SCORED), Closing(2, 2), V(1, Phase.SCORED), ()),
    ("evaluator", V(1, Phase.MISSED, "x"), Closing(2, 2), V(1, Phase.MISSED, "x"), ()),
    ("evaluator", V(1, EVAL), EvaluatorReturned(1, SCORES, epoch=3, rows_cap=40), V(1, Phase.SCORED),
     (RECORD_EVAL,)),
    ("evaluator", V(1, EVAL), EvaluatorReturned(1, error="OSError('gone')"),
     V(1, Phase.MISSED, "the evaluator failed: OSError('gone')"),
     (Missed(1, "the evaluator failed: OSError('gone')"),)),
    ("evaluator", V(1, EVAL), EvaluatorReturned(1, {"sequences": 10}),
     V(1, Phase.MISSED, UNUSABLE),
     (Missed(1, UNUSABLE),)),
    ("evaluator", V(1, EVAL), TimedOut(1, 30.0), V(1, Phase.MISSED, "not reported in 30 s"),
     (Missed(1, "not reported in 30 s"),)),
    ("evaluator", V(2, EVAL), TimedOut(1, 30.0), V(2, EVAL), ()),
    ("learners", V(1, LEARN), LearnerDropped("b"),
     V(1, Phase.MISSED, "learner 'b' was dropped before its share came"),
     (Missed(1, "learner 'b' was dropped before its share came"),)),
    ("evaluator", V(1, EVAL), LearnerDropped("b"), V(1, EVAL), ()),
    ("learners", V(1, LEARN), NewGroup(), V(1, DUE), ()),
    ("evaluator", V(1, EVAL), NewGroup(), V(1, EVAL), ()),
    ("learners", V(1, DUE), Joined(1), V(1, LEARN), (AskLearners(1),)),
    ("learners", V(1, LEARN), Joined(1), V(1, LEARN), (AskLearners(1),)),
    ("learners", V(1, DUE), Joined(2), V(1, DUE), ()),
    ("evaluator", V(1, DUE), Joined(1, {"epoch": 1}), V(1, EVAL), (StartEvaluator(1, False, 1),)),
    ("evaluator", V(1, EVAL), Joined(1), V(1, EVAL), ()),  # started once only
    ("evaluator", None, Joined(0), None, ()),
    ("learners", V(1, LEARN), Reported(1, 0.5, epoch=0), V(1, Phase.SCORED),
     (Record(1, 0.5, "validator", 0),)),
    ("evaluator", V(3, EVAL), Reseeded(5), V(3, Phase.MISSED, "a learner re-seeded round 5: round 3's state is gone"),
     (Missed(3, "a learner re-seeded round 5: round 3's state is gone"),)),
    ("evaluator", V(3, EVAL), Restored(3, 3), V(3, DUE), ()),
    ("learners", V(3, Phase.SCORED), Restored(4, None), None, ()),
]  # fmt: skip


@pytest.mark.parametrize(("by", "before", "event", "after", "actions"), TRANSITIONS)
def test_each_transition_gives_its_state_and_actions(by, before, event, after, actions):
    machine = _machine(by, before, averaged=1)
    step = machine.on(event)
    assert (step.state, step.actions) == (after, actions)
    assert machine.state == after  # the machine keeps the step's state


def test_every_state_is_reachable():
    """From nothing: due (restored), scoring by the learners, scoring by the evaluator, scored, missed."""
    reached: set = set()
    for by, events in [
        ("learners", [Restored(1, 1), Joined(1), ShareArrived(0, 1, _tallies(5), 1), Averaged(2), Closing(3, 1)]),
        ("evaluator", [Averaged(1), EvaluatorReturned(1, SCORES), Averaged(2), TimedOut(2, 1.0)]),
    ]:  # fmt: skip
        machine = _machine(by)
        for event in events:
            reached.add(machine.on(event).state.phase)
    assert reached == set(Phase)


def test_a_validation_round_is_due_every_m_rounds_and_other_reports_are_refused():
    """Round r with r % m == 0 owes one validation; a report of another round is the caller's error."""
    machine = _machine("evaluator", every=2)
    assert machine.on(Averaged(1)).state is None and machine.due is None
    assert machine.on(Averaged(2)).state == V(2, EVAL) and machine.due == 2
    with pytest.raises(ValueError, match="not a validation round"):
        machine.on(Reported(1, 0.5))
    refused = machine.on(Reported(4, 0.5, "rank0")).refused
    assert isinstance(refused, StaleRoundError) and "not averaged yet" in str(refused)
    assert _outcomes(machine.on(Reported(2, 0.5)).actions) == [(2, "scored")] and machine.due is None
    again = machine.on(Reported(2, 0.5, "rank0"))
    assert not again.taken and again.actions == () and "reported already" in str(again.refused)
    assert again.refused.learner == "rank0"
    with pytest.raises(ValueError, match="accuracy"):
        machine.on(Reported(2, float("nan")))


@pytest.mark.parametrize(
    ("every", "near"),
    [(10, {5, 6, 7, 8, 9, 15}), (1, set(range(1, 16))), (2, {1, 3, 5, 7, 9, 11, 13, 15}), (0, set())],
)
def test_a_validation_is_near_in_the_second_half_of_its_interval(every, near):
    """``validation_near``: the rounds from which a restarted averager builds its evaluator, at least half of m rounds
    before the validation that asks for it (m = 10: 5-9; a due round itself is not, its validation starts
    the build); m = 0 validates never, so no round is near."""
    assert {r for r in range(1, 16) if validation_near(every, r)} == near


def test_the_learners_shares_sum_once_all_of_the_group_are_in():
    machine = _machine("learners", V(4, LEARN))
    assert not machine.on(ShareArrived(0, 3, _tallies(1), 2)).taken  # another round
    first = machine.on(ShareArrived(0, 4, _tallies(7, 10, 0), 2, epoch=1, rows_cap=40))
    assert first.taken and first.actions == () and machine.state == V(4, LEARN)
    done = machine.on(ShareArrived(1, 4, _tallies(2, 5, 1), 2, epoch=1, rows_cap=40))
    [record] = done.actions
    assert (record.round, record.accuracy, record.learner, record.val_size) == (4, 9 / 15, "learners", 15)
    assert record.metrics["mean_class_accuracy"] == pytest.approx((0.7 + 0.4) / 2)
    assert (record.epoch, record.rows_cap, machine.state, len(machine.tally)) == (
        1,
        40,
        V(4, Phase.SCORED),
        0,
    )
    late = machine.on(ShareArrived(0, 4, _tallies(1), 2))
    assert not late.taken and isinstance(late.actions[0], Ignored)  # never scored twice
    # A share of a group of another size starts the tally again; bad tallies raise, taken or not.
    machine = _machine("learners", V(6, LEARN))
    machine.on(ShareArrived(0, 6, _tallies(1, 2), 2))
    assert machine.on(ShareArrived(0, 6, _tallies(2, 2), 1)).actions[0].accuracy == 1.0
    with pytest.raises((TypeError, ValueError, KeyError)):
        machine.on(ShareArrived(0, 6, {"nonsense": 1}, 1))
    evaluator = _machine("evaluator", V(4, EVAL))
    assert not evaluator.on(ShareArrived(0, 4, _tallies(1), 1)).taken  # the evaluator scores here


def test_the_round_that_ends_training_waits_for_the_test_pass():
    end = EpochPosition(2, steps=8).as_dict()
    machine = _machine("evaluator", end={"epochs": 2, "steps": None})
    assert machine.on(Averaged(1, EpochPosition(1, steps=4).as_dict())).actions == (
        StartEvaluator(1, False, 1),
    )
    machine.on(EvaluatorReturned(1, SCORES))
    assert machine.on(Averaged(2, end)).actions == (StartEvaluator(2, True, 2),)


def test_the_machine_is_built_from_the_averagers_settings():
    settings = AveragerSettings(world_size=2, validate_every=3, timeout_s=7.0, epochs=4)
    by_evaluator = ValidationMachine.from_settings(settings, by_learners=False)
    assert (by_evaluator.every, by_evaluator.policy.timeout_s, by_evaluator.end) == (
        3,
        7.0,
        {"epochs": 4, "steps": None},
    )
    assert isinstance(ValidationMachine.from_settings(settings, by_learners=True).policy, LearnersScore)
    with pytest.raises(ValueError, match="validate_every"):
        ValidationMachine(-1, LearnersScore())
    with pytest.raises(TypeError, match="not a validation event"):
        by_evaluator.on("round closed")  # fmt: skip


# --------------------------------------------------------------------------- never twice, never lost
EVENT_POOL = ["averaged", "closing", "share0", "share1", "returned", "failed", "late", "dropped", "timeout",
              "joined", "group", "report"]  # fmt: skip


def _random_event(rng: random.Random, machine: ValidationMachine, next_round: int):
    kind = rng.choice(EVENT_POOL)
    open_round = machine.due or max(1, next_round - 1)
    return {
        "averaged": Averaged(next_round),
        "closing": Closing(next_round, 2),
        "share0": ShareArrived(0, open_round, _tallies(3), 2),
        "share1": ShareArrived(1, open_round, _tallies(4), 2),
        "returned": EvaluatorReturned(open_round, SCORES),
        "failed": EvaluatorReturned(open_round, error="boom"),
        "late": EvaluatorReturned(max(1, open_round - 1), SCORES),
        "dropped": LearnerDropped(rng.choice([0, 1])),
        "timeout": TimedOut(open_round, 1.0),
        "joined": Joined(next_round - 1),
        "group": NewGroup(),
        "report": Reported(open_round, 0.5) if open_round % 2 == 0 else Closing(next_round, 2),
    }[kind]


@pytest.mark.parametrize("by", ["learners", "evaluator"])
@pytest.mark.parametrize("seed", range(20))
def test_a_validation_is_never_scored_twice_nor_lost(by, seed):
    """Random event sequences: each due round gets at most one outcome (a score or a miss with its
    reason); once every round is settled (a close, and the evaluator's timeout), each has exactly one."""
    rng = random.Random(seed)
    machine = _machine(by, every=2)
    outcomes: list[tuple] = []
    due: set[int] = set()
    next_round = 1
    for _ in range(200):
        event = _random_event(rng, machine, next_round)
        step = machine.on(event)
        if isinstance(event, Averaged):
            next_round += 1
            if event.round % 2 == 0:
                due.add(event.round)
        outcomes += _outcomes(step.actions)
        assert all(a.reason for a in step.actions if isinstance(a, Missed))  # each says why
        assert len(outcomes) == len(set(r for r, _ in outcomes))  # never twice
    for event in (Closing(next_round, 2), TimedOut(machine.due or 0, 1.0)):
        outcomes += _outcomes(machine.on(event).actions)
    assert sorted(r for r, _ in outcomes) == sorted(due) and len(due) >= 2  # never lost
    assert machine.due is None


# ------------------------------------------------------------------------------- event sequences
def _run(by: str, events: list, **options) -> tuple[ValidationMachine, list[tuple]]:
    machine = _machine(by, **options)
    outcomes = []
    for event in events:
        outcomes += _outcomes(machine.on(event).actions)
    return machine, outcomes


SEQUENCES = [
    ("learners score", "learners",
     [Averaged(1), ShareArrived(0, 1, _tallies(6), 2), ShareArrived(1, 1, _tallies(4), 2), Closing(2, 2)],
     V(1, Phase.SCORED), [(1, "scored")]),
    ("a learner dropped mid-scoring", "learners",
     [Averaged(1), ShareArrived(0, 1, _tallies(6), 2), LearnerDropped(0), LearnerDropped(1), Closing(2, 2),
      ShareArrived(1, 1, _tallies(4), 2)],
     V(1, Phase.MISSED, "learner 1 was dropped before its share came"), [(1, "missed")]),
    ("a new group scores the due round again", "learners",
     [Averaged(1), ShareArrived(0, 1, _tallies(6), 2), NewGroup(), Joined(1), ShareArrived(0, 1, _tallies(6), 1)],
     V(1, Phase.SCORED), [(1, "scored")]),
    ("the evaluator fails", "evaluator",
     [Averaged(1), EvaluatorReturned(1, error="RuntimeError('no rows')"), Closing(2, 2), TimedOut(1, 30.0)],
     V(1, Phase.MISSED, "the evaluator failed: RuntimeError('no rows')"), [(1, "missed")]),
    ("the evaluator succeeds", "evaluator",
     [Averaged(1), Closing(2, 2), EvaluatorReturned(1, SCORES), TimedOut(1, 30.0)],
     V(1, Phase.SCORED), [(1, "scored")]),
    ("the evaluator is late", "evaluator",
     [Averaged(1), Closing(2, 2), TimedOut(1, 30.0), EvaluatorReturned(1, SCORES)],
     V(1, Phase.MISSED, "not reported in 30 s"), [(1, "missed")]),
    ("a late evaluation is not the next one's", "evaluator",
     [Averaged(1), TimedOut(1, 30.0), Averaged(2), EvaluatorReturned(1, error="boom"), EvaluatorReturned(2, SCORES)],
     V(2, Phase.SCORED), [(1, "missed"), (2, "scored")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("by", "events", "final", "outcomes"), [s[1:] for s in SEQUENCES], ids=[s[0] for s in SEQUENCES]
)
def test_event_sequences(by, events, final, outcomes):
    machine, got = _run(by, events)
    assert (machine.state, got) == (final, outcomes)


# The state a checkpoint is taken in -> the events that lead there (round 1 validated, m = 1).
AT = {
    None: [],
    Phase.DUE: [Restored(1, 1)],
    Phase.BY_LEARNERS: [Averaged(1)],
    Phase.BY_EVALUATOR: [Averaged(1)],
    Phase.SCORED: [Averaged(1), Reported(1, 0.5)],
    Phase.MISSED: [Averaged(1), Closing(2, 2), TimedOut(1, 1.0)],
}
FINISH = {  # what the resumed group does: its learners score their shares, or the evaluator returns
    "learners": [ShareArrived(0, 1, _tallies(5), 1)],
    "evaluator": [EvaluatorReturned(1, SCORES)],
}


RESUMES = [
    (by, phase) for by in FINISH for phase in AT if phase is not {"learners": EVAL, "evaluator": LEARN}[by]
]


@pytest.mark.parametrize(
    ("by", "phase"), RESUMES, ids=[f"{by}-{getattr(p, 'name', 'none')}" for by, p in RESUMES]
)
def test_resume_from_a_checkpoint_at_each_state(by, phase):
    """A checkpoint keeps the open validation's round (``due``); restored, it comes back due and is
    scored by whoever scores at the join (the learners are asked, the evaluator starts), or missed when
    the next round closes. A scored or missed one is not due again."""
    before, _ = _run(by, AT[phase])
    assert before.state is None if phase is None else before.state.phase is phase
    resumed = _machine(by)
    assert resumed.on(Restored(1, before.due)).state == (None if before.due is None else V(1, DUE))
    joined = resumed.on(Joined(1))
    if before.due is None:
        assert (joined.state, joined.actions) == (None, ())
        return
    asks = AskLearners(1) if by == "learners" else StartEvaluator(1, False, None)
    assert joined.actions == (asks,)
    outcomes = []
    for event in FINISH[by]:
        outcomes += _outcomes(resumed.on(event).actions)
    assert (resumed.state, outcomes) == (V(1, Phase.SCORED), [(1, "scored")])
    nobody = _machine(by)  # restored, but no learner joins at its state: missed when the next round closes
    nobody.on(Restored(1, before.due))
    assert _outcomes(nobody.on(Closing(2, 1)).actions) == [(1, "missed")]


# ------------------------------------------------------------------------ the averager runs the actions
def _tiny(value: float) -> dict:
    return {"w": torch.full((4,), float(value))}


class SlowEvaluator:
    """Scores after ``delay`` seconds, or raises ``failure``."""

    def __init__(self, delay: float = 0.0, failure: Exception | None = None) -> None:
        self.delay, self.failure, self.rounds = delay, failure, []

    async def __call__(self, state):
        self.rounds.append(state.round)
        await asyncio.sleep(self.delay)
        if self.failure is not None:
            raise self.failure
        return dict(SCORES)


def _two_rounds(evaluator, *, timeout_s: float):
    async def scenario():
        averager = local_averager(1, timeout_s=timeout_s, validate_every=1, batch_size=4, validator=evaluator)
        await averager.join("a")
        await averager.average("a", 1, 1, _tiny(1), None)
        await asyncio.sleep(0.05)
        await averager.average("a", 2, 1, _tiny(2), None)  # waits for round 1's score at most timeout_s
        await asyncio.sleep(0.3)  # a late evaluation comes back meanwhile
        return (await averager.summary(settle=True)).validation_history

    return asyncio.run(asyncio.wait_for(scenario(), 20))


def test_the_averager_records_the_evaluators_scores_once_each():
    history = _two_rounds(SlowEvaluator(), timeout_s=5.0)
    assert [(v["round"], v["accuracy"], v["missed"]) for v in history] == [(1, 0.5, False), (2, 0.5, False)]


def test_a_failed_evaluation_is_missed_at_once_with_its_reason():
    history = _two_rounds(SlowEvaluator(failure=RuntimeError("no rows")), timeout_s=5.0)
    assert [(v["round"], v["missed"]) for v in history] == [(1, True), (2, True)]
    assert history[0]["reason"] == "the evaluator failed: RuntimeError('no rows')"


def test_a_late_evaluation_is_missed_and_its_score_never_counts():
    history = _two_rounds(SlowEvaluator(delay=0.2), timeout_s=0.1)
    assert [(v["round"], v["missed"]) for v in history][:1] == [(1, True)]
    assert history[0]["reason"] == "not reported in 0.1 s"
    assert [v["round"] for v in history].count(1) == 1  # the late score of round 1 was not taken


def test_a_learner_dropped_mid_scoring_misses_the_validation_with_its_name():
    async def scenario():
        averager = local_averager(2, timeout_s=0.2, validate_every=1, batch_size=4)
        for name in "ab":
            await averager.join(name, 2, incarnation=name)
        await asyncio.gather(*(averager.average(n, 1, 2, _tiny(1), None) for n in "ab"))
        assert await averager.report_validation_share("a", 1, _tallies(7), 2, epoch=0)
        await averager.average("a", 2, 2, _tiny(2), None)  # b never sends round 2: dropped at the timeout
        return (await averager.summary()).validation_history

    [missed] = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert (missed["round"], missed["missed"]) == (1, True)
    assert missed["reason"] == "learner 'b' was dropped before its share came"
