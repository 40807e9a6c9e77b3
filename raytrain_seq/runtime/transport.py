"""The learner's side of the wire to the averager actor: ``AveragerClient``'s transport over Ray.

``rounds.client.AveragerClient`` holds the retry and rejoin policy and takes its transport through its
constructor (a fake in tests). ``RayTransport`` is the one for a learner actor: each call is one actor
method call, and the failures the client retries become ``Unreachable``. ray is imported only inside the
call.
"""

from __future__ import annotations

from typing import Any

from raytrain_seq.rounds.client import Unreachable

__all__ = ["RayTransport"]


class RayTransport:
    """``AveragerClient``'s transport in a learner actor: ``ray.get(handle.method.remote(...))``.

    A dead or restarting actor (``RayActorError``, which ``ActorUnavailableError`` is) and a call
    silent past ``timeout`` (``GetTimeoutError``) become ``Unreachable``; the client retries those.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __call__(self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return ray.get(getattr(self.handle, method).remote(*args, **kwargs), timeout=timeout)
        except GetTimeoutError as exc:
            raise Unreachable(f"{type(exc).__name__}: no answer in {timeout:g} s", silent=True) from exc
        except RayActorError as exc:
            raise Unreachable(type(exc).__name__) from exc
