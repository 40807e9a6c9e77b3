"""The averager's asyncio parts, without Ray: the test pass (``rounds.test_pass``), the validation schedule
(``rounds.validation_schedule``), the channel session (``dataplane.channel_session``) and the hub load
(``dataplane.hub_load``) and the round merge (``rounds.merging``), each built with fakes through its constructor."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from conftest import adam_learners
from test_payload import same

from raytrain_seq.averaging import average_states, merge_adam_states
from raytrain_seq.dataplane.channel_session import ChannelSession
from raytrain_seq.dataplane.generations import ChannelBook, Channelled, Link
from raytrain_seq.dataplane.hub_load import HubLoad, tensor_bytes
from raytrain_seq.dataplane.payload import FlatLayout, FlatPayload, InProcessShards, InProcessStore
from raytrain_seq.rounds.book import RoundBook
from raytrain_seq.rounds.events import RunHistory
from raytrain_seq.rounds.merging import RoundMerge
from raytrain_seq.rounds.settings import AveragerSettings
from raytrain_seq.rounds.state import AveragedState, RoundResult, check_payload
from raytrain_seq.rounds.test_pass import TestPass
from raytrain_seq.rounds.validation import ValidationGate
from raytrain_seq.rounds.validation_schedule import ValidationSchedule


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
    assert first == second and first["correct"] == 3 and first["sequences"] == 4 and first["learners"] == 2
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
    assert alone["learners"] == 1 and alone["correct"] == 1 and not over  # summed without the other
    assert again["correct"] == 2 and again["learners"] == 1 and tests.tested.is_set()  # its share replaced
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


# ---------------------------------------------------------------------------------- validation schedule
class _Validator:
    def __init__(self, accuracy: float | None) -> None:
        self.accuracy, self.scored = accuracy, []

    async def __call__(self, state):
        self.scored.append(state.round)
        if self.accuracy is None:
            raise RuntimeError("no rows")
        return {"accuracy": self.accuracy, "sequences": 10, "top5_accuracy": 1.0, "mean_class_accuracy": 0.5}


def _schedule(validator, *, state=None, validate_every=1, tested=None):
    settings = AveragerSettings(world_size=1, batch_size=4, validate_every=validate_every, timeout_s=0.5)
    book = RoundBook(1, timeout_s=0.5, min_learners=1, validate_every=validate_every)
    gate = ValidationGate(settings, by_learners=validator is None)
    history = RunHistory(None)
    tasks = []

    def spawn(coro):
        task = asyncio.get_running_loop().create_task(coro)
        tasks.append(task)
        return task

    schedule = ValidationSchedule(
        validator,
        book=book,
        gate=gate,
        history=history,
        end=None,
        tested=tested or asyncio.Event(),
        spawn=spawn,
        latest=lambda: state,
        local_copy=lambda: None,
        rows_cap=lambda: 100,
    )
    return schedule, book, history, tasks


def _result(round_: int) -> RoundResult:
    state = AveragedState(round=round_, params={"w": torch.zeros(1)}, batch_size=4, source="live")
    return RoundResult(state=state, learners=(0,), dropped=(), seconds=0.0, weights=(1.0,))


def test_the_evaluator_scores_a_due_round_and_the_next_round_waits_for_its_report():
    async def rounds():
        validator = _Validator(0.75)
        schedule, book, history, tasks = _schedule(validator)
        book.restore(1, 1)  # round 1 closed, its validation due
        result = schedule.after_round(_result(1))
        assert result.validate is False and schedule.future is not None  # the evaluator scores it
        await asyncio.gather(*tasks)
        await schedule.await_due()  # reported: nothing left to wait for
        return validator, book, history

    validator, book, history = _run(rounds())
    assert validator.scored == [1] and book.validation_due is None
    assert [v["accuracy"] for v in history.validation_history] == [0.75]


def test_without_a_validator_the_learners_are_asked_and_missing_shares_miss_it_at_once():
    async def rounds():
        schedule, book, history, _ = _schedule(None)
        book.restore(1, 1)
        result = schedule.after_round(_result(1))
        await schedule.await_due()  # no share came before the next round: missed, nothing waits
        return result, book, history

    result, book, history = _run(rounds())
    assert result.validate is True and book.validation_due is None
    assert history.validation_history[-1]["missed"] and history.validation_history[-1]["round"] == 1


def test_a_failed_evaluation_is_a_missed_validation_and_settle_does_not_raise():
    async def rounds():
        schedule, book, history, tasks = _schedule(_Validator(None))
        book.restore(1, 1)
        schedule.after_round(_result(1))
        await asyncio.gather(*tasks)
        await schedule.settle()  # logs what the summary lacks
        await schedule.await_due()
        return book, history

    book, history = _run(rounds())
    assert book.validation_due is None and history.validation_history[-1]["missed"]


def test_a_restored_due_validation_is_scored_by_the_evaluator_when_it_holds_that_state():
    state = _result(3).state
    checked = dataclasses.replace(state, round=3)

    async def joined():
        validator = _Validator(0.5)
        schedule, book, _, tasks = _schedule(validator, state=checked)
        book.restore(3, 3)
        asked = schedule.on_join(state)
        await asyncio.gather(*tasks)
        return asked, validator, book

    asked, validator, book = _run(joined())
    assert asked is False and validator.scored == [3] and book.validation_due is None


# ------------------------------------------------------------------------------------- channel session
class _Pool:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.opened = fail, []

    async def targets(self):
        return [("shard0", "node0")]

    async def open_channels(self, generation, inputs, readers, nbytes):
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


def test_round_merge_of_tensors_and_of_flat_slices_equals_the_library_mean():
    params, moments = adam_learners(2, width=6)
    weights = [1.0, 2.0]
    expected = average_states(params, weights)
    expected_moments = merge_adam_states(moments, weights=weights)
    settings = AveragerSettings(world_size=2, batch_size=4, shards=2)
    store = InProcessStore()

    def flat(p, m):
        layout = FlatLayout.of(p, m)
        buffers, extras = layout.pack(p, m)
        return FlatPayload(layout, tuple(store.put(s) for s in layout.split(buffers, 2)), extras), None

    async def both():
        loads = HubLoad()
        book, closed = _closed_round(params, moments, lambda p, m: (p, m))
        merge = RoundMerge(
            settings, pool=InProcessShards(2), book=book, channels=_session(_Pool()), loads=loads
        )
        arrivals = [arrival for _, arrival in closed.present]
        tensors = merge.tensors(arrivals, [a.weight for a in arrivals])
        book, closed = _closed_round(params, moments, flat)
        merge = RoundMerge(
            settings, pool=InProcessShards(2), book=book, channels=_session(_Pool()), loads=loads
        )
        _, merged = await merge.flat(closed)
        return tensors, merged, loads

    (mean, mean_moments), merged, loads = _run(both())
    assert same(mean, expected) and same(mean_moments, expected_moments)
    state = AveragedState(round=1, flat=merged, batch_size=4).materialise(store.get)
    assert same(state.params, expected) and same(state.optimizer_state, expected_moments)
    assert {"shard0", "shard1"} <= set(loads.as_list()[-1]["actors"])  # each shard's bytes recorded
