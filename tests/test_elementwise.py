"""The numpy merge rules (``elementwise``, what a shard runs) give the bits of ``averaging``'s torch rules,
and a shard's process loads no torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from raytrain_seq.algorithms import averaging, elementwise


def _learners(count: int, dtype, seed: int, size: int = 20_000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # Magnitudes from 1e-4 to 1e3 (to 1e1 in float16, whose squares must stay finite), so that every
    # term's rounding matters somewhere.
    top = 1 if dtype == np.float16 else 3
    return [
        (rng.standard_normal(size) * 10.0 ** rng.uniform(-4, top, size)).astype(dtype) for _ in range(count)
    ]


def _torch(arrays: list[np.ndarray]) -> list[torch.Tensor]:
    return [torch.from_numpy(a.copy()) for a in arrays]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("weights", [None, [1.0], [3.0, 7.0], [30.0, 50.0, 20.0], [1.0, 0.0, 2.0, 5.0, 0.5]])
def test_numpy_rules_equal_the_torch_rules_bit_for_bit(dtype, weights):
    count = 3 if weights is None else len(weights)
    means = _learners(count, dtype, seed=count)
    variances = [np.abs(v) for v in _learners(count, dtype, seed=count + 10)]

    mean = elementwise.weighted_mean(means, weights)
    assert mean.dtype == dtype
    np.testing.assert_array_equal(mean, averaging.weighted_mean(_torch(means), weights).numpy())

    m, v = elementwise.merge_mean_var(means, variances, weights)
    tm, tv = averaging.merge_mean_var(_torch(means), _torch(variances), weights)
    np.testing.assert_array_equal(m, tm.numpy())
    np.testing.assert_array_equal(v, tv.numpy())

    np.testing.assert_array_equal(
        elementwise.weighted_max(variances, weights),
        averaging.weighted_max(_torch(variances), weights).numpy(),
    )


def test_the_comparison_can_fail_a_fused_multiply_add_rounds_differently():
    """Not vacuous: torch's ``add_(alpha=)`` (one rounding per term) gives other bits than the rules'
    product-then-sum in some elements of a three-learner float32 mean, which the test above would catch."""
    arrays, weights = _learners(3, np.float32, seed=3), [30.0, 50.0, 20.0]
    w = torch.tensor(weights, dtype=torch.float64) / 100.0
    x = [torch.from_numpy(a).double() for a in arrays]
    fused = (x[1] - x[0]).mul_(w[1].item())
    fused.add_(x[2] - x[0], alpha=w[2].item())
    fused = fused.add_(x[0]).float().numpy()
    assert (fused != elementwise.weighted_mean(arrays, weights)).sum() > 0


def test_a_learner_of_weight_0_is_out_even_with_nan():
    a, b = np.ones(4, np.float32), np.full(4, np.nan, np.float32)
    np.testing.assert_array_equal(elementwise.weighted_mean([a, b], [1.0, 0.0]), a)
    np.testing.assert_array_equal(elementwise.weighted_max([b, a], [0.0, 2.0]), a)
    m, v = elementwise.merge_mean_var([a, b], [a, b], [1.0, 0.0])
    np.testing.assert_array_equal(m, a)
    np.testing.assert_array_equal(v, a)


def test_equal_learners_come_back_unchanged_and_out_and_workspace_give_the_same_bits():
    x = _learners(1, np.float32, seed=1)[0]
    np.testing.assert_array_equal(elementwise.weighted_mean([x, x, x], [1.0, 1.0, 1.0]), x)
    arrays = _learners(4, np.float32, seed=4, size=1000)
    weights = [1.0, 2.0, 3.0, 4.0]
    for dtype in (np.float32, np.float16):
        arrays = [a.astype(dtype) for a in arrays]
        out = np.empty(1000, dtype)
        workspace = np.full((3, 400), np.nan, np.float32)  # stale values must not leak in
        for lo in range(0, 1000, 400):  # chunk by chunk, as merge_parts does
            elementwise.weighted_mean(
                [a[lo : lo + 400] for a in arrays], weights, out=out[lo : lo + 400], workspace=workspace
            )
        np.testing.assert_array_equal(out, elementwise.weighted_mean(arrays, weights))


@pytest.mark.parametrize("count", [2, 3, 5, 8])
def test_a_float32_mean_is_within_a_few_ulps_of_the_float64_one(count):
    """float32 and narrower learners are accumulated in float32 (``accumulation_dtype``). The error is
    that of a float32 sum: against the float64 mean, at most (learners + 1) ulps of the largest learner's
    value in that element, and a float16 mean within one ulp (half an ulp, but for rounding twice, through
    float32). Values across seven decades, independent per learner, make it a worst case: learners that
    averaged before differ by far less than their values."""
    weights = list(range(1, count + 1))
    for dtype, bound in ((np.float32, count + 1), (np.float16, 1.0)):
        xs = _learners(count, dtype, seed=count, size=50_000)
        w = np.asarray(weights, np.float64) / sum(weights)
        exact = sum(wj * x.astype(np.float64) for wj, x in zip(w, xs, strict=True))
        got = elementwise.weighted_mean(xs, weights)
        assert got.dtype == dtype
        largest = np.max(np.abs(np.stack(xs)), axis=0)
        error = np.abs(got.astype(np.float64) - exact) / np.spacing(largest).astype(np.float64)
        assert error.max() <= bound
        assert error.max() > 0  # not vacuous: these inputs do round
    assert elementwise.accumulation_dtype(np.float64) == np.float64
    assert elementwise.accumulation_dtype(np.int64) == np.float64
    assert elementwise.accumulation_dtype(np.float16) == np.float32


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a: elementwise.weighted_mean(a, [1.0]), r"1 weights for 2 states"),
        (lambda a: elementwise.weighted_mean(a, [1.0, -1.0]), r"weights must be >= 0"),
        (lambda a: elementwise.weighted_mean(a, [1.0, float("nan")]), r"weights must be finite"),
        (lambda a: elementwise.weighted_mean(a, [0.0, 0.0]), r"weights sum to 0"),
        (lambda a: elementwise.weighted_mean(a, ["x", 1]), r"weights must be numbers"),
        (lambda a: elementwise.weighted_mean([a[0], a[1][:2]]), r"learner 1 has float32 \(2,\)"),
        (lambda a: elementwise.weighted_mean([a[0], a[1].astype(np.float64)]), r"learner 1 has float64"),
        (lambda a: elementwise.weighted_mean([a[0], list(a[1])]), r"pass numpy arrays only"),
        (lambda a: elementwise.weighted_mean(a, workspace=np.empty((3, 2))), r"workspace must be"),
        (lambda a: elementwise.merge_mean_var(a, a[:1]), r"2 means, 1 variances"),
        (lambda a: elementwise.weighted_max([]), r"states is empty"),
    ],
)
def test_bad_input_is_named(call, message):
    arrays = [np.ones(3, np.float32), np.zeros(3, np.float32)]
    with pytest.raises((ValueError, TypeError), match=message):
        call(arrays)


def test_a_shard_process_loads_no_torch():
    """``runtime.shards`` (the shard actor's module, which Ray imports in the shard's process) and the
    merge it runs import numpy, not torch."""
    code = (
        "import sys, numpy as np\n"
        "import raytrain_seq.runtime.shards\n"
        "from raytrain_seq.dataplane.merge import merge_parts\n"
        "merge_parts([{'mean/float32': np.ones(8, np.float32)}] * 2, [1.0, 1.0])\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
