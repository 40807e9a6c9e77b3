"""The learner's side of the wire to the averager actor: ``AveragerClient``'s transport over Ray.

``rounds.client.AveragerClient`` holds the retry and rejoin policy and takes its transport through its
constructor (a fake in tests). ``RayTransport`` is the one for a learner actor: each call is one actor
method call, and the failures the client retries become ``Unreachable``. ``away`` says whether the averager
is down without a call that would wait in a restarting actor's queue: an open ``watch()`` call fails the
moment its process dies, and only then is Ray's readiness probe asked until it answers (no dashboard or
state API needed). ``until_back`` is the client's pause between retries, cut short when a restarted
averager can take the call. ray is imported only inside the methods.
"""

from __future__ import annotations

import time
from typing import Any

from raytrain_seq.rounds.client import Unreachable

__all__ = ["RayTransport"]

# While the averager restarts its readiness probe fails at once: asked again this often.
PROBE_EVERY_S = 0.1
# A probe this slow waited in the queue of an actor that was not up: it was down, and is back.
QUEUED_S = 0.25


class RayTransport:
    """``AveragerClient``'s transport in a learner actor: ``ray.get(handle.method.remote(...))``.

    A dead or restarting actor (``RayActorError``, which ``ActorUnavailableError`` is) and a call
    silent past ``timeout`` (``GetTimeoutError``) become ``Unreachable``; the client retries those.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._watch: Any = None  # the open watch() call of the averager process last seen alive
        self._probe: Any = None  # once a watch failed: the readiness call to the restarting actor

    def __call__(self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return ray.get(getattr(self.handle, method).remote(*args, **kwargs), timeout=timeout)
        except GetTimeoutError as exc:
            raise Unreachable(f"{type(exc).__name__}: no answer in {timeout:g} s", silent=True) from exc
        except RayActorError as exc:
            raise Unreachable(type(exc).__name__) from exc

    def away(self) -> bool:
        """Whether the averager's actor is down now (restarting, or dead), where a call would wait in its
        queue until Ray restarted it and a learner that knows can train on (``AveragerClient.away``).

        An open ``watch()`` call (it never answers) says no at the cost of a ``ray.wait``: it fails the
        moment its process dies. Then Ray's readiness probe (``__ray_ready__``, every actor's; Ray Serve
        asks a recovered actor so) waits in the restarting actor's queue, or fails while Ray restarts
        it and is asked again: away until it answers, then a new watch goes to the new process. The
        first call opens the first watch: the averager a learner has just joined is alive."""
        import ray
        from ray.exceptions import RayActorError

        if self._watch is None and self._probe is None:
            self._watch = self.handle.watch.remote()
        if self._watch is not None:
            if not ray.wait([self._watch], timeout=0)[0]:
                return False  # the process that took the watch lives
            self._watch, self._probe = None, self.handle.__ray_ready__.remote()
        if not ray.wait([self._probe], timeout=0)[0]:
            return True  # in the queue of the actor Ray is restarting
        try:
            ray.get(self._probe)
        except RayActorError:  # unavailable while Ray restarts it (or dead: a call will say so)
            self._probe = self.handle.__ray_ready__.remote()
            return True
        self._probe, self._watch = None, self.handle.watch.remote()
        return False

    def until_back(self, seconds: float) -> None:
        """Sleep up to ``seconds``, less when the averager comes back from a restart: the client's pause
        between retries (``AveragerClient(sleep=...)``), so that a learner rejoins a restarted averager
        as soon as its process takes calls, not up to a whole backoff later. Ray's readiness probe fails
        at once while Ray restarts the actor (asked again every ``PROBE_EVERY_S``) and waits in its
        queue while the new process starts: a probe that failed or waited, then answered, means back.
        One that answers at once finds the actor up all along (the call failed for another reason): the
        whole pause is slept, as a plain backoff would."""
        import ray
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + seconds
        was_down = False
        while (left := deadline - time.monotonic()) > 0:
            asked = time.monotonic()
            probe = self.handle.__ray_ready__.remote()
            if not ray.wait([probe], timeout=left)[0]:
                return  # still starting at the pause's end
            try:
                ray.get(probe)
            except RayActorError:  # restarting (or dead for good: the next call says so)
                was_down = True
                time.sleep(min(PROBE_EVERY_S, max(0.0, deadline - time.monotonic())))
                continue
            if was_down or time.monotonic() - asked >= QUEUED_S:
                return  # back
            time.sleep(max(0.0, deadline - time.monotonic()))
            return
