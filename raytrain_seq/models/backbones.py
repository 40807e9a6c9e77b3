"""The backbones' names and input statistics, without torchvision.

``model.backbone`` names a frame encoder ("small" or a ResNet) or a video backbone. The builders that need
torchvision (``models.resnet``, ``models.video``) are imported only when one of theirs is built or named
by attribute (``models.__init__``), so a process that trains the small encoder never imports torchvision:
its import costs seconds of CPU on every start-up, and a replacement learner's first step waits for it
(docs/LOG.md, the entry of issue 53's start-up work). The registries' names are held equal to these by
``tests/test_models.py``.
"""

from __future__ import annotations

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "KINETICS_MEAN", "KINETICS_STD", "RESNET_NAMES", "VIDEO_ARCHS"]

RESNET_NAMES: tuple[str, ...] = ("resnet18", "resnet50", "resnet152")
"""The ResNet frame encoders (``models.resnet.RESNET_ARCHS``)."""
VIDEO_ARCHS: tuple[str, ...] = ("r2plus1d_18", "r3d_18", "mc3_18")
"""torchvision's video ResNets (``models.video``)."""

# torchvision's ImageNet input statistics (RGB, images in [0, 1]); pass them to FrameNormalizer with weights.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# The input statistics torchvision's Kinetics-400 video weights were trained with (RGB in [0, 1]).
KINETICS_MEAN = (0.43216, 0.394666, 0.37645)
KINETICS_STD = (0.22803, 0.22145, 0.216989)
