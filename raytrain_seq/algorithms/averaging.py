"""AAVG's merge of the learners' states: weight averaging and optimizer-state merging, on tensors.

Algorithm: AAVG (Cong et al., "Accelerating deep neural network training for action recognition on a
cluster of GPUs"). P learners take K local steps, then the weights become their mean (``average_states``,
Algorithm 1 line 12; docs/ARCHITECTURE.md, "AAVG model averaging"). Algorithm 2 (``merge_adam_states``):
Adam's moments become the learners' mean, and a (mean, variance) pair such as BatchNorm's running
statistics is merged by the law of total variance (z_j = v_j + m_j^2, m = mean m_j, v = mean z_j - m^2).
The merged state approximates one optimizer's. Weighted sums are accumulated in float32 for float32 and
narrower tensors, float64 for float64 (``elementwise.accumulation_dtype``). When B grows between rounds
(Algorithm 1, lines 13-21) is ``batchsize``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from raytrain_seq.algorithms.elementwise import normalised_weights

_F64 = torch.float64
_ADAM_MEAN_KEYS = ("exp_avg", "exp_avg_sq")
_AMSGRAD_KEY = "max_exp_avg_sq"


# ----------------------------------------------------------------------------------------------- helpers
def _normalised_weights(weights: Any, count: int) -> Tensor:
    """Validated learner weights as a float64 vector summing to one (``elementwise.normalised_weights``)."""
    return torch.from_numpy(normalised_weights(weights, count))


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """``elementwise.accumulation_dtype`` for torch: float64 stays float64, float32 and narrower floats
    (float16, bfloat16) accumulate in float32 (it says why)."""
    return _F64 if dtype == _F64 else torch.float32


def _weighted_mean(tensors: Sequence[Tensor], w: Tensor, workspace: Tensor | None = None) -> Tensor:
    """sum_j w_j x_j in the accumulation dtype (``_accumulation_dtype``) on learner 0's device, for
    weights w summing to one.

    Written as x_k + sum_j w_j (x_j - x_k), x_k the first learner with weight > 0: the same value since
    sum_j w_j = 1, but learners that agree give back exactly x_k, where the plain form rounds (three times
    x/3 is not always x). A learner of weight 0 is out of the round: even its nan/inf must not leak in.
    In-place passes per learner: faster than stack + tensordot, and no [P, ...] buffer. A narrower learner
    is widened into a scratch first (exact) and subtracted in place: the same values as torch.sub's type
    promotion, whose mixed-dtype kernel is several times slower. Each weight is rounded to the
    accumulation dtype once and each term w_j d_j is rounded before it is added, not fused into one
    multiply-add (``add_(alpha=)`` rounds once, and numpy cannot), so that ``elementwise``'s numpy
    arithmetic, which a shard runs, gives the same bits. ``workspace``: a [3, >= numel] tensor of the
    accumulation dtype on that device holding the temporaries (sum, scratch, widened base), so that a
    caller merging chunk after chunk allocates them once; the result is then a view into it.
    """
    device = tensors[0].device
    acc_dtype = _accumulation_dtype(tensors[0].dtype)
    # Each weight rounded to the accumulation dtype once, as numpy rounds a Python float against a float32
    # array; a learner of weight 0 is left out by its exact weight.
    rounded = w.to(acc_dtype).tolist()
    kept = [(r, t) for wj, r, t in zip(w.tolist(), rounded, tensors, strict=True) if wj > 0]
    first = kept[0][1].detach()
    n = first.numel()
    as_is = first.dtype == acc_dtype and first.device == device  # else widened (or moved) into the scratch
    if workspace is None:
        workspace = torch.empty((2 if as_is else 3, n), dtype=acc_dtype, device=device)
    acc, scratch = (workspace[i, :n].view(first.shape) for i in range(2))
    base = first if as_is else workspace[2, :n].view(first.shape).copy_(first)  # base is only read
    if len(kept) == 1:
        return acc.copy_(base)
    # The first term is written, not added to zeros: 0 + w d rounds exactly as w d does, one pass less.
    for j, (wj, t) in enumerate(kept[1:]):
        t = t.detach()
        if t.dtype == acc_dtype and t.device == device:
            torch.sub(t, base, out=scratch)
        else:
            scratch.copy_(t).sub_(base)
        if j == 0:
            torch.mul(scratch, wj, out=acc)
        else:
            acc.add_(scratch.mul_(wj))
    return acc.add_(base)


def _check_alike(tensors: Sequence[Any], where: str) -> None:
    """All learners' values for one key are tensors of the first learner's shape and dtype."""
    first = tensors[0]
    for j, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{where}: learner {j} holds a {type(t).__name__}; pass tensors only")
        if t.shape != first.shape:
            raise ValueError(
                f"{where}: learner {j} has shape {tuple(t.shape)} but learner 0 has {tuple(first.shape)}; "
                "only states of the same architecture can be averaged"
            )
        if t.dtype != first.dtype:
            raise ValueError(
                f"{where}: learner {j} has dtype {t.dtype} but learner 0 has {first.dtype}; "
                "cast every learner's state to one dtype before averaging"
            )
        if t.is_complex():
            raise TypeError(f"{where}: complex tensors unsupported; pass real and imaginary parts")


def _same_keys(found: Mapping, expected: Mapping, what: str, j: int) -> None:
    if set(found) != set(expected):
        missing = sorted(map(str, set(expected) - set(found)))
        extra = sorted(map(str, set(found) - set(expected)))
        raise ValueError(
            f"{what}: learner {j} differs from learner 0 (missing {missing}, extra {extra}); merge only "
            "states of the same model and optimizer, with the same keys"
        )


def merge_mean_var(
    means: Sequence[Tensor], variances: Sequence[Tensor], weights: Any = None
) -> tuple[Tensor, Tensor]:
    """Pool per-learner (mean, centred variance) pairs by the law of total variance (Algorithm 2, 1/3/6).

    m = sum_j w_j m_j and v = sum_j w_j v_j + sum_j w_j (m_j - m)^2: the mean of the variances plus the
    variance of the means. That is Algorithm 2's z/P - m^2 with z_j = v_j + m_j^2, rearranged because
    E[x^2] - E[x]^2 cancels catastrophically when |m| >> sqrt(v) and can go negative; this form cannot.
    It is the pooled data's variance exactly when each v_j is a population (ddof=0) variance and w_j is
    proportional to learner j's sample count (BatchNorm keeps ddof=1 estimates: off by O(1/batch size)).
    Results keep the first learner's dtype and device.
    """
    if len(means) != len(variances):
        raise ValueError(f"{len(means)} means, {len(variances)} variances: pass one pair per learner")
    w = _normalised_weights(weights, len(means))
    _check_alike(list(means) + list(variances), "merge_mean_var")
    mean = _weighted_mean(means, w)
    between = torch.zeros_like(mean)
    for wj, rounded, m in zip(w.tolist(), w.to(mean.dtype).tolist(), means, strict=True):
        if wj:  # (m_j - m) is exactly zero when the learners agree, so equal inputs come back unchanged
            gap = torch.sub(m.detach().to(device=mean.device, dtype=mean.dtype), mean)
            between.add_(gap.mul_(gap).mul_(rounded))  # rounded before the sum, as in _weighted_mean
    var = _weighted_mean(variances, w).add_(between)
    return mean.to(means[0].dtype), var.to(variances[0].dtype)


def weighted_mean(
    tensors: Sequence[Tensor],
    weights: Any = None,
    *,
    out: Tensor | None = None,
    workspace: Tensor | None = None,
) -> Tensor:
    """sum_j w_j x_j of same-shape tensors (weights normalised to sum to one), accumulated in float64 for
    float64 tensors and in float32 otherwise (``_accumulation_dtype``) and cast back to the first tensor's
    dtype: the elementwise rule ``average_states`` applies to every plain floating key, so a slice of a
    flat buffer merged here equals that slice of the per-key result. ``out``: written with the result
    (the same rounding as the cast) instead of a new tensor. ``workspace``: scratch of the accumulation
    dtype and shape [3, >= numel] on the tensors' device, reused across calls (the same values; it saves
    the temporaries' allocation when merging chunk after chunk)."""
    w = _normalised_weights(weights, len(tensors))
    _check_alike(list(tensors), "weighted_mean")
    acc_dtype = _accumulation_dtype(tensors[0].dtype)
    if workspace is not None and (
        workspace.dtype != acc_dtype or workspace.dim() != 2 or workspace.shape[0] < 3
        or workspace.shape[1] < tensors[0].numel() or workspace.device != tensors[0].device
    ):  # fmt: skip
        raise ValueError(
            f"workspace must be a {acc_dtype} tensor of shape [3, >= {tensors[0].numel()}] on "
            f"{tensors[0].device} for {tensors[0].dtype} tensors, got {workspace.dtype} "
            f"{tuple(workspace.shape)} on {workspace.device}"
        )
    mean = _weighted_mean(tensors, w, workspace)
    return mean.to(tensors[0].dtype) if out is None else out.copy_(mean)


def weighted_max(tensors: Sequence[Tensor], weights: Any = None) -> Tensor:
    """Elementwise max over the tensors of learners with weight > 0 (AMSGrad's max_exp_avg_sq rule)."""
    w = _normalised_weights(weights, len(tensors))
    _check_alike(list(tensors), "weighted_max")
    kept = [t.detach() for t, wj in zip(tensors, w.tolist(), strict=True) if wj > 0]
    return torch.stack(kept).amax(dim=0)


# ------------------------------------------------------------------------------------------ model states
def bn_pairs(keys: Sequence[str], state: Mapping[str, Tensor]) -> dict[str, str]:
    """running_var key -> running_mean key for every BatchNorm-style pair of floating tensors."""
    pairs = {}
    for key in keys:
        if key == "running_var" or key.endswith(".running_var"):
            mean_key = key[: -len("running_var")] + "running_mean"
            if mean_key in state and state[key].is_floating_point() and state[mean_key].is_floating_point():
                pairs[key] = mean_key
    return pairs


def average_states(
    states: Sequence[Mapping[str, Tensor]], weights: Any = None, *, merge_bn_stats: bool = True
) -> dict[str, Tensor]:
    """Weighted mean of the learners' model states (Algorithm 1, line 12), key by key.

    Floating tensors become sum_j w_j x_j (weights default to equal; they are normalised to sum to one),
    accumulated in float32 (float64 for float64 tensors) and cast back to each tensor's dtype, on the
    first learner's device. Integer and bool buffers (BatchNorm's num_batches_tracked) are counters, not
    estimates: they are copied from the first learner. A BatchNorm ``X.running_var`` whose
    ``X.running_mean`` is present is merged by the law of total variance (see merge_mean_var): each
    learner's running statistics describe its own data, and the plain mean of the variances would ignore
    how far apart the learners' means are, underestimating the variance of the data all learners saw
    together (Algorithm 2, lines 1, 3 and 6). ``merge_bn_stats``
    False takes the plain weighted mean of both halves of a pair instead: Algorithm 2 is part of AAVG3
    only, so the AAVG1 and AAVG2 ablations average the statistics like any other tensor.
    """
    if isinstance(states, Mapping) or not isinstance(states, Sequence):
        raise TypeError(f"states must be a list of state dicts (one per learner), not {type(states)}")
    w = _normalised_weights(weights, len(states))
    for j, state in enumerate(states):
        if not isinstance(state, Mapping):
            raise TypeError(f"states[{j}] is a {type(state)}: pass each learner's model.state_dict()")
        _same_keys(state, states[0], "state keys", j)
    keys = list(states[0])
    for key in keys:
        _check_alike([state[key] for state in states], f"key {key!r}")
    pairs = bn_pairs(keys, states[0]) if merge_bn_stats else {}
    merged: dict[str, Tensor] = {}
    for var_key, mean_key in pairs.items():
        merged[mean_key], merged[var_key] = merge_mean_var(
            [s[mean_key] for s in states], [s[var_key] for s in states], w
        )
    out = {}
    for key in keys:
        first = states[0][key]
        if key in merged:
            out[key] = merged[key]
        elif not first.is_floating_point():
            out[key] = first.detach().clone()
        else:
            mean = _weighted_mean([s[key] for s in states], w)
            out[key] = mean.to(first.dtype)
    return out


# -------------------------------------------------------------------------------------- optimizer states
def _agreed_step(index: Any, steps: Sequence[Any], furthest: bool = False) -> Any:
    """The common step of all learners (Adam's bias correction 1 - beta^step depends on it), or with
    ``furthest`` the largest (learners that sent before the others' deferred rounds took fewer steps)."""
    values = [float(s.item()) if isinstance(s, Tensor) else float(s) for s in steps]
    if furthest:
        top = steps[max(range(len(values)), key=values.__getitem__)]
        return top.detach().clone() if isinstance(top, Tensor) else top
    if any(v != values[0] for v in values):
        raise ValueError(
            f"param {index}: step differs across learners {values}; AAVG learners take the same number of "
            "local steps between averages, so merge states from one averaging round (or reset step first)"
        )
    first = steps[0]
    return first.detach().clone() if isinstance(first, Tensor) else first


def _check_pairs(centred_pairs: Any) -> list[tuple[str, str]]:
    pairs = []
    for pair in centred_pairs:
        if not (isinstance(pair, Sequence) and len(pair) == 2 and all(isinstance(k, str) for k in pair)):
            raise TypeError(f"centred_pairs entries must be (mean_key, var_key) string pairs, got {pair!r}")
        clash = set(pair) & {"step", _AMSGRAD_KEY, *_ADAM_MEAN_KEYS}
        if pair[0] == pair[1] or clash:
            raise ValueError(
                f"centred pair {tuple(pair)} must name two distinct keys other than step/exp_avg/exp_avg_sq/"
                "max_exp_avg_sq: those are merged already"
            )
        pairs.append((pair[0], pair[1]))
    return pairs


def merge_adam_states(
    states: Sequence[Mapping[Any, Mapping[str, Any]]],
    *,
    weights: Any = None,
    centred_pairs: Sequence[tuple[str, str]] = (),
    furthest_step: bool = False,
) -> dict[Any, dict[str, Any]]:
    """Merge the learners' ``optimizer.state_dict()["state"]`` of torch.optim.Adam/AdamW (Algorithm 2).

    exp_avg and exp_avg_sq become the learners' weighted means (line 5). exp_avg_sq is a plain mean and not
    a total-variance merge because it is the uncentred second moment E[g^2] already: it is Algorithm 2's
    z, and the mean of the z_j is the pooled second moment. max_exp_avg_sq (AMSGrad) becomes the
    elementwise MAX over learners with positive weight: AMSGrad's convergence argument needs the
    denominator sqrt(v_hat) never to shrink, and the max is >= every learner's own v_hat, whereas a mean
    would shrink it for learners above the mean and enlarge their next steps. It also keeps
    v_hat >= exp_avg_sq, since the mean of the exp_avg_sq is below the max of the v_hat.
    Each (mean_key, var_key) in centred_pairs names a gradient mean and a CENTRED variance (as an optimizer
    that tracks Var[g] keeps them) and is merged by the law of total variance (lines 1, 3 and 6).
    step must agree across learners (``furthest_step``: the largest is kept, as when some learners deferred
    their rounds past the others') and keeps its type; any other floating tensor raises, since averaging
    state we do not understand could silently break the optimizer; other values must agree and are copied.
    Load the result with ``opt.load_state_dict({"state": merged, "param_groups": ...})``.
    """
    if isinstance(states, Mapping) or not isinstance(states, Sequence):
        raise TypeError("states must be a list (one per learner) of optimizer.state_dict()['state'] dicts")
    w = _normalised_weights(weights, len(states))
    pairs = _check_pairs(centred_pairs)
    paired = {key for pair in pairs for key in pair}
    for j, state in enumerate(states):
        if not isinstance(state, Mapping):
            raise TypeError(f"states[{j}] is a {type(state).__name__}: pass optimizer.state_dict()['state']")
        _same_keys(state, states[0], "param indices", j)
    out: dict[Any, dict[str, Any]] = {}
    for index in states[0]:
        entries = [state[index] for state in states]
        for j, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise TypeError(f"param {index}: learner {j}'s entry is a {type(entry).__name__}, not a dict")
            _same_keys(entry, entries[0], f"param {index} state keys", j)
        merged: dict[str, Any] = {}
        for mean_key, var_key in pairs:
            present = [k in entries[0] for k in (mean_key, var_key)]
            if any(present) and not all(present):
                raise ValueError(
                    f"param {index}: centred pair ({mean_key!r}, {var_key!r}) is only half present "
                    f"(keys {sorted(entries[0])}); list only pairs whose two keys the optimizer keeps"
                )
            if all(present):
                for key in (mean_key, var_key):
                    _check_alike([e[key] for e in entries], f"param {index} key {key!r}")
                merged[mean_key], merged[var_key] = merge_mean_var(
                    [e[mean_key] for e in entries], [e[var_key] for e in entries], w
                )
        out[index] = {
            key: _merge_entry(index, key, [e[key] for e in entries], w, paired, merged, furthest_step)
            for key in entries[0]
        }
    return out


def _merge_entry(
    index: Any, key: str, values: list[Any], w: Tensor, paired: set[str], merged: dict, furthest: bool = False
) -> Any:
    where = f"param {index} key {key!r}"
    if key == "step":
        return _agreed_step(index, values, furthest)
    if key in paired:
        return merged[key]
    first = values[0]
    if key in _ADAM_MEAN_KEYS:
        _check_alike(values, where)
        return _weighted_mean(values, w).to(first.dtype)
    if key == _AMSGRAD_KEY:
        _check_alike(values, where)
        # A zero-weight learner is left out of the round, so its v_hat must not raise the maximum.
        kept = [v.detach().to(first.device) for v, wj in zip(values, w.tolist(), strict=True) if wj > 0]
        return torch.stack(kept).amax(dim=0).to(first.dtype)
    if isinstance(first, Tensor) and (first.is_floating_point() or first.is_complex()):
        raise ValueError(
            f"{where}: unknown floating state (known: step, exp_avg, exp_avg_sq, max_exp_avg_sq). If "
            f"{key!r} is half of a (mean, centred variance) pair pass it in centred_pairs; otherwise "
            "merge it yourself and remove it from the states before calling"
        )
    for j, value in enumerate(values):
        tensors = isinstance(first, Tensor) and isinstance(value, Tensor)
        if not (torch.equal(value, first) if tensors else value == first):
            raise ValueError(f"{where}: learner {j} has {value!r}, learner 0 {first!r}; these must agree")
    return first.detach().clone() if isinstance(first, Tensor) else first


# ------------------------------------------------------------------------------------------- flat states
@dataclass(frozen=True)
class FlatEntry:
    """Where one floating tensor lives in the flat buffer: flat[offset : offset + numel]."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True)
class FlatSpec:
    """Layout of a flattened state: the key order, the floating entries, and the non-float tensors.

    Integer and bool tensors travel by value in ``extras`` instead of inside the buffer: they are never
    averaged, and an int64 above 2**24 (a long run's num_batches_tracked) does not survive float32.
    """

    keys: tuple[str, ...]
    entries: tuple[FlatEntry, ...]
    extras: dict[str, Tensor]
    dtype: torch.dtype
    numel: int


def flatten_state(state: Mapping[str, Tensor]) -> tuple[Tensor, FlatSpec]:
    """One contiguous 1-D buffer holding every floating tensor, plus the spec to undo it.

    The buffer is float64 if any tensor is float64, else float32 (float16/bfloat16 convert exactly), on the
    first floating tensor's device: one buffer per learner ships far cheaper than hundreds of small tensors.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict of tensors (model.state_dict()), got {type(state).__name__}")
    floats: list[tuple[str, Tensor]] = []
    extras: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if not isinstance(tensor, Tensor):
            raise TypeError(f"key {key!r} holds a {type(tensor).__name__}: flatten_state takes tensors only")
        if tensor.is_complex():
            raise TypeError(f"key {key!r} is complex: split it into real and imaginary parts first")
        if tensor.is_floating_point():
            floats.append((key, tensor.detach()))
        else:
            extras[key] = tensor.detach().clone()
    dtype = torch.float64 if any(t.dtype == torch.float64 for _, t in floats) else torch.float32
    device = floats[0][1].device if floats else torch.device("cpu")
    # Offsets are running sums of the sizes: shapes (2, 3), (3,), (3,) have numels [6, 3, 3], so the
    # offsets are [0, 6, 9], the entries occupy flat[0:6], flat[6:9], flat[9:12], and numel is 12.
    entries, offset = [], 0
    for key, tensor in floats:
        entries.append(FlatEntry(key, tensor.dtype, tuple(tensor.shape), offset, tensor.numel()))
        offset += tensor.numel()
    if floats:
        flat = torch.cat([t.reshape(-1).to(device=device, dtype=dtype) for _, t in floats])
    else:
        flat = torch.empty(0, dtype=dtype, device=device)
    return flat, FlatSpec(tuple(state), tuple(entries), extras, dtype, offset)


def unflatten_state(flat: Tensor, spec: FlatSpec) -> dict[str, Tensor]:
    """The state dict that flatten_state turned into (flat, spec), keys in their original order.

    Tensors land on flat's device with their original dtypes; where that dtype is flat's own the tensor is
    a view of flat (no copy), so do not write into flat while the result is in use.
    """
    if not isinstance(spec, FlatSpec):
        raise TypeError(f"spec must be the FlatSpec returned by flatten_state, got {type(spec).__name__}")
    if not isinstance(flat, Tensor) or flat.dim() != 1 or not flat.is_floating_point():
        raise ValueError(
            "flat must be the 1-D floating buffer returned by flatten_state (or an average of such)"
        )
    if flat.numel() != spec.numel:
        raise ValueError(
            f"flat has {flat.numel()} values but spec expects {spec.numel}: pair it with its own spec"
        )
    by_name = {entry.name: entry for entry in spec.entries}
    out = {}
    for key in spec.keys:
        if key in spec.extras:
            out[key] = spec.extras[key].clone().to(flat.device)
        else:
            e = by_name[key]
            out[key] = flat[e.offset : e.offset + e.numel].view(e.shape).to(e.dtype)
    return out
