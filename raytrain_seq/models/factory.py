"""The run's model from its config: ``build_model_for(config, num_classes=..., in_channels=...)``.

One place turns ``ModelConfig`` into a model, so every process (learners, evaluator, fusion, benches)
builds the same network; the class count and input channels come from the data (the feed's
``model_spec()``). A per-frame backbone ("small", the ResNets) runs under ``TemporalClassifier``, a
per-sequence encoder (torchvision's video ResNets, or ``model.model_factory``: ``models.hook``) under
``SequenceClassifier``. The starting weights, in order:
* ``model.init_from``: that run's newest averaged model that loads (RGB into flow by TSN's cross-modality
  init; the same norm and class count, else a ValueError naming the field), read by every learner itself.
* ``model.weights``: a local torchvision ImageNet file (ResNets, frozen BatchNorm, conv1 tiled or
  TSN-averaged, ImageNet normalisation) or Kinetics-400 file (video backbones, the run's head).
* otherwise a fresh seeded initialisation (GroupNorm for a ResNet from scratch).
``model.norm="batchnorm"``: BatchNorm that trains, merged by AAVG's Algorithm 2; inexact (a BLoad row
packs several videos; statistics are per micro-batch), for ``bench/bn_merge.py`` and users who accept it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from raytrain_seq import checkpoint
from raytrain_seq.models.backbones import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    KINETICS_MEAN,
    KINETICS_STD,
    VIDEO_ARCHS,
)
from raytrain_seq.models.classifier import build_model
from raytrain_seq.models.frame_encoder import SmallFrameEncoder
from raytrain_seq.models.hook import build_from_factory
from raytrain_seq.models.sequence import SequenceClassifier

if TYPE_CHECKING:
    from raytrain_seq.config import ModelConfig

logger = logging.getLogger(__name__)

__all__ = ["MODEL_NORMS", "build_model_for", "load_run_state", "model_from_state"]

MODEL_NORMS: tuple[str, ...] = ("auto", "batchnorm")
"""``model.norm``'s choices (``config.NORMS``, equal: a test holds them so)."""
# Fields that fix the shapes of a TemporalClassifier's tensors: a source run must agree on all of them.
_ARCHITECTURE = ("backbone", "model_factory", "width", "depth", "hidden", "temporal", "norm")


def load_run_state(run_dir: str | Path) -> checkpoint.Checkpoint:
    """The newest checkpoint of ``run_dir`` that loads and holds an averaged model; ValueError naming it."""
    folder = Path(run_dir).expanduser()
    if not folder.is_dir():
        raise ValueError(f"run folder {folder} does not exist: pass the folder of a finished run")
    found = checkpoint.load_latest(folder)
    if found is None:
        raise ValueError(
            f"{folder} holds no {checkpoint.PREFIX}*/{checkpoint.STATE_FILE} that loads: pass the folder of "
            "a run that finished at least one averaging round"
        )
    if not found.state.params:
        raise ValueError(f"{found.folder} has no averaged model: pick a later checkpoint")
    return found


def _model_field(source: checkpoint.Checkpoint, name: str) -> Any:
    """A model field of the source run's config (None when the checkpoint kept no config)."""
    return (source.config or {}).get("model", {}).get(name)


def _uses_frozen_norm(params: Mapping[str, torch.Tensor]) -> bool:
    """Frozen BatchNorm keeps running statistics as state; GroupNorm has none."""
    return any(key.startswith("encoder.") and key.endswith("running_mean") for key in params)


def _encoder_norm(m: ModelConfig, frozen: bool) -> str:
    """The encoder's ``norm``: "batch" under ``model.norm="batchnorm"``, else "frozen" or "group"."""
    if m.norm == "batchnorm":
        return "batch"
    return "frozen" if frozen else "group"


def _build_sequence(
    m: ModelConfig, num_classes: int, in_channels: int, *, frozen: bool, pretrained: bool
) -> SequenceClassifier:
    """A per-sequence encoder (the factory's, else the video backbone) under a linear head."""
    if m.model_factory is not None:
        encoder = build_from_factory(m.model_factory, in_channels)
        return _logged(SequenceClassifier(num_classes, in_channels, encoder, name=m.model_factory))
    from raytrain_seq.models.video import VideoBackbone  # torchvision, only for its backbones

    encoder = VideoBackbone(m.backbone, in_channels, norm=_encoder_norm(m, frozen))
    stats = {"mean": KINETICS_MEAN, "std": KINETICS_STD} if pretrained and in_channels == 3 else {}
    return _logged(SequenceClassifier(num_classes, in_channels, encoder, name=m.backbone, **stats))


def _logged(model: SequenceClassifier) -> SequenceClassifier:
    logger.info(
        "SequenceClassifier encoder=%s in_channels=%d classes=%d: %d parameters", model.backbone,
        model.in_channels, model.num_classes, sum(p.numel() for p in model.parameters()),
    )  # fmt: skip
    return model


def _build(m: ModelConfig, num_classes: int, in_channels: int, *, frozen: bool, imagenet: bool) -> nn.Module:
    if m.model_factory is not None or m.backbone in VIDEO_ARCHS:
        return _build_sequence(m, num_classes, in_channels, frozen=frozen, pretrained=imagenet)
    options: dict[str, Any] = {}
    if m.backbone != "small" or m.norm == "batchnorm":
        options["encoder_options"] = {"norm": _encoder_norm(m, frozen)}
    if imagenet and in_channels == 3:
        options.update(mean=IMAGENET_MEAN, std=IMAGENET_STD)
    return build_model(
        num_classes,
        in_channels,
        width=m.width,
        depth=m.depth,
        hidden=m.hidden,
        temporal=m.temporal,
        backbone=m.backbone,
        **options,
    )


def _check_architecture(m: ModelConfig, source: checkpoint.Checkpoint, num_classes: int) -> None:
    where = f"--init-from {source.folder.parent}"
    for name in _ARCHITECTURE:
        theirs = _model_field(source, name)
        if theirs is not None and theirs != getattr(m, name):
            raise ValueError(
                f"{where}: that run has model.{name}={theirs!r}, this one {getattr(m, name)!r}: "
                f"pass --{name} {theirs} so the weights fit"
            )
    head = source.state.params.get("head.weight")
    if head is not None and head.shape[0] != num_classes:
        raise ValueError(
            f"{where}: its classifier has {head.shape[0]} classes but this run has {num_classes}: train on "
            "the same classes (same dataset and --num-classes) to start from it"
        )


def _first_conv(model: nn.Module) -> str | None:
    """The first conv's key (None: a factory's encoder, where the first 4-D or 5-D weight is taken)."""
    if isinstance(model, SequenceClassifier):
        from raytrain_seq.models.video import FIRST_CONV, VideoBackbone

        return f"encoder.net.{FIRST_CONV}" if isinstance(model.encoder, VideoBackbone) else None
    # The frame encoders are the small one and the ResNets (frame_encoder.FRAME_ENCODERS).
    return (
        "encoder.features.0.weight"
        if isinstance(model.encoder, SmallFrameEncoder)
        else "encoder.conv1.weight"
    )


def _initialise(model: nn.Module, source: checkpoint.Checkpoint) -> None:
    params, target = source.state.params, model.state_dict()
    key = _first_conv(model)
    if key is None:
        key = next((k for k, v in target.items() if k.endswith("weight") and v.dim() in (4, 5)), "")
    if key in params and params[key].shape[1] != target[key].shape[1]:
        from raytrain_seq.models.resnet import cross_modality_init

        # The classifier feeds [frames, differences] to its encoder, so the halves stay apart.
        state = cross_modality_init(target, params, key=key, groups=2 if model.motion else 1)
        logger.info(
            "model initialised from %s: %s cross-modality %d -> %d channels, %d other tensors copied",
            source.folder, key, params[key].shape[1], target[key].shape[1], len(state) - 1,
        )  # fmt: skip
    else:
        missing = sorted(set(target) ^ set(params))
        if missing:
            raise ValueError(
                f"--init-from {source.folder.parent}: key {missing[0]!r} is in only one of the two "
                "models: both need the same backbone, temporal module and sizes"
            )
        state = {k: params[k].to(dtype=v.dtype) for k, v in target.items()}
        logger.info("model initialised from %s: %d tensors copied", source.folder, len(state))
    model.load_state_dict(state, strict=True)


def build_model_for(model: ModelConfig, *, num_classes: int, in_channels: int) -> nn.Module:
    """The classifier ``model`` (a config's model section) describes, for ``num_classes`` classes and ``in_channels`` inputs.

    Starting weights: ``model.init_from`` (with cross-modality init when the channels differ), else
    ``model.weights`` (ImageNet, frozen BatchNorm), else the caller's seeded random initialisation.
    """
    m = model
    if m.init_from is not None:
        source = load_run_state(m.init_from)
        _check_architecture(m, source, num_classes)
        if m.weights is not None:
            logger.info("model.init_from %s is used; model.weights %s is not loaded", m.init_from, m.weights)
        imagenet = _model_field(source, "weights") is not None or m.weights is not None
        built = _build(
            m, num_classes, in_channels, frozen=_uses_frozen_norm(source.state.params), imagenet=imagenet
        )
        _initialise(built, source)
        return built
    built = _build(m, num_classes, in_channels, frozen=m.weights is not None, imagenet=m.weights is not None)
    if m.weights is not None:
        _load_weights(built, m.weights, in_channels)
    return built


def _load_weights(built: nn.Module, weights: str, in_channels: int) -> None:
    """``model.weights`` into the encoder: a Kinetics file into a video backbone, else an ImageNet one."""
    from raytrain_seq.models.resnet import load_imagenet_weights  # torchvision: pretrained backbones only
    from raytrain_seq.models.video import VideoBackbone, load_video_weights

    if isinstance(built.encoder, VideoBackbone):
        load_video_weights(built.encoder, weights)  # the stem sees in_channels: flow 2 -> TSN average
    else:
        # The encoder sees 2 * in_channels (frames + differences): RGB 6 -> tile, flow 4 -> TSN average.
        load_imagenet_weights(built.encoder, weights, conv1="tile" if in_channels == 3 else "average")


def model_from_state(
    m: ModelConfig, params: Mapping[str, torch.Tensor], *, num_classes: int, in_channels: int
) -> nn.Module:
    """A finished run's model: ``m`` (the run's model section) gives the architecture, ``params`` every tensor.

    Neither ``init_from`` nor ``weights`` is read (the params already hold the trained values); the
    norm follows the params and RGB frames get ImageNet statistics when the run was built with weights.
    """
    model = _build(
        m, num_classes, in_channels, frozen=_uses_frozen_norm(params), imagenet=m.weights is not None
    )
    model.load_state_dict(dict(params), strict=True)
    return model
