"""Tests for raytrain_seq.runtime.averager: the round policy (no ray) and the actor on a local Ray cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pickle
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from averager_fixtures import local_averager
from conftest import adam_learners
from test_payload import same

from raytrain_seq import checkpoint
from raytrain_seq.algorithms.averaging import average_states, merge_adam_states
from raytrain_seq.dataplane.payload import FlatLayout, FlatPayload
from raytrain_seq.dataplane.stores import InProcessShards
from raytrain_seq.members.errors import AveragingTimeoutError, MembershipError, StaleRoundError
from raytrain_seq.rounds.book import RoundBook
from raytrain_seq.rounds.current_round import RoundPhase
from raytrain_seq.rounds.state import AveragedState

LEARNERS = ["a", "b", "c"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _book(**kwargs) -> tuple[RoundBook, FakeClock]:
    clock = FakeClock()
    book = RoundBook(3, timeout_s=kwargs.pop("timeout_s", 5.0), clock=clock, **kwargs)
    for learner in LEARNERS:
        assert book.join(learner) == 1
    return book, clock


def _tiny(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4,), float(value))}


# ------------------------------------------------------------------------------------ RoundBook, no ray
def test_book_round_completes_when_all_arrive():
    """A round completes exactly when every expected learner arrived; its deadline is first arrival + timeout."""
    book, clock = _book()
    assert not book.arrive("b", 1, 3, "pb")
    assert book.current.deadline == 105.0 and book.current.missing == ["a", "c"]
    clock.now = 101.0
    assert not book.arrive("a", 1, 3, "pa")
    with pytest.raises(RuntimeError, match="waiting for"):
        book.close()  # neither complete nor past the deadline
    assert book.arrive("c", 1, 3, "pc")
    closed = book.close()
    # Averaged in sorted order whatever the arrival order, with each learner's own payload.
    assert closed.present == (("a", "pa"), ("b", "pb"), ("c", "pc")) and closed.dropped == ()
    book.finish()
    assert (book.round, book.current.phase, book.dropped_log) == (2, RoundPhase.IDLE, [])


def test_book_deadline_drops_the_missing_with_a_reason(caplog):
    """Past the deadline the missing learner is dropped with a logged reason and not expected any more."""
    caplog.set_level(logging.WARNING, logger="raytrain_seq.runtime.averager")
    book, clock = _book(timeout_s=2.0)
    book.arrive("a", 1, 3)
    book.arrive("c", 1, 3)
    clock.now = 101.9
    assert not book.current.expired()
    clock.now = 102.0
    assert book.current.expired()
    closed = book.close()
    assert [name for name, _ in closed.present] == ["a", "c"] and closed.dropped == ("b",)
    [record] = book.dropped_log
    assert set(record) == {"round", "learner", "reason", "time"}
    assert (record["round"], record["learner"]) == (1, "b") and "within 2 s" in record["reason"]
    assert any("'b'" in m and record["reason"] in m for m in caplog.messages)
    book.finish()
    book.arrive("a", 2, 3)
    assert book.current.expected == ["a", "c"] and book.arrive("c", 2, 3)  # b is not waited for


def test_book_drop_unread_leaves_the_readable_and_refuses_outside_closing():
    """drop_unread removes arrived learners from the closing round with a reason; too few left is an error."""
    book, _ = _book(min_learners=2)
    for learner in LEARNERS:
        book.arrive(learner, 1, 3, f"p{learner}")
    closed = book.close()
    with pytest.raises(RuntimeError, match="not the one closing"):
        book.drop_unread(closed.__class__(2, (), (), 0.0), ["a"], "why")
    kept = book.drop_unread(closed, ["b"], "unreadable")
    assert kept.present == (("a", "pa"), ("c", "pc")) and kept.dropped == ("b",) and kept.error is None
    assert book.current.phase == RoundPhase.CLOSING and book.dropped == {"b": "unreadable"}
    failed = book.drop_unread(kept, ["c"], "unreadable too")
    assert failed.present == () and failed.dropped == ("b", "c")
    assert isinstance(failed.error, AveragingTimeoutError) and failed.error.arrived == ("a",)
    book.finish(ok=False)
    assert (book.round, book.current.phase, book.quorum) == (1, RoundPhase.IDLE, 1)
    with pytest.raises(RuntimeError, match="not the one closing"):
        book.drop_unread(failed, ["a"], "idle now")


def test_book_stale_skipped_and_duplicate_rounds_name_the_learner():
    """Closed, skipped-ahead and repeated rounds raise StaleRoundError naming the learner and join()."""
    book, _ = _book()
    for learner in LEARNERS:
        book.arrive(learner, 1, 3)
    book.close()
    book.finish()
    cases = [("a", 1, 2, "closed"), ("b", 3, 2, "skipped ahead")]
    for learner, sent, expected, why in cases:
        with pytest.raises(StaleRoundError, match=why) as info:
            book.arrive(learner, sent, 3)
        err = info.value
        assert (err.learner, err.sent_round, err.expected_round) == (learner, sent, expected)
        assert repr(learner) in str(err) and "join()" in str(err)
    book.arrive("c", 2, 3)
    with pytest.raises(StaleRoundError, match="already sent"):
        book.arrive("c", 2, 3)
    assert book.current.arrived == ["c"]  # the rejected calls recorded nothing


def test_book_world_size_and_membership():
    """A different world size, an unregistered caller or a joiner beyond the world raise MembershipError."""
    book, _ = _book()
    with pytest.raises(MembershipError) as info:
        book.arrive("a", 1, 4)
    assert (info.value.learner, info.value.sent_world_size, info.value.world_size) == ("a", 4, 3)
    with pytest.raises(MembershipError, match="call join"):
        book.arrive("zed", 1, 3)
    with pytest.raises(MembershipError, match="group is full"):
        book.join("d")
    assert book.current.phase == RoundPhase.IDLE  # nothing opened a round
    book.set_world_size(4)
    assert book.join("d") == 1
    with pytest.raises(MembershipError):
        book.arrive("a", 1, 3)  # the old size is now the wrong one
    assert not book.arrive("a", 1, 4) and book.current.expected == ["a", "b", "c", "d"]
    assert [e["event"] for e in book.membership_log] == ["join"] * 3 + ["world_size", "join"]


def test_book_rejoin_after_drop():
    """A dropped learner gets StaleRoundError until it joins; joining mid-round, it is expected in it."""
    book, clock = _book(timeout_s=1.0)
    book.arrive("a", 1, 3)
    book.arrive("b", 1, 3)
    clock.now += 1.0
    assert book.close().dropped == ("c",)
    book.finish()
    with pytest.raises(StaleRoundError, match="dropped from round 1") as info:
        book.arrive("c", 1, 3)
    assert info.value.learner == "c" and info.value.expected_round == 2
    book.arrive("a", 2, 3)  # round 2 is open without c
    assert book.quorum == 2 and book.join("c") == 2  # it starts from round 1's state: it can send round 2
    assert book.quorum == 3 and book.current.expected == ["a", "b", "c"]
    assert not book.arrive("b", 2, 3)  # round 2 now waits for c too
    assert book.arrive("c", 2, 3)
    assert [name for name, _ in book.close().present] == ["a", "b", "c"]
    book.finish()
    assert book.dropped == {}
    changes = [(e["event"], e["learners"]) for e in book.membership_log if e["change"]]
    assert changes == [("drop", 2), ("rejoin", 3)]


def test_book_new_incarnation_starts_a_new_group():
    """A new process under a known id, or another world size, regroups: the open round is abandoned."""
    book = RoundBook(3, timeout_s=5.0, clock=FakeClock())
    for learner in range(3):
        book.join(learner, 3, incarnation=f"old-{learner}")
    assert book.generation == 1  # the first group
    book.arrive(0, 1, 3, "p0", incarnation="old-0")
    book.arrive(2, 1, 3, "p2", incarnation="old-2")
    # Ray Train restarted the group with 2 learners: rank 1's new process joins first.
    assert book.join(1, 2, incarnation="new-1") == 1  # the abandoned round is sent again
    assert (book.generation, book.world_size) == (2, 2)
    assert (book.current.phase, book.current.arrived) == (RoundPhase.IDLE, [])
    [group] = [e for e in book.membership_log if e["event"] == "group" and e["generation"] == 2]
    assert "(3 -> 2)" in group["detail"] and "[0, 2] abandoned" in group["detail"] and group["learners"] == 2
    with pytest.raises(MembershipError, match="replaced by a newer one"):
        book.join(0, 2, incarnation="old-0")  # a leftover of the old group cannot disturb the new one
    book.join(0, 2, incarnation="new-0")
    with pytest.raises(MembershipError, match="another process"):
        book.arrive(0, 1, 2, incarnation="stale")
    assert not book.arrive(1, 1, 2, incarnation="new-1") and book.arrive(0, 1, 2, incarnation="new-0")
    # Not vacuous: without incarnations the same joins are plain (re)joins and nothing regroups.
    plain = RoundBook(2, timeout_s=5.0, clock=FakeClock())
    plain.join(0)
    plain.join(0)
    assert plain.generation == 0 and [e["event"] for e in plain.membership_log] == ["join", "rejoin"]


def test_book_late_joiner_of_a_group_takes_part_in_the_open_round():
    """A group's learner joining after another already sent round n is expected in n (quorum = world)."""
    book = RoundBook(2, timeout_s=5.0, clock=FakeClock())
    book.join(0, 2, incarnation="x0")
    assert not book.arrive(0, 1, 2, incarnation="x0")  # alone but 2 are due: the round waits
    assert book.current.missing == [] and book.quorum == 2
    assert book.join(1, 2, incarnation="x1") == 1
    assert book.arrive(1, 1, 2, incarnation="x1")
    assert [name for name, _ in book.close().present] == [0, 1]


def test_book_too_few_learners_fail_the_round_and_keep_its_number():
    """Below min_learners the round fails with AveragingTimeoutError listing the missing; it can be resent."""
    book, clock = _book(timeout_s=1.0, min_learners=2)
    book.arrive("b", 1, 3)
    clock.now += 1.5
    closed = book.close()
    assert isinstance(closed.error, AveragingTimeoutError) and closed.present == ()
    assert (closed.error.missing, closed.error.arrived) == (("a", "c"), ("b",))
    assert (book.round, book.current.phase) == (1, RoundPhase.IDLE)
    book.join("a")
    book.arrive("b", 1, 3)
    assert book.arrive("a", 1, 3)  # c is dropped, so a and b complete round 1
    assert [name for name, _ in book.close().present] == ["a", "b"]


def test_errors_pickle_round_trip():
    """Every typed error survives pickling with all its fields and the same message."""
    errors = [
        AveragingTimeoutError(7, ["b", 2], ["a"], 1.5),
        StaleRoundError("learner-1", 3, 5, "it skipped ahead"),
        MembershipError(4, 3, 2, "it is not registered: call join() first"),
    ]
    for err in errors:
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err) and str(copy) == str(err) and copy.args == err.args
        assert copy._fields == err._fields and len(err._fields) == 4
        assert all(getattr(copy, name) == getattr(err, name) for name in err._fields)
    assert "'b'" in str(errors[0]) and "learner-1" in str(errors[1]) and "join()" in str(errors[1])


# ------------------------------------------------------------------------ the actor on asyncio, no ray
def test_actor_new_group_fails_the_old_round_and_starts_from_the_latest_state():
    """When Ray Train restarts the group, the old round's senders get StaleRoundError; joiners the latest."""

    async def scenario():
        averager = local_averager(3, timeout_s=30.0)
        for k, name in enumerate(LEARNERS):
            await averager.join(name, 3, incarnation=f"old-{k}")
        position = {"epoch": 0, "history": [], "world_size": 3, "rows_done": 4}
        await asyncio.gather(
            *(averager.average(n, 1, 3, _tiny(k), None, position=position) for k, n in enumerate(LEARNERS))
        )
        stuck = asyncio.create_task(averager.average("a", 2, 3, _tiny(7), None))
        await asyncio.sleep(0.05)
        joined = await averager.join("b", 2, incarnation="new-b")  # 2 learners now: b's new process
        with pytest.raises(StaleRoundError, match="restarted"):
            await stuck
        return joined, await averager.summary()

    joined, summary = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert (joined.next_round, joined.state.round, joined.world_size, joined.state.source) == (
        2,
        1,
        2,
        "live",
    )
    assert torch.equal(joined.state.params["w"], torch.full((4,), 1.0))
    assert joined.state.position["rows_done"] == 4
    [recovery] = summary.recoveries
    assert recovery["kind"] == "live_recovery" and "round 1" in recovery["detail"]
    groups = [e for e in summary.membership if e["event"] == "group"]
    assert [g["learners"] for g in groups] == [3, 2] and "abandoned" in groups[1]["detail"]


def test_actor_adopts_a_flat_seed_in_hand_and_hands_it_out_flat():
    """A rejoining learner's seed travels flat, its slices the arrays it holds (a call pickles an array
    as its bytes, a tensor at a cost per tensor): adopted when newer, handed to the next joiner flat,
    and equal to the learner's tensors once unpacked; a seed whose slices are references is refused."""
    params, moments = adam_learners(1, width=4)
    layout = FlatLayout.of(params[0], moments[0])
    buffers, extras = layout.pack(params[0], moments[0])
    flat = FlatPayload(layout, tuple(layout.split(buffers, 2)), extras)
    seed = AveragedState(round=3, flat=flat, batch_size=4, source="live")

    async def scenario():
        averager = local_averager(2, timeout_s=30.0, batch_size=4)
        seeded = await averager.join(0, 2, incarnation="a", seed=seed)
        other = await averager.join(1, 2, incarnation="b")
        refs = seed.replace(flat=dataclasses.replace(flat, parts=("ref-0", "ref-1")))
        with pytest.raises(TypeError, match="fetched"):
            await averager.join(0, 2, incarnation="a", seed=refs)
        return seeded, other, await averager.summary()

    seeded, other, summary = asyncio.run(asyncio.wait_for(scenario(), 20))
    for reply in (seeded, other):
        assert (reply.state.round, reply.next_round, reply.state.source) == (3, 4, "seed")
        assert reply.state.params is None and reply.state.flat.local
        unpacked = reply.state.materialise(lambda refs: pytest.fail("local slices need no read"))
        assert same(unpacked.params, params[0])
        assert all(same(unpacked.optimizer_state[i], entry) for i, entry in moments[0].items())
    assert [r["kind"] for r in summary.recoveries] == ["reseeded"]


def test_actor_reports_its_learner_processes_and_logs_them_with_each_rounds_steps(tmp_path):
    """The report names each learner's process (incarnation, node) of the current group; a round's record
    in events.jsonl holds its wall time and per learner its process and first step's wall time, which
    the per-learner totals do not sum. A restarted group's processes replace the old ones."""
    from raytrain_seq.outputs.reports import JoinedProcess
    from raytrain_seq.rounds.events import UNSUMMED, EventLog
    from raytrain_seq.rounds.sync import Tally

    began = time.time()
    tallies = {name: Tally() for name in "ab"}
    for tally in tallies.values():
        tally.add_step(frames=10, sequences=2, seconds=0.1, loss=1.0)
        tally.add_step(frames=10, sequences=2, seconds=0.1, loss=1.0)
    stats = {name: tally.flush() for name, tally in tallies.items()}

    async def scenario():
        averager = local_averager(2, timeout_s=30.0, run_dir=tmp_path, actor_id=lambda: "actor-1")
        for name in "ab":
            await averager.join(name, 2, incarnation=f"old-{name}", node=f"node-{name}")
        position = {"epoch": 0, "history": [], "world_size": 2, "rows_done": 2}
        await asyncio.gather(
            *(averager.average(n, 1, 2, _tiny(1), None, stats=stats[n], position=position) for n in "ab")
        )
        before = await averager.summary()
        await averager.join("a", 1, incarnation="new-a", node="node-a")  # Ray Train restarted the group
        return before, await averager.summary()

    before, after = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert before.processes == (
        JoinedProcess(learner="a", incarnation="old-a", node="node-a"),
        JoinedProcess(learner="b", incarnation="old-b", node="node-b"),
    )
    assert after.processes == (JoinedProcess(learner="a", incarnation="new-a", node="node-a"),)
    assert before.learners["a"]["steps"] == 2 and "first_step_wall" not in before.learners["a"]
    if os.path.exists("/proc/thread-self/schedstat"):  # a real Tally's wait for a CPU, summed as a total
        assert before.learners["a"]["cpu_wait_s"] == stats["a"]["cpu_wait_s"] >= 0.0
    [record] = [r for r in EventLog(tmp_path / "events.jsonl").read() if r["type"] == "round"]
    assert began <= record["time"] <= time.time()
    for proc, name in zip(record["processes"], "ab", strict=True):
        assert proc["learner"] == name and proc["incarnation"] == f"old-{name}"
        assert proc["node"] == f"node-{name}" and began <= proc["first_step_wall"] <= record["time"]
        assert proc["longest_gap_s"] == stats[name]["longest_gap_s"] >= 0.0  # kept apart, not summed
    assert [stats for _, stats in record["stats"]] == [
        {k: v for k, v in stats[n].items() if k not in UNSUMMED} for n in "ab"
    ]
    assert all(tally.first_step_wall is None for tally in tallies.values())  # the flush reset it


def test_actor_counts_the_wait_for_the_last_arrival_apart_from_the_rest_of_the_round():
    """A learner that arrives 0.3 s before the other has waited ~0.3 s of its averaging time for it; the
    last one waited for nobody. Both spent the whole call in averaging (waiting included)."""

    async def scenario():
        averager = local_averager(2, timeout_s=30.0)
        for name in ("a", "b"):
            await averager.join(name, 2)
        early = asyncio.create_task(averager.average("a", 1, 2, _tiny(1), None))
        await asyncio.sleep(0.3)
        await averager.average("b", 1, 2, _tiny(3), None)
        await early
        return await averager.summary()

    learners = asyncio.run(asyncio.wait_for(scenario(), 20)).learners
    assert 0.25 <= learners["a"]["waiting_s"] <= learners["a"]["averaging_s"] < 5.0
    assert learners["b"]["waiting_s"] == pytest.approx(0.0, abs=0.05) and learners["b"]["averaging_s"] < 5.0


def test_actor_restart_reloads_the_checkpoint_and_learners_reseed_it(tmp_path):
    """A restarted averager reloads run_dir's checkpoint; a learner ahead of it re-seeds it, nothing lost."""

    def actor_id() -> str:
        return "actor-1"  # Ray keeps an actor's id over its restarts

    prepared: list[int] = []  # per pool made, the shards' starts before the first join

    class Pool(InProcessShards):
        def prepare(self) -> None:
            prepared[-1] += 1

    def pool(count: int) -> Pool:
        prepared.append(0)
        return Pool(count)

    async def scenario():
        first = local_averager(2, timeout_s=30.0, run_dir=tmp_path, actor_id=actor_id, shard_pool=pool)
        assert prepared == [0]  # a first start waits for the learners' nodes
        for name in "ab":
            await first.join(name, 2, incarnation=name)
        results = []
        for r in (1, 2):
            position = {"epoch": 0, "history": [], "world_size": 2, "rows_done": 2 * r}
            sends = (
                first.average(n, r, 2, _tiny(r * 10 + k), None, position=position) for k, n in enumerate("ab")
            )
            results.append((await asyncio.gather(*sends))[0])
            if r == 1:  # the checkpoint Ray Train keeps after round 1
                state, history = await first.checkpoint_contents()
                checkpoint.save(tmp_path / checkpoint.folder_name(1), state=state, history=history.as_dict())
        # Ray's restart: its shards start before any learner rejoins (the old ones died with it).
        second = local_averager(2, timeout_s=30.0, run_dir=tmp_path, actor_id=actor_id, shard_pool=pool)
        assert prepared[-1] == 1
        reloaded = await second.latest()
        seed = results[-1].state  # what each learner holds: round 2's averaged state
        joins = [await second.join(n, 2, incarnation=n, seed=seed) for n in "ab"]
        third = await asyncio.gather(
            *(second.average(n, 3, 2, _tiny(30 + k), None) for k, n in enumerate("ab"))
        )
        return reloaded, joins, third[0], await second.summary()

    reloaded, joins, third, summary = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert reloaded.round == 1 and torch.equal(reloaded.params["w"], torch.full((4,), 10.5))
    assert reloaded.source == "checkpoint"
    assert [(j.next_round, j.state.round, j.state.source) for j in joins] == [(3, 2, "seed"), (3, 2, "seed")]
    assert joins[0].state.position["rows_done"] == 4
    assert torch.equal(joins[1].state.params["w"], torch.full((4,), 20.5))
    assert third.state.round == 3 and third.learners == ("a", "b")  # round 3 follows round 2: no round lost
    assert [r["kind"] for r in summary.recoveries] == ["averager_restart", "reseeded"]
    # Round 1 from the checkpoint, round 2 from the events log (after the checkpoint), round 3 live.
    assert [h["round"] for h in summary.loss_history] == [1, 2, 3]
    assert summary.learners["a"]["rounds"] == 3 and summary.rounds_completed == 3
    # The events log outlives the actor: the second one read the first one's membership back.
    assert [e["event"] for e in summary.membership][:3] == ["group", "join", "join"]
    assert (tmp_path / "events.jsonl").exists()


def test_a_restarted_averager_builds_its_evaluator_once_a_round_near_a_validation_closed(tmp_path):
    """A first start builds the evaluator at once; a restarted one (Ray's restart, its learners rejoining)
    not at its first round but once a round in the second half of a validation interval closed (m = 8:
    round 3 is not near, round 4 is), off the survivors' recovery."""

    class Recorder:
        """The validator: records when the averager starts its build; never asked to score (m = 8)."""

        def __init__(self) -> None:
            self.started = False

        def start(self) -> None:
            self.started = True

        async def __call__(self, state: Any) -> dict[str, float]:
            raise AssertionError(f"round {state.round} is not a validation round")

    def make(validator: Recorder) -> Any:
        return local_averager(
            2, timeout_s=30.0, validate_every=8, run_dir=tmp_path, actor_id=lambda: "actor-1",
            validator=validator,
        )  # fmt: skip

    async def rounds(averager: Any, validator: Recorder, numbers: range, seed: Any) -> tuple[list, Any]:
        for name in "ab":
            await averager.join(name, 2, incarnation=name, seed=seed)
        started, result = [], None
        for r in numbers:
            position = {"epoch": 0, "history": [], "world_size": 2, "rows_done": 2 * r}
            sends = (averager.average(n, r, 2, _tiny(r), None, position=position) for n in "ab")
            result = (await asyncio.gather(*sends))[0]
            started.append((r, validator.started))
        return started, result.state

    async def scenario():
        validators = [Recorder(), Recorder()]  # Ray's restart: a new process, a new validator
        first = make(validators[0])
        at_start = validators[0].started
        _, seed = await rounds(first, validators[0], range(1, 3), None)
        second = make(validators[1])
        at_restart = validators[1].started
        started, _ = await rounds(second, validators[1], range(3, 6), seed)
        return at_start, at_restart, started

    at_start, at_restart, started = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert at_start and not at_restart
    assert started == [(3, False), (4, True), (5, True)]


def test_actor_ablations_keep_the_batch_size_and_the_moments():
    """adaptive_batch=False never changes B; merge_moments=False averages weights and returns no moments."""
    adam = [
        {0: {"step": torch.tensor(1.0), "exp_avg": torch.full((4,), v), "exp_avg_sq": torch.ones(4)}}
        for v in (0.0, 2.0)
    ]

    async def scenario(**flags):
        averager = local_averager(2, timeout_s=30.0, validate_every=1, batch_size=4, **flags)
        for name in "ab":
            await averager.join(name)
        sizes = []
        for r, accuracy in ((1, 0.5), (2, 0.1)):
            sends = [averager.average(n, r, 2, _tiny(k), adam[k]) for k, n in enumerate("ab")]
            results = await asyncio.gather(*sends)
            sizes.append(await averager.report_validation(r, accuracy))
        return results[0], sizes

    adaptive, sizes = asyncio.run(asyncio.wait_for(scenario(steps=100), 20))  # the paper's budget: B grows
    fixed, fixed_sizes = asyncio.run(
        asyncio.wait_for(scenario(adaptive_batch=False, merge_moments=False), 20)
    )
    assert sizes == [4, 8] and fixed_sizes == [4, 4]  # the drop in accuracy grows B only when adaptive
    assert torch.equal(adaptive.state.optimizer_state[0]["exp_avg"], torch.full((4,), 1.0))
    assert fixed.state.optimizer_state is None
    assert torch.equal(fixed.state.params["w"], adaptive.state.params["w"])


# Issue 45's small case: validation accuracies on 10 videos that climb, then dip by one and two videos.
SMALL_VAL_RUN = [0.3, 0.5, 0.7, 0.9, 0.8, 0.9, 0.7, 0.9, 1.0, 0.9, 0.8, 1.0, 0.7, 0.9, 0.8, 1.0]


def test_default_rule_on_10_validation_videos_keeps_the_fixed_batch_under_an_epoch_budget():
    """Issue 45: with the job's defaults (TrainConfig, an epoch budget) the averager decides B = the fixed
    batch's at every validation of a 10-video set, so the run takes the fixed batch's steps and updates and
    cannot end below it; --batch-growth always (the earlier default) grows B on the same validations, and
    so does the default under --steps N (the paper's budget), as Algorithm 1 says."""
    from raytrain_seq.config import TrainConfig

    async def sizes(train: TrainConfig) -> list[int]:
        # The driver's arguments, from the same TrainConfig fields.
        averager = local_averager(
            1, timeout_s=30.0, validate_every=1, batch_size=train.batch_size, b1=train.b1, b2=train.b2,
            max_batch_size=train.max_batch_size, adaptive_batch=train.adaptive_batch,
            batch_growth=train.batch_growth, epochs=train.epochs, steps=train.steps,
        )  # fmt: skip
        await averager.join("a")
        out = []
        for r, accuracy in enumerate(SMALL_VAL_RUN, start=1):
            await averager.average("a", r, 1, _tiny(r), None)
            out.append(await averager.report_validation(r, accuracy, val_size=10, rows_cap=40))
        return out

    def run(**fields) -> list[int]:
        return asyncio.run(asyncio.wait_for(sizes(TrainConfig(**fields)), 20))

    default, fixed = run(), run(adaptive_batch=False)
    always, steps = run(batch_growth="always"), run(steps=300)
    assert TrainConfig().steps is None and TrainConfig().batch_growth == "steps"  # the defaults tested
    assert default == fixed == [4] * len(SMALL_VAL_RUN)
    assert always == steps and steps[-1] == 40 and steps.count(4) == 6  # grows from the 7th validation on


def test_actor_rejects_a_bad_payload_without_spoiling_the_round():
    """A malformed or mismatched payload fails only its sender, records nothing, and the round goes on."""
    adam = {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(4), "exp_avg_sq": torch.ones(4)}}
    bad_payloads = [
        ({"params": {"w": torch.zeros(5)}}, ValueError),  # another shape than the round's first learner
        ({"optimizer_state": adam}, ValueError),  # Adam state while the first learner has none
        ({"params": {"w": 1.0}}, TypeError),
        ({"weight": -1.0}, ValueError),
        ({"optimizer_state": {"state": {}, "param_groups": []}}, TypeError),
        ({"stats": {"frames": "many"}}, TypeError),
    ]

    async def scenario():
        averager = local_averager(2, timeout_s=30.0)
        for learner in "ab":
            await averager.join(learner)
        first = asyncio.create_task(averager.average("a", 1, 2, _tiny(1), None))
        await asyncio.sleep(0.01)
        for bad, error in bad_payloads:
            with pytest.raises(error):
                await averager.average("b", 1, 2, **{"params": _tiny(3), "optimizer_state": None, **bad})
        assert not first.done()
        return await averager.average("b", 1, 2, _tiny(3), None), await first

    results = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert all(
        r.learners == ("a", "b") and torch.equal(r.state.params["w"], torch.full((4,), 2.0)) for r in results
    )


def test_actor_checkpoint_survives_save_and_load_and_restores(tmp_path):
    """checkpoint_contents() saved by the checkpoint module loads with weights_only=True (its file is
    plain tensors and numbers) and a restored averager resumes from it, histories included."""

    async def scenario():
        averager = local_averager(2, timeout_s=30.0, validate_every=1, batch_size=4)
        for learner in "ab":
            await averager.join(learner)
        await asyncio.gather(*(averager.average(n, 1, 2, _tiny(k + 1), None) for k, n in enumerate("ab")))
        await averager.report_validation(1, 0.3)
        state, history = await averager.checkpoint_contents()
        folder = checkpoint.save(
            tmp_path / checkpoint.folder_name(state.round), state=state, history=history.as_dict()
        )
        torch.load(folder / checkpoint.STATE_FILE, weights_only=True)  # plain types only
        restarted = local_averager(2, timeout_s=30.0, validate_every=1, batch_size=4)
        await restarted.restore(checkpoint.load(folder))
        return await restarted.join("b"), await restarted.summary()

    joined, summary = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert (joined.next_round, joined.state.round) == (2, 1)
    assert torch.equal(joined.state.params["w"], torch.full((4,), 1.5))
    assert joined.state.adaptive_state["best"] == 0.3 and joined.state.source == "checkpoint"
    assert summary.validation_history[0]["accuracy"] == 0.3


def _tallies(correct: int, sequences: int = 10, label: int = 0) -> dict:
    return {"correct": correct, "sequences": sequences, "per_class": {str(label): [correct, sequences]},
            "top5_correct": sequences, "confusion": {f"{label},{label}": correct}}  # fmt: skip


def test_learners_validation_shares_sum_exactly_and_a_missing_one_costs_no_wait():
    """Without an evaluator a validation round's result asks the learners to validate; their shares'
    tallies are summed exactly (EvalResult.combine: 7 + 2 of 10 + 5 sequences, two classes) into the
    round's validation, which decides B for the round after next; a share that never comes makes the
    next round close at once (timeout 30 s) with the validation recorded as missed."""

    async def scenario():
        averager = local_averager(2, timeout_s=30.0, validate_every=1, batch_size=4, b1=1.0)
        for name in "ab":
            await averager.join(name, 2, incarnation=name)
        first = await asyncio.gather(*(averager.average(n, 1, 2, _tiny(1), None) for n in "ab"))
        taken = [
            await averager.report_validation_share("a", 1, _tallies(7, 10, 0), 2, epoch=0),
            await averager.report_validation_share("b", 1, _tallies(2, 5, 1), 2, epoch=0),
            await averager.report_validation_share("b", 7, _tallies(2, 5, 1), 2, epoch=0),  # not due
        ]
        second = await asyncio.gather(*(averager.average(n, 2, 2, _tiny(2), None) for n in "ab"))
        await averager.report_validation_share("a", 2, _tallies(1, 10, 0), 2, epoch=0)  # b's never comes
        began = time.monotonic()
        third = await asyncio.gather(*(averager.average(n, 3, 2, _tiny(3), None) for n in "ab"))
        return first, taken, second, third, time.monotonic() - began, await averager.summary()

    first, taken, second, third, waited, summary = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert all(r.validate for r in (*first, *second, *third)) and taken == [True, True, False]
    [one, two] = summary.validation_history
    assert (one["round"], one["accuracy"], one["missed"]) == (1, 9 / 15, False)
    assert one["mean_class_accuracy"] == pytest.approx((7 / 10 + 2 / 5) / 2)
    assert (two["round"], two["missed"]) == (2, True) and waited < 5.0
    assert {r.state.batch_size for r in third} == {4}


@pytest.mark.parametrize("restart", [False, True], ids=["resume", "ray-restart"])
@pytest.mark.parametrize("mode", ["learners", "evaluator"])
def test_a_restored_due_validation_is_scored_or_missed_but_never_waited_for(tmp_path, mode, restart):
    """A checkpoint taken while round 1's validation was due (the run stopped, or Ray restarts the
    averager, before anyone reported it): with learners validating, the joining learners are asked to
    score it (``JoinReply.validate``); with an evaluator, it scores the restored state at the join. Either
    way the next round does not wait the timeout (30 s) for a validation nobody runs: learners that do not
    report make it a missed one at once."""

    class Evaluator:
        def __init__(self):
            self.rounds = []

        async def __call__(self, state):
            self.rounds.append(state.round)
            return {"accuracy": 0.5, "sequences": 10, "top5_accuracy": 1.0, "mean_class_accuracy": 0.5}

    evaluator = Evaluator() if mode == "evaluator" else None
    options = {"timeout_s": 30.0, "validate_every": 1, "batch_size": 4, "run_dir": tmp_path}
    if restart:
        options["actor_id"] = lambda: "actor-1"  # Ray keeps an actor's id over its restarts

    async def scenario():
        first = local_averager(2, **options)
        for name in "ab":
            await first.join(name, 2, incarnation=name)
        await asyncio.gather(*(first.average(n, 1, 2, _tiny(1), None) for n in "ab"))
        state, history = await first.checkpoint_contents()
        assert history.validation_due == 1  # nobody reported it before the stop
        checkpoint.save(tmp_path / checkpoint.folder_name(1), state=state, history=history.as_dict())
        again = local_averager(2, **options, validator=evaluator)
        joins = [await again.join(n, 2, incarnation=f"{n}2") for n in "ab"]
        began = time.monotonic()
        second = await asyncio.gather(*(again.average(n, 2, 2, _tiny(2), None) for n in "ab"))
        return joins, second, time.monotonic() - began, await again.summary()

    joins, second, waited, summary = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert waited < 5.0 and [r.state.round for r in second] == [2, 2]
    [restored] = [v for v in summary.validation_history if v["round"] == 1]
    if mode == "learners":
        assert [j.validate for j in joins] == [True, True]  # asked; these fakes do not report it
        assert restored["missed"]
    else:
        assert [j.validate for j in joins] == [False, False] and evaluator.rounds[0] == 1
        assert (restored["accuracy"], restored["missed"]) == (0.5, False)


# ------------------------------------------------------------------------------- the actor on local ray
# tests/conftest.py's ray_cluster: 2 CPUs (the default), actor logs kept out of the test output.
RAY_CLUSTER = {"log_to_driver": False}


@pytest.fixture(scope="module")
def averagers(ray_cluster):
    """One fresh actor per test (timeout 1 s, learners a, b, c joined), all started at once to save time."""
    from raytrain_seq.rounds.settings import AveragerSettings
    from raytrain_seq.runtime.averager import create_averager

    configs = {
        "reference": {},
        "drop": {},
        "timeout": {"min_learners": 2},
        # steps: the paper's budget, under which B may grow (batch_growth "steps", the default)
        "validation": {"validate_every": 1, "batch_size": 4, "steps": 1000},
    }
    actors = {
        name: create_averager(f"avg-{name}", AveragerSettings(world_size=3, timeout_s=1.0, **kw))
        for name, kw in configs.items()
    }
    ray_cluster.get([actor.join.remote(learner) for actor in actors.values() for learner in LEARNERS])
    yield actors
    for actor in actors.values():
        ray_cluster.kill(actor)


def _adam_runs(steps: int = 3) -> tuple[list[dict], list[dict]]:
    """Three learners of a 5-channel BatchNorm model (conftest.adam_learners)."""
    return adam_learners(3, width=5, steps=steps)


@pytest.mark.ray
def test_ray_round_equals_single_process_reference(ray_cluster, averagers):
    """3 concurrent learners all get the same params and Adam state as average_states/merge_adam_states."""
    ray = ray_cluster
    actor = averagers["reference"]
    params, opt_states = _adam_runs()
    weights = [30.0, 50.0, 20.0]  # e.g. samples seen
    assert not torch.equal(params[0]["0.weight"], params[1]["0.weight"])  # the learners really differ
    refs = [
        actor.average.remote(name, 1, 3, params[j], opt_states[j], {"frames": 10.0 * (j + 1)}, weights[j])
        for j, name in enumerate(LEARNERS)
    ]
    results = ray.get(refs, timeout=60)
    expected = average_states(params, weights)
    expected_opt = merge_adam_states(opt_states, weights=weights)
    for result in results:
        state = result.state
        assert state.round == 1 and result.learners == tuple(LEARNERS) and result.dropped == ()
        assert state.params.keys() == expected.keys()
        assert all(torch.equal(state.params[k], expected[k]) for k in expected)
        assert state.optimizer_state.keys() == expected_opt.keys()
        for index, entry in expected_opt.items():
            assert all(torch.equal(state.optimizer_state[index][k], v) for k, v in entry.items())
    # Not vacuous: the weighted mean is none of the inputs and not the unweighted mean.
    plain = average_states(params)["0.weight"]
    assert not torch.equal(expected["0.weight"], plain)
    assert not any(torch.equal(expected["0.weight"], p["0.weight"]) for p in params)
    summary = ray.get(actor.summary.remote())
    assert [summary.learners[name]["frames"] for name in LEARNERS] == [10.0, 20.0, 30.0]
    assert summary.rounds_completed == 1


@pytest.mark.ray
def test_ray_a_round_closes_without_a_stopped_learner_and_waits_for_one_that_answers(ray_cluster):
    """probe_s: a learner whose process is stopped (SIGSTOP) is dropped a few probes after the first
    arrival; one whose process answers is waited for until the deadline, as without probes."""
    ray = ray_cluster
    from raytrain_seq.rounds.settings import AveragerSettings
    from raytrain_seq.runtime.averager import create_averager
    from raytrain_seq.runtime.probes import handle_bytes

    @ray.remote(num_cpus=0)
    class Process:
        def pid(self) -> int:
            return os.getpid()

    processes = [Process.remote() for _ in range(2)]
    pid = ray.get(processes[1].pid.remote())
    params, opt_states = _adam_runs()
    waited, reasons = {}, {}
    for stopped in (True, False):
        settings = AveragerSettings(world_size=2, timeout_s=4.0, probe_s=0.2)
        actor = create_averager(f"avg-probe-{stopped}", settings)
        # The stopped one's handle comes pickled, as a learner sends it (runtime.probes.handle_bytes).
        ray.get([actor.join.remote(0, 2, process=processes[0])])
        ray.get([actor.join.remote(1, 2, process=handle_bytes(processes[1]))])
        # The averager's process loads torch when a call first brings tensors (a flat round needs none):
        # loaded before the clock starts, so that what is timed is the probes.
        ray.get(actor.__ray_call__.remote(lambda self: bool(__import__("torch"))))
        if stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            result = ray.get(actor.average.remote(0, 1, 2, params[0], opt_states[0], {}, 1.0), timeout=60)
            waited[stopped] = time.monotonic() - began
        finally:
            if stopped:
                os.kill(pid, signal.SIGCONT)
        assert result.learners == (0,) and result.dropped == (1,)
        reasons[stopped] = ray.get(actor.summary.remote()).dropped[0]["reason"]
        ray.kill(actor)
    assert waited[True] < 2.0 <= 4.0 <= waited[False]
    assert "did not answer within 0.2 s" in reasons[True]
    assert reasons[False].startswith("did not send round 1 within 4 s")
    assert ray.get(processes[1].pid.remote(), timeout=30) == pid  # thawed, never restarted


@pytest.mark.ray
def test_ray_store_registers_with_cuda_only_in_an_actor_whose_mapping_lasts(ray_cluster):
    """RayStore(cuda=True) registers the store's mapping with CUDA in an actor's process (a Ray Train
    worker's) and not in the driver, which may shut Ray down and map a new store at the same addresses."""
    from raytrain_seq.runtime.ray_store import RayStore
    from raytrain_seq.runtime.store_memory import cuda_host_register

    def registers(cuda: bool) -> bool:
        return RayStore(cuda=cuda).memory.register is cuda_host_register

    @ray_cluster.remote(num_cpus=0)
    class Worker:
        def registers(self, cuda: bool) -> bool:
            return registers(cuda)

    worker = Worker.remote()
    try:
        in_actor = ray_cluster.get([worker.registers.remote(True), worker.registers.remote(False)])
        assert in_actor == [True, False]
        assert not registers(True) and not registers(False)  # the driver
    finally:
        ray_cluster.kill(worker)


def test_ray_store_names_slices_gone_with_their_owner():
    """Ray's ObjectLostError family (OwnerDiedError: the averager, which owns a round's merged slices,
    died before they were read) leaves RayStore.get as SlicesLost, which the learner's client turns
    into a rejoin, not a crash; other errors pass."""
    from ray.exceptions import GetTimeoutError, OwnerDiedError

    from raytrain_seq.dataplane.stores import SlicesLost
    from raytrain_seq.runtime.ray_store import RayStore

    def failing(error):
        def get(refs, timeout=None):
            raise error

        return get

    gone = OwnerDiedError("00" * 28, "192.0.2.2:41451", "")
    with pytest.raises(SlicesLost, match="OwnerDiedError") as raised:
        RayStore(timeout_s=30.0, get=failing(gone)).get(["ref"])
    assert raised.value.__cause__ is gone
    with pytest.raises(GetTimeoutError):
        RayStore(timeout_s=30.0, get=failing(GetTimeoutError("slow"))).get(["ref"])
    assert RayStore(get=lambda refs, timeout=None: [r.upper() for r in refs]).get(["a"]) == ["A"]


@pytest.mark.ray
def test_ray_sharded_rounds_equal_the_reference_and_survive_a_killed_shard(ray_cluster):
    """3 learners' flat payloads through the object store and 3 shard actors: every learner reads the
    reference state; each shard moves about one payload in and one out; a shard killed between rounds is
    restarted by Ray, and the next rounds are again the reference (shards hold no state to re-seed): the
    slice merged by the averager until it sees the restarted process up, then by the shard again. The
    averager learns it from its own readiness call, whose answer can come a round or two after the
    restarted process answers the test's (and a shard that lags its peers on a busy box is merged here
    too: ``HEDGE_S``): rounds go on, each the reference, until every shard merged one (bounded)."""
    from raytrain_seq.dataplane.payload import FlatLayout, FlatPayload
    from raytrain_seq.rounds.settings import AveragerSettings
    from raytrain_seq.runtime.averager import create_averager
    from raytrain_seq.runtime.ray_store import RayStore

    ray = ray_cluster
    actor = create_averager("avg-sharded", AveragerSettings(world_size=3, timeout_s=30.0))
    store = RayStore(timeout_s=60)
    try:
        replies = ray.get(
            [actor.join.remote(j, 3, node=ray.get_runtime_context().get_node_id()) for j in range(3)]
        )
        assert {reply.shards for reply in replies} == {3}  # one shard per learner by default
        params, opt_states = _adam_runs()
        weights = [30.0, 50.0, 20.0]
        expected = average_states(params, weights)
        expected_opt = merge_adam_states(opt_states, weights=weights)

        def round_(number: int) -> list:
            sends = []
            for j in range(3):
                layout = FlatLayout.of(params[j], opt_states[j])
                buffers, extras = layout.pack(params[j], opt_states[j])
                parts = tuple(store.put(part) for part in layout.split(buffers, 3))
                payload = FlatPayload(layout, parts, extras)
                sends.append(actor.average.remote(j, number, 3, payload, None, weight=weights[j]))
            return ray.get(sends, timeout=60)

        # Up before the rounds, so that they go through the shards (while their processes start the
        # averager merges a round itself: tests/test_shards_starting.py).
        ray.get([shard.__ray_ready__.remote() for shard in ray.get(actor.shard_actors.remote())], timeout=60)
        payload_bytes = FlatLayout.of(params[0], opt_states[0]).nbytes

        def last_load() -> dict:
            return ray.get(actor.summary.remote()).hub_load[-1]["actors"]

        number, deadline = 0, time.monotonic() + 30
        while number < 4 or not {"shard0", "shard1", "shard2"} <= set(last_load()):
            if number >= 4:
                assert time.monotonic() < deadline, "the averager never went back to the restarted shard"
                time.sleep(0.2)  # its readiness call's answer is on the way
            number += 1
            results = round_(number)
            assert len({tuple(r.state.flat.parts) for r in results}) == 1  # one object per shard for all
            for result in results:
                state = result.state.materialise(store.get)
                assert all(torch.equal(state.params[k], v) for k, v in expected.items())
                for index, entry in expected_opt.items():
                    assert all(torch.equal(state.optimizer_state[index][k], v) for k, v in entry.items())
            if number == 1:
                shards = ray.get(actor.shard_actors.remote())
                assert len(shards) == 3
                ray.kill(shards[0], no_restart=False)
            if number == 2:
                ray.get(shards[0].__ray_ready__.remote(), timeout=60)  # restarted before round 3
        summary = ray.get(actor.summary.remote())
        loads = summary.hub_load[-1]["actors"]
        assert set(loads) == {"control", "shard0", "shard1", "shard2"}  # every slice merged by its shard
        hub = max((a["received"] + a["sent"]) / payload_bytes for a in loads.values())
        assert 1.9 <= hub <= 2.1 and summary.shards == 3
    finally:
        ray.kill(actor)


@pytest.mark.ray
def test_ray_a_shards_next_merge_leaves_its_last_result_as_it_was(ray_cluster):
    """A shard writes each merge into the arrays of its last one (``merge_parts(reuse=...)``): the last
    round's merged slice, an object in the store (1.2 MB: not inlined in the reply), must still read as
    that round's merge once the next round, of other weights, has been merged."""
    from raytrain_seq.dataplane.merge import merge_parts
    from raytrain_seq.runtime.averaging_shard import AveragingShard

    ray = ray_cluster
    rng = np.random.default_rng(0)
    parts = [{"mean/float32": rng.standard_normal(300_000, dtype=np.float32)} for _ in range(2)]
    refs = [ray.put(part) for part in parts]
    shard = ray.remote(AveragingShard).options(num_cpus=0).remote(0)
    try:
        first, _ = shard.merge.options(num_returns=2).remote(1, refs, [1.0, 3.0], 2, 30.0)
        second, _ = shard.merge.options(num_returns=2).remote(2, refs, [3.0, 1.0], 2, 30.0)
        got_second, got_first = ray.get(second)["mean/float32"], ray.get(first)["mean/float32"]
        assert np.array_equal(got_first, merge_parts(parts, [1.0, 3.0])["mean/float32"])
        assert np.array_equal(got_second, merge_parts(parts, [3.0, 1.0])["mean/float32"])
        assert not np.array_equal(got_first, got_second)  # not vacuous: the two rounds differ
    finally:
        ray.kill(shard)


@pytest.mark.ray
def test_ray_store_memory_finds_this_workers_store_mapping(ray_cluster):
    """In a process connected to Ray, StoreMemory finds the object store's shared mapping (about the
    store's size) and populates it; only its first 4 MiB for real here, so the test commits no GBs."""
    from raytrain_seq.runtime.store_memory import StoreMemory, populate, store_mappings

    store_bytes = ray_cluster.cluster_resources()["object_store_memory"]
    mappings = store_mappings(Path("/proc/self/maps").read_text())
    assert mappings, "no plasma mapping in a process connected to Ray: store_mappings misses Ray's name"
    size = sum(end - start for start, end in mappings)
    assert size >= 0.9 * store_bytes
    calls = []

    def first_for_real(start: int, length: int) -> None:
        if not calls:
            populate(start, 4 << 20)  # the store's own pages: raises if the kernel refuses
        calls.append(length)

    memory = StoreMemory(populate=first_for_real)
    assert memory.expect(int(store_bytes)) is True  # one round of the store's size covers it
    assert memory.wait(60) is not None and memory.error is None and sum(calls) == size
    assert memory.expect(1) is True  # decided once


@pytest.mark.ray
def test_ray_missing_learner_is_dropped_then_rejoins(ray_cluster, averagers):
    """A learner that never comes is dropped after the timeout; late, it gets StaleRoundError, then join()."""
    ray = ray_cluster
    actor = averagers["drop"]
    start = time.monotonic()
    results = ray.get(
        [actor.average.remote(name, 1, 3, _tiny(k), None) for k, name in enumerate("ab")]
    )  # 0, 1
    elapsed = time.monotonic() - start
    assert 0.9 < elapsed < 10, elapsed
    for result in results:
        assert result.dropped == ("c",) and result.learners == ("a", "b")
        assert result.state.optimizer_state is None
        assert torch.equal(result.state.params["w"], torch.full((4,), 0.5))
    [record] = ray.get(actor.summary.remote()).dropped
    assert record["learner"] == "c" and "did not send round 1 within 1 s" in record["reason"]
    with pytest.raises(StaleRoundError) as info:
        ray.get(actor.average.remote("c", 1, 3, _tiny(9.0), None))
    err = info.value
    assert isinstance(err, ray.exceptions.RayTaskError) and isinstance(err.cause, StaleRoundError)
    assert (err.learner, err.sent_round, err.expected_round) == ("c", 1, 2) and "'c'" in str(err)
    joined = ray.get(actor.join.remote("c"))
    assert joined.next_round == 2 and torch.equal(joined.state.params["w"], results[0].state.params["w"])


@pytest.mark.ray
def test_ray_too_few_learners_raise_averaging_timeout(ray_cluster, averagers):
    """With min_learners=2, a round that only 1 of 3 reaches fails with the two missing listed."""
    ray = ray_cluster
    actor = averagers["timeout"]
    with pytest.raises(AveragingTimeoutError) as info:
        ray.get(actor.average.remote("b", 1, 3, _tiny(1.0), None), timeout=30)
    assert (info.value.cause.missing, info.value.cause.arrived, info.value.round) == (("a", "c"), ("b",), 1)
    assert ray.get(actor.latest.remote()).round == 0  # nothing was averaged


@pytest.mark.ray
def test_ray_validation_grows_batch_size_identically(ray_cluster, averagers):
    """Without an evaluator the learners validate: each validation round's result asks them to, each
    sends its share's tallies before its next round, and B grows by b2 in the result after the validation
    that asks for it, for every learner alike. A share that never comes costs no wait: the next round
    closes at once and records the validation as missed."""
    ray = ray_cluster
    actor = averagers["validation"]

    def tallies(correct: int) -> dict:
        return {"correct": correct, "sequences": 10, "per_class": {"0": [correct, 10]}, "top5_correct": 10}

    def round_(n, shares=None):
        if shares is not None:  # each learner's share of round n - 1's validation, before round n
            taken = [
                actor.report_validation_share.remote(name, n - 1, tallies(c), 3)
                for name, c in zip(LEARNERS, shares, strict=False)
            ]
            assert ray.get(taken) == [True] * len(shares)
        refs = [actor.average.remote(name, n, 3, _tiny(n + k), None) for k, name in enumerate(LEARNERS)]
        results = ray.get(refs, timeout=30)
        assert all(r.validate for r in results)  # validate_every=1: every round's state is validated
        return {r.state.batch_size for r in results}

    assert round_(1) == {4}
    assert round_(2, shares=[5, 5, 5]) == {4}  # a* = 0.5: no growth
    assert round_(3, shares=[4, 4, 4]) == {8}  # 0.4 < a* * b1: B doubles in the very next result
    start = time.monotonic()
    assert round_(4, shares=[4, 4]) == {8}  # one share of round 3's never comes: B kept, nobody waits
    assert time.monotonic() - start < 0.9  # the round's timeout is 1 s: it was not waited for
    history = ray.get(actor.summary.remote()).validation_history
    assert [(v["round"], v["batch_size"], v["missed"]) for v in history] == [
        (1, 4, False),
        (2, 8, False),
        (3, 8, True),
    ]
