"""AAVG's elementwise merge rules on numpy arrays: what an averaging shard applies to its slice.

Every rule of the averaging arithmetic is elementwise: the weighted mean (floating weights, Adam's
moments), the law-of-total-variance merge of a (mean, variance) pair (BatchNorm's running statistics,
AAVG Algorithm 2) and AMSGrad's elementwise max. So a shard merges any slice of the learners' flat
buffers alone (``elastic.merge``). Here that arithmetic runs on numpy arrays, so that a shard's process
imports no torch; ``averaging`` applies the same arithmetic to tensors on any device, for whole state
dicts. Both accumulate in float64, round each weighted term before adding it (no fused multiply-add), and
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

__all__ = ["merge_mean_var", "normalised_weights", "weighted_max", "weighted_mean"]

ACC = np.float64  # the accumulation dtype of every weighted sum


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


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 values in ``dtype``, rounded as torch rounds them: torch casts float64 to float16 through
    float32 (two roundings, which now and then differ from numpy's direct cast in the last bit)."""
    if dtype == np.float16:
        return values.astype(np.float32).astype(np.float16)
    return values.astype(dtype)


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
    arrays: Sequence[np.ndarray], w: np.ndarray, workspace: np.ndarray | None = None
) -> np.ndarray:
    """sum_j w_j x_j in float64, written as x_k + sum_j w_j (x_j - x_k) with x_k the first learner of
    weight > 0: learners that agree give back exactly x_k (three times x/3 is not always x). Each x_j is
    widened into a float64 scratch (exact), the first term is written rather than added to zeros, and each
    later term is rounded before it is added. ``workspace``: float64 [3, >= size] holding the base, the sum
    and the scratch; the result is then a view into it."""
    kept = [(wj, a) for wj, a in zip(w.tolist(), arrays, strict=True) if wj > 0]
    first = kept[0][1]
    if workspace is None:
        base = first.astype(ACC)
        acc = np.empty_like(base)
        scratch = np.empty_like(base) if len(kept) > 1 else None
    else:
        base, acc, scratch = (workspace[i, : first.size].reshape(first.shape) for i in range(3))
        base[...] = first
    if len(kept) == 1:
        acc[...] = base
        return acc
    for j, (wj, a) in enumerate(kept[1:]):
        scratch[...] = a
        np.subtract(scratch, base, out=scratch)
        if j == 0:
            np.multiply(scratch, wj, out=acc)
        else:
            np.add(acc, np.multiply(scratch, wj, out=scratch), out=acc)
    return np.add(acc, base, out=acc)


def weighted_mean(
    arrays: Sequence[np.ndarray],
    weights: Any = None,
    *,
    out: np.ndarray | None = None,
    workspace: np.ndarray | None = None,
) -> np.ndarray:
    """sum_j w_j x_j of same-shape arrays (weights normalised to sum to one), accumulated in float64 and
    cast back to the first array's dtype; ``out``: written with the result instead of a new array.
    ``workspace``: float64 scratch of shape [3, >= size], reused across calls (merging chunk after chunk)."""
    w = normalised_weights(weights, len(arrays))
    _check_alike(list(arrays), "weighted_mean")
    size = arrays[0].size
    if workspace is not None and (
        workspace.dtype != ACC or workspace.ndim != 2 or workspace.shape[0] < 3 or workspace.shape[1] < size
    ):
        raise ValueError(
            f"workspace must be a float64 array of shape [3, >= {size}], got {workspace.dtype} {workspace.shape}"
        )
    mean = _accumulate(arrays, w, workspace)
    if out is None:
        return _cast(mean, arrays[0].dtype)
    # In place for float32 and float64 (the same rounding as astype); float16 goes through _cast.
    out[...] = _cast(mean, out.dtype) if out.dtype == np.float16 else mean
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
    between = np.zeros_like(mean)
    for wj, m in zip(w.tolist(), means, strict=True):
        if wj:  # (m_j - m) is exactly zero when the learners agree, so equal inputs come back unchanged
            gap = np.subtract(m, mean, dtype=ACC)
            np.multiply(gap, gap, out=gap)
            np.add(between, np.multiply(gap, wj, out=gap), out=between)
    var = np.add(_accumulate(variances, w), between)
    return _cast(mean, means[0].dtype), _cast(var, variances[0].dtype)


def weighted_max(arrays: Sequence[np.ndarray], weights: Any = None) -> np.ndarray:
    """Elementwise max over the arrays of learners with weight > 0 (AMSGrad's max_exp_avg_sq rule)."""
    w = normalised_weights(weights, len(arrays))
    _check_alike(list(arrays), "weighted_max")
    kept = [a for a, wj in zip(arrays, w.tolist(), strict=True) if wj > 0]
    return functools.reduce(np.maximum, kept[1:], np.array(kept[0], copy=True))
