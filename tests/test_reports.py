"""The reports that cross processes into the summary: the producers return them typed and frozen."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from averager_fixtures import local_averager

from raytrain_seq.outputs.reports import AveragingReport, FeedReport, LearnerReport, RoundMetrics


async def _one_round_summary() -> AveragingReport:
    averager = local_averager(2, timeout_s=30.0, batch_size=4)
    for rank in (0, 1):
        await averager.join(rank, 2, incarnation=f"a{rank}")
    await asyncio.gather(
        *(
            averager.average(rank, 1, 2, {"w": torch.full((2,), float(rank))}, None, {"frames": 3.0})
            for rank in (0, 1)
        )
    )
    return await averager.summary()


def test_the_averagers_summary_is_an_averaging_report():
    report = asyncio.run(asyncio.wait_for(_one_round_summary(), 20))
    assert type(report) is AveragingReport
    assert report.rounds_completed == 1 and report.world_size == 2 and report.test is None
    assert report.learners[0]["frames"] == 3.0 and report.next_round == 2
    assert report.validator_error is None  # set only when the evaluator failed
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.world_size = 3


def test_round_metrics_are_what_ray_train_got_before():
    """``ray.train.report`` takes a dict: the round metrics give the three keys in their old order."""
    metrics = RoundMetrics(round=4, epoch=1, batch_size=8)
    assert list(metrics.to_dict().items()) == [("round", 4), ("epoch", 1), ("batch_size", 8)]


def test_learner_report_refuses_a_missing_or_an_unknown_field():
    fields = {f.name: None for f in dataclasses.fields(LearnerReport)}
    with pytest.raises(TypeError, match="surprise"):
        LearnerReport(**fields, surprise=1)
    del fields["round"]
    with pytest.raises(TypeError, match="round"):
        LearnerReport(**fields)


def test_reports_are_frozen():
    report = FeedReport(**{f.name: None for f in dataclasses.fields(FeedReport)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.t_max = 3
