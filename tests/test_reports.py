"""The reports that cross processes into the summary: what the producers send parses back field by field."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from averager_fixtures import local_averager

from raytrain_seq.reports import AveragingReport, FeedReport, LearnerReport


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


@pytest.mark.parametrize("cls", [LearnerReport])
def test_from_dict_names_the_missing_and_the_unknown_keys(cls):
    names = [f.name for f in dataclasses.fields(cls)]
    partial = {name: None for name in names[1:]} | {"surprise": 1}
    with pytest.raises(ValueError, match=rf"missing \['{names[0]}'\], unknown \['surprise'\]"):
        cls.from_dict(partial)
    with pytest.raises(TypeError, match="takes a dict"):
        cls.from_dict([1, 2])


def test_reports_are_frozen():
    report = FeedReport(**{f.name: None for f in dataclasses.fields(FeedReport)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.t_max = 3
