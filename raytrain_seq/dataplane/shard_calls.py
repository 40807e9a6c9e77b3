"""``answers``: every shard's answer to one call, made again where the call was lost (asyncio, no Ray).

A shard is restarted by Ray when its process or node dies, and the calls in flight to it are retried, but
not always to an answer: the retries can be used up while the node is being declared dead (the call fails
as unavailable), and a merge in flight when its shard's node died was once never answered, and the
round never closed (docs/ARCHITECTURE.md, "Failure and recovery"). So the caller watches its calls: a shard
whose call fails with a ``retry_on`` error, or is unanswered while ``confirm`` pings to the same shard
have answered (a shard runs its calls one at a time, in order: a ping sent after the call answers only
once the call is done, so two answered pings and no answer mean the call is gone), gets the call again,
a fresh one, at most ``tries`` times in all; with a ``fallback`` (a merge its caller can do itself), the
fallback is awaited instead, once. A shard that answers nothing for ``give_up_s`` (a merge's own waits
included) fails the whole call with ``ShardUnavailableError``. Calls and pings are injected as awaitables
(a Ray ``ObjectRef`` is one), so this runs with fakes in a test.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

from raytrain_seq.members.errors import ShardUnavailableError

logger = logging.getLogger(__name__)

__all__ = ["answers"]


async def answers(
    what: str,
    count: int,
    submit: Callable[[int], Sequence[Awaitable[Any]]],
    ping: Callable[[int], Awaitable[Any]],
    *,
    retry_on: tuple[type[BaseException], ...],
    tries: int = 4,
    confirm: int = 2,
    ping_every_s: float = 1.0,
    give_up_s: float = 300.0,
    fallback: Callable[[int], Awaitable[Sequence[Any]]] | None = None,
    local: Collection[int] = (),
) -> tuple[list[Sequence[Any]], list[Any]]:
    """Shard i's call ``submit(i)`` (its returns: the last one is awaited) for i < ``count``, and the
    answers: ``(calls, values)``, the calls as last made (a merge's other return is read from there).

    ``ping(i)``: a cheap call to shard i, sent while its call is unanswered after ``ping_every_s`` (one
    at a time); ``confirm`` answered pings with the call still unanswered make the call again. An
    error not in ``retry_on`` is raised as it is (every other call is cancelled first). ``fallback(i)``:
    what replaces shard i's call once it is lost or failed: its returns stand for the call's (the last
    one is the answer), and nothing pings the shard for it; the shards in ``local`` (known to be down)
    get no call: the fallback from the start."""
    calls: dict[int, Any] = {i: submit(i) for i in range(count) if i not in local}
    waiting = {i: asyncio.ensure_future(fallback(i) if i in local else calls[i][-1]) for i in range(count)}
    values, pings = {}, {}  # shard -> its answer; shard -> its ping in flight
    made, pinged = dict.fromkeys(range(count), 1), dict.fromkeys(range(count), 0)
    heard = dict.fromkeys(range(count), time.monotonic())  # when shard i last answered anything
    here = set(local)  # the shards whose call the fallback replaced
    try:
        while waiting:
            await asyncio.wait(waiting.values(), timeout=ping_every_s)
            again: dict[int, str] = {}
            for i, future in list(waiting.items()):
                if not future.done():
                    continue
                del waiting[i]
                error = future.exception()
                if error is None and i in here:
                    calls[i] = tuple(future.result())
                    values[i] = calls[i][-1]
                elif error is None:
                    values[i] = future.result()
                elif isinstance(error, retry_on) and i not in here:  # a fallback's error is raised
                    again[i] = f"failed ({type(error).__name__}: {error})"
                else:
                    raise error
            now = time.monotonic()
            for i in list(waiting):
                if i in again or i in here:
                    continue
                if i in pings and pings[i].done():
                    answered = pings.pop(i).exception() is None
                    if answered:
                        heard[i], pinged[i] = now, pinged[i] + 1
                    if pinged[i] >= confirm:
                        again[i] = f"unanswered while {pinged[i]} later pings were answered"
                        continue
                if i not in pings:
                    pings[i] = asyncio.ensure_future(ping(i))
                if now - heard[i] > give_up_s:
                    raise ShardUnavailableError(what, i, f"nothing answered for {give_up_s:g} s")
            for i, why in again.items():
                if i in pings:
                    pings.pop(i).cancel()
                if fallback is not None:
                    logger.warning("shard %d: %s %s: done here instead", i, what, why)
                    here.add(i)
                    waiting[i] = asyncio.ensure_future(fallback(i))
                    continue
                if made[i] == tries:
                    raise ShardUnavailableError(what, i, f"{tries} calls, the last one {why}")
                logger.warning("shard %d: %s %s: calling it again (call %d of %d)",
                               i, what, why, made[i] + 1, tries)  # fmt: skip
                calls[i], made[i], pinged[i] = submit(i), made[i] + 1, 0
                waiting[i] = asyncio.ensure_future(calls[i][-1])
    finally:
        for future in [*waiting.values(), *pings.values()]:
            future.cancel()
    return [calls[i] for i in range(count)], [values[i] for i in range(count)]
