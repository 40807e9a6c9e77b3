"""A learner trains on while the averager is away: its round is deferred, not waited for (issue 53).

Contract pinned: ``AveragerClient.average(defer=True)`` of a dead or restarting averager (``Unreachable``,
not silent) returns ``Deferred`` at once, without the retries, and lets go of its channels; a silent
round still fails (it may be in the averager's hands). The learner keeps the round's steps and work
(``Tally.carry``) and sends them at its next K steps, so one learner still ends on the plain loop's
weights. A learner that sent before the others' deferred rounds stops short of them: the averager takes
the furthest position and records the rows between as missed (``settle(short=...)``), which the layout's
end makes up. No Ray.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import threading

import numpy as np
import pytest
import torch
from averager_fixtures import local_averager
from conftest import InProcess
from test_learner_loop import Feed, Scripted, _client, _config, _reference, _state

from raytrain_seq.members.errors import AveragerUnavailableError
from raytrain_seq.parts import Parts
from raytrain_seq.rounds.client import Averaged, Deferred, Unreachable
from raytrain_seq.rounds.position import EpochPosition, settle
from raytrain_seq.rounds.state import JoinReply, RoundResult
from raytrain_seq.rounds.sync import Tally
from raytrain_seq.runtime.learner import Learner


class Ends:
    """A learner's channel ends that only record being let go of."""

    generation = 3

    def __init__(self) -> None:
        self.closed = 0

    def close(self, generation=None) -> None:
        self.closed += 1


def test_an_averager_away_defers_the_round_at_once_and_a_silent_round_still_fails():
    sleeps: list[float] = []
    ends = Ends()
    transport = Scripted(average=[Unreachable("ActorUnavailableError")])
    client = _client(transport, sleep=sleeps.append, channels=ends)
    decision = client.average({"w": torch.ones(1)}, None, stats={}, position=None, defer=True)
    assert decision.round == 1 and client.next_round == 1  # the same round, sent again later
    assert decision.answer_lost  # the call went out: the round may have closed with it (``LostAnswer``)
    assert len(transport.calls) == 1 and sleeps == []  # no retry, no wait
    assert ends.closed == 1  # its shards died with the averager: no write may wait for them
    # While the averager is known to be down (its process died), a round that may be deferred is, with no
    # call (one would fail only after Ray's grace for the death); once it is up, the learner rejoins (the
    # new process knows no learner: a round sent first would be refused) and the round is sent.
    down = [True]
    result = RoundResult(state=_state(1, 1.0), learners=(0,))
    joined = JoinReply(state=_state(0, 1.0), next_round=1, world_size=1)
    transport = Scripted(join=[joined], average=[result])
    client = _client(transport, away=lambda: down[0])
    early = client.average({"w": torch.ones(1)}, None, stats={}, position=None, defer=True)
    assert early == Deferred(1) and not early.answer_lost  # nothing sent
    assert transport.calls == []
    down[0] = False
    decision = client.average({"w": torch.ones(1)}, None, stats={}, position=None, defer=True)
    assert isinstance(decision, Averaged) and [c[0] for c in transport.calls] == ["join", "average"]
    # The next round goes straight out: the rejoin ended the outage.
    transport.replies["average"] = [RoundResult(state=_state(2, 1.0), learners=(0,))]
    decision = client.average({"w": torch.ones(1)}, None, stats={}, position=None, defer=True)
    methods = [call[0] for call in transport.calls]
    assert isinstance(decision, Averaged) and methods == ["join", "average", "average"]
    # Without defer the same failure is retried, as before.
    transport = Scripted(average=[Unreachable("ActorUnavailableError"), result])
    decision = _client(transport, sleep=sleeps.append).average(
        {"w": torch.ones(1)}, None, stats={}, position=None
    )
    assert isinstance(decision, Averaged) and sleeps == [0.1]
    # A silent round is never deferred (nor resent): the averager may hold it.
    transport = Scripted(average=[Unreachable("no answer", silent=True)])
    with pytest.raises(AveragerUnavailableError):
        _client(transport).average({"w": torch.ones(1)}, None, stats={}, position=None, defer=True)


def test_a_round_that_cannot_be_deferred_waits_for_the_averager_without_calling_it_while_it_is_away():
    """At a layout's end the round is never deferred: while the averager is known away no call goes out
    (one would fail only after Ray's grace for the death), the client pauses (``sleep``: the transport's
    ``until_back``), and once it is back the learner rejoins and sends the round."""
    result = RoundResult(state=_state(1, 1.0), learners=(0,))
    joined = JoinReply(state=_state(0, 1.0), next_round=1, world_size=1)
    transport = Scripted(join=[joined], average=[result])
    down, sleeps = [True], []

    def pause(seconds: float) -> None:
        sleeps.append(seconds)
        down[0] = len(sleeps) < 3  # back during the third pause

    client = _client(transport, away=lambda: down[0], sleep=pause)
    decision = client.average({"w": torch.ones(1)}, None, stats={}, position=None)
    assert isinstance(decision, Averaged) and [c[0] for c in transport.calls] == ["join", "average"]
    assert sleeps == [0.1, 0.2, 0.4]


def test_a_carried_flush_goes_out_with_the_next_one():
    """``Tally.carry`` undoes a flush: the next flush holds both rounds' work, the totals count it once."""
    waited = {"tally": 0.0, "whole": 0.0}  # each one's run queue: 0.25 s more at every reading

    def run_queue(name):
        waited[name] += 0.25
        return waited[name]

    tally, whole = Tally(run_queue=lambda: run_queue("tally")), Tally(run_queue=lambda: run_queue("whole"))
    for t in (tally, whole):
        t.add_step(frames=10, sequences=2, seconds=0.5, loss=1.0)
    first = tally.flush()
    tally.carry(first)
    for t in (tally, whole):
        t.add_step(frames=6, sequences=1, seconds=0.25, loss=4.0)
    got, want = tally.flush(), whole.flush()
    assert got.pop("first_step_wall") == first["first_step_wall"]  # the deferred round's first step
    want.pop("first_step_wall")
    assert got.pop("longest_gap_s") >= first["longest_gap_s"] and want.pop("longest_gap_s") >= 0.0
    # The deferred round's wait for a CPU goes out with the next: two readings' worth against one.
    assert (got.pop("cpu_wait_s"), want.pop("cpu_wait_s")) == (0.5, 0.25)
    assert got == want and got["steps"] == 2.0 and got["loss"] == pytest.approx(2.0)
    assert tally.totals.pop("cpu_wait_s") == 0.5 and whole.totals.pop("cpu_wait_s") == 0.25
    assert tally.totals == whole.totals


def test_the_wait_for_a_cpu_is_the_training_threads_run_queue_time_between_flushes():
    """``cpu_wait_s``: the difference of the thread's run-queue readings from the first step (or the last
    flush) to this flush, on one thread; none where the kernel gives no reading; a drop forgets it."""
    reading = [1.0]
    tally = Tally(run_queue=lambda: reading[0])
    assert "cpu_wait_s" not in tally.flush()  # no reading before it: this one starts the count
    tally.add_step(frames=1, sequences=1, seconds=0.1, loss=1.0)
    reading[0] = 1.75
    assert tally.flush()["cpu_wait_s"] == 0.75
    reading[0] = 2.0
    tally.add_step(frames=1, sequences=1, seconds=0.1, loss=1.0)
    reading[0] = 2.5
    assert tally.flush()["cpu_wait_s"] == 0.75  # from the last flush's 1.75: the round's wait included
    reading[0] = 4.0
    tally.drop()  # the steps after a held round, dropped: their wait too
    reading[0] = 4.5
    assert tally.flush()["cpu_wait_s"] == 0.5 and tally.totals["cpu_wait_s"] == 2.0
    # A reading on another thread is no difference of this thread's: it restarts the count.
    other = threading.Thread(target=tally.flush)
    other.start()
    other.join()
    reading[0] = 9.0
    assert "cpu_wait_s" not in tally.flush()
    reading[0] = 9.5
    assert tally.flush()["cpu_wait_s"] == 0.5
    # A kernel without /proc/thread-self/schedstat: no figure rather than a 0, and the file is asked for
    # at the first step and once a round, never at every step.
    asked = []
    blind = Tally(run_queue=lambda: asked.append(1))
    for _ in range(5):
        blind.add_step(frames=1, sequences=1, seconds=0.1, loss=1.0)
    assert "cpu_wait_s" not in blind.flush() and "cpu_wait_s" not in blind.totals
    assert len(asked) == 2


def test_run_queue_wait_reads_the_second_schedstat_field(tmp_path):
    """``run_queue_wait_s``: schedstat's run-queue nanoseconds in seconds; None for a missing file; an
    unreadable format is an error naming the file. On this Linux box the real file answers."""
    from raytrain_seq.training.run_queue import run_queue_wait_s

    stat = tmp_path / "schedstat"
    stat.write_text("123456789 2500000000 42\n")
    assert run_queue_wait_s(stat) == 2.5
    assert run_queue_wait_s(tmp_path / "absent") is None
    stat.write_text("123\n")
    with pytest.raises(ValueError, match="schedstat"):
        run_queue_wait_s(stat)
    if sys.platform == "linux":
        assert run_queue_wait_s() >= 0.0


def test_the_longest_gap_between_steps_counts_a_rounds_wait_in_the_next_round():
    """``longest_gap_s``: the longest time from one step's end to the next since the last flush; the wait
    for a round (between a flush and the next step) shows in the next flush, and a carried flush keeps its
    gap."""
    now = [0.0]
    tally = Tally(clock=lambda: now[0])
    for t in (0.0, 1.0, 5.0):  # gaps of 1 and 4 s
        now[0] = t
        tally.add_step(frames=1, sequences=1, seconds=0.1, loss=1.0)
    first = tally.flush()
    assert first["longest_gap_s"] == 4.0 and first["first_step_wall"] == 0.0
    now[0] = 12.0  # 7 s waiting on the round, then a step
    tally.add_step(frames=1, sequences=1, seconds=0.1, loss=1.0)
    second = tally.flush()
    assert second["longest_gap_s"] == 7.0 and second["first_step_wall"] == 12.0
    assert "longest_gap_s" not in Tally().flush()  # no step: no gap to tell
    tally.carry(second)  # deferred: the next flush holds its gap, unless a longer one came since
    now[0] = 13.0
    tally.add_step(frames=1, sequences=1, seconds=0.1, loss=1.0)
    assert tally.flush()["longest_gap_s"] == 7.0


def test_settle_records_the_rows_a_present_rank_stopped_short_of():
    """Rank 1 sent at row 4 of a round sent at row 6 (the others' deferred rounds held more rows): its
    rows 4-6 are missed, and the layout's end makes them up."""
    previous = EpochPosition(0, (), 2, 2, steps=1)
    mid = settle(EpochPosition(0, (), 2, 6, steps=3), previous, [0, 1], shard_rows=8, short={1: 4})
    assert mid.missed == ((1, 4, 6),)
    assert settle(EpochPosition(0, (), 2, 6, steps=3), previous, [0, 1], shard_rows=8).missed == ()


def test_the_averager_takes_the_furthest_position_and_records_the_short_rows():
    """Learner 1 deferred its round (more steps) while learner 0 had sent: the round's position is
    learner 1's, and learner 0's rows between are missed."""
    short, ahead, missed = (
        EpochPosition(0, (), 2, 2, steps=1),
        EpochPosition(0, (), 2, 4, steps=2),
        ((0, 2, 4),),
    )

    async def scenario():
        averager = local_averager(2, timeout_s=5.0, batch_size=2, adaptive_batch=False)
        for rank in range(2):
            await averager.join(rank, 2, incarnation=f"p{rank}")
        sends = [
            averager.average(
                rank, 1, 2, {"w": torch.full((2,), float(rank))}, None, position=p.as_dict(), rows=8
            )
            for rank, p in ((0, short), (1, ahead))
        ]
        return (await asyncio.gather(*sends))[0]

    result = asyncio.run(asyncio.wait_for(scenario(), 20))
    position = EpochPosition.from_dict(result.state.position)
    assert position == dataclasses.replace(ahead, missed=missed)
    assert result.learners == (0, 1) and not result.dropped  # both averaged, nobody dropped


class Away:
    """The in-process averager, away for this learner's first ``calls`` ``average`` calls (a restart)."""

    def __init__(self, inner: InProcess, calls: int) -> None:
        self.inner, self.left = inner, calls

    def __call__(self, method, *args, timeout=None, **kwargs):
        if method == "average" and self.left:
            self.left -= 1
            raise Unreachable("ActorUnavailableError: The actor is restarting")
        return self.inner(method, *args, timeout=timeout, **kwargs)


class FeedWithIds(Feed):
    """``Feed`` whose rows name their sequences' videos (epoch * 1000 + row * 10 + slot; -1: padding)."""

    def epoch(self, epoch: int) -> list[dict[str, np.ndarray]]:
        rows = super().epoch(epoch)
        for i, row in enumerate(rows):
            real = row["lengths"] >= 0
            row["ids"] = np.where(real, epoch * 1000 + i * 10 + np.arange(real.size), -1).astype(np.int64)
        return rows


@pytest.mark.parametrize(
    ("away", "rounds", "served"),
    [
        (1, [4, 2, 2], [0]),  # round 1 (step 2) deferred: sent at step 4, the epoch's end
        # Steps 2 and 4 deferred, and the layout's end, which closes on epoch 1, held back
        # (tests/test_held_round.py): sent from its state at step 6, after epoch 1 began.
        (3, [4, 2, 2], [0, 1]),
    ],
)
def test_a_learner_trains_on_through_deferred_rounds_and_ends_on_the_plain_loops_weights(
    away, rounds, served
):
    """8 rows an epoch, B=2, K=2, 2 epochs: the averager is away for the first ``away`` tries and the
    learner steps on. One learner's averaging is the identity, so it must end on the plain loop's
    weights (no step skipped or repeated), every step and every video id of each epoch reaching a round
    once. ``served``: the epochs the feed had begun when the first round went out."""
    config = _config()
    feed = FeedWithIds()
    averager = local_averager(1, timeout_s=30.0, validate_every=1, batch_size=2, adaptive_batch=False)
    inner = InProcess(averager)
    sent: list[float] = []
    began: list[list[int]] = []

    def count_steps(method, *args, timeout=None, **kwargs):
        if method == "average":
            sent.append(kwargs["stats"]["steps"])
            began.append([epoch for epoch, _ in feed.epoch_calls])
        return inner(method, *args, timeout=timeout, **kwargs)

    try:
        learner = Learner(
            Parts.of(config).learner, rank=0, world_size=1, device="cpu",
            client=_client(Away(count_steps, away)), feed=feed, report=lambda metrics, folder: None,
        )  # fmt: skip
        learner.run()
    finally:
        inner.close()
    expected = _reference(config, feed)
    got = learner.model.state_dict()
    assert all(torch.allclose(got[k], expected[k], rtol=0, atol=1e-6) for k in expected)
    assert sent == rounds and learner.steps_done == 8  # the rounds the averager took, in steps
    assert began[0] == served
    totals = averager._history.summary()["learners"][0]
    for epoch in (0, 1):
        ids = [int(i) for row in feed.epoch(epoch) for i in row["ids"] if i >= 0]
        assert totals[f"ids_e{epoch}_count"] == len(ids) and totals[f"ids_e{epoch}_sum"] == sum(ids)


def test_a_round_of_uneven_steps_keeps_the_furthest_adam_step():
    """The learner short of the others' deferred rounds took fewer Adam steps: the merge keeps the
    furthest's count (both paths), and without ``furthest_step`` a mismatch still fails loudly."""
    from raytrain_seq.algorithms.averaging import merge_adam_states
    from raytrain_seq.dataplane.extras import OptimizerExtras, merge_extras

    def entry(step: float) -> dict:
        return {0: {"step": torch.tensor(step), "exp_avg": torch.ones(2), "exp_avg_sq": torch.ones(2)}}

    merged = merge_adam_states([entry(84.0), entry(96.0)], furthest_step=True)
    assert merged[0]["step"].item() == 96.0
    with pytest.raises(ValueError, match="step differs"):
        merge_adam_states([entry(84.0), entry(96.0)])
    extras = [{"optimizer": OptimizerExtras.of({0: {"step": torch.tensor(n)}})} for n in (84.0, 96.0)]
    assert merge_extras(extras, furthest_step=True) is extras[1]
    with pytest.raises(ValueError, match="step differs"):
        merge_extras(extras)


def test_a_round_deferred_while_the_averager_is_down_puts_nothing():
    """Known down (``away``): the round is deferred before its slices are put in the store (a model's and
    its moments' bytes, each try), and the steps stay counted."""
    from raytrain_seq.dataplane.stores import InProcessStore
    from raytrain_seq.rounds.sync import LocalRounds

    class CountingStore(InProcessStore):
        puts = 0

        def put(self, value):
            CountingStore.puts += 1
            return super().put(value)

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    client = _client(Scripted(), away=lambda: True, store=CountingStore())
    rounds = LocalRounds(client, model, optimizer, k=2)
    rounds.step(), rounds.step()
    position = EpochPosition(0, (), 1, 2, steps=2)
    rounds.last_seconds = 99.0  # what a previous round took
    assert rounds.sync(stats={}, position=position, defer=True) == Deferred(1)
    assert CountingStore.puts == 0 and rounds.local_steps == 2 and rounds.pending
    assert rounds.last_seconds < 99.0  # this try's own time: the learner adds it to its averaging time
