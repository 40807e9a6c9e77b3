"""Per-frame encoders: uint8 frames -> float, then a CNN mapping ``[N, C, H, W]`` to ``[N, D]``.

Algorithm: each real frame of a BLoad block (Iftekhar, Ruschel et al., "BLoad") is encoded on its own, so
the encoder can never mix two sequences; the temporal module that follows is where resets matter. The
"small" encoder is ``depth`` stride-2 stages of conv3x3 -> GroupNorm -> ReLU (channels ``width * 2**i``)
and a global spatial mean. GroupNorm, never BatchNorm: batch statistics would couple the frames of
different sequences (and of different micro-batches, breaking the exact micro-batch gradient). The one
exception is asked for by name: ``norm="batch"`` (``model.norm="batchnorm"``) puts ``nn.BatchNorm2d`` in its
place, for the Algorithm 2 experiment (``bench/bn_merge.py``) and for users who accept inexact statistics
(``models.factory`` says why).

Trade-off: the width 16 / depth 4 encoder has 97,680 parameters and still takes most of the classifier's
forward+backward on CPU (docs/ARCHITECTURE.md, "Measurements behind the code"); it is deliberately tiny so the whole pipeline trains on
a laptop, and larger backbones plug into ``build_frame_encoder`` (see ``FRAME_ENCODERS``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from raytrain_seq.models.backbones import RESNET_NAMES
from raytrain_seq.models.norm import GroupNorm

logger = logging.getLogger(__name__)

__all__ = ["FRAME_ENCODERS", "FrameNormalizer", "SmallFrameEncoder", "build_frame_encoder"]


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}: pass e.g. {name}=1")
    return value


class FrameNormalizer(nn.Module):
    """Channel-last frames (uint8 in [0, 255], or float already in [0, 1]) -> ``(x - mean) / std``.

    The conversion lives in the model so block rows stay uint8 (4x smaller) until they reach the device.
    Defaults ``mean=0.5, std=1.0`` give ``x / 255 - 0.5``; pass per-channel statistics to whiten instead.
    """

    def __init__(
        self, in_channels: int, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
    ) -> None:
        super().__init__()
        self.in_channels = _positive_int("in_channels", in_channels)
        mean_t = torch.full((in_channels,), 0.5) if mean is None else torch.as_tensor(mean, dtype=torch.float)
        std_t = torch.ones(in_channels) if std is None else torch.as_tensor(std, dtype=torch.float)
        for name, t in (("mean", mean_t), ("std", std_t)):
            if t.shape != (in_channels,):
                raise ValueError(
                    f"{name} has shape {tuple(t.shape)}; give one value per input channel ({in_channels})"
                )
        if not bool((std_t > 0).all()):
            raise ValueError(f"std must be positive in every channel, got {std_t.tolist()}")
        # Non-persistent: constants, not learned state, so weight averaging never touches them.
        self.register_buffer("mean", mean_t, persistent=False)
        self.register_buffer("std", std_t, persistent=False)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """``frames`` ``[..., C]`` -> float in the buffers' dtype (the model's dtype), normalised."""
        if frames.shape[-1] != self.in_channels:
            raise ValueError(
                f"frames have {frames.shape[-1]} channels (last dim) but the model was built with "
                f"in_channels={self.in_channels}: build it with in_channels={frames.shape[-1]}"
            )
        if frames.dtype == torch.uint8:
            x = frames.to(self.mean.dtype) / 255.0
        elif frames.is_floating_point():
            x = frames.to(self.mean.dtype)
        else:
            raise TypeError(f"frames must be uint8 (0..255) or float (0..1), got {frames.dtype}")
        return (x - self.mean) / self.std


class SmallFrameEncoder(nn.Module):
    """``depth`` stride-2 conv3x3 + GroupNorm (``norm="batch"``: BatchNorm) + ReLU stages, then a spatial mean: ``[N,C,H,W] -> [N,D]``.

    Channels double per stage from ``width``: width 16, depth 4 -> 16, 32, 64, 128, so ``out_dim`` is
    ``width * 2**(depth-1)`` (128). A 32x32 frame shrinks 32 -> 16 -> 8 -> 4 -> 2 before the mean.
    """

    def __init__(
        self, in_channels: int, *, width: int = 16, depth: int = 4, groups: int = 8, norm: str = "group"
    ) -> None:
        super().__init__()
        if norm not in ("group", "batch"):
            raise ValueError(
                f"norm must be 'group' or 'batch', got {norm!r}: 'group' unless BatchNorm must train"
            )
        _positive_int("in_channels", in_channels)
        _positive_int("width", width)
        _positive_int("depth", depth)
        _positive_int("groups", groups)
        layers: list[nn.Module] = []
        c_in = in_channels
        for stage in range(depth):
            c_out = width * 2**stage
            layers += [
                # No conv bias: GroupNorm's shift makes it redundant.
                nn.Conv2d(c_in, c_out, kernel_size=3, stride=2, padding=1, bias=False),
                # gcd keeps the group count a divisor of the channels (width 12 -> 4 groups of 3).
                GroupNorm(math.gcd(c_out, groups), c_out) if norm == "group" else nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True),
            ]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.out_dim = c_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).mean(dim=(2, 3))


def _build_small(in_channels: int, **kwargs: Any) -> nn.Module:
    return SmallFrameEncoder(in_channels, **kwargs)


def _resnet_builder(arch: str) -> Callable[..., nn.Module]:
    def build(in_channels: int, **kwargs: Any) -> nn.Module:
        # torchvision is imported here, when a ResNet is built, not with this module (models.backbones).
        from raytrain_seq.models.resnet import RESNET_BUILDERS

        return RESNET_BUILDERS[arch](in_channels, **kwargs)

    build.__name__ = f"build_{arch}"
    return build


# The backbone seam: name -> builder(in_channels, **kwargs) returning an nn.Module that maps float
# [N, in_channels, H, W] -> [N, out_dim] and exposes ``out_dim``. "resnet18" / "resnet50" / "resnet152"
# (models/resnet.py) take ``norm`` and ``weights`` and drop the small encoder's width/depth/groups, which
# the classifier passes to every backbone.
FRAME_ENCODERS: dict[str, Callable[..., nn.Module]] = {
    "small": _build_small, **{arch: _resnet_builder(arch) for arch in RESNET_NAMES}
}  # fmt: skip


def build_frame_encoder(name: str, in_channels: int, **kwargs: Any) -> nn.Module:
    """Build the frame encoder registered as ``name`` (see ``FRAME_ENCODERS``) for ``in_channels`` inputs.

    ``in_channels`` is 3 for RGB and 2 for optical flow (x, y). Keyword options go to the builder
    ("small": ``width``, ``depth``, ``groups``, ``norm`` "group" | "batch"; the ResNets: ``norm`` "frozen" | "group" and ``weights``, a
    local torchvision ImageNet file, and they ignore the small encoder's options).
    """
    if name not in FRAME_ENCODERS:
        raise ValueError(f"unknown frame encoder {name!r}: choose one of {sorted(FRAME_ENCODERS)}")
    encoder = FRAME_ENCODERS[name](in_channels, **kwargs)
    if not isinstance(getattr(encoder, "out_dim", None), int):
        raise TypeError(f"frame encoder {name!r} must expose an int out_dim, the size of its output")
    logger.debug("frame encoder %s: in_channels=%d out_dim=%d", name, in_channels, encoder.out_dim)
    return encoder
