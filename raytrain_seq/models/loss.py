"""Loss and prediction over BLoad block rows, in the (loss_sum, item_count) form micro-batching needs.

Algorithm: Micro Batch Streaming (Piao, Synn et al.) gets the full-batch gradient from micro-batches by
summing per-item losses and dividing once by the total item count. With BLoad blocks (Iftekhar, Ruschel
et al.) the item is a sequence, not a row: rows hold 0..S sequences, so a per-row mean would weight
sequences unequally and filler rows would count. ``sequence_loss`` therefore returns the cross-entropy
SUMMED over the real sequences of a micro-batch and their count.

Trade-off: none in accuracy (sum / count over any split equals the full-batch mean exactly); the caller
must divide by the count summed over all micro-batches, not per micro-batch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from raytrain_seq.models.block_index import sequence_labels
from raytrain_seq.models.transfer import to_device

logger = logging.getLogger(__name__)

__all__ = ["BLOCK_KEYS", "predict", "sequence_loss"]

BLOCK_KEYS = ("frames", "starts", "lengths", "labels", "num_sequences")


def _block_fields(batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    if not isinstance(batch, Mapping):
        raise TypeError(
            f"batch must be a dict of block-row tensors with keys {BLOCK_KEYS}, got {type(batch)}"
        )
    missing = [key for key in BLOCK_KEYS if key not in batch]
    if missing:
        raise ValueError(f"batch lacks {missing}: a block-row batch needs the keys {BLOCK_KEYS}")
    return tuple(batch[key] for key in BLOCK_KEYS)


def sequence_loss(model: nn.Module, micro_batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Cross-entropy summed over the micro-batch's real sequences, and how many there are.

    Rows with 3, 0 and 2 sequences give a sum of 5 per-sequence losses and count 5. A micro-batch of only
    filler rows gives a zero loss (still differentiable, so ``backward()`` is harmless) and count 0.
    Extra keys in ``micro_batch`` (ids, weights, ...) are ignored.
    """
    frames, starts, lengths, labels, num_sequences = _block_fields(micro_batch)
    logits = model(frames, starts, lengths, num_sequences)
    targets = to_device(sequence_labels(labels, num_sequences), logits.device)
    loss_sum = F.cross_entropy(logits, targets, reduction="sum")
    return loss_sum, int(targets.numel())


def predict(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[K, num_classes]`` and labels ``[K]`` of the real sequences, without autograd.

    Both are on the model's output device, in the same row-major (row, slot) order, so
    ``(logits.argmax(1) == labels).float().mean()`` is the per-sequence accuracy. The caller chooses
    train/eval mode: without dropout both give the same logits, except under ``model.norm="batchnorm"``,
    where train mode normalises by the batch (every caller scores in eval mode, the running statistics).
    """
    frames, starts, lengths, labels, num_sequences = _block_fields(batch)
    with torch.no_grad():
        logits = model(frames, starts, lengths, num_sequences)
    return logits, to_device(sequence_labels(labels, num_sequences), logits.device)
