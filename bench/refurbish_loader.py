"""The refurbishing benchmark's loader: eviction policies, step sampler, cache and block rows of a step.

Revamper (Lee et al., "Refurbish Your Training Data", USENIX ATC '21) in the shape of a PyTorch loader:
``StepSampler`` (main process) says, for every step of the run, which samples it holds and from which
epoch each one's partial augmentation must come (``computing_epochs``: balanced eviction of
``refurbish.RefurbishSchedule``, or a random / reference-count eviction for comparison) and batches
them with ``RefurbishSchedule.compose`` (cache-aware) or a plain shuffle; ``RefurbishingLoader`` (the
worker, which holds the cache) computes or reuses the partial augmentation, applies the final one and
packs the step's sequences into block rows, and reports the thread CPU seconds it took.

Data echoing (Choi et al.) is the same loader caching AFTER the final augmentation (``mode="echo"``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from benchlib import LocalData
from randaugment import burn_cpu

from raytrain_seq.augment import final_augment
from raytrain_seq.config import Config
from raytrain_seq.packing import pack
from raytrain_seq.refurbish import RefurbishSchedule
from raytrain_seq.seeds import FINAL_STREAM


def computing_epochs(policy: str, num: int, reuse: int, epochs: int, seed: int) -> np.ndarray:
    """``[epochs, num]``: the epoch whose partial augmentation each id uses in each epoch.

    "balanced": ``RefurbishSchedule`` (epoch - age). "random": every epoch >= 1 recomputes a random N/r
    subset (some ids wait longer than r epochs, others come back sooner). "refcount": the naive
    reference count, every id recomputed after r uses, so all of them at once in epochs r, 2r, ...
    With num 4, r 2, 4 epochs, refcount gives rows [0,0,0,0], [0,0,0,0], [2,2,2,2], [2,2,2,2].
    """
    out = np.zeros((epochs, num), dtype=np.int64)
    if policy == "balanced":
        schedule = RefurbishSchedule(num, reuse=reuse, seed=seed)
        for e in range(epochs):
            out[e] = e - schedule.age(e)
    elif policy == "random":
        rng = np.random.default_rng([seed, 0x52414E44])
        count = num // reuse
        for e in range(1, epochs):
            out[e] = out[e - 1]
            out[e, rng.choice(num, size=count, replace=False)] = e
    elif policy == "refcount":
        for e in range(epochs):
            out[e] = (e // reuse) * reuse
    else:
        raise ValueError(f"unknown eviction policy {policy!r}: use balanced, random or refcount")
    return out


def epoch_batches(
    computing: np.ndarray, epoch: int, batch: int, *, compose: bool, reuse: int, seed: int
) -> list[np.ndarray]:
    """Mini-batches of catalog positions for ``epoch``: ``RefurbishSchedule.compose`` or a plain shuffle.

    compose applies to the balanced schedule only (its fresh ids are the schedule's); a plain shuffle
    is ``default_rng([seed, epoch]).permutation`` cut into ``batch``-sized pieces.
    """
    num = computing.shape[1]
    if compose:
        return RefurbishSchedule(num, reuse=reuse, seed=seed).compose(epoch, batch)
    order = np.random.default_rng([seed, 0x53485546, epoch]).permutation(num)
    return [order[lo : lo + batch] for lo in range(0, num, batch)]


@dataclass(frozen=True)
class Task:
    """One sample of one step, as the batch sampler hands it to the loader worker."""

    epoch: int
    position: int  # index into the train catalog
    computed_in: int  # the epoch whose partial augmentation this use needs


class StepSampler:
    """Batch sampler over the whole run: every epoch's mini-batches as lists of Tasks, epoch by epoch."""

    def __init__(self, computing: np.ndarray, batch: int, *, compose: bool, reuse: int, seed: int) -> None:
        self.computing, self.batch, self.compose, self.reuse, self.seed = (
            computing,
            batch,
            compose,
            reuse,
            seed,
        )
        self.plans = [
            epoch_batches(computing, e, batch, compose=compose, reuse=reuse, seed=seed)
            for e in range(computing.shape[0])
        ]

    def __iter__(self) -> Iterator[list[Task]]:
        for epoch, batches in enumerate(self.plans):
            for ids in batches:
                yield [Task(epoch, int(i), int(self.computing[epoch, i])) for i in ids]

    def __len__(self) -> int:
        return sum(len(b) for b in self.plans)


class RefurbishingLoader(torch.utils.data.Dataset):
    """The loader worker's side: the cache, the augmentations, the block rows of each mini-batch.

    ``mode``: "standard" (no cache), "refurbish" (cache the partial augmentation) or "echo" (cache
    the final augmentation). ``__getitems__`` returns one mini-batch: block rows (numpy) plus its
    thread CPU seconds and how many partial augmentations it computed.
    """

    def __init__(
        self,
        config: dict,
        mode: str,
        *,
        frame_cost: float,
        extra_ops: int = 2,
        t_max: int,
        max_sequences: int,
    ) -> None:
        if mode not in ("standard", "refurbish", "echo"):
            raise ValueError(f"mode must be standard, refurbish or echo, got {mode!r}")
        self.config, self.mode, self.frame_cost, self.extra_ops = config, mode, frame_cost, extra_ops
        self.t_max, self.max_sequences = t_max, max_sequences
        self._data: LocalData | None = None
        self.cache: dict[int, tuple[int, np.ndarray]] = {}
        self.partials = 0

    @property
    def data(self) -> LocalData:
        if self._data is None:  # built in the worker process, on first use
            self._data = LocalData(Config.from_dict(self.config))
        return self._data

    def __len__(self) -> int:
        return len(self.data.catalogs["train"])

    def __getitem__(self, index):
        raise TypeError("RefurbishingLoader serves whole mini-batches: use it with a batch_sampler")

    def _partial(self, video: int, epoch: int) -> np.ndarray:
        began = time.thread_time()
        frames = self.data.partial(video, epoch, extra_ops=self.extra_ops)
        burn_cpu(len(frames) * self.frame_cost - (time.thread_time() - began))
        self.partials += 1
        return frames

    def _final(self, frames: np.ndarray, video: int, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.data.config.data.seed, FINAL_STREAM, epoch, video])
        return final_augment(frames, crop=self.data.config.data.crop, rng=rng)

    def sample(self, task: Task) -> np.ndarray:
        catalog = self.data.catalogs["train"]
        video = int(catalog.ids[task.position])
        if self.mode == "standard":
            return self._final(self._partial(video, task.epoch), video, task.epoch)
        cached = self.cache.get(video)
        if cached is not None and cached[0] == task.computed_in:
            frames = cached[1]
        else:
            frames = self._partial(video, task.computed_in)
            if self.mode == "echo":
                frames = self._final(frames, video, task.computed_in)
            self.cache[video] = (task.computed_in, frames)
        return frames if self.mode == "echo" else self._final(frames, video, task.epoch)

    def __getitems__(self, tasks: Sequence[Task]) -> dict:
        began, partials = time.thread_time(), self.partials
        sequences = [self.sample(t) for t in tasks]
        labels = self.data.catalogs["train"].labels
        rows = pack_rows(sequences, [int(labels[t.position]) for t in tasks], self.t_max, self.max_sequences)
        rows["cpu_seconds"] = time.thread_time() - began
        rows["partials"] = self.partials - partials
        rows["epoch"] = tasks[0].epoch
        return rows


def pack_rows(sequences: list[np.ndarray], labels: list[int], t_max: int, max_sequences: int) -> dict:
    """Pack one mini-batch's sequences into block rows ("optimal"): the row layout of the job.

    Lengths [5, 3, 4] at t_max 8 -> two rows, e.g. starts [0, 5] (5 + 3) and [0] (4), -1 padded.
    """
    plan = pack([len(s) for s in sequences], t_max, strategy="optimal", seed=0)
    n = len(plan.blocks)
    frames = np.zeros((n, t_max, *sequences[0].shape[1:]), dtype=np.uint8)
    starts = np.full((n, max_sequences), -1, dtype=np.int64)
    lengths, row_labels = starts.copy(), starts.copy()
    for row, block in enumerate(plan.blocks):
        for slot, (i, start, length) in enumerate(zip(block.ids, block.starts, block.lengths, strict=True)):
            frames[row, start : start + length] = sequences[i]
            starts[row, slot], lengths[row, slot], row_labels[row, slot] = start, length, labels[i]
    counts = np.array([len(b.ids) for b in plan.blocks], dtype=np.int64)
    return {
        "frames": frames,
        "starts": starts,
        "lengths": lengths,
        "labels": row_labels,
        "num_sequences": counts,
    }


def identity_collate(batch):
    """DataLoader collate_fn: ``__getitems__`` already returns the finished mini-batch."""
    return batch
