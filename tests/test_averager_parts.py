"""The averager's plain parts, without Ray or asyncio: its settings (``rounds.settings``), the batch-size
rule (``rounds.batch_rule``), the shares of an evaluation pass (``rounds.tally``) and the round in progress
(``rounds.current_round``: its phase, deadline, expected and arrived learners). The validation machine
has its own tests (``test_validation_machine.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from raytrain_seq.config import Config
from raytrain_seq.parts import Parts
from raytrain_seq.rounds.batch_rule import BatchRule
from raytrain_seq.rounds.book import RoundBook
from raytrain_seq.rounds.current_round import CurrentRound, RoundPhase
from raytrain_seq.rounds.settings import AveragerSettings
from raytrain_seq.rounds.tally import ShareTally
from raytrain_seq.training.eval_result import EvalResult


def _tallies(correct: int, sequences: int, label: int = 0) -> dict:
    wrong = sequences - correct
    return EvalResult(
        accuracy=correct / sequences,
        loss=0.0,
        sequences=sequences,
        per_class={label: (correct, sequences)},
        top5_correct=sequences,
        confusion={(label, label): correct, **({(label, label + 1): wrong} if wrong else {})},
    ).tallies()


def test_settings_come_from_the_train_section_whole():
    config = Config.from_preset("demo", storage_path="/tmp/unused")
    settings = Parts.of(config).averager
    train = config.train
    assert (settings.world_size, settings.timeout_s) == (train.max_learners, train.averager_timeout_s)
    assert settings.probe_s == train.averager_probe_s > 0
    assert (settings.batch_size, settings.b1, settings.b2) == (train.batch_size, train.b1, train.b2)
    assert (settings.shard_count, settings.channels) == (train.shards, train.averager_channels)
    assert (settings.epochs, settings.steps, settings.tracker) == (
        train.epochs,
        train.steps,
        config.run.tracker,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.batch_size = 8  # passed whole, never edited on the way


def test_settings_refuse_what_only_the_averager_reads():
    with pytest.raises(TypeError, match="merge_moments must be True or False"):
        AveragerSettings(world_size=2, merge_moments=1)
    with pytest.raises(ValueError, match="shards must be an int >= 1"):
        AveragerSettings(world_size=2, shards=0)
    with pytest.raises(ValueError, match="batch growth must be one of"):
        AveragerSettings(world_size=2, batch_growth="sometimes")
    assert AveragerSettings(world_size=3).shard_count == 3  # one shard per learner unless given


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"world_size": 0}, "world_size must be an int >= 1"),
        ({"world_size": 2, "timeout_s": 0}, "timeout_s must be a number >= 0.001"),
        ({"world_size": 2, "min_learners": 3}, "min_learners 3 > world_size 2: lower min_learners"),
        ({"world_size": 2, "validate_every": -1}, "validate_every must be an int >= 0"),
        ({"world_size": 2, "batch_size": 0}, "initial must be >= 1"),
        ({"world_size": 2, "batch_size": 8, "max_batch_size": 4}, "max_size 4 < initial 8"),
        ({"world_size": 2, "b1": 0.0}, "b1 must be > 0"),
        ({"world_size": 2, "b2": 0.5}, "b2 must be >= 1"),
        ({"world_size": 2, "tracker": "wandb"}, "tracker must be one of"),
    ],
)
def test_settings_are_checked_when_built_not_by_a_throwaway_averager(values, message):
    """What the round book and the batch rule refuse fails at construction, in the driver (create_averager
    builds no averager to find it)."""
    with pytest.raises(ValueError, match=message):
        AveragerSettings(**values)


def test_the_batch_rule_grows_b_only_when_the_rule_and_the_budget_say_so():
    """An accuracy that falls short of the best grows B by b2 (AAVG Algorithm 1, lines 14-20) under a step
    budget; under epochs (batch_growth "steps") or with adaptive_batch off B stays."""
    falling = (0.9, 0.5, 0.4)
    grows = BatchRule(AveragerSettings(world_size=1, batch_size=4, steps=100))
    decided = [grows.decide(a, val_size=None, rows_cap=None) for a in falling]
    assert [(d.size, d.grew) for d in decided] == [(4, False), (8, True), (16, True)]
    assert grows.size == grows.state_dict()["size"] == 16
    held = BatchRule(AveragerSettings(world_size=1, batch_size=4))
    fixed = BatchRule(AveragerSettings(world_size=1, batch_size=4, steps=100, adaptive_batch=False))
    for rule in (held, fixed):
        decided = [rule.decide(a, val_size=None, rows_cap=None) for a in falling]
        assert [(d.size, d.grew) for d in decided] == [(4, False)] * 3
    restored = BatchRule(AveragerSettings(world_size=1, batch_size=4))
    restored.load_state_dict(grows.state_dict())  # a checkpoint's rule comes back whole
    assert restored.size == 16


def test_a_tally_sums_shares_as_evalresult_combine_does():
    tally = ShareTally()
    assert not tally.add(0, _tallies(1, 2, label=0), 2)
    assert tally.add(1, _tallies(2, 2, label=1), 2)
    totals = tally.totals()
    assert (totals.correct, totals.sequences, totals.learners) == (3, 4, 2)
    assert totals.per_class == {"0": [1, 2], "1": [2, 2]}
    assert totals.confusion == {"0,0": 1, "0,1": 1, "1,1": 2}
    tally.clear()
    assert (len(tally), tally.world, tally.complete) == (0, None, False)


def test_the_round_phase_is_an_enum_through_a_round():
    book = RoundBook(1, timeout_s=30.0)
    book.join("a")
    assert book.current.phase is RoundPhase.IDLE
    book.arrive("a", 1, 1, object())
    assert book.current.phase is RoundPhase.OPEN
    closed = book.close()
    assert book.current.phase is RoundPhase.CLOSING and closed.round == 1
    book.finish(ok=True)
    assert (book.current.phase, book.round) == (RoundPhase.IDLE, 2)


def test_the_current_round_waits_for_the_expected_until_its_deadline_and_settles_empty():
    """The first arrival opens the round with its expected set and a deadline from the injected clock;
    a released learner is no longer waited for unless it sent already; settle empties it back to idle
    and the next open counts a new opening (the timer of an earlier one is then stale)."""
    now = [100.0]
    current = CurrentRound(lambda: now[0])
    assert (current.phase, current.opening, current.deadline) == (RoundPhase.IDLE, 0, None)
    assert current.first_payload is None
    assert not current.expired()  # an idle round has no deadline to pass
    current.open({"b", 2, 1}, 5.0)
    current.arrivals["b"], current.arrivals[1] = "pb", "p1"
    assert (current.phase, current.opening) == (RoundPhase.OPEN, 1)
    assert (current.opened_at, current.deadline) == (100.0, 105.0)
    assert current.expected == [1, 2, "b"] and current.arrived == [1, "b"] and current.missing == [2]
    assert current.first_payload == "pb"  # the first to arrive, whatever the sorted order
    current.expect("c")
    current.release(1)  # it sent already: its payload stays and it is not missing
    current.release(2)
    assert current.missing == ["c"] and current.arrived == [1, "b"]
    now[0] = 105.0
    assert current.expired()
    current.phase = RoundPhase.CLOSING
    assert not current.expired()  # a closing round is past waiting
    current.settle()
    assert (current.phase, current.opened_at, current.deadline) == (RoundPhase.IDLE, None, None)
    assert current.arrivals == {} and current.expected == [] and current.opening == 1
    current.open([], 1.0)
    assert current.opening == 2 and current.deadline == 106.0


def test_the_averager_module_imports_no_model_code():
    """A restarted averager answers the learners only once its module is imported: it adds counts
    (``EvalResult``) and tensors, and never builds a model, so neither the project's models nor
    torchvision may come with it (they once did, through ``training.evaluation``)."""
    import subprocess
    import sys

    probe = (
        "import sys, raytrain_seq.runtime.averager\n"
        "print(sorted(m for m in ('torchvision', 'raytrain_seq.models', 'raytrain_seq.training.evaluation')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    # Vacuity guard: the probe does see a module that is imported.
    seen = subprocess.run(
        [sys.executable, "-c", "import sys, raytrain_seq.models.resnet; print('torchvision' in sys.modules)"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert seen.strip() == "True"
