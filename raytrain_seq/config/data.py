"""``DataConfig``, the ``data`` section of the run's config tree (``raytrain_seq.config``): which videos, how
they are strided, augmented, cached, refurbished and packed into blocks; every value checked at construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from raytrain_seq.checks import choice, int_at_least, is_int, number, optional_int_at_least, optional_path
from raytrain_seq.config.choices import (
    DATASETS,
    DECODERS,
    LIST_FIELDS,
    PACKINGS,
    REAL_DATASETS,
    STREAMS,
    SYNTHETIC_CLASSES,
    TEST_VIEWS,
)

__all__ = ["DataConfig"]


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
