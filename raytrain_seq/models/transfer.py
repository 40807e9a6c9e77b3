"""Host-to-device copies inside a forward pass that do not stall the host, and the convolutions' layout.

The reset table of a batch of block rows stays on the host (``staging.MicroBatchStage``), so the models build
their gather indices, lengths and labels there and move them to the device during the forward pass. A
copy from pageable host memory to a GPU makes the host wait until the GPU has caught up with everything
queued before it; in the learner that wait cancels the overlap of micro-batch i + 1's staging with
micro-batch i's forward (docs/ARCHITECTURE.md, "Micro-batch streaming"). ``to_device`` copies such a
tensor through pinned memory with ``non_blocking=True`` instead: the host queues the copy and goes on.
The pinned block is PyTorch's caching host allocator's, kept until the copy has read it.

``channels_last`` puts a convolution's input into the channels-last layout on CUDA, where cuDNN's
tensor-core kernels for bf16 and fp16 read NHWC (NDHWC for 3-D) and would otherwise transpose every
activation on the way in and out. Only the input changes; the weights stay contiguous, as the flat
storage binds them. On the CPU the layout is left as it comes. Plain torch.
"""

from __future__ import annotations

import torch

__all__ = ["channels_last", "to_device"]


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``: itself when it is there already, a non-blocking copy from pinned memory
    when it goes from the host to a CUDA device, else ``tensor.to(device)``."""
    device = torch.device(device)
    if tensor.device == device:
        return tensor
    if tensor.device.type == "cpu" and device.type == "cuda":
        source = tensor if tensor.is_pinned() else tensor.pin_memory()
        return source.to(device, non_blocking=True)
    return tensor.to(device)


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """``x`` (``[N, C, H, W]`` or ``[N, C, T, H, W]``) in the channels-last layout when it is on CUDA
    (``torch.channels_last`` / ``torch.channels_last_3d``; same values and shape), else ``x`` itself."""
    if not x.is_cuda or x.dim() not in (4, 5):
        return x
    return x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
