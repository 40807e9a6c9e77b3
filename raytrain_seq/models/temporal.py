"""Temporal modules with exact resets: each sequence of a BLoad block is its own entry, never a neighbour's.

BLoad keeps a reset table, the start of every sequence in a block. Here the reset is structural, not a
masked state: the classifier cuts the block at its starts into a padded ``[K, L_max, D]`` tensor (one
left-aligned row per sequence), and both modules treat the rows independently:
- ``"gru"``: a GRU over a PackedSequence: every sequence starts from the zero state and stops at its own
  length, so no state crosses a start and padded steps are never computed.
- ``"tcn"``: a causal stack of dilated Conv1d with residual ReLU blocks, left-padded with zeros as the
  sequence alone would be; outputs before ``length`` depend only on earlier steps of the same row.
Both give the output of the sequence run alone up to float rounding (tests pin float64). Trade-off: the
GRU is sequential in time, the TCN parallel with a finite receptive field, ``1 + (kernel_size - 1) *
(2**layers - 1)`` frames. The GRU runs at float32 under autocast (cuDNN would otherwise be handed fp16).
Costs: docs/ARCHITECTURE.md, "Measurements behind the code".
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from raytrain_seq.models.transfer import to_device

logger = logging.getLogger(__name__)

__all__ = ["TEMPORAL_MODULES", "CausalConvTemporal", "GRUTemporal", "build_temporal"]


class GRUTemporal(nn.Module):
    """GRU over a PackedSequence: ``x [K, L_max, D]``, ``lengths [K]`` -> ``[K, L_max, hidden]``.

    Outputs at padded steps (``t >= lengths[k]``) are zero; the caller masks them anyway.

    The recurrence runs at float32 (or the input's own precision, float64 in the tests) whatever the
    autocast around it: under CUDA autocast PyTorch casts a cuDNN RNN's input, state and weights to
    float16 even when the run asked for bfloat16, and the learner scales the loss only for fp16, so
    the encoder's gradients would come back through an unscaled float16 GRU and could underflow; the
    cast would also copy the weights out of their one chunk (``models.recurrent``) on every forward.
    With autocast off here and the weights at float32, cuDNN reads the flattened weights as they are.
    The output stays at that precision (a ``[K, L_max, hidden]`` tensor, small beside the encoder's).
    """

    def __init__(self, in_dim: int, hidden: int, *, layers: int = 1) -> None:
        super().__init__()
        self.gru = nn.GRU(in_dim, hidden, num_layers=layers, batch_first=True)
        self.out_dim = hidden

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        # Longest first, as pack_padded_sequence(enforce_sorted=True) wants; sorted here rather than by
        # torch (enforce_sorted=False), which moves its permutation to the device with a blocking copy.
        # The lengths stay on the host, where packing reads them.
        host_lengths = lengths.cpu()
        order = torch.argsort(host_lengths, descending=True, stable=True)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel())
        ordered = x.index_select(0, to_device(order, x.device)).to(dtype)
        packed = pack_padded_sequence(ordered, host_lengths[order], batch_first=True, enforce_sorted=True)
        with torch.autocast(x.device.type, enabled=False):
            out, _ = self.gru(packed)  # no h0 given: every sequence starts from zeros, the reset
        padded, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return padded.index_select(0, to_device(inverse, padded.device))  # back to sequence k in row k


class CausalConvTemporal(nn.Module):
    """Causal dilated Conv1d stack: ``x [K, L_max, D]`` -> ``[K, L_max, hidden]``, exact per sequence.

    Level ``i`` computes ``h <- h + relu(conv_i(left_zero_pad(h)))`` with dilation ``2**i``. With kernel 3
    and dilation 2, output step t reads steps t-4, t-2, t: the left pad of 4 zeros stands in for steps
    -4 and -2, which is the value a sequence run alone sees, so a neighbour's frames can never enter
    (there are none to the left of step 0 in a per-sequence row). Outputs at padded steps are garbage by
    design and must be masked by the caller.
    """

    def __init__(self, in_dim: int, hidden: int, *, layers: int = 3, kernel_size: int = 3) -> None:
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"kernel_size must be >= 1, got {kernel_size}: pass e.g. kernel_size=3")
        self.proj = nn.Linear(in_dim, hidden)
        self.convs = nn.ModuleList(
            nn.Conv1d(hidden, hidden, kernel_size, dilation=2**level) for level in range(layers)
        )
        self.out_dim = hidden
        # Each level adds (k - 1) * dilation past steps: k=3, 3 levels -> 1 + 2 * (1 + 2 + 4) = 15 frames.
        self.receptive_field = 1 + (kernel_size - 1) * (2**layers - 1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.proj(x).transpose(1, 2)  # [K, hidden, L_max]
        for conv in self.convs:
            left = conv.dilation[0] * (conv.kernel_size[0] - 1)
            h = h + F.relu(conv(F.pad(h, (left, 0))))  # zero pad on the left only: causal
        return h.transpose(1, 2)


def _build_gru(in_dim: int, hidden: int, *, layers: int | None = None, kernel_size: int = 3) -> nn.Module:
    del kernel_size  # a GRU has no kernel; accepted so one call signature builds either module
    return GRUTemporal(in_dim, hidden, layers=1 if layers is None else layers)


def _build_tcn(in_dim: int, hidden: int, *, layers: int | None = None, kernel_size: int = 3) -> nn.Module:
    return CausalConvTemporal(in_dim, hidden, layers=3 if layers is None else layers, kernel_size=kernel_size)


# name -> builder(in_dim, hidden, *, layers, kernel_size); every module maps ([K, L_max, D], lengths [K])
# to [K, L_max, out_dim] with row k depending only on the first lengths[k] steps of row k.
TEMPORAL_MODULES: dict[str, Callable[..., nn.Module]] = {"gru": _build_gru, "tcn": _build_tcn}


def build_temporal(
    name: str, in_dim: int, hidden: int, *, layers: int | None = None, kernel_size: int = 3
) -> nn.Module:
    """Build the temporal module ``name`` ("gru" or "tcn"); ``layers`` None -> 1 GRU layer / 3 TCN levels."""
    if name not in TEMPORAL_MODULES:
        raise ValueError(f"unknown temporal module {name!r}: choose one of {sorted(TEMPORAL_MODULES)}")
    for arg, value in (("in_dim", in_dim), ("hidden", hidden)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg} must be a positive int, got {value!r}")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise ValueError(f"temporal layers must be a positive int or None (the default), got {layers!r}")
    module = TEMPORAL_MODULES[name](in_dim, hidden, layers=layers, kernel_size=kernel_size)
    logger.debug("temporal module %s: in_dim=%d hidden=%d", name, in_dim, hidden)
    return module
