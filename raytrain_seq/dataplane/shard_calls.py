"""``answers``: every shard's answer to one call, made again where the call was lost (asyncio, no Ray).

A shard is restarted by Ray when its process or node dies, and the calls in flight to it are retried, but
not always to an answer: the retries can be used up while the node is being declared dead (the call fails
as unavailable), and a merge in flight when its shard's node died was once never answered, and the
round never closed (docs/ARCHITECTURE.md, "Failure and recovery"). So the caller watches its calls: a shard
whose call fails with a ``retry_on`` error, or is unanswered while ``confirm`` pings to the same shard
have answered (a shard runs its calls one at a time, in order: a ping sent after the call answers only
once the call is done, so two answered pings and no answer mean the call is gone), gets the call again,
a fresh one, at most ``tries`` times in all; with a ``fallback`` (a merge its caller can do itself), the
fallback is awaited instead, once, and also for a call that lags the others (``hedge_s``: a call sent to
a shard whose process just died waits in Ray's queue for the restarted one). A shard that answers nothing
for ``give_up_s`` (a merge's own waits included) fails the whole call with ``ShardUnavailableError``.
Calls and pings are injected as awaitables (a Ray ``ObjectRef`` is one), so this runs with fakes in a test.
"""

from __future__ import annotations

import asyncio
import logging
import math
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
    hedge_s: float | None = None,
) -> tuple[list[Sequence[Any]], list[Any]]:
    """Shard i's call ``submit(i)`` (its returns: the last one is awaited) for i < ``count``, and the
    answers: ``(calls, values)``, the calls as last made (a merge's other return is read from there).

    ``ping(i)``: a cheap call to shard i, sent while its call is unanswered after ``ping_every_s`` (one
    at a time); ``confirm`` answered pings with the call still unanswered make the call again. An
    error not in ``retry_on`` is raised as it is (every other call is cancelled first). ``fallback(i)``:
    what replaces shard i's call once it is lost or failed: its returns stand for the call's (the last
    one is the answer), and nothing pings the shard for it; the shards in ``local`` (known to be down)
    get no call: the fallback from the start. ``hedge_s`` (with a fallback): a call unanswered
    ``max(hedge_s, t)`` after another slice came in ``t`` s (a call's or the fallback's) is replaced by the
    fallback too (slices are of one size: a shard that lags that far is restarting or stopped)."""
    calls: dict[int, Any] = {i: submit(i) for i in range(count) if i not in local}
    waiting = {i: asyncio.ensure_future(fallback(i) if i in local else calls[i][-1]) for i in range(count)}
    values: dict[int, Any] = {}  # shard -> its answer
    began = next_ping = time.monotonic()
    pings = _Pings(count, ping, began)
    made, here = dict.fromkeys(range(count), 1), set(local)  # calls made; those the fallback replaced
    hedge_at = math.inf  # when a call still unanswered is replaced by the fallback (hedge_s)
    try:
        while waiting:
            # Woken by each answer (a failure is acted on at once), and at hedge_at while a call may lag.
            if next_ping <= time.monotonic():  # the pings are looked at once per ping_every_s
                next_ping = time.monotonic() + ping_every_s
            wake = min(next_ping, hedge_at if set(waiting) - here else math.inf) - time.monotonic()
            await asyncio.wait(waiting.values(), timeout=max(wake, 0.0), return_when=asyncio.FIRST_COMPLETED)
            again: dict[int, str] = {}
            for i, future in [(i, future) for i, future in waiting.items() if future.done()]:
                del waiting[i]
                error = future.exception()
                if error is None and i in here:
                    calls[i], values[i] = tuple(future.result()), future.result()[-1]
                elif error is None:
                    values[i] = future.result()
                elif isinstance(error, retry_on) and i not in here:  # a fallback's error is raised
                    again[i] = f"failed ({type(error).__name__}: {error})"
                else:
                    raise error
                if error is None and hedge_s is not None and fallback is not None and hedge_at == math.inf:
                    hedge_at = _hedge_at(began, time.monotonic(), hedge_s)  # the first slice is in
            now = time.monotonic()
            lagging = [i for i in waiting if i not in here and i not in again] if now >= hedge_at else []
            again.update((i, f"unanswered after {now - began:.2f} s, another slice long in") for i in lagging)
            for i in [i for i in waiting if i not in here and i not in again] if now >= next_ping else []:
                if (why := pings.judge(i, now, confirm)) is not None:
                    again[i] = why
                elif now - pings.heard[i] > give_up_s:
                    raise ShardUnavailableError(what, i, f"nothing answered for {give_up_s:g} s")
            for i, why in again.items():
                pings.drop(i)
                if fallback is not None:
                    level = logging.INFO if i in lagging else logging.WARNING  # a lag is no failure
                    logger.log(level, "shard %d: %s %s: done here instead", i, what, why)
                    here.add(i)
                    waiting[i] = asyncio.ensure_future(fallback(i))
                    continue
                if made[i] == tries:
                    raise ShardUnavailableError(what, i, f"{tries} calls, the last one {why}")
                logger.warning("shard %d: %s %s: calling it again (call %d of %d)",
                               i, what, why, made[i] + 1, tries)  # fmt: skip
                calls[i], made[i], pings.answered[i] = submit(i), made[i] + 1, 0
                waiting[i] = asyncio.ensure_future(calls[i][-1])
    finally:
        for future in [*waiting.values(), *pings.flying.values()]:
            future.cancel()
    return [calls[i] for i in range(count)], [values[i] for i in range(count)]


def _hedge_at(began: float, now: float, hedge_s: float) -> float:
    """When the calls still unanswered are replaced, the first slice having come at ``now``: at least as
    long again as it took. E.g. it took 0.02 s: with hedge_s 0.25 the others have until 0.27 s."""
    return now + max(hedge_s, now - began)


class _Pings:
    """Per shard: its ping in flight, how many pings it answered since its call was made, and when it
    last answered anything."""

    def __init__(self, count: int, ping: Callable[[int], Awaitable[Any]], now: float) -> None:
        self.ping = ping
        self.flying: dict[int, asyncio.Future] = {}
        self.answered = dict.fromkeys(range(count), 0)
        self.heard = dict.fromkeys(range(count), now)

    def judge(self, i: int, now: float, confirm: int) -> str | None:
        """Shard i's call, still unanswered at a ping tick: why it is taken for lost once ``confirm`` pings
        sent after it were answered; else None, and a ping goes out unless one is in flight."""
        if i in self.flying and self.flying[i].done():
            if self.flying.pop(i).exception() is None:
                self.heard[i], self.answered[i] = now, self.answered[i] + 1
            if self.answered[i] >= confirm:
                return f"unanswered while {self.answered[i]} later pings were answered"
        if i not in self.flying:
            self.flying[i] = asyncio.ensure_future(self.ping(i))
        return None

    def drop(self, i: int) -> None:
        """Shard i's call is replaced: its ping in flight is let go of."""
        if i in self.flying:
            self.flying.pop(i).cancel()
