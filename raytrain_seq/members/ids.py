"""A learner's id in an averaging group, and the check every public entry point applies to one.

``LearnerId`` is a learner's rank in its group (an int) or a name for a reporter that is not a rank
(``"evaluator"``, ``"validator"``). ``check_learner`` raises ``TypeError`` for anything else (a bool
included, though Python counts it as an int), naming the value and the fix. ``ordered`` sorts ids
(ints before strs), so a result never depends on the order learners arrived in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["LearnerId", "check_learner", "ordered"]

# A learner's id: its rank in the group (an int), or a name for a reporter that is not a rank ("evaluator").
LearnerId = str | int


def check_learner(learner: Any) -> None:
    """``learner`` is a str or an int (not a bool), else ``TypeError``."""
    if isinstance(learner, bool) or not isinstance(learner, str | int):
        raise TypeError(f"learner must be a str or int id, got {learner!r}: pass e.g. the learner's rank")


def ordered(learners: Iterable[LearnerId]) -> list[LearnerId]:
    """``learners`` sorted, ints before strs (a mixed set cannot be sorted by value alone)."""
    return sorted(learners, key=lambda x: (isinstance(x, str), x))
