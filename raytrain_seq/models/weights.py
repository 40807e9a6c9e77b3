"""torchvision state_dict files into a backbone: read, match key by key, adapt the first conv, load.

``load_backbone_weights(module, path, arch=..., first_conv=..., conv1=...)`` loads a file a user
downloaded beforehand (ImageNet ResNets, Kinetics-400 video ResNets; no download happens here) into a
backbone built with torchvision's module names. Contract: strict about every tensor of the backbone
(each must be in the file with its shape); the file's classifier (``fc.*``) and BatchNorm batch counters
(``*.num_batches_tracked``) are skipped and returned, because the run's own head replaces the classifier
and frozen statistics need no counter; any other extra key raises. The first conv may have other input
channels than the file's 3 (RGB): ``conv1="average"`` applies TSN's cross-modality rule (Wang et al.,
ECCV 2016: averaged over the RGB channels, repeated, not rescaled), ``conv1="tile"`` repeats the RGB
filters (a still frame of an [frames, differences] input then gets exactly the pretrained response).
Every error is a ValueError naming the file, the architecture and the first mismatched key (in the
backbone's key order, then the file's), raised before any tensor is copied.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["CONV1_RULES", "cross_modality_weight", "load_backbone_weights", "read_state_file"]

CONV1_RULES = ("average", "tile")


def cross_modality_weight(weight: torch.Tensor, in_channels: int, *, groups: int = 1) -> torch.Tensor:
    """TSN's rule: ``[O, C_src, *kernel]`` -> ``[O, in_channels, *kernel]``, averaged and repeated, no rescale.

    The source channels are cut into ``groups`` equal consecutive groups, each averaged over its channels
    and repeated over the matching group of target channels. ``groups=1``: an ImageNet conv1 ``[64, 3]``
    to 6 channels gives every channel ``w.mean(1)``. ``groups=2`` keeps the classifier's
    ``[frames, differences]`` layout apart: source 6 = RGB frames 0-2 + RGB differences 3-5, target 4 =
    flow x, y 0-1 + flow differences 2-3, so target 0-1 = mean of source 0-2, target 2-3 = mean of 3-5.
    A 3-D conv (``[O, C, kt, kh, kw]``, the video backbones' stem) follows the same rule.
    """
    if weight.dim() not in (4, 5):
        raise ValueError(
            f"expected a conv weight [out, in, kh, kw] or [out, in, kt, kh, kw], got {tuple(weight.shape)}"
        )
    c_src = weight.shape[1]
    if groups < 1 or c_src % groups or in_channels % groups:
        raise ValueError(
            f"groups={groups} must divide both the source's {c_src} and the target's {in_channels} input "
            f"channels: use groups=1 (all channels averaged together)"
        )
    parts = []
    for src in weight.chunk(groups, dim=1):
        mean = src.mean(dim=1, keepdim=True)  # [O, 1, *kernel]
        parts.append(mean.expand(-1, in_channels // groups, *(-1,) * (weight.dim() - 2)))
    return torch.cat(parts, dim=1).contiguous()


def read_state_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A dict of tensors from ``path`` (``torch.load(weights_only=True)``); ValueError naming the file."""
    path = Path(path).expanduser()
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
    return dict(state)


def _mismatch(source: Path, key: str, problem: str, fix: str) -> ValueError:
    return ValueError(f"{source}: key {key!r} {problem}: {fix}")


def _adapt_first_conv(path: Path, value: torch.Tensor, channels: int, conv1: str) -> torch.Tensor:
    """The file's first-conv weight for ``channels`` input channels (``conv1``: "tile" or "average")."""
    if conv1 == "tile":
        if channels % value.shape[1]:
            raise ValueError(
                f"{path}: conv1='tile' repeats the file's {value.shape[1]} input channels, which do "
                f"not divide the backbone's {channels}: use conv1='average'"
            )
        return value.repeat(1, channels // value.shape[1], *(1,) * (value.dim() - 2))
    return cross_modality_weight(value, channels)


def _matched(
    path: Path, state: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], arch: str, *,
    first_conv: str, conv1: str, hint: str,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Every target key's tensor from ``state``, the first conv adapted; ValueError at the first misfit."""
    adapted: dict[str, torch.Tensor] = {}
    for key, tensor in target.items():
        if key not in state:
            raise _mismatch(
                path, key, "is missing from the file" + hint,
                f"the file must be a torchvision {arch} state_dict (keys like {next(iter(target))!r})",
            )  # fmt: skip
        value = state[key]
        if key == first_conv and value.dim() == tensor.dim() and value.shape[1] != tensor.shape[1]:
            value = _adapt_first_conv(path, value, tensor.shape[1], conv1)
            logger.info(
                "%s: %s adapted from %d to %d input channels (%s)", path, key, state[key].shape[1],
                tensor.shape[1], "tiled" if conv1 == "tile" else "TSN average",
            )  # fmt: skip
        if value.shape != tensor.shape:
            raise _mismatch(
                path, key, f"has shape {tuple(value.shape)} in the file but {tuple(tensor.shape)} in {arch}",
                f"use a {arch} file (another architecture or depth has other shapes)",
            )  # fmt: skip
        adapted[key] = value
    return adapted


def load_backbone_weights(
    module: nn.Module, path: str | Path, *, arch: str, first_conv: str, conv1: str = "average", hint: str = ""
) -> list[str]:
    """Load the torchvision state_dict file ``path`` into ``module`` (see the module docstring); returns
    the file's keys that were skipped (its classifier, its batch counters). ``hint`` is appended to a
    missing or unexpected key's error (e.g. why a GroupNorm backbone takes no BatchNorm statistics)."""
    if conv1 not in CONV1_RULES:
        raise ValueError(
            f"conv1 must be 'average' (flow, TSN) or 'tile' (RGB frames + differences), got {conv1!r}"
        )
    path = Path(path).expanduser()
    state = read_state_file(path)
    target = module.state_dict()
    skipped = [
        k for k in state if k.startswith("fc.") or (k.endswith(".num_batches_tracked") and k not in target)
    ]
    adapted = _matched(path, state, target, arch, first_conv=first_conv, conv1=conv1, hint=hint)
    extra = [k for k in state if k not in target and k not in skipped]
    if extra:
        raise _mismatch(
            path, extra[0], f"is not in {arch}{hint} ({len(extra)} unexpected keys)",
            f"the file must be a torchvision {arch} state_dict",
        )  # fmt: skip
    module.load_state_dict(adapted, strict=True)
    logger.info("loaded %s into %s; skipped %s", path, arch, skipped)
    return skipped
