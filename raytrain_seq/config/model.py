"""``ModelConfig``, the ``model`` section of the run's config tree (``raytrain_seq.config``): the temporal
classifier's backbone, temporal module and sizes, checked at construction against a bound on its parameters.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import ClassVar

from raytrain_seq.checks import choice, int_at_least, optional_path
from raytrain_seq.config.choices import (
    BACKBONES,
    FACTORY_FORMAT,
    MAX_PARAMETERS,
    NORMS,
    TEMPORALS,
    VIDEO_BACKBONES,
)

__all__ = ["ModelConfig"]


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
