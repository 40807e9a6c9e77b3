"""Temporal classifier over BLoad block rows: one logit vector per real sequence, exact resets.

Algorithm (BLoad, Iftekhar, Ruschel et al.: blocks of whole sequences plus a reset table): from a batch
of block rows, gather only the frames of real sequences (padding frames and filler rows are skipped),
encode them in one batched CNN call, cut the features at the starts into a left-aligned
``[K, L_max, D]`` tensor, run the temporal module ("gru" or "tcn") with every sequence as its own row,
mean-pool each sequence over its own steps only, and apply a linear head. A sequence's logits therefore
equal (float64: to 1e-9) the logits of the same sequence alone in a block, at any offset, with any
neighbours and any padding content: the tests pin this.

Trade-off: the model at width 16, depth 4, hidden 128 and 101 classes has 209,781 parameters with the
GRU and 275,061 with the TCN, and the frame encoder takes most of a forward+backward (timings: docs/ARCHITECTURE.md, "Measurements behind the code"). Padding costs no compute because it is never encoded, where a model that reset by masking a
full ``[B, t_max]`` scan would spend CNN time on every padding frame; the price is one host sync per
forward to size the gather.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from raytrain_seq.models.block_index import block_sequence_index
from raytrain_seq.models.frame_encoder import FrameNormalizer, build_frame_encoder
from raytrain_seq.models.temporal import build_temporal
from raytrain_seq.models.transfer import to_device

logger = logging.getLogger(__name__)

__all__ = ["TemporalClassifier", "build_model"]


class TemporalClassifier(nn.Module):
    """Frame CNN -> per-sequence temporal module -> masked mean over time -> linear head.

    ``forward(frames, starts, lengths, num_sequences)`` takes a batch of block rows (``frames`` uint8
    ``[B, t_max, H, W, C]``, the other three int64 ``[B, S]`` / ``[B]`` padded with -1) and returns logits
    ``[K, num_classes]``, K = ``num_sequences.sum()``, in row-major (row, slot) order: with num_sequences
    ``[3, 0, 2]`` logits rows 0-2 are row 0's slots 0-2, row 1 (a filler) adds none, rows 3-4 are row 2's
    slots 0-1. ``sequence_labels(labels, num_sequences)`` returns the matching targets.
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: int = 3,
        width: int = 16,
        depth: int = 4,
        hidden: int = 128,
        temporal: str = "gru",
        backbone: str = "small",
        *,
        temporal_layers: int | None = None,
        kernel_size: int = 3,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        motion: bool = True,
        segments: int = 2,
        encoder_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.backbone, self.temporal_name = backbone, temporal
        self.normalizer = FrameNormalizer(in_channels, mean, std)
        self.motion = bool(motion)
        # Frame differences are near zero except at moving edges, so at the first convolution they are
        # drowned by the frames themselves; a fixed gain of 4 puts them on a comparable scale. In one
        # single-process run on the synthetic set (1000 videos; an experiment, not a bench/ script) the
        # model left chance after the first epoch with the gain and only after the third without it.
        self.motion_gain = 4.0
        encoder_channels = 2 * in_channels if self.motion else in_channels
        # encoder_options: the ResNets' ``norm`` ("frozen" to hold ImageNet statistics, "group" from
        # scratch) and ``weights``; see ``build_frame_encoder``.
        self.encoder = build_frame_encoder(
            backbone, encoder_channels, width=width, depth=depth, **dict(encoder_options or {})
        )
        self.temporal = build_temporal(
            temporal, self.encoder.out_dim, hidden, layers=temporal_layers, kernel_size=kernel_size
        )
        if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
            raise ValueError(f"segments must be an int >= 1, got {segments!r}: use 1 (plain mean) or 2")
        self.segments = segments
        self.head = nn.Linear(self.temporal.out_dim * segments, num_classes)

    def forward(
        self,
        frames: torch.Tensor,
        starts: torch.Tensor,
        lengths: torch.Tensor,
        num_sequences: torch.Tensor,
    ) -> torch.Tensor:
        index = block_sequence_index(frames.shape, starts, lengths, num_sequences)
        if index.count == 0:
            # Only filler rows: no logits, but still a graph through the head so a caller's
            # loss.backward() works (it leaves zero gradient on the head, none elsewhere).
            return self.head(self.head.weight.new_zeros(0, self.head.in_features))

        device = self.head.weight.device
        # Gather on the frames' device, then move only real frames (uint8) to the model's device.
        flat = frames.reshape(-1, *frames.shape[2:])  # [B * t_max, H, W, C]
        real = to_device(flat[to_device(index.frame_index, frames.device)], device)
        x = self.normalizer(real).permute(0, 3, 1, 2).contiguous()  # [N, C, H, W]
        if self.motion:
            x = torch.cat([x, self.motion_gain * _reset_difference(x, index.lengths)], dim=1)
        features = self.encoder(x)  # [N, D], one batched call for every real frame

        # Left-aligned per-sequence layout [K, L_max, D]: frame_index is sequence-major, so splitting the
        # N features by lengths (e.g. 37, 24, 20, 50) recovers the sequences in logits order.
        per_sequence = features.split(index.lengths.tolist())
        padded = pad_sequence(per_sequence, batch_first=True)
        out = self.temporal(padded, index.lengths)  # [K, L_max, hidden]

        # Mean over each sequence's own steps; torch.where (not a product) so garbage at padded steps
        # can never leak, even if it were inf or nan.
        return self.head(_segment_pool(out, to_device(index.lengths, device), self.segments))


def _segment_pool(out: torch.Tensor, lengths: torch.Tensor, segments: int) -> torch.Tensor:
    """Mean of each sequence's steps within each of ``segments`` equal time segments, concatenated.

    Step t of a sequence of length L falls in segment ``floor(t * segments / L)``: L=5, 2 segments ->
    steps 0-2 in segment 0 and 3-4 in segment 1. Keeping the segments apart (TSN-style segment pooling)
    lets the head read the ORDER of what happened, which a single mean over time discards; a segment
    with no steps (L < segments) pools to zeros. Padded steps (t >= L) belong to no segment, so their
    values, whatever they are, never leak (``torch.where``, not a product, so even inf or nan cannot).
    """
    k, l_max, _ = out.shape
    steps = torch.arange(l_max, device=out.device)[None, :].expand(k, l_max)
    which = torch.div(steps * segments, lengths[:, None], rounding_mode="floor")  # [K, L_max]
    pooled = []
    for segment in range(segments):
        mask = (which == segment) & (steps < lengths[:, None])
        total = torch.where(mask[..., None], out, torch.zeros((), dtype=out.dtype, device=out.device)).sum(1)
        count = mask.sum(1, keepdim=True).clamp(min=1).to(out.dtype)
        pooled.append(total / count)
    return torch.cat(pooled, dim=1)


def _reset_difference(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Frame-to-frame difference ``x[t] - x[t-1]`` inside each sequence, zero at every sequence start.

    ``x`` holds the real frames sequence after sequence (the gather order), so the previous frame is the
    previous row except at a start. Lengths ``[3, 2]``: rows 0-2 and 3-4; differences at rows 1, 2 and 4;
    rows 0 and 3 (the starts ``cumsum - lengths = [0, 3]``) get zeros, so no difference ever spans two
    sequences. This is the cheap motion cue of TSN's "RGB difference" input, made reset-exact.
    """
    diff = torch.zeros_like(x)
    diff[1:] = x[1:] - x[:-1]
    first = torch.cumsum(lengths, 0) - lengths
    diff[to_device(first, x.device)] = 0
    return diff


def build_model(num_classes: int, *args: Any, **kwargs: Any) -> TemporalClassifier:
    """Build a ``TemporalClassifier`` (same arguments) and log its parameter count."""
    model = TemporalClassifier(num_classes, *args, **kwargs)
    params = sum(p.numel() for p in model.parameters())
    logger.info(
        "TemporalClassifier backbone=%s temporal=%s in_channels=%d classes=%d: %d parameters",
        model.backbone,
        model.temporal_name,
        model.in_channels,
        num_classes,
        params,
    )
    return model
