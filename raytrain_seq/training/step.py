"""The learner's inner step, without Ray: collate block rows, stream micro-batches, step the optimizer.

Everything a learner does between two averaging rounds lives here, in plain torch, so the same code runs
inside a learner actor and in a GPU benchmark on a machine that has no Ray. One step takes a mini-batch
of B block rows (``frames [B, t_max, H, W, C]`` uint8 plus the reset tables), streams it to the device as
micro-batches with :func:`raytrain_seq.algorithms.microbatch.accumulate` (so the gradient is exactly the full-batch
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

from raytrain_seq.algorithms.augment import final_augment_batch
from raytrain_seq.algorithms.microbatch import MicroBatchSizer, SideStreams, accumulate
from raytrain_seq.config import LR_SCHEDULES, PRECISIONS
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
    ``stage``: how each micro-batch reaches the device (``MicroBatchStage``: a learner's mini-batch stays
    in host memory and only its micro-batches go to the device, cropped there); None: every tensor is
    moved as it is (``microbatch.device_stage``).
    ``streams``: where the side stream that stages micro-batches on CUDA comes from; one ``SideStreams``
    per learner (the default makes its own), so every mini-batch stages on the same stream.
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
        stage: Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]] | None = None,
        streams: SideStreams | None = None,
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
        self.stage = stage
        self.streams = streams if streams is not None else SideStreams()
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
            stage=self.stage,
            streams=self.streams,
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

    def tallies(self) -> dict[str, Any]:
        """The counts that a learner sends for its share of a split (plain types; no loss: the shares'
        sums need none): ``from_tallies`` rebuilds the result, ``combine`` sums the shares."""
        return {
            "correct": sum(c for c, _ in self.per_class.values()),
            "sequences": self.sequences,
            "per_class": {str(k): list(v) for k, v in self.per_class.items()},
            "top5_correct": self.top5_correct,
            "confusion": {f"{t},{p}": n for (t, p), n in self.confusion.items()},
        }

    @classmethod
    def from_tallies(cls, tallies: Mapping[str, Any]) -> EvalResult:
        """The result behind ``tallies()`` (loss 0: not sent)."""
        sequences = int(tallies["sequences"])
        return cls(
            accuracy=int(tallies["correct"]) / sequences if sequences else 0.0,
            loss=0.0,
            sequences=sequences,
            per_class={int(k): (int(c), int(t)) for k, (c, t) in tallies.get("per_class", {}).items()},
            top5_correct=int(tallies.get("top5_correct", 0)),
            confusion={
                tuple(int(v) for v in cell.split(",")): int(n)
                for cell, n in tallies.get("confusion", {}).items()
            },
        )

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


# Rows per forward-only micro-batch when a GPU scores with micro_batch_size="auto": an evaluation batch
# (``collate_stream``'s 16 rows) at once.
CUDA_EVAL_ROWS = 16


def eval_micro_batch_size(micro_batch_size: int | str, device: torch.device | str | None = None) -> int:
    """Rows per forward-only micro-batch when scoring: the training micro-batch (``"auto"``: 4 on a CPU,
    ``CUDA_EVAL_ROWS`` on a GPU).

    Why not larger on a CPU, though a forward pass without autograd would fit several times the rows: the
    frame encoder's activations of a bigger micro-batch fall out of the caches, and the demo model scored
    slower per row at 16 rows a micro-batch than at 4 (timed by hand: docs/ARCHITECTURE.md, "Measurements behind the code").
    The training size is the one known to fit on the learner's device and to run at training's rate. A
    GPU needs the rows to fill it, and a forward pass without autograd holds one layer's activations at
    a time, far less than the training step that "auto" sized.
    """
    if isinstance(micro_batch_size, int):
        return micro_batch_size
    cuda = device is not None and torch.device(device).type == "cuda"
    return CUDA_EVAL_ROWS if cuda else 4


def evaluate(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    micro_batch_size: int = 16,
    device: torch.device | str | None = None,
    views: Sequence[tuple[int, int, bool]] | None = None,
    crop: int | None = None,
    flow: bool = False,
    precision: str = "fp32",
) -> EvalResult:
    """Score every real sequence of ``batches`` (dicts of block-row tensors) without autograd.

    ``views`` (with ``crop``): the batches hold uncropped frames and each sequence is scored on every
    (top, left, flip) view, the softmax averaged (multi-view testing); the loss is then the negative log
    of the averaged probability. None: the frames are final already (one view). Only the frames go to
    ``device`` (the reset table is read on the host); ``precision`` autocasts the forward passes as
    training does ("bf16", "fp16"), the scores are computed in float32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    autocast = {"device_type": device.type, "enabled": precision != "fp32"}
    if precision != "fp32":
        autocast["dtype"] = torch.bfloat16 if precision == "bf16" else torch.float16
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
                part = {key: value[lo : lo + micro_batch_size] for key, value in batch.items()}
                part["frames"] = part["frames"].to(device)
                with torch.autocast(**autocast):
                    if views:
                        probs, labels = view_probabilities(model, part, views, crop=crop, flow=flow)
                        logits = torch.log(probs.clamp_min(1e-12))  # log-probabilities rank like logits
                    else:
                        logits, labels = predict(model, part)
                logits = logits.float()
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
