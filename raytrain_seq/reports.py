"""The reports that cross processes into a run's summary: the averager's, the feed's and rank 0's.

Three actors end a run knowing something the summary needs: the averager (``AveragingReport``, its
``summary()``: rounds, per-learner totals, histories, membership), the feed (``FeedReport``, its
``stats()``: videos, packing and refurbishing per epoch) and rank 0's learner (``LearnerReport``, its
final metrics: the test scores and its own clock). Each producer builds its report and sends
``to_dict()`` (plain data: Ray pickles it cheaply and the tests read it as a dict); the driver reads it
back with ``from_dict``, which refuses a report that lacks a field or has one it does not know, naming
them, so ``driver.build_summary`` reads fields and never guesses a default.

Contract: ``from_dict(r.to_dict()) == r``; ``to_dict`` gives exactly the keys the producer always sent
(an optional field that is None is left out where the producer left its key out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["AveragingReport", "FeedReport", "LearnerReport", "LearnerStop"]

_R = TypeVar("_R")


def _to_dict(report: Any, omit_if_none: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields as a dict (values as they are, not copied deeply), less the ``omit_if_none`` ones
    that are None."""
    out = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}
    for name in omit_if_none:
        if out[name] is None:
            del out[name]
    return out


def _from_dict(cls: type[_R], d: Mapping[str, Any]) -> _R:
    """``cls(**d)``, with an error naming the keys missing and unknown instead of a bare TypeError."""
    if not isinstance(d, Mapping):
        raise TypeError(f"{cls.__name__}.from_dict takes a dict, not {type(d).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    required = {
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    missing, unknown = sorted(required - set(d)), sorted(set(d) - set(fields))
    if missing or unknown:
        raise ValueError(
            f"{cls.__name__}.from_dict: missing {missing}, unknown {unknown}: the producer and the driver "
            "run different versions of raytrain_seq (reinstall the same one on every node)"
        )
    return cls(**d)


@dataclass(frozen=True, kw_only=True)
class AveragingReport:
    """What ``ParameterAverager.summary()`` reports: the run history (``rounds.events.RunHistory``)
    plus the round book's membership and the data plane's counts."""

    rounds_completed: int
    """Averaging rounds closed in this run (a restarted averager counts those in its events log)."""
    learners: dict[Any, dict[str, float]]
    """Per learner id, its summed round stats (frames, compute_s, averaging_s, waiting_s, ...)."""
    total_averaging_s: float
    """The learners' averaging seconds, summed."""
    round_seconds: list[float]
    """Each closed round's length, first arrival to close."""
    recoveries: list[dict[str, Any]]
    """Drops, restarts and re-seeds: ``{elapsed_s, kind, detail, ...}``."""
    failed_rounds: list[dict[str, Any]]
    """Rounds that failed (too few learners), with why."""
    batch_size_history: list[dict[str, Any]]
    """``{round, batch_size, time_s}`` from each round on."""
    validation_history: list[dict[str, Any]]
    """``{round, epoch, accuracy, time_s, ...}`` per validation; a missed one has ``missed``."""
    loss_history: list[dict[str, Any]]
    """``{round, loss, time_s}`` per round (NaN when a round's loss was not finite)."""
    elapsed_s: float
    """The run's training clock when the report was made."""
    next_round: int
    """The round the learners send next."""
    open_round: dict[str, Any]
    """``{phase, arrived}`` of the round being collected."""
    world_size: int
    """Learners the averager expects now."""
    generation: int
    """How often the group's membership changed."""
    dropped: list[dict[str, Any]]
    """The round book's drops: ``{learner, round, reason, ...}``."""
    membership: list[dict[str, Any]]
    """The round book's membership log (joins, drops, rejoins, leaves)."""
    position: dict[str, Any] | None
    """The latest averaged state's ``EpochPosition.as_dict()``; None before the first round."""
    shards: int
    """Averaging shards that merge the flat payloads."""
    channels: dict[str, Any]
    """Channel generations: ``{enabled, generations, live, ended}``."""
    hub_load: list[dict[str, Any]]
    """Per round, the bytes each averaging actor moved."""
    test: dict[str, Any] | None
    """The summed test tallies (``rounds.tally.ShareTally.totals``); None before a test pass."""
    validator_error: str | None = None
    """Why the evaluator could not validate (the driver raises it); None when it could."""


@dataclass(frozen=True, kw_only=True)
class FeedReport:
    """What ``BlockFeed.stats()`` reports: videos per split, and per epoch the packing and the partial
    augmentations recomputed and reused."""

    videos: dict[str, Any]
    """``{train, val, test}`` counts, ``skipped`` and ``decode_failed`` paths, ``length_fixed``."""
    flow_method: str | None
    """The optical flow method(s) used; None for an RGB stream."""
    flow_once: bool
    """Whether each video's flow is computed once and windows cut from it."""
    epochs: dict[int, dict[str, Any]]
    """Per epoch: ``packing`` (``PackPlan.stats``), recomputed, reused, partial videos and seconds."""
    eval: dict[str, Any]
    """Evaluation's partial augmentations: ``{videos, seconds}``."""
    totals: dict[str, Any]
    """The epochs' sums (recomputed, reused, partial_videos, partial_seconds, flow counts) and
    ``tasks_pending``."""
    t_max: int
    """Frames per block."""
    max_sequences: int
    """The most sequences a block holds."""
    reuse: int
    """Refurbishing's r: each partial augmentation serves r epochs."""
    restarts: list[dict[str, Any]]
    """The feed's restarts by Ray: ``{time, kind, detail}`` (wall time)."""


@dataclass(frozen=True, kw_only=True)
class LearnerStop:
    """Why rank 0 ended the run before its final metrics, returned in their place (the driver raises it)."""

    reason: str
    """What stopped it: "checkpoint" (a checkpoint could not be written)."""
    message: str
    """Rank 0's error, naming the folder and the fix."""

    def __post_init__(self) -> None:
        if self.reason not in STOP_REASONS:
            raise ValueError(f"LearnerStop.reason must be one of {STOP_REASONS}, got {self.reason!r}")


STOP_REASONS = ("checkpoint",)


@dataclass(frozen=True, kw_only=True)
class LearnerReport:
    """Rank 0's final metrics (``Learner.finish``): its clock, what was trained and the summed test."""

    round: int
    """The last averaged round."""
    epoch: int
    """The epoch training ended in (its position's)."""
    batch_size: int
    """The batch size at the end."""
    learner_seconds: float
    """Rank 0's training loop, the run's clock (from the averaged state's elapsed time)."""
    averaging_s: float
    """Rank 0's seconds in averaging rounds."""
    compute_s: float
    """Rank 0's seconds of compute (steps, staging)."""
    data_wait_s: float
    """Rank 0's seconds waiting for rows."""
    cold_epoch_s: float
    """Rank 0's wait for epoch 0's partial augmentations."""
    validation_s: float
    """Rank 0's seconds scoring its validation shares."""
    test_s: float
    """Rank 0's seconds of the test pass."""
    first_step_wall: float | None
    """Wall time of rank 0's first step; None when it took none."""
    timeline: dict[str, float]
    """Rank 0's wall-time marks (built, joined, first_step, trained, ...)."""
    steps_trained: int | None
    """Optimizer steps at the end (None when the position does not count them)."""
    epochs_trained: float
    """Epochs done, fractional when train.steps ended the run inside an epoch."""
    test_sequences_mine: int
    """Test sequences rank 0 scored."""
    test_accuracy: float | None
    """Top-1 over the summed test shares (None when no test sequence was scored)."""
    test_sequences: int
    """Test sequences scored by every learner together."""
    test_learners: int
    """Learners whose test shares the sum holds."""
    per_class: dict[str, list[int]]
    """``{class index: [correct, total]}`` over the test split."""
    top5_accuracy: float | None
    """Top-5 over the summed test shares."""
    mean_class_accuracy: float | None
    """The mean of the classes' accuracies."""
    confusion: dict[str, int]
    """``{"true,pred": count}`` over the test split."""
    final_report_wall: float
    """Wall time rank 0 finished its test pass (the final checkpoint and the summary follow)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data: what ``finish`` returns (Ray Train's ``Result.return_value``)."""
        return _to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LearnerReport:
        """Inverse of ``to_dict``; ValueError naming missing or unknown keys."""
        return _from_dict(cls, d)
