"""A learner's state held in the data plane's flat buffers (raytrain_seq.elastic.flat_storage), without Ray.

Contracts pinned: binding moves every parameter, floating buffer and Adam moment into a view of its
buffer without changing a value, once (a second bind moves nothing, a replaced tensor is moved again);
training a bound model gives the bits of an unbound twin, and the buffers are what it trained; slice i of
a buffer is one contiguous array holding the bytes the piece-by-piece path puts; loading an averaged state
in place gives what ``load_averaged`` gives and keeps the optimizer's tensors bound; what cannot be held
(bfloat16, a non-contiguous tensor, tied weights) is named; ``LocalRounds`` puts the bound slices and
falls back to the pieces for a state it cannot bind, with the same averaged result.
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import InProcess
from torch import nn

from raytrain_seq.averaging import average_states, merge_adam_states
from raytrain_seq.elastic.client import AveragerClient
from raytrain_seq.elastic.flat_storage import FlatStorage
from raytrain_seq.elastic.payload import FlatLayout, InProcessStore
from raytrain_seq.elastic.position import EpochPosition
from raytrain_seq.elastic.sync import LocalRounds
from raytrain_seq.runtime.averager import ParameterAverager
from raytrain_seq.step import load_averaged


def model_and_adam(seed: int = 0, *, amsgrad: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A small conv + BatchNorm + linear model and its Adam, with state after one step."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv1d(3, 8, 3), nn.BatchNorm1d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6, 5)
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=amsgrad)
    train(model, optimizer, steps=1, seed=seed)
    return model, optimizer


def train(model: nn.Module, optimizer: torch.optim.Optimizer, *, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(100 + seed)
    for _ in range(steps):
        x, y = torch.randn(4, 3, 8, generator=gen), torch.randint(0, 5, (4,), generator=gen)
        x = x.to(next(model.parameters()).dtype)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def live(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    return model.state_dict(keep_vars=True), optimizer.state_dict()["state"]


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Copies of the model's state_dict and the optimizer's state (nothing shared with the live tensors)."""
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()["state"])


def same_state(a: tuple[dict, dict], b: tuple[dict, dict]) -> bool:
    (pa, ma), (pb, mb) = a, b
    return (
        list(pa) == list(pb)
        and all(pa[k].dtype == pb[k].dtype and torch.equal(pa[k], pb[k]) for k in pa)
        and list(ma) == list(mb)
        and all(
            list(ma[i]) == list(mb[i]) and all(torch.equal(ma[i][n], mb[i][n]) for n in ma[i]) for i in ma
        )
    )


def inside(tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
    start = buffer.data_ptr()
    return start <= tensor.data_ptr() < start + buffer.numel() * buffer.element_size()


def bound(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[FlatStorage, FlatLayout]:
    params, moments = live(model, optimizer)
    layout = FlatLayout.of(params, moments)
    assert FlatStorage.unsupported(layout, params, moments) is None
    storage = FlatStorage(layout)
    storage.bind(params, moments)
    return storage, layout


# ------------------------------------------------------------------------------------------ binding
@pytest.mark.parametrize("amsgrad", [False, True])
def test_bind_moves_every_floating_tensor_into_its_buffer_without_changing_a_value(amsgrad):
    model, optimizer = model_and_adam(amsgrad=amsgrad)
    before = snapshot(model, optimizer)
    params, moments = live(model, optimizer)
    layout = FlatLayout.of(params, moments)
    storage = FlatStorage(layout)
    assert storage.bind(params, moments) == len(layout.slots) > 10  # conv, BN pair, linear, moments
    for slot in layout.slots:
        tensor = layout.tensor_of(params, moments, slot)
        assert inside(tensor, storage.buffers[slot.buffer]), slot.key
        assert torch.equal(
            tensor.detach().reshape(-1), storage.buffers[slot.buffer][slot.offset : slot.offset + slot.numel]
        )
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())
    assert same_state(snapshot(model, optimizer), before)
    # Idempotent: the second bind finds everything in place.
    assert storage.bind(*live(model, optimizer)) == 0 and storage.moved == len(layout.slots)


def test_a_bound_model_trains_to_the_bits_of_an_unbound_twin_and_its_buffers_hold_them():
    model, optimizer = model_and_adam()
    twin = copy.deepcopy(model)
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    storage, layout = bound(model, optimizer)
    train(model, optimizer, steps=3, seed=1)
    train(twin, twin_optimizer, steps=3, seed=1)
    assert same_state(snapshot(model, optimizer), snapshot(twin, twin_optimizer))
    # Not vacuous: training moved the weights, and the buffers moved with them.
    assert not torch.equal(model[0].weight, model_and_adam()[0][0].weight)
    assert storage.bind(*live(model, optimizer)) == 0
    flat = storage.buffers["mean/float32"]
    weight = layout.slots[0]
    assert torch.equal(
        flat[weight.offset : weight.offset + weight.numel], twin.state_dict()[weight.key].reshape(-1)
    )


def test_a_replaced_tensor_is_moved_back_into_its_view():
    model, optimizer = model_and_adam()
    storage, layout = bound(model, optimizer)
    # load_state_dict hands the optimizer new moment tensors (and a new step): they leave the buffers.
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    params, moments = live(model, optimizer)
    moment_slots = [s for s in layout.slots if s.owner == "optimizer"]
    assert not any(
        inside(layout.tensor_of(params, moments, s), storage.buffers[s.buffer]) for s in moment_slots
    )
    values = snapshot(model, optimizer)
    assert storage.bind(params, moments) == len(moment_slots)
    assert all(inside(layout.tensor_of(params, moments, s), storage.buffers[s.buffer]) for s in layout.slots)
    assert same_state(snapshot(model, optimizer), values)


# ------------------------------------------------------------------------------------------- slices
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_slices_are_one_contiguous_array_a_buffer_with_the_bytes_the_pieces_put(shards):
    model, optimizer = model_and_adam()
    storage, layout = bound(model, optimizer)
    params, moments = live(model, optimizer)
    pieces, _, _ = layout.slices(params, moments, shards)
    slices = storage.slices(shards)
    assert len(slices) == shards
    for mine, theirs in zip(slices, pieces, strict=True):
        assert set(mine) == set(theirs)
        for key, array in mine.items():
            assert isinstance(array, np.ndarray) and array.flags.c_contiguous
            assert np.array_equal(array, np.concatenate([np.empty(0, array.dtype), *theirs[key]]))
    # What a put stores is a copy: training on afterwards leaves the stored slices as they were.
    stored = [InProcessStore().put(part) for part in slices]
    kept = [{k: v.copy() for k, v in part.items()} for part in stored]
    train(model, optimizer, steps=1, seed=2)
    assert all(np.array_equal(stored[i][k], kept[i][k]) for i in range(shards) for k in kept[i])


# --------------------------------------------------------------------------------------------- load
@pytest.mark.parametrize("amsgrad", [False, True])
def test_load_in_place_equals_load_averaged_and_keeps_the_optimizer_bound(amsgrad):
    model, optimizer = model_and_adam(0, amsgrad=amsgrad)
    other, other_optimizer = model_and_adam(1, amsgrad=amsgrad)
    train(other, other_optimizer, steps=2, seed=3)  # a different state, with a different Adam step
    averaged = snapshot(other, other_optimizer)
    twin = copy.deepcopy(model)
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2, amsgrad=amsgrad)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    storage, _ = bound(model, optimizer)
    assert storage.matches(*averaged, merge_bn_stats=True)
    params, moments = live(model, optimizer)
    storage.load(*averaged, into_params=params, into_moments=moments)
    load_averaged(twin, twin_optimizer, *copy.deepcopy(averaged))
    assert same_state(snapshot(model, optimizer), snapshot(twin, twin_optimizer))
    assert same_state(snapshot(model, optimizer), averaged)  # not vacuous: the state changed to this
    assert storage.bind(*live(model, optimizer)) == 0  # written in place: nothing left the buffers
    # The loaded state owns nothing of the averaged one: training on changes only the learner's.
    train(model, optimizer, steps=1, seed=4)
    train(twin, twin_optimizer, steps=1, seed=4)
    assert same_state(snapshot(model, optimizer), snapshot(twin, twin_optimizer))
    assert not torch.equal(model[0].weight, averaged[0]["0.weight"])


def test_a_state_of_another_layout_does_not_match():
    model, optimizer = model_and_adam()
    storage, _ = bound(model, optimizer)
    params, moments = snapshot(model, optimizer)
    assert not storage.matches(params, None, merge_bn_stats=True)  # the moments are missing
    assert not storage.matches(
        {k: v for k, v in params.items() if k != "4.bias"}, moments, merge_bn_stats=True
    )
    assert not storage.matches(params, moments, merge_bn_stats=False)  # BN pairs in the mean buffer


# ------------------------------------------------------------------------------------ what it refuses
def test_what_the_buffers_cannot_hold_is_named():
    def reason(model: nn.Module) -> str | None:
        params = model.state_dict(keep_vars=True)
        return FlatStorage.unsupported(FlatLayout.of(params, None), params, None)

    assert reason(nn.Linear(3, 2)) is None
    assert "bfloat16" in reason(nn.Linear(3, 2).to(torch.bfloat16))
    transposed = nn.Linear(3, 2)
    transposed.weight = nn.Parameter(torch.randn(3, 2).t())
    assert "'weight' is not contiguous" in reason(transposed)
    tied = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    tied[1].weight = tied[0].weight
    assert "'0.weight' and model '1.weight' share memory" in reason(tied)


# ------------------------------------------------------------------------------------- LocalRounds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_learners_rounds_give_the_single_process_mean_bound_or_piece_by_piece(dtype):
    """Two LocalRounds through a real in-process averager with 2 shards end on ``average_states`` +
    ``merge_adam_states`` of their states, bit for bit: float32 learners through their bound buffers
    (each slice one array), bfloat16 ones piece by piece (the reason named)."""
    averager = ParameterAverager(2, timeout_s=30.0, shards=2)
    transport = InProcess(averager)
    learners = []
    for j in range(2):
        model, _ = model_and_adam(j)
        model.to(dtype)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        train(model, optimizer, steps=2, seed=j)
        client = AveragerClient(transport, learner=j, world_size=2, incarnation=f"i{j}", round_timeout_s=30.0, store=RecordingPuts())  # fmt: skip
        client.join()
        learners.append((model, optimizer, LocalRounds(client, model, optimizer, k=1), client))
    try:
        for _ in range(2):  # the second round: bound since the first, installed in place
            states = [snapshot(model, optimizer) for model, optimizer, _, _ in learners]
            expected = average_states([p for p, _ in states])
            expected_moments = merge_adam_states([m for _, m in states])
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda learner: learner[2].sync(stats={}, position=EpochPosition(0)), learners))
            for model, optimizer, _, _ in learners:
                assert same_state(snapshot(model, optimizer), (expected, expected_moments))
            for model, optimizer, _, _ in learners:  # the learners part again before the next round
                train(model, optimizer, steps=1, seed=7 + len(learners))
    finally:
        transport.close()
    for _, _, rounds, client in learners:
        puts = client.store.puts[-2:]  # the last round's two slices
        if dtype == torch.float32:
            assert rounds.storage is not None and rounds.unsupported is None
            assert all(isinstance(array, np.ndarray) for part in puts for array in part.values())
            assert rounds.storage.moved == len(rounds.storage.layout.slots)  # bound once, kept bound
        else:
            assert rounds.storage is None and "bfloat16" in rounds.unsupported
            assert all(isinstance(array, tuple) for part in puts for array in part.values())


class RecordingPuts(InProcessStore):
    """The in-process store, keeping what each put was handed."""

    def __init__(self) -> None:
        self.puts: list[dict] = []

    def put(self, value):
        self.puts.append(value)
        return super().put(value)
