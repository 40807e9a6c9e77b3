"""``dataplane.shard_calls.answers`` with fake shards (no Ray): a lost call is made again, a slow one is
not, an unavailable one is retried, and a shard that never answers fails the round with a typed error."""

from __future__ import annotations

import asyncio
import time

import pytest

from raytrain_seq.dataplane.shard_calls import answers
from raytrain_seq.members.errors import AveragerError, ShardUnavailableError


class Unavailable(Exception):
    """Stands for Ray's ActorUnavailableError."""


class FakeShards:
    """Shard i answers call k (counted from 0) as ``plan[i][k]``: a value after ``delay`` seconds, "lost"
    (never answered), or "unavailable" (fails at once). Pings answer at once unless ``silent``."""

    def __init__(self, plan: dict[int, list], *, delay: float = 0.0, silent: frozenset = frozenset()):
        self.plan, self.delay, self.silent = plan, delay, silent
        self.calls = dict.fromkeys(plan, 0)
        self.pings = dict.fromkeys(plan, 0)

    def submit(self, i: int) -> tuple:
        k, self.calls[i] = self.calls[i], self.calls[i] + 1
        return ("other return", self._answer(self.plan[i][min(k, len(self.plan[i]) - 1)]))

    async def _answer(self, outcome):
        if outcome == "lost":
            await asyncio.Event().wait()  # never set
        if outcome == "unavailable":
            raise Unavailable("the actor is temporarily unavailable")
        await asyncio.sleep(self.delay)
        return outcome

    async def ping(self, i: int) -> str:
        self.pings[i] += 1
        if i in self.silent:
            await asyncio.Event().wait()
        return "node"


def _answers(shards: FakeShards, **kwargs):
    options = {"retry_on": (Unavailable,), "ping_every_s": 0.01, "give_up_s": 5.0, **kwargs}
    return asyncio.run(answers("merge()", len(shards.plan), shards.submit, shards.ping, **options))


def test_answers_in_shard_order_with_each_call_made_once_when_nothing_is_lost():
    shards = FakeShards({0: ["a"], 1: ["b"], 2: ["c"]})
    calls, values = _answers(shards)
    assert values == ["a", "b", "c"]
    assert [call[0] for call in calls] == ["other return"] * 3
    assert shards.calls == {0: 1, 1: 1, 2: 1}


def test_a_lost_call_is_made_again_once_later_pings_were_answered():
    shards = FakeShards({0: ["a"], 1: ["lost", "b"]})
    _, values = _answers(shards, confirm=2)
    assert values == ["a", "b"]
    assert shards.calls == {0: 1, 1: 2}
    assert shards.pings[1] >= 2  # two answered pings confirmed the loss


def test_a_slow_call_whose_shard_answers_no_ping_is_waited_for_not_made_again():
    # The shard is busy with the call (its pings queue behind it): slower than many ping intervals.
    shards = FakeShards({0: ["a"], 1: ["b"]}, delay=0.2, silent=frozenset({0, 1}))
    _, values = _answers(shards)
    assert values == ["a", "b"]
    assert shards.calls == {0: 1, 1: 1}
    assert shards.pings[0] == 1  # one ping at a time, not one per interval


def test_an_unavailable_call_is_made_again_and_an_unlisted_error_is_raised_as_it_is():
    shards = FakeShards({0: ["unavailable", "unavailable", "a"]})
    _, values = _answers(shards)
    assert values == ["a"] and shards.calls[0] == 3

    class Broken:
        def submit(self, i):
            return (self._fail(),)

        async def _fail(self):
            raise ValueError("a bug in the merge")

        async def ping(self, i):
            return "node"

    with pytest.raises(ValueError, match="a bug in the merge"):
        asyncio.run(answers("merge()", 1, Broken().submit, Broken().ping, retry_on=(Unavailable,)))


def test_a_call_lost_every_time_fails_after_its_tries_with_a_typed_error_the_learners_rejoin_on():
    shards = FakeShards({0: ["a"], 1: ["lost"]})
    with pytest.raises(ShardUnavailableError, match=r"shard 1 did not answer merge\(\): 3 calls") as caught:
        _answers(shards, tries=3)
    assert isinstance(caught.value, AveragerError)  # the client rejoins and resends on an AveragerError
    assert shards.calls[1] == 3


def test_a_shard_silent_past_give_up_fails_the_call():
    shards = FakeShards({0: ["lost"]}, silent=frozenset({0}))
    with pytest.raises(ShardUnavailableError, match=r"nothing answered for 0\.1 s"):
        _answers(shards, give_up_s=0.1)
    assert shards.calls[0] == 1  # never made again: no ping confirmed the loss


def test_the_error_survives_pickling_as_ray_ships_it():
    import pickle

    error = pickle.loads(pickle.dumps(ShardUnavailableError("merge()", 2, "3 calls")))
    assert (error.call, error.shard, error.detail) == ("merge()", 2, "3 calls")


def test_a_fallback_replaces_a_failed_or_lost_call_once_and_its_shard_is_not_pinged_for_it():
    """``fallback``: what the caller can do itself (a merge the control plane makes here). A call that
    failed (shard 1) or was lost (shard 2) is replaced by it, not made again; its returns stand for the
    call's; the shard that answered (0) keeps its call."""
    shards = FakeShards({0: ["a"], 1: ["unavailable", "never made"], 2: ["lost", "never made"]})
    done_here = []

    async def fallback(i: int) -> tuple:
        done_here.append(i)
        return (f"ref{i}", f"here{i}")

    calls, values = _answers(shards, fallback=fallback, confirm=2)
    assert values == ["a", "here1", "here2"] and sorted(done_here) == [1, 2]
    assert calls[0][0] == "other return" and (calls[1], calls[2]) == (("ref1", "here1"), ("ref2", "here2"))
    assert shards.calls == {0: 1, 1: 1, 2: 1}  # none made again
    assert shards.pings[1] == 0 and shards.pings[2] >= 2  # two answered pings confirmed shard 2's loss


def test_a_fallback_that_fails_raises_its_error_and_is_not_tried_again():
    shards = FakeShards({0: ["unavailable"]})
    tried = []

    async def fallback(i: int) -> tuple:
        tried.append(i)
        raise Unavailable("the fallback failed too")

    with pytest.raises(Unavailable, match="the fallback failed too"):
        _answers(shards, fallback=fallback)
    assert tried == [0] and shards.calls[0] == 1


class Timed(FakeShards):
    """Shard i answers after ``delays[i]`` seconds (None: never); ``events``: the answers and the
    fallbacks, in the order they came."""

    def __init__(self, delays: dict[int, float | None]):
        super().__init__({i: ["unused"] for i in delays})
        self.delays, self.events = delays, []

    def submit(self, i: int) -> tuple:
        self.calls[i] += 1
        return ("other return", self._after(i))

    async def _after(self, i: int) -> str:
        if self.delays[i] is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.delays[i])
        self.events.append(f"answer{i}")
        return f"shard{i}"

    async def fallback(self, i: int) -> tuple:
        self.events.append(f"here{i}")
        return (f"ref{i}", f"here{i}")


def test_a_call_that_lags_its_peers_is_replaced_by_the_fallback_and_only_then():
    """``hedge_s``: a merge sent to a shard whose process just died waits in Ray's queue for the restart;
    once a peer answered, a call still unanswered ``max(hedge_s, t)`` later (t: the peer's time) is done
    by the fallback, with no ping needed; calls that come within that are waited for."""
    shards = Timed({0: 0.0, 1: None, 2: 0.05})
    calls, values = _answers(shards, fallback=shards.fallback, hedge_s=0.5, ping_every_s=30.0)
    assert values == ["shard0", "here1", "shard2"]  # shard 2 lagged 0.05 s: within hedge_s, kept
    assert shards.events == ["answer0", "answer2", "here1"] and calls[1] == ("ref1", "here1")
    assert shards.calls == {0: 1, 1: 1, 2: 1} and shards.pings == {0: 0, 1: 0, 2: 0}
    # A slice merged by the fallback sets the bar too: with shard 0 down from the start, shard 1 lags it.
    shards = Timed({0: None, 1: None})
    _, values = _answers(shards, fallback=shards.fallback, hedge_s=0.05, ping_every_s=30.0, local={0})
    assert values == ["here0", "here1"] and shards.calls == {0: 0, 1: 1}
    # Shards that are all slow alike are not hedged: the first answer sets the bar (at least its time).
    shards = Timed({0: 0.3, 1: 0.33})
    _, values = _answers(shards, fallback=shards.fallback, hedge_s=0.01, ping_every_s=30.0)
    assert values == ["shard0", "shard1"] and shards.events == ["answer0", "answer1"]
    # Without a fallback, or without hedge_s, a lagging call is waited for (the pings judge it).
    for options in ({"hedge_s": 0.01}, {"fallback": Timed({}).fallback}):
        shards = Timed({0: 0.0, 1: 0.3})
        _, values = _answers(shards, ping_every_s=30.0, **options)
        assert values == ["shard0", "shard1"]


def test_a_failed_call_is_replaced_at_once_not_at_the_next_ping():
    """Each answer wakes the loop: a call that fails is replaced by the fallback before a slower peer
    answers, however long the ping interval."""
    shards = FakeShards({0: ["unavailable"], 1: ["b"]}, delay=0.3)
    order = []

    async def fallback(i: int) -> tuple:
        order.append(f"here{i}")
        return (f"ref{i}", f"here{i}")

    async def later(i: int):
        value = await shards._answer("b")
        order.append(f"answer{i}")
        return value

    submit = {0: shards.submit, 1: lambda i: ("other return", later(i))}
    _, values = asyncio.run(
        answers("merge()", 2, lambda i: submit[i](i), shards.ping, retry_on=(Unavailable,),
                ping_every_s=30.0, fallback=fallback)
    )  # fmt: skip
    assert values == ["here0", "b"] and order == ["here0", "answer1"]


def test_a_hedged_round_waits_for_its_fallback_without_spinning():
    """Once the lagging calls are the fallback's, the loop sleeps until an answer (or a ping tick): a
    fallback of 0.3 s costs this process next to no CPU time, where a loop woken at the past hedge time
    over and over would burn all of it."""
    shards = Timed({0: 0.0, 1: None})

    async def slow_fallback(i: int) -> tuple:
        await asyncio.sleep(0.3)
        return await shards.fallback(i)

    cpu = time.process_time()
    _, values = _answers(shards, fallback=slow_fallback, hedge_s=0.01, ping_every_s=30.0)
    assert values == ["shard0", "here1"]
    assert time.process_time() - cpu < 0.15
