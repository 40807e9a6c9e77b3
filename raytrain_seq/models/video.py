"""torchvision's video ResNets as per-sequence encoders: one whole sequence in, one feature vector out.

``torchvision.models.video`` builds R3D-18, MC3-18 and R(2+1)D-18 (Tran et al., CVPR 2018);
``VideoBackbone`` keeps it as ``net`` with ``fc`` the identity, so ``forward(frames [T, C, H, W])`` runs
the clip ``[1, C, T, H, W]`` and returns its ``[512]`` feature. ``models.sequence.SequenceClassifier``
calls it once per real sequence, so two sequences never meet in a convolution and padding is never
encoded; ``forward_packed`` batches equal lengths in one call, which changes nothing per clip because
every ``nn.BatchNorm3d`` is replaced: by frozen statistics (with ``weights``) or GroupNorm (from scratch;
the largest group count <= 32 dividing the width); ``norm="batch"`` keeps it, inexact (``models.factory``).
Any T >= 1 works.
``load_video_weights(backbone, FILE)`` loads a torchvision Kinetics-400 state_dict, downloaded beforehand
(``models.weights.load_backbone_weights``: keys and shapes checked, the file's ``fc`` skipped, the stem
averaged for another channel count); inputs are normalised by ``KINETICS_MEAN``/``KINETICS_STD``.
Trade-off: sequences of different lengths are separate calls, for exactness and no compute on padding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchvision.models import video as tv_video

from raytrain_seq.models.backbones import KINETICS_MEAN, KINETICS_STD, VIDEO_ARCHS
from raytrain_seq.models.norm import FrozenBatchNorm, GroupNorm, group_count
from raytrain_seq.models.transfer import channels_last
from raytrain_seq.models.weights import load_backbone_weights

logger = logging.getLogger(__name__)

__all__ = [
    "KINETICS_MEAN", "KINETICS_STD", "VIDEO_ARCHS", "VIDEO_BUILDERS", "VideoBackbone", "load_video_weights",
]  # fmt: skip

NORMS = ("frozen", "group", "batch")
FIRST_CONV = "stem.0.weight"  # every VideoResNet stem starts with its one Conv3d on the input


def _replace_batchnorm(module: nn.Module, norm: str) -> int:
    """Swap every ``nn.BatchNorm3d`` below ``module`` for the ``norm`` layer, in place; returns the count
    (``norm="batch"`` keeps them: 0)."""
    count = 0
    if norm == "batch":
        return count
    for name, child in list(module.named_children()):
        if isinstance(child, nn.BatchNorm3d):
            c = child.num_features
            setattr(module, name, FrozenBatchNorm(c) if norm == "frozen" else GroupNorm(group_count(c), c))
            count += 1
        else:
            count += _replace_batchnorm(child, norm)
    return count


class VideoBackbone(nn.Module):
    """A torchvision video ResNet without ``fc``: ``[T, C, H, W]`` (one sequence) -> ``[512]``.

    Also ``[B, T, C, H, W]`` -> ``[B, 512]`` (B clips of one length), and ``forward_packed(x [N, C, H, W],
    lengths [K]) -> [K, 512]`` for K sequences laid one after another (the classifier's layout).
    """

    def __init__(self, arch: str = "r2plus1d_18", in_channels: int = 3, *, norm: str = "group") -> None:
        super().__init__()
        if arch not in VIDEO_ARCHS:
            raise ValueError(f"unknown video backbone {arch!r}: choose one of {list(VIDEO_ARCHS)}")
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f"in_channels must be a positive int, got {in_channels!r}: e.g. 3 for RGB")
        if norm not in NORMS:
            raise ValueError(
                f"norm must be one of {NORMS}, got {norm!r}: 'frozen' with weights, else 'group' ('batch': "
                "BatchNorm that trains, inexact: models.factory)"
            )
        self.arch, self.in_channels, self.norm = arch, in_channels, norm
        net = getattr(tv_video, arch)(weights=None)
        if in_channels != 3:
            old = net.stem[0]
            net.stem[0] = nn.Conv3d(
                in_channels,
                old.out_channels,
                old.kernel_size,
                stride=old.stride,
                padding=old.padding,
                bias=False,
            )
            nn.init.kaiming_normal_(net.stem[0].weight, mode="fan_out", nonlinearity="relu")
        _replace_batchnorm(net, norm)
        net.fc = nn.Identity()  # the run's classifier head replaces Kinetics' 400 classes
        self.net = net
        self.out_dim = 512

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        single = frames.dim() == 4
        clips = frames[None] if single else frames
        if clips.dim() != 5 or clips.shape[2] != self.in_channels:
            raise ValueError(
                f"{self.arch} expects frames [T, {self.in_channels}, H, W] or [B, T, {self.in_channels}, H, W], "
                f"got shape {tuple(frames.shape)}: build it with the input's channel count"
            )
        # [B, T, C, H, W] -> torchvision's [B, C, T, H, W], channels last on CUDA (models.transfer)
        features = self.net(channels_last(clips.transpose(1, 2)))
        return features[0] if single else features

    def forward_packed(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Features ``[K, 512]`` of K sequences laid one after another in ``x`` (``lengths`` [K]).

        Sequences of equal length go through in one call: lengths ``[4, 2, 4]`` run rows 0-3 and 6-9 as a
        batch of two clips of 4 frames, rows 4-5 as one clip of 2, and the features come back in order.
        """
        sizes = [int(n) for n in lengths.tolist()]
        pieces = x.split(sizes)
        out: list[torch.Tensor | None] = [None] * len(sizes)
        for length in sorted(set(sizes)):
            which = [k for k, n in enumerate(sizes) if n == length]
            features = self(torch.stack([pieces[k] for k in which]))
            for k, feature in zip(which, features, strict=True):
                out[k] = feature
        return torch.stack(out) if out else x.new_zeros(0, self.out_dim)


def load_video_weights(backbone: VideoBackbone, path: str | Path) -> list[str]:
    """Load a torchvision video state_dict (Kinetics-400) into ``backbone.net``; the skipped keys back.

    ValueError naming the file, the architecture and the first mismatched key; the stem's first conv is
    averaged over the file's RGB channels (TSN) when the backbone takes another channel count.
    """
    if not isinstance(backbone, VideoBackbone):
        raise TypeError(f"backbone must be a VideoBackbone ('r2plus1d_18', ...), got {type(backbone)}")
    hint = (
        " (this backbone has norm='group', which has no BatchNorm statistics: build it with norm='frozen' "
        "to load torchvision's BatchNorm weights)"
        if backbone.norm == "group"
        else ""
    )
    return load_backbone_weights(backbone.net, path, arch=backbone.arch, first_conv=FIRST_CONV, hint=hint)


# The small encoder's options, which the classifier passes to every backbone: dropped here, as the
# ResNets do, while any other unknown option (a typo) still raises.
_IGNORED = frozenset({"width", "depth", "groups"})


def _builder(arch: str) -> Callable[..., nn.Module]:
    def build(
        in_channels: int, *, norm: str | None = None, weights: str | Path | None = None, **options: Any
    ) -> nn.Module:
        unknown = sorted(set(options) - _IGNORED)
        if unknown:
            raise TypeError(f"{arch} takes the options norm and weights, not {unknown}: remove them")
        backbone = VideoBackbone(
            arch, in_channels, norm=norm or ("frozen" if weights is not None else "group")
        )
        if weights is not None:
            load_video_weights(backbone, weights)
        return backbone

    build.__name__ = f"build_{arch}"
    return build


# name -> builder(in_channels, *, norm=None, weights=None, **ignored) returning a VideoBackbone.
VIDEO_BUILDERS: dict[str, Callable[..., nn.Module]] = {arch: _builder(arch) for arch in VIDEO_ARCHS}
