"""``ShareTally``: the learners' shares of one evaluation pass (validation or test), summed once all are in.

Each learner scores its own share of a split and sends its tallies (``EvalResult.tallies``); the
tally keeps one share per learner and says when the ``world_size`` learners of the latest share's group
are in. The sum is ``EvalResult.combine``, the project's one way to
add up scores of disjoint shards. Plain Python, no asyncio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raytrain_seq.checks import check_number
from raytrain_seq.members.ids import LearnerId, check_learner
from raytrain_seq.training.eval_result import EvalResult

__all__ = ["ShareTally", "TestTotals"]


@dataclass(frozen=True, kw_only=True)
class TestTotals:
    """The learners' shares of a test pass, summed (``ShareTally.totals``): what ``report_test`` answers."""

    __test__ = False  # not a pytest test class

    correct: int
    """Sequences scored right (top-1)."""
    sequences: int
    """Sequences scored."""
    accuracy: float
    """Top-1 over the summed shares."""
    top5_accuracy: float
    """Top-5 over the summed shares."""
    mean_class_accuracy: float
    """The mean of the classes' accuracies."""
    per_class: dict[str, list[int]]
    """``{class index: [correct, total]}``."""
    confusion: dict[str, int]
    """``{"true,pred": count}``."""
    learners: int
    """How many learners' shares the sums hold."""


class ShareTally:
    """One pass's shares by learner, for a group of ``world`` learners (None: no share yet)."""

    def __init__(self) -> None:
        self.shares: dict[LearnerId, EvalResult] = {}
        self.world: int | None = None

    def __len__(self) -> int:
        return len(self.shares)

    def clear(self) -> None:
        """Forget every share (a new pass, or a new group that scores its own)."""
        self.shares, self.world = {}, None

    def add(self, learner: LearnerId, tallies: Mapping[str, Any], world_size: int) -> bool:
        """Take ``learner``'s share of a group of ``world_size``; whether that many shares are in."""
        check_learner(learner)
        check_number("world_size", world_size, 1)
        self.shares[learner] = EvalResult.from_tallies(tallies)
        self.world = world_size
        return self.complete

    @property
    def complete(self) -> bool:
        return self.world is not None and len(self.shares) >= self.world

    def total(self) -> EvalResult:
        """The sum of the shares held (``EvalResult.combine``)."""
        return EvalResult.combine(self.shares.values())

    def totals(self) -> TestTotals:
        """The sum as a test pass reports it: counts, accuracies, per class, the confusion cells
        ("true,pred") and how many learners' shares it holds."""
        total = self.total()
        return TestTotals(
            correct=sum(c for c, _ in total.per_class.values()),
            sequences=total.sequences,
            accuracy=total.accuracy,
            top5_accuracy=total.top5_accuracy,
            mean_class_accuracy=total.mean_class_accuracy,
            per_class={str(k): [c, t] for k, (c, t) in total.per_class.items()},
            confusion={f"{t},{p}": n for (t, p), n in total.confusion.items()},
            learners=len(self.shares),
        )
