"""``BatchRule``: what a validation's accuracy makes of the batch size (AAVG Algorithm 1, lines 13-21).

Every m-th round's averaged model is validated (``rounds.validation``) and its accuracy decides B for the
round after next: ``AdaptiveBatchSize``, held at its start when the run's batch growth says so
(``batchsize.batch_may_grow``), and not asked at all when the batch is not adaptive (an ablation). The
averager tells the rule each scored validation, hands its B out with every round's result and keeps its
state in checkpoints (``adaptive_state``). Plain Python, no asyncio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raytrain_seq.algorithms.batchsize import AdaptiveBatchSize, batch_may_grow
from raytrain_seq.rounds.settings import AveragerSettings

__all__ = ["BatchDecision", "BatchRule"]


@dataclass(frozen=True)
class BatchDecision:
    """What one validation decided: B after it, and whether it grew."""

    size: int
    grew: bool


class BatchRule:
    """The batch-size rule of one averager, from its ``settings`` (B, b1, b2, the cap, the growth)."""

    def __init__(self, settings: AveragerSettings) -> None:
        hold = not batch_may_grow(settings.batch_growth, settings.steps)  # B held under an epoch budget
        self.batch = AdaptiveBatchSize(
            settings.batch_size, b1=settings.b1, b2=settings.b2, max_size=settings.max_batch_size, hold=hold
        )
        self.adaptive = settings.adaptive_batch

    @property
    def size(self) -> int:
        """B now."""
        return self.batch.size

    def state_dict(self) -> dict[str, Any]:
        return self.batch.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take a restored or re-seeded run's batch-size rule (its ``adaptive_state``)."""
        self.batch.load_state_dict(dict(state))

    def decide(self, accuracy: float, *, val_size: int | None, rows_cap: int | None) -> BatchDecision:
        """A validation's accuracy decides B (kept as it is when the batch is not adaptive)."""
        before = self.batch.size
        size = self.batch.update(accuracy, val_size=val_size, rows_cap=rows_cap) if self.adaptive else before
        return BatchDecision(size, size > before)
