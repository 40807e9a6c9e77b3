"""The flat data plane (raytrain_seq.dataplane.payload) without Ray, and the control plane over it in process.

Contracts pinned: a state packed into flat buffers and cut into S slices comes back exactly (keys, order,
dtypes, shapes, integer buffers, Adam steps); merging the slices shard by shard equals
``average_states`` + ``merge_adam_states`` bit for bit for every S (BatchNorm pairs cut at the same
offsets, AMSGrad's max, weights); a tensor inside one slice is read without a copy; an in-process
ParameterAverager over flat payloads hands every learner that same state and counts each shard's bytes
(about one learner's payload in and out with S = learners, where one actor moves 2 P of them).
"""

from __future__ import annotations

import asyncio
import itertools
import pickle

import numpy as np
import pytest
import torch
from averager_fixtures import local_averager
from conftest import adam_learners

from raytrain_seq.algorithms.averaging import average_states, merge_adam_states
from raytrain_seq.dataplane import merge
from raytrain_seq.dataplane.extras import OptimizerExtras, merge_extras
from raytrain_seq.dataplane.merge import ShardMerge, merge_parts
from raytrain_seq.dataplane.payload import FlatLayout, FlatPayload, Slot
from raytrain_seq.dataplane.stores import InProcessShards, InProcessStore
from raytrain_seq.members.errors import AveragingTimeoutError, StaleRoundError
from raytrain_seq.rounds.state import AveragedState


def learners(count: int = 3, *, amsgrad: bool = False, steps: int = 3) -> tuple[list[dict], list[dict]]:
    """``count`` learners of a 50-channel BatchNorm model (conftest.adam_learners)."""
    return adam_learners(count, width=50, amsgrad=amsgrad, steps=steps)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("shards", [1, 2, 3, 7])
def test_pack_split_unpack_round_trip_is_exact(shards):
    params, moments = learners(1)
    layout = FlatLayout.of(params[0], moments[0])
    buffers, extras = layout.pack(params[0], moments[0])
    parts = layout.split(buffers, shards)
    assert len(parts) == shards
    assert {key for key, _ in layout.sizes} == {"mean/float32", "pmean/float32", "pvar/float32"}
    assert sum(p["pmean/float32"].size for p in parts) == 50  # one BatchNorm pair of 50 channels
    back, back_moments = layout.unpack(parts, extras)
    assert same(back, params[0]) and same(back_moments, moments[0])
    assert layout.nbytes == sum(b.numel() * 4 for b in buffers.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_a_cuda_state_packs_through_reused_pinned_buffers_to_the_host_bits():
    """A learner on CUDA that cannot bind its state (FlatStorage) puts it through ``slices``' pack: host
    buffers that are pinned (asynchronous copies), reused from the last round, holding the bits of the
    same state packed on the host."""
    params, moments = learners(1)
    layout = FlatLayout.of(params[0], moments[0])
    host, host_extras = layout.pack(params[0], moments[0])
    on_gpu = (
        {k: v.cuda() for k, v in params[0].items()},
        {i: {n: v.cuda() if n != "step" else v for n, v in e.items()} for i, e in moments[0].items()},
    )
    parts, extras, staging = layout.slices(*on_gpu, 2)
    assert all(buffer.is_pinned() for buffer in staging.values())
    assert all(np.array_equal(np.concatenate([p[key] for p in parts]), host[key].numpy()) for key in host)
    got, expected = layout.unpack(parts, extras), layout.unpack(layout.split(host, 2), host_extras)
    assert same(got[0], expected[0]) and same(got[1], expected[1])
    again, _, reused = layout.slices(*on_gpu, 2, staging)
    assert all(reused[key].data_ptr() == staging[key].data_ptr() for key in staging)
    assert np.shares_memory(again[0]["mean/float32"], parts[0]["mean/float32"])


def test_values_not_averaged_travel_as_numpy_and_come_back_as_writable_tensors():
    """The extras (integer buffers, Adam's steps) cross the control plane in every message of a round:
    they hold numpy arrays, not tensors (which Ray pickles through torch.save, one by one), the steps
    one column for all parameters, and every unpack gives fresh writable tensors of the original dtype
    and value. A dtype outside the exact round trip (uint16 here) travels as a tensor copy."""
    params, moments = learners(1)
    layout = FlatLayout.of(params[0], moments[0])
    buffers, extras = layout.pack(params[0], moments[0])
    assert any(k.endswith("num_batches_tracked") for k in extras["model"])
    assert all(isinstance(v, np.ndarray) for v in extras["model"].values())
    # One column of float32 steps in parameter order, nothing else: Adam keeps only its step by value.
    assert isinstance(extras["optimizer"], OptimizerExtras) and extras["optimizer"].other == {}
    ((name, indices, steps),) = extras["optimizer"].columns.values()
    assert name == "step" and indices == tuple(moments[0]) and steps.dtype == np.float32
    assert steps.tolist() == [float(moments[0][i]["step"]) for i in indices] and len(indices) == 6
    back, back_moments = layout.unpack(layout.split(buffers, 2), extras)
    again, again_moments = layout.unpack(layout.split(buffers, 2), extras)
    for key in extras["model"]:
        assert same(back[key], params[0][key]) and back[key] is not again[key]
    for index, entry in back_moments.items():
        assert same(entry["step"], moments[0][index]["step"])
        entry["step"].add_(1)  # writable: the optimizer counts its steps in place, alone
    assert all(same(e["step"], moments[0][i]["step"]) for i, e in again_moments.items())
    assert steps.tolist() == [float(moments[0][i]["step"]) for i in indices]  # the column is untouched

    odd = {"w": torch.ones(3), "q": torch.tensor([2, 3], dtype=torch.uint16)}
    kept = FlatLayout.of(odd, None).extras(odd, None)["model"]["q"]
    assert isinstance(kept, torch.Tensor) and torch.equal(kept, odd["q"]) and kept is not odd["q"]


def test_a_layout_pickles_back_to_itself():
    """``FlatLayout`` pickles as columns of plain values (every message of a round carries it): it comes
    back equal, slots and all, with or without moments, and with no slot at all."""
    params, moments = learners(1)
    for layout in (
        FlatLayout.of(params[0], moments[0]),
        FlatLayout.of(params[0], None),
        FlatLayout.of({"count": torch.tensor(3)}, None),
    ):
        back = pickle.loads(pickle.dumps(layout, protocol=5))
        assert back == layout and back.signature == layout.signature
        assert all(isinstance(slot, Slot) for slot in back.slots)
    assert not FlatLayout.of({"count": torch.tensor(3)}, None).slots  # not vacuous: the empty case


def test_a_layout_met_before_unpickles_to_the_same_object():
    """A process unpickles the layout of every message of a round, almost always the same one: it gets
    the layout it built or unpickled before (compared by identity from then on), and a different layout
    stays itself, also once several others came between."""
    params, moments = learners(2)
    layout = FlatLayout.of(params[0], moments[0])
    first = pickle.loads(pickle.dumps(layout, protocol=5))
    again = pickle.loads(pickle.dumps(FlatLayout.of(params[1], moments[1]), protocol=5))
    # The layout built here is the one kept: a reply's layout is the learner's own object.
    assert first is layout and again is layout and FlatLayout.of(params[1], moments[1]) is layout
    without = pickle.loads(pickle.dumps(FlatLayout.of(params[0], None), protocol=5))
    assert without is not first and without != first and not without.moments
    for n in range(1, 8):  # more layouts than a process keeps: each still comes back as itself
        other = FlatLayout.of({f"w{i}": torch.zeros(i + 1) for i in range(n)}, None)
        assert pickle.loads(pickle.dumps(other, protocol=5)) == other
    assert pickle.loads(pickle.dumps(layout, protocol=5)) == layout


def test_a_tensor_inside_one_slice_is_read_without_a_copy():
    params, moments = learners(1)
    layout = FlatLayout.of(params[0], moments[0])
    buffers, extras = layout.pack(params[0], moments[0])
    parts = layout.split(buffers, 1)
    back, _ = layout.unpack(parts, extras)
    slot = next(s for s in layout.slots if s.key == "2.weight")
    assert np.shares_memory(back["2.weight"].numpy(), parts[0][slot.buffer])


@pytest.mark.parametrize("shards", [1, 2, 5])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_sharded_merge_equals_the_single_process_reference_bit_for_bit(shards, amsgrad):
    params, moments = learners(3, amsgrad=amsgrad)
    weights = [30.0, 50.0, 20.0]
    layouts = [FlatLayout.of(p, m) for p, m in zip(params, moments, strict=True)]
    assert len({layout.signature for layout in layouts}) == 1
    packed = [layout.pack(p, m) for layout, p, m in zip(layouts, params, moments, strict=True)]
    sliced = [layouts[0].split(buffers, shards) for buffers, _ in packed]
    merged = [merge_parts([s[i] for s in sliced], weights) for i in range(shards)]
    got, got_moments = layouts[0].unpack(merged, merge_extras([e for _, e in packed]))
    expected = average_states(params, weights)
    expected_moments = merge_adam_states(moments, weights=weights)
    assert same(got, expected) and same(got_moments, expected_moments)
    # Not vacuous: the BatchNorm variance is a total-variance merge, not the plain weighted mean.
    plain = sum(w * p["1.running_var"].double() for w, p in zip(weights, params, strict=True)) / 100
    assert not torch.allclose(got["1.running_var"].double(), plain, rtol=0, atol=1e-9)
    if amsgrad:
        assert any(key == "max/float32" for key, _ in layouts[0].sizes)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_a_merge_into_the_last_merges_arrays_gives_the_same_bits(amsgrad):
    """``merge_parts(reuse=...)`` (a shard's next round): the result overwrites the arrays of the one
    passed, for every buffer whose length and dtype match, and gives the bits of a fresh merge; arrays
    that do not fit, or are read-only (an object-store view), are not written."""
    params, moments = learners(3, amsgrad=amsgrad)
    layout = FlatLayout.of(params[0], moments[0])
    sliced = [layout.split(layout.pack(p, m)[0], 2) for p, m in zip(params, moments, strict=True)]
    first = merge_parts([s[0] for s in sliced], [30.0, 50.0, 20.0])
    reference = merge_parts([s[0] for s in sliced], [20.0, 30.0, 50.0])
    assert any(not np.array_equal(first[k], reference[k]) for k in first)  # not vacuous: new values
    again = merge_parts([s[0] for s in sliced], [20.0, 30.0, 50.0], reuse=first)
    assert again.keys() == reference.keys()
    assert all(again[k] is first[k] and np.array_equal(again[k], reference[k]) for k in again)

    key = "mean/float32"
    short = {key: np.zeros(3, np.float32)}
    frozen = {key: np.zeros_like(reference[key])}
    frozen[key].flags.writeable = False
    for unfit in (short, frozen, {key: reference[key].astype(np.float64)}):
        kept = unfit[key].copy()
        got = merge_parts([s[0] for s in sliced], [20.0, 30.0, 50.0], reuse=unfit)
        assert got[key] is not unfit[key] and np.array_equal(unfit[key], kept)
        assert np.array_equal(got[key], reference[key])


def test_pieces_are_gathered_window_by_window_to_the_bits_of_flat_slices(monkeypatch):
    """A shard merges CHUNK-element windows, gathering the pieces a window spans (a model of many small
    tensors): with a 7-element CHUNK, pieces of 0 to 11 elements cut differently per learner, and every
    rule (mean, a (mean, var) pair, max), the result equals the merge of the same slices as flat arrays."""
    monkeypatch.setattr(merge, "CHUNK", 7)
    rng = np.random.default_rng(3)
    n, weights = 40, [1.0, 2.0, 3.0]
    flats = [
        {
            k: rng.standard_normal(n).astype(np.float32)
            for k in ("mean/float32", "pmean/float32", "max/float32")
        }
        for _ in weights
    ]
    for flat in flats:
        flat["pvar/float32"] = rng.random(n).astype(np.float32)

    def cut(array: np.ndarray, sizes: list[int]) -> tuple[np.ndarray, ...]:
        edges = np.cumsum([0, *sizes])
        return tuple(array[a:b] for a, b in itertools.pairwise(edges))

    cuts = [[11, 0, 3, 9, 1, 16], [40], [2] * 20]  # an empty piece; one piece; pieces shorter than CHUNK
    pieced = [{k: cut(v, sizes) for k, v in flat.items()} for flat, sizes in zip(flats, cuts, strict=True)]
    expected, got = merge_parts(flats, weights), merge_parts(pieced, weights)
    assert expected.keys() == got.keys() == set(flats[0])
    assert all(np.array_equal(got[k], expected[k]) for k in got)
    assert not np.array_equal(expected["mean/float32"], flats[0]["mean/float32"])  # not vacuous


@pytest.mark.parametrize("shards", [1, 2, 5])
def test_cpu_slices_are_views_of_the_tensors_and_merge_like_the_packed_buffers(shards):
    """On the CPU ``slices`` cuts the tensors themselves (no staging copy): every piece is a view of a
    learner's tensor, the pieces of slice i concatenate to slice i of the packed buffer, and the shards
    merge them (alone, or beside a learner that sent packed flat slices) to the same bits."""
    params, moments = learners(3)
    weights = [30.0, 50.0, 20.0]
    layout = FlatLayout.of(params[0], moments[0])
    sliced = [layout.slices(p, m, shards)[0] for p, m in zip(params, moments, strict=True)]
    packed = [layout.split(layout.pack(p, m)[0], shards) for p, m in zip(params, moments, strict=True)]
    tensors = [t.numpy() for t in params[0].values() if t.is_floating_point()] + [
        v.numpy() for entry in moments[0].values() for v in entry.values() if v.dim() > 0
    ]
    pieces = [piece for part in sliced[0] for value in part.values() for piece in value]
    # Every floating tensor is one piece, plus one more for each cut a slice boundary makes in a tensor.
    assert len(pieces) == len(tensors) if shards == 1 else len(pieces) > len(tensors)
    assert all(any(np.shares_memory(piece, t) for t in tensors) for piece in pieces)
    for i in range(shards):
        for key, flat in packed[0][i].items():
            assert np.array_equal(np.concatenate([np.empty(0, flat.dtype), *sliced[0][i][key]]), flat)
    for mix in (sliced, [sliced[0], packed[1], sliced[2]]):
        merged = [merge_parts([s[i] for s in mix], weights) for i in range(shards)]
        reference = [merge_parts([s[i] for s in packed], weights) for i in range(shards)]
        for a, b in zip(merged, reference, strict=True):
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    got, _ = layout.unpack(
        merged, merge_extras([layout.extras(p, m) for p, m in zip(params, moments, strict=True)])
    )
    assert same(got, average_states(params, weights))
    stored = InProcessStore().put(sliced[0][0])  # a put copies the pieces, as ray.put does
    assert not any(
        np.shares_memory(a, b) for k in stored for a, b in zip(stored[k], sliced[0][0][k], strict=True)
    )


@pytest.mark.parametrize("shards", [1, 3])
def test_merge_bn_stats_off_averages_batchnorm_pairs_as_plain_means_in_both_paths(shards):
    """train.merge_bn_stats=False (the AAVG1/AAVG2 ablations): no pmean/pvar buffers, the shards' merge
    equals ``average_states(..., merge_bn_stats=False)`` and the variance is the plain weighted mean."""
    params, moments = learners(3)
    weights = [30.0, 50.0, 20.0]
    layouts = [FlatLayout.of(p, m, merge_bn_stats=False) for p, m in zip(params, moments, strict=True)]
    assert {key for key, _ in layouts[0].sizes} == {"mean/float32"}
    assert layouts[0].signature != FlatLayout.of(params[0], moments[0]).signature
    packed = [layout.pack(p, m) for layout, p, m in zip(layouts, params, moments, strict=True)]
    sliced = [layouts[0].split(buffers, shards) for buffers, _ in packed]
    merged = [merge_parts([s[i] for s in sliced], weights) for i in range(shards)]
    got, _ = layouts[0].unpack(merged, merge_extras([e for _, e in packed]))
    expected = average_states(params, weights, merge_bn_stats=False)
    assert same(got, expected)
    plain = sum(w * p["1.running_var"].double() for w, p in zip(weights, params, strict=True)) / 100
    assert torch.allclose(got["1.running_var"].double(), plain, rtol=1e-6, atol=0)
    # Not vacuous: the learners' statistics differ, so the total-variance merge gives a larger variance.
    merged_on = average_states(params, weights)
    assert bool((merged_on["1.running_var"] > got["1.running_var"]).any())


def test_bad_inputs_fail_early_with_the_fix():
    params, _ = learners(1)
    odd = {0: {"step": torch.tensor(1.0), "momentum_buffer": torch.zeros(3)}}
    with pytest.raises(ValueError, match="unknown floating optimizer state 'momentum_buffer'"):
        FlatLayout.of(params[0], odd)
    layout = FlatLayout.of(params[0], None)
    with pytest.raises(ValueError, match="shards must be an int >= 1"):
        layout.bounds(0)
    steps = [{"optimizer": OptimizerExtras.of({0: {"step": torch.tensor(float(n))}})} for n in (3, 4)]
    with pytest.raises(
        ValueError, match=r"param 0: step differs across learners \(learner 0 3.0, learner 1 4.0\)"
    ):
        merge_extras(steps)
    # A step kept as a plain number (not a one-value tensor) is compared too.
    floats = [{"optimizer": OptimizerExtras.of({0: {"step": n}})} for n in (3, 4)]
    with pytest.raises(ValueError, match="step differs across learners"):
        merge_extras(floats)
    assert merge_extras([steps[0], steps[0]]) is steps[0]
    with pytest.raises(ValueError, match="materialise"):
        AveragedState(round=1, batch_size=2, flat=FlatPayload(layout, ())).to_dict()


def test_cuts_move_to_a_tensor_boundary_within_a_sixteenth_of_a_slice():
    """The docstring's examples, then invariants over random layouts: the cuts cover every buffer in
    order, none is further from its equal cut than 1/16 of a slice, a cut that could land on a tensor
    boundary does, and BatchNorm (mean, var) halves are cut alike."""

    def layout(sizes):
        return FlatLayout.of({f"w{i}": torch.zeros(n) for i, n in enumerate(sizes)}, None)

    assert layout([3990, 4010]).bounds(2) == [{"mean/float32": (0, 3990)}, {"mean/float32": (3990, 8000)}]
    assert layout([3000, 5000]).bounds(2) == [{"mean/float32": (0, 4000)}, {"mean/float32": (4000, 8000)}]
    rng = np.random.default_rng(0)
    moved = 0
    for _ in range(200):
        sizes = [int(n) for n in rng.integers(1, 5000, size=int(rng.integers(1, 30)))]
        shards = int(rng.integers(1, 9))
        n, slack = sum(sizes), sum(sizes) // shards // 16
        edges = set(np.cumsum([0, *sizes]).tolist())
        parts = layout(sizes).bounds(shards)
        cuts = [part["mean/float32"] for part in parts]
        assert cuts[0][0] == 0 and cuts[-1][1] == n
        assert all(a[1] == b[0] and a[0] <= a[1] for a, b in zip(cuts, [*cuts[1:], (n, n)], strict=True))
        for i, (lo, _) in enumerate(cuts[1:], start=1):
            even = n * i // shards
            assert abs(lo - even) <= slack
            near = [e for e in edges if abs(e - even) <= slack]
            assert (lo in edges) if near else lo == even, (sizes, shards, cuts)
            moved += lo != even
    assert moved > 20  # not vacuous: many cuts did move to a boundary
    bn = torch.nn.Sequential(torch.nn.Linear(3, 700), torch.nn.BatchNorm1d(700), torch.nn.BatchNorm1d(700))
    parts = FlatLayout.of(bn.state_dict(), None).bounds(3)
    assert all(part["pmean/float32"] == part["pvar/float32"] for part in parts)


def _run(coro):
    return asyncio.run(coro)


def flat_payload(params: dict, moments: dict, shards: int, store: InProcessStore) -> FlatPayload:
    """A learner's round as it sends it: the state packed, cut into ``shards`` slices, each put in ``store``."""
    layout = FlatLayout.of(params, moments)
    buffers, extras = layout.pack(params, moments)
    return FlatPayload(layout, tuple(store.put(p) for p in layout.split(buffers, shards)), extras)


def test_in_process_averager_over_flat_payloads_equals_the_reference_and_counts_shard_bytes():
    params, moments = learners(3)
    weights = [1.0, 2.0, 1.0]
    store = InProcessStore()
    averager = local_averager(3, timeout_s=30.0, shards=3)

    async def round_():
        replies = [await averager.join(j, 3) for j in range(3)]
        assert {r.shards for r in replies} == {3}
        sends = [
            averager.average(j, 1, 3, flat_payload(params[j], moments[j], 3, store), None, weight=weights[j])
            for j in range(3)
        ]
        return await asyncio.gather(*sends), await averager.summary()

    results, summary = _run(round_())
    expected = average_states(params, weights)
    expected_moments = merge_adam_states(moments, weights=weights)
    for result in results:
        assert result.state.params is None and result.state.flat is not None  # the control plane holds refs
        state = result.state.materialise(store.get)
        assert same(state.params, expected) and same(state.optimizer_state, expected_moments)
    payload = FlatLayout.of(params[0], moments[0]).nbytes
    loads = summary.hub_load[-1]["actors"]
    assert set(loads) == {"control", "shard0", "shard1", "shard2"}
    # The control plane passes references on; in the background it reads the merged state once (joins
    # and checkpoints get tensors), at most one payload, and that read may or may not be done by now.
    assert loads["control"]["sent"] == 0 and loads["control"]["received"] <= 1.01 * payload
    per_shard = [(a["received"] + a["sent"]) / payload for k, a in loads.items() if k != "control"]
    assert max(per_shard) <= 2.1 and min(per_shard) >= 1.9  # ~ one payload in, one out, each


class UnreadableOnce(InProcessShards):
    """A pool whose first merge cannot read learner ``index``'s slices (as when that learner's process is
    frozen after it sent its round); later merges read everything."""

    def __init__(self, count: int, index: int) -> None:
        super().__init__(count)
        self.index, self.calls = index, []

    async def merge(self, round, payloads, weights, timeout_s=None, write=False):
        self.calls.append((len(payloads), timeout_s))
        if len(self.calls) == 1:
            return ShardMerge(unreadable=frozenset({self.index}))
        return await super().merge(round, payloads, weights, timeout_s)


def test_a_learner_whose_slices_cannot_be_read_is_dropped_and_the_others_are_merged_again():
    params, moments = learners(3)
    weights = [1.0, 2.0, 3.0]
    store = InProcessStore()
    pools: list[UnreadableOnce] = []

    def pool(count: int) -> UnreadableOnce:
        pools.append(UnreadableOnce(count, index=1))  # learner 1: the second of the round, in id order
        return pools[-1]

    averager = local_averager(3, timeout_s=7.0, shards=2, shard_pool=pool)

    async def round_():
        for j in range(3):
            await averager.join(j, 3)
        sends = [
            averager.average(j, 1, 3, flat_payload(params[j], moments[j], 2, store), None, weight=weights[j])
            for j in range(3)
        ]
        results = await asyncio.gather(*sends, return_exceptions=True)
        return results, await averager.summary(), await averager.join(1, 3)

    (first, unread, third), summary, rejoined = _run(round_())
    # The merge was tried with all three (bounded by the round's timeout), then again without learner 1.
    assert pools[0].calls == [(3, 7.0), (2, 7.0)]
    assert isinstance(unread, StaleRoundError) and unread.learner == 1 and unread.expected_round == 2
    expected = average_states([params[0], params[2]], [1.0, 3.0])
    expected_moments = merge_adam_states([moments[0], moments[2]], weights=[1.0, 3.0])
    for result in (first, third):
        assert result.learners == (0, 2) and result.dropped == (1,) and result.weights == (1.0, 3.0)
        state = result.state.materialise(store.get)
        assert same(state.params, expected) and same(state.optimizer_state, expected_moments)
    assert not same(expected, average_states(params, weights))  # not vacuous: learner 1 changes the mean
    [drop] = summary.dropped
    assert (drop["round"], drop["learner"]) == (1, 1) and "unreadable for 7 s" in drop["reason"]
    assert rejoined.next_round == 2 and rejoined.state.round == 1  # it rejoins from the averaged round


def test_a_round_left_below_min_learners_by_unreadable_slices_fails_for_the_others():
    params, moments = learners(2)
    averager = local_averager(
        2, timeout_s=5.0, min_learners=2, shards=1, shard_pool=lambda n: UnreadableOnce(n, 0)
    )
    store = InProcessStore()

    async def round_():
        for j in range(2):
            await averager.join(j, 2)
        sends = [
            averager.average(j, 1, 2, flat_payload(params[j], moments[j], 1, store), None) for j in range(2)
        ]
        return await asyncio.gather(*sends, return_exceptions=True), await averager.summary()

    (unread, other), summary = _run(round_())
    assert isinstance(unread, AveragingTimeoutError) and isinstance(other, AveragingTimeoutError)
    assert other.missing == (0,) and other.arrived == (1,)
    assert summary.next_round == 1 and [d["learner"] for d in summary.dropped] == [0]


def test_star_hub_load_is_about_two_payloads_per_learner():
    """The tensor path (one actor) counts 2 P payloads: the star the shards replace."""
    params, moments = learners(3)
    averager = local_averager(3, timeout_s=30.0)

    async def round_():
        for j in range(3):
            await averager.join(j, 3)
        await asyncio.gather(*(averager.average(j, 1, 3, params[j], moments[j]) for j in range(3)))
        return await averager.summary()

    loads = _run(round_()).hub_load[-1]["actors"]
    payload = FlatLayout.of(params[0], moments[0]).nbytes
    hub = (loads["control"]["received"] + loads["control"]["sent"]) / payload
    assert 5.5 < hub < 6.5


def test_wrong_number_of_parts_is_refused_for_that_learner_only():
    params, moments = learners(1)
    averager = local_averager(1, timeout_s=30.0, shards=2)
    layout = FlatLayout.of(params[0], moments[0])
    buffers, extras = layout.pack(params[0], moments[0])
    payload = FlatPayload(layout, tuple(layout.split(buffers, 3)), extras)

    async def send():
        await averager.join(0, 1)
        return await averager.average(0, 1, 1, payload, None)

    with pytest.raises(ValueError, match="3 parts for 2 shards"):
        _run(send())
    assert InProcessShards(2).count == 2
