"""runtime.off_loop.off_loop_get: ray.get's values and errors, read from a thread of an asyncio actor
without Ray's "blocking ray.get inside async actor" warning, and never on an event loop's thread."""

from __future__ import annotations

import asyncio

import pytest

from raytrain_seq.runtime.off_loop import off_loop_get


def test_refuses_to_wait_on_an_event_loop_thread():
    async def on_the_loop():
        off_loop_get([])

    with pytest.raises(RuntimeError, match="await the object references"):
        asyncio.run(on_the_loop())


def test_values_timeouts_and_errors_are_ray_gets(ray_cluster):
    import ray

    refs = [ray.put(i * 10) for i in range(3)]
    assert off_loop_get(refs) == ray.get(refs) == [0, 10, 20]
    assert off_loop_get(refs[1]) == 10

    @ray.remote
    def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        off_loop_get(fails.remote())

    @ray.remote
    def slow():
        import time

        time.sleep(5)

    with pytest.raises(ray.exceptions.GetTimeoutError):
        off_loop_get([slow.remote()], timeout=0.05)


def test_an_async_actor_reads_on_a_thread(ray_cluster):
    """The averager's evaluator reads on a thread of an asyncio actor like this one."""
    import ray

    @ray.remote
    class Async:
        async def read(self, refs):
            return await asyncio.to_thread(off_loop_get, refs)

    actor = Async.remote()
    assert ray.get(actor.read.remote([ray.put(7)])) == [7]
    ray.kill(actor)
