"""The reports that cross processes into a run's summary: the averager's, the feed's and rank 0's.

Three actors end a run knowing something the summary needs: the averager (``AveragingReport``, its
``summary()``: rounds, per-learner totals, histories, membership), the feed (``FeedReport``, its
``stats()``: videos, packing and refurbishing per epoch) and rank 0's learner (``LearnerReport``, its
final metrics: the test scores and its own clock). Each producer returns its report as it is, a frozen
dataclass that Ray pickles, so ``driver.build_summary``, the benches and the tests read fields and
never guess a key; none is written as JSON (``summary.RunSummary`` is the run's summary.json).
``RoundMetrics`` is what every learner hands its ``report`` at a checkpoint round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raytrain_seq.rounds.tally import TestTotals

__all__ = ["AveragingReport", "FeedReport", "JoinedProcess", "LearnerReport", "LearnerStop", "RoundMetrics"]


@dataclass(frozen=True, kw_only=True)
class JoinedProcess:
    """One learner process of the current group, as the averager knows it from its join."""

    learner: int | str
    """Its learner id (its slot)."""
    incarnation: str
    """The id the process joined with, fresh in every process (a restart changes it)."""
    node: str | None
    """The Ray node it runs on; None when it did not say."""


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
    test: TestTotals | None
    """The summed test tallies (``rounds.tally.ShareTally.totals``); None before a test pass."""
    validator_error: str | None = None
    """Why the evaluator could not validate (the driver raises it); None when it could."""
    processes: tuple[JoinedProcess, ...] = ()
    """The current group's learner processes that joined, in learner order."""


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
class RoundMetrics:
    """What every learner hands its ``report`` at a checkpoint round (``runtime.fleet.put_checkpoint``)."""

    round: int
    """The averaged round."""
    epoch: int
    """The epoch of the position training goes on from."""
    batch_size: int
    """The batch size decided for the rounds after it."""

    def to_dict(self) -> dict[str, int]:
        """The fields as a dict, in their order."""
        return {"round": self.round, "epoch": self.epoch, "batch_size": self.batch_size}


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
