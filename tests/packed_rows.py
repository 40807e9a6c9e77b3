"""Block rows built by hand for the model tests: random uint8 sequences laid at chosen starts in blocks of
``t_max`` frames, the layout ``models/`` takes (frames, starts, lengths, labels, num_sequences)."""

from __future__ import annotations

import torch


def sequence(seed: int, length: int, *, channels: int = 3, hw: int = 8) -> torch.Tensor:
    """``length`` random frames ``[T, hw, hw, channels]`` (uint8), the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (length, hw, hw, channels), dtype=torch.uint8, generator=g)


def packed_batch(
    rows, t_max: int, *, max_sequences: int, garbage_seed: int | None = None, channels: int = 3, hw: int = 8
) -> dict[str, torch.Tensor]:
    """Block rows from rows of (start, frames, label) triples; padding frames zero, or random garbage
    from ``garbage_seed`` (a model must ignore them either way)."""
    b = len(rows)
    shape = (b, t_max, hw, hw, channels)
    if garbage_seed is None:
        frames = torch.zeros(shape, dtype=torch.uint8)
    else:
        g = torch.Generator().manual_seed(garbage_seed)
        frames = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    starts, lengths, labels = (torch.full((b, max_sequences), -1, dtype=torch.long) for _ in range(3))
    num = torch.zeros(b, dtype=torch.long)
    for i, row in enumerate(rows):
        for j, (start, seq, label) in enumerate(row):
            frames[i, start : start + len(seq)] = seq
            starts[i, j], lengths[i, j], labels[i, j] = start, len(seq), label
        num[i] = len(row)
    return {"frames": frames, "starts": starts, "lengths": lengths, "labels": labels, "num_sequences": num}


def logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's logits for every sequence slot of ``batch``."""
    return model(batch["frames"], batch["starts"], batch["lengths"], batch["num_sequences"])
