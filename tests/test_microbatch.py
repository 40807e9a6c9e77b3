"""Micro-batch streaming: exact gradients for any split, validation, the fit finder, BatchNorm warning."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

from raytrain_seq.algorithms.microbatch import MicroBatchSizer, accumulate

SLOTS, FEATURES, OUT = 3, 5, 2
ROWS = 37
LOGGER = "raytrain_seq.algorithms.microbatch"


class SlotMLP(nn.Module):
    """An MLP applied to every item slot of a row, plus a parameter the loss never touches."""

    def __init__(self, dtype: torch.dtype = torch.float64, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, OUT)).to(dtype)
        self.unused = nn.Parameter(torch.zeros(3, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def block_rows(
    rows: int = ROWS, dtype: torch.dtype = torch.float64, seed: int = 1
) -> dict[str, torch.Tensor]:
    """Rows of 3 item slots, each row holding 0..3 real items (``num_sequences``), like packed Blocks."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(rows, SLOTS, FEATURES, generator=gen, dtype=dtype),
        "y": torch.randn(rows, SLOTS, OUT, generator=gen, dtype=dtype),
        "num_sequences": torch.randint(0, SLOTS + 1, (rows,), generator=gen),
    }


def slot_loss(model: nn.Module, mb: dict[str, torch.Tensor]):
    """Sum of the squared errors of the real item slots, and how many real items there are."""
    per_item = ((model(mb["x"]) - mb["y"]) ** 2).sum(-1)
    mask = torch.arange(SLOTS) < mb["num_sequences"][:, None]
    return (per_item * mask).sum(), mask.sum()


def tensor_loss(model: nn.Module, x: torch.Tensor):
    """One item per row: a regression of sin(x[:, :2]); returns (loss sum, rows) with an int count."""
    return ((model(x) - torch.sin(x[:, :OUT])) ** 2).sum(), int(x.shape[0])


def flat_grad(model: nn.Module) -> torch.Tensor:
    """All parameter gradients in one vector, a missing gradient read as zeros."""
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()]
    )


def reference(model: nn.Module, batch, loss_fn) -> tuple[torch.Tensor, float]:
    """One backward of (sum over all items) / (count) on the whole batch in one go."""
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    loss_sum, count = loss_fn(ref, batch)
    (loss_sum / count).backward()
    return flat_grad(ref), float(loss_sum.detach() / count)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def micro_batch_counts(batch, size: int) -> list[int]:
    nums = batch["num_sequences"]
    return [int(nums[lo : lo + size].sum()) for lo in range(0, nums.shape[0], size)]


@pytest.mark.parametrize("size", [1, 7, 16, ROWS, 100])
def test_dict_batch_gradient_equals_full_batch_float64(size):
    """Any split of Block-like rows (0..3 items each) leaves the full-batch gradient (float64, 1e-9)."""
    model, batch = SlotMLP(), block_rows()
    nums = batch["num_sequences"]
    assert (nums == 0).any() and (nums == SLOTS).any()  # filler rows and full rows both present
    if 1 < size < ROWS:
        assert len(set(micro_batch_counts(batch, size))) > 1  # uneven item counts across micro-batches
    want, want_loss = reference(model, batch, slot_loss)
    got_loss = accumulate(model, batch, slot_loss, micro_batch_size=size)
    assert rel_err(flat_grad(model), want) < 1e-9
    assert isinstance(got_loss, float)
    assert got_loss == pytest.approx(want_loss, rel=1e-12)


@pytest.mark.parametrize("size", [1, 7, 16, ROWS, 100])
def test_tensor_batch_gradient_equals_full_batch_float64(size):
    """A plain tensor batch (one item per row, uneven last micro-batch) gets the full-batch gradient."""
    model = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, OUT)).double()
    x = torch.randn(ROWS, FEATURES, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    want, want_loss = reference(model, x, tensor_loss)
    got_loss = accumulate(model, x, tensor_loss, micro_batch_size=size)
    assert rel_err(flat_grad(model), want) < 1e-9
    assert got_loss == pytest.approx(want_loss, rel=1e-12)


def paper_rule(model: nn.Module, batch, loss_fn, size: int) -> torch.Tensor:
    """MBS Algorithm 1: each micro-batch's MEAN loss divided by the number of micro-batches."""
    model.zero_grad(set_to_none=True)
    rows = batch.shape[0] if isinstance(batch, torch.Tensor) else batch["x"].shape[0]
    starts = list(range(0, rows, size))
    for lo in starts:
        mb = (
            batch[lo : lo + size]
            if isinstance(batch, torch.Tensor)
            else {k: v[lo : lo + size] for k, v in batch.items()}
        )
        loss_sum, count = loss_fn(model, mb)
        (loss_sum / count / len(starts)).backward()
    return flat_grad(model)


def test_paper_rule_is_wrong_when_uneven_and_right_when_even():
    """The paper's normalisation differs from the full-batch gradient for uneven splits (ours does not)."""
    model, batch = SlotMLP(), block_rows()
    want, _ = reference(model, batch, slot_loss)
    assert rel_err(paper_rule(copy.deepcopy(model), batch, slot_loss, 16), want) > 1e-3
    accumulate(model, batch, slot_loss, micro_batch_size=16)
    assert rel_err(flat_grad(model), want) < 1e-9

    mlp = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, OUT)).double()
    x = torch.randn(ROWS, FEATURES, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want_x, _ = reference(mlp, x, tensor_loss)
    assert rel_err(paper_rule(copy.deepcopy(mlp), x, tensor_loss, 16), want_x) > 1e-3  # 16, 16, 5 rows
    # Even split, one item per row: the paper's rule is exact, so the helper above is the paper's rule.
    even = x[:32]
    want_even, _ = reference(mlp, even, tensor_loss)
    assert rel_err(paper_rule(copy.deepcopy(mlp), even, tensor_loss, 8), want_even) < 1e-9


@pytest.mark.parametrize("size", [1, 7, 16, ROWS])
def test_float32_gradient_within_1e_5(size):
    """In float32 the split gradient matches the float32 full-batch gradient to 1e-5 relative."""
    model, batch = SlotMLP(torch.float32), block_rows(dtype=torch.float32)
    want, _ = reference(model, batch, slot_loss)
    accumulate(model, batch, slot_loss, micro_batch_size=size)
    assert rel_err(flat_grad(model), want) < 1e-5


def test_custom_count_items_counts_tokens():
    """count_items decides the normaliser: here real item slots counted from a mask, no num_sequences key."""
    model, batch = SlotMLP(), block_rows()
    mask = torch.arange(SLOTS) < batch.pop("num_sequences")[:, None]
    batch["mask"] = mask

    def masked_loss(m, mb):
        per_item = ((m(mb["x"]) - mb["y"]) ** 2).sum(-1)
        return (per_item * mb["mask"]).sum(), int(mb["mask"].sum())

    want, _ = reference(model, batch, masked_loss)
    accumulate(model, batch, masked_loss, micro_batch_size=5, count_items=lambda b: int(b["mask"].sum()))
    assert rel_err(flat_grad(model), want) < 1e-9
    # Without count_items the default counts rows (no num_sequences key), which disagrees with loss_fn.
    assert int(mask.sum()) != ROWS
    with pytest.raises(ValueError, match="count_items"):
        accumulate(model, batch, masked_loss, micro_batch_size=5)


def test_count_mismatch_raises_and_clears_grads():
    """Counts from loss_fn that do not add up to count_items(batch) raise ValueError; no stale grads stay."""
    model, batch = SlotMLP(), block_rows()
    assert int(batch["num_sequences"].sum()) != 5
    with pytest.raises(ValueError, match="count_items counted 5"):
        accumulate(model, batch, slot_loss, micro_batch_size=7, count_items=lambda b: 5)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="whole number"):
        accumulate(model, batch, slot_loss, micro_batch_size=7, count_items=lambda b: -1)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "16", "Auto", True, None])
def test_bad_micro_batch_size(bad):
    """micro_batch_size must be an int >= 1 or 'auto'; the error names the argument and the fix."""
    with pytest.raises(ValueError, match=r"micro_batch_size=.*pass an int >= 1"):
        accumulate(SlotMLP(), block_rows(), slot_loss, micro_batch_size=bad)


def test_bad_batches_and_loss_fns():
    """Bad batch types, ragged dicts, and malformed loss_fn results raise errors naming the culprit."""
    model, batch = SlotMLP(), block_rows()
    with pytest.raises(TypeError, match="dict of tensors or a tensor"):
        accumulate(model, [batch["x"]], slot_loss, micro_batch_size=4)
    with pytest.raises(TypeError, match=r"batch\['ids'\]"):
        accumulate(model, {**batch, "ids": list(range(ROWS))}, slot_loss, micro_batch_size=4)
    with pytest.raises(ValueError, match=r"batch\['y'\] has 36 rows"):
        accumulate(model, {**batch, "y": batch["y"][:-1]}, slot_loss, micro_batch_size=4)
    with pytest.raises(ValueError, match=r"batch\['w'\] is a 0-dim"):
        accumulate(model, {**batch, "w": torch.tensor(1.0)}, slot_loss, micro_batch_size=4)
    with pytest.raises(ValueError, match="0-dim tensor"):
        accumulate(model, torch.tensor(1.0), tensor_loss, micro_batch_size=4)
    with pytest.raises(ValueError, match="empty dict"):
        accumulate(model, {}, slot_loss, micro_batch_size=4)
    with pytest.raises(ValueError, match="device='gpu0'"):
        accumulate(model, batch, slot_loss, micro_batch_size=4, device="gpu0")
    with pytest.raises(TypeError, match=r"rows 0:4.*\(loss_sum, item_count\)"):
        accumulate(model, batch, lambda m, mb: slot_loss(m, mb)[0], micro_batch_size=4)
    with pytest.raises(ValueError, match="does not require grad"):
        accumulate(model, batch, lambda m, mb: (torch.zeros(()), 0), micro_batch_size=4)
    with pytest.raises(TypeError, match="loss_fn is not callable"):
        accumulate(model, batch, "mse", micro_batch_size=4)
    with pytest.raises(TypeError, match="count_items is not callable"):
        accumulate(model, batch, slot_loss, micro_batch_size=4, count_items=5)


def test_all_filler_batch_runs_no_forward_and_leaves_zero_grads():
    """A batch of 0 items returns 0.0, never calls loss_fn, and leaves all-zero grads (garbage replaced)."""
    model, batch = SlotMLP(), block_rows()
    batch["num_sequences"].zero_()
    for p in model.parameters():
        p.grad = torch.full_like(p, 123.0)
    calls = []
    result = accumulate(model, batch, lambda m, mb: calls.append(mb) or slot_loss(m, mb), micro_batch_size=7)
    assert result == 0.0 and calls == []
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_grads_are_zeroed_first_and_unused_params_get_zeros():
    """Garbage already in .grad does not leak into the result; an unused parameter ends with zeros."""
    model, batch = SlotMLP(), block_rows()
    want, _ = reference(model, batch, slot_loss)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e3)
    accumulate(model, batch, slot_loss, micro_batch_size=7)
    assert rel_err(flat_grad(model), want) < 1e-9
    assert model.unused.grad is not None and not model.unused.grad.any()


def bn_model() -> nn.Module:
    torch.manual_seed(4)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, OUT)).double()


def test_batchnorm_warning_once_per_model(caplog):
    """A training-mode BatchNorm model that is really split gets exactly one warning naming GroupNorm."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    x = torch.randn(ROWS, FEATURES, dtype=torch.float64)
    model = bn_model()
    accumulate(model, x, tensor_loss, micro_batch_size=ROWS)  # one micro-batch: statistics unchanged
    assert not caplog.records
    for _ in range(3):
        accumulate(model, x, tensor_loss, micro_batch_size=8)
    warnings = [r for r in caplog.records if "GroupNorm" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    accumulate(bn_model(), x, tensor_loss, micro_batch_size=8)  # a second model gets its own warning
    assert len([r for r in caplog.records if "GroupNorm" in r.getMessage()]) == 2
    accumulate(bn_model().eval(), x, tensor_loss, micro_batch_size=8)  # eval mode: running stats only
    assert len(caplog.records) == 2


def test_auto_on_cpu_is_the_whole_batch():
    """micro_batch_size='auto' on CPU runs the whole batch as one micro-batch, exactly."""
    model, batch = SlotMLP(), block_rows()
    want, _ = reference(model, batch, slot_loss)
    sizes, sizer = [], MicroBatchSizer()
    loss_fn = lambda m, mb: sizes.append(mb["x"].shape[0]) or slot_loss(m, mb)  # noqa: E731
    accumulate(model, batch, loss_fn, micro_batch_size="auto", sizer=sizer)
    assert sizes == [ROWS]
    assert sizer.known(model, batch) is None
    assert rel_err(flat_grad(model), want) < 1e-9


def fake_oom(loss_fn, limit: int, sizes: list[int]):
    """Like loss_fn, but a micro-batch of more than ``limit`` rows 'runs out of memory' after its forward."""

    def wrapped(model, mb):
        rows = (mb if isinstance(mb, torch.Tensor) else mb["x"]).shape[0]
        sizes.append(rows)
        out = loss_fn(model, mb)
        if rows > limit:
            raise torch.cuda.OutOfMemoryError(f"fake: {rows} rows > {limit}")
        return out

    return wrapped


def test_auto_halves_after_oom_remembers_and_stays_exact(caplog):
    """After OOMs the sizer halves 37 -> 19 -> 10, restarts the mini-batch exactly, and remembers 10."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    model, batch = SlotMLP(), block_rows()
    want, want_loss = reference(model, batch, slot_loss)
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    sizes, sizer = [], MicroBatchSizer()
    got_loss = accumulate(model, batch, fake_oom(slot_loss, 10, sizes), micro_batch_size="auto", sizer=sizer)
    assert sizes == [37, 19, 10, 10, 10, 7]
    assert sizer.known(model, batch) == 10
    assert rel_err(flat_grad(model), want) < 1e-9
    assert got_loss == pytest.approx(want_loss, rel=1e-12)
    sizes.clear()
    accumulate(model, batch, fake_oom(slot_loss, 10, sizes), micro_batch_size="auto", sizer=sizer)
    assert sizes == [10, 10, 10, 7]  # the remembered size, no new failures
    assert len([r for r in caplog.records if "10 fits" in r.getMessage()]) == 1
    # Another per-sample shape or another model starts from its whole batch again.
    other = {**batch, "x": batch["x"][..., :4]}
    assert sizer.known(model, other) is None and sizer.known(SlotMLP(), batch) is None


def test_oom_retry_restores_batchnorm_statistics():
    """A failed attempt's forwards leave no trace in BatchNorm running statistics."""
    x = torch.randn(ROWS, FEATURES, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    model, sizes = bn_model(), []
    expected = copy.deepcopy(model)
    accumulate(model, x, fake_oom(tensor_loss, 10, sizes), micro_batch_size="auto", sizer=MicroBatchSizer())
    assert sizes == [37, 19, 10, 10, 10, 7]  # two failed forwards ran before the good pass
    for lo in range(0, ROWS, 10):
        expected(x[lo : lo + 10])
    bn, bn_expected = model[1], expected[1]
    assert int(bn.num_batches_tracked) == 4
    assert torch.equal(bn.running_mean, bn_expected.running_mean)
    assert torch.equal(bn.running_var, bn_expected.running_var)


def test_oom_at_size_one_and_other_errors_propagate():
    """An OOM with one-row micro-batches, or any non-OOM error, reaches the caller."""
    model, batch = SlotMLP(), block_rows()
    sizes: list[int] = []
    with pytest.raises(torch.cuda.OutOfMemoryError):
        accumulate(
            model, batch, fake_oom(slot_loss, 0, sizes), micro_batch_size="auto", sizer=MicroBatchSizer()
        )
    assert sizes == [37, 19, 10, 5, 3, 2, 1]
    assert all(p.grad is None for p in model.parameters())  # no half-accumulated gradient is left

    def broken(m, mb):
        sizes.append(-1)
        raise RuntimeError("not memory")

    sizes.clear()
    with pytest.raises(RuntimeError, match="not memory"):
        accumulate(model, batch, broken, micro_batch_size="auto", sizer=MicroBatchSizer())
    assert sizes == [-1]


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def keep_stream_busy(device, size=1024, rounds=4):
    """Queue a few matmuls on the current stream (their result is unused; entries of 1 / size stay exactly
    1 / size, so nothing overflows): a public stand-in for a kernel busy-wait, so that work queued after it
    waits on the device."""
    busy = torch.full((size, size), 1.0 / size, device=device)
    for _ in range(rounds):
        busy = busy @ busy


def cuda_slot_loss(model, mb):
    """slot_loss on the GPU, with busy work queued first so prefetches really overlap the computation."""
    assert mb["x"].is_cuda and mb["num_sequences"].is_cuda
    keep_stream_busy(mb["x"].device)
    per_item = ((model(mb["x"]) - mb["y"]) ** 2).sum(-1)
    mask = torch.arange(SLOTS, device=mb["x"].device) < mb["num_sequences"][:, None]
    return (per_item * mask).sum(), mask.sum()


@needs_cuda
@pytest.mark.parametrize("size", [1, 7, ROWS])
def test_cuda_streaming_from_host_is_exact(size):
    """Host batches streamed to the GPU (pinned, non-blocking, prefetched) give the full-batch gradient."""
    model, batch = SlotMLP().cuda(), block_rows(rows=301)
    want, want_loss = reference(model, {k: v.cuda() for k, v in batch.items()}, slot_loss_on_device)
    got_loss = accumulate(model, batch, cuda_slot_loss, micro_batch_size=size)
    assert rel_err(flat_grad(model), want) < 1e-9
    assert got_loss == pytest.approx(want_loss, rel=1e-12)


def slot_loss_on_device(model, mb):
    per_item = ((model(mb["x"]) - mb["y"]) ** 2).sum(-1)
    mask = torch.arange(SLOTS, device=mb["x"].device) < mb["num_sequences"][:, None]
    return (per_item * mask).sum(), mask.sum()


@needs_cuda
def test_cuda_auto_and_fake_oom_are_exact():
    """On CUDA 'auto' fits the whole small batch, and halves after an OOM with the gradient still exact."""
    model, batch = SlotMLP().cuda(), block_rows()
    want, _ = reference(model, {k: v.cuda() for k, v in batch.items()}, slot_loss_on_device)
    sizer, sizes = MicroBatchSizer(), []
    accumulate(model, batch, cuda_slot_loss, micro_batch_size="auto", sizer=sizer)
    assert sizer.known(model, batch) is None
    assert rel_err(flat_grad(model), want) < 1e-9
    accumulate(model, batch, fake_oom(cuda_slot_loss, 10, sizes), micro_batch_size="auto", sizer=sizer)
    assert sizes == [37, 19, 10, 10, 10, 7]
    assert rel_err(flat_grad(model), want) < 1e-9
