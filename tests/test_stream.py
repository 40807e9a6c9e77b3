"""The learner's persistent row stream and the final augmentation on the learner's device (no Ray)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from raytrain_seq.algorithms.augment import final_augment_batch
from raytrain_seq.rows.assembly import BlockSpec, EpochShard, assemble_rows, shard_items
from raytrain_seq.rows.stream import RowStream
from raytrain_seq.training.staging import RowPrefetcher, host_rows, stage_rows


def _shard(blocks, *, channels: int, epoch: int = 4, center: bool = False) -> EpochShard:
    return EpochShard(
        split="train", epoch=epoch, rank=0, world_size=1, blocks=tuple(blocks), t_max=12, max_sequences=3,
        crop=5, channels=channels, seed=7, center=center, recomputed=0, reused=0, size=8,
    )  # fmt: skip


BLOCKS = [
    BlockSpec((10, 11), (0, 5), (5, 3), (0, 0), (1, 2), plan_index=3),
    BlockSpec((11, 12, 10), (0, 4, 6), (4, 2, 5), (5, 0, 0), (2, 0, 1), plan_index=0),  # a chunk piece
    BlockSpec((), (), (), (), (), plan_index=-1),  # a filler
    BlockSpec((12,), (0,), (7,), (0,), (0,), plan_index=9),
]


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))],
)
@pytest.mark.parametrize("channels", [3, 2])
def test_device_crop_and_flip_equal_the_cpu_rows(channels, device):
    """Rows left uncropped for the learner, then final_augment_batch (via stage_rows, on the learner's
    device), give exactly the frames assemble_rows' per-sequence CPU final_augment gives: same final_rng
    draws, flow x negated."""
    rng = np.random.default_rng(1)
    arrays = {
        v: rng.integers(1, 256, (n, 8, 8, channels), dtype=np.uint8) for v, n in [(10, 6), (11, 9), (12, 7)]
    }
    shard = _shard(BLOCKS, channels=channels)
    items = shard_items(shard)
    batch = {key: np.stack([item[key] for item in items]) for key in items[0]}
    cpu = assemble_rows(batch, arrays, shard.row_format)
    deferred = assemble_rows(batch, arrays, dataclasses.replace(shard.row_format, final_on_learner=True))
    assert deferred["frames"].shape == (4, 12, 8, 8, channels) and "tops" in deferred
    flips = deferred["flips"][deferred["lengths"] > 0]
    assert 0 < flips.sum() < flips.size  # both branches (flipped and not) are exercised
    staged = stage_rows(deferred, device, crop=5, flow=channels == 2)
    assert set(staged) == {k for k in cpu}
    # The frames go to the device; the reset table stays on the host, where the model reads it.
    assert {key for key, value in staged.items() if value.device.type == device} >= {"frames"}
    assert all(value.device.type == "cpu" for key, value in staged.items() if key != "frames")
    assert torch.equal(staged["frames"].cpu(), torch.from_numpy(cpu["frames"]))
    assert cpu["frames"][0, :8].min() > 0  # not vacuous: real pixels were compared
    # Rows that are final already pass through unchanged.
    assert torch.equal(stage_rows(cpu, "cpu", crop=5, flow=False)["frames"], torch.from_numpy(cpu["frames"]))


def test_uncropped_evaluation_rows_hold_the_whole_cached_frames_and_no_draws():
    """Multi-view testing's rows (an evaluation shard, epoch None, not centre-cropped, left to the learner):
    each sequence's cached frames whole at its start, no crop draws (the learner cuts its own views)."""
    rng = np.random.default_rng(2)
    arrays = {v: rng.integers(1, 256, (n, 8, 8, 3), dtype=np.uint8) for v, n in [(10, 6), (11, 9), (12, 7)]}
    shard = dataclasses.replace(_shard(BLOCKS, channels=3, epoch=None), split="test")
    items = shard_items(shard)
    batch = {key: np.stack([item[key] for item in items]) for key in items[0]}
    rows = assemble_rows(batch, arrays, dataclasses.replace(shard.row_format, final_on_learner=True))
    assert rows["frames"].shape == (4, 12, 8, 8, 3) and "tops" not in rows
    assert np.array_equal(rows["frames"][0, 5:8], arrays[11][:3])  # block 0: video 11 at start 5, uncropped
    assert np.array_equal(rows["frames"][3, :7], arrays[12])


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))],
)
def test_the_prefetcher_collates_ahead_into_host_memory_and_raises_at_wait(device):
    """Submitted one and two mini-batches ahead (on CUDA from its thread), every mini-batch waited for
    holds exactly the rows as host tensors, in pinned memory on CUDA (the step streams them to the device
    micro-batch by micro-batch); a collating error surfaces at ``wait``, not at ``submit``."""
    rng = np.random.default_rng(3)
    arrays = {v: rng.integers(1, 256, (n, 8, 8, 3), dtype=np.uint8) for v, n in [(10, 6), (11, 9), (12, 7)]}
    shard = _shard(BLOCKS, channels=3)
    items = shard_items(shard)
    fmt = dataclasses.replace(shard.row_format, final_on_learner=True)
    minis = [
        assemble_rows({key: np.stack([item[key] for item in part]) for key in part[0]}, arrays, fmt)
        for part in (items[:2], items[2:], items[1:3])
    ]
    prefetcher = RowPrefetcher(device)
    try:
        pending = [prefetcher.submit(minis[0]), prefetcher.submit(minis[1])]
        got = [prefetcher.wait(pending[0])]
        pending.append(prefetcher.submit(minis[2]))
        got += [prefetcher.wait(pending[1]), prefetcher.wait(pending[2])]
        for rows, batch in zip(minis, got, strict=True):
            expected = host_rows(rows, pin=False)
            assert set(batch) == set(expected) and all(v.device.type == "cpu" for v in batch.values())
            assert all(torch.equal(batch[k], expected[k]) for k in expected)
            assert all(v.is_pinned() == (device == "cuda") for v in batch.values())
            assert int(batch["frames"].sum()) > 0  # not vacuous: real pixels

        class Uncollatable:
            def __array__(self, *args, **kwargs):
                raise ValueError("these rows cannot be collated")

        bad = prefetcher.submit({**minis[0], "frames": Uncollatable()})
        with pytest.raises(ValueError, match="cannot be collated"):
            prefetcher.wait(bad)
    finally:
        prefetcher.close()


def test_final_augment_batch_cuts_each_sequence_once_and_leaves_padding_zero():
    """Two sequences of one row cut at their own (top, left), the second mirrored (and its flow x
    negated); the frames past them stay zero whatever the input holds there."""
    frames = torch.arange(2 * 7 * 4 * 4 * 2, dtype=torch.int64).remainder(250).add(1).to(torch.uint8)
    frames = frames.reshape(2, 7, 4, 4, 2)  # every input pixel > 0, padding frames included
    layout = {"starts": torch.tensor([[0, 2], [0, -1]]), "lengths": torch.tensor([[2, 3], [4, -1]])}
    draws = {"tops": torch.tensor([[1, 0], [2, 0]]), "lefts": torch.tensor([[0, 2], [1, 0]])}
    out = final_augment_batch(
        frames, **layout, **draws, flips=torch.tensor([[0, 1], [0, 0]]), crop=2, flow=True
    )
    assert torch.equal(out[0, :2], frames[0, :2, 1:3, 0:2])
    mirrored = frames[0, 2:5, 0:2, 2:4].flip(2)
    assert torch.equal(out[0, 2:5, ..., 1], mirrored[..., 1])
    assert torch.equal(out[0, 2:5, ..., 0], 255 - mirrored[..., 0])
    assert torch.equal(out[1, :4], frames[1, :4, 2:4, 1:3])
    assert not out[0, 5:].any() and not out[1, 4:].any()  # padding: zero, though the input was not


def test_final_augment_batch_rejects_a_crop_larger_than_the_frames():
    frames = torch.zeros((1, 2, 4, 4, 3), dtype=torch.uint8)
    zeros = torch.zeros((1, 1), dtype=torch.int64)
    with pytest.raises(ValueError, match="exceeds the frame size"):
        final_augment_batch(
            frames, starts=zeros, lengths=zeros + 2, tops=zeros, lefts=zeros, flips=zeros, crop=5, flow=False
        )


def _rows(epoch: int, first: int, count: int) -> dict[str, np.ndarray]:
    block = np.arange(first, first + count)
    return {
        "block": block,
        "lengths": np.stack([block + 1, np.full(count, -1)], axis=1),
        "epoch": np.full(count, epoch),
    }


class _Source:
    """Epoch e has 5 + e rows, yielded in batches of 2; records calls and the epochs opened by then."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple[int, tuple, int]] = []
        self.fail_at = fail_at

    def rows(self, epoch: int) -> int:
        return 5 + epoch

    def __call__(self, epoch, history, skip):
        self.calls.append((epoch, history, skip))
        if epoch == self.fail_at:
            raise OSError(f"source broke at epoch {epoch}")
        total = self.rows(epoch)

        def batches():
            for lo in range(skip, total, 2):
                yield _rows(epoch, lo, min(2, total - lo))

        return total, batches()


def _drain(view, sizes=(1, 3, 2)) -> list[int]:
    got, i = [], 0
    while (out := view.take(sizes[i % len(sizes)])) is not None:
        got.extend(out["block"].tolist())
        i += 1
    return got


def test_row_stream_serves_every_epoch_in_order_and_runs_one_epoch_ahead_at_most():
    """One stream from (epoch 1, skip 2) to the last epoch: every row once, in order, per epoch; the
    producer asks for epoch e+1 only once the consumer opened epoch e."""
    source = _Source()
    stream = RowStream(source, epoch=1, epochs=4, skip=2, depth=2)
    try:
        time.sleep(0.3)  # room to run ahead: it must stop at epoch 2 (one ahead of nothing opened = 1)
        assert [c[0] for c in source.calls] == [1]
        assert stream.continues(1, (), 2) and not stream.continues(1, (), 0)
        view, total = stream.epoch_rows(1)
        assert total == 6 and _drain(view) == [2, 3, 4, 5]
        assert stream.continues(2) and not stream.continues(3)
        for epoch in (2, 3):
            view, total = stream.epoch_rows(epoch)
            assert total == source.rows(epoch) and _drain(view) == list(range(total))
            assert view.rows == total and view.frames == sum(range(1, total + 1))
        assert source.calls == [(1, (), 2), (2, (), 0), (3, (), 0)]
        assert not stream.continues(4)
    finally:
        stream.close()


def test_an_epoch_opened_without_reading_ahead_holds_the_producer_until_the_next_is_opened():
    """A learner that went on past a held round opens epoch 1 with ``ahead=False``: the producer reads
    epoch 1 (one ahead of epoch 0, as always) but not epoch 2, whose activation would make the feed drop
    epoch 0, until epoch 2 itself is opened; then it runs one ahead again."""
    source = _Source()
    stream = RowStream(source, epoch=0, epochs=4, depth=8)
    try:
        view, _ = stream.epoch_rows(0)
        assert _drain(view) == list(range(5))
        view, total = stream.epoch_rows(1, ahead=False)
        assert _drain(view) == list(range(total))
        time.sleep(0.3)  # room to run ahead: it must not
        assert [c[0] for c in source.calls] == [0, 1]
        view, total = stream.epoch_rows(2)
        assert _drain(view) == list(range(total))
        deadline = time.monotonic() + 5
        while len(source.calls) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [c[0] for c in source.calls] == [0, 1, 2, 3]
    finally:
        stream.close()


def test_close_leaves_a_producer_stuck_in_its_source_without_waiting_for_it(caplog):
    """A realigned learner closes its stream while the producer is inside its source (reading objects a
    lost node held, which Ray calls lost only seconds later): close() returns within its short wait, not
    once the read ends; the read's late failure is logged as a closed stream's, never raised or queued."""
    import logging
    import threading

    release = threading.Event()

    def stuck(epoch, history, skip):
        def batches():
            yield _rows(epoch, 0, 2)
            release.wait(30)
            raise OSError("the object's owner died")

        return 4, batches()

    stream = RowStream(stuck, epoch=0, epochs=1, depth=4)
    view, _ = stream.epoch_rows(0)
    assert view.take(2)["block"].tolist() == [0, 1]
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="raytrain_seq.rows.stream"):
        stream.close()
        waited = time.monotonic() - began
        assert stream.producing and waited < 5.0, waited  # left to end, not waited for
        release.set()
        deadline = time.monotonic() + 10
        while stream.producing and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not stream.producing
    assert "still in its source" in caplog.text and "closed stream's producer ended" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_row_stream_mid_epoch_position_needs_a_new_stream_and_close_unblocks_the_producer():
    """A view left mid-epoch (a realignment) means the stream cannot continue; a new stream at the
    position serves the rest; close() stops a producer blocked on a full queue."""
    source = _Source()
    stream = RowStream(source, epoch=0, epochs=3, depth=1)
    view, _ = stream.epoch_rows(0)
    assert view.take(2)["block"].tolist() == [0, 1]
    assert not stream.continues(1) and not stream.continues(0, (), 2)
    with pytest.raises(ValueError, match="close it and start"):
        stream.epoch_rows(1)
    stream.close()
    assert not stream.producing
    again = RowStream(source, epoch=0, epochs=1, history=((3, 1),), skip=3)
    try:
        view, total = again.epoch_rows(0)
        assert total == 5 and _drain(view) == [3, 4] and source.calls[-1] == (0, ((3, 1),), 3)
    finally:
        again.close()


def test_row_stream_raises_the_sources_error_in_the_consumer():
    """An error in the producer reaches the learner: epoch 0 is served, opening epoch 1 raises it."""
    stream = RowStream(_Source(fail_at=1), epoch=0, epochs=3)
    try:
        view, _ = stream.epoch_rows(0)
        assert _drain(view) == list(range(5))
        with pytest.raises(OSError, match="source broke at epoch 1"):
            stream.epoch_rows(1)
    finally:
        stream.close()
