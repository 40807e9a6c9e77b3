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


def test_the_learners_settings_cross_without_the_tree():
    """What a learner is launched with holds its own settings, not the ``Config``: the record a checkpoint
    carries is plain JSON that rebuilds the same tree, and the settings survive pickling unchanged."""
    from raytrain_seq.config import Config
    from raytrain_seq.parts import LearnerSettings, Parts

    config = Config.from_preset("smoke", learners="1:3", run_name="r", precision="bf16", k=3)
    settings = Parts.of(config).learner
    assert isinstance(settings, LearnerSettings)
    assert pickle.loads(pickle.dumps(settings)) == settings
    assert not any(isinstance(getattr(settings, f.name), Config) for f in dataclasses.fields(settings))
    assert Config.from_dict(settings.config_record()) == config
    assert (settings.k, settings.step.precision, settings.run_dir) == (3, "bf16", str(config.run_dir()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.k = 1  # type: ignore[misc]
