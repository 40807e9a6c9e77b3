"""The averager's parts, without Ray: the test pass (``rounds.test_pass``), the channel session (``dataplane.channel_session``), the hub load
(``dataplane.hub_load``), the round merge (``rounds.merging``), the arrival checks (``rounds.arrivals``),
the group recovery (``rounds.recovery``), the open round's wait (``rounds.round_wait``), the shard placement (``dataplane.placement``) and the run folder
(``rounds.run_folder``), each built with fakes through its constructor."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch
from conftest import adam_learners
from test_payload import same

from raytrain_seq import checkpoint
from raytrain_seq.algorithms.averaging import average_states, merge_adam_states
from raytrain_seq.dataplane.channel_session import ChannelSession
from raytrain_seq.dataplane.generations import ChannelBook, Channelled, Link
from raytrain_seq.dataplane.hub_load import HubLoad, tensor_bytes
from raytrain_seq.dataplane.merge import ShardMerge
from raytrain_seq.dataplane.payload import FlatLayout, FlatPayload
from raytrain_seq.dataplane.placement import ShardPlacement
from raytrain_seq.dataplane.stores import InProcessShards, InProcessStore
from raytrain_seq.members.errors import StaleRoundError
from raytrain_seq.rounds.arrivals import Arrivals
from raytrain_seq.rounds.batch_rule import BatchRule
from raytrain_seq.rounds.book import RoundBook
from raytrain_seq.rounds.events import EVENTS_FILE, RunHistory
from raytrain_seq.rounds.held_state import HeldState
from raytrain_seq.rounds.merging import RoundMerge
from raytrain_seq.rounds.recovery import GroupRecovery
from raytrain_seq.rounds.round_wait import FIRST_PROBE_S, RoundWait
from raytrain_seq.rounds.run_folder import RunFolder
from raytrain_seq.rounds.settings import AveragerSettings
from raytrain_seq.rounds.state import AveragedState, check_payload
from raytrain_seq.rounds.test_pass import TestPass
from raytrain_seq.rounds.validation import ValidationMachine


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def _test_tallies(correct: int, sequences: int) -> dict:
    return {"correct": correct, "sequences": sequences, "per_class": {"0": [correct, sequences]}}


# ------------------------------------------------------------------------------------------- test pass
def test_a_test_pass_answers_every_learner_with_the_sum_once_all_are_in():
    async def both():
        tests = TestPass(timeout_s=5.0)
        first = asyncio.ensure_future(tests.report(0, _test_tallies(1, 2), 2))
        await asyncio.sleep(0.01)
        assert not first.done() and not tests.tested.is_set()  # waits for the other learner
        second = await tests.report(1, _test_tallies(2, 2), 2)
        return await first, second, tests

    first, second, tests = _run(both())
    assert first == second and first.correct == 3 and first.sequences == 4 and first.learners == 2
    assert tests.tested.is_set() and tests.totals() == first


def test_a_test_pass_sums_those_in_after_the_timeout_and_a_new_pass_starts_over():
    async def short():
        tests = TestPass(timeout_s=0.05)
        assert tests.totals() is None
        alone = await tests.report(0, _test_tallies(1, 2), 2)  # the other never reports
        over = tests.tested.is_set()
        again = await tests.report(0, _test_tallies(2, 2), 1)  # learner 0 again, in a group of one
        return alone, over, again, tests

    alone, over, again, tests = _run(short())
    assert alone.learners == 1 and alone.correct == 1 and not over  # summed without the other
    assert again.correct == 2 and again.learners == 1 and tests.tested.is_set()  # its share replaced
    with pytest.raises(ValueError, match="sequences"):
        _run(TestPass(1.0).report(0, {"correct": 1}, 1))


# ------------------------------------------------------------------------------------------- hub load
def test_hub_load_counts_the_tensor_path_and_the_control_actors_own_reads():
    class Sent:
        def __init__(self) -> None:
            self.params, self.optimizer_state = {"w": torch.zeros(4)}, None  # 16 bytes

    load = HubLoad()
    load.record(1, [], in_process=([Sent(), Sent()], {"w": torch.zeros(4)}, None))
    load.record(2, [{"shard": 0, "received": 5, "sent": 6, "seconds": 0.1, "other": 9}])
    load.add_received(2, 100)
    load.add_received(7, 100)  # a round no longer kept: nothing to count it in
    assert load.as_list() == [
        {"round": 1, "actors": {"control": {"received": 32, "sent": 32}}},
        {
            "round": 2,
            "actors": {
                "control": {"received": 100, "sent": 0},
                "shard0": {"received": 5, "sent": 6, "seconds": 0.1},
            },
        },
    ]
    assert tensor_bytes({"a": {"b": torch.zeros(2, dtype=torch.float64)}, "c": 3}) == 16
    for r in range(100):
        load.record(r, [])
    assert len(load.as_list()) == 64 and load.as_list()[-1]["round"] == 99


# ------------------------------------------------------------------------------------- channel session
class _Pool:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.opened = fail, []

    async def targets(self):
        return [("shard0", "node0")]

    async def open_channels(self, generation, inputs, readers, nbytes, timeout_s=None):
        if self.fail:
            raise RuntimeError("no shard")
        self.opened.append((generation, len(readers), nbytes))
        return ["input0"]


def _session(pool) -> ChannelSession:
    return ChannelSession(
        ChannelBook(enabled=True),
        pool=pool,
        timeout_s=0.2,
        self_reader=lambda: ("me", "node0"),
        read_round=lambda channel, round_, timeout: f"{channel}@{round_}",
    )


def _link(nbytes: int = 8) -> Link:
    return Link(outputs=("out0",), reader=("learner", "node0"), nbytes=(nbytes,))


def test_a_generation_goes_live_once_every_member_linked_and_its_rounds_are_read_in_place():
    async def linked():
        pool = _Pool()
        session = _session(pool)
        plan = await session.plan([0, 1], [0, 1], [], True, 2)
        waiting = asyncio.ensure_future(session.link(plan.generation, 0, _link()))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # waits for the other member
        last = await session.link(plan.generation, 1, _link())
        parts = await session.read([Channelled(plan.generation, 0, 5)])
        return await waiting, last, parts, pool, session

    first, last, parts, pool, session = _run(linked())
    assert first == last == ["input0"] and pool.opened == [(1, 3, (8,))]  # two members and the averager read
    assert parts == ["input0@5"] and session.report() == {
        "enabled": True,
        "generations": 1,
        "live": True,
        "ended": 0,
    }


def test_a_generation_that_cannot_open_or_is_short_of_a_member_ends_and_the_store_is_used():
    async def failing():
        session = _session(_Pool(fail=True))
        assert await session.plan([0], [0, 1], [], True, 2) is None  # not the whole group: no generation
        plan = await session.plan([0, 1], [0, 1], [], True, 2)
        waiting = asyncio.ensure_future(session.link(plan.generation, 0, _link()))
        last = await session.link(plan.generation, 1, _link())
        return await waiting, last, session

    first, last, session = _run(failing())
    assert first is None and last is None and session.report()["ended"] == 1 and not session.report()["live"]


# ------------------------------------------------------------------------------------------ held state
class _CopyingPool(_Pool):
    """A pool of one shard that kept its copy of the rounds it wrote into its channel."""

    def __init__(self, copies: dict) -> None:
        super().__init__()
        self.copies, self.asked = copies, []

    async def results(self, round_):
        self.asked.append(round_)
        return [self.copies[round_]]


def test_the_held_state_falls_back_to_the_shards_copies_when_its_channel_read_fails_and_ends_the_generation():
    """A channel read that fails (Ray's "Reader missed a value" after a member's node died) leaves the
    averager no readable place among the readers: it reads the shards' copies and ends the generation,
    so that a joiner or a checkpoint still gets the round."""
    layout = FlatLayout.of({"w": torch.zeros(4)}, None)
    copy = {"mean/float32": np.arange(4, dtype=np.float32)}

    def broken(channel, round_, timeout):
        raise RuntimeError("Reader missed a value. Are you sure there are num_readers many readers?")

    async def reading(read_round):
        pool = _CopyingPool({5: copy})
        session = ChannelSession(ChannelBook(enabled=True), pool=pool, timeout_s=0.2,
                                 self_reader=lambda: ("me", "node0"), read_round=read_round)  # fmt: skip
        plan = await session.plan([0], [0], [], True, 1)
        await session.link(plan.generation, 0, _link())
        loads = HubLoad()
        loads.record(5, [])  # the round's close recorded its merge
        held = HeldState(channels=session, pool=pool, loads=loads, batch=None, history=None, latest=None)
        marker = Channelled(plan.generation, 0, 5)
        state = AveragedState(round=5, batch_size=4, flat=FlatPayload(layout, (marker,)))
        return await held.read(state), pool, session, loads

    (state, parts), pool, session, loads = _run(reading(broken))
    assert pool.asked == [5] and parts == [copy] and state.flat.parts == (copy,)
    assert not session.book.live and session.report()["ended"] == 1
    assert loads.as_list()[-1]["actors"]["control"]["received"] == 16  # its copy counts in the hub load
    # Vacuity guard: with readable channels, the shards are not asked and the generation stays live.
    (_, parts), pool, session, _ = _run(reading(lambda channel, round_, timeout: copy))
    assert pool.asked == [] and parts == [copy] and session.book.live


# ------------------------------------------------------------------------------------------ round merge
def _closed_round(params, moments, payload):
    """A round of ``len(params)`` learners closed in a round book: what ``RoundMerge`` merges."""
    n = len(params)
    book = RoundBook(n, timeout_s=5.0, min_learners=1)
    for j in range(n):
        book.join(j, n, f"i{j}")
    for j in range(n):
        sent, moment = payload(params[j], moments[j])
        book.arrive(j, 1, n, check_payload(sent, moment, {}, float(j + 1)), f"i{j}")
    return book, book.close()


def _merge(settings, book, loads, *, latest=None, rows_cap=None, pool=None) -> RoundMerge:
    return RoundMerge(
        settings,
        pool=pool or InProcessShards(2),
        book=book,
        channels=_session(_Pool()),
        loads=loads,
        batch=BatchRule(settings),
        elapsed=lambda: 7.5,
        latest=lambda: latest or AveragedState(batch_size=4),
        rows_cap=lambda: rows_cap,
    )


def _flat_in(store):
    """A ``_closed_round`` payload maker: a learner's state as a flat payload of 2 slices in ``store``."""

    def flat(p, m):
        layout = FlatLayout.of(p, m)
        buffers, extras = layout.pack(p, m)
        return FlatPayload(layout, tuple(store.put(s) for s in layout.split(buffers, 2)), extras), None

    return flat


def test_round_merge_of_tensors_and_of_flat_slices_equals_the_library_mean():
    params, moments = adam_learners(2, width=6)
    weights = [1.0, 2.0]
    expected = average_states(params, weights)
    expected_moments = merge_adam_states(moments, weights=weights)
    settings = AveragerSettings(world_size=2, batch_size=4, shards=2)
    store = InProcessStore()
    flat = _flat_in(store)

    async def both():
        loads = HubLoad()
        book, closed = _closed_round(params, moments, lambda p, m: (p, m))
        merge = _merge(settings, book, loads)
        arrivals = [arrival for _, arrival in closed.present]
        tensors = merge.tensors(arrivals, [a.weight for a in arrivals])
        book, closed = _closed_round(params, moments, flat)
        merge = _merge(settings, book, loads)
        _, merged = await merge.flat(closed)
        return tensors, merged, loads

    (mean, mean_moments), merged, loads = _run(both())
    assert same(mean, expected) and same(mean_moments, expected_moments)
    state = AveragedState(round=1, flat=merged, batch_size=4).materialise(store.get)
    assert same(state.params, expected) and same(state.optimizer_state, expected_moments)
    assert {"shard0", "shard1"} <= set(loads.as_list()[-1]["actors"])  # each shard's bytes recorded


def test_round_merge_result_carries_the_batch_rules_size_the_clock_and_the_settled_position():
    params, moments = adam_learners(2, width=6)
    settings = AveragerSettings(world_size=2, batch_size=4, shards=2)

    async def close():
        book, closed = _closed_round(params, moments, lambda p, m: (p, m))
        return await _merge(settings, book, HubLoad()).result(closed)

    _, result = _run(close())
    assert result.learners == (0, 1) and result.weights == (1.0, 2.0) and result.dropped == ()
    state = result.state
    assert state.round == 1 and state.batch_size == 4 and state.elapsed_s == 7.5 and state.source == "live"
    assert state.position is None and same(state.params, average_states(params, [1.0, 2.0]))


class _ForgettingPool(InProcessShards):
    """Its first merge waits until a payload is forgotten (its learner was lost), then names that one and
    the payload at ``stale`` unreadable, as shards do; later merges are plain."""

    def __init__(self, stale: int) -> None:
        super().__init__(2)
        self.stale, self.forgotten, self.merges = stale, asyncio.Event(), 0
        self.forgotten_payloads: list = []

    def forget(self, round, payload) -> None:
        self.forgotten_payloads.append(payload)
        self.forgotten.set()

    async def merge(self, round, payloads, weights, timeout_s=None, write=False):
        self.merges += 1
        if self.merges > 1:
            return await super().merge(round, payloads, weights, timeout_s, write)
        await self.forgotten.wait()
        lost = {i for i, p in enumerate(payloads) if any(p is f for f in self.forgotten_payloads)}
        return ShardMerge(unreadable=frozenset(lost | {self.stale}))


@pytest.mark.parametrize("why", [None, "its process did not answer within 1 s while round 1 merged"])
def test_a_learner_lost_while_its_round_merges_is_dropped_as_lost_and_a_slow_one_as_unreadable(why):
    """``RoundMerge.lost`` hands the averager the lost learner's payload in the running merge (the pool
    forgets it); the drop says its process was lost (or the reason given: a probe's), while a learner
    whose slices timed out keeps the timeout's reason; the others' slices are merged again. Not in a
    merge: nothing to forget."""
    params, moments = adam_learners(3, width=6)
    settings = AveragerSettings(world_size=3, batch_size=4, shards=2)
    store = InProcessStore()
    flat = _flat_in(store)

    async def merging():
        book, closed = _closed_round(params, moments, flat)
        pool = _ForgettingPool(stale=2)
        merge = _merge(settings, book, HubLoad(), pool=pool)
        assert merge.lost(1) is None  # no merge running yet
        running = asyncio.ensure_future(merge.flat(closed))
        await asyncio.sleep(0.05)
        round_, payload = merge.lost(1) if why is None else merge.lost(1, why)
        pool.forget(round_, payload)
        kept, merged = await asyncio.wait_for(running, 5)
        return book, round_, kept, merged, pool

    book, round_, kept, merged, pool = _run(merging())
    assert round_ == 1 and pool.merges == 2 and [learner for learner, _ in kept.present] == [0]
    assert book.dropped == {
        1: why or "its process was lost while the round merged: its slices died with it",
        2: "its slices were lost or unreadable for 5 s (the learner owns them)",
    }
    state = AveragedState(round=1, flat=merged, batch_size=4).materialise(store.get)
    assert same(state.params, params[0])  # learner 0's alone


# -------------------------------------------------------------------------------------------- arrivals
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _arrivals(n: int = 2, *, shards: int = 1, merge_moments: bool = True):
    book = RoundBook(n, timeout_s=5.0, min_learners=1)
    for j in range(n):
        book.join(j, n, f"i{j}")
    clock = _Clock()
    return Arrivals(book, shards=shards, merge_moments=merge_moments, clock=clock), book, clock


def _send(arrivals, learner, params, optimizer_state=None, *, round_=1, world=2, rows=None):
    return arrivals.admit(learner, round_, world, params, optimizer_state, {}, 1.0, None, f"i{learner}", rows)


def test_arrivals_refuse_a_bad_sender_and_one_unlike_the_rounds_first_without_failing_the_round():
    arrivals, book, _ = _arrivals()
    with pytest.raises(ValueError, match="rows"):
        Arrivals.check_sender(0, 0)
    with pytest.raises(TypeError):
        Arrivals.check_sender(0.5, None)
    first = _send(arrivals, 0, {"w": torch.zeros(2)}, rows=12)
    assert arrivals.rows_cap == 12
    book.arrive(0, 1, 2, first, "i0")
    with pytest.raises(ValueError, match="differ from the round's first"):
        _send(arrivals, 1, {"w": torch.zeros(3)})
    assert book.current.arrived == [0] and arrivals.rows_cap == 12  # the round goes on without the odd one
    with pytest.raises(Exception, match="round"):
        _send(arrivals, 1, {"w": torch.zeros(2)}, round_=5, rows=99)  # a stale round is refused
    assert arrivals.rows_cap == 12  # a refused sender's rows are not taken


def test_arrivals_check_a_flat_payloads_parts_and_moments():
    params, moments = adam_learners(1, width=6)
    layout = FlatLayout.of(params[0], moments[0])
    buffers, extras = layout.pack(params[0], moments[0])
    store = InProcessStore()
    payload = FlatPayload(layout, tuple(store.put(s) for s in layout.split(buffers, 2)), extras)
    with pytest.raises(ValueError, match="2 parts for 3 shards"):
        _send(_arrivals(shards=3)[0], 0, payload)
    with pytest.raises(ValueError, match="merge_moments=False"):
        _send(_arrivals(shards=2, merge_moments=False)[0], 0, payload)
    assert _send(_arrivals(shards=2)[0], 0, payload).adam


def test_arrivals_time_a_senders_wait_for_the_others_until_the_round_closed():
    arrivals, _, clock = _arrivals()
    clock.now = 2.0
    start = arrivals.now()
    clock.now = 5.0
    arrivals.mark_closed(1)
    clock.now = 6.0
    assert arrivals.timed(1, start) == (4.0, 3.0)  # 4 s in the call, 3 of them waiting
    assert arrivals.timed(2, start) == (4.0, 0.0)  # a round that never closed: no waiting
    for r in range(3, 20):
        arrivals.mark_closed(r)
    arrivals.timed(19, start)
    assert arrivals.timed(1, start) == (4.0, 0.0)  # only recent rounds' closes are kept


# ------------------------------------------------------------------------------- recovery, run folder
def _parts(tmp_path=None, *, world: int = 2):
    settings = AveragerSettings(world_size=world, batch_size=4, adaptive_batch=True)
    history = RunHistory(None if tmp_path is None else tmp_path / EVENTS_FILE, actor="actor-1")
    book = RoundBook(world, timeout_s=5.0, min_learners=1, sink=history.on_member)  # as the averager wires it
    return settings, book, BatchRule(settings), history


def _state(round_: int, source: str = "live", batch: int = 8) -> AveragedState:
    rule = BatchRule(AveragerSettings(world_size=1, batch_size=batch)).state_dict()
    params = {"w": torch.full((2,), float(round_))}
    return AveragedState(round=round_, params=params, batch_size=batch, adaptive_state=rule, source=source)


def _kinds(history: RunHistory) -> list[str]:
    return [r["kind"] for r in history.recoveries]


def test_a_new_group_records_whether_it_starts_over_from_a_checkpoint_or_live():
    _, book, batch, history = _parts()
    recovery = GroupRecovery(book=book, batch=batch, history=history)
    for generation, state in [
        (1, _state(2)),
        (2, AveragedState(batch_size=4)),
        (2, _state(3)),
        (3, _state(5, "checkpoint")),
    ]:
        book.generation = generation
        recovery.on_new_group(state)
    assert _kinds(history) == ["restart_from_scratch", "live_recovery", "checkpoint_recovery"]
    assert "group of 2 starts from round 3's state held by the averager" in history.recoveries[1]["detail"]


def test_a_newer_seed_is_adopted_and_an_older_or_bad_one_is_not():
    _, book, batch, history = _parts()
    recovery = GroupRecovery(book=book, batch=batch, history=history)
    held = _state(4)
    assert not recovery.newer(_state(4), held) and not recovery.newer(_state(2), held)
    with pytest.raises(TypeError, match="AveragedState"):
        recovery.check_seed({"w": torch.zeros(2)})
    recovery.check_seed(None)
    assert recovery.newer(_state(6, "checkpoint", batch=8), held)
    state = recovery.adopt(1, _state(6, "checkpoint", batch=8), held=4)
    assert state.round == 6 and state.source == "checkpoint" and batch.size == 8 and book.round == 7
    assert recovery.adopt(0, _state(9), held=6).source == "seed"
    assert _kinds(history) == ["checkpoint_recovery", "reseeded"] and "(the averager had 4)" in str(
        history.recoveries[0]["detail"]
    )


def test_shard_placement_starts_the_pool_once_enough_learners_nodes_are_known():
    class Pool:
        count = 2

        def __init__(self) -> None:
            self.placed, self.prepared = [], 0

        def place(self, learner, node):
            self.placed.append((learner, node))

        def prepare(self):
            self.prepared += 1

    pool = Pool()
    placement = ShardPlacement(pool)
    placement.place(0, "a", 4)
    assert pool.prepared == 0  # 1 node known of the 2 shards' worth
    placement.place(1, "b", 4)
    assert pool.placed == [(0, "a"), (1, "b")] and pool.prepared == 1
    alone = Pool()
    ShardPlacement(alone).place(0, "a", 1)  # a group of one: its one node is enough
    assert alone.prepared == 1


def _folder(tmp_path, found):
    settings, book, batch, history = _parts(tmp_path)
    validation = ValidationMachine.from_settings(settings, by_learners=True)
    folder = RunFolder(
        book=book, batch=batch, validation=validation, history=history, load_latest=lambda run_dir: found
    )
    return folder, book, batch, history, validation


def test_a_run_folder_resumes_from_its_latest_checkpoint(tmp_path):
    found = checkpoint.Checkpoint(
        folder=tmp_path / "checkpoint_round_000003",
        state=_state(3, batch=8),
        history={"validation_due": 3, "dropped_log": [], "loss_history": [{"round": 3, "loss": 1.0}]},
    )
    folder, book, batch, history, validation = _folder(tmp_path, found)
    state = folder.load(tmp_path, restarted_by_ray=False, state=AveragedState(batch_size=4))
    assert state.round == 3 and state.source == "checkpoint" and batch.size == 8
    assert book.round == 4 and validation.due == 3 and validation.averaged == 3 and not book.restarted
    assert _kinds(history) == ["resumed"] and history.loss_history == [{"round": 3, "loss": 1.0}]


def test_a_resume_names_the_rounds_a_killed_run_averaged_after_its_checkpoint_and_logs_them_redone(tmp_path):
    """A driver killed after round 5 with checkpoint 3 in its folder: the rounds its averager held only in
    memory (4, 5) are averaged again by the resumed run, which says so and logs them ``redo``, so the
    round log reads 1..N with each repeat marked (bench/chaos.py's ``rounds_contiguous``)."""
    _, _, _, killed = _parts(tmp_path)
    for round_ in range(1, 6):
        killed.record_round(
            round_, seconds=0.5, batch_size=4, position=None, stats=[(0, {"loss": 2.0, "sequences": 2})]
        )
    found = checkpoint.Checkpoint(folder=tmp_path / "checkpoint_round_000003", state=_state(3, batch=8))
    folder, book, _, history, _ = _folder(tmp_path, found)
    history.actor = "actor-2"  # the resumed run's averager
    folder.load(tmp_path, restarted_by_ray=False, state=AveragedState(batch_size=4))
    [resumed] = history.recoveries
    assert resumed["kind"] == "resumed" and book.round == 4
    assert "checkpoint_round_000003 (round 3); rounds 4-5 of the stopped run" in resumed["detail"], resumed
    for round_ in (4, 5, 6):
        history.record_round(round_, seconds=0.5, batch_size=8, position=None, stats=[(0, {"loss": 1.0})])
    logged = [
        (r["actor"], r["round"], r.get("redo", False)) for r in history.log.read() if r["type"] == "round"
    ]
    assert logged[5:] == [("actor-2", 4, True), ("actor-2", 5, True), ("actor-2", 6, False)]
    assert _kinds(history) == ["resumed"] and history.summary()["rounds_completed"] == 3


def test_a_resume_of_a_run_stopped_before_its_first_checkpoint_starts_over_and_says_so(tmp_path):
    _, _, _, killed = _parts(tmp_path)
    killed.mark_start()
    killed.record_round(1, seconds=0.5, batch_size=4, position=None, stats=[(0, {"loss": 2.0})])
    folder, book, _, history, _ = _folder(tmp_path, None)
    history.actor = "actor-2"
    empty = AveragedState(batch_size=4)
    assert folder.load(tmp_path, restarted_by_ray=False, state=empty) is empty and book.round == 1
    [resumed] = history.recoveries
    assert resumed["detail"].startswith("run resumed from the start (no checkpoint yet); round 1 of the")
    history.record_round(1, seconds=0.5, batch_size=4, position=None, stats=[(0, {"loss": 2.0})])
    assert [r.get("redo", False) for r in history.log.read() if r["type"] == "round"] == [False, True]


def test_an_event_log_cut_short_by_a_kill_reads_back_and_the_next_writer_starts_a_new_line(tmp_path, caplog):
    from raytrain_seq.rounds.events import EventLog

    path = tmp_path / EVENTS_FILE
    EventLog(path).append({"type": "start", "n": 1})
    with path.open("a") as out:
        out.write('{"type": "round", "rou')  # the writer killed mid-line
    with caplog.at_level("WARNING"):
        assert EventLog(path).read() == [{"type": "start", "n": 1}]
    assert f"{EVENTS_FILE}:2 skipped" in caplog.text
    later = EventLog(path)
    later.append({"type": "start", "n": 2})
    later.append({"type": "start", "n": 3})
    assert [r["n"] for r in EventLog(path).read()] == [1, 2, 3]
    assert path.read_text().count("\n") == 4  # the torn line closed once, then one line a record


def test_a_run_folder_tells_a_restart_by_ray_from_a_new_run(tmp_path):
    empty = AveragedState(batch_size=4)
    folder, book, _, history, _ = _folder(tmp_path, None)
    assert folder.load(tmp_path, restarted_by_ray=True, state=empty) is empty  # a new run: nothing to say
    assert not book.restarted and history.recoveries == []
    history.record_round(
        1, seconds=0.5, batch_size=4, position=None, stats=[(0, {"loss": 2.0, "sequences": 2})]
    )
    folder, book, _, history, _ = _folder(tmp_path, None)  # the same actor id, started again
    assert folder.load(tmp_path, restarted_by_ray=True, state=empty) is empty
    assert book.restarted and _kinds(history) == ["averager_restart"]
    assert [h["round"] for h in history.loss_history] == [1]  # its round since the checkpoint, replayed
    # Who took part in it, for a learner whose answer died with the actor (``JoinReply.took_part``).
    assert history.learners_of(1) == {0} and history.learners_of(2) == set()


# ------------------------------------------------------------------------------------------ round wait
def test_the_round_wait_closes_at_the_deadline_or_at_once_and_fails_a_round_the_book_moved_past():
    async def scenario():
        book = RoundBook(2, timeout_s=0.05)
        for name in "ab":
            book.join(name)
        closed, tasks = [], set()

        async def close(round_close, future):
            closed.append((round_close.round, sorted(round_close.dropped), future))
            book.finish(ok=True)

        def spawn(coro):
            task = asyncio.ensure_future(coro)
            tasks.add(task)
            return task

        wait = RoundWait(book, Arrivals(book, shards=1, merge_moments=False), spawn=spawn, close=close)
        book.arrive("a", 1, 2, object())
        wait.open()
        late = wait.future
        await asyncio.sleep(0.3)  # b never sends round 1: the deadline closes it without b
        book.join("b")
        book.arrive("a", 2, 2, object())
        wait.open()
        assert book.arrive("b", 2, 2, object())  # complete: closed at once, the timer stopped
        wait.start_close()
        prompt = wait.future
        await asyncio.sleep(0.3)
        book.arrive("a", 3, 2, object())
        wait.open()
        stale = wait.future
        wait.fail("the learner group was restarted")
        await asyncio.gather(*tasks, return_exceptions=True)
        return closed, late, prompt, stale, wait.future

    closed, late, prompt, stale, after = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert closed == [(1, ["b"], late), (2, [], prompt)]  # round 2 closed once, when complete
    assert after is None and isinstance(stale.exception(), StaleRoundError)
    assert "restarted" in str(stale.exception())


def test_the_round_wait_drops_learners_whose_processes_do_not_answer_and_waits_for_the_slow():
    async def scenario(answers: dict, timeout_s: float, late: dict, probe_s: float = 0.05):
        book = RoundBook(len(answers), timeout_s=timeout_s)
        for name in answers:
            book.join(name)
        closed, asked, tasks = [], [], set()

        async def probe(learner, within):
            asked.append(learner)
            await asyncio.sleep(within if answers[learner] is False else 0.0)  # a silent one: its wait
            return answers[learner]

        async def close(round_close, future):
            closed.append((time.monotonic() - opened, sorted(round_close.dropped)))
            book.finish(ok=True)

        def spawn(coro):
            task = asyncio.ensure_future(coro)
            tasks.add(task)
            return task

        arrivals = Arrivals(book, shards=1, merge_moments=False)
        wait = RoundWait(book, arrivals, spawn=spawn, close=close, probe=probe, probe_s=probe_s)
        opened = time.monotonic()
        book.arrive("a", 1, len(answers), object())
        wait.open()
        for learner, after in late.items():  # the slow ones send later, while the probes go on
            await asyncio.sleep(after)
            if book.arrive(learner, 1, len(answers), object()):
                wait.start_close()
        while not closed:
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks, return_exceptions=True)
        return closed, asked, book.dropped

    # b is slow but answers, c is stopped: the round waits for b, then closes without c long before 30 s.
    run = scenario({"a": True, "b": True, "c": False}, 30.0, {"b": 0.4})
    closed, asked, dropped = asyncio.run(asyncio.wait_for(run, 10))
    [(seconds, gone)] = closed
    assert gone == ["c"] and 0.4 <= seconds < 2.0
    assert asked.count("b") >= 2 and asked.count("c") >= 3 and "a" not in asked  # probed while missing
    assert "did not answer within 0.05 s while round 1 waited" in dropped["c"]
    # A learner whose process is unknown (None) is waited for until the deadline, as without probes.
    closed, asked, dropped = asyncio.run(asyncio.wait_for(scenario({"a": True, "d": None}, 0.3, {}), 10))
    [(seconds, gone)] = closed
    assert gone == ["d"] and seconds >= 0.3 and asked
    assert dropped["d"].startswith("did not send round 1 within 0.3 s")
    # A round complete before the first probe asks nobody.
    run = scenario({"a": True, "b": False}, 30.0, {"b": 0.0})
    closed, asked, _ = asyncio.run(asyncio.wait_for(run, 10))
    assert [gone for _, gone in closed] == [[]] and asked == []
    # The first probe goes out FIRST_PROBE_S after the round opened, not probe_s: a stopped learner is
    # dropped about one probe_s after the first arrival (two, with the first probe at probe_s).
    closed, asked, _ = asyncio.run(asyncio.wait_for(scenario({"a": True, "c": False}, 30.0, {}, 0.5), 10))
    [(seconds, gone)] = closed
    assert gone == ["c"] and asked == ["c"]
    assert 0.5 + FIRST_PROBE_S <= seconds < 2 * 0.5  # the old first probe: at 0.5 s, dropped at >= 1 s


def test_a_merging_rounds_senders_are_probed_and_one_that_does_not_answer_is_forgotten_once():
    """``RoundWait.probe_merging``: every probe_s while the merge runs, the senders' processes are
    probed; a silent one goes to ``silent`` once, with the reason; one that answers, or is unknown, is
    probed on. Without a probe nothing is asked."""

    async def scenario(probe):
        book = RoundBook(3, timeout_s=30.0)
        asked, silent = [], []

        async def answers(learner, within):
            asked.append(learner)
            return {"a": True, "b": False, "c": None}[learner]

        wait = RoundWait(
            book, Arrivals(book, shards=1, merge_moments=False), spawn=asyncio.ensure_future,
            close=None, probe=answers if probe else None, probe_s=0.05,
        )  # fmt: skip
        watching = asyncio.ensure_future(
            wait.probe_merging(["a", "b", "c"], lambda *told: silent.append(told))
        )
        # The merge runs on: at least 0.4 s, and until "a" was probed 3 times (a busy box may stall this
        # loop for longer than a few probes take on a quiet one).
        began = time.monotonic()
        while (
            time.monotonic() - began < 0.4 or (probe and asked.count("a") < 3)
        ) and time.monotonic() - began < 30:
            await asyncio.sleep(0.05)
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        return asked, silent

    asked, silent = asyncio.run(scenario(probe=True))
    assert [learner for learner, _ in silent] == ["b"] and asked.count("b") == 1
    assert "did not answer within 0.05 s while round 1 merged" in silent[0][1]
    assert asked.count("a") >= 3 and asked.count("c") >= 3  # probed on while the merge runs
    assert asyncio.run(scenario(probe=False)) == ([], [])
