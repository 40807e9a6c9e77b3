"""``TrainConfig``, the ``train`` section of the run's config tree (``raytrain_seq.config``): AAVG's learners,
rounds and adaptive batch size, the optimizer, the actors' restarts and the devices; checked at construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from raytrain_seq.checks import (
    choice,
    int_at_least,
    is_int,
    number,
    optional_bool,
    optional_int_at_least,
    parse_learners,
)
from raytrain_seq.config.choices import (
    BATCH_GROWTH,
    BATCH_RULES,
    LR_SCHEDULES,
    OPTIMIZERS,
    PAPER_B1,
    PRECISIONS,
    VALIDATORS,
)

__all__ = ["TrainConfig"]


@dataclass(kw_only=True)
class TrainConfig:
    """AAVG training: learners, local steps between averaging rounds, adaptive batch size, optimizer."""

    section: ClassVar[str] = "train"

    learners: int | tuple[int, int] = 2
    """AAVG learners (actors, one per slot; P in the paper): a count, or (min, max) / "MIN:MAX" for elastic."""
    max_failures: int = 3
    """Learner losses (process or node) the run survives, each slot restarted in place by Ray; -1 = no limit."""
    worker_start_timeout_s: float = 60.0
    """Seconds to wait for the first learners, and for min_learners again after losses."""
    poll_interval_s: float = 0.5
    """Seconds between the driver's checks of the learners (ray.wait): a lost learner is told then."""
    averager_max_restarts: int = 3
    """Restarts Ray may make of the averaging actor (it reloads the latest checkpoint); -1 = no limit."""
    feed_max_restarts: int = 3
    """Restarts Ray may make of the feed actor (it recomputes its lost cache); -1 = no limit."""
    keep_freed_memory: bool = True
    """Learners and the evaluator keep freed host memory for their next step (glibc mallopt, heap.py)."""
    adaptive_batch: bool = True
    """Grow the batch size when validation stalls (AAVG Algorithm 1); False keeps batch_size (ablation)."""
    merge_moments: bool = True
    """Average the learners' Adam moments with their weights (AAVG Algorithm 2); False = keep their own."""
    merge_bn_stats: bool = True
    """Merge BatchNorm (mean, var) pairs by the law of total variance (AAVG Algorithm 2); False = plain mean."""
    k: int = -1
    """Local steps between averaging rounds, K in the paper; -1 = one round at the end of every epoch."""
    batch_size: int = 4
    """Initial mini-batch size in blocks per learner step; AAVG may grow it up to max_batch_size."""
    max_batch_size: int = 576
    """Cap of the adaptive batch size (576 in the AAVG paper); at least batch_size."""
    micro_batch_size: int | str = 4
    """Blocks streamed to the device at once (gradients accumulate exactly); "auto" = largest that fits."""
    validate_every: int = 1
    """m in the paper: validate (and maybe grow the batch size) every m averaging rounds."""
    batch_rule: str | None = None
    """B's growth test: "noise-aware" (val < best - its std error) or "paper" (val < b1 x best); none: from b1."""
    b1: float | None = None
    """The paper rule's margin: grow when val accuracy < b1 x best (1.0 under --batch-rule paper); none: noise-aware."""
    b2: float = 2
    """AAVG growth factor: a growing batch size is multiplied by b2, up to max_batch_size (>= 1)."""
    batch_growth: str = "steps"
    """When B may grow: "steps" = only under train.steps (the paper's N; epochs fix B), "always" = under epochs too."""
    epochs: int = 10
    """Passes over the training videos (the run's end when train.steps is none)."""
    steps: int | None = None
    """Optimizer steps per learner, N in AAVG Algorithm 1: the run ends there, whatever the epoch; none = epochs."""
    lr: float = 1e-3
    """Learning rate of the learners' optimizer."""
    optimizer: str = "adam"
    """Optimizer: "adam", "adamw" (Adam moments are merged at averaging) or "sgd"."""
    weight_decay: float = 0.0
    """Weight decay of the optimizer (L2 for adam and sgd, decoupled for adamw); 0 = none."""
    averager_timeout_s: float = 60.0
    """Seconds the averager waits for a learner in a round before dropping it from that round."""
    averager_probe_s: float = 0.5
    """Drop a learner from a round sooner when its process does not answer within this (0: never ask)."""
    averager_shards: int | None = None
    """Averaging shard actors S, each merging a slice of the weights; None = one per learner (the max)."""
    averager_channels: bool = False
    """Move a stable group's bytes through Ray's shared-memory channels: only on nodes that are not lost."""
    checkpoint_every: int = 1
    """Save a checkpoint every this many averaging rounds."""
    use_gpu: bool | None = None
    """Train on GPUs: True, False, or None = when the cluster has enough GPUs for the learners."""
    gpus_per_learner: float = 1.0
    """GPU share each learner holds when it trains on a GPU: 1, or a fraction (0.5: two learners per GPU)."""
    validator: str = "auto"
    """Who scores validation rounds: "learners" (each its share), "evaluator" (the averager's thread), "auto" (learners on GPUs)."""
    precision: str = "fp32"
    """Forward-pass precision: "fp32", or autocast to "bf16" or "fp16" (fp16 with a gradient scaler)."""
    lr_schedule: str = "constant"
    """Learning rate over the run: "constant" (AAVG keeps it fixed) or "cosine" (to 0 at the last epoch)."""
    warmup_steps: int = 0
    """Optimizer steps of linear learning-rate warm-up from 0 (0 = none)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field, its value and the fix."""
        self.learners = parse_learners(self.learners)
        self._check_restarts_and_switches()
        self._check_rounds_and_batch_size()
        self._check_length_and_optimizer()
        self._check_averager_and_devices()
        self._check_lr_schedule()

    def _check_restarts_and_switches(self) -> None:
        """Restart limits, the learners' timeouts and the on/off switches."""
        for name in ("max_failures", "averager_max_restarts", "feed_max_restarts"):
            value = getattr(self, name)
            if not is_int(value) or value < -1:
                raise ValueError(
                    f"train.{name} must be an int >= -1 (-1 = no limit), got {value!r}: use e.g. 3"
                )
        for name in ("worker_start_timeout_s", "poll_interval_s"):
            number(f"train.{name}", getattr(self, name), "> 0", lambda v: v > 0, "use e.g. 60.0 seconds")
        switches = ["adaptive_batch", "merge_moments", "merge_bn_stats", "averager_channels"]
        for name in (*switches, "keep_freed_memory"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"train.{name} must be True or False, got {getattr(self, name)!r}: "
                    f"pass --{name.replace('_', '-')} or --no-{name.replace('_', '-')}"
                )

    def _check_rounds_and_batch_size(self) -> None:
        """K steps between rounds and AAVG's batch-size rule (start, cap, micro-batches, b1, b2, growth)."""
        if not is_int(self.k) or (self.k != -1 and self.k < 1):
            raise ValueError(
                f"train.k must be -1 (average once per epoch) or an int >= 1 (steps between rounds), "
                f"got {self.k!r}: use -1 or a positive step count"
            )
        int_at_least("train.batch_size", self.batch_size, 1, "give the blocks per mini-batch, e.g. 4")
        int_at_least("train.max_batch_size", self.max_batch_size, 1, "use e.g. 576 as in the AAVG paper")
        if self.max_batch_size < self.batch_size:
            raise ValueError(
                f"train.max_batch_size={self.max_batch_size} is below train.batch_size={self.batch_size}: "
                f"raise max_batch_size to >= {self.batch_size} or lower batch_size"
            )
        if self.micro_batch_size != "auto" and (
            not is_int(self.micro_batch_size) or self.micro_batch_size < 1
        ):
            raise ValueError(
                f"train.micro_batch_size must be an int >= 1 or 'auto', got {self.micro_batch_size!r}: "
                "give the blocks that fit on the device at once, or 'auto' to find it"
            )
        int_at_least("train.validate_every", self.validate_every, 1, "use 1 to validate every round")
        self._resolve_batch_rule()
        number("train.b2", self.b2, ">= 1", lambda v: v >= 1, "use 2 as in the AAVG paper")
        choice("train.batch_growth", self.batch_growth, BATCH_GROWTH)

    def _check_length_and_optimizer(self) -> None:
        """The run's length (epochs, steps) and the optimizer (kind, rate, weight decay)."""
        int_at_least("train.epochs", self.epochs, 1, "train for at least 1 epoch")
        optional_int_at_least(
            "train.steps", self.steps, 1, "give the optimizer steps per learner, e.g. 200, or none for epochs"
        )
        number("train.lr", self.lr, "> 0", lambda v: v > 0, "use e.g. 1e-3")
        choice("train.optimizer", self.optimizer, OPTIMIZERS)
        number("train.weight_decay", self.weight_decay, ">= 0", lambda v: v >= 0, "use 0.0 for none")

    def _check_averager_and_devices(self) -> None:
        """The averager's timeout, checkpoints and shards; GPUs, the validator and the precision."""
        timeout, why = self.averager_timeout_s, "use e.g. 60.0 seconds"
        number("train.averager_timeout_s", timeout, ">= 0.001", lambda v: v >= 0.001, why)
        probe, why = self.averager_probe_s, "use e.g. 0.5 seconds, or 0 to wait the whole timeout"
        number("train.averager_probe_s", probe, ">= 0", lambda v: v >= 0, why)
        int_at_least("train.checkpoint_every", self.checkpoint_every, 1, "use 1 to checkpoint every round")
        if self.averager_shards is not None:
            int_at_least(
                "train.averager_shards", self.averager_shards, 1, "use 1 or more, or None for one per learner"
            )
        optional_bool("train.use_gpu", self.use_gpu, "None = when the cluster has GPUs")
        number(
            "train.gpus_per_learner",
            self.gpus_per_learner,
            "> 0",
            lambda v: v > 0,
            "use 1 (a GPU per learner) or a fraction such as 0.5 (two learners share a GPU)",
        )
        if self.gpus_per_learner > 1:
            raise ValueError(
                f"train.gpus_per_learner={self.gpus_per_learner:g}: a learner is one process driving one GPU; "
                "give at most 1 (or a fraction, 0.5 to share a GPU between two learners) and raise "
                "--learners to use more GPUs"
            )
        choice("train.validator", self.validator, VALIDATORS)
        choice("train.precision", self.precision, PRECISIONS)

    def _check_lr_schedule(self) -> None:
        """The learning-rate schedule and its warm-up, which must end before the run does."""
        choice("train.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        int_at_least("train.warmup_steps", self.warmup_steps, 0, "use 0 for no warm-up, e.g. 500")
        if self.steps is not None and self.warmup_steps >= self.steps:
            raise ValueError(
                f"train.warmup_steps={self.warmup_steps} is not below train.steps={self.steps}: the learning "
                f"rate would still be warming up when the run ends; lower it, e.g. to {max(1, self.steps // 10)}"
            )

    def _resolve_batch_rule(self) -> None:
        """batch_rule none follows b1 (a number: the paper's test, as before the field existed); "paper"
        without b1 takes the paper's 1.0; "noise-aware" has no margin, so a b1 beside it is refused."""
        if self.batch_rule is None:
            self.batch_rule = "noise-aware" if self.b1 is None else "paper"
        choice("train.batch_rule", self.batch_rule, BATCH_RULES)
        if self.batch_rule == "paper" and self.b1 is None:
            self.b1 = PAPER_B1
        if self.batch_rule == "noise-aware" and self.b1 is not None:
            raise ValueError(
                f"train.b1={self.b1!r} is the paper rule's margin, but train.batch_rule='noise-aware' has none: "
                "pass --batch-rule paper to use it, or drop --b1"
            )
        if self.b1 is not None:
            number("train.b1", self.b1, "> 0", lambda v: v > 0, "use 1.0 as in the AAVG paper")

    @property
    def max_epochs(self) -> int:
        """Epochs the run may start: ``epochs``, or with ``steps`` one per step at most (every learner
        has at least one row per epoch, so every epoch takes at least one step)."""
        return self.epochs if self.steps is None else self.steps

    @property
    def shards(self) -> int:
        """S, the averaging shards: ``averager_shards``, or one per learner of the largest group."""
        return self.averager_shards if self.averager_shards is not None else self.max_learners

    @property
    def min_learners(self) -> int:
        """Fewest learners the run goes on with (``learners`` itself when it is a count)."""
        return self.learners if isinstance(self.learners, int) else self.learners[0]

    @property
    def max_learners(self) -> int:
        """Most learners the run asks for (``learners`` itself when it is a count)."""
        return self.learners if isinstance(self.learners, int) else self.learners[1]
