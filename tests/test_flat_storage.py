"""A learner's state held in the data plane's flat buffers (raytrain_seq.dataplane.flat_storage), without Ray.

Contracts pinned: binding moves every parameter, floating buffer and Adam moment into a view of its
buffer without changing a value, once (a second bind moves nothing, a replaced tensor is moved again);
training a bound model gives the bits of an unbound twin, and the buffers are what it trained; slice i of
a buffer is one contiguous array holding the bytes the piece-by-piece path puts; loading an averaged state
in place gives what ``load_averaged`` gives and keeps the optimizer's tensors bound; what cannot be held
(bfloat16, a non-contiguous tensor, tied weights) is named; ``LocalRounds`` puts the bound slices and
falls back to the pieces for a state it cannot bind, with the same averaged result. Where a GPU is, the
same contracts hold for a learner on CUDA (its slices through reused pinned host copies, an averaged
state from the host written into its device views); elsewhere those cases skip.
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from averager_fixtures import local_averager
from conftest import InProcess
from torch import nn

from raytrain_seq.algorithms.averaging import average_states, merge_adam_states
from raytrain_seq.dataplane.flat_storage import FlatStorage
from raytrain_seq.dataplane.payload import FlatLayout
from raytrain_seq.dataplane.stores import InProcessStore
from raytrain_seq.rounds.client import AveragerClient
from raytrain_seq.rounds.position import EpochPosition
from raytrain_seq.rounds.sync import LocalRounds
from raytrain_seq.training.step import load_averaged

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


@pytest.fixture(autouse=True)
def deterministic_cudnn():
    """cuDNN picks its convolution algorithms by timing them, and some accumulate with atomics: bit-for-bit
    comparisons of two CUDA models need the deterministic ones."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def model_and_adam(
    seed: int = 0, *, amsgrad: bool = False, device: str = "cpu"
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A small conv + BatchNorm + linear model on ``device`` and its Adam, with state after one step."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv1d(3, 8, 3), nn.BatchNorm1d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6, 5)
    ).to(device)  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=amsgrad)
    train(model, optimizer, steps=1, seed=seed)
    return model, optimizer


def train(model: nn.Module, optimizer: torch.optim.Optimizer, *, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(100 + seed)
    for _ in range(steps):
        x, y = torch.randn(4, 3, 8, generator=gen), torch.randint(0, 5, (4,), generator=gen)
        weight = next(model.parameters())
        x, y = x.to(weight.device, weight.dtype), y.to(weight.device)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def live(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    return model.state_dict(keep_vars=True), optimizer.state_dict()["state"]


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Copies of the model's state_dict and the optimizer's state (nothing shared with the live tensors)."""
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()["state"])


def on_cpu(state: tuple[dict, dict]) -> tuple[dict, dict]:
    """A snapshot's tensors copied to the host (bits unchanged), to compare with a host reference."""
    params, moments = state
    return (
        {k: v.cpu() for k, v in params.items()},
        {
            i: {n: v.cpu() if isinstance(v, torch.Tensor) else v for n, v in e.items()}
            for i, e in moments.items()
        },
    )


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
    storage = FlatStorage(layout, next(model.parameters()).device)
    storage.bind(params, moments)
    return storage, layout


# ------------------------------------------------------------------------------------------ binding
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("amsgrad", [False, True])
def test_bind_moves_every_floating_tensor_into_its_buffer_without_changing_a_value(amsgrad, device):
    model, optimizer = model_and_adam(amsgrad=amsgrad, device=device)
    before = snapshot(model, optimizer)
    params, moments = live(model, optimizer)
    layout = FlatLayout.of(params, moments)
    storage = FlatStorage(layout, device)
    assert all(buffer.device.type == device for buffer in storage.buffers.values())
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


@pytest.mark.parametrize("device", DEVICES)
def test_a_bound_model_trains_to_the_bits_of_an_unbound_twin_and_its_buffers_hold_them(device):
    model, optimizer = model_and_adam(device=device)
    twin = copy.deepcopy(model)
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    storage, layout = bound(model, optimizer)
    train(model, optimizer, steps=3, seed=1)
    train(twin, twin_optimizer, steps=3, seed=1)
    assert same_state(snapshot(model, optimizer), snapshot(twin, twin_optimizer))
    # Not vacuous: training moved the weights, and the buffers moved with them.
    assert not torch.equal(model[0].weight, model_and_adam(device=device)[0][0].weight)
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


def test_it_holds_the_live_state_until_a_tensor_or_a_key_moves():
    """``holds``: every slotted tensor its own view under the layout's keys, so that the layout of the
    live state is the storage's (checked against ``FlatLayout.of``); a replaced tensor, a new optimizer
    entry, a missing key or missing moments are not held."""
    model, optimizer = model_and_adam()
    storage, _ = bound(model, optimizer)
    params, moments = live(model, optimizer)
    assert storage.holds(params, moments)
    assert FlatLayout.of(params, moments).signature == storage.layout.signature
    train(model, optimizer, steps=2, seed=5)  # in-place updates keep the views
    assert storage.holds(*live(model, optimizer))
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # new moment tensors
    assert not storage.holds(*live(model, optimizer))
    storage.bind(*live(model, optimizer))
    assert storage.holds(*live(model, optimizer))
    params, moments = live(model, optimizer)
    assert not storage.holds({k: v for k, v in params.items() if k != "4.bias"}, moments)
    assert not storage.holds(params, None)
    assert not storage.holds(params, {**moments, 99: {"step": torch.tensor(1.0)}})
    fresh = torch.optim.Adam(model.parameters(), lr=1e-2)  # no state yet: no moment keys
    assert not storage.holds(params, fresh.state_dict()["state"])


# ------------------------------------------------------------------------------------------- slices
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_slices_are_one_contiguous_array_a_buffer_with_the_bytes_the_pieces_put(shards, device):
    model, optimizer = model_and_adam(device=device)
    storage, layout = bound(model, optimizer)
    pieces, _, _ = layout.slices(*on_cpu(live(model, optimizer)), shards)  # the host path's pieces
    slices = storage.slices(shards)
    assert len(slices) == shards
    for mine, theirs in zip(slices, pieces, strict=True):
        assert set(mine) == set(theirs)
        for key, array in mine.items():
            assert isinstance(array, np.ndarray) and array.flags.c_contiguous
            assert np.array_equal(array, np.concatenate([np.empty(0, array.dtype), *theirs[key]]))
    if device == "cuda":
        # Host copies in reused pinned buffers: the next round's slices land in the same memory.
        again = storage.slices(shards)
        assert all(np.shares_memory(again[i][k], slices[i][k]) for i in range(shards) for k in slices[i])
        assert all(torch.from_numpy(array).is_pinned() for part in again for array in part.values())
    # What a put stores is a copy: training on afterwards leaves the stored slices as they were.
    stored = [InProcessStore().put(part) for part in slices]
    kept = [{k: v.copy() for k, v in part.items()} for part in stored]
    train(model, optimizer, steps=1, seed=2)
    assert all(np.array_equal(stored[i][k], kept[i][k]) for i in range(shards) for k in kept[i])


# --------------------------------------------------------------------------------------------- load
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("amsgrad", [False, True])
def test_load_in_place_equals_load_averaged_and_keeps_the_optimizer_bound(amsgrad, device):
    model, optimizer = model_and_adam(0, amsgrad=amsgrad, device=device)
    other, other_optimizer = model_and_adam(1, amsgrad=amsgrad)
    train(other, other_optimizer, steps=2, seed=3)  # a different state, with a different Adam step
    averaged = snapshot(other, other_optimizer)  # on the host, as an averaged state arrives
    twin = copy.deepcopy(model)
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2, amsgrad=amsgrad)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    storage, _ = bound(model, optimizer)
    assert storage.matches(*averaged, merge_bn_stats=True)
    params, moments = live(model, optimizer)
    storage.load(*averaged, into_params=params, into_moments=moments)
    load_averaged(twin, twin_optimizer, *copy.deepcopy(averaged))
    assert same_state(snapshot(model, optimizer), snapshot(twin, twin_optimizer))
    assert same_state(on_cpu(snapshot(model, optimizer)), averaged)  # not vacuous: the state changed to this
    assert model[0].weight.device.type == device
    assert storage.bind(*live(model, optimizer)) == 0  # written in place: nothing left the buffers
    # The loaded state owns nothing of the averaged one: training on changes only the learner's.
    train(model, optimizer, steps=1, seed=4)
    train(twin, twin_optimizer, steps=1, seed=4)
    assert same_state(snapshot(model, optimizer), snapshot(twin, twin_optimizer))
    assert not torch.equal(model[0].weight.cpu(), averaged[0]["0.weight"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shards", [1, 3])
def test_load_slices_equals_load_of_the_unpacked_state_one_copy_a_slice(shards, device):
    """Installing a round's merged slices as they are (one copy a slice and buffer, the values not
    averaged from the extras) gives the bits ``load`` of the unpacked state gives, and keeps the
    optimizer bound; slices of another cut, or a learner's pieces, are refused by name."""
    model, optimizer = model_and_adam(0, device=device)
    other, other_optimizer = model_and_adam(1)
    train(other, other_optimizer, steps=2, seed=3)  # another state, another Adam step
    layout = FlatLayout.of(*live(other, other_optimizer))
    buffers, extras = layout.pack(*live(other, other_optimizer))
    parts = layout.split(buffers, shards)  # what the shards return: one array a buffer and slice
    twin = copy.deepcopy(model)
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    storage, mine = bound(model, optimizer)
    twin_storage, _ = bound(twin, twin_optimizer)
    assert mine.signature == layout.signature
    storage.load_slices(
        parts,
        extras,
        into_params=model.state_dict(keep_vars=True),
        into_moments=optimizer.state_dict()["state"],
    )
    unpacked = layout.unpack(parts, extras)
    twin_storage.load(
        *unpacked,
        into_params=twin.state_dict(keep_vars=True),
        into_moments=twin_optimizer.state_dict()["state"],
    )
    assert same_state(snapshot(model, optimizer), snapshot(twin, twin_optimizer))
    assert same_state(on_cpu(snapshot(model, optimizer)), snapshot(other, other_optimizer))  # not vacuous
    assert storage.bind(*live(model, optimizer)) == 0
    with pytest.raises(ValueError, match="not this layout's"):
        storage.load_slices(
            layout.split(buffers, shards + 1)[:shards], extras, into_params={}, into_moments=None
        )
    pieces, _, _ = layout.slices(*on_cpu(live(other, other_optimizer)), 2)
    with pytest.raises(TypeError, match="merged slices"):
        storage.load_slices(pieces, extras, into_params={}, into_moments=None)


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
@pytest.mark.parametrize(
    ("dtype", "device"),
    [
        (torch.float32, "cpu"),
        (torch.bfloat16, "cpu"),
        pytest.param(torch.float32, "cuda", marks=DEVICES[1].marks),
    ],
)
def test_two_learners_rounds_give_the_single_process_mean_bound_or_piece_by_piece(dtype, device, monkeypatch):
    """Two LocalRounds through a real in-process averager with 2 shards end on ``average_states`` +
    ``merge_adam_states`` of their states (on the host), bit for bit: float32 learners through their
    bound buffers (each slice one array), bfloat16 ones piece by piece (the reason named); a CUDA
    learner's state stays on its device. A bound learner builds its layout at its first round only."""
    built, original = [], FlatLayout.of

    def counted(params, moments, **kwargs):
        built.append(len(params))
        return original(params, moments, **kwargs)

    monkeypatch.setattr(FlatLayout, "of", staticmethod(counted))
    averager = local_averager(2, timeout_s=30.0, shards=2)
    transport = InProcess(averager)
    learners = []
    for j in range(2):
        model, _ = model_and_adam(j, device=device)
        model.to(dtype)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        train(model, optimizer, steps=2, seed=j)
        client = AveragerClient(transport, learner=j, world_size=2, incarnation=f"i{j}", round_timeout_s=30.0, store=RecordingPuts())  # fmt: skip
        client.join()
        learners.append((model, optimizer, LocalRounds(client, model, optimizer, k=1, device=device), client))
    try:
        for _ in range(2):  # the second round: bound since the first, installed in place
            states = [on_cpu(snapshot(model, optimizer)) for model, optimizer, _, _ in learners]
            expected = average_states([p for p, _ in states])
            expected_moments = merge_adam_states([m for _, m in states])
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda learner: learner[2].sync(stats={}, position=EpochPosition(0)), learners))
            for model, optimizer, _, _ in learners:
                assert same_state(on_cpu(snapshot(model, optimizer)), (expected, expected_moments))
                assert model[0].weight.device.type == device
            for model, optimizer, _, _ in learners:  # the learners part again before the next round
                train(model, optimizer, steps=1, seed=7 + len(learners))
    finally:
        transport.close()
    for _, _, rounds, client in learners:
        puts = client.store.puts[-2:]  # the last round's two slices
        if dtype == torch.float32:
            assert rounds.storage is not None and rounds.unsupported is None
            assert len(built) == 2  # one layout a learner, at its first round
            assert client.held.flat.local  # held as the merged slices, installed a slice at a time
            assert all(isinstance(array, np.ndarray) for part in puts for array in part.values())
            assert rounds.storage.moved == len(rounds.storage.layout.slots)  # bound once, kept bound
        else:
            assert rounds.storage is None and "bfloat16" in rounds.unsupported
            assert len(built) == 4  # nothing bound: a layout every round
            assert all(isinstance(array, tuple) for part in puts for array in part.values())


class RecordingPuts(InProcessStore):
    """The in-process store, keeping what each put was handed."""

    def __init__(self) -> None:
        self.puts: list[dict] = []

    def put(self, value):
        self.puts.append(value)
        return super().put(value)


class Recurrent(nn.Module):
    """A linear encoder and a GRU: the learner's model in miniature, with recurrent weights to mirror."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(3, 6)
        self.gru = nn.GRU(6, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(self.encoder(x))[0][:, -1]


@pytest.mark.parametrize("device", DEVICES)
def test_recurrent_weights_are_mirrored_in_one_chunk_of_their_own_through_rounds(device):
    """A recurrent module's weights stay out of the flat buffers (cuDNN runs an RNN from one weight chunk
    of its own: a view of the round's buffer would make every forward copy and warn): the storage mirrors
    them. A put carries their values as trained since the bind, a load writes the merged values into
    them in place, ``holds`` stays true, and ``compact_recurrent`` (what ``LocalRounds.install`` ends with)
    leaves them one chunk (``is_compact``; on CUDA cuDNN's, with no "not part of single contiguous chunk"
    warning from a forward)."""
    import warnings

    from raytrain_seq.models import compact_recurrent, is_compact, recurrent_keys

    torch.manual_seed(0)
    model = Recurrent().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(5, 7, 3, device=device)

    def step() -> None:
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    step()
    keys = recurrent_keys(model)
    assert keys == {f"gru.{n}" for n in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")}
    params, moments = live(model, optimizer)
    layout = FlatLayout.of(params, moments)
    storage = FlatStorage(layout, device, mirrored=keys)
    moved = storage.bind(params, moments)
    assert moved == len(layout.slots) - 4  # the encoder's weights and every Adam moment are bound
    assert not any(inside(w, b) for w in model.gru.parameters() for b in storage.buffers.values())
    assert inside(model.encoder.weight, storage.buffers["mean/float32"])
    step()  # training moves the mirrored weights in their own storage
    assert storage.holds(*live(model, optimizer))
    sent = storage.slices(2)
    # The put carries the GRU's values as trained: its slot's bytes equal the live weight.
    for slot in layout.slots:
        if slot.owner == "model" and slot.key in keys:
            flat = np.concatenate([part[slot.buffer] for part in sent])
            got = torch.from_numpy(flat[slot.offset : slot.offset + slot.numel].copy()).view(slot.shape)
            assert torch.equal(got, params[slot.key].detach().cpu())
    merged = [{key: np.full_like(value, 0.25) for key, value in part.items()} for part in sent]
    extras = layout.extras(params, moments)
    storage.load_slices(merged, extras, into_params=params, into_moments=moments)
    assert all(torch.all(w == 0.25) for w in model.gru.parameters())
    assert not any(inside(w, b) for w in model.gru.parameters() for b in storage.buffers.values())
    assert compact_recurrent(model) == 1 and is_compact(model.gru)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # cuDNN's "not part of single contiguous chunk" would raise here
        model(x)
