"""``ValidationGate``: which validation reports count, and what B becomes (AAVG Algorithm 1, lines 13-21).

Every m-th round's averaged model is validated and its accuracy decides the batch size of the round after
next (``AdaptiveBatchSize``; held when the run's batch growth says so, ``averaging.batch_may_grow``). The
gate owns that rule and, when the learners score the validation themselves (no evaluator: GPU learners),
the tally of their shares: a share counts only for the validation due, and the group's shares are summed
once each of its learners sent one. The averager asks the gate and records what it decides; the round
book (``rounds.book``) says which round is due. Plain Python, no asyncio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raytrain_seq.averaging import AdaptiveBatchSize, batch_may_grow
from raytrain_seq.members.ids import LearnerId
from raytrain_seq.rounds.settings import AveragerSettings
from raytrain_seq.rounds.tally import ShareTally
from raytrain_seq.step import EvalResult

__all__ = ["BatchDecision", "ShareDecision", "ValidationGate"]


@dataclass(frozen=True)
class BatchDecision:
    """What one validation report decided: B after it, and whether it grew."""

    size: int
    grew: bool


@dataclass(frozen=True)
class ShareDecision:
    """A learner's validation share: whether it was taken, and the group's sum once it completed it."""

    taken: bool
    total: EvalResult | None = None


class ValidationGate:
    """The batch-size rule and the learners' validation shares of one averager.

    by_learners: the learners score the validations (no evaluator), so their shares are taken."""

    def __init__(self, settings: AveragerSettings, *, by_learners: bool) -> None:
        hold = not batch_may_grow(settings.batch_growth, settings.steps)  # B held under an epoch budget
        self.batch = AdaptiveBatchSize(
            settings.batch_size, b1=settings.b1, b2=settings.b2, max_size=settings.max_batch_size, hold=hold
        )
        self.adaptive = settings.adaptive_batch
        self.by_learners = by_learners
        self.shares = ShareTally()  # the due validation's shares, by learner

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

    def new_pass(self) -> None:
        """The learners are asked to score a validation (or a new group scores its own): no shares yet."""
        self.shares.clear()

    def take_share(
        self, learner: LearnerId, round: int, tallies: Mapping[str, Any], world_size: int, *, due: int | None
    ) -> ShareDecision:
        """``learner``'s tallies of its share of round ``round``'s validation, of a group of
        ``world_size``; ``due``: the round whose validation is due (None: none). Not taken when the
        learners do not score validations or ``round`` is not due; a group of another size than the
        shares held starts the tally again (its split of the split is another)."""
        EvalResult.from_tallies(tallies)  # bad tallies raise here, whether or not the share is taken
        if not self.by_learners or due != round:
            return ShareDecision(taken=False)
        if self.shares.world != world_size:
            self.shares.clear()
        if not self.shares.add(learner, tallies, world_size):
            return ShareDecision(taken=True)
        total = self.shares.total()
        self.shares.shares = {}  # the group's size stays: the next validation's shares come from it
        return ShareDecision(taken=True, total=total)

    def missing(self, world_size: int) -> str:
        """Why the learners' validation is missed when its round's successor closes: the shares that came."""
        return f"{len(self.shares)} of {self.shares.world or world_size} learners' shares came"
