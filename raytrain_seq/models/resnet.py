"""ResNet-18/50/152 frame encoders with torchvision's parameter names, frozen or group normalisation.

Algorithm: the residual networks of He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016),
in torchvision's layout (the "v1.5" Bottleneck strides on its 3x3 conv): a 7x7/2 stem conv, 3x3/2 max
pool, four stages of BasicBlocks (18: [2, 2, 2, 2]) or Bottlenecks (50: [3, 4, 6, 3], 152: [3, 8, 36, 3]),
then a global average pool, ``[N, C, H, W] -> [N, out_dim]`` (512 or 2048). The classifier ``fc`` is left
out. Module names equal torchvision's (``conv1``, ``bn1``, ``layer3.35.conv3``, ``layer2.0.downsample.1``),
so a torchvision ImageNet state_dict file loads with ``load_imagenet_weights`` (no download, no torchvision).

Normalisation. Micro-batch streaming (Piao, Synn et al.) makes BatchNorm's batch statistics depend on how
a mini-batch is split, and BLoad blocks would couple different sequences through them, so there is no
``nn.BatchNorm2d`` here. ``norm="frozen"`` (default) is a FrozenBatchNorm2d as in torchvision.ops /
Detectron: ``weight``, ``bias``, ``running_mean``, ``running_var`` are buffers (BatchNorm2d's state_dict
keys, so ImageNet weights load), applied as the fixed affine map ``x * scale + shift``; frames never
interact and nothing is learned in it. ``norm="group"`` is GroupNorm with 32 groups (Wu & He, ECCV 2018),
per-sample statistics and a learned affine, for training from scratch; it has no running statistics, so
ImageNet BatchNorm files do not load into it (a clear error says so). Trade-off: frozen BN is exact and
free but only normalises when pretrained statistics are loaded (from scratch it is the identity, and
deep stacks of unnormalised residual blocks blow up); GroupNorm trains from scratch but costs a
reduction per layer and cannot reuse ImageNet BatchNorm weights; on CPU the two cost about the same
(docs/ARCHITECTURE.md, "Measurements behind the code", with the feature scale at initialisation: with frozen BN from scratch it grows
by orders of magnitude with depth, with GroupNorm it stays near 1).

Cross-modality initialisation (Wang et al., "Temporal Segment Networks", ECCV 2016, Sec. 3.2): a network
for inputs with C channels (flow, or frames plus differences) starts from an RGB one by averaging the
first conv's weights over the RGB input channels and replicating that average C times. Like TSN we do NOT
rescale by 3/C: a gray input v on every channel then gives C/3 times the RGB response, but the frame
channels of an RGB+difference input (differences ~0 away from motion) give exactly the pretrained gray
response, which is what the frozen ``bn1`` statistics right after ``conv1`` expect. For the RGB
classifier itself ``load_imagenet_weights(..., conv1="tile")`` keeps the colour filters: the file's
3-channel conv1 repeated over [frames, differences], so a still frame gets the exact ImageNet response.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from raytrain_seq.models.norm import GroupNorm

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

# torchvision's ImageNet input statistics (RGB, images in [0, 1]); pass them to FrameNormalizer with weights.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NORMS = ("frozen", "group")
GROUPS = 32  # GroupNorm groups: every ResNet width (64 .. 2048) is a multiple of 32


def _drop_batch_counter(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    # A BatchNorm2d file counts its training batches; frozen statistics have no use for the counter. The
    # pre-hook runs on this module's own copy of the state_dict, before its keys are matched.
    state_dict.pop(prefix + "num_batches_tracked", None)


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d with fixed statistics and affine: ``y = (x - running_mean) / sqrt(running_var + eps) * w + b``.

    All four tensors are buffers (state_dict keys as BatchNorm2d's, minus ``num_batches_tracked``, which
    a loaded file may carry and is dropped), so nothing is learned or updated and each sample is
    normalised on its own: the output of a frame never depends on the rest of the batch. Matches
    ``nn.BatchNorm2d`` in eval mode with the same statistics.
    """

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.num_features, self.eps = num_features, eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_load_state_dict_pre_hook(_drop_batch_counter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * torch.rsqrt(self.running_var + self.eps)
        shift = self.bias - self.running_mean * scale
        return x * scale[None, :, None, None] + shift[None, :, None, None]

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"


def _norm_layer(norm: str) -> Callable[[int], nn.Module]:
    if norm == "frozen":
        return FrozenBatchNorm2d
    return lambda channels: GroupNorm(GROUPS, channels)


def _conv(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    # No bias: the normalisation's shift right after makes it redundant (and torchvision has none).
    return nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs and a shortcut: ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``."""

    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int, downsample: nn.Module | None, norm: str) -> None:
        super().__init__()
        make_norm = _norm_layer(norm)
        self.conv1, self.bn1 = _conv(c_in, planes, 3, stride), make_norm(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = _conv(planes, planes, 3), make_norm(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + shortcut)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride, torchvision's v1.5), 1x1 expand by 4, plus a shortcut."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int, downsample: nn.Module | None, norm: str) -> None:
        super().__init__()
        make_norm = _norm_layer(norm)
        self.conv1, self.bn1 = _conv(c_in, planes, 1), make_norm(planes)
        self.conv2, self.bn2 = _conv(planes, planes, 3, stride), make_norm(planes)
        self.conv3, self.bn3 = _conv(planes, planes * 4, 1), make_norm(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + shortcut)


# arch -> (block, blocks per stage), as torchvision.models.resnet18 / resnet50 / resnet152.
RESNET_ARCHS: dict[str, tuple[type[nn.Module], tuple[int, int, int, int]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}


class ResNetEncoder(nn.Module):
    """torchvision ResNet without ``fc``: float ``[N, in_channels, H, W]`` -> ``[N, out_dim]``.

    ``out_dim`` is 512 (resnet18) or 2048 (resnet50/152). Spatial size shrinks by 32 (112 -> 4 before
    the mean; inputs down to 1x1 work). Weights are initialised as torchvision does (Kaiming normal,
    fan_out, for convs; normalisation weight 1, bias 0).
    """

    def __init__(self, arch: str = "resnet18", in_channels: int = 3, *, norm: str = "frozen") -> None:
        super().__init__()
        if arch not in RESNET_ARCHS:
            raise ValueError(f"unknown ResNet {arch!r}: choose one of {sorted(RESNET_ARCHS)}")
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f"in_channels must be a positive int, got {in_channels!r}: e.g. 3 for RGB")
        if norm not in NORMS:
            raise ValueError(
                f"norm must be one of {NORMS}, got {norm!r}: 'frozen' for ImageNet weights, 'group' "
                f"for training from scratch"
            )
        block, counts = RESNET_ARCHS[arch]
        self.arch, self.in_channels, self.norm = arch, in_channels, norm
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = _norm_layer(norm)(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        c_in = 64
        for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), counts, strict=True)):
            stride = 1 if stage == 0 else 2
            downsample = None
            if stride != 1 or c_in != planes * block.expansion:
                # The shortcut must match the block output's shape: a strided 1x1 conv + norm (the
                # "downsample.0" / "downsample.1" keys of torchvision files).
                c_out = planes * block.expansion
                downsample = nn.Sequential(_conv(c_in, c_out, 1, stride), _norm_layer(norm)(c_out))
            blocks = [block(c_in, planes, stride, downsample, norm)]
            c_in = planes * block.expansion
            blocks += [block(c_in, planes, 1, None, norm) for _ in range(count - 1)]
            self.add_module(f"layer{stage + 1}", nn.Sequential(*blocks))
        self.out_dim = c_in
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"{self.arch} expects [N, {self.in_channels}, H, W], got shape {tuple(x.shape)}: build it "
                f"with in_channels={x.shape[1] if x.dim() == 4 else '<C>'}"
            )
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return x.mean(dim=(2, 3))  # torchvision's AdaptiveAvgPool2d(1) + flatten


def cross_modality_weight(weight: torch.Tensor, in_channels: int, *, groups: int = 1) -> torch.Tensor:
    """TSN's rule: ``[O, C_src, kh, kw]`` -> ``[O, in_channels, kh, kw]``, averaged and repeated, no rescale.

    The source channels are cut into ``groups`` equal consecutive groups, each averaged over its channels
    and repeated over the matching group of target channels. ``groups=1``: an ImageNet conv1 ``[64, 3]``
    to 6 channels gives every channel ``w.mean(1)``. ``groups=2`` keeps the classifier's
    ``[frames, differences]`` layout apart: source 6 = RGB frames 0-2 + RGB differences 3-5, target 4 =
    flow x, y 0-1 + flow differences 2-3, so target 0-1 = mean of source 0-2, target 2-3 = mean of 3-5.
    """
    if weight.dim() != 4:
        raise ValueError(f"expected a conv weight [out, in, kh, kw], got shape {tuple(weight.shape)}")
    c_src = weight.shape[1]
    if groups < 1 or c_src % groups or in_channels % groups:
        raise ValueError(
            f"groups={groups} must divide both the source's {c_src} and the target's {in_channels} input "
            f"channels: use groups=1 (all channels averaged together)"
        )
    parts = []
    for src in weight.chunk(groups, dim=1):
        mean = src.mean(dim=1, keepdim=True)  # [O, 1, kh, kw]
        parts.append(mean.expand(-1, in_channels // groups, -1, -1))
    return torch.cat(parts, dim=1).contiguous()


def _state_mismatch(source: str, key: str, problem: str, fix: str) -> ValueError:
    return ValueError(f"{source}: key {key!r} {problem}: {fix}")


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
    if conv1 not in ("average", "tile"):
        raise ValueError(
            f"conv1 must be 'average' (flow, TSN) or 'tile' (RGB frames + differences), got {conv1!r}"
        )
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"weights file {str(path)!r} does not exist: pass the path of a local .pth file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        # torch's own message runs over many lines (the weights_only story): its first sentence is the fact.
        first = str(err).strip().splitlines()[0].split(". ")[0][:160] if str(err).strip() else ""
        raise ValueError(
            f"{path} could not be read as a tensor state_dict ({type(err).__name__}: {first}): pass a "
            f"torchvision state_dict file, saved with torch.save(model.state_dict(), path)"
        ) from err
    if not isinstance(state, Mapping) or not all(torch.is_tensor(v) for v in state.values()):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a dict of tensors: save a state_dict")
    target = encoder.state_dict()
    skipped = [
        k for k in state if k.startswith("fc.") or (k.endswith(".num_batches_tracked") and k not in target)
    ]
    group_hint = (
        " (this encoder has norm='group', which has no BatchNorm statistics: build it with norm='frozen' "
        "to load ImageNet BatchNorm weights)"
        if encoder.norm == "group"
        else ""
    )
    adapted: dict[str, torch.Tensor] = {}
    for key, tensor in target.items():
        if key not in state:
            raise _state_mismatch(
                str(path),
                key,
                "is missing from the file" + group_hint,
                f"the file must be a torchvision {encoder.arch} state_dict (keys like 'layer1.0.conv1.weight')",
            )
        value = state[key]
        if key == "conv1.weight" and value.dim() == 4 and value.shape[1] != tensor.shape[1]:
            if conv1 == "tile":
                if tensor.shape[1] % value.shape[1]:
                    raise ValueError(
                        f"{path}: conv1='tile' repeats the file's {value.shape[1]} input channels, which do "
                        f"not divide the encoder's {tensor.shape[1]}: use conv1='average'"
                    )
                value = value.repeat(1, tensor.shape[1] // value.shape[1], 1, 1)
            else:
                value = cross_modality_weight(value, tensor.shape[1])
            logger.info(
                "%s: conv1 adapted from %d to %d input channels (%s)",
                path,
                state[key].shape[1],
                tensor.shape[1],
                "tiled" if conv1 == "tile" else "TSN average",
            )
        if value.shape != tensor.shape:
            raise _state_mismatch(
                str(path),
                key,
                f"has shape {tuple(value.shape)} in the file but {tuple(tensor.shape)} in the encoder",
                f"use a {encoder.arch} file (a different depth has other shapes)",
            )
        adapted[key] = value
    extra = [k for k in state if k not in target and k not in skipped]
    if extra:
        raise _state_mismatch(
            str(path),
            extra[0],
            f"is not in {encoder.arch}{group_hint} ({len(extra)} unexpected keys)",
            f"the file must be a torchvision {encoder.arch} state_dict",
        )
    encoder.load_state_dict(adapted, strict=True)
    logger.info("loaded %s into %s (norm=%s); skipped %s", path, encoder.arch, encoder.norm, skipped)
    return skipped


def _first_conv_key(state: Mapping[str, torch.Tensor]) -> str:
    for key, value in state.items():
        if (
            key.endswith("weight")
            and torch.is_tensor(value)
            and value.dim() == 4
            and value.is_floating_point()
        ):
            return key
    raise ValueError("no 4-D conv weight in the target state: pass key='<first conv>.weight' explicitly")


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
    4-D floating ``*weight`` in the target's key order, which is ``encoder.conv1.weight`` (ResNet) or
    ``encoder.features.0.weight`` ("small") in a TemporalClassifier and ``conv1.weight`` in a bare
    encoder. With the classifier's motion input ([frames, differences]) pass ``groups=2``. Any other key
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
            if src.dim() != 4 or (src.shape[0], *src.shape[2:]) != (tgt.shape[0], *tgt.shape[2:]):
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
