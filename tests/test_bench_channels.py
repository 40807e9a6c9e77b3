"""bench/averager_cost.channel_rounds: a round of 2 learners through Ray's shared-memory channels gives
every learner the mean of their states, as the data plane's round does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "bench"

RAY_CLUSTER = {"log_to_driver": False}


def _bench():
    spec = importlib.util.spec_from_file_location("averager_cost_channels", BENCH / "averager_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_channel_rounds_average_the_learners_states_and_time_each_round(ray_cluster):
    """Two learners of different states, two rounds (a warm-up and one timed): both end with the equal-
    weight mean of the initial buffers (the second round averages two equal states: the same again); the
    timed round's seconds are positive, and the reference called before each round is returned beside it."""
    ray = ray_cluster
    cost = _bench()
    learner_cls = ray.remote(num_cpus=0)(cost.learner_class())
    pair = [learner_cls.remote(3_000, seed, 4) for seed in (1, 2)]
    try:
        before = ray.get([a.buffers.remote() for a in pair])
        assert before[0].keys() == before[1].keys() and before[0]
        assert any(not np.array_equal(before[0][k], before[1][k]) for k in before[0])  # not vacuous
        passes = iter([0.5, 0.25])
        times, references = cost.channel_rounds(pair, count=1, reference=lambda: next(passes))
        after = ray.get([a.buffers.remote() for a in pair])
    finally:
        for actor in pair:
            ray.kill(actor)
    assert len(times) == 1 and times[0] > 0 and references == [0.25]  # the warm-up's pass left out
    for key, first in before[0].items():
        expected = first + (before[1][key] - first) * np.float32(0.5)  # elementwise's rule, float32
        for state in after:
            np.testing.assert_allclose(state[key], expected, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(after[0][key], after[1][key])
