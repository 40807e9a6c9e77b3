"""``RayTransport.away``: a restarting averager is seen without calling it (a call would fail only after
Ray's grace for the death, unless the process was started with ``fleet.LEARNER_ENV``, as a learner is on a
cluster without ``connect.DEATH_AT_ONCE``).

Pins the Ray pieces it reads, on a cluster without a dashboard (no state API): the open ``watch()`` call
that fails when the process dies, and every actor's readiness probe (``__ray_ready__``), which fails when
sent during the restart, answers once the restarted process is up and fails for an actor that is dead for
good.
"""

from __future__ import annotations

import time

from conftest import killed_actor_call

from raytrain_seq.runtime.transport import RayTransport


def _until(predicate, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def _slow_class(ray):
    class Slow:  # defined here: Ray ships it by value (this test module is not importable on a worker)
        """An actor whose restart takes seconds (as the averager's: a process, imports, a checkpoint)."""

        def __init__(self, restart_s: float = 4.0) -> None:
            if ray.get_runtime_context().was_current_actor_reconstructed:
                time.sleep(restart_s)
            self.up = time.time()  # when this process could first take a call

        def ping(self) -> int:
            return 1

        def up_at(self) -> float:
            return self.up

        async def watch(self) -> None:  # as ParameterAverager.watch: never answers
            import asyncio

            await asyncio.Event().wait()

    return Slow


def test_away_is_true_while_the_actor_restarts_and_false_when_it_answers(ray_cluster):
    ray = ray_cluster
    handle = ray.remote(max_restarts=1)(_slow_class(ray)).remote()
    assert ray.get(handle.ping.remote()) == 1
    transport = RayTransport(handle)
    assert transport.away() is False
    assert transport.away() is False  # the watch is open: no new call
    ray.kill(handle, no_restart=False)
    assert _until(transport.away, 10), "the restarting actor was never seen away"
    began = time.monotonic()
    assert _until(lambda: not transport.away(), 30), "the restarted actor was never seen alive"
    # The restart's 4 s sleep in __init__ passed before it answered: away() did not say back too early.
    assert time.monotonic() - began > 1.0
    assert ray.get(handle.ping.remote(), timeout=30) == 1
    # Its new watch is open on the new process: a second death is seen too.
    ray.kill(handle, no_restart=True)
    assert _until(transport.away, 10), "the dead actor was never seen away"


def test_an_actor_dead_for_good_stays_away(ray_cluster):
    """No restart left: every probe fails and is asked again, and away() keeps saying so (the learner
    trains on until its layout's end, where the round that is never deferred raises the actor's error)."""
    ray = ray_cluster
    handle = ray.remote(max_restarts=0)(_slow_class(ray)).remote()
    transport = RayTransport(handle)
    assert transport.away() is False
    ray.kill(handle, no_restart=True)
    assert _until(transport.away, 10), "the dead actor was never seen away"
    time.sleep(0.5)
    assert all(transport.away() for _ in range(3))


def test_until_back_ends_the_pause_when_a_restarted_actor_takes_calls(ray_cluster):
    """The client's pause between retries: cut short once the restarted process answers (its 4 s
    constructor over), the whole pause while the actor is up all along (the call failed for another
    reason, and a plain backoff would wait)."""
    ray = ray_cluster
    handle = ray.remote(max_restarts=1)(_slow_class(ray)).remote()
    transport = RayTransport(handle)
    assert ray.get(handle.ping.remote()) == 1
    began = time.monotonic()
    transport.until_back(0.6)
    assert time.monotonic() - began >= 0.6  # up all along: the whole pause
    ray.kill(handle, no_restart=False)
    assert _until(transport.away, 10), "the restarting actor was never seen away"
    began = time.monotonic()
    transport.until_back(60.0)
    waited = time.monotonic() - began
    assert 1.0 < waited < 30.0, waited  # the restart's 4 s constructor, not the 60 s pause
    assert ray.get(handle.ping.remote(), timeout=1) == 1  # back: the next call is answered at once


def test_until_back_ends_once_the_new_process_is_up_not_a_probes_grace_later(ray_cluster):
    """A probe sent during a restart fails only after Ray's grace for the death, which the old single
    probe waited out (up to 2 s after the new process was up); a fresh probe every ``PROBE_EVERY_S``
    finds it up within Ray's own notice of the restart. Three restarts, the middle lag."""
    ray = ray_cluster
    handle = ray.remote(max_restarts=-1)(_slow_class(ray)).remote(restart_s=1.5)
    transport = RayTransport(handle)
    assert ray.get(handle.ping.remote()) == 1 and transport.away() is False
    lags = []
    for _ in range(3):
        ray.kill(handle, no_restart=False)
        transport.until_back(60.0)
        back = time.time()
        lags.append(back - ray.get(handle.up_at.remote(), timeout=10))
    assert all(lag > 0 for lag in lags), lags  # it never said back before the new process was up
    assert sorted(lags)[1] < 1.2, lags


def test_a_call_answered_after_a_restart_ends_the_outage_at_once(ray_cluster):
    """Once the restarted averager answered a call (the learner rejoined), ``away()`` says so at once: a
    probe sent during the restart, not yet failed, would otherwise defer the learner's next round."""
    ray = ray_cluster
    handle = ray.remote(max_restarts=1)(_slow_class(ray)).remote(restart_s=1.5)
    transport = RayTransport(handle)
    assert ray.get(handle.ping.remote()) == 1 and transport.away() is False
    ray.kill(handle, no_restart=False)
    assert _until(transport.away, 10), "the restarting actor was never seen away"
    answered = _until(lambda: _answers(transport), 30)
    assert answered, "the restarted actor never answered"
    assert transport.away() is False


def _answers(transport: RayTransport) -> bool:
    from raytrain_seq.rounds.client import Unreachable

    try:
        return transport("ping") == 1
    except Unreachable:
        return False


def test_a_learners_call_to_a_killed_averager_fails_at_once_and_without_its_env_a_grace_later(ray_cluster):
    """``fleet.LEARNER_ENV``: from a learner's process (an actor started with it) a call to an actor whose
    process was just killed fails at once, so the learner defers its round and trains on; from a process
    without it the same call waits Ray's grace for the cause of the death. Each caller kills the actor
    itself, so that its call goes to the dead process before any notice of the death."""
    from raytrain_seq.runtime.fleet import LEARNER_ENV

    seconds = {}
    for env in (LEARNER_ENV, None):
        options = {"runtime_env": {"env_vars": env}} if env else None
        kind, seconds[bool(env)] = killed_actor_call(ray_cluster, options)
        assert kind == "ActorUnavailableError"  # the client's Unreachable: deferred, then rejoined
    assert seconds[True] < 0.5 < seconds[False], seconds
