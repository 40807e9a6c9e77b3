"""AAVG's adaptive batch size (``algorithms.batchsize``): Algorithm 1's rule, its noise-aware test, its
caps, its hold under an epoch budget and its checkpointed state."""

from __future__ import annotations

import json
import math

import pytest

from raytrain_seq.algorithms.batchsize import BATCH_GROWTH, AdaptiveBatchSize, batch_may_grow


def test_adaptive_batch_size_follows_algorithm1():
    """Batch size doubles only when a < a* * b1 (strictly), a* keeps the best; history records each step."""
    rule = AdaptiveBatchSize(32, b1=1.0)
    accuracies = [0.5, 0.6, 0.55, 0.7, 0.7, 0.69]
    sizes = [rule.update(a) for a in accuracies]
    # a*: 0 -> 0.5 -> 0.6 -> 0.6 (0.55 < 0.6: grow) -> 0.7 -> 0.7 (0.7 < 0.7 is false) -> 0.69 < 0.7: grow
    assert sizes == [32, 32, 64, 64, 64, 128]
    assert rule.size == 128 and rule.best == 0.7
    assert [r.best_before for r in rule.history] == [0.0, 0.5, 0.6, 0.6, 0.7, 0.7]
    assert [r.grew for r in rule.history] == [False, False, True, False, False, True]
    assert [r.size for r in rule.history] == sizes and [r.accuracy for r in rule.history] == accuracies


def test_adaptive_batch_size_cap_tolerance_and_factor():
    """Growth stops at max_size; b1 < 1 tolerates small drops; a non-integer b2 rounds down."""
    capped = AdaptiveBatchSize(200, b1=1.0)
    assert [capped.update(a) for a in [0.9, 0.1, 0.1, 0.1]] == [200, 400, 576, 576]
    assert [r.grew for r in capped.history] == [False, True, True, False]
    seq = [0.7, 0.65, 0.62]
    strict = AdaptiveBatchSize(32, b1=1.0)
    tolerant = AdaptiveBatchSize(32, b1=0.9)
    assert [strict.update(a) for a in seq] == [32, 64, 128]
    assert [tolerant.update(a) for a in seq] == [32, 32, 64]  # 0.65 >= 0.63, 0.62 < 0.63
    fractional = AdaptiveBatchSize(32, b1=1.0, b2=1.5, max_size=100)
    assert [fractional.update(a) for a in [0.5, 0.4, 0.3, 0.2]] == [32, 48, 72, 100]


def test_adaptive_batch_size_state_dict_round_trip():
    """state_dict() is plain JSON-able python; load_state_dict restores size, best, history and config."""
    rule = AdaptiveBatchSize(16, b1=0.95, b2=3, max_size=1000)
    for a in [0.3, 0.2, 0.5]:
        rule.update(a)
    saved = json.loads(json.dumps(rule.state_dict()))
    other = AdaptiveBatchSize(1)
    other.load_state_dict(saved)
    assert other.state_dict() == rule.state_dict() and other.history == rule.history
    assert [other.update(a) for a in [0.1, 0.6]] == [rule.update(a) for a in [0.1, 0.6]] == [144, 144]


def test_adaptive_batch_size_validation():
    """Bad constructor args, accuracies and checkpoints raise naming the field; a bad load changes nothing."""
    for kwargs, pattern in (
        ({"initial": 0}, "initial must be >= 1"),
        ({"initial": 8, "b1": 0.0}, "b1 must be > 0"),
        ({"initial": 8, "b2": 0.5}, "b2 must be >= 1"),
        ({"initial": 8, "max_size": 4}, "raise max_size"),
        ({"initial": 8, "b1": float("inf")}, "b1 must be a finite"),
    ):
        with pytest.raises(ValueError, match=pattern):
            AdaptiveBatchSize(**kwargs)
    with pytest.raises(TypeError, match="initial must be an integer"):
        AdaptiveBatchSize(2.5)
    rule = AdaptiveBatchSize(8, b1=1.0)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="accuracy must be a finite"):
            rule.update(bad)
    assert rule.history == []
    rule.update(0.4)
    before = rule.state_dict()
    with pytest.raises(ValueError, match=r"lacks \['history'\]"):
        rule.load_state_dict({k: v for k, v in before.items() if k != "history"})
    with pytest.raises(ValueError, match="size 9999 is outside"):
        rule.load_state_dict({**before, "size": 9999})
    assert rule.state_dict() == before
    noisy = AdaptiveBatchSize(8)
    with pytest.raises(ValueError, match=r"val_size is missing.*train\.b1 = 1\.0"):
        noisy.update(0.5)
    for kwargs, pattern in (
        ({"val_size": 0}, "val_size must be >= 1"),
        ({"val_size": 10, "rows_cap": 0}, "rows_cap must be >= 1"),
    ):
        with pytest.raises(ValueError, match=pattern):
            noisy.update(0.5, **kwargs)
    with pytest.raises(TypeError, match="val_size must be an integer"):
        noisy.update(0.5, val_size=9.5)
    assert noisy.history == []


# A noisy plateau on 10 validation videos: every value is the true 0.5-0.6 level give or take one video
# (one video = 0.1), the way the 5-class miniature UCF101 moved.
NOISY_VAL = [0.3, 0.5, 0.4, 0.6, 0.5, 0.5, 0.6, 0.4, 0.5, 0.6, 0.5, 0.4, 0.5, 0.6, 0.5, 0.5]


def test_paper_rule_ratchets_on_a_noisy_small_validation_set_and_the_noise_rule_does_not():
    """Both rules on the same noisy sequence (n = 10): the paper's (b1 = 1) doubles B on every dip.

    Paper: every value under the best so far doubles B (0.4 after 0.5, then 9 of the 12 values after
    a* = 0.6), 10 doublings, so B goes 1 -> 512 -> 576 (max_size). Noise-aware: after a* = 0.6 the
    threshold is 0.6 - sqrt(0.24 / 10) = 0.445, so only the two 0.4s grow B: B = 4.
    """
    paper = AdaptiveBatchSize(1, b1=1.0)
    noise = AdaptiveBatchSize(1)
    paper_sizes = [paper.update(a, val_size=10) for a in NOISY_VAL]
    noise_sizes = [noise.update(a, val_size=10) for a in NOISY_VAL]
    assert sum(r.grew for r in paper.history) == 10 and paper_sizes[-1] == 576
    assert noise.noise_aware and not paper.noise_aware
    grown_at = [i for i, r in enumerate(noise.history) if r.grew]
    assert [NOISY_VAL[i] for i in grown_at] == [0.4, 0.4] and noise_sizes[-1] == 4
    assert max(paper_sizes) == 576 and max(noise_sizes) == 4
    assert noise.history[4].threshold == pytest.approx(0.6 - math.sqrt(0.24 / 10))
    # a drop of one video (0.6 -> 0.5) is inside the noise of 10 videos, outside that of 1000
    for n, grows in ((10, False), (1000, True)):
        rule = AdaptiveBatchSize(4)
        rule.update(0.6, val_size=n)
        assert (rule.update(0.5, val_size=n) > 4) is grows


def test_noise_rule_at_the_edges_of_the_accuracy_range():
    """a* = 0 never grows; at a* = 1 of 10 the standard error is 0 and the one-video floor keeps B at 0.9."""
    rule = AdaptiveBatchSize(2)
    assert rule.update(0.0, val_size=10) == 2  # first validation: nothing to fall below
    assert rule.update(1.0, val_size=10) == 2
    assert rule.threshold(10) == pytest.approx(0.9)
    assert rule.update(0.9, val_size=10) == 2  # 1.0 - 0.9 is 0.0999...98 in floats: the guard's case
    assert rule.update(0.8, val_size=10) == 4
    assert rule.update(0.7, val_size=10) == 8


@pytest.mark.parametrize("b1", [None, 1.0])
def test_batch_size_never_exceeds_the_rows_a_learner_has_per_epoch(b1):
    """rows_cap bounds B under both rules, B comes down when the cap does, never below initial."""
    rule = AdaptiveBatchSize(2, b1=b1)
    dips = [0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    sizes = [rule.update(a, val_size=1000, rows_cap=12) for a in dips]
    assert sizes == [2, 4, 8, 12, 12, 12, 12]
    assert max(r.size for r in rule.history) <= 12
    assert rule.update(0.1, val_size=1000, rows_cap=5) == 5  # more learners: 5 rows each
    assert rule.update(0.1, val_size=1000, rows_cap=1) == 2  # never below initial
    assert rule.update(0.1, val_size=1000) == 4  # no cap given: max_size rules


def test_adaptive_batch_size_loads_a_state_dict_saved_before_the_noise_rule():
    """An older checkpoint (b1 a number, history without thresholds) loads and keeps the paper's rule."""
    old = {
        "initial": 4, "b1": 1.0, "b2": 2, "max_size": 64, "size": 8, "best": 0.7,
        "history": [{"accuracy": 0.7, "best_before": 0.0, "size": 4, "grew": False},
                    {"accuracy": 0.6, "best_before": 0.7, "size": 8, "grew": True}],
    }  # fmt: skip
    rule = AdaptiveBatchSize(1)
    rule.load_state_dict(old)
    assert not rule.noise_aware and rule.size == 8 and rule.history[1].threshold is None
    assert rule.update(0.69) == 16  # the paper's rule, no val_size needed
    noise = AdaptiveBatchSize(4)
    noise.update(0.5, val_size=10)
    saved = json.loads(json.dumps(noise.state_dict()))
    again = AdaptiveBatchSize(1, b1=1.0)
    again.load_state_dict(saved)
    assert again.noise_aware and again.state_dict() == noise.state_dict()


# A 10-video validation set as issue 45 saw it: the model climbs, then dips by one and two videos around a*
# = 0.9-1.0. Noise-aware, a* = 0.9: se = 0.095, floor 0.1, threshold 0.8, so 0.7 grows B; a* = 1.0:
# threshold 0.9, so 0.8 grows B.
SMALL_VAL_RUN = [0.3, 0.5, 0.7, 0.9, 0.8, 0.9, 0.7, 0.9, 1.0, 0.9, 0.8, 1.0, 0.7, 0.9, 0.8, 1.0]


def test_batch_may_grow_only_under_a_step_budget_by_default():
    """The default, "steps", grows B only with train.steps (the paper's N); "always" under epochs too."""
    assert BATCH_GROWTH == ("steps", "always")
    assert not batch_may_grow("steps", None) and batch_may_grow("steps", 200)
    assert batch_may_grow("always", None) and batch_may_grow("always", 200)
    with pytest.raises(ValueError, match="batch growth must be one of steps, always, got 'epochs'"):
        batch_may_grow("epochs", None)


def test_a_held_rule_keeps_the_fixed_batch_on_10_videos_where_algorithm1_grows():
    """Issue 45: on 10 validation videos under an epoch budget the rule keeps B = initial at every
    validation (the fixed batch's B, so the same steps and updates: it cannot end below the fixed batch),
    and records each validation it held; the same rule not held (a step budget) grows B on exactly those
    validations, as Algorithm 1 says."""
    held = AdaptiveBatchSize(4, hold=True)
    grows = AdaptiveBatchSize(4)
    held_sizes = [held.update(a, val_size=10, rows_cap=40) for a in SMALL_VAL_RUN]
    grown_sizes = [grows.update(a, val_size=10, rows_cap=40) for a in SMALL_VAL_RUN]
    assert held_sizes == [4] * len(SMALL_VAL_RUN) and held.hold and not grows.hold
    grew_at = [i for i, r in enumerate(grows.history) if r.grew]
    assert [SMALL_VAL_RUN[i] for i in grew_at] == [0.7, 0.8, 0.7, 0.8]  # guard: the sequence does grow B
    assert grown_sizes[-1] == 40  # 4 -> 8 -> 16 -> 32 -> 40, the rows cap
    assert [i for i, r in enumerate(held.history) if r.held] == grew_at
    assert not any(r.grew for r in held.history) and not any(r.held for r in grows.history)
    assert held.best == grows.best == 1.0
    assert [r.threshold for r in held.history] == [r.threshold for r in grows.history]
    # The state round-trips with its hold; a dict saved before hold existed grew B under any budget.
    again = AdaptiveBatchSize(1)
    again.load_state_dict(json.loads(json.dumps(held.state_dict())))
    assert again.hold and again.history == held.history and again.update(0.1, val_size=10) == 4
    old = {k: v for k, v in grows.state_dict().items() if k != "hold"}
    old["history"] = [{k: v for k, v in r.items() if k != "held"} for r in old["history"]]
    legacy = AdaptiveBatchSize(1)
    legacy.load_state_dict(old)
    assert not legacy.hold and legacy.size == 40 and not legacy.history[0].held
    with pytest.raises(TypeError, match="hold must be True or False"):
        AdaptiveBatchSize(4, hold=1)
