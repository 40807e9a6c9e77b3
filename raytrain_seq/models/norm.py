"""The encoders' normalisation layers: a GroupNorm that stays in autocast's half precision on CUDA, and
torchvision's frozen BatchNorm for inputs of any rank.

CUDA autocast runs ``group_norm`` in float32 whatever its input, so in a bf16 or fp16 network every
GroupNorm would widen the activation and the next convolution narrow it again, both copies kept for the
backward pass. ``GroupNorm`` here takes a half-precision CUDA input as it comes: each group's mean and
variance accumulate in float32 and the output is written in the input's dtype, the affine cast to it.
Everywhere else it is ``nn.GroupNorm`` exactly (same parameters, state_dict and bits). The measured
effect: docs/ARCHITECTURE.md, "Measurements behind the code".
``FrozenBatchNorm`` is ``torchvision.ops.FrozenBatchNorm2d`` (fixed statistics and affine, BatchNorm's
state_dict keys, a file's ``num_batches_tracked`` dropped on load) broadcast over any rank, so the video
backbones' ``[N, C, T, H, W]`` use it too, keeping the input's precision; written here so that this
module, which the small encoder uses, does not import torchvision (``models.backbones``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FrozenBatchNorm", "GroupNorm", "group_count"]

HALF = (torch.bfloat16, torch.float16)


class GroupNorm(nn.GroupNorm):
    """``nn.GroupNorm`` whose output keeps a half-precision CUDA input's dtype under autocast."""

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cuda" or x.dtype not in HALF or not torch.is_autocast_enabled("cuda"):
            return super().forward(x)
        weight = None if self.weight is None else self.weight.to(x.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        with torch.autocast("cuda", enabled=False):
            return F.group_norm(x, self.num_groups, weight, bias, self.eps)


class FrozenBatchNorm(nn.Module):
    """``y = (x - running_mean) / sqrt(running_var + eps) * weight + bias`` per channel (dim 1), any rank.

    Nothing is learned and each sample is normalised on its own, so a frame's or a clip's output never
    depends on the rest of its batch. Matches ``nn.BatchNorm2d``/``nn.BatchNorm3d`` in eval mode.
    """

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.num_features, self.eps = num_features, eps
        # Buffers, not parameters: BatchNorm's state_dict keys, and nothing for an optimizer to step.
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # A BatchNorm file's step counter has no place here (torchvision drops it too).
        state_dict.pop(prefix + "num_batches_tracked", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"

    def forward(self, x: Tensor) -> Tensor:
        # [C] -> [1, C, 1, ...] for x of rank 4 (frames) or 5 (clips).
        shape = (1, -1) + (1,) * (x.dim() - 2)
        scale = self.weight * torch.rsqrt(self.running_var + self.eps)
        shift = self.bias - self.running_mean * scale
        if x.is_floating_point():
            # In the input's precision: a bf16 activation times float32 statistics would promote to
            # float32, and the next convolution would cast it back (two passes and two copies kept).
            scale, shift = scale.to(x.dtype), shift.to(x.dtype)
        return x * scale.reshape(shape) + shift.reshape(shape)


def group_count(channels: int, most: int = 32) -> int:
    """The largest divisor of ``channels`` that is at most ``most``: GroupNorm's group count for layers
    whose widths are not multiples of 32 (R(2+1)D's middle planes: 45 -> 15, 230 -> 23, 144 -> 24)."""
    return next(g for g in range(min(most, channels), 0, -1) if channels % g == 0)
