"""Validation off the learners' critical path: an evaluator scores the averaged model of validation rounds.

On a CPU cluster (``train.validator`` ``auto`` without GPUs, or ``evaluator``) no learner scores the
validation rounds: when round r (r % m == 0) closes, the ``ParameterAverager`` hands its
``AveragedState`` (refs of the merged slices, read from the store like a learner) to ``validate`` and
reports the accuracy to itself; every learner trains on, and round r+1's result waits for it at most
``timeout_s`` (the one-round lag of the batch-size rule). It runs on threads of the averager actor (0
CPUs), one scoring thread per learner; it builds the run's model once, assembles the validation rows
once (the feed's "val" shard) and scores with ``evaluation.evaluate``.
``Evaluator`` is the plain class (tested in process with a fake feed and an ``InProcessStore``);
``ThreadValidator`` is the picklable callable the control plane awaits, which builds the real feed,
store and ``Evaluator`` on its thread. ray is imported only inside the functions that talk to a cluster.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from raytrain_seq.dataplane.stores import ObjectStore
from raytrain_seq.models.factory import build_model_for
from raytrain_seq.parts import EvaluatorSettings
from raytrain_seq.rounds.state import AveragedState
from raytrain_seq.training.evaluation import EvalResult, eval_micro_batch_size, evaluate
from raytrain_seq.training.heap import keep_freed_memory
from raytrain_seq.training.staging import collate_stream

logger = logging.getLogger(__name__)

__all__ = ["Evaluator", "ThreadValidator"]


class Evaluator:
    """Scores averaged states on an evaluation split; the rows are assembled once and kept.

    ``threads`` score disjoint parts of the rows at once (one torch thread each, results combined with
    ``EvalResult.combine``); None = one per learner (``train.max_learners``), at most one per core this
    process may run on. Why: on a node whose cores the learners keep busy, one scoring thread sits on one
    learner's core and slows that learner alone (its peers then wait for it at the round); threads spread
    over the cores slow them alike.
    """

    def __init__(
        self,
        settings: EvaluatorSettings,
        *,
        feed: Any,
        store: ObjectStore,
        split: str = "val",
        threads: int | None = None,
    ) -> None:
        if split not in ("val", "test"):
            raise ValueError(f"split must be 'val' or 'test', got {split!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(
                f"threads must be an int >= 1 or None, got {threads!r}: pass e.g. 2, or None for one per learner"
            )
        spec = feed.model_spec()
        self.model = build_model_for(
            settings.model, num_classes=spec.num_classes, in_channels=spec.in_channels
        )
        # Never trained here: eval mode once, so that concurrent evaluate() calls never toggle it.
        self.model.eval()
        cores = len(os.sched_getaffinity(0))
        self.threads = threads if threads is not None else max(1, min(cores, settings.max_learners))
        self.settings, self.feed, self.store, self.split = settings, feed, store, split
        self._rows: list[dict[str, torch.Tensor]] | None = None
        # The scoring threads live as long as the evaluator: new threads every validation would each
        # start from an empty heap arena and page-fault their activations in again.
        self._pool = (
            ThreadPoolExecutor(self.threads, thread_name_prefix="score") if self.threads > 1 else None
        )
        self.scored: list[int] = []  # the rounds scored, in order

    def prepare(self) -> int:
        """Assemble and keep the split's rows now (the driver calls it at the start, so that the first
        validation round does not wait for them); returns how many batches of rows were kept."""
        if self._rows is None:
            self._rows = collate_stream(self.feed.eval_rows(self.split))
        return len(self._rows)

    def score(self, state: AveragedState) -> EvalResult:
        """The averaged model of ``state`` on the split (the state read from the store if it lives there)."""
        if state.empty:
            raise ValueError("state holds no averaged model (round 0): score a round's state")
        state = state.materialise(self.store.get)
        self.model.load_state_dict(dict(state.params))
        self.prepare()
        micro = eval_micro_batch_size(self.settings.micro_batch_size)
        # Batches dealt round-robin: 7 batches over 2 threads -> batches 0, 2, 4, 6 and 1, 3, 5.
        parts = [self._rows[i :: self.threads] for i in range(min(self.threads, len(self._rows)))]
        if len(parts) <= 1 or self._pool is None:
            result = evaluate(self.model, self._rows, micro_batch_size=micro)
        else:
            scored = self._pool.map(lambda part: evaluate(self.model, part, micro_batch_size=micro), parts)
            result = EvalResult.combine(list(scored))
        self.scored.append(state.round)
        return result

    def validate(self, state: AveragedState) -> dict[str, float]:
        """The scores of ``state``'s averaged model that the control plane reports for B: accuracy, the
        validation sequences behind it (the noise-aware batch rule's n), top-5 and mean class accuracy."""
        result = self.score(state)
        return {
            "accuracy": result.accuracy,
            "sequences": result.sequences,
            "top5_accuracy": result.top5_accuracy,
            "mean_class_accuracy": result.mean_class_accuracy,
        }


class ThreadValidator:
    """The control plane's validator: ``await validator(state)`` scores ``state`` with an ``Evaluator`` that
    lives on a thread of the process holding this object, the averager actor.

    Why not an actor of its own: a process that imports torch and builds the model at the job's start
    competes with the learners' start on a busy node, and the averager has torch loaded already. Interleaved
    demos on the 2-core box: start-up and the job shorter, the learners' rounds no less even (docs/ARCHITECTURE.md, "Measurements behind the code"). The evaluator keeps freed heap memory (``heap.py``) like a learner, or every
    validation maps its activations afresh and the learners beside it slow down (the same LOG entry).

    ``start()`` (the averager calls it when it starts) builds the evaluator and assembles the validation
    rows on that thread; validations queue behind it. Picklable until started, so the driver hands it to
    the averager's constructor; a restarted averager builds a new one. ray is imported only on the thread.
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
        # Process-wide, as in a learner: one intra-op thread per scoring thread, freed memory kept.
        torch.set_num_threads(1)
        if self.settings.keep_freed_memory:
            keep_freed_memory()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="evaluator")
        self._evaluator = self._thread.submit(self._prepared)

    def _prepared(self) -> Evaluator:
        evaluator = self.build() if self.build is not None else self._evaluator_of_the_run()
        evaluator.prepare()  # the validation rows, assembled while the learners start
        return evaluator

    def _evaluator_of_the_run(self) -> Evaluator:
        from raytrain_seq.runtime.feed import get_feed
        from raytrain_seq.runtime.learner_feed import LearnerFeed
        from raytrain_seq.runtime.off_loop import off_loop_get
        from raytrain_seq.runtime.shards import RayStore

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
        if self._thread is None or self._evaluator is None:
            raise RuntimeError("ThreadValidator.start() was not called: the averager starts its validator")
        evaluator = await asyncio.wrap_future(self._evaluator)  # raises what building it raised
        return await asyncio.get_running_loop().run_in_executor(self._thread, evaluator.validate, state)
