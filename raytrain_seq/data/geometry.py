"""The run's data geometry: the three splits' catalogs and what the checks, the feed and the model need to
know of them, learned once in the driver.

``load_catalogs(config)`` reads the catalogs through the configured source (``data.sources``) and turns a
reader's error into a RunSetupError; ``data_geometry(config)`` adds ``t_max`` (the longest video of any
split unless given), the reset table's size and the evaluation packing, and refuses a video longer than
``t_max`` with the flags that fix it. The driver hands the ``Geometry`` to the feed actor, so a run probes
its videos once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from raytrain_seq.config import DataConfig, RunSetupError
from raytrain_seq.data.sources import CHANNELS, get_source, source_kwargs
from raytrain_seq.data.splits import SPLITS
from raytrain_seq.rows.assembly import max_sequences_bound

__all__ = ["Geometry", "ModelSpec", "data_geometry", "load_catalogs"]


def load_catalogs(data: DataConfig, *, warn: bool = True) -> dict[str, Any]:
    """Catalogs of the three splits and what the model and summary need to know about them.

    Returns ``{"catalogs": {train, val, test}, "class_names", "skipped": [paths], "channels",
    "flow_method"}``. A reader's error (bad layout, split file, class or label) becomes a RunSetupError.
    """
    source = get_source(source_kwargs(data))
    try:
        loaded = source.catalogs(warn=warn)
        method = source.flow_method  # imports OpenCV for a flow stream: missing, it fails here, at start
    except RunSetupError:
        raise
    except (ValueError, ImportError) as exc:
        if data.dataset == "synthetic":
            raise
        raise RunSetupError(str(exc)) from exc
    return {**loaded, "channels": CHANNELS[data.stream], "flow_method": method}


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Geometry:
    """What the checks, the feed and the model need to know of a run's data, learned once in the driver
    (``data_geometry``) and handed to the feed actor, so the videos are probed once a run."""

    catalogs: dict[str, Any]
    """``{"train", "val", "test"}`` -> that split's catalog (``SyntheticCatalog`` or ``VideoCatalog``)."""
    t_max: int
    """Frames a block holds: ``data.t_max``, or the longest video of any split."""
    max_sequences: int
    """The most sequences one block can hold (the reset table's size)."""
    eval_strategy: str
    """"optimal" packing of the evaluation splits, or "chunk" when training cuts sequences too."""
    channels: int
    """Input channels of a frame (3 RGB, 2 flow)."""
    class_names: tuple[str, ...]
    """The class of each label."""
    skipped: tuple[str, ...]
    """Listed videos left out of the catalogs (unreadable, missing, zero frames)."""
    flow_method: str | None
    """The optical-flow algorithm of a flow stream; None for RGB."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What the learners' model must take (the feed's ``model_spec()``, from the ``Geometry``)."""

    num_classes: int
    """Labels the classifier scores."""
    in_channels: int
    """Input channels of a frame (3 RGB, 2 flow, whose flip negates x)."""
    class_names: tuple[str, ...]
    """The class of each label."""

    def as_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (``checkpoint.save``'s ``model_spec``: plain types, the class names a
        list)."""
        return {
            "num_classes": self.num_classes,
            "in_channels": self.in_channels,
            "class_names": list(self.class_names),
        }


def data_geometry(data: DataConfig, *, warn: bool = True) -> Geometry:
    """Catalogs, t_max, max_sequences, the evaluation strategy and the sources' facts (channels, class
    names, skipped videos, flow method); RunSetupError for a bad fit (a video longer than t_max).
    ``warn=False``: skipped videos are logged at DEBUG (the feed actor rebuilds the catalog the driver's
    check already warned about)."""
    loaded = load_catalogs(data, warn=warn)
    catalogs = loaded["catalogs"]
    # t_max None: the longest video of ANY split, so evaluation never cuts a video that training would
    # not have cut (a small max_videos subset often has a longer val/test video than train video).
    longest = max(int(catalogs[split].lengths.max()) for split in SPLITS)
    t_max = data.t_max if data.t_max is not None else longest
    eval_strategy = "optimal"
    for split in SPLITS:
        split_longest = int(catalogs[split].lengths.max())
        if split_longest > t_max:
            if data.packing == "chunk":
                eval_strategy = "chunk"  # chunk training cuts sequences, so evaluation has to as well
                continue
            raise RunSetupError(
                f"data.t_max={t_max} but the {split} split has a video of {split_longest} strided frames "
                f"(stride {data.stride}): pass --t-max {split_longest} or more, leave it out (the longest "
                "video), raise --stride, or use --packing chunk"
            )
    every = np.concatenate([catalogs[split].lengths for split in SPLITS])
    return Geometry(
        catalogs=catalogs,
        t_max=int(t_max),
        max_sequences=max_sequences_bound(every, t_max),
        eval_strategy=eval_strategy,
        channels=int(loaded["channels"]),
        class_names=tuple(loaded["class_names"]),
        skipped=tuple(loaded["skipped"]),
        flow_method=loaded["flow_method"],
    )
