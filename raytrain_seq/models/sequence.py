"""Classifier over BLoad block rows whose encoder sees each whole sequence at once: one feature vector each.

Algorithm (BLoad, Iftekhar, Ruschel et al.: blocks of whole sequences plus a reset table): from a batch
of block rows, gather only the frames of real sequences (``block_sequence_index``: padding frames and
filler rows are never touched), normalise them, and hand the encoder each sequence as its own clip
``[T, C, H, W]``; its feature vector ``[D]`` (pooled by the encoder) goes through one linear head. An encoder that defines
``forward_packed(x [N, C, H, W], lengths [K]) -> [K, D]`` gets every sequence in one call instead (the
sequences laid one after another, the layout ``TemporalClassifier`` passes its temporal module); it
must keep them apart itself (``models.video.VideoBackbone`` batches equal lengths). Either way a
sequence's logits equal (float64: to 1e-9) those of the same sequence alone in a block, at any offset,
with any neighbours and padding: the tests pin this for every video backbone.

The encoder is ``models.video.VideoBackbone`` or what a ``--model-factory`` returns (``models.hook``),
exposing ``out_dim``. Trade-off: one call per sequence length, for exact resets and no compute on padding.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from raytrain_seq.models.block_index import SequenceIndex, block_sequence_index
from raytrain_seq.models.frame_encoder import FrameNormalizer
from raytrain_seq.models.transfer import to_device

logger = logging.getLogger(__name__)

__all__ = ["SequenceClassifier", "encode_sequences", "real_frames"]


def real_frames(frames: torch.Tensor, index: SequenceIndex, device: torch.device) -> torch.Tensor:
    """The real frames of a batch of block rows, sequence after sequence, moved to ``device``.

    Gathered on the frames' device (padding never moves), then only real frames (uint8) travel.
    """
    flat = frames.reshape(-1, *frames.shape[2:])  # [B * t_max, H, W, C]
    return to_device(flat[to_device(index.frame_index, frames.device)], device)


def encode_sequences(encoder: nn.Module, x: torch.Tensor, lengths: torch.Tensor, name: str) -> torch.Tensor:
    """``[K, D]``: each sequence of ``x`` (``[N, C, H, W]``, sequences one after another) encoded alone.

    ``forward_packed(x, lengths)`` when the encoder has it, else one ``encoder(clip)`` per sequence
    (lengths ``[3, 2]``: rows 0-2, then rows 3-4). ValueError naming ``name`` when a feature is not
    ``[out_dim]``.
    """
    out_dim = encoder.out_dim
    if hasattr(encoder, "forward_packed"):
        features = encoder.forward_packed(x, lengths)
    else:
        features = torch.stack([encoder(clip) for clip in x.split(lengths.tolist())])
    expected = (int(lengths.numel()), out_dim)
    if tuple(features.shape) != expected:
        raise ValueError(
            f"{name}: the encoder gave features of shape {tuple(features.shape)} for {expected[0]} sequences, "
            f"expected {expected}: return one vector of out_dim={out_dim} values per sequence"
        )
    return features


class SequenceClassifier(nn.Module):
    """Per-sequence encoder -> linear head: ``forward(frames, starts, lengths, num_sequences)`` -> logits.

    Same call and output as ``TemporalClassifier``: ``frames`` uint8 ``[B, t_max, H, W, C]``, the reset
    table ``[B, S]`` / ``[B]`` padded with -1, logits ``[K, num_classes]`` in row-major (row, slot) order.
    ``mean``/``std``: the normaliser's statistics (``FrameNormalizer``; None: ``x / 255 - 0.5``).
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        encoder: nn.Module,
        *,
        name: str,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        out_dim = getattr(encoder, "out_dim", None)
        if isinstance(out_dim, bool) or not isinstance(out_dim, int) or out_dim < 1:
            raise ValueError(
                f"{name}: the encoder ({type(encoder).__name__}) has no positive int out_dim ({out_dim!r}): "
                "set self.out_dim = D, the size of the feature vector it returns per sequence"
            )
        self.num_classes, self.in_channels = num_classes, in_channels
        self.backbone, self.motion = name, False  # no frame differences: the encoder sees time itself
        self.normalizer = FrameNormalizer(in_channels, mean, std)
        self.encoder = encoder
        self.head = nn.Linear(out_dim, num_classes)

    def forward(
        self, frames: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, num_sequences: torch.Tensor
    ) -> torch.Tensor:
        index = block_sequence_index(frames.shape, starts, lengths, num_sequences)
        if index.count == 0:
            # Only filler rows: no logits, but a graph through the head so backward() still works.
            return self.head(self.head.weight.new_zeros(0, self.head.in_features))
        real = real_frames(frames, index, self.head.weight.device)
        x = self.normalizer(real).permute(0, 3, 1, 2).contiguous()  # [N, C, H, W]
        return self.head(encode_sequences(self.encoder, x, index.lengths, self.backbone))
