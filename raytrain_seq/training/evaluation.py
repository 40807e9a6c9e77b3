"""Scoring a model without autograd: ``evaluate`` over block rows, and ``EvalResult``, what it counts.

``evaluate`` scores every real sequence of a split's batches (top-1, top-5, loss, per class, confusion),
one view of final frames or the softmax averaged over (top, left, flip) views cut on the device
(``view_probabilities``: multi-view testing), into an ``EvalResult`` (``training.eval_result``).
``eval_micro_batch_size`` is the forward-only micro-batch. The model is put
back in its own training mode afterwards. Plain torch: no ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from raytrain_seq.algorithms.augment import final_augment_batch
from raytrain_seq.config import PRECISIONS
from raytrain_seq.models import predict
from raytrain_seq.training.eval_result import EvalResult

__all__ = ["CUDA_EVAL_ROWS", "EvalResult", "eval_micro_batch_size", "evaluate", "view_probabilities"]


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
