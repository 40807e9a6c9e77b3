"""While a new shard's process starts, ``RayShards.merge`` merges the round in the control plane.

A restarted averager's shards, or a lost node's replacements, take a process start (seconds on a busy
node) before they answer; a round's learners would wait that long. The control plane merges such a round
itself with the shards' own ``merge_parts``: the same bits, the slices named unreadable as a shard names
them (lost, forgotten, or not readable within the round's timeout), the bytes counted as the control
actor's in ``hub_load``. Once every shard is up, merges go to the shards again; a round over
``here_max_bytes`` always does.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from conftest import adam_learners

from raytrain_seq.dataplane.hub_load import HubLoad
from raytrain_seq.dataplane.merge import ShardMerge
from raytrain_seq.dataplane.payload import FlatLayout, FlatPayload
from raytrain_seq.runtime.fleet import LEARNER_ENV
from raytrain_seq.runtime.shards import RayShards, ShardNames

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


def _payloads(shards: int) -> list[FlatPayload]:
    params, moments = adam_learners(2, width=6)
    out = []
    for p, m in zip(params, moments, strict=True):
        layout = FlatLayout.of(p, m)
        buffers, extras = layout.pack(p, m)
        out.append(FlatPayload(layout, tuple(ray.put(s) for s in layout.split(buffers, shards)), extras))
    return out


def test_prepare_starts_the_actors_once_while_the_caller_goes_on(ray_cluster):
    """``prepare`` starts the actors on a thread of its own (a restarted averager's constructor returns
    and takes the joins meanwhile); two prepares and a caller that needs the shards at once share one
    set of actors, all up."""
    pool = RayShards(2)
    pool.prepare()
    pool.prepare()
    handles = pool.handles()  # waits for the start under way, starts nothing more
    assert len(handles) == 2 and pool.handles() is handles
    assert all(isinstance(node, str) for node in ray.get([h.node.remote() for h in handles], timeout=60))


def test_a_round_merged_while_the_shards_start_is_merged_here_to_the_bits_the_shards_give(ray_cluster):
    payloads = _payloads(2)
    pool = RayShards(2, here_max_bytes=sum(p.layout.nbytes for p in payloads))  # just fits

    async def both():
        pool.prepare()  # the shards' processes start now: the first merge does not wait for them
        here = await pool.merge(1, payloads, [1.0, 2.0], timeout_s=30.0)
        await asyncio.wait_for(asyncio.gather(*(h.__ray_ready__.remote() for h in pool.handles())), 60)
        there = await pool.merge(2, payloads, [1.0, 2.0], timeout_s=30.0)
        return here, there

    here, there = asyncio.run(both())
    assert [load.get("here") for load in here.loads] == [True, True]
    assert not any(load.get("here") for load in there.loads)  # up: the shards merge again
    for mine, theirs in zip(ray.get(list(here.parts)), ray.get(list(there.parts)), strict=True):
        assert mine.keys() == theirs.keys() and mine  # the same buffers, not empty
        assert all(np.array_equal(mine[k], theirs[k]) for k in mine)
    loads = HubLoad()
    loads.record(1, here.loads)
    actors = loads.as_list()[-1]["actors"]
    assert set(actors) == {"control"} and actors["control"]["received"] == sum(
        load["received"] for load in here.loads
    )


def test_a_slice_lost_forgotten_or_late_while_the_shards_start_is_named_unreadable(ray_cluster):
    """Learner 1's slice never comes (a call that does not return): forgotten, the merge ends at once;
    not forgotten, it ends at the round's timeout; either way learner 1 is named, as a shard names it."""

    @ray.remote(num_cpus=0)
    class Never:
        def slice(self) -> None:
            time.sleep(120)

    pool = RayShards(1)
    good = _payloads(1)[0]
    never = FlatPayload(good.layout, (Never.remote().slice.remote(),), good.extras)

    async def merges():
        pool.prepare()
        began = time.monotonic()
        forgotten = asyncio.ensure_future(pool.merge(7, [good, never], [1.0, 1.0], timeout_s=60.0))
        late = asyncio.ensure_future(pool.merge(8, [good, never], [1.0, 1.0], timeout_s=1.0))
        await asyncio.sleep(0.3)
        pool.forget(7, never)
        first = await asyncio.wait_for(forgotten, 10)
        forgot_after = time.monotonic() - began
        second = await asyncio.wait_for(late, 10)
        return first, forgot_after, second, time.monotonic() - began

    first, forgot_after, second, late_after = asyncio.run(merges())
    assert first.unreadable == frozenset({1}) and first.parts == () and forgot_after < 5.0
    assert second.unreadable == frozenset({1}) and late_after >= 0.9
    assert all(load["here"] for load in first.loads + second.loads)  # named here, as a shard names them


def test_a_round_too_big_to_merge_here_waits_for_the_starting_shards(ray_cluster):
    """Over ``here_max_bytes`` (a big model: longer than a process start, and every slice at once in the
    control plane's heap) the round goes to the shards even while they start."""
    payloads = _payloads(2)
    pool = RayShards(2, here_max_bytes=sum(p.layout.nbytes for p in payloads) - 1)

    async def merge():
        pool.prepare()
        return await pool.merge(1, payloads, [1.0, 2.0], timeout_s=30.0)

    merged = asyncio.run(merge())
    assert len(merged.parts) == 2 and not any(load.get("here") for load in merged.loads)


def test_a_shard_that_died_has_its_slice_merged_here_until_its_restarted_process_is_up(ray_cluster):
    """Shard 1 killed between two rounds, the pool in a process that hears of a death at once
    (``LEARNER_ENV``; the averager hears of it after Ray's grace for the cause), so that the next round
    comes before the restarted process is up: it does not wait for it. Slice 1 is merged here, to the
    bits the shard gave the same round before, shard 0 merges its own; once Ray has restarted it, shard 1
    merges again. (Before, the round's call waited in Ray's queue for the restarted process.)"""

    @ray.remote(num_cpus=0, runtime_env={"env_vars": LEARNER_ENV})
    class ControlPlane:
        def __init__(self) -> None:
            self.pool = RayShards(2)

        async def ready(self) -> None:
            self.pool.prepare()
            await asyncio.gather(*(h.__ray_ready__.remote() for h in self.pool.handles()))

        async def merge(self, round_: int, payloads: list) -> ShardMerge:
            return await self.pool.merge(round_, payloads, [1.0, 2.0], timeout_s=30.0)

        def kill(self, i: int) -> None:
            ray.kill(self.pool.handles()[i], no_restart=False)

        async def restarted(self, i: int) -> None:
            await self.pool.handles()[i].node.remote()  # Ray's retries wait for the new process

    payloads = _payloads(2)
    plane = ControlPlane.remote()
    ray.get(plane.ready.remote(), timeout=120)
    before = ray.get(plane.merge.remote(1, payloads), timeout=60)
    ray.get(plane.kill.remote(1))
    time.sleep(0.2)  # the watch has failed; the new process is not up yet (a process start: longer)
    died = ray.get(plane.merge.remote(2, payloads), timeout=60)
    ray.get(plane.restarted.remote(1), timeout=120)
    after = ray.get(plane.merge.remote(3, payloads), timeout=60)
    assert [bool(load.get("here")) for load in before.loads] == [False, False]
    assert [bool(load.get("here")) for load in died.loads] == [False, True]
    assert [bool(load.get("here")) for load in after.loads] == [False, False]
    for mine, theirs in zip(ray.get(list(died.parts)), ray.get(list(before.parts)), strict=True):
        assert mine.keys() == theirs.keys() and mine
        assert all(np.array_equal(mine[k], theirs[k]) for k in mine)


def test_named_shards_outlive_their_control_plane_and_end_once_it_is_gone(ray_cluster):
    """A pool with ``ShardNames`` (as ``create_averager`` makes it): Ray restarts the control plane (its
    process killed), and the restarted one's pool takes the same shard actors back, up at once (no
    round merged here), merging to the same bits; once the control plane is gone for good, the shards
    end themselves (``runtime.averaging_shard``), though another actor took its name: nothing of the
    run is left."""
    names = ShardNames.of("plane-of-named-shards", "shards-test")

    @ray.remote(num_cpus=0)
    class ControlPlane:
        def __init__(self) -> None:
            self.pool = RayShards(2, names=names)

        async def shards(self) -> list:
            handles = self.pool.handles()
            await asyncio.gather(*(h.__ray_ready__.remote() for h in handles))
            return handles

        async def merge(self, round_: int, payloads: list) -> ShardMerge:
            return await self.pool.merge(round_, payloads, [1.0, 2.0], timeout_s=30.0)

    payloads = _payloads(2)
    options = {"name": names.owner, "namespace": names.namespace, "max_restarts": 1, "max_task_retries": 3}
    plane = ControlPlane.options(**options).remote()
    first = ray.get(plane.shards.remote(), timeout=120)
    before = ray.get(plane.merge.remote(1, payloads), timeout=60)
    ray.kill(plane, no_restart=False)  # Ray restarts it: a new process, its constructor run again
    again = ray.get(plane.shards.remote(), timeout=120)  # Ray's retry waits for the restarted process
    after = ray.get(plane.merge.remote(2, payloads), timeout=60)
    assert again == first and names.alive() == {0: 0, 1: 0}  # the same actors, taken back
    assert not any(load.get("here") for load in before.loads + after.loads)
    for mine, theirs in zip(ray.get(list(after.parts)), ray.get(list(before.parts)), strict=True):
        assert mine.keys() == theirs.keys() and mine
        assert all(np.array_equal(mine[k], theirs[k]) for k in mine)
    ray.kill(plane, no_restart=True)
    # A resumed run's control plane takes the name as soon as it is free: it is not these shards' maker.
    deadline = time.monotonic() + 30
    while True:
        try:
            successor = ControlPlane.options(name=names.owner, namespace=names.namespace).remote()
            ray.get(successor.__ray_ready__.remote(), timeout=60)
            break
        except ValueError:  # the name is released once Ray has ended the killed actor
            assert time.monotonic() < deadline, "the killed control plane's name was never released"
            time.sleep(0.01)
    while names.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert names.alive() == {}, "the shards outlived their control plane's end"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(first[0].node.remote(), timeout=30)
