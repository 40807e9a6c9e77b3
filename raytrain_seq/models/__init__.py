"""Temporal classifiers over BLoad block rows (Iftekhar, Ruschel et al.), with exact resets at every start:
``build_model(num_classes, ...)`` -> ``TemporalClassifier``; ``model(frames, starts, lengths,
num_sequences)`` -> logits ``[K, num_classes]`` for the K real sequences in row-major (row, slot) order;
``sequence_labels`` gives the matching targets; ``sequence_loss`` / ``predict`` take a block-row dict.
Backbones register in ``FRAME_ENCODERS`` ("small", "resnet18", "resnet50", "resnet152"; ImageNet files
load with ``load_imagenet_weights``, RGB -> flow starts with ``cross_modality_init``), temporal modules in
``TEMPORAL_MODULES``. Per-sequence encoders (a whole sequence in, one feature vector out) sit under a
``SequenceClassifier``: torchvision's video ResNets (``VideoBackbone``, ``VIDEO_ARCHS``; Kinetics files
load with ``load_video_weights``) and the module a ``--model-factory`` names (``build_from_factory``).
torch and torchvision only; importing this package builds nothing and imports no torchvision: the names
of ``models.resnet`` and ``models.video`` load their module when first read (``models.backbones``).
"""

from __future__ import annotations

import importlib
from typing import Any

from raytrain_seq.models.backbones import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    KINETICS_MEAN,
    KINETICS_STD,
    VIDEO_ARCHS,
)
from raytrain_seq.models.block_index import SequenceIndex, block_sequence_index, sequence_labels
from raytrain_seq.models.classifier import TemporalClassifier, build_model
from raytrain_seq.models.frame_encoder import (
    FRAME_ENCODERS,
    FrameNormalizer,
    SmallFrameEncoder,
    build_frame_encoder,
)
from raytrain_seq.models.hook import build_from_factory, resolve_factory
from raytrain_seq.models.loss import BLOCK_KEYS, predict, sequence_loss
from raytrain_seq.models.norm import FrozenBatchNorm, GroupNorm
from raytrain_seq.models.recurrent import compact_recurrent, is_compact, recurrent_keys
from raytrain_seq.models.sequence import SequenceClassifier
from raytrain_seq.models.temporal import (
    TEMPORAL_MODULES,
    CausalConvTemporal,
    GRUTemporal,
    build_temporal,
)
from raytrain_seq.models.weights import cross_modality_weight, load_backbone_weights

__all__ = [
    "BLOCK_KEYS",
    "FRAME_ENCODERS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "KINETICS_MEAN",
    "KINETICS_STD",
    "TEMPORAL_MODULES",
    "VIDEO_ARCHS",
    "CausalConvTemporal",
    "FrameNormalizer",
    "FrozenBatchNorm",
    "FrozenBatchNorm2d",
    "GRUTemporal",
    "GroupNorm",
    "ResNetEncoder",
    "SequenceClassifier",
    "SequenceIndex",
    "SmallFrameEncoder",
    "TemporalClassifier",
    "VideoBackbone",
    "block_sequence_index",
    "build_frame_encoder",
    "build_from_factory",
    "build_model",
    "build_resnet",
    "build_temporal",
    "compact_recurrent",
    "cross_modality_init",
    "cross_modality_weight",
    "is_compact",
    "load_backbone_weights",
    "load_imagenet_weights",
    "load_video_weights",
    "predict",
    "recurrent_keys",
    "resolve_factory",
    "sequence_labels",
    "sequence_loss",
]

# name -> the module that holds it, imported on first use (it imports torchvision).
_LAZY = {
    **dict.fromkeys(
        (
            "FrozenBatchNorm2d",
            "ResNetEncoder",
            "build_resnet",
            "cross_modality_init",
            "load_imagenet_weights",
        ),
        "raytrain_seq.models.resnet",
    ),
    **dict.fromkeys(("VideoBackbone", "load_video_weights"), "raytrain_seq.models.video"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
