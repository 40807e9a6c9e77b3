"""``AveragerSettings``: everything the parameter-averaging actor is told, in one frozen value.

Built from the config's ``train`` section (``parts.Parts.of``) and passed whole to the
actor, so the driver copies no field by hand and a test states only what it changes from the defaults.
The checks run at construction, in the driver, before any actor starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from raytrain_seq.algorithms.batchsize import AdaptiveBatchSize, batch_may_grow
from raytrain_seq.checks import check_number
from raytrain_seq.config import TRACKERS

__all__ = ["AveragerSettings"]


@dataclass(frozen=True, kw_only=True)
class AveragerSettings:
    """The averager's settings (AAVG rounds, the batch-size rule, the data plane, where training ends)."""

    world_size: int
    """Learners the first group starts with (each group's first learner sets its own size)."""
    timeout_s: float = 300.0
    """A round closes this long after its first arrival without the missing learners."""
    probe_s: float = 0.0
    """Every this many seconds a round probes the processes it waits for (missing or merging); 0: never."""
    min_learners: int = 1
    """Fewest learners a round may close with (fewer: AveragingTimeoutError to those present)."""
    validate_every: int = 0
    """m: every m-th round's averaged model is validated (0: never)."""
    batch_size: int = 32
    """B at the start (blocks per mini-batch)."""
    b1: float = 1.0
    """AAVG's b1: the accuracy gain below which B grows."""
    b2: float = 2
    """AAVG's b2: the factor B grows by."""
    max_batch_size: int = 576
    """B never grows past it."""
    centred_pairs: tuple = ()
    """(mean, var) pairs of centred optimizer statistics merged as a pooled variance."""
    adaptive_batch: bool = True
    """False keeps B whatever validation says (an AAVG ablation)."""
    batch_growth: str = "steps"
    """"steps": B grows only under a step budget (``batchsize.batch_may_grow``); "always": under epochs too."""
    merge_moments: bool = True
    """False averages the weights only; each learner keeps its own Adam moments (AAVG2)."""
    merge_bn_stats: bool = True
    """False averages BatchNorm (mean, var) pairs as plain means (an AAVG ablation)."""
    shards: int | None = None
    """S, the averaging shards; None: one per learner of the first group."""
    channels: bool = False
    """Move a linked group's bytes through shared-memory channels (``dataplane.generations``)."""
    epochs: int | None = None
    """Where training ends (``train.epochs``); None: unknown, every validation starts when its round closes."""
    steps: int | None = None
    """The step budget (``train.steps``); None: epochs end the run."""
    tracker: str = "none"
    """Live tracking of the run history (``tracking.make_tracker``)."""
    live: bool = False
    """Live groups (``rounds.group``): a lost learner or a newcomer changes the group at a round's close."""

    def __post_init__(self) -> None:
        # Every setting is checked here, when the settings are built (the driver builds them from a
        # Config, which checked the same fields), so no averager has to be built to find a bad one.
        for name in ("adaptive_batch", "merge_moments", "merge_bn_stats", "channels", "live"):
            flag = getattr(self, name)
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        batch_may_grow(self.batch_growth, self.steps)  # raises for a growth it does not know
        for name in ("shards", "epochs", "steps"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), 1)
        self._check_rounds()
        # The batch-size rule's own checks (b1, b2, B and its cap), as the averager's rule will make them.
        AdaptiveBatchSize(self.batch_size, b1=self.b1, b2=self.b2, max_size=self.max_batch_size)
        if self.tracker not in TRACKERS:
            raise ValueError(f"tracker must be one of {TRACKERS}, got {self.tracker!r}: pick one of them")

    def _check_rounds(self) -> None:
        """The round book's settings: learners, the round timeout, the validation period."""
        check_number("world_size", self.world_size, 1)
        check_number("timeout_s", self.timeout_s, 0.001, int | float)
        check_number("probe_s", self.probe_s, 0.0, int | float)
        check_number("min_learners", self.min_learners, 1)
        if self.min_learners > self.world_size:
            raise ValueError(
                f"min_learners {self.min_learners} > world_size {self.world_size}: lower min_learners"
            )
        check_number("validate_every", self.validate_every, 0)

    @property
    def shard_count(self) -> int:
        """S: ``shards``, or one per learner of the first group."""
        return self.shards if self.shards is not None else self.world_size
