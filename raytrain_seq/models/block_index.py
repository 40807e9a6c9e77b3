"""Index arithmetic from a batch of BLoad block rows to its real sequences and their real frames.

Algorithm: a BLoad block (Iftekhar, Ruschel et al., "BLoad") concatenates whole sequences into ``t_max``
frames and records a reset table, the start of each sequence. A batch of ``B`` rows carries it as
``starts``, ``lengths``, ``labels`` ``[B, S]`` padded with -1 past ``num_sequences[b]``. This module turns
that into (a) the ``K`` real sequences in row-major (row, slot) order, the order of the model's logits,
and (b) the flat indices of their frames, so only real frames are ever gathered and encoded.

Trade-off: padding frames and filler rows cost nothing downstream (never gathered, never encoded), at the
price of one host sync per forward (the reset table is read on the CPU to size the gather); the table is
``B * S`` ints, negligible next to the frames.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

__all__ = ["SequenceIndex", "block_sequence_index", "sequence_labels"]


@dataclass(frozen=True)
class SequenceIndex:
    """The real sequences of a batch of block rows, all tensors on the CPU, int64.

    ``rows``, ``slots``, ``starts``, ``lengths``: ``[K]``, sequence k is slot ``slots[k]`` of row ``rows[k]``.
    ``frame_index``: ``[sum(lengths)]`` flat indices into ``frames.reshape(B * t_max, H, W, C)``, sequence by
    sequence, each in time order. ``step_mask``: ``[K, L_max]`` bool, True at the real steps of each
    sequence in a left-aligned per-sequence layout.
    """

    rows: torch.Tensor
    slots: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor
    frame_index: torch.Tensor
    step_mask: torch.Tensor

    @property
    def count(self) -> int:
        return int(self.rows.numel())


def _int_table(name: str, value: object, shape: tuple[int, ...]) -> torch.Tensor:
    t = torch.as_tensor(value).detach().cpu()
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers (int64), got {t.dtype}: cast it with .long()")
    if tuple(t.shape) != shape:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}, expected {shape}: stack block rows on a first dim B "
            f"(a single row needs a leading batch dim of 1)"
        )
    return t.long()


def _real_slots(num_sequences: object, batch: int, max_sequences: int) -> torch.Tensor:
    """``[B, S]`` bool, True for slots ``j < num_sequences[b]``; validates ``num_sequences``."""
    num = _int_table("num_sequences", num_sequences, (batch,))
    if bool(((num < 0) | (num > max_sequences)).any()):
        raise ValueError(
            f"num_sequences must lie in [0, max_sequences={max_sequences}], got {num.tolist()}: it counts "
            f"the real (non -1) slots of each row"
        )
    return torch.arange(max_sequences)[None, :] < num[:, None]


def block_sequence_index(
    frames_shape: torch.Size | tuple[int, ...], starts: object, lengths: object, num_sequences: object
) -> SequenceIndex:
    """Validate a batch's reset table and locate its real sequences and frames.

    Worked example, ``t_max = 100``, two rows, ``S = 3`` slots::

        row 0: lengths [37, 24, 20]  starts [0, 37, 61]  num_sequences 3   (frames 81..99 are padding)
        row 1: lengths [50, -1, -1]  starts [0, -1, -1]  num_sequences 1

    Real (row, slot) pairs in row-major order: (0,0) (0,1) (0,2) (1,0), so K = 4 and logits row 2 is row
    0's slot 2. Sequence k's frame i sits at flat index ``rows[k] * t_max + starts[k] + i``: (0,1) covers
    37..60 and (1,0) covers 100..149, giving ``frame_index`` = 0..36, 37..60, 61..80, 100..149 (131
    frames; the 19 + 50 padding frames are never touched). ``step_mask`` is ``[4, 50]`` with row k True
    on its first ``lengths[k]`` steps (37, 24, 20, 50).
    """
    if len(frames_shape) != 5:
        raise ValueError(
            f"frames must be [B, t_max, H, W, C], got shape {tuple(frames_shape)}: stack block rows on a "
            f"first dim (frames[None] for a single row)"
        )
    batch, t_max = int(frames_shape[0]), int(frames_shape[1])
    starts_t = torch.as_tensor(starts)
    if starts_t.dim() != 2 or starts_t.shape[0] != batch:
        raise ValueError(f"starts must be [B={batch}, max_sequences], got shape {tuple(starts_t.shape)}")
    shape = (batch, int(starts_t.shape[1]))
    starts_t = _int_table("starts", starts_t, shape)
    lengths_t = _int_table("lengths", lengths, shape)
    real = _real_slots(num_sequences, *shape)

    rows, slots = real.nonzero(as_tuple=True)  # row-major: (0,0) (0,1) (0,2) (1,0) in the example
    seq_starts, seq_lengths = starts_t[rows, slots], lengths_t[rows, slots]
    bad = (seq_lengths < 1) | (seq_starts < 0) | (seq_starts + seq_lengths > t_max)
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"row {int(rows[k])} slot {int(slots[k])}: start {int(seq_starts[k])} and length "
            f"{int(seq_lengths[k])} do not fit in t_max={t_max} frames; a real slot needs length >= 1 and "
            f"0 <= start <= t_max - length (or lower num_sequences so the slot counts as padding)"
        )

    max_len = int(seq_lengths.max()) if rows.numel() else 0
    steps = torch.arange(max_len)
    step_mask = steps[None, :] < seq_lengths[:, None]  # [K, L_max]
    # Flat index of step i of sequence k: rows[k] * t_max + starts[k] + i (row 1, start 0 -> 100 + i).
    flat = (rows * t_max + seq_starts)[:, None] + steps[None, :]
    return SequenceIndex(
        rows=rows,
        slots=slots,
        starts=seq_starts,
        lengths=seq_lengths,
        frame_index=flat[step_mask],  # boolean indexing is row-major: sequence by sequence, time order
        step_mask=step_mask,
    )


def sequence_labels(labels: torch.Tensor, num_sequences: torch.Tensor) -> torch.Tensor:
    """Labels of the real sequences, ``[K]`` int64, in the model's logits order (row-major (row, slot)).

    In the example of ``block_sequence_index``, labels ``[[4, 9, 1], [7, -1, -1]]`` with num_sequences
    ``[3, 1]`` give ``[4, 9, 1, 7]``. Returned on ``labels``' device. A real slot labelled < 0 raises.
    """
    labels_t = torch.as_tensor(labels)
    if labels_t.dim() != 2:
        raise ValueError(f"labels must be [B, max_sequences], got shape {tuple(labels_t.shape)}")
    if labels_t.is_floating_point() or labels_t.dtype == torch.bool:
        raise TypeError(
            f"labels must hold integer class ids (int64), got {labels_t.dtype}: cast with .long()"
        )
    real = _real_slots(num_sequences, *labels_t.shape).to(labels_t.device)
    out = labels_t[real].long()
    if bool((out < 0).any()):
        raise ValueError(
            "a real slot (j < num_sequences) has label < 0; only padding slots may hold -1: fix the "
            "labels or num_sequences of the block rows"
        )
    return out
