"""The learner's side of the wire to the averager actor: ``AveragerClient``'s transport over Ray.

``rounds.client.AveragerClient`` holds the retry and rejoin policy and takes its transport through its
constructor (a fake in tests). ``RayTransport`` is the one for a learner actor: each call is one actor
method call, and the failures the client retries become ``Unreachable`` (a learner's process fails a call
to a dead process at once: ``connect.DEATH_AT_ONCE`` or ``fleet.LEARNER_ENV``). ``away`` says whether the
averager is down without a call: an open ``watch()`` call fails once its process dies, and only then
are Ray's readiness probes sent, a fresh one every ``PROBE_EVERY_S``, until one answers (no dashboard or
state API needed).
``until_back`` is the client's pause between retries, cut short when a restarted averager takes calls.
ray is imported only inside the methods.
"""

from __future__ import annotations

import time
from typing import Any

from raytrain_seq.rounds.client import Unreachable

__all__ = ["RayTransport"]

# While the averager restarts a readiness probe fails (after Ray's grace for a death, where the process
# keeps it): a fresh probe goes out this often, and the first one sent once it is up answers.
PROBE_EVERY_S = 0.1


class RayTransport:
    """``AveragerClient``'s transport in a learner actor: ``ray.get(handle.method.remote(...))``.

    A dead or restarting actor (``RayActorError``, which ``ActorUnavailableError`` is) and a call
    silent past ``timeout`` (``GetTimeoutError``) become ``Unreachable``; the client retries those.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._watch: Any = None  # the open watch() call of the averager process last seen alive
        self._down = False  # a watch failed and no probe has answered since
        self._probes: list[Any] = []  # while down: the readiness calls not yet answered
        self._probed_at = float("-inf")  # when the newest probe went out

    def __call__(self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            answer = ray.get(getattr(self.handle, method).remote(*args, **kwargs), timeout=timeout)
        except GetTimeoutError as exc:
            raise Unreachable(f"{type(exc).__name__}: no answer in {timeout:g} s", silent=True) from exc
        except RayActorError as exc:
            raise Unreachable(type(exc).__name__) from exc
        if self._down:
            # It answered, so it is back: the next away() opens a watch on it rather than saying
            # "away" until a probe sent during the restart has failed.
            self._down, self._probes = False, []
        return answer

    def away(self) -> bool:
        """Whether the averager's actor is down now (restarting, or dead), where a call would fail and a
        learner that knows can train on without sending its round (``AveragerClient.away``).

        An open ``watch()`` call (it never answers) says no at the cost of a ``ray.wait``: it fails once
        its process dies. Then Ray's readiness probe (``__ray_ready__``, every actor's; Ray Serve asks a
        recovered actor so) is sent, a fresh one every ``PROBE_EVERY_S`` while none has answered (one
        sent during the restart fails, one sent once the new process is up answers): away until one
        answers, then a new watch goes to the new process. The first call opens the first watch: the
        averager a learner has just joined is alive."""
        import ray

        if not self._down:
            if self._watch is None:
                self._watch = self.handle.watch.remote()
            if not ray.wait([self._watch], timeout=0)[0]:
                return False  # the process that took the watch lives
            self._watch, self._down, self._probed_at = None, True, float("-inf")
        if self._answered(ray):
            self._down, self._probes, self._watch = False, [], self.handle.watch.remote()
            return False
        if time.monotonic() - self._probed_at >= PROBE_EVERY_S:
            self._probes.append(self.handle.__ray_ready__.remote())
            self._probed_at = time.monotonic()
        return True

    def _answered(self, ray: Any) -> bool:
        """Whether a probe answered; those that failed (sent while Ray restarted it) are let go of."""
        from ray.exceptions import RayActorError

        if not self._probes:
            return False
        done, self._probes = ray.wait(self._probes, num_returns=len(self._probes), timeout=0)
        answered = False
        for probe in done:
            try:
                ray.get(probe)
                answered = True
            except RayActorError:
                continue  # sent while Ray restarted it (or dead for good: the next call says so)
        return answered

    def until_back(self, seconds: float) -> None:
        """Sleep up to ``seconds``, less when the averager comes back from a restart: the client's pause
        between retries (``AveragerClient(sleep=...)``), so that a learner rejoins a restarted averager
        as soon as its process takes calls, not up to a whole backoff later. ``away()`` is asked every
        ``PROBE_EVERY_S``: once it said away and then back, the pause ends. An actor up all along (the
        call failed for another reason) gets the whole pause, as a plain backoff would."""
        deadline = time.monotonic() + seconds
        was_away = False
        while (left := deadline - time.monotonic()) > 0:
            if self.away():
                was_away = True
            elif was_away:
                return  # back
            time.sleep(min(PROBE_EVERY_S, left))
