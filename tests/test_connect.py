"""How a run's own local Ray cluster is started (the object store ``run.object_store_gb`` asks for, a call
to a dead actor failing at once), whether a cluster fails such calls at once (``death_at_once``: the
learners then start without a runtime env) and which device its learners train on (``device_decision``:
GPUs when they are enough, a clear error when ``--use-gpu`` asks for more than the cluster has)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import killed_actor_call

from raytrain_seq.config import RunSetupError
from raytrain_seq.parts import Parts
from raytrain_seq.runtime.connect import (
    DEATH_AT_ONCE,
    DEATH_AT_ONCE_ENV,
    PREALLOCATE,
    WORKER_REUSE,
    death_at_once,
    device_decision,
    store_options,
)


@pytest.mark.parametrize(
    ("use_gpu", "gpus", "learners", "share", "expected", "words"),
    [
        (None, 2, 2, 1.0, True, "training on GPUs: 2 learners x 1 GPU of the cluster's 2"),
        (None, 1, 2, 0.5, True, "2 learners x 0.5 GPU"),
        (None, 1, 2, 1.0, False, "pass --gpus-per-learner 0.5 to share them"),
        (None, 0, 2, 1.0, False, "the cluster has no GPU"),
        (False, 8, 2, 1.0, False, "train.use_gpu is False"),
        (True, 1, 2, 0.5, True, "train.use_gpu is True"),
    ],
)
def test_the_device_decision_names_its_reason(use_gpu, gpus, learners, share, expected, words):
    use, why = device_decision(use_gpu, gpus, learners, share)
    assert use is expected and words in why


@pytest.mark.parametrize(
    ("gpus", "fix"), [(0, "start Ray on a node with GPUs"), (1, "--gpus-per-learner 0.5")]
)
def test_use_gpu_without_enough_gpus_fails_with_the_count_and_the_fix(gpus, fix):
    """--use-gpu on a cluster that cannot hold the learners: Ray Train would wait for GPUs forever."""
    with pytest.raises(RunSetupError) as info:
        device_decision(True, gpus, 2, 1.0)
    message = str(info.value)
    assert f"has {gpus} GPUs" in message and "need 2" in message and fix in message


def test_store_options_keep_rays_default_store_unless_a_size_is_given():
    assert store_options(None) == {"_system_config": {**WORKER_REUSE, **DEATH_AT_ONCE}}
    sized = store_options(0.25)
    assert sized["object_store_memory"] == 250_000_000
    assert sized["_system_config"] == {**WORKER_REUSE, **DEATH_AT_ONCE, **PREALLOCATE}


@pytest.mark.parametrize("own", [True, False])
def test_use_gpu_waits_for_a_joined_clusters_gpu_nodes_but_not_for_its_own(monkeypatch, own):
    """A cluster this job started has all the GPUs it will ever have: a shortfall fails at once. A joined
    one (cluster.yaml's GPU nodes may still be booting) is polled every second for at most
    ``worker_start_timeout_s``: here its GPUs come at the third look, and then the learners take them."""
    import ray

    from raytrain_seq.config import Config
    from raytrain_seq.runtime.connect import choose_device

    counts = iter([0, 0, 2, 2])
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": next(counts)})
    sleeps: list[float] = []
    config = Config.from_preset("smoke", use_gpu=True, worker_start_timeout_s=30.0)
    if own:
        with pytest.raises(RunSetupError, match="has 0 GPUs"):
            choose_device(Parts.of(config).connect, own_cluster=True, sleep=sleeps.append)
        assert sleeps == []
    else:
        assert choose_device(Parts.of(config).connect, own_cluster=False, sleep=sleeps.append) is True
        assert sleeps == [1.0, 1.0]


# This module's cluster (conftest's ray_cluster) is started the way connect() starts a run's own.
RAY_CLUSTER = {"num_cpus": 1, **store_options(0.3)}


def test_a_cluster_started_with_a_preallocated_store_has_that_size_and_takes_puts(ray_cluster):
    """Ray accepts the options (an unknown system-config key would fail ray.init) and the store is the
    size asked for; a 60 MB array goes in and comes back equal."""
    ray = ray_cluster
    assert ray.cluster_resources()["object_store_memory"] == pytest.approx(0.3e9, rel=0.01)
    array = np.arange(15_000_000, dtype=np.float32)
    assert np.array_equal(ray.get(ray.put(array)), array)


@pytest.mark.parametrize(
    ("own", "env", "expected"),
    [(True, None, True), (False, "0", True), (False, None, False), (False, "1000", False)],
)
def test_a_cluster_fails_calls_at_once_when_the_run_started_it_or_ray_start_exported_it(
    monkeypatch, own, env, expected
):
    """The learners go without a runtime env only where the cluster needs none: one the run started, or
    one whose `ray start` exported the setting at 0 (cluster.yaml), which a job's driver inherits."""
    if env is None:
        monkeypatch.delenv(DEATH_AT_ONCE_ENV, raising=False)
    else:
        monkeypatch.setenv(DEATH_AT_ONCE_ENV, env)
    assert death_at_once(own) is expected


def test_on_a_run_s_own_cluster_a_call_to_a_killed_actor_fails_at_once_without_any_runtime_env(ray_cluster):
    """``DEATH_AT_ONCE`` in the cluster's system config: from an actor started without a runtime env (a
    learner on such a cluster) a call to an actor whose process was just killed fails at once; on a
    cluster without it the same call waits Ray's grace (``tests/test_transport.py`` pins that contrast).
    The caller kills the actor itself, so that its call goes to the dead process before any notice."""
    kind, seconds = killed_actor_call(ray_cluster)
    assert kind == "ActorUnavailableError" and seconds < 0.5, (kind, seconds)


@pytest.mark.parametrize(
    ("gpus", "learners"), [(1, 6), (1, 2), (1, 3), (2, 7), (1, 7), (3, 9), (1, 100), (0.5, 3)]
)
def test_the_gpus_per_learner_hint_multiplied_back_fits_the_gpus(gpus, learners):
    """The --gpus-per-learner the decision suggests rounds down: times the learners it fits the cluster's
    GPUs (6 learners on 1 GPU: 0.16, where 0.17 would need 1.02 GPUs and fail the same way), and it is
    the largest such share of two decimals."""
    _, why = device_decision(None, gpus, learners, 1.0)
    hint = float(why.split("--gpus-per-learner ")[1].split()[0])
    assert 0 < hint * learners <= gpus + 1e-9 and (hint + 0.01) * learners > gpus
    assert device_decision(None, gpus, learners, hint)[0] is True


def test_no_share_is_hinted_when_not_even_a_hundredth_each_fits():
    use, why = device_decision(None, 1, 200, 1.0)
    assert use is False and "--gpus-per-learner" not in why and "lower --learners" in why
