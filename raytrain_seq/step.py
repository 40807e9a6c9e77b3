"""The learner's inner step, without Ray: collate block rows, stream micro-batches, step the optimizer.

Everything a learner does between two averaging rounds lives here, in plain torch, so the same code runs
inside a Ray Train worker and in a GPU benchmark on a machine that has no Ray. One step takes a mini-batch
of B block rows (``frames [B, t_max, H, W, C]`` uint8 plus the reset tables), streams it to the device as
micro-batches with :func:`raytrain_seq.microbatch.accumulate` (so the gradient is exactly the full-batch
gradient, normalised by the number of real sequences), then steps the optimizer once. AAVG's Algorithm 1
line 9 is exactly this update: the mean gradient over the B_n samples of the mini-batch. A mini-batch of
only filler rows (no real sequence) counts as a step and changes nothing else
(:func:`advance_without_update`): learners keep equal step counts, and no weight moves without data.

Trade-off: a mini-batch of any size fits any device; the price is one forward/backward per micro-batch
(``bench/microbatch.py`` measures the overhead against one batch that fits).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from raytrain_seq.augment import final_augment_batch
from raytrain_seq.config import LR_SCHEDULES, PRECISIONS
from raytrain_seq.microbatch import MicroBatchSizer, accumulate
from raytrain_seq.models import predict, sequence_loss

logger = logging.getLogger(__name__)

OPTIMIZERS = ("adam", "adamw", "sgd")


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


def stage_rows(
    rows: Mapping[str, np.ndarray], device: torch.device | str | None, *, crop: int, flow: bool
) -> dict[str, torch.Tensor]:
    """Block rows as tensors on ``device``, final-augmented there when the rows carry the crop draws.

    Rows from the learner's row stream hold the cached partial augmentation, uncropped (uint8, the
    cache size), and each sequence's seeded ``tops``, ``lefts``, ``flips``: the crop and flip run here
    on the whole mini-batch (``augment.final_augment_batch``), on the GPU when there is one. On CUDA the
    host tensors are pinned and copied with ``non_blocking=True``, so staging the next mini-batch before
    the current step overlaps the copy with compute. Rows without the draws are final already.
    """
    batch = collate_rows(rows)
    # The crop's draws and the rows' layout stay on the host: the crop reads them there, per sequence.
    draws = {key: batch.pop(key) for key in ("tops", "lefts", "flips") if key in batch}
    layout = {key: batch[key] for key in ("starts", "lengths")} if draws else {}
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        batch = {key: value.pin_memory().to(device, non_blocking=True) for key, value in batch.items()}
    elif device.type != "cpu":
        batch = {key: value.to(device) for key, value in batch.items()}
    if draws:
        batch["frames"] = final_augment_batch(batch["frames"], crop=crop, flow=flow, **layout, **draws)
    return batch


@dataclass(frozen=True)
class Staged:
    """A mini-batch on its way to the device (``RowPrefetcher.submit``): staging in a thread (``future``)
    or done in place (``value``, or the ``error`` it raised)."""

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
    """``stage_rows`` for the next mini-batch while this one trains: ``submit(rows)``, later ``wait``.

    On CUDA the host side of staging (pinning the frames, tens of MiB a mini-batch; launching the copies
    and the crops) would otherwise run between two steps while the GPU idles (``bench/learner_device.py``
    measures its share of a learner's time). Here it runs in one background thread, which queues the
    copies and crops on a side stream; ``wait`` makes the training stream wait for exactly that mini-batch's
    work and marks its tensors as used there, so the caching allocator does not hand their memory to the
    next mini-batch while a step still reads them. Elsewhere (a CPU learner, whose cores its own step keeps
    busy) ``submit`` stages in place. The bits are ``stage_rows``' either way, and an error raised while
    staging reaches the caller at ``wait``.

    The rows handed to ``submit`` must stay unchanged until ``wait`` returns (the learner takes the next
    rows from its stream only after that).
    """

    def __init__(self, device: torch.device | str | None, *, crop: int, flow: bool) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.crop, self.flow = crop, flow
        cuda = self.device.type == "cuda"
        self._side = torch.cuda.Stream(self.device) if cuda else None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="stage-rows") if cuda else None

    def submit(self, rows: Mapping[str, np.ndarray]) -> Staged:
        """Start staging ``rows``; the returned handle goes to ``wait``."""
        if self._pool is not None:
            return Staged(future=self._pool.submit(self._stage_on_side, rows))
        try:
            return Staged(value=(stage_rows(rows, self.device, crop=self.crop, flow=self.flow), None))
        except Exception as error:  # kept for wait(), where the threaded path raises it too
            return Staged(error=error)

    def _stage_on_side(self, rows: Mapping[str, np.ndarray]) -> tuple[dict[str, torch.Tensor], Any]:
        with torch.cuda.stream(self._side):
            batch = stage_rows(rows, self.device, crop=self.crop, flow=self.flow)
            ready = torch.cuda.Event()
            ready.record(self._side)
        return batch, ready

    def wait(self, staged: Staged) -> dict[str, torch.Tensor]:
        """The staged mini-batch, usable on the caller's current stream."""
        batch, ready = staged.result()
        if ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(ready)
            for tensor in batch.values():
                if tensor.device.type == "cuda":
                    tensor.record_stream(stream)
        return batch

    def close(self) -> None:
        """Stop the staging thread (after the last ``wait``)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def useful_frames(batch: Mapping[str, torch.Tensor]) -> int:
    """Frames that belong to real sequences (padding and filler rows excluded).

    ``lengths`` is padded with -1 past ``num_sequences``: rows with lengths ``[37, 24, 20, -1]`` and
    ``[-1, -1, -1, -1]`` hold 81 useful frames.
    """
    lengths = batch["lengths"]
    return int(lengths.clamp(min=0).sum())


def build_optimizer(
    name: str, params: Iterable[nn.Parameter], *, lr: float, weight_decay: float = 0.0, momentum: float = 0.9
) -> torch.optim.Optimizer:
    """``adam`` (the AAVG default, whose moments the averager merges), ``adamw`` or ``sgd`` (with momentum)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")


def advance_without_update(optimizer: torch.optim.Optimizer) -> None:
    """Count one optimizer step that changes no parameter and no moment: the step of a filler-only batch.

    Every parameter that holds a gradient gets what one ``optimizer.step()`` would give its step counter
    (Adam/AdamW's per-parameter ``step`` + 1; SGD keeps none) and nothing else: weights, ``exp_avg``,
    ``exp_avg_sq`` and ``max_exp_avg_sq`` are left as they were. A parameter whose state the optimizer
    has not created yet (a learner whose first mini-batch is all filler) gets the state a step creates,
    made by the optimizer's own step on a zero gradient with weight decay off for that one call (zero
    moments, step 1), then its weights are put back: every learner then holds the same state keys, which
    the moment merge requires. Anything that reads the step counter (a learning-rate schedule, Adam's
    bias correction) sees the step; the run has no learning-rate schedule yet, so the counter is all
    there is to advance.
    """
    fresh: list[torch.Tensor] = []
    known: list[torch.Tensor] = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                (known if optimizer.state.get(param) else fresh).append(param)
    if fresh:
        _create_state(optimizer, fresh, known)
    for param in known:
        state = optimizer.state[param]
        if "step" not in state:
            continue
        if isinstance(state["step"], torch.Tensor):
            state["step"].add_(1)
        else:
            state["step"] = state["step"] + 1


def _create_state(
    optimizer: torch.optim.Optimizer, fresh: list[torch.Tensor], known: list[torch.Tensor]
) -> None:
    """Let the optimizer create the state of ``fresh`` parameters by one step that updates none of them."""
    saved_grads = [param.grad for param in (*fresh, *known)]
    saved_decay = [group.get("weight_decay") for group in optimizer.param_groups]
    weights = [param.detach().clone() for param in fresh]
    try:
        # Parameters without a gradient are skipped by torch's optimizers, so the known ones sit this
        # call out; a zero gradient without weight decay leaves Adam's new moments at zero.
        for param in known:
            param.grad = None
        for param in fresh:
            param.grad = torch.zeros_like(param)
        for group in optimizer.param_groups:
            if "weight_decay" in group:
                group["weight_decay"] = 0.0
        optimizer.step()
    finally:
        for param, grad in zip((*fresh, *known), saved_grads, strict=True):
            param.grad = grad
        for group, decay in zip(optimizer.param_groups, saved_decay, strict=True):
            if decay is not None:
                group["weight_decay"] = decay
    with torch.no_grad():
        for param, weight in zip(fresh, weights, strict=True):
            param.copy_(weight)


@dataclass(frozen=True)
class StepStats:
    """What one optimizer step did."""

    loss: float
    """Mean cross-entropy over the mini-batch's real sequences."""
    sequences: int
    """Real sequences in the mini-batch (the loss's denominator)."""
    frames: int
    """Useful frames in the mini-batch (padding excluded)."""
    seconds: float
    """Wall time of the step, device work included."""


@dataclass(frozen=True)
class LearningRate:
    """The learning rate of a step: a linear warm-up over the first ``warmup_steps`` optimizer steps, then
    constant (AAVG's setting: the paper keeps it fixed) or a cosine decay to 0 over the run.

    The cosine follows the run's progress (epochs done, as a fraction of all), not a step count: under
    AAVG the batch size grows and an elastic group changes size, so the number of steps ahead is unknown,
    while every learner knows where the epoch stands and so agrees on the rate. E.g. lr 1e-3, cosine,
    progress 0.5: 5e-4; warm-up 100 steps, step 25 of it: 2.5e-4 (times the cosine factor).
    """

    lr: float
    schedule: str = "constant"
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.schedule not in LR_SCHEDULES:
            raise ValueError(f"lr schedule must be one of {LR_SCHEDULES}, got {self.schedule!r}")
        if (
            isinstance(self.warmup_steps, bool)
            or not isinstance(self.warmup_steps, int)
            or self.warmup_steps < 0
        ):
            raise ValueError(f"warmup_steps must be an int >= 0, got {self.warmup_steps!r}")

    def at(self, step: int, progress: float) -> float:
        """The rate for optimizer step ``step`` (1-based) at ``progress`` in [0, 1] of the run."""
        factor = 1.0
        if self.schedule == "cosine":
            factor = 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
        if self.warmup_steps and step <= self.warmup_steps:
            factor *= step / self.warmup_steps
        return self.lr * factor


class InnerStep:
    """One AAVG local step: ``step(batch)`` = micro-batched forward/backward + one optimizer step.

    ``precision``: "fp32", or autocast to "bf16" or "fp16" for the forward passes (the weights, the
    gradients and the optimizer stay fp32). fp16 scales the loss with a ``GradScaler``: every micro-batch's
    loss is multiplied by the same scale, so the accumulated gradient is the scale times the exact
    full-batch gradient and unscaling gives it back; a step whose gradient overflowed is skipped by the
    scaler and counted like a filler step, so the learners' Adam step counts stay in lockstep.
    ``lr``: a ``LearningRate`` set on the optimizer before each step (None: the optimizer's own rate).
    ``loss_fn``: a micro-batch's (loss sum, sequence count), under the autocast (default ``sequence_loss``).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        micro_batch_size: int | str,
        device: torch.device | str | None = None,
        precision: str = "fp32",
        lr: LearningRate | None = None,
        loss_fn: Callable[[nn.Module, Mapping[str, torch.Tensor]], tuple[torch.Tensor, int]] = sequence_loss,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.model = model
        self.optimizer = optimizer
        self.micro_batch_size = micro_batch_size
        self.device = torch.device(device) if device is not None else None
        # One sizer per learner: "auto" probes the largest micro-batch once per input shape.
        self.sizer = MicroBatchSizer()
        self.precision, self.lr = precision, lr
        self.loss_fn = loss_fn
        device_type = (self.device or next(model.parameters()).device).type
        self._autocast = {"device_type": device_type, "enabled": precision != "fp32"}
        if precision != "fp32":
            self._autocast["dtype"] = torch.bfloat16 if precision == "bf16" else torch.float16
        self.scaler = torch.amp.GradScaler(device_type, enabled=precision == "fp16")
        self.steps = 0
        self.skipped = 0  # fp16 steps the scaler skipped on an overflow

    def _loss(self, model: nn.Module, micro_batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        with torch.autocast(**self._autocast):
            loss_sum, count = self.loss_fn(model, micro_batch)
        if loss_sum.dtype in (torch.float16, torch.bfloat16):
            loss_sum = loss_sum.float()  # sum the micro-batches' losses at fp32 at least
        # The same scale for every micro-batch keeps the accumulated gradient exact up to that factor.
        return self.scaler.scale(loss_sum), count

    def __call__(self, batch: Mapping[str, torch.Tensor], *, progress: float = 0.0) -> StepStats:
        """One optimizer step on ``batch``; ``progress`` (0..1 of the run) drives a cosine rate."""
        began = time.perf_counter()
        self.model.train()
        self.steps += 1
        if self.lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr.at(self.steps, progress)
        loss = accumulate(
            self.model,
            dict(batch),
            self._loss,
            micro_batch_size=self.micro_batch_size,
            device=self.device,
            sizer=self.sizer,
        )
        if self.scaler.is_enabled():
            loss /= self.scaler.get_scale()
        sequences = int(batch["num_sequences"].sum())
        if sequences and self.scaler.is_enabled():
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # unscales; skips the update when a gradient is inf or nan
            self.scaler.update()
            if self.scaler.get_scale() < before:  # it backed off: this step was skipped
                self.skipped += 1
                advance_without_update(self.optimizer)
        elif sequences:
            self.optimizer.step()
        else:
            # A mini-batch of only filler rows has nothing to learn from, but a real Adam step on its zero
            # gradient still moves every weight by about lr (m / (sqrt(v) + eps) is not zero once the
            # moments are), so the step is counted and nothing else: the learner keeps the step count
            # its peers reach (averaging.merge_adam_states refuses learners at steps 20 and 21).
            advance_without_update(self.optimizer)
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepStats(loss, sequences, useful_frames(batch), time.perf_counter() - began)


@dataclass(frozen=True)
class EvalResult:
    """Scores of a model over a set of block rows; ``combine`` sums the results of disjoint shards."""

    accuracy: float
    """Correct sequences / sequences (top-1; 0.0 for an empty set)."""
    loss: float
    """Mean cross-entropy per sequence."""
    sequences: int
    """How many sequences were scored."""
    per_class: dict[int, tuple[int, int]]
    """label -> (correct, total)."""
    top5_correct: int = 0
    """Sequences whose label is among the 5 highest logits (all of them when there are <= 5 classes)."""
    confusion: dict[tuple[int, int], int] = field(default_factory=dict)
    """(label, predicted class) -> count, the non-zero cells of the confusion matrix."""

    @property
    def top5_accuracy(self) -> float:
        return self.top5_correct / self.sequences if self.sequences else 0.0

    @property
    def mean_class_accuracy(self) -> float:
        """The mean over classes of each class's accuracy (MMAction2's mean class accuracy): every class
        counts the same, however many test videos it has. Classes with no sequence are left out."""
        rates = [c / t for c, t in self.per_class.values() if t]
        return sum(rates) / len(rates) if rates else 0.0

    @classmethod
    def combine(cls, parts: Iterable[EvalResult]) -> EvalResult:
        """One result for the union of disjoint shards' sequences (counts summed, means re-weighted)."""
        parts = list(parts)
        total = sum(p.sequences for p in parts)
        per_class: dict[int, list[int]] = {}
        confusion: dict[tuple[int, int], int] = {}
        for part in parts:
            for label, (c, t) in part.per_class.items():
                tally = per_class.setdefault(label, [0, 0])
                tally[0] += c
                tally[1] += t
            for cell, count in part.confusion.items():
                confusion[cell] = confusion.get(cell, 0) + count
        correct = sum(c for c, _ in per_class.values())
        return cls(
            accuracy=correct / total if total else 0.0,
            loss=sum(p.loss * p.sequences for p in parts) / total if total else 0.0,
            sequences=total,
            per_class={label: (c, t) for label, (c, t) in sorted(per_class.items())},
            top5_correct=sum(p.top5_correct for p in parts),
            confusion=dict(sorted(confusion.items())),
        )


def view_probabilities(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    views: Sequence[tuple[int, int, bool]],
    *,
    crop: int,
    flow: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Class probabilities ``[K, classes]`` of the batch's real sequences, the softmax averaged over
    ``views`` ((top, left, flip) cut from the batch's uncropped frames on its device), and their labels."""
    total, labels = None, None
    for top, left, flip in views:
        draws = {
            "tops": torch.full_like(batch["starts"], top),
            "lefts": torch.full_like(batch["starts"], left),
            "flips": torch.full_like(batch["starts"], int(flip)),
        }
        frames = final_augment_batch(
            batch["frames"], starts=batch["starts"], lengths=batch["lengths"], crop=crop, flow=flow, **draws
        )
        logits, labels = predict(model, {**batch, "frames": frames})
        probs = torch.softmax(logits.float(), dim=1)
        total = probs if total is None else total + probs
    return total / len(views), labels


def eval_micro_batch_size(micro_batch_size: int | str) -> int:
    """Rows per forward-only micro-batch when scoring: the training micro-batch (``"auto"``: 4).

    Why not larger, though a forward pass without autograd would fit several times the rows: on a CPU the
    frame encoder's activations of a bigger micro-batch fall out of the caches, and the demo model scored
    slower per row at 16 rows a micro-batch than at 4 (timed by hand: docs/LOG.md, 2026-11-23, issue 13).
    The training size is the one known to fit on the learner's device and to run at training's rate.
    """
    return micro_batch_size if isinstance(micro_batch_size, int) else 4


def evaluate(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    micro_batch_size: int = 16,
    device: torch.device | str | None = None,
    views: Sequence[tuple[int, int, bool]] | None = None,
    crop: int | None = None,
    flow: bool = False,
) -> EvalResult:
    """Score every real sequence of ``batches`` (dicts of block-row tensors) without autograd.

    ``views`` (with ``crop``): the batches hold uncropped frames and each sequence is scored on every
    (top, left, flip) view, the softmax averaged (multi-view testing); the loss is then the negative log
    of the averaged probability. None: the frames are final already (one view)."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct = total = top5 = 0
    loss_sum = 0.0
    per_class: dict[int, list[int]] = {}
    confusion: dict[tuple[int, int], int] = {}
    try:
        for batch in batches:
            rows = int(batch["num_sequences"].shape[0])
            for lo in range(0, rows, micro_batch_size):
                part = {key: value[lo : lo + micro_batch_size].to(device) for key, value in batch.items()}
                if views:
                    probs, labels = view_probabilities(model, part, views, crop=crop, flow=flow)
                    logits = torch.log(probs.clamp_min(1e-12))  # log-probabilities rank like logits
                else:
                    logits, labels = predict(model, part)
                if labels.numel() == 0:
                    continue
                predicted = logits.argmax(1)
                hits = predicted == labels
                best5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
                top5 += int((best5 == labels[:, None]).any(1).sum())
                loss_sum += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
                correct += int(hits.sum())
                total += int(labels.numel())
                for label, guess in zip(labels.tolist(), predicted.tolist(), strict=True):
                    tally = per_class.setdefault(label, [0, 0])
                    tally[0] += int(label == guess)
                    tally[1] += 1
                    confusion[(label, guess)] = confusion.get((label, guess), 0) + 1
    finally:
        model.train(was_training)
    return EvalResult(
        accuracy=correct / total if total else 0.0,
        loss=loss_sum / total if total else 0.0,
        sequences=total,
        per_class={label: (c, t) for label, (c, t) in sorted(per_class.items())},
        top5_correct=top5,
        confusion=dict(sorted(confusion.items())),
    )


def load_averaged(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    params: Mapping[str, torch.Tensor],
    optimizer_state: Mapping | None,
) -> None:
    """Install the averager's mean parameters and, when given, its merged optimizer moments.

    The merged state replaces only ``state`` (the per-parameter moments and step); the learner keeps its
    own ``param_groups`` (learning rate, betas), which AAVG never averages.
    """
    model.load_state_dict(dict(params))
    if optimizer_state is not None:
        current = optimizer.state_dict()
        optimizer.load_state_dict({"state": dict(optimizer_state), "param_groups": current["param_groups"]})
