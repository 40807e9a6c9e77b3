"""A round whose answer died with the averager: the steps since stay when it closed with the learner.

Contract pinned: a round sent to an averager that dies on it (``Unreachable``, not silent) is deferred
with ``answer_lost``; the learner trains on, and each try sends that round's work and rows ahead of its
own (``merged_stats``, ``merged_ids``). When a rejoin finds that round averaged with this learner in it
(``JoinReply.took_part``: the averager's record of the round), the learner keeps the steps since on top
of its mean (each parameter += now - the state sent) and sends them as the next round, from inside a
layout or from a round held back at the layout's end: one learner then ends on the plain loop's weights,
each epoch trained once, each video id in one round. A round that closed without it is a realignment as
before: the steps since are dropped and their rows trained again. No Ray.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from averager_fixtures import local_averager
from conftest import InProcess
from test_deferred_rounds import FeedWithIds
from test_held_round import LostReply
from test_learner_loop import _client, _config, _reference

from raytrain_seq.parts import Parts
from raytrain_seq.rounds.lost_answer import merged_ids, merged_stats
from raytrain_seq.rounds.position import EpochPosition
from raytrain_seq.rounds.state import AveragedState, JoinReply
from raytrain_seq.runtime.learner import Learner

KEPT = "closed with it before the averager died: its steps since are kept"


def test_two_flushes_merge_into_one_rounds_work():
    earlier = dict(frames=10.0, sequences=2.0, steps=1.0, compute_s=0.5, data_wait_s=0.1, loss=1.0)
    earlier.update(first_step_wall=100.0, longest_gap_s=0.2, cpu_wait_s=0.05)
    later = dict(frames=30.0, sequences=6.0, steps=3.0, compute_s=1.5, data_wait_s=0.3, loss=2.0)
    later.update(first_step_wall=105.0, longest_gap_s=0.9)
    merged = merged_stats(earlier, later)
    assert {k: merged[k] for k in ("frames", "sequences", "steps")} == dict(
        frames=40.0, sequences=8.0, steps=4.0
    )
    assert merged["compute_s"] == pytest.approx(2.0) and merged["data_wait_s"] == pytest.approx(0.4)
    assert merged["loss"] == pytest.approx((1.0 * 2 + 2.0 * 6) / 8)  # weighted by sequences
    assert merged["first_step_wall"] == 100.0 and merged["longest_gap_s"] == 0.9
    assert merged["cpu_wait_s"] == 0.05  # only the earlier read one
    idle = dict(frames=0.0, sequences=0.0, steps=0.0, compute_s=0.0, data_wait_s=0.0, loss=math.nan)
    none = merged_stats(idle, idle)
    assert math.isnan(none["loss"]) and "first_step_wall" not in none and "cpu_wait_s" not in none
    assert merged_ids({0: [1, 2]}, {0: [3], 1: [7]}) == {0: [1, 2, 3], 1: [7]}


def _run(
    lost: int, back_at: int, took_part: bool = True, shift: float = 0.0
) -> tuple[Learner, LostReply, FeedWithIds]:
    """8 rows an epoch, B=2, K=2, 2 epochs; the averager closes round ``lost`` and dies before its reply,
    and is away until the learner's step ``back_at``; its rejoin then finds round ``lost`` averaged (its
    mean the state sent, + ``shift``), with this learner in it or not (``took_part``)."""
    config = _config(checkpoint_every=50)
    feed = FeedWithIds()
    transport = LostReply(
        feed,
        lost,
        took_part=took_part,
        shift=shift,
        join=[JoinReply(state=AveragedState(batch_size=2), next_round=1, world_size=1)],
        report_validation_share=[True] * 8,
    )
    made: list[Learner] = []

    def away() -> bool:
        return transport.closed is not None and made[0].steps_done < back_at

    learner = Learner(
        Parts.of(config).learner, rank=0, world_size=1, device="cpu", feed=feed, report=lambda m, f: None,
        client=_client(transport, away=away, sleep=lambda s: None),
    )  # fmt: skip
    made.append(learner)
    position = learner.start()
    while not learner.finished(position):
        position = learner.train_epoch(position)
    return learner, transport, feed


def _check_kept(learner: Learner, transport: LostReply, feed: FeedWithIds) -> None:
    """The plain loop's weights, each epoch read once, rounds 1-4 sent once each, every id in one."""
    expected = _reference(_config(checkpoint_every=50), feed)
    got = learner.model.state_dict()
    assert all(torch.allclose(got[k], expected[k], rtol=0, atol=1e-5) for k in expected)
    assert [e for e, _ in feed.epoch_calls] == [0, 1] and learner.steps_done == 8
    sent = [c for c in transport.calls if c[0] == "average"]
    assert [c[1][1] for c in sent] == [1, 2, 3, 4]
    assert [c[2]["stats"]["steps"] for c in sent] == [2, 2, 2, 2]  # the lost round's steps not sent again
    for epoch in (0, 1):
        ids = [int(i) for row in feed.epoch(epoch) for i in row["ids"] if i >= 0]
        counts = sum(c[2]["stats"].get(f"ids_e{epoch}_count", 0) for c in sent)
        sums = sum(c[2]["stats"].get(f"ids_e{epoch}_sum", 0) for c in sent)
        assert (counts, sums) == (len(ids), sum(ids))


def test_a_lost_answer_inside_a_layout_keeps_the_steps_since(caplog):
    """Round 1 (step 2) closes, its answer lost; the averager is back at step 4, the layout's end: the
    rejoin finds round 1 averaged with this learner, so steps 3-4 stay on its mean and go out as round 2
    (before: realigned to round 1's place, rows 4-7 trained again)."""
    with caplog.at_level(logging.WARNING):
        learner, transport, feed = _run(lost=1, back_at=4)
    assert "round 1 " + KEPT in caplog.text
    _check_kept(learner, transport, feed)
    assert learner.lost.pending is None


def test_a_lost_answer_before_a_held_layout_end_keeps_the_steps_since(caplog):
    """Round 1's answer lost, and the averager away past the layout's end (step 4): that round is held
    back and epoch 1 begins. Back at step 6: round 1 is found averaged with this learner, so the held
    round goes out as round 2 from its state on round 1's mean, and steps 5-6 stay on round 2's mean."""
    with caplog.at_level(logging.WARNING):
        learner, transport, feed = _run(lost=1, back_at=6)
    assert "round 1 " + KEPT in caplog.text and "held back" in caplog.text
    _check_kept(learner, transport, feed)
    held = EpochPosition.from_dict([c for c in transport.calls if c[0] == "average"][1][2]["position"])
    assert (held.epoch, held.rows_done) == (0, 8)  # round 2: the layout's end, held


@pytest.mark.parametrize("back_at", [4, 6])
def test_the_steps_kept_go_on_top_of_the_lost_rounds_mean(back_at):
    """The lost round's mean is the state sent + 0.5 (another learner's share): round 2, the layout's
    end (sent once back, or held back and sent from its state), carries the plain loop's weights after
    its 4 steps + 0.5, its buffers the learner's own: the steps since the state sent, on that mean."""
    learner, transport, _ = _run(lost=1, back_at=back_at, shift=0.5)
    round_2 = next(c for c in transport.calls if c[0] == "average" and c[1][1] == 2)
    sent = AveragedState(round=2, flat=round_2[1][3], batch_size=2).materialise(list).params
    plain = _reference(_config(checkpoint_every=50), FeedWithIds(), steps=4)
    parameters = {name for name, _ in learner.model.named_parameters()}
    for name, value in plain.items():
        want = value + 0.5 if name in parameters else value
        assert torch.allclose(sent[name], want, rtol=0, atol=1e-5), name


def test_a_round_that_closed_without_the_learner_drops_the_steps_since(caplog):
    """The same lost answer, but the averager's record of round 1 does not hold this learner: a
    realignment as for any round the others averaged without it; steps 3-4 are dropped, and the learner
    reads epoch 0 again from round 1's place."""
    with caplog.at_level(logging.WARNING):
        learner, transport, feed = _run(lost=1, back_at=4, took_part=False)
    assert KEPT not in caplog.text
    assert [e for e, _ in feed.epoch_calls] == [0, 0, 1]  # rows 4-7 again, then epoch 1
    sent = [c for c in transport.calls if c[0] == "average"]
    assert [c[2]["stats"]["steps"] for c in sent] == [2, 2, 2, 2] and learner.steps_done == 8


def test_the_averager_tells_a_rejoining_learner_whether_it_took_part_in_the_round():
    averager = local_averager(1, timeout_s=30.0, batch_size=2, adaptive_batch=False)
    transport = InProcess(averager)
    try:
        client = _client(transport)
        assert not client.join().took_part  # nothing averaged yet
        client.average({"w": torch.ones(2)}, None, stats={"steps": 1.0}, position=None)
        reply = client.join()
        assert reply.state.round == 1 and reply.took_part
    finally:
        transport.close()
