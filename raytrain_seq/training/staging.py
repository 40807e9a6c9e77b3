"""How a learner's block rows reach its device: collated on the host, then staged micro-batch by micro-batch.

A mini-batch of B block rows (``frames [B, t_max, H, W, C]`` uint8 plus the reset tables and, for
training rows, each sequence's crop draws) is collated into host tensors (``collate_rows``,
``host_rows``: pinned on CUDA), for the next step while this one trains on CUDA (``RowPrefetcher``).
``microbatch.accumulate`` then hands each micro-batch to ``MicroBatchStage``, which copies its frames to
the device and crops and flips them there (``augment.final_augment_batch``); the reset table stays on the
host. Contract: the device holds O(micro-batch) of input whatever B is, and the final frames are the
same as ``stage_rows``'s, the whole mini-batch staged at once. Plain torch and numpy: no ray.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raytrain_seq.algorithms.augment import final_augment_batch

__all__ = [
    "CROP_DRAWS", "MicroBatchStage", "RowPrefetcher", "Staged", "collate_rows", "collate_stream", "host_rows",
    "stage_rows",
]  # fmt: skip


def collate_rows(
    rows: Sequence[Mapping[str, np.ndarray]] | Mapping[str, np.ndarray],
) -> dict[str, torch.Tensor]:
    """Stack block rows (dicts of numpy arrays) into one dict of CPU tensors, first dim = rows.

    A dict of already-batched arrays (what Ray Data's ``iter_batches`` yields) is converted without a
    copy; a list of single rows is stacked. Keys other than numeric arrays (e.g. string ids) are dropped
    because the model never sees them.
    """
    if isinstance(rows, Mapping):
        batched = rows
    else:
        if not rows:
            raise ValueError("collate_rows got no rows: a mini-batch needs at least one block row")
        batched = {key: np.stack([np.asarray(row[key]) for row in rows]) for key in rows[0]}
    out = {}
    for key, value in batched.items():
        array = np.asarray(value)
        if array.dtype.kind in "biuf":
            out[key] = torch.from_numpy(np.ascontiguousarray(array))
    return out


def collate_stream(stream: Any, rows: int = 16) -> list[dict[str, torch.Tensor]]:
    """Every row of an evaluation ``stream`` (``take(n)`` -> a dict of row arrays, None at its end) as CPU
    tensors in batches of ``rows``, kept for scoring again and again. Crop draws are dropped: scoring rows
    are centre-cropped already, or cut into views by ``evaluate``."""
    batches = []
    while (part := stream.take(rows)) is not None:
        batches.append({k: v for k, v in collate_rows(part).items() if k not in ("tops", "lefts", "flips")})
    return batches


# The crop and flip draws of each sequence (training rows): read on the host by the crop, never sent on.
CROP_DRAWS = ("tops", "lefts", "flips")


def host_rows(rows: Mapping[str, np.ndarray], *, pin: bool) -> dict[str, torch.Tensor]:
    """Block rows collated into host tensors, in pinned memory when ``pin`` (a CUDA learner: its
    micro-batches are then copied to the device with ``non_blocking=True`` straight from here)."""
    batch = collate_rows(rows)
    if pin:
        batch = {key: value.pin_memory() for key, value in batch.items()}
    return batch


class MicroBatchStage:
    """How a micro-batch of block rows reaches the learner's device (``microbatch.accumulate``'s stage).

    ``frames`` is copied to ``device`` (from pinned memory, non-blocking, on CUDA); rows that carry each
    sequence's seeded crop draws (``tops``, ``lefts``, ``flips``: the learner's training rows, uncropped
    at the cache size) are cropped and flipped there (``augment.final_augment_batch``), so only the
    micro-batch's uncropped frames ever reach the device, and only for as long as the crop takes. The
    reset table (``starts``, ``lengths``, ``labels``, ``num_sequences``) stays on the host, where the
    model and the crop read it without a device synchronisation.
    """

    def __init__(self, device: torch.device | str | None, *, crop: int, flow: bool) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.crop, self.flow = crop, flow

    def __call__(self, part: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        part = dict(part)
        draws = {key: part.pop(key) for key in CROP_DRAWS if key in part}
        frames = part["frames"]
        if self.device.type == "cuda" and frames.device.type == "cpu":
            if not frames.is_pinned():  # a mini-batch topped up after B grew (torch.cat): not pinned
                frames = frames.pin_memory()
            frames = frames.to(self.device, non_blocking=True)
        elif frames.device != self.device:
            frames = frames.to(self.device)
        if draws:
            layout = {key: part[key] for key in ("starts", "lengths")}
            frames = final_augment_batch(frames, crop=self.crop, flow=self.flow, **layout, **draws)
        part["frames"] = frames
        return part


def stage_rows(
    rows: Mapping[str, np.ndarray], device: torch.device | str | None, *, crop: int, flow: bool
) -> dict[str, torch.Tensor]:
    """A whole mini-batch staged at once: ``MicroBatchStage`` of all its rows (frames on ``device``,
    final-augmented there when the rows carry the crop draws; the reset table on the host). What the
    learner did before it streamed micro-batches, kept as the baseline the benchmark measures the
    streamed learner against and for callers that want the final frames of a few rows."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    return MicroBatchStage(device, crop=crop, flow=flow)(host_rows(rows, pin=device.type == "cuda"))


@dataclass(frozen=True)
class Staged:
    """A mini-batch on its way to host memory (``RowPrefetcher.submit``): collating in a thread
    (``future``) or done in place (``value``, or the ``error`` it raised)."""

    future: Future | None = None
    value: Any = None
    error: Exception | None = None

    def result(self) -> Any:
        """The staged value, once ready; raises what staging raised."""
        if self.future is not None:
            return self.future.result()
        if self.error is not None:
            raise self.error
        return self.value


class RowPrefetcher:
    """``host_rows`` for the next mini-batch while this one trains: ``submit(rows)``, later ``wait``.

    On CUDA the mini-batch is collated into pinned host memory (tens of MiB to GiB a mini-batch) in one
    background thread, so that the GPU does not idle between two steps while the host copies it; the
    step then streams it to the device micro-batch by micro-batch (``MicroBatchStage``), so the device
    holds O(micro-batch) of input whatever B is. Elsewhere (a CPU learner, whose cores its own step keeps
    busy) ``submit`` collates in place. An error raised while collating reaches the caller at ``wait``.

    The rows handed to ``submit`` must stay unchanged until ``wait`` returns (the learner takes the next
    rows from its stream only after that).
    """

    def __init__(self, device: torch.device | str | None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.pin = self.device.type == "cuda"
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="stage-rows") if self.pin else None

    def submit(self, rows: Mapping[str, np.ndarray]) -> Staged:
        """Start collating ``rows``; the returned handle goes to ``wait``."""
        if self._pool is not None:
            return Staged(future=self._pool.submit(host_rows, rows, pin=True))
        try:
            return Staged(value=host_rows(rows, pin=False))
        except Exception as error:  # kept for wait(), where the threaded path raises it too
            return Staged(error=error)

    def wait(self, staged: Staged) -> dict[str, torch.Tensor]:
        """The collated mini-batch, in host memory (pinned on CUDA)."""
        return staged.result()

    def close(self) -> None:
        """Stop the collating thread (after the last ``wait``)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
