"""GroupNorm that stays in autocast's half precision on CUDA: the encoders' normalisation layer.

CUDA autocast runs ``group_norm`` in float32 whatever its input (it is on that device's float32 list),
so in a bf16 or fp16 network every GroupNorm turns the convolution's half-precision output into float32,
and the next convolution casts it back: two extra passes over every activation, and both copies kept for
the backward pass. ``GroupNorm`` here takes a half-precision CUDA input as it comes instead: the kernel
accumulates each group's mean and variance in float32 and writes its output in the input's dtype, with
the affine weight and bias cast to it, as autocast does for a convolution's weights. Everywhere else
(float32, no autocast, or the CPU, whose autocast already keeps group_norm in the input's precision) it
is ``nn.GroupNorm`` exactly: same parameters, same state_dict, same bits. Measured on a GPU learner in
docs/ARCHITECTURE.md ("Measurements behind the code"). torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GroupNorm"]

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
