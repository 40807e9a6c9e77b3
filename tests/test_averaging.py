"""AAVG arithmetic: weighted state averaging, Adam-state merging and flat states."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from raytrain_seq.algorithms.averaging import (
    average_states,
    flatten_state,
    merge_adam_states,
    merge_mean_var,
    unflatten_state,
    weighted_mean,
)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _t(array: np.ndarray, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.from_numpy(np.asarray(array, dtype=np.float64)).to(dtype)


# ------------------------------------------------------------------------------------------ average_states
def test_weighted_mean_matches_numpy():
    """average_states is the weighted mean np.average(..., weights) key by key (weights normalised)."""
    rng = _rng(1)
    shapes = {"a.weight": (4, 3), "a.bias": (4,), "scalar": ()}
    arrays = [{k: rng.normal(size=s) for k, s in shapes.items()} for _ in range(4)]
    weights = [1.0, 2.0, 3.0, 0.5]
    states = [{k: _t(v) for k, v in learner.items()} for learner in arrays]
    out = average_states(states, weights)
    for key in shapes:
        ref = np.average(np.stack([learner[key] for learner in arrays]), axis=0, weights=weights)
        np.testing.assert_allclose(out[key].numpy(), ref, rtol=1e-13, atol=1e-15)
        plain = np.mean(np.stack([learner[key] for learner in arrays]), axis=0)
        assert not np.allclose(ref, plain), "the weights must matter for this test to mean anything"
    equal = average_states(states)
    np.testing.assert_allclose(
        equal["a.weight"].numpy(), np.mean([a["a.weight"] for a in arrays], axis=0), rtol=1e-13
    )


def test_weighted_mean_with_a_reused_workspace_is_bit_identical():
    """A workspace reused chunk after chunk gives the same bits as fresh temporaries, weight-0 learners
    and learners that agree included; a workspace of the wrong dtype, rank or length is refused."""
    rng = _rng(2)
    learners = [torch.from_numpy(rng.normal(size=1000).astype(np.float32)) for _ in range(3)]
    learners[2][:10] = math.nan  # weight 0: left out
    weights = [0.3, 0.7, 0.0]
    # Float32 learners accumulate in float32; stale values must not leak in.
    workspace = torch.full((3, 400), math.nan)
    out = torch.empty(1000, dtype=torch.float32)
    for lo in range(0, 1000, 400):
        chunk = [t[lo : lo + 400] for t in learners]
        weighted_mean(chunk, weights, out=out[lo : lo + 400], workspace=workspace)
    fresh = weighted_mean(learners, weights)
    assert torch.equal(out, fresh) and not torch.isnan(out).any()
    same = [learners[0], learners[0].clone()]
    assert torch.equal(weighted_mean(same, [1, 2], workspace=torch.empty(3, 1000)), same[0])
    for bad in (
        torch.empty(3, 999),
        torch.empty(3, 1000, dtype=torch.float64),
        torch.empty(3000),
    ):
        with pytest.raises(ValueError, match=r"workspace must be a torch\.float32 tensor of shape"):
            weighted_mean(learners, weights, workspace=bad)


def test_dtypes_kept_int_buffers_from_first():
    """Each tensor keeps its dtype and device; int/bool buffers are copied from learner 0 even if they differ."""
    rng = _rng(2)
    raw = [rng.normal(size=(3, 5)) for _ in range(3)]
    states = [
        {
            "h": _t(x, torch.float16),
            "b": _t(x, torch.bfloat16),
            "d": _t(x, torch.float64),
            "bn.num_batches_tracked": torch.tensor(10 + j, dtype=torch.int64),
            "mask": torch.tensor([j % 2 == 0, True]),
        }
        for j, x in enumerate(raw)
    ]
    out = average_states(states)
    for key, state in states[0].items():
        assert out[key].dtype == state.dtype and out[key].device == state.device, key
    for key, dtype in (("h", torch.float16), ("b", torch.bfloat16)):
        # Accumulated in float32 and rounded to the low precision: within one of its ulps of the exact
        # mean of the values each learner really holds (half an ulp, but for rounding twice).
        held = np.stack([s[key].double().numpy() for s in states])
        exact = torch.from_numpy(held.mean(axis=0))
        ulp = torch.finfo(dtype).eps * exact.abs()
        assert ((out[key].double() - exact).abs() <= ulp).all(), key
    np.testing.assert_allclose(out["d"].numpy(), np.mean(raw, axis=0), rtol=1e-14)
    assert out["bn.num_batches_tracked"].item() == 10  # learners hold 10, 11, 12: no mean
    assert out["mask"].tolist() == [True, True]


_DEVICES = [
    "meta",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


@pytest.mark.parametrize("device", _DEVICES)
def test_device_kept(device):
    """Results stay on the learners' device (meta stands in for an accelerator on CPU-only machines)."""
    states = [
        {
            "w": torch.ones(2, 3, dtype=torch.bfloat16, device=device) * (j + 1),
            "bn.running_mean": torch.full((3,), float(j), device=device),
            "bn.running_var": torch.ones(3, device=device),
            "bn.num_batches_tracked": torch.tensor(j, device=device),
        }
        for j in range(2)
    ]
    out = average_states(states)
    for key, tensor in states[0].items():
        assert out[key].device == tensor.device and out[key].dtype == tensor.dtype, key
    if device != "meta":
        assert torch.all(out["w"] == 1.5) and torch.all(out["bn.running_var"] == 1.25)


def _pooled_bn_states(sizes, rng):
    """Per-learner data with different means, summarised as BatchNorm running stats (population var)."""
    data = [rng.normal(loc=3.0 * j, scale=1.0 + j, size=(n, 4)) for j, n in enumerate(sizes)]
    states = [
        {
            "bn.weight": _t(np.ones(4)),
            "bn.running_mean": _t(x.mean(axis=0)),
            "bn.running_var": _t(x.var(axis=0)),
            "bn.num_batches_tracked": torch.tensor(7),
        }
        for x in data
    ]
    return data, states


def test_bn_running_var_is_variance_of_pooled_data():
    """running_var merges by total variance: equal-size samples give np.var of the concatenated data."""
    data, states = _pooled_bn_states([50, 50, 50], _rng(3))
    out = average_states(states)
    pooled = np.concatenate(data)
    np.testing.assert_allclose(out["bn.running_mean"].numpy(), pooled.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(out["bn.running_var"].numpy(), pooled.var(axis=0), rtol=1e-12)
    plain = np.mean([x.var(axis=0) for x in data], axis=0)
    assert np.all(pooled.var(axis=0) > 1.5 * plain), "the plain mean must be clearly wrong here"


def test_bn_weighted_by_sample_counts_and_algorithm2_literal():
    """Weights proportional to sample counts pool unequal samples; equals Algorithm 2's z/P - m^2 form."""
    sizes = [20, 50, 130]
    data, states = _pooled_bn_states(sizes, _rng(4))
    out = average_states(states, weights=sizes)
    pooled = np.concatenate(data)
    np.testing.assert_allclose(out["bn.running_var"].numpy(), pooled.var(axis=0), rtol=1e-12)
    # Algorithm 2 lines 1, 3, 6 written out literally with equal weights
    m = np.stack([x.mean(axis=0) for x in data])
    v = np.stack([x.var(axis=0) for x in data])
    z = v + m**2
    mean, var = merge_mean_var([_t(r) for r in m], [_t(r) for r in v])
    np.testing.assert_allclose(mean.numpy(), m.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(var.numpy(), z.mean(axis=0) - m.mean(axis=0) ** 2, rtol=1e-10)


def test_equal_states_come_back_exactly():
    """Averaging identical states (any weights, any dtype, BN pairs included) changes no bit."""
    rng = _rng(5)
    base = {
        "w16": _t(rng.normal(size=300), torch.float16),
        "wbf": _t(rng.normal(size=300), torch.bfloat16),
        "w32": _t(rng.normal(size=300), torch.float32),
        "w64": _t(rng.normal(size=300)),
        "bn.running_mean": _t(rng.normal(size=300), torch.float32),
        "bn.running_var": _t(rng.uniform(0.1, 2.0, size=300), torch.float32),
        "bn.num_batches_tracked": torch.tensor(3),
    }
    for weights in ([0.2, 0.7, 0.1], [1.0] * 7):
        out = average_states([copy.deepcopy(base) for _ in weights], weights)
        for key, tensor in base.items():
            assert torch.equal(out[key], tensor), key
        # guard: the plain weighted sum sum_j w_j x_j really rounds away from x for these weights
        w = torch.tensor(weights, dtype=torch.float64) / sum(weights)
        naive = torch.tensordot(w, torch.stack([base["w64"]] * len(weights)), dims=1)
        assert not torch.equal(naive, base["w64"])


def test_average_states_rejects_mismatches_and_bad_weights():
    """Different keys/shapes/dtypes name the key and learner; bad weights name the problem and the fix."""
    good = {"a": torch.zeros(2), "b": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"learner 1.*missing \['b'\]"):
        average_states([good, {"a": torch.zeros(2)}])
    with pytest.raises(ValueError, match=r"key 'b': learner 2 has shape \(4,\)"):
        average_states([good, good, {"a": torch.zeros(2), "b": torch.zeros(4)}])
    with pytest.raises(ValueError, match=r"key 'a': learner 1 has dtype torch.float64"):
        average_states([good, {"a": torch.zeros(2, dtype=torch.float64), "b": torch.zeros(3)}])
    for weights, pattern in (
        ([1.0], "one weight per learner"),
        ([1.0, float("nan")], "finite"),
        ([1.0, -1.0], ">= 0"),
        ([0.0, 0.0], "weight > 0"),
    ):
        with pytest.raises(ValueError, match=pattern):
            average_states([good, good], weights)
    with pytest.raises(ValueError, match="states is empty"):
        average_states([])
    with pytest.raises(TypeError, match="list of state dicts"):
        average_states(good)


# -------------------------------------------------------------------------------------- merge_adam_states
def _train_learners(opt_cls, *, learners=3, steps=3, **kw):
    """Learners from one initial model, each a few optimizer steps on its own data."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    models, opts = [], []
    for j in range(learners):
        model = copy.deepcopy(base)
        opt = opt_cls(model.parameters(), lr=1e-2, **kw)
        gen = torch.Generator().manual_seed(100 + j)
        for _ in range(steps):
            x = torch.randn(16, 5, generator=gen) + j
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        models.append(model)
        opts.append(opt)
    return base, models, opts


@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.AdamW])
def test_merge_real_adam_states_and_load(opt_cls):
    """exp_avg/exp_avg_sq become the learners' means, step is kept, and a fresh optimizer loads and steps."""
    base, _, opts = _train_learners(opt_cls)
    states = [opt.state_dict()["state"] for opt in opts]
    merged = merge_adam_states(states)
    assert sorted(merged) == sorted(states[0])
    for index, entry in merged.items():
        for key in ("exp_avg", "exp_avg_sq"):
            held = np.stack([s[index][key].double().numpy() for s in states])
            assert not np.allclose(held[0], held[1]), "learners must really differ"
            # A float32 sum: within a few ulps of the learners' largest value (elementwise.accumulation_dtype).
            ulp = np.spacing(np.abs(held).max(axis=0).astype(np.float32))
            assert (np.abs(entry[key].numpy() - held.mean(axis=0)) <= 3 * ulp).all()
            assert entry[key].dtype == states[0][index][key].dtype
        assert isinstance(entry["step"], torch.Tensor) and entry["step"].item() == 3
        assert entry["step"].dtype == states[0][index]["step"].dtype
    model = copy.deepcopy(base)
    fresh = opt_cls(model.parameters(), lr=1e-2)
    fresh.load_state_dict({"state": merged, "param_groups": opts[0].state_dict()["param_groups"]})
    fresh.zero_grad()
    model(torch.randn(4, 5)).pow(2).mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    # cloned first: load_state_dict keeps the merged tensors, and the step updates them in place
    before = {index: entry["exp_avg"].clone() for index, entry in merged.items()}
    fresh.step()
    beta1 = fresh.param_groups[0]["betas"][0]
    for index, p in enumerate(model.parameters()):
        state = fresh.state[p]
        assert state["step"].item() == 4
        expected = beta1 * before[index] + (1 - beta1) * grads[index]
        torch.testing.assert_close(state["exp_avg"], expected)


def test_amsgrad_takes_the_max_over_weighted_learners():
    """max_exp_avg_sq is the elementwise max over learners with weight > 0 and stays >= exp_avg_sq."""
    _, _, opts = _train_learners(torch.optim.Adam, amsgrad=True)
    states = [opt.state_dict()["state"] for opt in opts]
    merged = merge_adam_states(states)
    for index, entry in merged.items():
        held = torch.stack([s[index]["max_exp_avg_sq"] for s in states])
        assert torch.equal(entry["max_exp_avg_sq"], held.amax(dim=0))
        assert not torch.allclose(held.amax(dim=0), held.mean(dim=0)), "max and mean must differ here"
        assert torch.all(entry["max_exp_avg_sq"] >= entry["exp_avg_sq"])
    kept = merge_adam_states(states, weights=[1, 1, 0])
    dropped = [i for i in merged if not torch.equal(merged[i]["max_exp_avg_sq"], kept[i]["max_exp_avg_sq"])]
    assert dropped, "learner 2 must hold the max somewhere for the zero-weight case to be tested"
    for index in kept:
        two = torch.stack([s[index]["max_exp_avg_sq"] for s in states[:2]]).amax(dim=0)
        assert torch.equal(kept[index]["max_exp_avg_sq"], two)


def _entry(step, rng, **extra):
    return {"step": step, "exp_avg": _t(rng.normal(size=3)), "exp_avg_sq": _t(rng.uniform(size=3)), **extra}


def test_step_mismatch_and_missing_keys_raise():
    """Different steps, param indices or keys raise ValueError naming the param index and what differs."""
    rng = _rng(6)
    states = [{0: _entry(torch.tensor(4.0), rng), 1: _entry(torch.tensor(4.0), rng)} for _ in range(3)]
    states[2][1]["step"] = torch.tensor(5.0)
    with pytest.raises(ValueError, match=r"param 1: step differs across learners \[4.0, 4.0, 5.0\]"):
        merge_adam_states(states)
    states[2][1]["step"] = torch.tensor(4.0)
    del states[2][1]["exp_avg_sq"]
    with pytest.raises(ValueError, match=r"param 1 state keys: learner 2 .*missing \['exp_avg_sq'\]"):
        merge_adam_states(states)
    with pytest.raises(ValueError, match=r"param indices: learner 1 .*missing \['1'\]"):
        merge_adam_states([{0: _entry(1, rng), 1: _entry(1, rng)}, {0: _entry(1, rng)}])
    plain = merge_adam_states([{0: _entry(7, rng)}, {0: _entry(7, rng)}])
    assert plain[0]["step"] == 7 and type(plain[0]["step"]) is int


def test_unknown_float_state_raises_and_other_values_copied():
    """An unknown floating key raises with the centred_pairs hint; agreeing non-float values are copied."""
    rng = _rng(7)
    with pytest.raises(ValueError, match=r"param 0 key 'momentum_buffer'.*centred_pairs"):
        merge_adam_states([{0: _entry(1, rng, momentum_buffer=_t(np.ones(3)))} for _ in range(2)])
    merged = merge_adam_states([{0: _entry(1, rng, tag="x", count=torch.tensor(3))} for _ in range(2)])
    assert merged[0]["tag"] == "x" and merged[0]["count"].item() == 3
    with pytest.raises(ValueError, match="learner 1 has 'y'"):
        merge_adam_states([{0: _entry(1, rng, tag="x")}, {0: _entry(1, rng, tag="y")}])


def test_centred_pairs_merge_matches_pooled_gradients():
    """A (mean, centred var) pair in centred_pairs merges to the pooled data's mean and np.var."""
    rng = _rng(8)
    grads = [rng.normal(loc=j, scale=0.5 + j, size=(40, 6)) for j in range(3)]
    states = [
        {0: _entry(torch.tensor(2.0), rng, g_mean=_t(g.mean(axis=0)), g_var=_t(g.var(axis=0)))} for g in grads
    ]
    merged = merge_adam_states(states, centred_pairs=[("g_mean", "g_var")])
    pooled = np.concatenate(grads)
    np.testing.assert_allclose(merged[0]["g_mean"].numpy(), pooled.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(merged[0]["g_var"].numpy(), pooled.var(axis=0), rtol=1e-12)
    assert not np.allclose(np.mean([g.var(axis=0) for g in grads], axis=0), pooled.var(axis=0))
    with pytest.raises(ValueError, match="only half present"):
        merge_adam_states(states, centred_pairs=[("g_mean", "g_other")])
    with pytest.raises(ValueError, match="merged already"):
        merge_adam_states(states, centred_pairs=[("exp_avg", "g_var")])


# ------------------------------------------------------------------------------------------- flat states
def test_flatten_unflatten_round_trip():
    """unflatten_state(*flatten_state(s)) restores every key, order, dtype and value exactly."""
    rng = _rng(9)
    state = {
        "h": _t(rng.normal(size=(2, 3)), torch.float16),
        "count": torch.tensor(2**40 + 1),
        "b": _t(rng.normal(size=3), torch.bfloat16),
        "f": _t(rng.normal(size=(3,)), torch.float32),
        "d": _t(rng.normal(size=()) * 1e-300),
        "empty": torch.zeros(0, 4),
        "flags": torch.tensor([True, False]),
    }
    flat, spec = flatten_state(state)
    assert flat.dim() == 1 and flat.dtype == torch.float64 and flat.numel() == 6 + 3 + 3 + 1
    assert [e.offset for e in spec.entries] == [0, 6, 9, 12, 13]
    back = unflatten_state(flat, spec)
    assert list(back) == list(state)
    for key, tensor in state.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
    no64 = {k: v for k, v in state.items() if k != "d"}
    flat32, spec32 = flatten_state(no64)
    assert flat32.dtype == torch.float32
    assert all(torch.equal(a, no64[k]) for k, a in unflatten_state(flat32, spec32).items())
    with pytest.raises(ValueError, match="spec expects 13"):
        unflatten_state(flat[:-1], spec)


def test_flat_states_average_like_the_originals():
    """Averaging unflattened learner buffers gives the same state as averaging the originals."""
    _, models, _ = _train_learners(torch.optim.Adam)
    for model in models:
        model.add_module("bn", torch.nn.BatchNorm1d(3))
        model.bn.running_mean.normal_()
    states = [m.state_dict() for m in models]
    flats = [flatten_state(s) for s in states]
    via_flat = average_states([unflatten_state(f, spec) for f, spec in flats])
    direct = average_states(states)
    assert all(torch.equal(via_flat[k], direct[k]) for k in direct)


def test_zero_weight_learner_is_left_out_entirely():
    """A learner of weight 0 (even learner 0, even holding nan) does not touch the result."""
    rng = _rng(10)
    raw = [rng.normal(size=5) for _ in range(3)]
    states = [{"w": _t(x), "bn.running_mean": _t(x), "bn.running_var": _t(x**2)} for x in raw]
    states[0] = {k: torch.full_like(v, float("nan")) for k, v in states[0].items()}
    out = average_states(states, weights=[0.0, 1.0, 3.0])
    np.testing.assert_allclose(out["w"].numpy(), np.average(raw[1:], axis=0, weights=[1, 3]), rtol=1e-13)
    assert torch.isfinite(out["bn.running_var"]).all()
    assert out["w"].dtype == torch.float64
