"""Rows of a learner dropped from averaged rounds are trained again by the group, without a cluster.

Contract pinned (issue 16): whatever learners are left out of averaged rounds (a stall past the timeout,
a node lost before Ray Train replaced the group) and whatever group changes follow, the rows that reach
averaged rounds over an epoch are exactly the epoch's plan, each block once. ``settle`` records the rows
of the ranks absent from a round as missed; the layout's end deals them again in a make-up layout; a
group change re-splits them with the unreached rows. A single-process reference run drives the pure
functions the averager and the learners use (``settle``, ``for_group``, ``layout_specs``) and counts the
blocks of the averaged rounds only; the same run without the missed ranges falls short (not vacuous).
The averager wires ``settle`` into its rounds: a round that times out on a learner leaves the missed
range in the averaged position, and the layout's last round starts the make-up layout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter

import numpy as np
import pytest
import torch
from averager_fixtures import local_averager

from raytrain_seq.algorithms.packing import pack
from raytrain_seq.rounds.position import EpochPosition, layout_specs, parse_history, resplit, settle
from raytrain_seq.rows.assembly import plan_specs


def _plan(n: int = 61, seed: int = 7):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 60, size=n)
    plan = pack(lengths, 64, seed=seed)
    ids, labels = (np.arange(n) + 1000).tolist(), (np.arange(n) % 4).tolist()
    fresh = rng.random(n) < 0.4  # drawn once: every process deals the same plan the same way
    return plan, lambda w: plan_specs(plan, w, ids, labels, fresh)


def _keys(blocks) -> list[tuple]:
    return [(b.ids, b.offsets) for b in blocks if b.ids]


def _reference_epoch(split, world: int, k: int, absent: dict, regroup: dict, record_missed: bool = True):
    """One epoch of the protocol in one process: every round each learner of the layout takes its next
    ``k`` rows; the ranks ``absent[round]`` are left out of that averaged round (their rows count for
    nothing); ``regroup[round]`` = w restarts the group with w learners from the averaged position after
    that round. Returns the blocks the averaged rounds hold, the layouts run and the rounds."""
    averaged, previous = [], None
    position = EpochPosition(0).for_group(world)
    layouts, round_ = [], 0
    while position.epoch == 0:
        specs = layout_specs(split, position.history, position.world_size)
        shard_rows = len(specs[0])
        layouts.append((len(position.history), position.world_size, shard_rows))
        if position.rows_done >= shard_rows:  # an empty make-up layout: the epoch ends without a round
            break
        round_ += 1
        first, end = position.rows_done, min(position.rows_done + k, shard_rows)
        present = [r for r in range(position.world_size) if r not in absent.get(round_, ())]
        for rank in present:
            averaged += _keys(specs[rank][first:end])
        sent = position.after(end)
        if not record_missed:
            present = range(position.world_size)  # the protocol before the fix: absent rows forgotten
        previous = settle(sent, previous, present, shard_rows)
        # The ranks absent from a regrouping round were lost: their blocks come last (resplit's gone).
        gone = absent.get(round_, ()) if round_ in regroup else ()
        position = previous.for_group(regroup.get(round_, position.world_size), gone)
    return averaged, layouts, round_


@pytest.mark.parametrize(
    ("world", "k", "absent", "regroup"),
    [
        (2, 3, {2: {1}, 3: {1}}, {}),  # a stall: rank 1 out of rounds 2-3, then realigned
        (3, 2, {4: {2}}, {4: 2}),  # a node lost: round 4 times out on rank 2, the group restarts with 2
        (2, 2, {1: {0}, 5: {2}}, {3: 3}),  # a drop, the group grows to 3, a drop in the new layout
        (2, 2, {7: {1}, 8: {0}, 10: {1}}, {}),  # drops at the layout's end and inside its make-up layout
    ],
)
def test_reference_run_with_drops_trains_every_block_of_the_plan_once(world, k, absent, regroup):
    plan, split = _plan()
    averaged, _, rounds = _reference_epoch(split, world, k, absent, regroup)
    expected = Counter(_keys(b for shard in split(1) for b in shard))
    assert len(expected) == len(plan.blocks)
    assert Counter(averaged) == expected, "a block was lost or averaged twice"
    assert max(absent) <= rounds, "a scheduled drop fell after the epoch: the case tests nothing"
    # Not vacuous: without the missed ranges the same run falls short by the absent learners' rows.
    naive, _, _ = _reference_epoch(split, world, k, absent, regroup, record_missed=False)
    assert sum(Counter(naive).values()) < sum(expected.values())


def test_a_rank_absent_round_after_round_does_not_hold_the_others_in_make_up_layouts():
    """Rank 0 stalled from round 3 on: the others make its rows up and the epoch ends. The make-up layouts
    deal from a turning rank; from rank 0 each time, its lone last missed block went back to it in every
    make-up layout, and rank 1 stepped on fillers until rank 0 came back (a soak's stall did so)."""
    _, split = _plan(n=30, seed=2)
    long_stall = {round_: {0} for round_ in range(3, 200)}  # rank 0 back only at round 200
    averaged, layouts, rounds = _reference_epoch(split, 2, 2, long_stall, {})
    assert Counter(averaged) == Counter(_keys(b for s in split(1) for b in s))
    assert rounds < 50, f"the epoch took {rounds} rounds: rank 1 waited out rank 0's stall"
    assert len({depth for depth, _, _ in layouts}) > 2  # not vacuous: make-up layouts were dealt


def test_drop_in_a_layouts_last_round_makes_the_rows_up_in_a_make_up_layout():
    """Rank 1 left out of the last round of a 2-learner layout: the layout closes into a make-up layout
    of the same group dealing its rows; a drop inside the make-up layout makes another; then epoch 1."""
    _, split = _plan(n=30, seed=2)
    shard_rows = len(split(2)[0])
    last = -(-shard_rows // 3)  # the round that takes the last rows with k = 3
    averaged, layouts, _ = _reference_epoch(split, 2, 3, {last: {1}, last + 1: {0}}, {})
    assert Counter(averaged) == Counter(_keys(b for s in split(1) for b in s))
    # The first layout, then a make-up layout (history 1), then a make-up of the make-up (history 2).
    assert list(dict.fromkeys((depth, w) for depth, w, _ in layouts)) == [(0, 2), (1, 2), (2, 2)]


def test_settle_records_the_absent_ranks_rows_and_closes_the_layout():
    """The worked example of ``settle``: rows 4-6 of rank 1 missed, the layout's end makes them up."""
    previous = EpochPosition(3, (), 2, 4, steps=8)
    mid = settle(EpochPosition(3, (), 2, 6, steps=10), previous, [0], shard_rows=8)
    assert mid == EpochPosition(3, (), 2, 6, steps=10, missed=((1, 4, 6),))
    end = settle(EpochPosition(3, (), 2, 8, steps=12), mid, [0, 1], shard_rows=8)
    assert end == EpochPosition(3, ((2, 8, ((1, 4, 6),)),), 2, 0, steps=12)
    # Nothing missed: the layout's end is the next epoch; a new layout's first round counts from row 0.
    assert settle(EpochPosition(3, (), 2, 8, steps=12), previous, [0, 1], 8) == EpochPosition(4, steps=12)
    fresh = settle(EpochPosition(4, (), 3, 2), EpochPosition(4), [0, 2], shard_rows=9)
    assert fresh.missed == ((1, 0, 2),)
    # A group change carries the missed rows into the history, where the re-split deals them.
    moved = mid.for_group(3)
    assert moved == EpochPosition(3, ((2, 6, ((1, 4, 6),)),), 3, 0, steps=10)
    assert EpochPosition.from_dict(json.loads(json.dumps(moved.as_dict()))) == moved
    assert EpochPosition.from_dict(json.loads(json.dumps(mid.as_dict()))) == mid


def test_resplit_deals_the_missed_blocks_again_and_refuses_ranges_outside_the_layout():
    _, split = _plan(n=40, seed=4)
    specs = split(2)
    out = resplit(specs, 4, 2, missed=((0, 1, 3),))
    dealt = Counter(k for s in out for k in _keys(s))
    assert dealt == Counter(_keys(specs[0][1:3]) + _keys(b for s in specs for b in s[4:]))
    with pytest.raises(ValueError, match="missed ranges"):
        resplit(specs, 4, 2, missed=((2, 0, 1),))
    with pytest.raises(ValueError, match="missed ranges"):
        resplit(specs, 4, 2, missed=((0, 3, 6),))
    with pytest.raises(ValueError, match="history entry"):
        parse_history([[2, 4, [[5, 0, 1]]]])
    with pytest.raises(ValueError, match="epoch position"):
        EpochPosition.from_dict({"epoch": 0, "world_size": 2, "rows_done": 3, "missed": [[1, 2, 5]]})


def _tiny(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2,), value)}


def test_averager_settles_a_round_that_dropped_a_learner_and_starts_the_make_up_layout():
    """Learner 1 misses round 2 (timed out): the averaged position records its rows 2-4 as missed; the
    layout's last round (rows 8 of 8) answers with the make-up layout, whose shards deal those rows."""

    async def scenario():
        averager = local_averager(2, timeout_s=0.3, batch_size=2, adaptive_batch=False)
        for rank in range(2):
            await averager.join(rank, 2, incarnation=f"p{rank}")

        def at(rows: int) -> dict:
            return EpochPosition(0, (), 2, rows, steps=rows // 2).as_dict()

        sends = [averager.average(r, 1, 2, _tiny(r), None, position=at(2), rows=8) for r in range(2)]
        await asyncio.gather(*sends)
        second = await averager.average(0, 2, 2, _tiny(0), None, position=at(4), rows=8)
        await averager.join(1, 2, incarnation="p1")  # it rejoins (a realignment) and sends round 3 on
        await asyncio.gather(
            *(averager.average(r, 3, 2, _tiny(r), None, position=at(6), rows=8) for r in (0, 1))
        )
        last = await asyncio.gather(
            *(averager.average(r, 4, 2, _tiny(r), None, position=at(8), rows=8) for r in (0, 1))
        )
        return second, last[0]

    second, last = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert second.dropped == (1,)
    assert EpochPosition.from_dict(second.state.position).missed == ((1, 2, 4),)
    make_up = EpochPosition.from_dict(last.state.position)
    assert make_up == EpochPosition(0, ((2, 8, ((1, 2, 4),)),), 2, 0, steps=4)
    _, split = _plan(n=30, seed=1)
    dealt = layout_specs(split, make_up.history, 2)
    # Rank 1's missed rows 2-4, with the rows past 8 (this plan's shards are longer than the 8 sent).
    again = _keys(split(2)[1][2:4]) + _keys(b for s in split(2) for b in s[8:])
    assert Counter(k for s in dealt for k in _keys(s)) == Counter(again)
    assert dataclasses.replace(make_up, history=()).close_layout() == EpochPosition(1, steps=4)


def test_training_ends_at_the_epoch_count_or_the_step_count_not_before_a_make_up_layout():
    """EpochPosition.ends_training, which the learners' loop and the averager (its last round's
    validation) both ask: 2 epochs end at epoch 2's start, not at epoch 1's last row nor while a make-up
    layout of a dropped learner's rows is still to deal; train.steps ends at that step count anywhere."""
    last_row = EpochPosition(1, (), 2, 8, steps=8)
    assert not last_row.ends_training(epochs=2)
    assert last_row.close_layout().ends_training(epochs=2)  # nothing missed: the next epoch's start
    missed = dataclasses.replace(last_row, missed=((1, 4, 8),))
    assert not missed.close_layout().ends_training(epochs=2)  # a make-up layout of epoch 1 comes first
    assert EpochPosition(0, (), 2, 3, steps=5).ends_training(epochs=2, steps=5)
    assert not EpochPosition(3, steps=4).ends_training(epochs=2, steps=5)  # steps rule, not epochs
