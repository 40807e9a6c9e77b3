"""The learner's side of the wire to the averager actor: ``AveragerClient``'s transport over Ray.

``rounds.client.AveragerClient`` holds the retry and rejoin policy and takes its transport through its
constructor (a fake in tests). ``RayTransport`` is the one for a learner actor: each call is one actor
method call, and the failures the client retries become ``Unreachable``. ``away`` says whether the averager
is down without a call that would wait in a restarting actor's queue: an open ``watch()`` call fails the
moment its process dies, and only then is the actor table read (Ray's state API) until it is back.
ray is imported only inside the methods.
"""

from __future__ import annotations

import logging
from typing import Any

from raytrain_seq.rounds.client import Unreachable

logger = logging.getLogger(__name__)

__all__ = ["RayTransport"]

# The longest wait for the actor table (Ray's state API) before the round is sent anyway.
STATE_TIMEOUT_S = 5


class RayTransport:
    """``AveragerClient``'s transport in a learner actor: ``ray.get(handle.method.remote(...))``.

    A dead or restarting actor (``RayActorError``, which ``ActorUnavailableError`` is) and a call
    silent past ``timeout`` (``GetTimeoutError``) become ``Unreachable``; the client retries those.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._watch: Any = None  # the open watch() call of the averager process last seen alive

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
        queue until Ray restarted it and a learner that knows can train on (``AveragerClient.away``). An
        unanswered ``watch()`` says no at the cost of a ``ray.wait``; once it failed, the actor table
        says, and a new watch goes to the process once it is alive. Unknown (no state API): False."""
        import ray

        if self._watch is not None and not ray.wait([self._watch], timeout=0)[0]:
            return False  # the process that took the watch lives
        state = self._state()
        if state is None or state == "ALIVE":
            self._watch = self.handle.watch.remote()
            return False
        return True

    def _state(self) -> str | None:
        """The averager's state in the actor table (Ray's state API, which the head's dashboard serves);
        None, logged, when it cannot be read."""
        from ray.util.state import get_actor

        try:  # the handle's id: no public accessor (Ray's own libraries read it so too)
            actor = get_actor(self.handle._actor_id.hex(), timeout=STATE_TIMEOUT_S)
        except Exception as exc:  # a decision, logged: the round goes the waiting way
            logger.warning("the averager's state could not be read (%r): sending the round", exc)
            return None
        return None if actor is None else actor.state
