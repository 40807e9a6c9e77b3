"""The learners' launch spec: one frozen, checked value crosses from the driver to every learner."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from raytrain_seq.runtime.launch import LearnerLaunch


def test_a_launch_is_frozen_checked_and_survives_pickling():
    """Ray Train pickles train_loop_config to the learners: the spec comes back equal; a field cannot be
    set after the fact (the driver replaces the whole value), and an empty name or a bad thread count is
    refused naming the field."""
    launch = LearnerLaunch(averager="averager-1", feed="feed-1", namespace="raytrain_seq", fresh=True)
    assert pickle.loads(pickle.dumps(launch)) == launch
    assert (launch.evaluator, launch.torch_threads) == (False, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        launch.evaluator = True  # type: ignore[misc]
    assert dataclasses.replace(launch, evaluator=True).evaluator
    with pytest.raises(ValueError, match=r"LearnerLaunch\.feed"):
        LearnerLaunch(averager="a", feed="", namespace="n", fresh=False)
    with pytest.raises(ValueError, match=r"LearnerLaunch\.torch_threads"):
        LearnerLaunch(averager="a", feed="f", namespace="n", fresh=False, torch_threads=0)
