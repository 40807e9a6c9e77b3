"""Reading Ray objects from a worker thread of an asyncio actor (the averager's evaluator).

``ray.get`` in an asyncio actor's process logs "Using blocking ray.get inside async actor" (Ray cannot tell
the event loop's thread from another one) and, called on the loop's thread, would stall every call the
actor serves. ``off_loop_get`` waits on the objects' futures instead: the same values and errors as
``ray.get``, on the calling thread only, and it refuses to run on a thread whose event loop is running.
Code that may run there takes its getter through its constructor (``LearnerFeed(get=...)``,
``RayStore(get=...)``); everywhere else keeps ``ray.get``. ray is imported inside the function.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from typing import Any

__all__ = ["off_loop_get"]


def off_loop_get(refs: Any, timeout: float | None = None) -> Any:
    """``ray.get(refs, timeout=timeout)`` by the objects' futures: a list for a list, a value for one ref.

    Raises RuntimeError on a thread running an event loop (await the references there instead), and
    ``ray.exceptions.GetTimeoutError`` when the objects are not ready within ``timeout`` seconds."""
    import ray

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no loop on this thread: waiting blocks this thread only
    else:
        raise RuntimeError("off_loop_get on an event loop's thread: await the object references instead")
    single = isinstance(refs, ray.ObjectRef)
    futures = [ref.future() for ref in ([refs] if single else _as_list(refs))]
    _, pending = concurrent.futures.wait(futures, timeout=timeout)
    if pending:
        raise ray.exceptions.GetTimeoutError(
            f"{len(pending)} of {len(futures)} objects not ready in {timeout} s"
        )
    values = [future.result() for future in futures]
    return values[0] if single else values


def _as_list(refs: Sequence[Any]) -> list[Any]:
    if not isinstance(refs, Sequence):
        raise TypeError(f"off_loop_get takes an ObjectRef or a list of them, not {type(refs).__name__}")
    return list(refs)
