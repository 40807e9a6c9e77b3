"""``EvalResult``: what scoring a model counts, summed over disjoint shards (plain Python, no torch).

``training.evaluation.evaluate`` makes one; ``combine`` sums disjoint shards' results, and a result travels
as plain counts (``tallies``/``from_tallies``), so learners each score a share of a split and the averager
adds the shares (``rounds.tally``). Its own module so that the averager, which only adds counts, imports
no model code: ``models`` loads torchvision, which a restarted averager's process would import before it
answers the learners again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EvalResult"]


@dataclass(frozen=True)
class EvalResult:
    """Scores of a model over a set of block rows; ``combine`` sums the results of disjoint shards."""

    accuracy: float
    """Correct sequences / sequences (top-1; 0.0 for an empty set)."""
    loss: float
    """Mean cross-entropy per sequence."""
    sequences: int
    """How many sequences were scored."""
    per_class: dict[int, tuple[int, int]]
    """label -> (correct, total)."""
    top5_correct: int = 0
    """Sequences whose label is among the 5 highest logits (all of them when there are <= 5 classes)."""
    confusion: dict[tuple[int, int], int] = field(default_factory=dict)
    """(label, predicted class) -> count, the non-zero cells of the confusion matrix."""

    @property
    def top5_accuracy(self) -> float:
        return self.top5_correct / self.sequences if self.sequences else 0.0

    @property
    def mean_class_accuracy(self) -> float:
        """The mean over classes of each class's accuracy (MMAction2's mean class accuracy): every class
        counts the same, however many test videos it has. Classes with no sequence are left out."""
        rates = [c / t for c, t in self.per_class.values() if t]
        return sum(rates) / len(rates) if rates else 0.0

    def tallies(self) -> dict[str, Any]:
        """The counts that a learner sends for its share of a split (plain types; no loss: the shares'
        sums need none): ``from_tallies`` rebuilds the result, ``combine`` sums the shares."""
        return {
            "correct": sum(c for c, _ in self.per_class.values()),
            "sequences": self.sequences,
            "per_class": {str(k): list(v) for k, v in self.per_class.items()},
            "top5_correct": self.top5_correct,
            "confusion": {f"{t},{p}": n for (t, p), n in self.confusion.items()},
        }

    @classmethod
    def from_tallies(cls, tallies: Mapping[str, Any]) -> EvalResult:
        """The result behind ``tallies()`` (loss 0: not sent)."""
        sequences = int(tallies["sequences"])
        return cls(
            accuracy=int(tallies["correct"]) / sequences if sequences else 0.0,
            loss=0.0,
            sequences=sequences,
            per_class={int(k): (int(c), int(t)) for k, (c, t) in tallies.get("per_class", {}).items()},
            top5_correct=int(tallies.get("top5_correct", 0)),
            confusion={
                tuple(int(v) for v in cell.split(",")): int(n)
                for cell, n in tallies.get("confusion", {}).items()
            },
        )

    @classmethod
    def combine(cls, parts: Iterable[EvalResult]) -> EvalResult:
        """One result for the union of disjoint shards' sequences (counts summed, means re-weighted)."""
        parts = list(parts)
        total = sum(p.sequences for p in parts)
        per_class: dict[int, list[int]] = {}
        confusion: dict[tuple[int, int], int] = {}
        for part in parts:
            for label, (c, t) in part.per_class.items():
                tally = per_class.setdefault(label, [0, 0])
                tally[0] += c
                tally[1] += t
            for cell, count in part.confusion.items():
                confusion[cell] = confusion.get(cell, 0) + count
        correct = sum(c for c, _ in per_class.values())
        return cls(
            accuracy=correct / total if total else 0.0,
            loss=sum(p.loss * p.sequences for p in parts) / total if total else 0.0,
            sequences=total,
            per_class={label: (c, t) for label, (c, t) in sorted(per_class.items())},
            top5_correct=sum(p.top5_correct for p in parts),
            confusion=dict(sorted(confusion.items())),
        )
