"""The run's model from its config: ``build_model_for(config, num_classes=..., in_channels=...)``.

One place turns ``ModelConfig`` into a ``TemporalClassifier`` so every process (learners, the fusion
evaluator, benchmarks) builds the same network for the same config. The class count and input channels
come from the data (the feed's ``model_spec()``: a real dataset knows its classes only after its split
files are read; the flow stream has 2 channels per frame), not from the config alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raytrain_seq.models.classifier import TemporalClassifier, build_model

if TYPE_CHECKING:
    from raytrain_seq.config import Config

__all__ = ["build_model_for"]


def build_model_for(config: Config, *, num_classes: int, in_channels: int) -> TemporalClassifier:
    """The classifier ``config.model`` describes, for ``num_classes`` classes and ``in_channels`` inputs."""
    m = config.model
    return build_model(
        num_classes,
        in_channels,
        width=m.width,
        depth=m.depth,
        hidden=m.hidden,
        temporal=m.temporal,
        backbone=m.backbone,
    )
