"""Validation off the learners' critical path: an evaluator scores the averaged model of validation rounds.

On a CPU cluster (``train.validator`` ``auto`` without GPUs, or ``evaluator``) no learner scores the
validation rounds: when round r (r % m == 0) closes, the ``ParameterAverager`` hands its
``AveragedState`` (refs of the merged slices, read from the store like a learner) to ``validate`` and
reports the accuracy to itself; every learner trains on, and round r+1's result waits for it at most
``timeout_s`` (the one-round lag of the batch-size rule). It runs on threads of the averager actor (0
CPUs), one scoring thread per learner; it builds the run's model once, assembles the validation rows
once (the feed's "val" shard) and scores with ``evaluation.evaluate``.
``Evaluator`` is the plain class (tested in process with a fake feed and an ``InProcessStore``);
``runtime.validator.ThreadValidator`` is the picklable callable the control plane awaits, which builds the
real feed, store and ``Evaluator`` on its thread. No ray here.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from raytrain_seq.dataplane.stores import ObjectStore
from raytrain_seq.models.factory import build_model_for
from raytrain_seq.parts import EvaluatorSettings
from raytrain_seq.rounds.state import AveragedState
from raytrain_seq.training.evaluation import EvalResult, eval_micro_batch_size, evaluate
from raytrain_seq.training.staging import collate_stream

logger = logging.getLogger(__name__)

__all__ = ["Evaluator"]


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
