"""ResNet-18/50/152 frame encoders: torchvision's ResNets without ``fc``, frozen or group normalisation.

Algorithm: He et al.'s residual networks (CVPR 2016), built by ``torchvision.models.ResNet`` itself, with
``fc`` replaced by the identity: ``[N, C, H, W] -> [N, out_dim]`` (512 or 2048). Module names are
torchvision's, so an ImageNet state_dict file loads with ``load_imagenet_weights`` (no download).
Normalisation is ``nn.BatchNorm2d`` only when asked (``norm="batch"``, ``model.norm="batchnorm"``):
batch statistics depend on the micro-batch split and couple the sequences of a block. ``norm="frozen"`` is ``models.norm.FrozenBatchNorm`` (BatchNorm2d's keys,
a fixed affine map: exact and free, but the identity from scratch, where deep stacks blow up);
``norm="group"`` is GroupNorm with 32 groups (per-sample statistics, trains from scratch, cannot load
ImageNet BatchNorm files). Costs: docs/ARCHITECTURE.md, "Measurements behind the code".
Cross-modality initialisation (TSN, Sec. 3.2): a C-channel input starts from RGB by averaging conv1 over
the RGB channels, repeated C times, not rescaled by 3/C (``models.weights.cross_modality_weight``); for
the RGB classifier ``load_imagenet_weights(..., conv1="tile")`` repeats the 3-channel conv1 over
[frames, differences], so a still frame gets the exact ImageNet response.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchvision.models import ResNet
from torchvision.models.resnet import BasicBlock, Bottleneck

from raytrain_seq.models.backbones import IMAGENET_MEAN, IMAGENET_STD
from raytrain_seq.models.norm import FrozenBatchNorm, GroupNorm
from raytrain_seq.models.transfer import channels_last
from raytrain_seq.models.weights import cross_modality_weight, load_backbone_weights

logger = logging.getLogger(__name__)

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "NORMS",
    "RESNET_ARCHS",
    "RESNET_BUILDERS",
    "FrozenBatchNorm2d",
    "ResNetEncoder",
    "build_resnet",
    "cross_modality_init",
    "cross_modality_weight",
    "load_imagenet_weights",
]

NORMS = ("frozen", "group", "batch")
GROUPS = 32  # GroupNorm groups: every ResNet width (64 .. 2048) is a multiple of 32


# The frozen BatchNorm of torchvision, for inputs of any rank (the name the package always exported).
FrozenBatchNorm2d = FrozenBatchNorm


def _norm_layer(norm: str) -> Callable[[int], nn.Module]:
    if norm == "frozen":
        return FrozenBatchNorm
    if norm == "batch":
        return nn.BatchNorm2d
    return lambda channels: GroupNorm(GROUPS, channels)


# arch -> (block, blocks per stage), as torchvision.models.resnet18 / resnet50 / resnet152.
RESNET_ARCHS: dict[str, tuple[type[nn.Module], tuple[int, int, int, int]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}


def _check_options(arch: str, in_channels: int, norm: str) -> None:
    if arch not in RESNET_ARCHS:
        raise ValueError(f"unknown ResNet {arch!r}: choose one of {sorted(RESNET_ARCHS)}")
    if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
        raise ValueError(f"in_channels must be a positive int, got {in_channels!r}: e.g. 3 for RGB")
    if norm not in NORMS:
        raise ValueError(
            f"norm must be one of {NORMS}, got {norm!r}: 'frozen' for ImageNet weights, 'group' "
            f"for training from scratch, 'batch' for BatchNorm that trains (inexact: models.factory)"
        )


class ResNetEncoder(ResNet):
    """torchvision's ResNet with ``fc`` the identity: float ``[N, in_channels, H, W]`` -> ``[N, out_dim]``.

    ``out_dim`` is 512 (resnet18) or 2048 (resnet50/152). Spatial size shrinks by 32 (112 -> 4 before
    the mean; inputs down to 1x1 work). Weights are initialised as torchvision does (Kaiming normal,
    fan_out, for convs; normalisation weight 1, bias 0); ``conv1`` is rebuilt for ``in_channels`` != 3.
    """

    def __init__(self, arch: str = "resnet18", in_channels: int = 3, *, norm: str = "frozen") -> None:
        _check_options(arch, in_channels, norm)
        block, counts = RESNET_ARCHS[arch]
        super().__init__(block, list(counts), norm_layer=_norm_layer(norm))
        self.arch, self.in_channels, self.norm = arch, in_channels, norm
        if in_channels != 3:
            # Same slot in the module order, so the state_dict keys keep torchvision's order.
            self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
            nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.out_dim = 512 * block.expansion
        self.fc = nn.Identity()  # the run's classifier head replaces ImageNet's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"{self.arch} expects [N, {self.in_channels}, H, W], got shape {tuple(x.shape)}: build it "
                f"with in_channels={x.shape[1] if x.dim() == 4 else '<C>'}"
            )
        return super().forward(channels_last(x))


def load_imagenet_weights(encoder: ResNetEncoder, path: str | Path, *, conv1: str = "average") -> list[str]:
    """Load a torchvision ResNet state_dict file (``torch.load(weights_only=True)``) into ``encoder``.

    Strict about every tensor of the encoder: each must be in the file with its shape. File keys
    ``fc.*`` (the ImageNet classifier) and ``*.num_batches_tracked`` (a BatchNorm counter) are skipped
    and returned; any other extra key raises. If ``conv1`` has C != file's input channels (3 for RGB),
    its weight is adapted: ``conv1="average"`` by ``cross_modality_weight`` (TSN: averaged and repeated,
    not rescaled; for flow), ``conv1="tile"`` by repeating the RGB filters as they are when C is a
    multiple of 3 (the classifier's RGB input [frames, differences]: a still frame then gets exactly the
    pretrained colour response, which the frozen ``bn1`` statistics expect).
    Errors name the file and the first mismatched key, in the encoder's key order, then the file's.
    """
    if not isinstance(encoder, ResNetEncoder):
        raise TypeError(f"encoder must be a ResNetEncoder (build_resnet / 'resnet18'), got {type(encoder)}")
    hint = (
        " (this encoder has norm='group', which has no BatchNorm statistics: build it with norm='frozen' "
        "to load ImageNet BatchNorm weights)"
        if encoder.norm == "group"
        else ""
    )
    return load_backbone_weights(
        encoder, path, arch=encoder.arch, first_conv="conv1.weight", conv1=conv1, hint=hint
    )


def _first_conv_key(state: Mapping[str, torch.Tensor]) -> str:
    for key, value in state.items():
        if (
            key.endswith("weight")
            and torch.is_tensor(value)
            and value.dim() in (4, 5)
            and value.is_floating_point()
        ):
            return key
    raise ValueError(
        "no 4-D or 5-D conv weight in the target state: pass key='<first conv>.weight' explicitly"
    )


def cross_modality_init(
    target_state: Mapping[str, torch.Tensor],
    source_state: Mapping[str, torch.Tensor],
    *,
    key: str | None = None,
    groups: int = 1,
) -> dict[str, torch.Tensor]:
    """A flow model's state started from an RGB model's: every tensor copied, the first conv by TSN's rule.

    ``target_state`` (the flow model's ``state_dict()``) fixes the keys, dtypes and devices of the result;
    values come from ``source_state`` (the RGB run's). The first conv, ``key``, gets
    ``cross_modality_weight(source[key], target channels, groups=groups)``; ``key=None`` takes the first
    4-D or 5-D floating ``*weight`` in the target's key order, which is ``encoder.conv1.weight`` (ResNet)
    or ``encoder.features.0.weight`` ("small") in a TemporalClassifier, ``encoder.net.stem.0.weight`` in a
    video backbone's SequenceClassifier and ``conv1.weight`` in a bare encoder. With the classifier's motion input ([frames, differences]) pass ``groups=2``. Any other key
    missing on either side, or any other shape mismatch, raises naming the key.
    """
    for name, state in (("target_state", target_state), ("source_state", source_state)):
        if not isinstance(state, Mapping):
            raise TypeError(f"{name} must be a state_dict (model.state_dict()), got {type(state).__name__}")
    key = _first_conv_key(target_state) if key is None else key
    if key not in target_state or key not in source_state:
        side = "target_state" if key not in target_state else "source_state"
        raise ValueError(f"first-conv key {key!r} is not in {side}: pass the first conv's weight key")
    missing = [k for k in target_state if k not in source_state]
    extra = [k for k in source_state if k not in target_state]
    if missing or extra:
        bad = missing[0] if missing else extra[0]
        where = "the source (RGB) state lacks" if missing else "the target (flow) state lacks"
        raise ValueError(
            f"{where} key {bad!r}: both models need the same architecture (backbone, "
            f"temporal module, hidden size, classes)"
        )
    result: dict[str, torch.Tensor] = {}
    for name, tgt in target_state.items():
        src = source_state[name]
        if name == key:
            if src.dim() not in (4, 5) or (src.shape[0], *src.shape[2:]) != (tgt.shape[0], *tgt.shape[2:]):
                raise ValueError(
                    f"first conv {key!r}: source {tuple(src.shape)} and target {tuple(tgt.shape)} must agree "
                    f"in every dim but the input channels (dim 1): same backbone and width on both sides"
                )
            src = cross_modality_weight(src, tgt.shape[1], groups=groups)
        elif src.shape != tgt.shape:
            raise ValueError(
                f"key {name!r} has shape {tuple(src.shape)} in the source but {tuple(tgt.shape)} in the "
                f"target: only the first conv ({key!r}) may differ; build both with the same options"
            )
        result[name] = src.detach().to(device=tgt.device, dtype=tgt.dtype).clone()
    return result


def build_resnet(
    arch: str, in_channels: int, *, norm: str = "frozen", weights: str | Path | None = None
) -> ResNetEncoder:
    """``ResNetEncoder(arch, in_channels, norm=norm)``, then ``load_imagenet_weights`` if ``weights``."""
    encoder = ResNetEncoder(arch, in_channels, norm=norm)
    if weights is not None:
        load_imagenet_weights(encoder, weights)
    return encoder


# Options of the "small" encoder. TemporalClassifier passes width and depth to every backbone; they have
# no meaning for a ResNet (its widths and depth are fixed by arch), so the ResNet builders accept and drop
# exactly these and still reject any other unknown option (a typo such as nrom= must not pass silently).
_SMALL_ENCODER_OPTIONS = frozenset({"width", "depth", "groups"})


def _registry_builder(arch: str) -> Callable[..., nn.Module]:
    def build(
        in_channels: int, *, norm: str | None = None, weights: str | Path | None = None, **options: Any
    ) -> nn.Module:
        # Frozen BatchNorm only makes sense with the statistics of loaded weights; from scratch it
        # normalises nothing (feature std 7.9e6 at init for resnet152), so the default follows weights.
        norm = norm or ("frozen" if weights is not None else "group")
        unknown = sorted(set(options) - _SMALL_ENCODER_OPTIONS)
        if unknown:
            raise TypeError(f"{arch} takes the options norm and weights, not {unknown}: remove them")
        if options:
            logger.debug("%s ignores the small encoder's options %s", arch, sorted(options))
        return build_resnet(arch, in_channels, norm=norm, weights=weights)

    build.__name__ = f"build_{arch}"
    return build


# Entries for FRAME_ENCODERS: name -> builder(in_channels, *, norm="frozen", weights=None, **ignored).
RESNET_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    arch: _registry_builder(arch) for arch in RESNET_ARCHS
}
