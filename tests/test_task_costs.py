"""The feed's cost from its tasks' reports (data/task_costs.py), without Ray."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from raytrain_seq.data.task_costs import feed_cost, task_tallies
from raytrain_seq.outputs.reports import FeedReport


def _info(ids, epochs, frames, cpu_s, **extra):
    return {"ids": ids, "epochs": epochs, "frames": frames, "cpu_s": cpu_s, "seconds": 1.0, **extra}


def test_a_tasks_cpu_goes_to_its_epochs_by_frames_and_its_cache_counts_stay_whole():
    """4 CPU-seconds over videos of 30 and 10 frames of epochs 1 and 2: 3 and 1 s; the stages likewise;
    the frame-cache counts go whole to the task's first epoch (a task computes for one epoch)."""
    infos = [
        _info([7, 8], [1, 2], [30, 10], 4.0, stages={"decode": 2.0}, frame_cache={"hits": 1, "misses": 1}),
        _info([9], [None], [5], 0.5),
    ]
    ran, seconds, flowed, _, costs = task_tallies(infos)
    assert ran == {1: [7], 2: [8], None: [9]} and flowed == {} and seconds[1] == pytest.approx(0.5)
    assert costs[1]["partial_cpu_s"] == pytest.approx(3.0) and costs[2]["partial_cpu_s"] == pytest.approx(1.0)
    assert costs[1]["stages"]["decode"] == pytest.approx(1.5) and costs[1]["partial_frames"] == 30
    assert costs[1]["frame_cache"] == {"hits": 1, "misses": 1} and costs[2]["frame_cache"] == {}
    assert costs[None]["partial_cpu_s"] == pytest.approx(0.5)
    assert sum(c["partial_cpu_s"] for c in costs.values()) == pytest.approx(4.5)  # none lost


def test_feed_cost_is_cpu_per_kept_frame_served_cold_and_warm():
    """Epochs 0 and 1 serve 1,000 frames each for 2 and 0.5 task CPU-seconds, the actor spent 0.2: cold
    2.1e-3 and warm 6e-4 CPU-seconds a frame; the learners' wait is rank 0's data and cold-epoch wait."""
    epochs = {
        0: {"kept_frames": 1000, "partial_cpu_s": 2.0, "stages": {"decode": 1.5}},
        1: {"kept_frames": 1000, "partial_cpu_s": 0.5, "stages": {"decode": 0.1}},
    }
    report = FeedReport(
        videos={}, flow_method=None, flow_once=False, epochs=epochs, eval={"partial_cpu_s": 0.3},
        totals={"actor_cpu_s": 0.2}, t_max=8, max_sequences=2, reuse=3, restarts=[],
    )  # fmt: skip
    cost = feed_cost(report, SimpleNamespace(data_wait_s=1.0, cold_epoch_s=2.5))
    assert cost["kept_frames"] == 2000 and cost["cpu_s"] == pytest.approx(3.0)
    assert cost["cpu_s_per_kept_frame_cold"] == pytest.approx(2.1e-3)
    assert cost["cpu_s_per_kept_frame_warm"] == pytest.approx(6e-4)
    assert cost["learner_wait_s"] == pytest.approx(3.5) and cost["stages_cpu_s"] == {
        "decode": pytest.approx(1.6)
    }
    one_epoch = FeedReport(**{**report.__dict__, "epochs": {0: epochs[0]}})
    assert (
        feed_cost(one_epoch, SimpleNamespace(data_wait_s=0.0, cold_epoch_s=0.0))["cpu_s_per_kept_frame_warm"]
        is None
    )
