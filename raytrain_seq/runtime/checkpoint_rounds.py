"""What a learner hands ``report`` at a checkpoint round: the round's metrics, and rank 0's checkpoint.

Every rank calls ``report(metrics, folder)`` at a checkpoint round (``checkpoint.is_due``); rank 0 hands a
temporary folder holding the averager's state and history for it (``checkpoint.save``), which the report
puts in the run folder, the others None. A checkpoint due while the averager is away is skipped, but the
final one (``AveragerClient.checkpoint_contents(wait=False)``): rank 0 trains on rather than wait for it,
and the next checkpoint round writes one. A learner realigned past checkpoint rounds the others averaged
reports them too (``catch_up``). No ray.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from raytrain_seq import checkpoint
from raytrain_seq.outputs.reports import LearnerReport, RoundMetrics
from raytrain_seq.rounds.client import AveragerClient, Realigned
from raytrain_seq.rounds.position import EpochPosition
from raytrain_seq.rounds.sync import missed_checkpoint_rounds

__all__ = ["CheckpointRounds", "Report"]

logger = logging.getLogger(__name__)

# report(metrics, checkpoint_folder): called by every rank at a checkpoint round; the folder, given on
# rank 0 only, holds the files of ``checkpoint.save``, which it puts in the run folder. The final
# checkpoint and metrics go to a ``keep_final`` of the same shape, rank 0 only (``Learner.finish``).
Report = Callable[[RoundMetrics | LearnerReport, Path | None], None]


class CheckpointRounds:
    """One learner's reports at checkpoint rounds (the module docstring)."""

    def __init__(
        self, client: AveragerClient, report: Report, *, every: int, config: Any, model_spec: Any
    ) -> None:
        self.client, self.report, self.every = client, report, every
        self.config, self.model_spec = config, model_spec  # recorded in each checkpoint

    def metrics(self, position: EpochPosition) -> RoundMetrics:
        """The metrics of the latest round this learner took, at ``position``."""
        return RoundMetrics(
            round=self.client.next_round - 1, epoch=position.epoch, batch_size=self.client.batch_size
        )

    def reached(self, position: EpochPosition, *, rank: int, final: bool) -> None:
        """A checkpoint round's ``report`` (rank 0's with the checkpoint; the final one waits for it)."""
        metrics = self.metrics(position)
        contents = None if rank != 0 else self.client.checkpoint_contents(metrics.round, wait=final)
        if contents is None:
            if rank == 0:
                logger.warning("the checkpoint of round %d is skipped: the averager is away", metrics.round)
            self.report(metrics, None)
            return
        with self.folder(position, metrics.round, contents) as folder:
            self.report(metrics, folder)

    def catch_up(self, decision: Realigned, *, finished: Callable[[EpochPosition], bool]) -> None:
        """The ``report`` calls of the checkpoint rounds the others averaged without this learner."""
        state = decision.reply.state
        latest = EpochPosition(0) if state.position is None else EpochPosition.from_dict(state.position)
        final = finished(latest)
        for round_ in missed_checkpoint_rounds(
            decision.first_missed, state.round, every=self.every, latest_is_final=final
        ):
            self.report(
                RoundMetrics(round=round_, epoch=latest.epoch, batch_size=self.client.batch_size), None
            )

    @contextlib.contextmanager
    def folder(self, position: EpochPosition, done: int, contents: Any = None) -> Iterator[Path]:
        """A temporary folder holding the averager's round-``done`` checkpoint (``checkpoint.save``), of
        ``contents`` when given (``AveragerClient.checkpoint_contents``)."""
        state, history = contents or self.client.checkpoint_contents(done)
        with tempfile.TemporaryDirectory() as folder:
            checkpoint.save(
                folder,
                state=state,
                history=history.as_dict(),
                config=self.config,
                position=position.as_dict(),
                model_spec=self.model_spec.as_dict(),
            )
            yield Path(folder)
