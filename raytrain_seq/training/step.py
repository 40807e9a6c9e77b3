"""The learner's inner step, without Ray: stream a mini-batch's micro-batches, step the optimizer once.

Everything a learner does between two averaging rounds lives here, in plain torch, so the same code runs
inside a learner actor and in a GPU benchmark on a machine that has no Ray. One step takes a mini-batch
of B block rows (``frames [B, t_max, H, W, C]`` uint8 plus the reset tables), streams it to the device as
micro-batches with :func:`raytrain_seq.algorithms.microbatch.accumulate` (so the gradient is exactly the full-batch
gradient, normalised by the number of real sequences), then steps the optimizer once. AAVG's Algorithm 1
line 9 is exactly this update: the mean gradient over the B_n samples of the mini-batch. A mini-batch of
only filler rows (no real sequence) counts as a step and changes nothing else
(:func:`advance_without_update`): learners keep equal step counts, and no weight moves without data.

Trade-off: a mini-batch of any size fits any device; the price is one forward/backward per micro-batch
(``bench/microbatch.py`` measures the overhead against one batch that fits). How the rows reach the
device: ``training.staging``; scoring: ``training.evaluation``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from raytrain_seq.algorithms.microbatch import MicroBatchSizer, SideStreams, accumulate
from raytrain_seq.config import LR_SCHEDULES, PRECISIONS
from raytrain_seq.models import sequence_loss

logger = logging.getLogger(__name__)

OPTIMIZERS = ("adam", "adamw", "sgd")


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
