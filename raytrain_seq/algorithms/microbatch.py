"""Micro-batch streaming with exact loss normalisation (torch only).

Algorithm (Piao, Synn et al., "Micro Batch Streaming", Algorithm 1): a mini-batch is cut along its first
dim into micro-batches streamed to the device one after another, each running forward and backward, the
gradients accumulating until the caller steps once. Where this departs from the paper: ``loss_fn``
returns a loss *sum* and its item count, the mini-batch's count ``N`` is counted first (``count_items``)
and each micro-batch backpropagates ``loss_sum / N``, so the accumulated gradient is exactly the
full-batch one for any split (the paper's mean / ``N_S`` is exact only for equal micro-batches).
Streaming: the mini-batch stays where the caller keeps it; ``stage`` brings one micro-batch at a time to
the device, i + 1 staged on a side stream (``SideStreams``) while i computes, so at most two exist at once.
``micro_batch_size="auto"`` (``MicroBatchSizer``): from the whole mini-batch, halve on a CUDA OOM and
restart the mini-batch (still exact); the working size is remembered; on CPU "auto" is the whole batch.
BatchNorm in training mode computes per-micro-batch statistics, so it breaks exactness: one warning.
``bench/microbatch.py`` measures the cost (docs/BENCHMARKS.md, "MBS").
"""

from __future__ import annotations

import gc
import logging
import numbers
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn

logger = logging.getLogger(__name__)

Batch = Mapping[str, Tensor] | Tensor
LossFn = Callable[[nn.Module, Batch], "tuple[Tensor, int | Tensor]"]
# A micro-batch (a slice of the mini-batch where the caller keeps it) -> what loss_fn reads, on the device.
Stage = Callable[[Batch], Batch]
T = TypeVar("T")

# Errors after which a smaller micro-batch may fit. torch.cuda.OutOfMemoryError exists in CPU builds
# too, which lets tests inject it.
OOM_ERRORS: tuple[type[BaseException], ...] = (torch.cuda.OutOfMemoryError,)

# Every trainable torch module with batch statistics and running buffers, named publicly (torch's common
# base class is private). The Lazy ones subclass that base, not BatchNormNd, until their first forward turns
# them into BatchNormNd.
BATCHNORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.LazyBatchNorm1d,
    nn.LazyBatchNorm2d,
    nn.LazyBatchNorm3d,
)

_BATCHNORM_WARNED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def num_samples(batch: Batch) -> int:
    """Validate ``batch`` (a tensor, or a dict of tensors sharing their first dim) and return that dim."""
    if isinstance(batch, Tensor):
        if batch.dim() == 0:
            raise ValueError(
                "batch is a 0-dim tensor; pass a tensor whose first dim indexes samples (e.g. x.unsqueeze(0))"
            )
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        if not batch:
            raise ValueError(
                "batch is an empty dict; pass at least one tensor whose first dim indexes samples"
            )
        rows: int | None = None
        first_key = None
        for key, value in batch.items():
            if not isinstance(value, Tensor):
                raise TypeError(
                    f"batch[{key!r}] is a {type(value).__name__}, not a tensor; every value of a batch dict "
                    "must be a tensor whose first dim indexes samples (convert it with torch.as_tensor, or "
                    "keep it out of the batch)"
                )
            if value.dim() == 0:
                raise ValueError(
                    f"batch[{key!r}] is a 0-dim tensor; give it a first dim of samples (one value per row)"
                )
            if rows is None:
                rows, first_key = int(value.shape[0]), key
            elif value.shape[0] != rows:
                raise ValueError(
                    f"batch[{key!r}] has {value.shape[0]} rows but batch[{first_key!r}] has {rows}; every "
                    "tensor in a batch dict must have the same first dim (one entry per sample)"
                )
        return int(rows)
    raise TypeError(
        f"batch must be a dict of tensors or a tensor, got {type(batch).__name__}; collate the samples "
        "first (e.g. torch.stack them, or build a dict of stacked tensors)"
    )


def default_count_items(batch: Batch) -> int:
    """Items in ``batch``: ``batch["num_sequences"].sum()`` for a dict of Block rows, else the rows."""
    if isinstance(batch, Mapping) and "num_sequences" in batch:
        return _as_count(batch["num_sequences"].sum(), "batch['num_sequences'].sum()")
    return num_samples(batch)


def _as_count(value: object, what: str) -> int:
    """An item count as a Python int; rejects bools, non-integers and negatives."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"{what} is a tensor of shape {tuple(value.shape)}; return one number (an item count)"
            )
        value = value.item()
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not float(value).is_integer()
        or value < 0
    ):
        raise ValueError(f"{what} is {value!r}; it must be a whole number of items >= 0 (an int)")
    return int(value)


def _slice(batch: Batch, lo: int, hi: int) -> Batch:
    if isinstance(batch, Tensor):
        return batch[lo:hi]
    return {key: value[lo:hi] for key, value in batch.items()}


def _map(batch: Batch, fn: Callable[[Tensor], Tensor]) -> Batch:
    if isinstance(batch, Tensor):
        return fn(batch)
    return {key: fn(value) for key, value in batch.items()}


def _signature(batch: Batch) -> tuple:
    """Per-sample shapes and dtypes: what decides how many samples fit, whatever the batch size."""
    items = [("", batch)] if isinstance(batch, Tensor) else sorted(batch.items(), key=lambda kv: str(kv[0]))
    return tuple((key, tuple(value.shape[1:]), str(value.dtype)) for key, value in items)


def _release_cached_memory() -> None:
    """Free what a failed attempt left behind, so the smaller retry sees the memory."""
    # CPU memory exhaustion is never retried, so there is nothing to release without CUDA.
    if torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


class MicroBatchSizer:
    """Finds, by halving after out-of-memory errors, a micro-batch size that fits, and remembers it.

    One sizer can serve several models: sizes are kept per model (weakly) and per-sample shape and
    dtype. The size never grows again for that key (probing upwards costs a failed step); use a fresh
    sizer to re-probe. ``oom_errors`` are the exceptions that mean "try smaller".
    """

    def __init__(self, oom_errors: tuple[type[BaseException], ...] = OOM_ERRORS) -> None:
        self.oom_errors = tuple(oom_errors)
        # model -> {per-sample signature -> cap}; cap None: the whole batch fitted so far.
        self._caps: weakref.WeakKeyDictionary[nn.Module, dict[tuple, int | None]] = (
            weakref.WeakKeyDictionary()
        )

    def known(self, model: nn.Module, batch: Batch) -> int | None:
        """The remembered size cap for this model and per-sample shape, None if no OOM was seen yet."""
        return self._caps.get(model, {}).get(_signature(batch))

    def run(
        self,
        model: nn.Module,
        batch: Batch,
        attempt: Callable[[int], T],
        *,
        on_oom: Callable[[], None] | None = None,
    ) -> T:
        """``attempt(size)`` with the largest size that fits, starting from the whole batch or the cap.

        ``attempt`` must redo the whole mini-batch from scratch; ``on_oom`` undoes what a failed
        attempt changed (gradients, running statistics) before the retry.
        """
        rows = num_samples(batch)
        signature = _signature(batch)
        caps = self._caps.setdefault(model, {})
        cap = caps.get(signature)
        size = max(1, rows if cap is None else min(rows, cap))
        failed_at: int | None = None
        while True:
            try:
                result = attempt(size)
            except self.oom_errors:
                if size <= 1:
                    if on_oom is not None:
                        on_oom()
                    raise
                failed_at = size
            else:
                break
            # Outside the except block, so the traceback (and the failed attempt's tensors) is gone.
            if on_oom is not None:
                on_oom()
            _release_cached_memory()
            # Halve, rounding up so the micro-batches stay balanced: 37 -> 19 -> 10 -> 5 -> 3 -> 2 -> 1.
            size = (size + 1) // 2
        if failed_at is None and signature in caps:
            return result
        caps[signature] = None if failed_at is None else size
        outcome = (
            f"the whole batch of {rows} fits" if failed_at is None else f"{size} fits ({failed_at} did not)"
        )
        shape = ", ".join(f"{key or 'x'}: {shp} {dtype}" for key, shp, dtype in signature)
        logger.info("micro_batch_size='auto' for %s (%s): %s", type(model).__name__, shape, outcome)
        return result


_DEFAULT_SIZER = MicroBatchSizer()


def _resolve_device(model: nn.Module, device: torch.device | str | None) -> torch.device | None:
    if device is None:
        first = next(iter(model.parameters()), None)
        if first is None:
            first = next(iter(model.buffers()), None)
        if first is None:
            return None
        resolved = first.device
    else:
        try:
            resolved = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(
                f"device={device!r} is not a torch device; pass e.g. 'cpu', 'cuda' or None"
            ) from err
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r} is a CUDA device but CUDA is not available; pass 'cpu' or None"
            )
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def device_stage(device: torch.device | None) -> Stage:
    """The default ``stage``: every tensor of a micro-batch moved to ``device`` (None: left where it is).
    A host tensor bound for CUDA is copied from pinned memory with ``non_blocking=True``; one that is not
    pinned is first copied into a pinned buffer of just this slice (the caching host allocator recycles it
    once the asynchronous copy has read it)."""

    def move(tensor: Tensor) -> Tensor:
        if device is None or tensor.device == device:
            return tensor
        if device.type == "cuda" and tensor.device.type == "cpu":
            if not tensor.is_pinned():
                tensor = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor)
            return tensor.to(device, non_blocking=True)
        return tensor.to(device)

    return lambda part: _map(part, move)


def _device_tensors(batch: Batch) -> list[Tensor]:
    values = [batch] if isinstance(batch, Tensor) else list(batch.values())
    return [value for value in values if isinstance(value, Tensor) and value.device.type == "cuda"]


class SideStreams:
    """The side stream that stages micro-batches, one per CUDA device, made on first use and then kept.

    The caching allocator reuses a freed block only on the stream that allocated it, so a new stream per
    mini-batch would leave every earlier stream's staging blocks reserved and unusable by the next: up to
    one mini-batch's worth of micro-batch inputs per stream made, enough to push another learner sharing
    the GPU (``--gpus-per-learner 0.5``) out of memory. One stream per device, reused by every
    mini-batch, keeps the reserve at two micro-batches of input. ``factory(device)`` makes a stream
    (``torch.cuda.Stream``; a test passes a counter). Devices other than CUDA have none (None).
    """

    def __init__(self, factory: Callable[[torch.device], Any] | None = None) -> None:
        self._factory = factory or (lambda device: torch.cuda.Stream(device))
        self._streams: dict[torch.device, Any] = {}

    def get(self, device: torch.device | None) -> Any:
        """The side stream of ``device`` (made the first time), or None off CUDA."""
        if device is None or device.type != "cuda":
            return None
        if device not in self._streams:
            self._streams[device] = self._factory(device)
        return self._streams[device]

    def __len__(self) -> int:
        """How many streams were made (one per CUDA device used)."""
        return len(self._streams)


_DEFAULT_STREAMS = SideStreams()


def _stream(
    batch: Batch, bounds: list[tuple[int, int]], device: torch.device | None, stage: Stage, side: Any = None
) -> Iterator[Batch]:
    """Micro-batches ``stage(batch[lo:hi])``, each staged once the previous one was handed out.

    Micro-batch i + 1 is staged after the consumer queued micro-batch i's forward and backward and
    before it lets go of i, so two micro-batches of input exist at once, never three. On CUDA staging
    runs on the side stream ``side``: the copy (and the stage's kernels) overlap micro-batch i's compute.
    """
    if side is not None:
        # The stream outlives this mini-batch: what the compute stream queued before it (the previous
        # optimizer step, a batch the caller put on the device) comes first.
        side.wait_stream(torch.cuda.current_stream(device))

    def prefetch(lo: int, hi: int) -> Batch:
        if side is None:
            return stage(_slice(batch, lo, hi))
        with torch.cuda.stream(side):
            return stage(_slice(batch, lo, hi))

    current = prefetch(*bounds[0])
    for i in range(len(bounds)):
        if side is not None:
            compute = torch.cuda.current_stream(device)
            # Only micro-batch i's staging is queued on the side stream here, so the compute stream waits
            # for exactly that and not for the prefetch of i + 1 queued below.
            compute.wait_stream(side)
            for tensor in _device_tensors(current):
                # Allocated on the side stream but read on the compute stream: without this the allocator
                # could hand the block to a later prefetch while micro-batch i is still being computed.
                tensor.record_stream(compute)
        yield current
        # The consumer has queued micro-batch i's forward and backward; staging i + 1 overlaps with them.
        if i + 1 < len(bounds):
            current = prefetch(*bounds[i + 1])


def _warn_batchnorm_once(model: nn.Module, num_micro_batches: int) -> None:
    if num_micro_batches <= 1 or model in _BATCHNORM_WARNED:
        return
    if any(isinstance(m, BATCHNORM_TYPES) and m.training for m in model.modules()):
        _BATCHNORM_WARNED.add(model)
        logger.warning(
            "%s has BatchNorm layers in training mode: with micro-batches their statistics come from each "
            "micro-batch, not the whole mini-batch (the 'ghost batch' effect), so the gradient differs from "
            "a full-batch step; use GroupNorm (per-sample statistics) for an exact update",
            type(model).__name__,
        )


def _call_loss_fn(loss_fn: LossFn, model: nn.Module, micro_batch: Batch, lo: int, hi: int):
    out = loss_fn(model, micro_batch)
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise TypeError(
            f"loss_fn returned {type(out).__name__} for rows {lo}:{hi}; it must return (loss_sum, item_count)"
        )
    loss_sum, count = out
    if not isinstance(loss_sum, Tensor) or loss_sum.numel() != 1:
        raise TypeError(
            f"loss_fn's loss_sum for rows {lo}:{hi} is not a one-element tensor; return the SUM of the item "
            "losses as a tensor (e.g. per_item_loss.sum())"
        )
    if not loss_sum.requires_grad:
        raise ValueError(
            f"loss_fn's loss_sum for rows {lo}:{hi} does not require grad; compute it from the model's output "
            "(not under torch.no_grad()), e.g. (per_item_loss * mask).sum() even when the mask is all zero"
        )
    if isinstance(count, bool) or not isinstance(count, numbers.Integral | Tensor):
        raise TypeError(
            f"loss_fn's item_count for rows {lo}:{hi} is {count!r}; return an int or a 0-dim tensor"
        )
    return loss_sum, count


def _sum_once(loss_parts: list[Tensor], counts: list[int | Tensor]) -> tuple[float, float]:
    """Total loss and item count with one host sync: everything on the loss device is read together."""
    device = loss_parts[0].device
    loss = torch.stack([part.reshape(()).to(device, torch.float64) for part in loss_parts]).sum()
    on_device = [
        c.reshape(()).to(torch.float64) for c in counts if isinstance(c, Tensor) and c.device == device
    ]
    # CPU ints and tensors cost no device sync; a count on some other device is rare and read directly.
    elsewhere = sum(float(c) for c in counts if not (isinstance(c, Tensor) and c.device == device))
    extra = torch.stack(on_device).sum() if on_device else torch.zeros((), dtype=torch.float64, device=device)
    loss_total, count_total = torch.stack([loss, extra]).tolist()
    return loss_total, count_total + elsewhere


def _fill_missing_grads(model: nn.Module) -> None:
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)


def _run_mini_batch(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn,
    size: int,
    *,
    rows: int,
    total: int,
    device: torch.device | None,
    stage: Stage,
    side: Any = None,
) -> float:
    """One exact pass over the mini-batch in micro-batches of ``size``; returns the loss sum."""
    model.zero_grad(set_to_none=True)
    # Micro-batch row bounds: rows=37, size=16 -> [(0, 16), (16, 32), (32, 37)].
    bounds = [(lo, min(lo + size, rows)) for lo in range(0, rows, size)]
    _warn_batchnorm_once(model, len(bounds))
    loss_parts: list[Tensor] = []
    counts: list[int | Tensor] = []
    for (lo, hi), micro_batch in zip(bounds, _stream(batch, bounds, device, stage, side), strict=True):
        loss_sum, count = _call_loss_fn(loss_fn, model, micro_batch, lo, hi)
        # Dividing by the whole mini-batch's count, not by len(bounds) as the paper does, keeps every
        # item's weight at 1/total whatever the micro-batch it lands in.
        (loss_sum / total).backward()
        loss_parts.append(loss_sum.detach())
        counts.append(count)
    loss_total, count_total = _sum_once(loss_parts, counts)
    if count_total != total:
        model.zero_grad(set_to_none=True)
        raise ValueError(
            f"loss_fn reported {count_total:g} items in all, but count_items counted {total} before the first "
            "micro-batch; they must count the same items (sequences, samples or tokens). The gradients "
            "were cleared: they would have been scaled by the wrong count"
        )
    _fill_missing_grads(model)
    return loss_total


def _batchnorm_snapshot(model: nn.Module) -> list[tuple[Tensor, Tensor]]:
    return [
        (buf, buf.detach().clone())
        for module in model.modules()
        if isinstance(module, BATCHNORM_TYPES)
        for buf in module.buffers(recurse=False)
    ]


def _check_micro_batch_size(micro_batch_size: object) -> None:
    if isinstance(micro_batch_size, str) and micro_batch_size == "auto":
        return
    if (
        isinstance(micro_batch_size, bool)
        or not isinstance(micro_batch_size, numbers.Integral)
        or micro_batch_size < 1
    ):
        raise ValueError(
            f"micro_batch_size={micro_batch_size!r} is invalid; pass an int >= 1 (rows per micro-batch; "
            "more than the batch means one micro-batch) or 'auto' (the largest that fits the device)"
        )


def accumulate(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn,
    *,
    micro_batch_size: int | Literal["auto"],
    device: torch.device | str | None = None,
    count_items: Callable[[Batch], int] | None = None,
    sizer: MicroBatchSizer | None = None,
    stage: Stage | None = None,
    streams: SideStreams | None = None,
) -> float:
    """Leave in ``.grad`` the gradient of (sum of item losses / item count) over ``batch``; return that mean.

    ``batch``: a tensor or a dict of tensors, first dim = rows; split into micro-batches of
    ``micro_batch_size`` rows (the last may be smaller). ``loss_fn(model, micro_batch)`` returns
    ``(loss_sum, item_count)``: the SUM of its item losses (a tensor that requires grad) and how many
    items that is (int or 0-dim tensor). ``count_items(batch) -> int`` counts the items of the whole
    batch before the first micro-batch runs (default: ``batch["num_sequences"].sum()`` for a dict with
    that key, else the rows); the counts ``loss_fn`` reports must add up to it, else ValueError.

    Gradients: cleared first (set to None, which frees their memory for the first forward), then
    every parameter with ``requires_grad`` ends with a dense ``.grad``, zeros where the loss does not
    depend on it, so the optimizer treats the same parameters the same way whatever the split. A batch
    of 0 items (all filler rows) runs no forward, leaves all-zero gradients and returns 0.0.

    ``device``: where the micro-batches go (default: the model's device). ``stage(micro_batch)`` takes
    each slice of ``batch`` to it and returns what ``loss_fn`` reads (default ``device_stage``: every
    tensor copied there, from pinned memory and non-blocking on CUDA); it runs one micro-batch ahead, on
    CUDA on a side stream, and never more than two micro-batches of input exist at once, so ``batch``
    may be far larger than the device (keep it in pinned host memory on CUDA). The side stream comes from
    ``streams`` (default: one module-wide ``SideStreams``), one per device for every mini-batch.

    ``micro_batch_size="auto"``: start from the whole batch and halve after each
    ``torch.cuda.OutOfMemoryError`` (restarting the mini-batch, so the gradient stays exact), with
    the size remembered per model and per-sample shape in ``sizer`` (default: one module-wide sizer).
    On CPU "auto" means the whole batch. The returned mean costs one host sync at the end (plus one
    for the default count when ``num_sequences`` is already on the GPU).
    The caller steps the optimizer.
    """
    _check_accumulate_args(model, loss_fn, micro_batch_size, count_items, stage)
    rows = num_samples(batch)
    device = _resolve_device(model, device)
    stage = device_stage(device) if stage is None else stage
    counter = default_count_items if count_items is None else count_items
    total = _as_count(counter(batch), "count_items(batch)")
    if rows == 0 and total > 0:
        raise ValueError(
            f"count_items counted {total} items in a batch of 0 rows; it must count the items loss_fn sees"
        )
    if total == 0:
        # Nothing to learn from: the exact gradient of an empty mean is taken as zero.
        model.zero_grad(set_to_none=True)
        _fill_missing_grads(model)
        return 0.0

    side = (streams if streams is not None else _DEFAULT_STREAMS).get(device)

    def attempt(size: int) -> float:
        return _run_mini_batch(
            model, batch, loss_fn, size, rows=rows, total=total, device=device, stage=stage, side=side
        )

    if micro_batch_size != "auto":
        loss_total = attempt(min(int(micro_batch_size), rows))
    else:
        loss_total = _auto_sized(model, batch, attempt, sizer or _DEFAULT_SIZER)
    return loss_total / total


def _check_accumulate_args(
    model: Any, loss_fn: Any, micro_batch_size: Any, count_items: Any, stage: Any
) -> None:
    """TypeError/ValueError naming the argument of ``accumulate`` that is not what it takes, and the fix."""
    _check_micro_batch_size(micro_batch_size)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model is a {type(model).__name__}; pass a torch.nn.Module")
    if not callable(loss_fn):
        raise TypeError(
            "loss_fn is not callable; pass a function (model, micro_batch) -> (loss_sum, item_count)"
        )
    if count_items is not None and not callable(count_items):
        raise TypeError(
            "count_items is not callable; pass a function (batch) -> int, or None for the default"
        )
    if stage is not None and not callable(stage):
        raise TypeError("stage is not callable; pass a function (micro_batch) -> micro_batch, or None")


def _auto_sized(
    model: nn.Module, batch: Batch, attempt: Callable[[int], float], sizer: MicroBatchSizer
) -> float:
    """``micro_batch_size="auto"``: ``sizer`` runs ``attempt`` at the largest size that fits. A failed
    attempt may already have run some micro-batches forward; put BatchNorm's running statistics back so
    the retry leaves the model as one successful pass would."""
    snapshot = _batchnorm_snapshot(model)

    def undo() -> None:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for live, saved in snapshot:
                live.copy_(saved)

    return sizer.run(model, batch, attempt, on_oom=undo)
