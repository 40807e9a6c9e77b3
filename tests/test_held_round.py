"""A layout's last round held back while the averager is away: the learner trains the next epoch on.

Contract pinned: at a layout's end where training goes on, a round the averager cannot take is held
(``LocalRounds.hold``: a host copy of the state it sends) and the learner starts the layout it closes on
as far as it knows (the next epoch, or a make-up of rows it knows missed) at once instead of waiting;
once the averager is back the held round goes out from the held state (``restore``), and the steps since
are kept on top of its mean (``keep_steps``: each parameter += now - held; buffers and moments the
learner's own) when the layout closed there, else dropped (the learner goes on from where it closed;
their work and rows reach no round). A held round whose reply was lost (closed, then the averager died)
is found averaged at the rejoin: its steps since are kept the same way.
One learner's averaging is the identity, so with the steps kept it ends on the plain loop's weights.
A checkpoint due while the averager is away is skipped (but the final one): rank 0 trains on. No Ray.
"""

from __future__ import annotations

import logging

import pytest
import torch
from test_learner_loop import Feed, Scripted, _client, _config, _reference

from raytrain_seq.members.errors import AveragerUnavailableError, StaleRoundError
from raytrain_seq.parts import Parts
from raytrain_seq.rounds.client import Unreachable
from raytrain_seq.rounds.position import EpochPosition
from raytrain_seq.rounds.state import AveragedState, JoinReply, RoundResult
from raytrain_seq.rounds.sync import LocalRounds
from raytrain_seq.runtime.learner import Learner


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 3, generator=generator)).pow(2).mean().backward()
        optimizer.step()


def test_keep_steps_puts_the_steps_since_the_hold_on_top_of_the_mean():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    rounds = LocalRounds(_client(Scripted()), model, optimizer, k=2)
    _train(model, optimizer, 2, seed=0)
    held = rounds.hold()
    _train(model, optimizer, 3, seed=1)
    now = rounds.hold()
    assert not torch.equal(now[0]["0.weight"], held[0]["0.weight"])  # the steps moved the weights
    rounds.restore(held)  # what the held round sends
    live = model.state_dict()
    assert all(torch.equal(live[k], held[0][k]) for k in live)
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], held[1][0]["exp_avg"])
    mean = {k: (v + 1.0 if v.is_floating_point() else v) for k, v in live.items()}  # what came back
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(mean[k])
    rounds.keep_steps(now, held)
    live, moments = model.state_dict(), optimizer.state_dict()["state"]
    for name, _ in model.named_parameters():
        want = mean[name] + (now[0][name] - held[0][name])
        assert torch.allclose(live[name], want, rtol=0, atol=1e-6)
    buffers = [name for name, _ in model.named_buffers()]
    assert buffers and all(torch.equal(live[name], now[0][name]) for name in buffers)  # its own
    assert all(torch.equal(moments[i]["exp_avg_sq"], now[1][i]["exp_avg_sq"]) for i in moments)
    assert (
        held[0]["0.weight"].device.type == "cpu"
        and held[0]["0.weight"].data_ptr() != live["0.weight"].data_ptr()
    )


class Echo(Scripted):
    """One learner's averager, its mean the learner's own state (the flat payload echoed), its position
    ``closes_on(sent)``; each ``average`` call's stats, position and the feed's epochs served then."""

    def __init__(self, feed: Feed, closes_on, **replies) -> None:
        super().__init__(**replies)
        self.feed, self.closes_on, self.rounds = feed, closes_on, []

    def __call__(self, method, *args, timeout=None, **kwargs):
        if method != "average":
            return super().__call__(method, *args, timeout=timeout, **kwargs)
        self.calls.append((method, args, kwargs))
        sent = kwargs["position"]
        self.rounds.append((kwargs["stats"]["steps"], sent, [e for e, _ in self.feed.epoch_calls]))
        state = AveragedState(round=args[1], flat=args[3], batch_size=2, position=self.closes_on(sent))
        return RoundResult(state=state, learners=(0,))


def _closed(sent: dict) -> dict:
    """The averager's settle for one learner with nothing missed: a layout's end starts the next epoch."""
    position = EpochPosition.from_dict(sent)
    return (position.close_layout() if position.rows_done >= Feed.ROWS else position).as_dict()


def _learner(config, feed, transport, away_at: tuple[int, ...]) -> Learner:
    """A learner whose averager is away while its step count is in ``away_at``."""
    made: list[Learner] = []

    def away() -> bool:
        return bool(made) and made[0].steps_done in away_at

    client = _client(transport, away=away, sleep=lambda s: None)
    made.append(
        Learner(
            Parts.of(config).learner,
            rank=0,
            world_size=1,
            device="cpu",
            feed=feed,
            client=client,
            report=lambda m, f: None,
        )
    )
    return made[0]


def _joins() -> list[JoinReply]:
    """The first join, and the rejoin once the averager is back (before round 2)."""
    return [JoinReply(state=AveragedState(batch_size=2), next_round=n, world_size=1) for n in (1, 2)]


def test_a_held_round_goes_out_once_back_and_the_steps_since_stay():
    """8 rows an epoch, B=2, K=2, 2 epochs. The averager is away from the round at step 4 (the layout's
    end) to step 6: the learner starts epoch 1 before the held round goes out (steps 3-4, the layout's
    end, from their state), and ends on the plain loop's weights: no step skipped or repeated."""
    config = _config(checkpoint_every=50)
    feed = Feed()
    transport = Echo(feed, _closed, join=_joins(), report_validation_share=[True] * 8)
    learner = _learner(config, feed, transport, away_at=(4, 5))
    position = learner.train_epoch(learner.start())
    assert position == EpochPosition(1, steps=4)  # held back: epoch 1 starts now
    assert learner.train_epoch(position) == EpochPosition(2, steps=8)
    expected = _reference(config, feed)
    got = learner.model.state_dict()
    assert all(torch.allclose(got[k], expected[k], rtol=0, atol=1e-5) for k in expected)
    steps = [s for s, _, _ in transport.rounds]
    positions = [EpochPosition.from_dict(p) for _, p, _ in transport.rounds]
    assert steps == [2, 2, 2, 2] and learner.steps_done == 8
    held = positions[1]
    assert (held.epoch, held.rows_done, held.steps) == (0, 8, 4)  # the layout's end, sent from its state
    assert 1 in transport.rounds[1][2]  # ... after epoch 1 had begun: nobody waited at the layout's end
    assert [(p.epoch, p.rows_done) for p in positions[2:]] == [(1, 4), (1, 8)]
    # Epoch 1 was opened past the held round: no epoch read ahead of it (the feed keeps epoch 0).
    assert feed.not_ahead == [1]


def test_a_held_round_that_closes_elsewhere_drops_the_steps_since():
    """The held round's layout closes on a make-up layout (rows the averager saw missed): the learner
    goes on from there, from the round's mean; the steps it took into epoch 1 reach no round."""
    config = _config(checkpoint_every=50)
    feed = Feed()
    make_up = EpochPosition(0, ((1, 8, ((0, 0, 2),)),), 1, 0, steps=4)

    def closes_on(sent: dict) -> dict:
        at = EpochPosition.from_dict(sent)
        return make_up.as_dict() if at.rows_done == Feed.ROWS else sent

    transport = Echo(feed, closes_on, join=_joins(), report_validation_share=[True] * 4)
    learner = _learner(config, feed, transport, away_at=(4, 5))
    crossed = learner.train_epoch(learner.start())
    assert crossed == EpochPosition(1, steps=4)
    moved = learner.train_epoch(crossed)
    assert moved == make_up and learner.steps_done == 4  # the round's count, not this learner's
    assert learner.tally.steps == 0  # the dropped steps' work is in no round
    assert feed.not_ahead == [1]  # epoch 1 on a guess; the make-up of epoch 0 not
    assert [s for s, _, _ in transport.rounds] == [2, 2]
    expected = _reference(config, feed, steps=4)  # the held state: epoch 0's four steps
    got = learner.model.state_dict()
    assert all(torch.allclose(got[k], expected[k], rtol=0, atol=1e-5) for k in expected)


def test_a_checkpoint_due_while_the_averager_is_away_is_skipped_and_rank_0_trains_on(caplog):
    """Round 2 (a checkpoint round, not the final one) is averaged, then the averager dies before rank 0
    asks for its part of the checkpoint: rank 0 reports the round without a checkpoint and goes on, no
    retry. An averager known down is not even called; the final checkpoint still waits (``wait``)."""
    config = _config(checkpoint_every=2)
    feed = Feed()
    transport = Echo(
        feed, _closed, join=_joins()[:1], checkpoint_contents=[Unreachable("ActorUnavailableError")],
        report_validation_share=[True] * 4,
    )  # fmt: skip
    reports: list[tuple[int, object]] = []
    learner = Learner(
        Parts.of(config).learner, rank=0, world_size=1, device="cpu", feed=feed,
        client=_client(transport, sleep=lambda s: None),
        report=lambda metrics, folder: reports.append((metrics.round, folder)),
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        assert learner.train_epoch(learner.start()) == EpochPosition(1, steps=4)
    assert reports == [(2, None)] and "checkpoint of round 2 is skipped" in caplog.text
    assert [c[0] for c in transport.calls].count("checkpoint_contents") == 1  # tried once, not retried
    down = _client(Scripted(), away=lambda: True)
    assert down.checkpoint_contents(2, wait=False) is None  # known down: no call
    with pytest.raises(AveragerUnavailableError):  # the final one waits, and fails only past the budget
        _client(Scripted(checkpoint_contents=[Unreachable("x")] * 50)).checkpoint_contents(2)


def test_a_layout_with_rows_known_missed_is_held_back_into_its_make_up_layout():
    """A learner that resumed inside a layout with rows missed (rank 0's rows 0-2) closes it, as far as it
    knows, on a make-up layout (``close_layout``): with the averager away there, it trains on into that
    make-up, and keeps the steps once the held round closes on it."""
    config = _config(checkpoint_every=50)
    feed = Feed()
    resumed = EpochPosition(0, (), 1, 4, steps=2, missed=((0, 0, 2),))
    state = AveragedState(batch_size=2, position=resumed.as_dict())
    joins = [JoinReply(state=state, next_round=1, world_size=1) for _ in range(2)]
    transport = Echo(feed, _closed, join=joins, report_validation_share=[True] * 4)
    learner = _learner(config, feed, transport, away_at=(4, 5))
    make_up = learner.train_epoch(learner.start())
    assert make_up == resumed.after(8).with_steps(4).close_layout()  # held back, not waited
    assert make_up.history == ((1, 8, ((0, 0, 2),)),) and transport.rounds == []
    learner.train_epoch(make_up)
    held = EpochPosition.from_dict(transport.rounds[0][1])
    assert (held.epoch, held.rows_done, held.missed) == (0, 8, ((0, 0, 2),))
    assert learner.steps_done == 8 and learner.tally.steps == 0  # kept, and sent since


class LostReply(Echo):
    """The averager closes round ``lost`` and dies before its reply: the call fails (not silently, so
    the learner defers it), and the rejoin after finds that round averaged, its mean the state sent (one
    learner's mean is its own state), its float tensors + ``shift`` (another learner's share), with this
    learner in it (``took_part``) or not."""

    def __init__(self, feed: Feed, lost: int, took_part: bool = True, shift: float = 0.0, **replies) -> None:
        super().__init__(feed, _closed, **replies)
        self.lost, self.closed, self.took_part, self.shift = lost, None, took_part, shift
        self.refused: list[int] = []

    def __call__(self, method, *args, timeout=None, **kwargs):
        if method == "average" and args[1] == self.lost and self.closed is None:
            self.calls.append((method, args, kwargs))
            self.closed = AveragedState(
                round=self.lost, flat=args[3], batch_size=2, position=_closed(kwargs["position"])
            )
            if self.shift:  # the others' share: the mean is not the state sent
                plain = self.closed.materialise(list)  # the in-process store's refs are the arrays
                shifted = {k: v + self.shift if v.is_floating_point() else v for k, v in plain.params.items()}
                self.closed = plain.replace(params=shifted)
            raise Unreachable("ActorDiedError: the actor died after the round closed")
        if method == "average" and self.closed is not None and args[1] <= self.lost:
            # A round it closed, sent again by a learner that did not rejoin first: refused (it rejoins).
            self.refused.append(args[1])
            raise StaleRoundError(args[0], args[1], self.lost + 1, "closed before the restart")
        if method == "join" and self.closed is not None:
            self.calls.append((method, args, kwargs))
            return JoinReply(
                state=self.closed, next_round=self.lost + 1, world_size=1, took_part=self.took_part
            )
        return super().__call__(method, *args, timeout=timeout, **kwargs)


def test_a_held_round_whose_reply_was_lost_keeps_the_steps_since_on_its_mean():
    """Round 2 (epoch 0's end) is averaged but its reply never comes (the averager died right after):
    the learner holds it and trains epoch 1 on; back (step 6), its rejoin finds round 2 averaged
    (another learner re-seeded it), whose mean holds what this learner sent: it keeps its steps on that
    mean, as for an answer, and does not train epoch 1 again (before: realigned, its steps dropped)."""
    config = _config(checkpoint_every=50)
    feed = Feed()
    transport = LostReply(feed, 2, join=_joins()[:1], report_validation_share=[True] * 8)
    made: list[Learner] = []

    def away() -> bool:  # from the lost reply to step 6
        return transport.closed is not None and made[0].steps_done < 6

    learner = Learner(
        Parts.of(config).learner, rank=0, world_size=1, device="cpu", feed=feed, report=lambda m, f: None,
        client=_client(transport, away=away, sleep=lambda s: None),
    )  # fmt: skip
    made.append(learner)
    crossed = learner.train_epoch(learner.start())
    assert crossed == EpochPosition(1, steps=4)  # held back: epoch 1 starts now
    assert learner.train_epoch(crossed) == EpochPosition(2, steps=8)
    assert [e for e, _ in feed.epoch_calls] == [0, 1]  # epoch 1 trained once
    # Round 2 sent once (its reply lost), not again: the rejoin found it; rounds 3 and 4 after.
    assert [c[1][1] for c in transport.calls if c[0] == "average"] == [1, 2, 3, 4]
    assert [c[0] for c in transport.calls].count("join") == 2
    expected = _reference(config, feed)
    got = learner.model.state_dict()
    assert all(torch.allclose(got[k], expected[k], rtol=0, atol=1e-5) for k in expected)
    assert learner.steps_done == 8
