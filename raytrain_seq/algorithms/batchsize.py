"""AAVG's adaptive batch size (Algorithm 1, lines 13-21): whether a validation grows B, and to what.

Every m rounds the validation accuracy a decides whether B grows: if a < a* x b1 then B <- B x b2, capped,
and a* keeps the best (``AdaptiveBatchSize``). Beyond the paper: the default test is noise-aware (a must
fall below a* by more than the binomial standard error on the validation set's size), B never exceeds a
learner's rows per epoch, and B grows only under the paper's budget of N steps (``batch_may_grow``;
docs/ARCHITECTURE.md, "AAVG model averaging"). Standard library only, like the other algorithm modules
pure; its ``state_dict`` is plain values, for checkpoints. The weights' merge is ``averaging``'s.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

logger = logging.getLogger(__name__)

BATCH_GROWTH: tuple[str, ...] = ("steps", "always")
"""When Algorithm 1 may grow B: "steps" (only under a budget of N optimizer steps), or "always"."""
BATCH_RULES: tuple[str, ...] = ("noise-aware", "paper")
"""Which test grows B (``train.batch_rule``): "noise-aware" (``AdaptiveBatchSize(b1=None)``) or "paper"
(a < a* x b1, b1 = 1). The test says WHETHER a validation grows B; ``BATCH_GROWTH`` says WHEN growth is
allowed at all: under "steps" (the default) neither rule grows B unless the run has a step budget."""


def batch_may_grow(growth: str, steps: int | None) -> bool:
    """Whether a run's batch-size rule may grow B: ``growth`` "always", or "steps" (the default) with a
    budget of ``steps`` optimizer steps per learner (``train.steps``, Algorithm 1's N).

    The paper fixes N, so a larger B sees more data in the same steps. Under a budget of epochs (``steps``
    None) the data is fixed instead, and B x 2 halves the steps left: "steps" then holds B (the rule
    still keeps a* and records what it would have done, ``BatchSizeRecord.held``). ("steps", None) ->
    False, ("steps", 200) -> True, ("always", None) -> True.
    """
    if growth not in BATCH_GROWTH:
        raise ValueError(
            f'batch growth must be one of {", ".join(BATCH_GROWTH)}, got {growth!r}: use "steps" (grow only '
            'under --steps N, the paper\'s budget) or "always" (grow under an epoch budget too)'
        )
    return growth == "always" or steps is not None


@dataclass(frozen=True)
class BatchSizeRecord:
    """One validation of Algorithm 1 (lines 14-20): the accuracy, a* before it, the size after it."""

    accuracy: float
    best_before: float
    size: int
    grew: bool
    threshold: float | None = None
    """The accuracy below which this validation grows B (None in records saved before it was kept)."""
    held: bool = False
    """The accuracy was below the threshold, but the rule holds B (``AdaptiveBatchSize(hold=True)``)."""


def _int_field(name: str, value: Any, fix: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}: {fix}")
    try:
        return operator.index(value)
    except TypeError as exc:
        raise TypeError(f"{name} must be an integer, got {value!r}: {fix}") from exc


def _finite_field(name: str, value: Any, fix: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a number, got {value!r}: {fix}") from exc
    if isinstance(value, bool) or not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}: {fix}")
    return number


class AdaptiveBatchSize:
    """AAVG's batch-size rule (Algorithm 1, lines 13-21), called once per validation.

    If the accuracy a is below a threshold, the batch size is multiplied by b2 (rounded down, capped at
    max_size and at the rows a learner has per epoch); then a* <- max(a*, a), with a* starting at 0.
    The threshold:

    - ``b1=None`` (the default), noise-aware: a* - max(se, 1/n), where se = sqrt(a* (1 - a*) / n) is
      the binomial standard error of an accuracy measured on the n validation sequences (``update``'s
      ``val_size``), and 1/n, one sequence, is the floor: near a* = 0 or 1 the standard error is smaller
      than the step an accuracy on n sequences moves by. n = 10, a* = 0.6: se = sqrt(0.24 / 10) = 0.155,
      so 0.5 (one video fewer) keeps B and 0.4 grows it; a* = 1.0 of 10: se = 0, the floor 0.1 keeps B
      at 0.9 and grows it at 0.8; n = 1000, a* = 0.6: se = 0.0155, so 0.58 grows it. B grows when the
      model got worse by more than the validation set can resolve, not on every dip of a small set. A
      rounding guard of 1e-9 keeps a drop of exactly the margin (1.0 - 0.9 in floats) from counting as
      more.
    - ``b1`` a number, the paper's rule exactly: a* x b1. b1 = 1 (the paper's) grows on any drop below
      the best, b1 < 1 tolerates a small drop, b1 > 1 demands a relative improvement. The paper uses
      b1=1, b2=2, max 576 with a large validation set and ImageNet-initialised weights; on 10 validation
      videos every one-video dip doubles B, so B ratchets to the cap.

    ``update``'s ``rows_cap`` (the rows, i.e. blocks, one learner gets per epoch) also caps B: a step
    can take no more rows than the epoch holds, and beyond that a doubling only removes steps. When the
    cap falls below the current B (more learners share the epoch) B comes down to it; it never goes
    below ``initial``, the user's own choice.

    ``hold=True`` keeps B at ``initial`` (a run whose budget is epochs, ``batch_may_grow``): the rule
    still runs, a* and the threshold are kept, and a validation below the threshold is recorded as
    ``held`` instead of growing B.
    """

    def __init__(
        self,
        initial: int,
        *,
        b1: float | None = None,
        b2: float = 2,
        max_size: int = 576,
        hold: bool = False,
    ) -> None:
        self._configure(initial, b1, b2, max_size)
        if not isinstance(hold, bool):
            raise TypeError(f"hold must be True or False, got {hold!r}: True keeps B at initial")
        self._hold = hold
        self._size = self._initial
        self._best = 0.0
        self._history: list[BatchSizeRecord] = []

    def _configure(self, initial: Any, b1: Any, b2: Any, max_size: Any) -> None:
        initial = _int_field("initial", initial, "pass the starting batch size as an int >= 1")
        max_size = _int_field("max_size", max_size, "pass the largest batch size as an int")
        if b1 is not None:
            b1 = _finite_field("b1", b1, "pass None (noise-aware) or the paper's accuracy margin, e.g. 1.0")
            if b1 <= 0:
                raise ValueError(
                    f"b1 must be > 0, got {b1}: use 1.0 (the paper: grow on any drop below the best accuracy) "
                    "or None (grow on a drop beyond the validation set's noise)"
                )
        b2 = _finite_field("b2", b2, "pass the growth factor, e.g. 2")
        if initial < 1:
            raise ValueError(f"initial must be >= 1, got {initial}: pass a positive batch size")
        if b2 < 1:
            raise ValueError(f"b2 must be >= 1, got {b2}: the batch size only grows; use 2 as in the paper")
        if max_size < initial:
            raise ValueError(f"max_size {max_size} < initial {initial}: raise max_size or lower initial")
        self._initial, self._b1, self._b2, self._max_size = initial, b1, b2, max_size

    @property
    def size(self) -> int:
        """The current batch size B_n."""
        return self._size

    @property
    def best(self) -> float:
        """a*, the best accuracy seen so far (0 before any update)."""
        return self._best

    @property
    def noise_aware(self) -> bool:
        """True for the default noise-aware threshold, False for the paper's a* x b1."""
        return self._b1 is None

    @property
    def hold(self) -> bool:
        """True when B is held at ``initial`` whatever the accuracy (an epoch budget)."""
        return self._hold

    @property
    def history(self) -> list[BatchSizeRecord]:
        """One record per update, oldest first (a copy)."""
        return list(self._history)

    def threshold(self, val_size: int | None = None) -> float:
        """The accuracy below which the next ``update`` grows B (the rule of the class docstring)."""
        if self._b1 is not None:
            return self._best * self._b1
        if val_size is None:
            raise ValueError(
                "val_size is missing: the noise-aware rule (b1=None, train.b1 = none) needs the number of "
                "validation sequences the accuracy was measured on; pass update(accuracy, val_size=n), "
                "or set b1 (train.b1 = 1.0) for the paper's rule"
            )
        n = _int_field("val_size", val_size, "pass the number of validation sequences, an int >= 1")
        if n < 1:
            raise ValueError(f"val_size must be >= 1, got {n}: pass the number of validation sequences")
        return self._best - max(math.sqrt(self._best * (1.0 - self._best) / n), 1.0 / n)

    def update(self, accuracy: float, *, val_size: int | None = None, rows_cap: int | None = None) -> int:
        """Apply lines 15-20 for one validation accuracy; return the batch size to use from now on.

        ``val_size``: the validation sequences behind ``accuracy`` (required by the noise-aware rule).
        ``rows_cap``: the rows one learner gets per epoch now; B stays at or below max(initial, rows_cap).
        """
        a = _finite_field("accuracy", accuracy, "pass the validation accuracy as a finite number")
        limit = self._max_size
        if rows_cap is not None:
            cap = _int_field("rows_cap", rows_cap, "pass the rows one learner gets per epoch, an int >= 1")
            if cap < 1:
                raise ValueError(
                    f"rows_cap must be >= 1, got {cap}: pass the rows one learner gets per epoch"
                )
            limit = min(limit, max(self._initial, cap))
        threshold = self.threshold(val_size)
        best_before, before = self._best, self._size
        size = before
        # The paper's comparison is exact; the noise-aware one gets the rounding guard (class docstring).
        below = a < threshold - (1e-9 if self._b1 is None else 0.0)
        if below and not self._hold:
            size = int(before * self._b2)
        self._size = min(size, limit)
        if a > best_before:
            self._best = a
        grew = self._size > before
        self._history.append(
            BatchSizeRecord(a, best_before, self._size, grew, threshold, below and self._hold)
        )
        if below and self._hold:
            logger.info(
                "batch size held at %d: accuracy %g < threshold %g (epoch budget)", before, a, threshold
            )
        if grew:
            logger.info("batch size %d -> %d: accuracy %g < threshold %g", before, self._size, a, threshold)
        elif self._size < before:
            logger.info(
                "batch size %d -> %d: a learner has only %d rows per epoch", before, self._size, limit
            )
        return self._size

    def state_dict(self) -> dict[str, Any]:
        """Plain python types only, for checkpoints."""
        config = {"initial": self._initial, "b1": self._b1, "b2": self._b2, "max_size": self._max_size}
        config["hold"] = self._hold
        history = [asdict(record) for record in self._history]
        return {**config, "size": self._size, "best": self._best, "history": history}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state_dict() (configuration included), validating it first; older dicts load too
        (one saved before ``hold`` existed grew B under any budget: it loads with hold False)."""
        required = ("initial", "b1", "b2", "max_size", "size", "best", "history")
        missing = [key for key in required if key not in state]
        if missing:
            raise ValueError(f"batch-size state lacks {missing}: pass AdaptiveBatchSize.state_dict()'s dict")
        # Built aside and swapped in whole, so a bad checkpoint leaves this object as it was.
        config = {key: state[key] for key in ("b1", "b2", "max_size")}
        fresh = AdaptiveBatchSize(state["initial"], **config, hold=state.get("hold", False))
        size = _int_field("size", state["size"], "pass the saved batch size")
        if not fresh._initial <= size <= fresh._max_size:
            raise ValueError(f"size {size} is outside [initial {fresh._initial}, max_size {fresh._max_size}]")
        fresh._size = size
        fresh._best = _finite_field("best", state["best"], "pass the saved best accuracy")
        try:
            fresh._history = [BatchSizeRecord(**record) for record in state["history"]]
        except TypeError as exc:
            raise ValueError(
                f"history entries need keys accuracy, best_before, size, grew (and threshold, held): {exc}"
            ) from exc
        self.__dict__.update(fresh.__dict__)
