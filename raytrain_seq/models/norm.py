"""The encoders' normalisation layers: a GroupNorm that stays in autocast's half precision on CUDA, and
torchvision's frozen BatchNorm for inputs of any rank.

CUDA autocast runs ``group_norm`` in float32 whatever its input (it is on that device's float32 list),
so in a bf16 or fp16 network every GroupNorm turns the convolution's half-precision output into float32,
and the next convolution casts it back: two extra passes over every activation, and both copies kept for
the backward pass. ``GroupNorm`` here takes a half-precision CUDA input as it comes instead: the kernel
accumulates each group's mean and variance in float32 and writes its output in the input's dtype, with
the affine weight and bias cast to it, as autocast does for a convolution's weights. Everywhere else
(float32, no autocast, or the CPU, whose autocast already keeps group_norm in the input's precision) it
is ``nn.GroupNorm`` exactly: same parameters, same state_dict, same bits. Measured on a GPU learner in
docs/ARCHITECTURE.md ("Measurements behind the code").

``FrozenBatchNorm`` is ``torchvision.ops.FrozenBatchNorm2d`` (fixed statistics and affine, all four
buffers with BatchNorm's state_dict keys, a file's ``num_batches_tracked`` dropped on load) made to
broadcast over any rank, so the video backbones' ``[N, C, T, H, W]`` activations use it too, and keep the
input's precision (bf16 in, bf16 out under autocast: the statistics are cast to it, as autocast casts a
convolution's weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d as TorchvisionFrozenBatchNorm

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


class FrozenBatchNorm(TorchvisionFrozenBatchNorm):
    """``y = (x - running_mean) / sqrt(running_var + eps) * weight + bias`` per channel (dim 1), any rank.

    Nothing is learned and each sample is normalised on its own, so a frame's or a clip's output never
    depends on the rest of its batch. Matches ``nn.BatchNorm2d``/``nn.BatchNorm3d`` in eval mode.
    """

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__(num_features, eps)
        self.num_features = num_features

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
