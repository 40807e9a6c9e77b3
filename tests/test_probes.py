"""``runtime.probes.LearnerProbes`` without a cluster: a learner's handle sent pickled is unpickled when a
probe first needs it, on a worker thread, never on the event loop's, and then probed like a handle sent
as is; a handle that does not unpickle leaves its learner unprobed (None), with the error logged."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading

from raytrain_seq.runtime.probes import LearnerProbes, handle_bytes

UNPICKLED_ON: list[str] = []  # the threads FakeProcess instances were unpickled on


class _Call:
    def __init__(self, answer: bool) -> None:
        self.answer = answer

    def remote(self) -> _Call:
        return self

    def future(self) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self.answer:
            future.set_result(True)
        return future  # a silent process: never answers


class FakeProcess:
    """Stands in for a learner's actor handle: ``__ray_ready__.remote().future()``, and pickled by value."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.__ray_ready__ = _Call(answer)

    def __reduce__(self):
        return _unpickle, (self.answer,)


def _unpickle(answer: bool) -> FakeProcess:
    UNPICKLED_ON.append(threading.current_thread().name)
    return FakeProcess(answer)


def test_a_pickled_handle_is_unpickled_at_its_first_probe_off_the_loop_and_probed_like_a_handle():
    async def scenario():
        probes = LearnerProbes()
        probes.note(0, handle_bytes(FakeProcess(True)))
        probes.note(1, handle_bytes(FakeProcess(False)))
        probes.note(2, FakeProcess(True))  # a handle as is
        probes.note(2, None)  # unknown: the old one is kept
        noted = list(UNPICKLED_ON)  # nothing unpickled by note(): on the loop, in the join's call
        loop_thread = threading.current_thread().name
        answers = [await probes.answers(learner, 0.05) for learner in (0, 1, 2, 3)]
        again = await probes.answers(0, 0.05)  # the unpickled handle is kept
        return noted, loop_thread, answers, again

    UNPICKLED_ON.clear()
    noted, loop_thread, answers, again = asyncio.run(scenario())
    assert noted == [] and answers == [True, False, True, None] and again is True
    assert len(UNPICKLED_ON) == 2 and loop_thread not in UNPICKLED_ON  # once each, on worker threads


def test_a_handle_that_does_not_unpickle_leaves_its_learner_unprobed_and_says_why(caplog):
    async def scenario():
        probes = LearnerProbes()
        probes.note(0, b"not a pickle")
        return await probes.answers(0, 0.05), await probes.answers(0, 0.05)

    with caplog.at_level(logging.ERROR, logger="raytrain_seq.runtime.probes"):
        assert asyncio.run(scenario()) == (None, None)
    [record] = caplog.records
    assert "learner 0: its actor handle did not unpickle" in record.getMessage() and record.exc_info
