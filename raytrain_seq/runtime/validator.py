"""``ThreadValidator``: the control plane's validator, an ``Evaluator`` on a thread of the averager's process.

On a CPU cluster (``train.validator`` ``auto`` without GPUs, or ``evaluator``) the averager awaits
``validator(state)`` for every validation round (``rounds.validation_runner``); the scoring itself is
``runtime.evaluator.Evaluator``. Contract: picklable until started (the driver hands it to the averager's
constructor); ``start()`` returns at once and builds the evaluator (torch, the model, the validation
rows) on the validator's own thread, where validations then queue. Nothing here imports torch at import
or in ``start``: a restarted averager serves its learners' rejoins while torch loads on that thread
(docs/ARCHITECTURE.md, "Failure and recovery"). ray is imported only on the thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from raytrain_seq.parts import EvaluatorSettings

if TYPE_CHECKING:
    from raytrain_seq.rounds.state import AveragedState
    from raytrain_seq.runtime.evaluator import Evaluator

logger = logging.getLogger(__name__)

__all__ = ["ThreadValidator"]


class ThreadValidator:
    """The control plane's validator: ``await validator(state)`` scores ``state`` with an ``Evaluator`` that
    lives on a thread of the process holding this object, the averager actor.

    Why not an actor of its own: a process of its own, started with the job, competes with the learners'
    start on a busy node, where the averager's process exists anyway. Interleaved demos on the 2-core box:
    start-up and the job shorter, the learners' rounds no less even (docs/ARCHITECTURE.md, "Measurements
    behind the code"). The evaluator keeps freed heap memory (``heap.py``) like a learner, or every
    validation maps its activations afresh and the learners beside it slow down (the same LOG entry).

    ``start()`` (the averager calls it at its start, or after a restart once a validation is near; one before
    that starts it) builds the evaluator and assembles the validation rows on that thread; validations
    queue behind it. Picklable until started, so the driver hands it to the averager's constructor; a
    restarted averager builds a new one.
    """

    def __init__(
        self,
        settings: EvaluatorSettings,
        *,
        feed_name: str,
        namespace: str,
        build: Callable[[], Evaluator] | None = None,
    ) -> None:
        self.settings, self.feed_name, self.namespace = settings, feed_name, namespace
        self.build = build  # None: the run's evaluator (the feed by name, Ray's object store); tests pass one
        self._thread: ThreadPoolExecutor | None = None
        self._evaluator: Future[Evaluator] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_thread": None, "_evaluator": None}  # a thread does not travel

    def start(self) -> None:
        """Build the evaluator in the background (once)."""
        if self._thread is not None:
            return
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="evaluator")
        self._evaluator = self._thread.submit(self._prepared)

    def _prepared(self) -> Evaluator:
        import torch

        from raytrain_seq.training.heap import keep_freed_memory

        # Process-wide, as in a learner: one intra-op thread per scoring thread, freed memory kept. Set
        # here, before the model is built and before any validation scores.
        torch.set_num_threads(1)
        if self.settings.keep_freed_memory:
            keep_freed_memory()
        evaluator = self.build() if self.build is not None else self._evaluator_of_the_run()
        evaluator.prepare()  # the validation rows, assembled while the learners start
        return evaluator

    def _evaluator_of_the_run(self) -> Evaluator:
        from raytrain_seq.runtime.evaluator import Evaluator
        from raytrain_seq.runtime.feed import get_feed
        from raytrain_seq.runtime.learner_feed import LearnerFeed
        from raytrain_seq.runtime.off_loop import off_loop_get
        from raytrain_seq.runtime.ray_store import RayStore

        # This thread is in the averager, an asyncio actor: its reads wait on the objects' futures, off the
        # event loop, where ray.get would log that it blocks the loop (runtime.off_loop).
        feed = LearnerFeed(get_feed(self.feed_name, namespace=self.namespace), get=off_loop_get)
        return Evaluator(self.settings, feed=feed, store=RayStore(get=off_loop_get))

    def error(self) -> str | None:
        """Why the evaluator could not be built (its validation rows assembled), once that is known."""
        if self._evaluator is None or not self._evaluator.done() or self._evaluator.exception() is None:
            return None
        return repr(self._evaluator.exception())

    async def __call__(self, state: AveragedState) -> dict[str, float]:
        self.start()  # a restarted averager starts it near a validation: a validation before it may
        evaluator = await asyncio.wrap_future(self._evaluator)  # raises what building it raised
        return await asyncio.get_running_loop().run_in_executor(self._thread, evaluator.validate, state)
