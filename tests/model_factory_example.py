"""A --model-factory target for the tests: ``model_factory_example:build`` (imported by name, as a user's
module would be). A per-sequence encoder: a 3-D conv over the whole clip, GroupNorm, a mean over time and
space; ``out_dim`` its feature size. ``build_without_channels`` takes no argument (RGB only)."""

from __future__ import annotations

import torch
from torch import nn


class ClipEncoder(nn.Module):
    def __init__(self, in_channels: int = 3, width: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv3d(in_channels, width, kernel_size=3, padding=1)
        self.norm = nn.GroupNorm(4, width)
        self.out_dim = width

    def forward(self, frames: torch.Tensor) -> torch.Tensor:  # [T, C, H, W] -> [width]
        clip = frames.transpose(0, 1)[None]  # [1, C, T, H, W]
        return torch.relu(self.norm(self.conv(clip))).mean(dim=(2, 3, 4))[0]


def build(in_channels: int = 3) -> nn.Module:
    return ClipEncoder(in_channels)


def build_without_channels() -> nn.Module:
    return ClipEncoder(3, width=4)


def build_no_out_dim(in_channels: int = 3) -> nn.Module:
    return nn.Conv3d(in_channels, 2, 1)


NOT_CALLABLE = 3
