"""One dataclass tree for a whole run: ``Config(data=..., model=..., train=..., run=...)``.

What it serves: the four techniques (docs/ARCHITECTURE.md) meet here as settings, so one value travels
to every process: BLoad packing (Iftekhar, Ruschel et al.: ``data.packing``, ``data.t_max``), AAVG
averaging (Cong et al.: ``train.k``, ``train.validate_every`` = m, ``train.b1``/``b2``,
``train.max_batch_size``, ``train.batch_growth``), Revamper refurbishing (Lee et al.: ``data.reuse`` = r) and micro-batch
streaming (Piao, Synn et al.: ``train.micro_batch_size``). ``raytrain_seq.cli`` generates the jobs'
command line from this tree: every field is a flag ``--section.field`` and ``--field-name``, and its
one-line docstring is that flag's help.

Every value is checked once, at construction (``__post_init__``), and a bad one raises ValueError naming
the field, the value and the fix, so a mistake stops the driver before Ray starts. ``to_dict`` and
``from_dict`` give nested plain types for workers, checkpoints and summary.json; after changing a field
of the (mutable) tree, call ``validate()``.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

from raytrain_seq.algorithms.augment import TEST_VIEWS
from raytrain_seq.algorithms.packing import STRATEGIES
from raytrain_seq.checks import (
    choice,
    int_at_least,
    is_int,
    is_number,
    number,
    optional_bool,
    optional_int_at_least,
    optional_path,
    parse_learners,
)
from raytrain_seq.data.decoders import DECODERS
from raytrain_seq.presets import PRESETS

logger = logging.getLogger(__name__)

__all__ = ["PRESETS", "Config", "DataConfig", "ModelConfig", "RunConfig", "RunSetupError", "TrainConfig"]


class RunSetupError(ValueError):
    """A valid configuration that cannot start here (run folder, cluster size, resume point).

    Raised before any training, so the job reports it as one line naming the fix, like a bad flag.
    """


DATASETS: tuple[str, ...] = ("synthetic", "ucf101", "hmdb51", "list")
REAL_DATASETS: tuple[str, ...] = ("ucf101", "hmdb51", "list")
LIST_FIELDS: tuple[str, ...] = ("train_list", "test_list", "val_list", "class_names")
STREAMS: tuple[str, ...] = ("rgb", "flow", "fuse")
FRAME_BACKBONES: tuple[str, ...] = ("small", "resnet18", "resnet50", "resnet152")
# torchvision's video ResNets (models/video.py, VIDEO_ARCHS; tests/test_video_backbones.py holds the two
# equal: config imports no torch).
VIDEO_BACKBONES: tuple[str, ...] = ("r2plus1d_18", "r3d_18", "mc3_18")
BACKBONES: tuple[str, ...] = FRAME_BACKBONES + VIDEO_BACKBONES
# package.module:function (models/hook.py, FACTORY_PATTERN, the same pattern).
FACTORY_FORMAT = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"
TEMPORALS: tuple[str, ...] = ("gru", "tcn")
NORMS: tuple[str, ...] = ("auto", "batchnorm")  # models.factory.MODEL_NORMS (config imports no torch)
OPTIMIZERS: tuple[str, ...] = ("adam", "adamw", "sgd")
TRACKERS: tuple[str, ...] = ("tensorboard", "mlflow", "none")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
LR_SCHEDULES: tuple[str, ...] = ("constant", "cosine")
VALIDATORS: tuple[str, ...] = ("auto", "learners", "evaluator")
PACKINGS: tuple[str, ...] = STRATEGIES
BATCH_GROWTH: tuple[str, ...] = ("steps", "always")  # averaging.BATCH_GROWTH (config imports no torch)
BATCH_RULES: tuple[str, ...] = ("noise-aware", "paper")  # averaging.BATCH_RULES
PAPER_B1 = 1.0  # AAVG's b1 (Cong et al.: "we simply use b1=1 and b2=2", B up to 576)
# Classes of the synthetic set: ordered pairs of its 12 motions, 12 x 11 (data/synthetic.py, class_motions;
# tests/test_synthetic.py holds the two equal).
SYNTHETIC_CLASSES = 132
# A bound on the parameters a config may ask for (1 GB of fp32 weights, 3 GB with Adam's moments): far
# above every model this project trains (a ResNet-152 has 60 M), low enough that a typo such as
# --depth 12 (about 5e9 parameters) stops here instead of allocating for minutes.
MAX_PARAMETERS = 250_000_000


@dataclass(kw_only=True)
class DataConfig:
    """Which videos, how they are strided, augmented, cached, refurbished and packed into blocks."""

    section: ClassVar[str] = "data"

    dataset: str = "synthetic"
    """Video source: "synthetic" (built in), "ucf101" or "hmdb51" (official archives), "list" (your own lists)."""
    data_root: str | None = None
    """Folder of the videos: the official archives extracted (ucf101, hmdb51), or the list's paths' root."""
    train_list: str | None = None
    """dataset list: the training annotation file, one "relative/path.ext label" per line (label from 0)."""
    test_list: str | None = None
    """dataset list: the test annotation file, same format."""
    val_list: str | None = None
    """dataset list: a validation annotation file; None = held out of the training list."""
    class_names: str | None = None
    """dataset list: a file of class names, one per line in label order; None = the labels as names."""
    split: int = 1
    """Official train/test split of ucf101 and hmdb51: 1, 2 or 3."""
    stream: str = "rgb"
    """What the model sees: "rgb" frames, "flow" (optical flow, 2 channels), or "fuse" (score model.fuse)."""
    num_classes: int | None = None
    """Train on the first this many classes; None = every class of the dataset (10 for synthetic)."""
    max_videos: int | None = None
    """Train on at most this many videos (a class-balanced subset); None = all of them."""
    stride: int = 8
    """Temporal stride: keep every stride-th frame, so a video of n frames gives ceil(n / stride)."""
    fps: float | None = None
    """Resample real videos to this frame rate instead of striding (stride must then be 1); None = stride."""
    decoder: str = "auto"
    """Video decoder of real videos: pyav, opencv, decord, or auto (the fastest installed: data/decoders.py)."""
    t_max: int | None = None
    """Block length in (strided) frames; None = the longest strided video, so every video fits whole."""
    cache_size: int = 36
    """Side in pixels of the cached partially augmented frames (the final random crop is cut from them)."""
    crop: int = 32
    """Side in pixels of the final crop the model sees; at most cache_size."""
    packing: str = "optimal"
    """Block packing strategy of raytrain_seq.algorithms.packing.pack: optimal, bload, pad or chunk."""
    reuse: int = 3
    """Refurbish reuse factor r: each cached partial augmentation serves r epochs (1 = recompute all)."""
    val_fraction: float = 0.1
    """Fraction of the training videos held out for AAVG's validation rounds, strictly between 0 and 1."""
    seed: int = 0
    """Root seed of the split, packing plans, augmentations and model initialisation."""
    test_views: str = "center"
    """Views each test video is scored on, softmax averaged: center, center_flip, three_crop, three_crop_flip, ten_crop."""
    augment_cost: float = 0
    """Extra busy CPU seconds per partial augmentation of one video, to make augmentation the bottleneck."""
    augment_cost_per_frame: float = 0
    """Extra busy CPU seconds per frame of a training video's partial augmentation (a per-frame RandAugment's cost)."""
    randaugment_ops: int = 0
    """RandAugment operations in a training video's partial augmentation (torchvision's, one draw a video); 0 = none."""
    randaugment_magnitude: int = 9
    """RandAugment's magnitude, 0 to 30 (torchvision's scale; 9 is the papers' usual strength)."""
    frame_cache_gib: float = 32
    """Real video: GiB of decoded frames each node keeps on disk so a video is decoded once; 0 = decode every time."""
    frame_cache_dir: str | None = None
    """Real video: the node-local folder of the frame cache; None = <temp folder>/raytrain_seq/frames."""

    def __post_init__(self) -> None:
        self.validate()

    def _validate_lists(self) -> None:
        """The list dataset's files: train and test lists needed with it, none of them without it."""
        for name in LIST_FIELDS:
            optional_path(f"data.{name}", getattr(self, name), "give the path of the file")
        if self.dataset != "list":
            given = [name for name in LIST_FIELDS if getattr(self, name) is not None]
            if given:
                raise ValueError(
                    f"data.{given[0]}={getattr(self, given[0])!r} is given but data.dataset={self.dataset!r}: "
                    "annotation lists are read "
                    "only with --dataset list; pass --dataset list or drop --" + given[0].replace("_", "-")
                )
            return
        for name in ("train_list", "test_list"):
            if getattr(self, name) is None:
                raise ValueError(
                    f"data.{name} is needed for dataset 'list': pass --{name.replace('_', '-')} FILE, one "
                    "'relative/path.ext label' per line (README, 'Your own videos')"
                )

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field, its value and the fix."""
        self._check_source()
        self._check_classes()
        self._check_frames()
        choice("data.packing", self.packing, PACKINGS)
        int_at_least("data.reuse", self.reuse, 1, "use 1 to recompute every epoch, 3 to reuse three times")
        number(
            "data.val_fraction",
            self.val_fraction,
            "strictly between 0 and 1",
            lambda v: 0 < v < 1,
            "use e.g. 0.1 to hold out 10 % of the videos",
        )
        int_at_least("data.seed", self.seed, 0, "use a non-negative int, e.g. 0")
        choice("data.test_views", self.test_views, TEST_VIEWS)
        for name in ("augment_cost", "augment_cost_per_frame"):
            number(f"data.{name}", getattr(self, name), ">= 0", lambda v: v >= 0, "use 0 for no extra cost")
        int_at_least("data.randaugment_ops", self.randaugment_ops, 0, "use 0 for none, 2 for the papers' two")
        int_at_least("data.randaugment_magnitude", self.randaugment_magnitude, 0, "use e.g. 9")
        if self.randaugment_magnitude > 30:
            raise ValueError(
                f"data.randaugment_magnitude={self.randaugment_magnitude} is past torchvision's scale (0 to 30): "
                "use e.g. 9"
            )
        number(
            "data.frame_cache_gib",
            self.frame_cache_gib,
            ">= 0 and < 2**40",
            lambda v: 0 <= v < 2**40,
            "give the GiB of disk each node may fill with decoded frames, or 0 to decode every time",
        )
        optional_path("data.frame_cache_dir", self.frame_cache_dir, "give a writable node-local folder")

    def _check_source(self) -> None:
        """Where the videos come from: the dataset, its root and lists, the split and the stream."""
        choice("data.dataset", self.dataset, DATASETS)
        if self.dataset in REAL_DATASETS and self.data_root is None:
            what = (
                "the folder the list's paths are relative to (README, 'Your own videos')"
                if self.dataset == "list"
                else "the folder the official archives were extracted to (see README, 'Real video')"
            )
            raise ValueError(
                f"data.data_root is needed for dataset {self.dataset!r}: pass --data-root DIR, {what}"
            )
        optional_path("data.data_root", self.data_root, "give the folder the official archives extracted to")
        self._validate_lists()
        if self.dataset == "synthetic" and self.data_root is not None and self.stream != "fuse":
            # Fusion is the exception: there --data-root says where the two runs' videos are now.
            raise ValueError(
                f"data.data_root={self.data_root!r} is given but data.dataset='synthetic' renders its videos "
                "and reads no files: pass --dataset ucf101, hmdb51 or list to train on that folder, or drop --data-root"
            )
        if not is_int(self.split) or self.split not in (1, 2, 3):
            raise ValueError(
                f"data.split must be 1, 2 or 3, got {self.split!r}: pick one of the official splits (--split 1)"
            )
        choice("data.stream", self.stream, STREAMS)
        choice(
            "data.decoder", self.decoder, DECODERS, " (--decoder auto takes the fastest one installed here)"
        )
        if self.stream == "flow" and self.dataset == "synthetic":
            raise ValueError(
                "data.stream='flow' needs real video (dataset ucf101, hmdb51 or list): the synthetic set has no "
                "optical flow stream; use stream='rgb' or pick a real dataset"
            )

    def _check_classes(self) -> None:
        """How many classes, and enough training videos for each."""
        if self.num_classes is None and self.dataset == "synthetic":
            self.num_classes = 10
        optional_int_at_least(
            "data.num_classes", self.num_classes, 2, "a classifier needs at least 2 classes"
        )
        if self.dataset == "synthetic" and self.num_classes > SYNTHETIC_CLASSES:
            raise ValueError(
                f"data.num_classes={self.num_classes} but the synthetic set has {SYNTHETIC_CLASSES} classes "
                f"(ordered pairs of 12 motions): pass --num-classes 2..{SYNTHETIC_CLASSES}, or a real dataset"
            )
        optional_int_at_least("data.max_videos", self.max_videos, 1, "give a positive video count")
        if (
            self.max_videos is not None
            and self.num_classes is not None
            and self.max_videos < self.num_classes
        ):
            raise ValueError(
                f"data.max_videos={self.max_videos} is fewer than data.num_classes={self.num_classes}: "
                f"every class needs a training video; raise max_videos to >= {self.num_classes} "
                "or lower num_classes"
            )

    def _check_frames(self) -> None:
        """Which frames are kept (stride or fps), the block length, and the cached and cropped sizes."""
        int_at_least("data.stride", self.stride, 1, "use 1 to keep every frame")
        if self.stride > 2**40:
            # Past the longest sequence a length file may hold, every video keeps one frame either way, and
            # the strided lengths' int64 arithmetic would overflow.
            raise ValueError(
                f"data.stride={self.stride} is longer than any video (at most 2**40 frames): "
                "use e.g. 8 to keep every 8th frame"
            )
        if self.fps is not None:
            number("data.fps", self.fps, "> 0", lambda v: v > 0, "use e.g. 25, or None to stride instead")
            if self.stride != 1:
                raise ValueError(
                    f"data.fps={self.fps} and data.stride={self.stride} both pick frames: give one of them "
                    "(set stride to 1 when resampling to fps)"
                )
        optional_int_at_least("data.t_max", self.t_max, 1, "give the block length in frames")
        int_at_least("data.cache_size", self.cache_size, 1, "give the cached frame side in pixels, e.g. 36")
        int_at_least("data.crop", self.crop, 1, "give the crop side in pixels, e.g. 32")
        if self.crop > self.cache_size:
            raise ValueError(
                f"data.crop={self.crop} is larger than data.cache_size={self.cache_size}: the crop is cut "
                f"from the cached frame; lower crop to <= {self.cache_size} or raise cache_size"
            )


@dataclass(kw_only=True)
class ModelConfig:
    """The temporal classifier: a per-frame CNN backbone, then a temporal module that resets per sequence."""

    section: ClassVar[str] = "model"

    backbone: str = "small"
    """Encoder: per frame "small" (CPU-sized), "resnet18|50|152"; per sequence "r2plus1d_18", "r3d_18", "mc3_18"."""
    weights: str | None = None
    """Local torchvision state_dict: ImageNet for a resnet, Kinetics-400 for a video backbone; None = random init."""
    model_factory: str | None = None
    """"package.module:function" returning your per-sequence encoder module (docs/ARCHITECTURE.md); None = --backbone."""
    init_from: str | None = None
    """Run folder whose final model starts this one (an RGB run for a flow model: cross-modality init)."""
    fuse: tuple[str, str] | None = None
    """The RGB run folder and flow run folder whose models stream="fuse" evaluates and fuses; else None."""
    width: int = 16
    """Channels of the first backbone stage; each further stage doubles them."""
    depth: int = 3
    """Number of stride-2 backbone stages."""
    hidden: int = 64
    """Hidden size of the temporal module (GRU state or TCN channels)."""
    temporal: str = "gru"
    """Temporal module: "gru" (recurrent) or "tcn" (causal dilated convolutions)."""
    norm: str = "auto"
    """"auto": frozen BatchNorm with --weights, else GroupNorm; "batchnorm": BatchNorm that trains (inexact: models.factory)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field, its value and the fix."""
        choice("model.backbone", self.backbone, BACKBONES)
        optional_path("model.weights", self.weights, "give the path of a local torchvision weights file")
        self._validate_factory()
        if self.weights is not None and self.backbone == "small":
            raise ValueError(
                "model.weights are torchvision weights for a resnet or video backbone, but model.backbone="
                "'small': pick --backbone resnet18|resnet50|resnet152|r2plus1d_18|r3d_18|mc3_18 or drop --weights"
            )
        optional_path("model.init_from", self.init_from, "give the folder of a finished run")
        if isinstance(self.fuse, list):
            self.fuse = tuple(self.fuse)  # JSON has no tuples: from_dict gets a list
        if self.fuse is not None and (
            not isinstance(self.fuse, tuple)
            or len(self.fuse) != 2
            or not all(isinstance(p, str) and p.strip() for p in self.fuse)
        ):
            raise ValueError(
                f"model.fuse must be two run folders (RGB run, flow run), got {self.fuse!r}: "
                "pass --fuse RGB_RUN FLOW_RUN"
            )
        int_at_least("model.width", self.width, 1, "use e.g. 16")
        int_at_least("model.depth", self.depth, 1, "use e.g. 3")
        int_at_least("model.hidden", self.hidden, 1, "use e.g. 64")
        choice("model.temporal", self.temporal, TEMPORALS)
        choice("model.norm", self.norm, NORMS, " (batchnorm trains BatchNorm: see models.factory's caveat)")
        size = self.parameters_estimate()
        if size > MAX_PARAMETERS:
            which = "--width and --depth" if self.backbone == "small" else "--hidden"
            raise ValueError(
                f"model.depth={self.depth}, model.width={self.width}, model.hidden={self.hidden} ask for about "
                f"{float(min(size, 10**300)):.1e} parameters ({self.backbone} backbone, {self.temporal}), more than "
                f"{MAX_PARAMETERS:.1e}: lower {which} (the small backbone doubles its channels per stage: "
                "depth 3-5 suits it), or pick --backbone resnet18|resnet50|resnet152"
            )

    def _validate_factory(self) -> None:
        if self.model_factory is None:
            return
        if not isinstance(self.model_factory, str) or not re.match(FACTORY_FORMAT, self.model_factory):
            raise ValueError(
                f"model.model_factory={self.model_factory!r}: expected 'package.module:function' "
                "(e.g. mymodels.video:build), a function that returns the per-sequence encoder"
            )
        if self.weights is not None or self.norm != "auto":
            name = "weights" if self.weights is not None else "norm"
            raise ValueError(
                f"model.{name}={getattr(self, name)!r} applies to a --backbone, but model.model_factory builds "
                f"the encoder: do that inside the factory function and drop --{name}"
            )

    def parameters_estimate(self, in_channels: int = 3) -> int:
        """About how many parameters the classifier has (what the config controls; a resnet backbone's
        own weights, at most 60 M, are left out; a video backbone or a factory's encoder is fixed by its
        code, so 0). The small backbone's conv3x3 stages dominate: width 16, depth 12 -> 9 x 16384 x 32768
        weights in the last stage alone, about 4.8e9."""
        if self.model_factory is not None or self.backbone in VIDEO_BACKBONES:
            return 0
        if self.backbone == "small":
            if self.depth > 40:  # past the bound at any width (2**39 channels): no need to count
                return 2**80
            # The encoder sees the frames and their differences: 2 * in_channels input channels.
            channels = [2 * in_channels] + [self.width * 2**i for i in range(self.depth)]
            encoder = sum(9 * a * b + 2 * b for a, b in itertools.pairwise(channels))
            out = channels[-1]
        else:
            encoder, out = 0, 512 if self.backbone == "resnet18" else 2048
        h = self.hidden
        temporal = 3 * (out * h + h * h + 2 * h) if self.temporal == "gru" else out * h + 3 * 3 * h * h
        return encoder + temporal


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
    averager_shards: int | None = None
    """Averaging shard actors S, each merging a slice of the weights; None = one per learner (the max)."""
    averager_channels: bool = True
    """Move a stable group's averaging bytes through Ray's shared-memory channels instead of new objects."""
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


@dataclass(kw_only=True)
class RunConfig:
    """Where the run writes checkpoints, summary.json and curves.png, and whether it resumes."""

    section: ClassVar[str] = "run"

    storage_path: str = "~/raytrain_seq_runs"
    """Parent folder of all runs ("~" is expanded by Config.run_dir())."""
    run_name: str | None = None
    """Folder of this run under storage_path; None: the driver names it "ucf101-<dataset>-<UTC timestamp>" as it starts."""
    resume: bool = False
    """Continue the run named run_name from its latest checkpoint."""
    tracker: str = "tensorboard"
    """Live tracking of losses, accuracies, batch size and times: "tensorboard", "mlflow" or "none"."""
    object_store_gb: float | None = None
    """Object store of a Ray cluster this run starts itself, in GB, preallocated; None = Ray's default."""
    keep_checkpoints: int | None = 2
    """Checkpoint folders kept: the newest this many plus the best by validation accuracy; None = all."""
    verbose: bool = False
    """Print Ray's own progress lines and the job's debug lines too (False: the job's lines)."""

    def __post_init__(self) -> None:
        if isinstance(self.storage_path, os.PathLike):
            self.storage_path = os.fspath(self.storage_path)
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field, its value and the fix."""
        if not isinstance(self.storage_path, str) or not self.storage_path.strip():
            raise ValueError(
                f"run.storage_path must be a non-empty path, got {self.storage_path!r}: "
                "use e.g. ~/raytrain_seq_runs"
            )
        if self.run_name is not None and (
            not isinstance(self.run_name, str)
            or not self.run_name.strip()
            or self.run_name in (".", "..")
            or "/" in self.run_name
            or os.sep in self.run_name
        ):
            raise ValueError(
                f"run.run_name must be a plain folder name (no '/'), got {self.run_name!r}: "
                "use e.g. my-run, or None for an automatic timestamped name"
            )
        if not isinstance(self.resume, bool):
            raise ValueError(
                f"run.resume must be True or False, got {self.resume!r}: pass True to continue run.run_name"
            )
        choice("run.tracker", self.tracker, TRACKERS)
        optional_int_at_least(
            "run.keep_checkpoints", self.keep_checkpoints, 1, "keep e.g. the newest 2 (the best is kept too)"
        )
        if not isinstance(self.verbose, bool):
            raise ValueError(
                f"run.verbose must be True or False, got {self.verbose!r}: pass --verbose or leave it out"
            )
        if self.object_store_gb is not None and (
            not is_number(self.object_store_gb) or self.object_store_gb < 0.1
        ):
            raise ValueError(
                f"run.object_store_gb must be a number of GB >= 0.1 or None, got {self.object_store_gb!r}: "
                "size it for the averaging round (about 2 x learners x the model's weights and moments) "
                "plus the refurbishing cache, e.g. 4"
            )


_SECTIONS: dict[str, type] = dict(data=DataConfig, model=ModelConfig, train=TrainConfig, run=RunConfig)
# Field names are unique across sections (they are the flag names), so a flat override finds its section.
_FIELD_SECTION: dict[str, str] = {f.name: s for s, c in _SECTIONS.items() for f in dataclasses.fields(c)}


# Fields only Ray Train read (runtime/fleet.py): what replaced each, and the default older records hold.
RETIRED: dict[str, tuple[str, Any]] = {
    "resize_interval_s": ("a learner slot joins as soon as a node has room for it", 60.0),
    "preemption_watcher": ("a drained node's learners are lost learners, restarted in their slots", False),
}


def _retired(key: str, value: Any, *, record: bool = True) -> bool:
    """True for a retired field at its old default in a record; ValueError for any other use of one."""
    if key not in RETIRED:
        return False
    if record and value == RETIRED[key][1]:
        return True
    raise ValueError(f"train.{key} was retired with Ray Train: {RETIRED[key][0]}; drop it (got {value!r})")


def _unknown(keys: list[str], known: list[str], where: str) -> ValueError:
    hints = []
    for key in keys:
        name = str(key).rsplit(".", 1)[-1]
        if name in _FIELD_SECTION and name not in known:  # a field of a section, given at another level
            owner = _FIELD_SECTION[name]
            hints.append(f"{key!r} (it belongs in {owner!r}: {owner}: {{{name}: ...}})")
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ValueError(f"unknown {where} key(s) {', '.join(hints)}: valid keys are {', '.join(known)}")


@dataclass(kw_only=True)
class Config:
    """A whole run: ``Config(data=DataConfig(...), model=..., train=..., run=...)``."""

    data: DataConfig = field(default_factory=DataConfig)
    """Videos, striding, augmentation cache, refurbishing and packing."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The temporal classifier."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """AAVG learners, averaging rounds, adaptive batch size and optimizer."""
    run: RunConfig = field(default_factory=RunConfig)
    """Output folder and resume."""

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(
                    f"Config.{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}: "
                    f"pass {name}={cls.__name__}(...) or build the whole tree with Config.from_dict"
                )
        if (self.data.stream == "fuse") != (self.model.fuse is not None):
            raise ValueError(
                "data.stream='fuse' and model.fuse go together: pass --stream fuse --fuse RGB_RUN FLOW_RUN "
                f"(got stream={self.data.stream!r}, fuse={self.model.fuse!r})"
            )
        if self.run.resume and self.run.run_name is None:
            raise ValueError(
                "run.resume=True needs run.run_name: pass the name of the run to resume (--run-name NAME)"
            )
        self.validate()

    def validate(self) -> None:
        """Re-check every section (after a field was changed in place); raises ValueError naming it."""
        for name in _SECTIONS:
            getattr(self, name).validate()

    def named(self) -> Config:
        """This config with its run folder named: itself when ``run.run_name`` is set, else a copy named
        ``ucf101-<dataset>-<UTC stamp>``. The driver (and the job, before its checks) calls it once, so every
        copy it hands on (learners, checkpoints, summary.json) names the same folder."""
        if self.run.run_name is not None:
            return self
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        run = dataclasses.replace(self.run, run_name=f"ucf101-{self.data.dataset}-{stamp}")
        return dataclasses.replace(self, run=run)

    def run_dir(self) -> Path:
        """``storage_path / run_name`` with ``~`` expanded: the folder of checkpoints and summary.json."""
        if self.run.run_name is None:
            raise ValueError(
                "run.run_name is not set, so the run has no folder yet: pass --run-name NAME, or call "
                "Config.named() first (the driver does when a run starts)"
            )
        return Path(os.path.expanduser(self.run.storage_path)) / self.run.run_name

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Nested plain types (str, int, float, bool, None): JSON-able, ``from_dict`` rebuilds it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Config:
        """Rebuild from ``to_dict()`` output; missing keys take defaults, unknown keys raise ValueError."""
        if not isinstance(d, Mapping):
            raise ValueError(
                f"a config must map sections ({', '.join(_SECTIONS)}) to their fields, got a "
                f"{type(d).__name__}: lay it out like --print-config's output"
            )
        unknown = sorted(str(k) for k in set(d) - set(_SECTIONS))
        if unknown:
            raise _unknown(unknown, list(_SECTIONS), "config section")
        sections = {}
        for name, section_cls in _SECTIONS.items():
            values = d.get(name, {})
            if not isinstance(values, Mapping):
                raise ValueError(
                    f"config section {name!r} must map field names to values, got {values!r}: "
                    f"write it like {name}: {{field: value}}"
                )
            known = [f.name for f in dataclasses.fields(section_cls)]
            values = {k: v for k, v in values.items() if not (name == "train" and _retired(k, v))}
            unknown = sorted(f"{name}.{k}" for k in set(values) - set(known))
            if unknown:
                raise _unknown(unknown, known, f"{name}")
            sections[name] = section_cls(**values)
        return cls(**sections)

    @classmethod
    def from_preset(cls, name: str | None, **overrides: Any) -> Config:
        """The preset ``name`` (a key of PRESETS; None = the defaults) with ``overrides`` applied on top.

        An override is a field name (``epochs=3``, the flag names with ``-`` -> ``_``) or a whole
        section (``train={"epochs": 3}``); unknown names raise ValueError.
        """
        if name is not None and name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(sorted(PRESETS))}, or None")
        merged: dict[str, dict[str, Any]] = {
            section: dict(values) for section, values in (PRESETS[name] if name else {}).items()
        }
        for key, value in overrides.items():
            if key in _SECTIONS and isinstance(value, Mapping):
                merged.setdefault(key, {}).update(value)
            elif key in _FIELD_SECTION:
                merged.setdefault(_FIELD_SECTION[key], {})[key] = value
            elif key in RETIRED:
                _retired(key, value, record=False)
            else:
                raise _unknown([key], sorted(_FIELD_SECTION), "override")
        logger.debug("config from preset %s with overrides %s", name, sorted(overrides))
        return cls.from_dict(merged)
