"""Live groups (issue 53) without a cluster: the round book's live transitions and the averager's lose.

Contracts pinned: in a live book (``RoundBook(live=True)``) a lost learner stops the open round waiting
for it at once and leaves the group at that round's close, which publishes the next group; a newcomer
(or a new process of a member) waits for the next close; old incarnations are refused, survivors are
never asked to rejoin; a book nobody is left to close a round in applies the change at once; a non-live
book keeps today's behaviour (``lose`` refused). The averager's ``lose`` closes the open round, whose
mean is the single-process mean of the present updates and whose position is dealt over the new group;
a newcomer's join returns after that close with the group, the state and its position.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from averager_fixtures import local_averager

from raytrain_seq.algorithms.averaging import average_states
from raytrain_seq.members.errors import MembershipError
from raytrain_seq.rounds.book import RoundBook
from raytrain_seq.rounds.current_round import RoundPhase
from raytrain_seq.rounds.group import place
from raytrain_seq.rounds.position import EpochPosition, settle


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _live_book(world: int = 3, **kwargs) -> RoundBook:
    book = RoundBook(world, timeout_s=5.0, clock=FakeClock(), live=True, **kwargs)
    for slot in range(world):
        assert book.join(slot, world, incarnation=f"p{slot}") == 1
    return book


def _round(book: RoundBook, senders, world: int):
    """Every sender sends the open round; returns the close once the book says it may close."""
    complete = False
    for slot in senders:
        complete = book.arrive(slot, book.round, world, f"payload{slot}", incarnation=f"p{slot}")
    return complete


# ------------------------------------------------------------------------------------------ the book
def test_a_lost_learner_stops_the_open_round_waiting_and_leaves_at_its_close():
    book = _live_book()
    assert not _round(book, [0, 1], 3) and book.current.missing == [2]
    assert book.lose(2, "p2") and book.complete  # no deadline needed
    assert not book.lose(2, "p2") and not book.lose(7)  # idempotent; an unknown slot changes nothing
    closed = book.close()
    assert [slot for slot, _ in closed.present] == [0, 1] and closed.dropped == () and closed.group == (0, 1)
    assert book.world_size == 3  # the group changes when the round finishes, not before
    book.finish()
    assert (book.round, book.world_size, book.live.group, book.live.lost) == (2, 2, (0, 1), {})
    assert book.dropped_log == [] and book.live.changes == 1 and book.generation == 1
    # Survivors send the next round with the new size, as the same processes: nothing asks them to rejoin.
    assert _round(book, [0, 1], 2)
    # The lost process is refused (its incarnation was retired), whatever it sends.
    with pytest.raises(MembershipError, match="replaced by a newer one"):
        book.join(2, 3, incarnation="p2")
    records = [r for r in book.membership_log if r["event"] in ("lose", "group")]
    assert [r["event"] for r in records] == ["group", "lose", "group"] and records[2]["change"]
    records = records[1:]  # the first: the launched group started
    assert "[2] lost" in records[1]["detail"] and "(3 -> 2)" in records[1]["detail"]


def test_a_payload_sent_before_the_loss_stays_averaged_and_a_stale_incarnation_is_a_no_op():
    book = _live_book()
    _round(book, [2, 0], 3)
    assert not book.lose(2, "an-older-process")  # not the known process: already replaced
    assert book.lose(2)
    assert not book.complete and book.current.missing == [1]  # slot 1 is still expected
    with pytest.raises(MembershipError, match="it was lost"):
        book.check(2, 1, 3, incarnation="p2")
    assert _round(book, [1], 3)
    closed = book.close()
    assert [slot for slot, _ in closed.present] == [0, 1, 2] and closed.group == (0, 1)


def test_a_newcomer_waits_for_the_next_close_and_a_new_process_of_a_member_replaces_it():
    book = _live_book()
    assert book.join(5, incarnation="n5") == 2  # queued: enters at the close of round 1
    assert book.live.waiting(5, "n5") and book.world_size == 3 and 5 not in book.current.expected
    _round(book, [0], 3)
    assert 5 not in book.current.expected
    # Slot 1's process restarted before the driver's lose: lose(old) + a newcomer.
    assert book.join(1, 3, incarnation="q1") == 2
    assert book.live.lost == {1: "p1"} and book.live.waiting(1, "q1") and book.current.missing == [2]
    assert _round(book, [2], 3)
    closed = book.close()
    assert closed.group == (0, 1, 2, 5)
    book.join(6, incarnation="n6")  # joins while the round closes: it enters at the next close
    book.finish()
    assert (book.world_size, book.live.group, book.live.admitted) == (4, (0, 1, 2, 5), {1: "q1", 5: "n5"})
    assert book.live.joining == {6: "n6"}
    assert place(book.live.group, 5) == (3, 4)
    assert _round(book, [0, 2], 4) is False  # the newcomers are expected from now on
    book.arrive(1, 2, 4, "new1", incarnation="q1")
    assert book.arrive(5, 2, 4, "p5", incarnation="n5")
    with pytest.raises(MembershipError, match="another process of this learner"):
        book.check(1, 2, 4, incarnation="p1")
    assert book.close().group == (0, 1, 2, 5, 6)


def test_changes_apply_at_once_when_nobody_is_left_to_close_a_round():
    book = _live_book(2)
    assert _round(book, [0, 1], 2)
    book.close()
    book.finish()
    assert book.lose(0) and book.lose(1) and book.live.changes == 0  # pending: no group would be left
    assert book.join(9, incarnation="n9")
    assert book.live.changes == 1 and book.live.group == (9,) and book.world_size == 1
    assert book.current.phase is RoundPhase.IDLE and book.round == 2 and not book.live.pending


def test_a_launched_learner_that_never_joined_is_not_waited_for():
    """While the first group forms (ids are ranks), lose() of a launched slot that never joined lets the
    round close without a deadline, and that close fixes the group without it."""
    book = RoundBook(3, timeout_s=5.0, clock=FakeClock(), live=True)
    for slot in (0, 1):
        book.join(slot, 3, incarnation=f"p{slot}")
    _round(book, [0, 1], 3)
    assert not book.complete and book.quorum == 3
    assert book.lose(2) and book.complete and book.quorum == 2
    assert book.close().group == (0, 1)
    book.finish()
    assert book.world_size == 2 and book.live.ranks([0, 1]) == [0, 1]


@pytest.mark.parametrize("launched_first", [0, 1])
def test_a_newcomer_whose_join_comes_before_the_launched_learners_waits_for_the_first_close(launched_first):
    """The fleet starts its first group with the slots up at the time; a slot up later is a newcomer, and
    its process can be built before theirs. Its join (no world size) neither starts the group nor takes a
    launched learner's place in the forming one: it waits for the first close, which takes it in. (It
    became a member without a rank before: its learner read its shard with world size None.)"""
    book = RoundBook(3, timeout_s=5.0, clock=FakeClock(), live=True)  # the averager's size: max learners
    for slot in range(launched_first):
        assert book.join(slot, 2, incarnation=f"p{slot}") == 1
    assert book.join(2, incarnation="n2") == 2  # queued: enters at the close of round 1
    for slot in range(launched_first, 2):
        assert book.join(slot, 2, incarnation=f"p{slot}") == 1  # the launched group (0, 1) forms
    assert book.generation == 1 and book.world_size == 2 and book.live.waiting(2, "n2")
    assert _round(book, [0, 1], 2)
    assert book.close().group == (0, 1, 2)
    book.finish()
    assert (book.world_size, book.live.group, book.live.admitted) == (3, (0, 1, 2), {2: "n2"})
    assert place(book.live.group, 2) == (2, 3)


def test_a_round_that_fails_keeps_the_changes_pending_and_a_plain_book_refuses_lose():
    book = _live_book(3, min_learners=2)
    _round(book, [0], 3)
    book.lose(1)
    book.lose(2)
    closed = book.close()
    assert closed.error is not None and closed.group is None  # fewer than min_learners: no group
    assert book.live.lost.keys() == {1, 2} and book.world_size == 3
    plain = RoundBook(2, timeout_s=5.0, clock=FakeClock())
    with pytest.raises(RuntimeError, match="live round book"):
        plain.lose(0)


# -------------------------------------------------------------------------------------- the averager
def _params(slot: int) -> dict[str, torch.Tensor]:
    return {"w": torch.arange(4, dtype=torch.float32) * (slot + 1), "b": torch.full((2,), float(slot))}


def test_the_averager_closes_on_lose_with_the_present_mean_and_a_waiting_join_gets_the_new_group():
    """Three slots at rows 2 of 4: slot 2 is lost before sending round 1. lose() closes the round at once
    (timeout 60 s) with the mean of slots 0 and 1, exactly a single-process mean of those two updates;
    the group shrinks to (0, 1) and the position records slot 2's rows as missed, dealt over the two. A
    newcomer's join waits for the next close (round 2) and gets its state, the group and the position."""

    async def scenario():
        averager = local_averager(3, timeout_s=60.0, live=True, batch_size=2, adaptive_batch=False)
        for slot in range(3):
            await averager.join(slot, 3, incarnation=f"p{slot}")

        def send(slot: int, round_: int, world: int, position: EpochPosition) -> asyncio.Future:
            return asyncio.ensure_future(averager.average(
                slot, round_, world, _params(slot), None, weight=1.0 + slot, position=position.as_dict(),
                rows=4 if world == 3 else 5, incarnation=f"p{slot}",
            ))  # fmt: skip

        sends = [send(s, 1, 3, EpochPosition(0, (), 3, 2, steps=1)) for s in (0, 1)]
        await asyncio.sleep(0.05)
        assert not any(f.done() for f in sends)  # everyone waits for slot 2
        assert not await averager.lose(2, "other-process") and await averager.lose(2, "p2")
        first = await asyncio.wait_for(asyncio.gather(*sends), 5)
        newcomer = asyncio.ensure_future(averager.join(7, incarnation="n7"))
        await asyncio.sleep(0.05)
        assert not newcomer.done()  # it waits for round 2's close
        at = EpochPosition.from_dict(first[0].state.position).after(1).with_steps(2)
        sends = [send(s, 2, 2, at) for s in (0, 1)]
        second = await asyncio.wait_for(asyncio.gather(*sends), 5)
        reply = await asyncio.wait_for(newcomer, 5)
        return first[0], second[0], reply, await averager.summary()

    first, second, reply, summary = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert first.group == (0, 1) and first.learners == (0, 1)
    expected = average_states([_params(0), _params(1)], [1.0, 2.0])
    assert all(torch.allclose(first.state.params[k], expected[k]) for k in expected)
    settled = settle(EpochPosition(0, (), 3, 2, steps=1), None, [0, 1], 4)
    assert settled.missed == ((2, 0, 2),)
    dealt = EpochPosition.from_dict(first.state.position)
    # The lost slot's rank is recorded: its blocks come last in the survivors' shards (resplit's gone).
    lost_last = EpochPosition(0, ((3, 2, ((2, 0, 2),), (2,)),), 2, 0, steps=1)
    assert dealt == settled.for_group(2, gone=[2]) == lost_last
    assert second.group == (0, 1, 7) and second.learners == (0, 1)
    assert EpochPosition.from_dict(second.state.position) == EpochPosition(
        0, ((3, 2, ((2, 0, 2),), (2,)), (2, 1)), 3, 0, steps=2
    )  # a newcomer's arrival loses nobody: that entry names no rank
    assert reply.group == (0, 1, 7) and reply.world_size == 3 and reply.next_round == 3
    assert reply.state.round == 2 and reply.state.position == second.state.position
    assert summary.world_size == 3 and summary.dropped == []  # no timeout, no drop


def test_the_averager_answers_a_newcomer_that_joined_before_the_first_group_at_its_first_close():
    """The averager's side of the test above: the newcomer's join, sent before the launched learners',
    returns after round 1's close with the group (0, 1, 2), its rank's place in it and round 1's state."""

    async def scenario():
        averager = local_averager(3, timeout_s=60.0, live=True, batch_size=2, adaptive_batch=False)
        newcomer = asyncio.ensure_future(averager.join(2, incarnation="n2"))
        await asyncio.sleep(0.05)
        for slot in (0, 1):
            await averager.join(slot, 2, incarnation=f"p{slot}")
        assert not newcomer.done()  # it waits for the first group's first close
        sends = [
            averager.average(
                slot, 1, 2, _params(slot), None, weight=1.0, position=EpochPosition(0, (), 2, 2).as_dict(),
                rows=4, incarnation=f"p{slot}",
            )
            for slot in (0, 1)
        ]  # fmt: skip
        first = await asyncio.wait_for(asyncio.gather(*sends), 5)
        return first[0], await asyncio.wait_for(newcomer, 5)

    first, reply = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert first.group == (0, 1, 2) and first.learners == (0, 1)
    assert reply.group == (0, 1, 2) and reply.world_size == 3 and reply.next_round == 2
    assert reply.state.round == 1 and reply.state.position == first.state.position


@pytest.mark.parametrize("steps", [1, 2])
def test_a_newcomer_whose_join_comes_after_the_last_round_is_told_at_once_that_training_ended(steps):
    """A run of two learners and ``steps`` steps, one a round: after round 1's close a newcomer's join
    returns at once with ``ended`` (and no state) when that round was the last (steps=1): no close would
    take it in; when it was not (steps=2), the join waits for the next close as before."""

    async def scenario():
        averager = local_averager(
            2, timeout_s=60.0, live=True, batch_size=2, adaptive_batch=False, epochs=1, steps=steps
        )
        for slot in (0, 1):
            await averager.join(slot, 2, incarnation=f"p{slot}")
        position = EpochPosition(0, (), 2, 2, steps=1).as_dict()
        sends = [
            averager.average(slot, 1, 2, _params(slot), None, weight=1.0, position=position, rows=4,
                             incarnation=f"p{slot}")
            for slot in (0, 1)
        ]  # fmt: skip
        first = await asyncio.wait_for(asyncio.gather(*sends), 5)
        late = asyncio.ensure_future(averager.join(2, incarnation="n2"))
        await asyncio.sleep(0.05)
        reply = late.result() if late.done() else late.cancel()
        return first[0], reply, await averager.summary()

    first, reply, summary = asyncio.run(asyncio.wait_for(scenario(), 20))
    last = EpochPosition.from_dict(first.state.position).ends_training(epochs=1, steps=steps)
    assert last is (steps == 1) and first.group is None
    if steps == 1:
        assert reply.ended and reply.state.empty and reply.group is None and reply.next_round == 2
    else:
        assert reply is True  # still waiting: cancelled
    assert summary.world_size == 2  # nobody was taken in


# ------------------------------------------------------------------------- learners, a loss and a join
class _Lost(Exception):
    """The doomed learner's process dies here."""


class _Dying:
    """A row stream that kills its learner on its ``dies_at``-th take."""

    def __init__(self, stream, dies_at: int) -> None:
        self.stream, self.takes, self.dies_at = stream, 0, dies_at

    @property
    def wait_seconds(self) -> float:
        return self.stream.wait_seconds

    def take(self, n: int):
        self.takes += 1
        if self.takes == self.dies_at:
            raise _Lost("the learner's node was lost")
        return self.stream.take(n)


class _PlanFeed:
    """A feed that serves a real packing plan's layouts (``layout_specs``) as rows carrying their video ids,
    the same plan every epoch; slot ``doomed`` dies at its 3rd take; epochs >= 1 wait for ``gate``."""

    def __init__(self, doomed: int, gate) -> None:
        import numpy as np

        from raytrain_seq.algorithms.packing import pack
        from raytrain_seq.rows.assembly import plan_specs

        rng = np.random.default_rng(5)
        lengths = rng.integers(3, 9, size=40)
        plan = pack(lengths, 12, seed=5)
        ids, labels = (np.arange(40) + 100).tolist(), (np.arange(40) % 4).tolist()
        fresh = rng.random(40) < 0.4
        self.split = lambda w: plan_specs(plan, w, ids, labels, fresh)
        self.plan_ids = [i for spec in self.split(1)[0] for i in spec.ids]
        self.doomed, self.gate = doomed, gate
        self.rows_served: list[tuple] = []

    def model_spec(self):
        from test_learner_loop import Feed

        return Feed().model_spec()

    def eval_rows(self, split, rank=0, world_size=1, *, uncropped=False):
        from test_learner_loop import Feed

        return Feed().eval_rows(split, rank, world_size, uncropped=uncropped)

    def _row(self, spec) -> dict:
        import numpy as np
        from test_learner_loop import SIZE, T_MAX

        rng = np.random.default_rng(abs(hash((spec.plan_index, spec.offsets))) % 2**32)
        frames = np.zeros((T_MAX, SIZE, SIZE, 3), dtype=np.uint8)
        frames[: sum(spec.lengths)] = rng.integers(0, 256, size=(sum(spec.lengths), SIZE, SIZE, 3))
        pad = 4 - len(spec.ids)
        return {
            "frames": frames,
            "starts": np.array([*spec.starts, *[-1] * pad], dtype=np.int64),
            "lengths": np.array([*spec.lengths, *[-1] * pad], dtype=np.int64),
            "labels": np.array([*spec.labels, *[-1] * pad], dtype=np.int64),
            "num_sequences": np.array(len(spec.ids), dtype=np.int64),
            "weight": np.array(spec.weight, dtype=np.float32),
            "block": np.array(spec.plan_index, dtype=np.int64),
            "ids": np.array([*spec.ids, *[-1] * pad], dtype=np.int64),
        }

    def for_slot(self, slot: int):
        feed = self

        class Mine:
            model_spec, eval_rows = feed.model_spec, feed.eval_rows

            def epoch_rows(self, epoch, rank, world_size, *, history=(), skip=0, ahead=True):
                from test_learner_loop import Rows

                from raytrain_seq.rounds.position import layout_specs
                from raytrain_seq.rows.assembly import BlockRowStream

                if epoch >= 1 and not feed.gate.wait(60):
                    raise TimeoutError("the newcomer never queued")
                specs = layout_specs(feed.split, history, world_size)
                rows = [feed._row(spec) for spec in specs[rank][skip:]]
                feed.rows_served.append((slot, epoch, rank, world_size, len(history), skip))
                stream = BlockRowStream(Rows(rows)) if rows else None
                if slot == feed.doomed and stream is not None:
                    stream = _Dying(stream, 3)
                return stream, len(specs[0])

        return Mine()


def test_survivors_train_on_through_a_loss_and_a_newcomer_and_every_row_is_averaged_once():
    """Three learners (slots 0-2) against one live in-process averager; slot 2's process dies in epoch 0
    after its first round and the driver calls lose(); later slot 5 joins as a newcomer. The survivors
    never rejoin and never see a refusal, the group becomes (0, 1) then (0, 1, 5), no round waits for
    a timeout, and over three epochs the averaged rounds hold every video id of the plan exactly once an
    epoch (the averager's accounting against the plan's checksum)."""
    import threading
    import time

    from conftest import InProcess
    from test_learner_loop import _client, _config

    from raytrain_seq.outputs import accounting
    from raytrain_seq.parts import Parts
    from raytrain_seq.runtime.learner import Learner

    class Recording(InProcess):
        def __call__(self, method, *args, timeout=None, **kwargs):
            slot = args[0] if args and method in ("join", "average") else None
            self.log.append((method, slot))
            try:
                return super().__call__(method, *args, timeout=timeout, **kwargs)
            except Exception as exc:
                self.errors.append((method, slot, type(exc).__name__))
                raise

    config = _config(epochs=3, k=1, checkpoint_every=100)
    gate = threading.Event()
    feed = _PlanFeed(doomed=2, gate=gate)
    averager = local_averager(3, timeout_s=120.0, live=True, batch_size=2, adaptive_batch=False)
    transport = Recording(averager)
    transport.log, transport.errors = [], []
    outcome: dict[int, object] = {}

    def learner(slot: int, world: int, incarnation: str) -> Learner:
        client = _client(transport, learner=slot, world_size=world, incarnation=incarnation)
        return Learner(
            Parts.of(config).learner, rank=slot if slot < world else 0, world_size=world, device="cpu",
            client=client, feed=feed.for_slot(slot), report=lambda m, f: None,
            keep_final=lambda m, f: None, validate=False,
        )  # fmt: skip

    def run(slot: int, learner: Learner) -> None:
        try:
            learner.run()
            outcome[slot] = learner
        except BaseException as exc:  # the doomed learner's death, or a failure the test reports
            outcome[slot] = exc

    learners = {slot: learner(slot, 3, f"p{slot}") for slot in range(3)}
    threads = {slot: threading.Thread(target=run, args=(slot, one)) for slot, one in learners.items()}
    try:
        for thread in threads.values():
            thread.start()
        threads[2].join(120)
        assert isinstance(outcome.get(2), _Lost), outcome.get(2)
        assert transport("lose", 2, "p2") is True
        live = averager._book.live
        deadline = time.monotonic() + 60
        while live.changes < 1 and time.monotonic() < deadline:
            time.sleep(0.02)  # the survivors' open round closes on the loss
        assert live.group == (0, 1)
        newcomer = learner(5, 1, "n5")
        threads[5] = threading.Thread(target=run, args=(5, newcomer))
        threads[5].start()
        while 5 not in live.joining and 5 not in live.admitted and time.monotonic() < deadline:
            time.sleep(0.02)  # queued for the next close (which may have taken it in already)
        assert 5 in live.joining or live.admitted == {5: "n5"}
        gate.set()
        for slot in (0, 1, 5):
            threads[slot].join(180)
        summary = transport("summary")
    finally:
        gate.set()
        transport.close()
    assert all(isinstance(outcome[s], Learner) for s in (0, 1, 5)), outcome
    assert live.group == (0, 1, 5) and summary.world_size == 3
    assert [(learners[s].rank, learners[s].world_size) for s in (0, 1)] == [(0, 3), (1, 3)]
    assert (newcomer.rank, newcomer.world_size) == (2, 3)
    # Survivors never rejoined nor were refused; nothing was dropped at a deadline.
    assert [m for m, s in transport.log if m == "join" and s in (0, 1)] == ["join", "join"]
    assert transport.errors == [] and summary.dropped == []
    assert all(learners[s].steps_done == newcomer.steps_done for s in (0, 1))
    # Every video id of the plan reached exactly one averaged round in each epoch.
    want = accounting.checksum(feed.plan_ids)
    assert accounting.per_epoch(summary.learners) == {e: want for e in range(3)}
    # Not vacuous: the survivors re-read their shards in epoch 0 under the new group, and slot 5 trained.
    assert any(s in (0, 1) and e == 0 and w == 2 for s, e, _, w, _, _ in feed.rows_served)
    assert any(s == 5 for s, *_ in feed.rows_served) and summary.learners[5]["rounds"] > 0
    assert summary.learners[2]["rounds"] == 1


# ------------------------------------------------------------------------------- the actor on local ray
RAY_CLUSTER = {"log_to_driver": False}


def test_the_actor_loses_a_learner_and_answers_a_waiting_join_at_the_next_close(ray_cluster):
    """Through Ray: lose() is an actor method that closes the open round at once (timeout 60 s), whose
    result carries the group (0,); a newcomer's join stays pending until the next round closes, then
    answers with the group (0, 4), rank 1 of 2."""
    from raytrain_seq.rounds.settings import AveragerSettings
    from raytrain_seq.runtime.averager import create_averager

    ray = ray_cluster
    actor = create_averager("avg-live", AveragerSettings(world_size=2, timeout_s=60.0, live=True))
    try:
        ray.get([actor.join.remote(slot, 2, incarnation=f"p{slot}") for slot in (0, 1)], timeout=60)
        first = actor.average.remote(0, 1, 2, _params(0), None, incarnation="p0")
        assert ray.get(actor.lose.remote(1, "p1"), timeout=30) is True
        result = ray.get(first, timeout=30)
        assert result.group == (0,) and result.learners == (0,)
        assert ray.get(actor.lose.remote(1, "p1"), timeout=30) is False
        joining = actor.join.remote(4, incarnation="n4")
        ready, _ = ray.wait([joining], timeout=1.0)
        assert not ready  # it waits for round 2's close
        second = ray.get(actor.average.remote(0, 2, 1, _params(0), None, incarnation="p0"), timeout=30)
        reply = ray.get(joining, timeout=30)
        assert second.group == (0, 4) and reply.group == (0, 4) and place(reply.group, 4) == (1, 2)
        assert reply.state.round == 2 and reply.next_round == 3 and reply.world_size == 2
    finally:
        ray.kill(actor)
