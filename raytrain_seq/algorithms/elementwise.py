"""AAVG's elementwise merge rules on numpy arrays: what an averaging shard applies to its slice.

Every rule of the averaging arithmetic is elementwise: the weighted mean (floating weights, Adam's
moments), the law-of-total-variance merge of a (mean, variance) pair (BatchNorm's running statistics,
AAVG Algorithm 2) and AMSGrad's elementwise max. So a shard merges any slice of the learners' flat
buffers alone (``dataplane.merge``). Here that arithmetic runs on numpy arrays, so that a shard's process
imports no torch; ``averaging`` applies the same arithmetic to tensors on any device, for whole state
dicts. Both accumulate in ``accumulation_dtype`` (float32 for float32 and narrower buffers, float64 for
float64 ones), round each weight and each weighted term before adding it (no fused multiply-add), and
cast back once, so they give the same bits: ``tests/test_elementwise.py`` compares the two, and
``tests/test_payload.py`` a sharded merge with ``averaging.average_states``.

Weights: one number per learner, finite and >= 0, not all 0 (``normalised_weights``), normalised to sum to
one; a learner of weight 0 is out of the round, and even its nan or inf must not leak into the result.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["accumulation_dtype", "merge_mean_var", "normalised_weights", "weighted_max", "weighted_mean"]

ACC = np.float64  # the weights' dtype, and the accumulation dtype of float64 and integer buffers


def normalised_weights(weights: Any, count: int) -> np.ndarray:
    """Validated learner weights as a float64 vector summing to one; None = equal weights."""
    if count == 0:
        raise ValueError("states is empty: pass a list with one state per learner (at least one)")
    if weights is None:
        return np.full(count, 1.0 / count, dtype=ACC)
    try:
        values = [float(x) for x in weights]
    except (TypeError, ValueError) as exc:
        raise TypeError(f"weights must be numbers, got {weights!r}: pass one number per learner") from exc
    if len(values) != count:
        raise ValueError(f"{len(values)} weights for {count} states: pass one weight per learner")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"weights must be finite, got {values}: replace nan/inf or drop the learner")
    if any(v < 0 for v in values):
        raise ValueError(f"weights must be >= 0, got {values}: use 0 to leave a learner out")
    total = math.fsum(values)
    if total <= 0:
        raise ValueError(f"weights sum to {total}: give at least one learner a weight > 0")
    return np.asarray(values, dtype=ACC) / total


def accumulation_dtype(dtype: Any) -> np.dtype:
    """The dtype a weighted sum of ``dtype`` values is accumulated in: float64 for float64 and integers,
    float32 for float32 and narrower floats (float16; bfloat16 travels as float32). Why not float64 for
    all: a shard's merge of float32 slices is then compute-bound, the widening and the float64 passes
    making it markedly slower than the same merge in float32 (docs/ARCHITECTURE.md, "Measurements behind the code"). What float32 costs: the sum is
    written as x_k + sum_j w_j (x_j - x_k), so its rounding errors scale with the learners' differences;
    against the float64 mean it stays within (learners + 1) ulps of the largest learner's value, the
    bound of any float32 sum such as DDP's all-reduce (``tests/test_elementwise.py`` measures it)."""
    dtype = np.dtype(dtype)
    return np.dtype(ACC) if dtype == ACC or dtype.kind in "iu" else np.dtype(np.float32)


def _check_alike(arrays: Sequence[Any], where: str) -> None:
    first = arrays[0]
    for j, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{where}: learner {j} holds a {type(a).__name__}; pass numpy arrays only")
        if a.shape != first.shape or a.dtype != first.dtype:
            raise ValueError(
                f"{where}: learner {j} has {a.dtype} {a.shape} but learner 0 has {first.dtype} {first.shape}; "
                "only slices of the same buffer can be merged"
            )
        if a.dtype.kind not in "fiu":
            raise TypeError(f"{where}: {a.dtype} arrays unsupported; pass real numbers")


def _accumulate(
    arrays: Sequence[np.ndarray],
    w: np.ndarray,
    workspace: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """sum_j w_j x_j in ``accumulation_dtype``, written as x_k + sum_j w_j (x_j - x_k) with x_k the first
    learner of weight > 0: learners that agree give back exactly x_k (three times x/3 is not always x).
    Narrower arrays are widened first (exact); each weight is rounded to the accumulation dtype once, each
    term w_j d_j is rounded before it is added (no fused multiply-add), so ``averaging``'s torch
    arithmetic gives the same bits. ``workspace``: [2, >= size] in the accumulation dtype, holding the sum
    and the scratch (and the widened base, in a third row, for narrower arrays); ``out``: of the
    accumulation dtype, written with the result (else the result is a new array, or a view into the
    workspace)."""
    kept = [(wj, a) for wj, a in zip(w.tolist(), arrays, strict=True) if wj > 0]
    first = kept[0][1]
    acc_dtype = accumulation_dtype(first.dtype)
    rows = 2 if first.dtype == acc_dtype else 3
    if workspace is None:
        workspace = np.empty((rows, first.size), dtype=acc_dtype)
    acc, scratch = (workspace[i, : first.size].reshape(first.shape) for i in range(2))
    if first.dtype == acc_dtype:
        base = first  # only read
    else:
        base = workspace[2, : first.size].reshape(first.shape)
        base[...] = first
    result = acc if out is None else out
    if len(kept) == 1:
        result[...] = base
        return result
    for j, (wj, a) in enumerate(kept[1:]):
        wj = acc_dtype.type(wj)
        if a.dtype == acc_dtype:
            np.subtract(a, base, out=scratch)
        else:
            scratch[...] = a
            np.subtract(scratch, base, out=scratch)
        if j == 0:
            np.multiply(scratch, wj, out=acc)
        else:
            np.add(acc, np.multiply(scratch, wj, out=scratch), out=acc)
    return np.add(acc, base, out=result)


def weighted_mean(
    arrays: Sequence[np.ndarray],
    weights: Any = None,
    *,
    out: np.ndarray | None = None,
    workspace: np.ndarray | None = None,
) -> np.ndarray:
    """sum_j w_j x_j of same-shape arrays (weights normalised to sum to one), accumulated in
    ``accumulation_dtype`` and cast back to the first array's dtype; ``out``: written with the result
    instead of a new array. ``workspace``: scratch of the accumulation dtype and shape [3, >= size],
    reused across calls (merging chunk after chunk)."""
    w = normalised_weights(weights, len(arrays))
    _check_alike(list(arrays), "weighted_mean")
    size = arrays[0].size
    acc_dtype = accumulation_dtype(arrays[0].dtype)
    if workspace is not None and (
        workspace.dtype != acc_dtype
        or workspace.ndim != 2
        or workspace.shape[0] < 3
        or workspace.shape[1] < size
    ):
        raise ValueError(
            f"workspace must be a {acc_dtype} array of shape [3, >= {size}] for {arrays[0].dtype} arrays, "
            f"got {workspace.dtype} {workspace.shape}"
        )
    if out is not None and out.dtype == acc_dtype:
        return _accumulate(arrays, w, workspace, out=out)
    mean = _accumulate(arrays, w, workspace)
    if out is None:
        return mean.astype(arrays[0].dtype)
    out[...] = mean
    return out


def merge_mean_var(
    means: Sequence[np.ndarray], variances: Sequence[np.ndarray], weights: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """Pool per-learner (mean, centred variance) pairs by the law of total variance:
    m = sum_j w_j m_j and v = sum_j w_j v_j + sum_j w_j (m_j - m)^2 (``averaging.merge_mean_var`` says why
    this form, and not E[x^2] - E[x]^2). Results keep the first learner's dtypes."""
    if len(means) != len(variances):
        raise ValueError(f"{len(means)} means, {len(variances)} variances: pass one pair per learner")
    w = normalised_weights(weights, len(means))
    _check_alike(list(means) + list(variances), "merge_mean_var")
    mean = _accumulate(means, w)
    acc_dtype = mean.dtype
    between = np.zeros_like(mean)
    for wj, m in zip(w.tolist(), means, strict=True):
        if wj:  # (m_j - m) is exactly zero when the learners agree, so equal inputs come back unchanged
            gap = np.subtract(m, mean, dtype=acc_dtype)
            np.multiply(gap, gap, out=gap)
            np.add(between, np.multiply(gap, acc_dtype.type(wj), out=gap), out=between)
    var = np.add(_accumulate(variances, w), between)
    return mean.astype(means[0].dtype), var.astype(variances[0].dtype)


def weighted_max(arrays: Sequence[np.ndarray], weights: Any = None) -> np.ndarray:
    """Elementwise max over the arrays of learners with weight > 0 (AMSGrad's max_exp_avg_sq rule)."""
    w = normalised_weights(weights, len(arrays))
    _check_alike(list(arrays), "weighted_max")
    kept = [a for a, wj in zip(arrays, w.tolist(), strict=True) if wj > 0]
    return functools.reduce(np.maximum, kept[1:], np.array(kept[0], copy=True))
