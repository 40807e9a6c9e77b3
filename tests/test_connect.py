"""How a run's own local Ray cluster is started: the object store ``run.object_store_gb`` asks for."""

from __future__ import annotations

import numpy as np
import pytest

from raytrain_seq.runtime.connect import PREALLOCATE, WORKER_REUSE, store_options


def test_store_options_keep_rays_default_store_unless_a_size_is_given():
    assert store_options(None) == {"_system_config": WORKER_REUSE}
    sized = store_options(0.25)
    assert sized["object_store_memory"] == 250_000_000
    assert sized["_system_config"] == {**WORKER_REUSE, **PREALLOCATE}


# This module's cluster (conftest's ray_cluster) is started the way connect() starts a run's own.
RAY_CLUSTER = {"num_cpus": 1, **store_options(0.3)}


def test_a_cluster_started_with_a_preallocated_store_has_that_size_and_takes_puts(ray_cluster):
    """Ray accepts the options (an unknown system-config key would fail ray.init) and the store is the
    size asked for; a 60 MB array goes in and comes back equal."""
    ray = ray_cluster
    assert ray.cluster_resources()["object_store_memory"] == pytest.approx(0.3e9, rel=0.01)
    array = np.arange(15_000_000, dtype=np.float32)
    assert np.array_equal(ray.get(ray.put(array)), array)
