"""``RayTransport.away``: a restarting averager is seen without calling it (a call would wait in its queue).

Pins the Ray pieces it reads: the state API's actor table (served by the dashboard) and the handle's
``_actor_id`` (no public accessor), and the open ``watch()`` call that fails when the process dies. A
cluster without the dashboard answers False: the round is sent.
"""

from __future__ import annotations

import time

import pytest

from raytrain_seq.runtime.transport import RayTransport

RAY_CLUSTER = {"include_dashboard": True}


def _until(predicate, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_away_is_true_while_the_actor_restarts_and_false_when_it_answers(ray_cluster):
    ray = ray_cluster

    class Slow:  # defined here: Ray ships it by value (this test module is not importable on a worker)
        """An actor whose restart takes seconds (as the averager's: a process, imports, a checkpoint)."""

        def __init__(self) -> None:
            if ray.get_runtime_context().was_current_actor_reconstructed:
                time.sleep(4)

        def ping(self) -> int:
            return 1

        async def watch(self) -> None:  # as ParameterAverager.watch: never answers
            import asyncio

            await asyncio.Event().wait()

    handle = ray.remote(max_restarts=1)(Slow).remote()
    assert ray.get(handle.ping.remote()) == 1
    transport = RayTransport(handle)
    assert transport.away() is False
    ray.kill(handle, no_restart=False)
    assert _until(transport.away, 10), "the restarting actor was never seen away"
    assert _until(lambda: not transport.away(), 30), "the restarted actor was never seen alive"
    assert ray.get(handle.ping.remote(), timeout=30) == 1


def test_away_is_false_when_the_state_cannot_be_read(caplog, monkeypatch):
    """No dashboard (the state API's server), or it does not answer: the round is sent, as before."""
    state = pytest.importorskip("ray.util.state")

    def unreachable(*args, **kwargs):
        raise ConnectionError("no dashboard")

    watches: list[int] = []

    class Handle:
        class _actor_id:  # the attribute of Ray's handle
            @staticmethod
            def hex() -> str:
                return "ff" * 16

        class watch:  # the method's ``.remote``
            @staticmethod
            def remote() -> int:
                watches.append(1)
                return 1

    monkeypatch.setattr(state, "get_actor", unreachable)
    assert RayTransport(Handle()).away() is False
    assert "could not be read" in caplog.text and "no dashboard" in caplog.text
    assert watches == [1]  # a watch is opened anyway: the next death is seen
