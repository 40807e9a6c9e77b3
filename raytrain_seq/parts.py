"""Each part's settings, built from the run's ``Config`` at one place: ``Parts.of(config)``.

The ``Config`` stays the user's one file and flag surface; a component takes only its own small frozen
settings (the feed ``FeedSettings``, connect ``ConnectSettings``, the evaluator ``EvaluatorSettings``, the
learners ``LearnerSettings`` with their step's ``StepSettings``, the averager
``rounds.settings.AveragerSettings``), or its own section of the tree (the model factory and the data
sources: ``config.model``, ``config.data``, as torchtitan hands its parts), never the whole tree. ``preflight.check`` builds the
parts once, before Ray starts, so a bad setting fails there (tests/test_config_flow.py measures where the
whole tree still travels).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raytrain_seq.config import Config, DataConfig, ModelConfig
    from raytrain_seq.rounds.settings import AveragerSettings

__all__ = ["ConnectSettings", "EvaluatorSettings", "FeedSettings", "LearnerSettings", "Parts", "StepSettings"]


@dataclass(frozen=True, kw_only=True)
class FeedSettings:
    """What the feed actor (``runtime.feed.BlockFeed``), its planner and its tasks are told."""

    data: DataConfig
    """The videos, their stride, cache, refurbishing and packing (the config's ``data`` section)."""
    max_epochs: int
    """Epochs the run may start (``train.max_epochs``)."""
    max_learners: int
    """Learners of the largest group: the evaluation tasks' lanes."""
    learners: int | tuple[int, int] = 1
    """``train.learners``: the world size epoch 0's prefetch orders its tasks by."""
    max_restarts: int = 0
    """Restarts Ray may make of the feed actor (``train.feed_max_restarts``)."""
    verbose: bool = False
    """Show Ray's own warnings (``run.verbose``)."""
    run_dir: str | None = None
    """The run folder, where the restart log goes; None: a feed outside a run (tests, benches)."""


@dataclass(frozen=True, kw_only=True)
class ConnectSettings:
    """What connecting to Ray, the run folder's and the cluster's checks and the device choice read."""

    run_dir: str | None
    """The run folder (``Config.run_dir()``); None: the config names no run yet (``Config.named``)."""
    resume: bool = False
    """Continue the run in ``run_dir`` (``run.resume``)."""
    verbose: bool = False
    """Keep Ray's INFO lines (``run.verbose``)."""
    object_store_gb: float | None = None
    """Object store of a cluster this run starts (``run.object_store_gb``)."""
    min_learners: int = 1
    """Fewest learners the run goes on with."""
    max_learners: int = 1
    """Most learners the run asks for."""
    use_gpu: bool | None = None
    """``train.use_gpu``: True, False, or None (when the cluster has GPUs)."""
    gpus_per_learner: float = 1.0
    """GPU share of a learner (``train.gpus_per_learner``)."""
    worker_start_timeout_s: float = 60.0
    """How long a joined cluster may take to bring GPU nodes up (``train.worker_start_timeout_s``)."""


@dataclass(frozen=True, kw_only=True)
class EvaluatorSettings:
    """What the averager's evaluator (``runtime.evaluator``) is told."""

    model: ModelConfig
    """The classifier it scores with (the config's ``model`` section)."""
    max_learners: int = 1
    """Scoring threads: one per learner of the largest group, at most the cores."""
    micro_batch_size: int | str = 4
    """``train.micro_batch_size``: the blocks scored at once."""
    keep_freed_memory: bool = True
    """Keep freed host memory for the next validation (``train.keep_freed_memory``)."""


@dataclass(frozen=True, kw_only=True)
class StepSettings:
    """What a learner's inner step (``training.step.InnerStep``), its optimizer and its learning rate read."""

    optimizer: str
    """``train.optimizer``: "adam", "adamw" or "sgd"."""
    lr: float
    """``train.lr``: the peak learning rate."""
    weight_decay: float
    """``train.weight_decay``."""
    lr_schedule: str
    """``train.lr_schedule``: "constant" or "cosine"."""
    warmup_steps: int
    """``train.warmup_steps``: linear warm-up steps."""
    micro_batch_size: int | str
    """``train.micro_batch_size``: blocks per forward/backward, or "auto"."""
    precision: str
    """``train.precision``: "fp32", "bf16" or "fp16"."""


@dataclass(frozen=True, kw_only=True)
class LearnerSettings:
    """What every learner (``runtime.learner``) is told: its model, step, rounds, data and checkpoints."""

    model: ModelConfig
    """The classifier it trains (the config's ``model`` section)."""
    step: StepSettings
    """Its inner step."""
    seed: int
    """``data.seed``: every learner's initial weights (AAVG's one w~)."""
    crop: int
    """``data.crop``: the side of the crops the step cuts on the device."""
    cache_size: int
    """``data.cache_size``: the side of the cached rows the test views are cut from."""
    test_views: str
    """``data.test_views``: the views each test row is scored on."""
    epochs: int
    """``train.epochs``."""
    steps: int | None
    """``train.steps``: a step budget that ends training inside an epoch; None: whole epochs."""
    max_epochs: int
    """``train.max_epochs``: the epochs the feed serves (make-up layouts included)."""
    k: int
    """``train.k``: local steps between rounds (-1: once an epoch)."""
    merge_moments: bool
    """``train.merge_moments``: average Adam's moments with the weights."""
    merge_bn_stats: bool
    """``train.merge_bn_stats``: average BatchNorm's running statistics with the weights."""
    validate_every: int
    """``train.validate_every``: rounds between validations (0: none)."""
    checkpoint_every: int
    """``train.checkpoint_every``: rounds between checkpoints."""
    averager_timeout_s: float
    """``train.averager_timeout_s``: the client's round timeout is three of these plus two minutes."""
    averager_channels: bool
    """``train.averager_channels``: rounds' tensors through compiled-graph channels."""
    keep_freed_memory: bool
    """``train.keep_freed_memory``: keep freed host memory for the next step (``training.heap``)."""
    verbose: bool
    """``run.verbose``: keep Ray's INFO lines in the learners."""
    run_dir: str | None
    """The run folder, where rank 0 puts checkpoints; None: a learner outside a run (tests)."""
    keep_checkpoints: int | None
    """``run.keep_checkpoints``: the newest checkpoints kept (None: all)."""
    record: str
    """The run's ``Config.to_dict()`` as JSON: the record each checkpoint carries (``checkpoint.save``)."""

    def config_record(self) -> dict[str, object]:
        """The run's configuration as plain data, for a checkpoint."""
        return json.loads(self.record)


@dataclass(frozen=True, kw_only=True)
class Parts:
    """Every part's settings of one run, built once from its ``Config`` (``Parts.of``)."""

    feed: FeedSettings
    connect: ConnectSettings
    evaluator: EvaluatorSettings
    averager: AveragerSettings
    learner: LearnerSettings
    model: ModelConfig
    data: DataConfig

    @classmethod
    def of(cls, config: Config) -> Parts:
        """The parts of ``config`` (named: its run folder is known); each settings type checks itself."""
        from raytrain_seq.rounds.settings import AveragerSettings

        data, model, train, run = config.data, config.model, config.train, config.run
        run_dir = None if run.run_name is None else str(config.run_dir())
        feed = FeedSettings(
            data=data, max_epochs=train.max_epochs, max_learners=train.max_learners, learners=train.learners,
            max_restarts=train.feed_max_restarts, verbose=run.verbose, run_dir=run_dir,
        )  # fmt: skip
        connect = ConnectSettings(
            run_dir=run_dir, resume=run.resume, verbose=run.verbose, object_store_gb=run.object_store_gb,
            min_learners=train.min_learners, max_learners=train.max_learners, use_gpu=train.use_gpu,
            gpus_per_learner=train.gpus_per_learner, worker_start_timeout_s=train.worker_start_timeout_s,
        )  # fmt: skip
        evaluator = EvaluatorSettings(
            model=model, max_learners=train.max_learners, micro_batch_size=train.micro_batch_size,
            keep_freed_memory=train.keep_freed_memory,
        )  # fmt: skip
        averager = AveragerSettings(
            world_size=train.max_learners, timeout_s=train.averager_timeout_s, probe_s=train.averager_probe_s,
            validate_every=train.validate_every,
            batch_size=train.batch_size, b1=train.b1, b2=train.b2, max_batch_size=train.max_batch_size,
            adaptive_batch=train.adaptive_batch, batch_growth=train.batch_growth, merge_moments=train.merge_moments,
            merge_bn_stats=train.merge_bn_stats, shards=train.shards, channels=train.averager_channels,
            epochs=train.epochs,  # the last round's validation waits for the test pass
            steps=train.steps, tracker=run.tracker,
        )  # fmt: skip
        step = StepSettings(
            optimizer=train.optimizer, lr=train.lr, weight_decay=train.weight_decay, lr_schedule=train.lr_schedule,
            warmup_steps=train.warmup_steps, micro_batch_size=train.micro_batch_size, precision=train.precision,
        )  # fmt: skip
        learner = LearnerSettings(
            model=model, step=step, seed=data.seed, crop=data.crop, cache_size=data.cache_size,
            test_views=data.test_views, epochs=train.epochs, steps=train.steps, max_epochs=train.max_epochs,
            k=train.k, merge_moments=train.merge_moments, merge_bn_stats=train.merge_bn_stats,
            validate_every=train.validate_every, checkpoint_every=train.checkpoint_every,
            averager_timeout_s=train.averager_timeout_s, averager_channels=train.averager_channels,
            keep_freed_memory=train.keep_freed_memory, verbose=run.verbose, run_dir=run_dir,
            keep_checkpoints=run.keep_checkpoints, record=json.dumps(config.to_dict(), sort_keys=True),
        )  # fmt: skip
        return cls(
            feed=feed, connect=connect, evaluator=evaluator, averager=averager, learner=learner, model=model,
            data=data,
        )  # fmt: skip
