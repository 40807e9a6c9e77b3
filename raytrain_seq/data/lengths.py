"""Sequence-length lists: the real UCF101 split-1 frame counts and the temporal stride.

The packer, the refurbish schedule and the synthetic data set plan from lengths alone (no pixels), so
the lengths must be the real ones: UCF101 split 1 has 9,537 training and 3,783 test videos of 29 to
1,776 extracted frames (median 168). The lists ship inside the package
(``raytrain_seq/data/ucf101_split1_{train,test}_lengths.txt``, one ``<num_frames> <label>`` line per
video, ``#`` comments) and are read through ``importlib.resources``, so an installed wheel works too.

A temporal stride ``s`` keeps frames ``0, s, 2s, ...``, i.e. ``ceil(n / s)`` of ``n`` frames: the
BLoad paper trains on strided clips, and the stride is what turns 168 frames into a 21-step sequence.
"""

from __future__ import annotations

import logging
import os
from importlib import resources

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["load_length_list", "parse_length_text", "strided", "ucf101_lengths"]

_SPLITS = ("train", "test")


def parse_length_text(text: str, source: str = "<text>") -> tuple[np.ndarray, np.ndarray]:
    """Parse ``<num_frames> <label>`` lines (``#`` comments and blank lines skipped).

    ``source`` only names the origin in error messages. Returns ``(lengths, labels)`` as int64 arrays
    in file order. Raises ValueError naming ``source:line`` for a malformed line, a length < 1, a
    label < 0, or a list with no entries.
    """
    lengths: list[int] = []
    labels: list[int] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(
                f"{source}:{lineno}: expected two integers '<num_frames> <label>', got {line!r}; "
                "fix the line or comment it out with '#'"
            )
        try:
            length, label = int(fields[0]), int(fields[1])
        except ValueError:
            raise ValueError(
                f"{source}:{lineno}: '<num_frames> <label>' must be integers, got {line!r}; "
                "fix the line or comment it out with '#'"
            ) from None
        if length < 1:
            raise ValueError(f"{source}:{lineno}: num_frames must be >= 1, got {length}; fix the line")
        if label < 0:
            raise ValueError(f"{source}:{lineno}: label must be >= 0, got {label}; fix the line")
        lengths.append(length)
        labels.append(label)
    if not lengths:
        raise ValueError(f"{source}: no '<num_frames> <label>' lines found; is this the right file?")
    return np.asarray(lengths, dtype=np.int64), np.asarray(labels, dtype=np.int64)


def load_length_list(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read a length list file; returns ``(lengths, labels)`` int64 arrays in file order.

    Raises FileNotFoundError for a missing file and ValueError naming the file and line for bad content.
    """
    path = os.fspath(path)
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return parse_length_text(text, source=path)


def ucf101_lengths(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """The packaged UCF101 split-1 list: ``(lengths, labels)``; 9,537 train or 3,783 test videos."""
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
    name = f"ucf101_split1_{split}_lengths.txt"
    text = resources.files("raytrain_seq.data").joinpath(name).read_text(encoding="utf-8")
    return parse_length_text(text, source=f"raytrain_seq/data/{name}")


def strided(lengths: np.ndarray | list[int], stride: int) -> np.ndarray:
    """Lengths after keeping every ``stride``-th frame: ``ceil(n / stride)`` as int64.

    Example: lengths ``[37, 24, 8, 1]`` with stride 8 keep frames ``0, 8, 16, 24, 32`` of the first
    video, so the result is ``[5, 3, 1, 1]``.
    """
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)):
        raise TypeError(f"stride must be an int >= 1, got {stride!r}")
    if stride < 1:
        raise ValueError(f"stride must be >= 1 (1 keeps every frame), got {stride}")
    arr = np.asarray(lengths)
    if arr.ndim == 1 and arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"lengths must be a 1-D sequence of ints, got shape {arr.shape} dtype {arr.dtype}")
    if arr.size and int(arr.min()) < 1:
        raise ValueError(
            f"lengths must all be >= 1, got minimum {int(arr.min())}; drop empty sequences first"
        )
    arr = arr.astype(np.int64)
    # A stride past the longest video keeps one frame of each, as the longest length does: clamping to it
    # keeps the int64 arithmetic from overflowing (stride 2**64 on [37, 8] -> stride 37 -> [1, 1]).
    stride = min(int(stride), int(arr.max())) if arr.size else int(stride)
    return (arr + stride - 1) // stride
