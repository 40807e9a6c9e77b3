"""Tests for the refurbishing Ray Data pipeline: pure helpers without Ray, then the feed on a local cluster."""

from __future__ import annotations

import time

import numpy as np
import pytest
from torch import cat as torch_cat

from raytrain_seq.algorithms.augment import center_crop, final_augment, partial_augment, resize_video
from raytrain_seq.algorithms.packing import pack, shard
from raytrain_seq.algorithms.refurbish import RefurbishSchedule
from raytrain_seq.config import Config
from raytrain_seq.data.lengths import strided, ucf101_lengths
from raytrain_seq.data.synthetic import SyntheticVideos
from raytrain_seq.parts import Parts
from raytrain_seq.rows.assembly import (
    ROW_KEYS,
    BlockRowStream,
    BlockSpec,
    EpochShard,
    assemble_rows,
    cache_aware_plan,
    consumption_order,
    max_sequences_bound,
    plan_specs,
    shard_items,
    spread_fresh,
)
from raytrain_seq.runtime.feed import create_feed, feed_geometry
from raytrain_seq.runtime.partial_tasks import OBJECT_BYTES, lane_waits, object_bounds
from raytrain_seq.seeds import FINAL_STREAM, PARTIAL_STREAM, PLAN_STREAM, plan_seed

SEED = 0


def _config(**overrides) -> Config:
    base = dict(num_classes=4, max_videos=40, cache_size=16, crop=12, stride=16, reuse=3, epochs=3, seed=SEED)
    base.update(overrides)
    return Config.from_preset(None, **base)


def _window_spread(values: list[int], window: int) -> tuple[float, float]:
    """Fresh frames of every `window` consecutive blocks: (std / mean, max / mean)."""
    sums = np.convolve(np.asarray(values, dtype=float), np.ones(window), mode="valid")
    return float(sums.std() / sums.mean()), float(sums.max() / sums.mean())


# ---------------------------------------------------------------------------------------- pure helpers
def test_spread_fresh_worked_example_and_permutation():
    """spread_fresh returns a permutation whose running fresh sum tracks the line (docstring example)."""
    order = spread_fresh([9, 8, 7, 0, 0, 0])
    assert order == [2, 3, 1, 4, 0, 5]
    values = [9, 8, 7, 0, 0, 0]
    pairs = [values[order[i]] + values[order[i + 1]] for i in (0, 2, 4)]
    assert pairs == [7, 8, 9]
    assert spread_fresh([]) == []
    assert spread_fresh([0, 0, 0]) == [0, 1, 2]  # equal counts keep the plan's order
    with pytest.raises(ValueError, match="fresh frame counts must be >= 0"):
        spread_fresh([3, -1])


def test_spread_fresh_evens_windows_on_ucf101_blocks():
    """On UCF101 blocks (stride 8, r=3) every 4-block window carries near its share of fresh frames."""
    lengths = strided(ucf101_lengths("train")[0], 8)
    schedule = RefurbishSchedule(len(lengths), reuse=3, seed=SEED)
    fresh = schedule.is_fresh(1)
    plan = pack(lengths, seed=plan_seed(SEED, 1))
    for blocks in shard(plan, 2):
        counts = [sum(n for i, n in zip(b.ids, b.lengths, strict=True) if fresh[i]) for b in blocks]
        order = spread_fresh(counts)
        assert sorted(order) == list(range(len(counts)))
        spread = [counts[i] for i in order]
        # Non-vacuous: in the plan's own (random) order 4-block windows vary a lot (std > 20 % of the
        # mean); the spread order cuts that at least 2.5x and lowers the heaviest window too.
        plain, even = _window_spread(counts, 4), _window_spread(spread, 4)
        assert plain[0] > 0.2 and even[0] < plain[0] / 2.5 and even[1] < plain[1]
        # Every prefix stays within one block's worth of fresh frames of the proportional line.
        line = np.arange(1, len(spread) + 1) * sum(spread) / len(spread)
        assert np.abs(np.cumsum(spread) - line).max() <= max(counts)


def test_cache_aware_plan_keeps_the_packing_and_evens_fresh_frames_beyond_spread_fresh():
    """cache_aware_plan on UCF101 blocks (stride 8, r=3, epoch 1): the same blocks' lengths, starts and
    padding with every video once; the learners' 4-block windows then carry their share of fresh frames
    more evenly than spread_fresh alone gives the raw plan, and epoch 0 (all fresh) is left as it is."""
    lengths = strided(ucf101_lengths("train")[0], 8)
    fresh = RefurbishSchedule(len(lengths), reuse=3, seed=SEED).is_fresh(1)
    plan = pack(lengths, seed=plan_seed(SEED, 1))
    aware = cache_aware_plan(plan, lengths, fresh)
    assert [(b.lengths, b.starts) for b in aware.blocks] == [(b.lengths, b.starts) for b in plan.blocks]
    assert sorted(i for b in aware.blocks for i in b.ids) == list(range(len(lengths)))
    assert aware.stats() == plan.stats()
    every = np.ones(len(lengths), bool)
    assert cache_aware_plan(plan, lengths, every).blocks == plan.blocks
    ids, labels = list(range(len(lengths))), [0] * len(lengths)
    spreads = {}
    for name, p in (("raw", plan), ("aware", aware)):
        counts = [[s.fresh_frames for s in rank] for rank in plan_specs(p, 2, ids, labels, fresh)]
        spreads[name] = max(_window_spread(c, 4)[0] for c in counts)
    assert spreads["aware"] < 0.8 * spreads["raw"], spreads


def test_max_sequences_bound_is_tight_and_never_exceeded():
    """max_sequences_bound: worked example; no plan of any strategy or seed exceeds it; a plan reaches it."""
    assert max_sequences_bound([5, 3, 9, 4], 12) == 3
    lengths = strided(ucf101_lengths("test")[0][:400], 8)
    t_max = int(lengths.max())
    bound = max_sequences_bound(lengths, t_max)
    assert bound > 1
    most = 0
    for strategy in ("optimal", "bload", "pad"):
        for seed in range(3):
            plan = pack(lengths, t_max, strategy=strategy, seed=seed)
            most = max(most, max(len(b.ids) for b in plan.blocks))
    assert most <= bound
    chunk = pack(lengths, t_max // 3, strategy="chunk", seed=0)
    assert max(len(b.ids) for b in chunk.blocks) <= max_sequences_bound(lengths, t_max // 3)
    smallest = np.sort(lengths)[:bound]
    assert len(pack(smallest, t_max).blocks[0].ids) == bound  # the bound is reachable: it is tight


def test_plan_specs_map_positions_to_videos_and_order_by_fresh_frames():
    """plan_specs: catalog ids/labels replace plan positions, plan_index names the plan block, fillers get
    -1, each rank's blocks follow spread_fresh; consumption_order lists ids by first use across ranks."""
    lengths = [30, 20, 25, 10, 15, 40, 5]
    plan = pack(lengths, 40, seed=3)
    ids, labels = [100 + i for i in range(7)], [i % 3 for i in range(7)]
    fresh = np.array([True, False, True, False, False, True, False])
    specs = plan_specs(plan, 3, ids, labels, fresh)
    assert len({len(rank) for rank in specs}) == 1
    for rank in specs:
        counts = [s.fresh_frames for s in rank]
        assert spread_fresh(counts) == list(range(len(counts)))  # already in spread order
        for spec in rank:
            if not spec.ids:
                assert spec.plan_index == -1 and spec.weight == 0.0
                continue
            block = plan.blocks[spec.plan_index]
            assert spec.ids == tuple(ids[i] for i in block.ids) and spec.labels == tuple(
                labels[i] for i in block.ids
            )
            assert spec.fresh_frames == sum(
                n for i, n in zip(block.ids, block.lengths, strict=True) if fresh[i]
            )
    assert sum(1 for rank in specs for s in rank if not s.ids) == (-len(plan.blocks)) % 3 > 0
    order = consumption_order(specs)
    assert sorted(order) == ids
    first = [v for rank in specs for v in rank[0].ids]
    assert order[: len(first)] == list(dict.fromkeys(first))
    two = [
        [BlockSpec((4, 1), (0, 5), (5, 5), (0, 0), (0, 0), 0)],
        [BlockSpec((2,), (0,), (5,), (0,), (0,), 1)],
    ]
    two[0].append(BlockSpec((3,), (0,), (5,), (0,), (0,), 2))
    two[1].append(BlockSpec((0,), (0,), (5,), (0,), (0,), 3))
    assert consumption_order(two) == [4, 1, 2, 3, 0]  # the docstring's example


def test_seed_streams_are_tagged_and_distinct():
    """Stream tags are nonzero and distinct, and per-epoch plan seeds differ (also from the eval keys)."""
    tags = {PARTIAL_STREAM, FINAL_STREAM, PLAN_STREAM}
    assert len(tags) == 3 and 0 not in tags
    seeds = {plan_seed(SEED, key) for key in (-2, -1, 0, 1, 2, 3)}
    assert len(seeds) == 6 and all(0 <= s < 2**62 for s in seeds)


def _shard(blocks: list[BlockSpec], *, t_max: int, s: int, center: bool = False) -> EpochShard:
    return EpochShard(
        split="train", epoch=None if center else 4, rank=0, world_size=1, blocks=tuple(blocks), t_max=t_max,
        max_sequences=s, crop=4, channels=3, seed=7, center=center, recomputed=0, reused=0,
    )  # fmt: skip


def test_assemble_rows_places_final_augmented_pieces_and_zero_padding():
    """Each piece (chunk offsets included) is final_augment of its cached frames at its start; rest zero."""
    rng = np.random.default_rng(0)
    arrays = {
        10: rng.integers(1, 256, (5, 6, 6, 3), dtype=np.uint8),
        11: rng.integers(1, 256, (9, 6, 6, 3), dtype=np.uint8),
    }
    blocks = [
        BlockSpec((10, 11), (0, 5), (5, 3), (0, 0), (1, 2), plan_index=3),
        BlockSpec((11,), (0,), (4,), (5,), (2,), plan_index=0),  # a chunk piece: frames 5..8 of video 11
        BlockSpec((), (), (), (), (), plan_index=-1),  # a filler
    ]
    shard_ = _shard(blocks, t_max=10, s=3)
    items = shard_items(shard_)
    batch = {key: np.stack([item[key] for item in items]) for key in items[0]}
    rows = assemble_rows(batch, arrays, shard_.row_format)
    assert tuple(rows) == ROW_KEYS
    assert rows["frames"].shape == (3, 10, 4, 4, 3) and rows["frames"].dtype == np.uint8
    assert rows["starts"].tolist() == [[0, 5, -1], [0, -1, -1], [-1, -1, -1]]
    assert rows["labels"].tolist() == [[1, 2, -1], [2, -1, -1], [-1, -1, -1]]
    assert rows["num_sequences"].tolist() == [2, 1, 0] and rows["weight"].tolist() == [1.0, 1.0, 0.0]
    expect = final_augment(arrays[11][:3], crop=4, rng=np.random.default_rng([7, FINAL_STREAM, 4, 3, 1]))
    assert np.array_equal(rows["frames"][0, 5:8], expect)
    expect = final_augment(arrays[11][5:9], crop=4, rng=np.random.default_rng([7, FINAL_STREAM, 4, 0, 0]))
    assert np.array_equal(rows["frames"][1, 0:4], expect)
    assert (
        rows["frames"][0, 8:].max() == 0 and rows["frames"][1, 4:].max() == 0 and rows["frames"][2].max() == 0
    )
    assert rows["frames"][0, :8].min() > 0  # the cached arrays have no zero pixel: every frame was written
    center = assemble_rows(batch, arrays, _shard(blocks, t_max=10, s=3, center=True).row_format)
    assert np.array_equal(center["frames"][1, :4], center_crop(arrays[11][5:9], 4))
    with pytest.raises(ValueError, match="max_sequences"):
        shard_items(_shard(blocks, t_max=10, s=1))


class _FakeDataset:
    """Yields batches of the given sizes with a small delay, like Dataset.iter_batches."""

    def __init__(self, sizes: list[int], delay: float) -> None:
        self.sizes, self.delay = sizes, delay

    def iter_batches(self, *, batch_size, batch_format, prefetch_batches):
        assert batch_size is None and batch_format == "numpy"
        first = 0
        for size in self.sizes:
            time.sleep(self.delay)
            block = np.arange(first, first + size)
            yield {"block": block, "lengths": np.stack([block, np.full(size, -1)], axis=1)}
            first += size


def test_block_row_stream_reslices_every_row_once_in_order():
    """take(n) with n changing between calls returns every row once, in order, then None; counts it."""
    stream = BlockRowStream(_FakeDataset([3, 1, 4, 2, 0, 5], delay=0.01))
    got, sizes = [], []
    for n in [2, 5, 1, 1, 3, 100]:
        out = stream.take(n)
        sizes.append(len(out["block"]))
        got.extend(out["block"].tolist())
    assert sizes == [2, 5, 1, 1, 3, 3]  # the last take is short: the shard ended
    assert got == list(range(15)) and stream.take(4) is None
    assert stream.rows == 15 and stream.frames == sum(range(15))
    assert stream.wait_seconds >= 6 * 0.01  # six batches were waited for (sleep is a lower bound)
    with pytest.raises(ValueError, match="int n >= 1"):
        stream.take(0)


def test_bad_t_max_fails_in_the_driver_and_chunk_evaluation_cuts():
    """An explicit t_max below a video's length is a RunSetupError (one line: the job's exit 2) naming the
    flag and the fix, unless packing is chunk."""
    from raytrain_seq.config import RunSetupError

    with pytest.raises(RunSetupError, match=r"data\.t_max=10 but .* pass --t-max \d+ or more"):
        create_feed(Parts.of(_config(t_max=10)).feed)
    geometry = feed_geometry(_config(t_max=10, packing="chunk").data)
    assert geometry.eval_strategy == "chunk" and geometry.t_max == 10
    assert feed_geometry(_config().data).eval_strategy == "optimal"


def test_feed_takes_the_drivers_catalogs_instead_of_probing_again(monkeypatch):
    """BlockFeed(geometry=...) (what create_feed passes) builds on the driver's catalogs: no second probe."""
    from raytrain_seq.runtime import feed as pipeline

    config = _config()
    geometry = feed_geometry(config.data)
    calls = []

    def probe(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("probed the videos")

    monkeypatch.setattr(pipeline, "data_geometry", probe)
    feed = pipeline.BlockFeed(Parts.of(config).feed, geometry=geometry)
    assert calls == [] and feed.t_max == geometry.t_max and feed.max_sequences == geometry.max_sequences
    assert feed.model_spec().num_classes == len(geometry.class_names)
    with pytest.raises(RuntimeError, match="probed"):  # not vacuous: without geometry the feed probes
        pipeline.BlockFeed(Parts.of(config).feed)
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------------ Ray
def _drain(shard_, feed, takes=(1, 2, 3)) -> dict[str, np.ndarray]:
    from raytrain_seq.runtime.learner_feed import shard_dataset

    stream = BlockRowStream(shard_dataset(shard_, feed), prefetch_batches=1)
    parts, i = [], 0
    while (out := stream.take(takes[i % len(takes)])) is not None:
        parts.append(out)
        i += 1
    rows = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    assert stream.rows == len(shard_.blocks) and stream.frames == shard_.frames
    return rows


# tests/conftest.py's ray_cluster: 2 CPUs (the default), no worker logs to the driver, logging left as is.
RAY_CLUSTER = {"log_to_driver": False, "configure_logging": False}


@pytest.fixture(scope="module")
def served(ray_cluster):
    """One feed; epochs 0, 1, 2 at world size 2, epoch 1 also at world size 3, and both eval splits."""
    ray = ray_cluster
    config = _config()
    feed = create_feed(Parts.of(config).feed, videos_per_task=8)
    out = {"config": config, "feed": feed, "shards": {}, "rows": {}}
    for epoch, world_size in [(0, 2), (1, 2), (1, 3), (2, 2)]:
        shards = ray.get([feed.epoch_shard.remote(epoch, r, world_size) for r in range(world_size)])
        if epoch == 1 and world_size == 2:
            # Epoch 2's recompute was started when epoch 1 was planned; epoch 1's rows come after it.
            out["before_epoch_2"] = ray.get(feed.stats.remote(wait=True, ids=True))
        out["shards"][epoch, world_size] = shards
        out["rows"][epoch, world_size] = [_drain(s, feed) for s in shards]
    for split in ("val", "test"):
        shard_ = ray.get(feed.eval_shard.remote(split))
        out["shards"][split] = [shard_]
        out["rows"][split] = [_drain(shard_, feed)]
    out["stats"] = ray.get(feed.stats.remote(wait=True, ids=True))
    return out


def _videos(config: Config) -> SyntheticVideos:
    d = config.data
    return SyntheticVideos(
        d.num_classes, d.stride, d.cache_size, d.seed, d.max_videos, val_fraction=d.val_fraction
    )


TRAIN_KEYS = [(0, 2), (1, 2), (1, 3), (2, 2)]


@pytest.mark.ray
@pytest.mark.parametrize("key", TRAIN_KEYS)
def test_every_train_id_once_per_epoch_equal_rows_no_crossing(served, key):
    """Every train id once across all learners' rows, equal rows per learner, sequences stay in their block,
    rows keep the shard's block order, padding frames are zero and fillers carry weight 0."""
    catalog = _videos(served["config"]).catalog("train")
    label_of = dict(zip(catalog.ids.tolist(), catalog.labels.tolist(), strict=True))
    shards, rows = served["shards"][key], served["rows"][key]
    assert len({len(r["block"]) for r in rows}) == 1
    seen, fillers = [], 0
    for shard_, row in zip(shards, rows, strict=True):
        assert row["block"].tolist() == list(range(len(shard_.blocks)))
        assert row["frames"].shape[1:] == (shard_.t_max, 12, 12, 3)
        for b, spec in enumerate(shard_.blocks):
            k = len(spec.ids)
            assert row["num_sequences"][b] == k and row["weight"][b] == (1.0 if k else 0.0)
            assert row["starts"][b, :k].tolist() == list(spec.starts) and (row["starts"][b, k:] == -1).all()
            assert row["labels"][b, :k].tolist() == [label_of[v] for v in spec.ids]
            ends = np.asarray(spec.starts) + np.asarray(spec.lengths)
            assert (ends <= shard_.t_max).all() and (np.asarray(spec.starts[1:]) >= ends[:-1]).all()
            used = np.zeros(shard_.t_max, dtype=bool)
            for start, length in zip(spec.starts, spec.lengths, strict=True):
                used[start : start + length] = True
            assert row["frames"][b][~used].max(initial=0) == 0
            fillers += k == 0
            seen.extend(spec.ids)
    assert sorted(seen) == catalog.ids.tolist()
    if key == (1, 3):
        assert fillers == 2  # 10 blocks over 3 learners: the filler path is really exercised


@pytest.mark.ray
@pytest.mark.parametrize("key", [*TRAIN_KEYS, "val", "test"])
def test_frames_equal_an_independent_recomputation(served, key):
    """Each sequence's frames equal final_augment(partial_augment(render)) with the documented seeds
    (computing epoch = epoch - age); evaluation rows equal center_crop(resize_video(render))."""
    config, videos = served["config"], _videos(served["config"])
    catalog = videos.catalog("train")
    position = {v: i for i, v in enumerate(catalog.ids.tolist())}
    schedule = RefurbishSchedule(len(catalog), reuse=3, seed=SEED)
    checked = 0
    for shard_, row in zip(served["shards"][key], served["rows"][key], strict=True):
        computed = None if shard_.epoch is None else shard_.epoch - schedule.age(shard_.epoch)
        for b, spec in enumerate(shard_.blocks):
            for slot, (video, start, length) in enumerate(
                zip(spec.ids, spec.starts, spec.lengths, strict=True)
            ):
                frames = videos.render(video)
                if computed is None:
                    expect = center_crop(resize_video(frames, 16), 12)
                else:
                    rng = np.random.default_rng([SEED, PARTIAL_STREAM, video, int(computed[position[video]])])
                    cached = partial_augment(frames, size=16, rng=rng)
                    rng = np.random.default_rng([SEED, FINAL_STREAM, shard_.epoch, spec.plan_index, slot])
                    expect = final_augment(cached, crop=config.data.crop, rng=rng)
                assert np.array_equal(row["frames"][b, start : start + length], expect), (key, video)
                checked += 1
    assert checked >= 40


@pytest.mark.ray
def test_epochs_recompute_only_evicted_ids_in_background(served):
    """Epoch 0 augments every id, epoch e>=1 exactly evicted(e) (counted in the tasks), the rest is reused;
    epoch 2's recompute ran before epoch 2 was requested, and none is launched past the last epoch."""
    catalog = _videos(served["config"]).catalog("train")
    ids = catalog.ids
    schedule = RefurbishSchedule(len(catalog), reuse=3, seed=SEED)
    epochs = served["stats"].epochs
    assert sorted(epochs) == [0, 1, 2]
    for epoch in (0, 1, 2):
        evicted = ids[schedule.evicted(epoch)].tolist()
        assert epochs[epoch]["partial_ids"] == sorted(evicted)
        assert epochs[epoch]["recomputed"] == len(evicted) and epochs[epoch]["reused"] == 40 - len(evicted)
    assert 0 < epochs[1]["recomputed"] < 40 and epochs[1]["packing"]["deleted"] == 0
    before = served["before_epoch_2"].epochs
    assert before[2]["partial_ids"] == epochs[2]["partial_ids"] and "recomputed" not in before[2]
    assert served["stats"].eval["videos"] == 80 and served["stats"].totals["tasks_pending"] == 0
    shards = served["shards"][1, 2]
    assert all(s.recomputed == epochs[1]["recomputed"] and s.reused == epochs[1]["reused"] for s in shards)


@pytest.mark.ray
def test_epochs_differ_in_plan_and_crops(served):
    """Different epochs pack differently, and a video reused from the same cached copy gets new crops."""
    first = [spec.ids for s in served["shards"][1, 2] for spec in s.blocks]
    second = [spec.ids for s in served["shards"][2, 2] for spec in s.blocks]
    assert sorted(first) != sorted(second)
    schedule = RefurbishSchedule(40, reuse=3, seed=SEED)
    same_copy = np.flatnonzero(1 - schedule.age(1) == 2 - schedule.age(2))  # positions not evicted in 2
    ids = _videos(served["config"]).catalog("train").ids
    frames = {}
    for epoch in (1, 2):
        for shard_, row in zip(served["shards"][epoch, 2], served["rows"][epoch, 2], strict=True):
            for b, spec in enumerate(shard_.blocks):
                for video, start, length in zip(spec.ids, spec.starts, spec.lengths, strict=True):
                    frames[epoch, video] = row["frames"][b, start : start + length]
    differ = [not np.array_equal(frames[1, v], frames[2, v]) for v in ids[same_copy].tolist()]
    assert len(differ) >= 20 and sum(differ) >= 0.8 * len(differ)


@pytest.mark.ray
@pytest.mark.parametrize("split", ["val", "test"])
def test_eval_shards_cover_every_id_once(served, split):
    """An evaluation shard holds every video of its split exactly once, with no fillers and no reuse."""
    (shard_,) = served["shards"][split]
    ids = [v for spec in shard_.blocks for v in spec.ids]
    assert sorted(ids) == _videos(served["config"]).catalog(split).ids.tolist()
    assert shard_.center and shard_.epoch is None and shard_.recomputed == 40 and shard_.reused == 0


def test_lane_waits_keep_at_most_lanes_tasks_running_and_every_task_in_order():
    """Task k waits for task k - lanes (the worked example), so that however long each task takes, at most
    ``lanes`` run at once and each lane runs in submission order; None waits for nothing."""
    assert lane_waits(6, 2) == [None, None, 0, 1, 2, 3]
    assert lane_waits(3, 5) == [None, None, None] == lane_waits(3, None)
    assert lane_waits(0, 1) == []
    rng = np.random.default_rng(0)
    for tasks, lanes in ((40, 1), (40, 3), (7, 7)):
        waits, seconds = lane_waits(tasks, lanes), rng.uniform(0.1, 2.0, tasks)
        start, end = [0.0] * tasks, [0.0] * tasks
        for k, wait in enumerate(waits):  # a task starts when the one it waits for has ended
            start[k] = 0.0 if wait is None else end[wait]
            end[k] = start[k] + seconds[k]
        running = max(sum(s <= t < e for s, e in zip(start, end, strict=True)) for t in start)
        assert running == min(lanes, tasks)  # not vacuous: the lanes are all used
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="lanes must be an int >= 1 or None"):
            lane_waits(3, bad)


def test_object_bounds_worked_example_and_cover():
    """Small videos share an object until it holds the target; a large video is alone; nothing is left out."""
    kib = 1024
    assert object_bounds([600 * kib, 600 * kib, 600 * kib, 2000 * kib, 100 * kib], OBJECT_BYTES) == [
        (0, 2),
        (2, 4),
        (4, 5),
    ]
    assert object_bounds([3 * OBJECT_BYTES] * 3, OBJECT_BYTES) == [(0, 1), (1, 2), (2, 3)]
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = rng.integers(1, 2 * OBJECT_BYTES, size=int(rng.integers(1, 20))).tolist()
        bounds = object_bounds(sizes, OBJECT_BYTES)
        assert [lo for lo, _ in bounds] == [0] + [hi for _, hi in bounds[:-1]] and bounds[-1][1] == len(sizes)
        # Every object but the last reaches the target, and drops below it without its last video.
        for lo, hi in bounds[:-1]:
            assert sum(sizes[lo:hi]) >= OBJECT_BYTES > sum(sizes[lo : hi - 1])


@pytest.mark.ray
def test_videos_share_an_object_only_with_videos_recomputed_in_the_same_epoch(ray_cluster):
    """A task's small videos travel as one object, and an object never mixes eviction slices, so it leaves
    the cache whole: epoch 0 computes every video, and slice k of r = 3 is recomputed in epoch k."""
    ray = ray_cluster
    config = _config()
    feed = create_feed(Parts.of(config).feed, videos_per_task=8)
    train = _videos(config).catalog("train").ids.tolist()
    ray.get(feed.epoch_shard.remote(0, 0, 2))
    cached = ray.get(feed.refs.remote(train, 0))
    schedule = RefurbishSchedule(len(train), reuse=3, seed=config.data.seed)
    slice_of = np.select([schedule.is_fresh(e) for e in (1, 2, 3)], [1, 2, 3])  # the epoch that evicts it
    objects: dict = {}
    for k, c in enumerate(cached):
        objects.setdefault(c.ref, []).append(k)
    assert 3 <= len(objects) < len(train) // 2  # shared (small videos), and split at least by slice
    for members in objects.values():
        assert len({int(slice_of[k]) for k in members}) == 1
        assert len(members) <= 8  # videos_per_task
        assert sorted(cached[k].index for k in members) == list(range(len(members)))
    ray.kill(feed)


@pytest.mark.ray
def test_refs_of_a_dropped_epoch_raise(served):
    """The feed keeps the newest 2 epochs; refs or a shard of an older one raise a ValueError naming the fix.
    Refs of an epoch not served are an ``EpochNotServedError``: a learner's stream retries it as a feed
    restart (it activates the epoch again), as a restarted feed serves no epoch until asked."""
    import ray

    from raytrain_seq.feed.cache import EpochNotServedError

    feed = served["feed"]
    video = served["shards"][2, 2][0].blocks[0].ids[0]
    assert len(ray.get(feed.refs.remote([video], 2))) == 1
    with pytest.raises(EpochNotServedError, match="call epoch_shard"):
        ray.get(feed.refs.remote([video], 0))
    with pytest.raises(ray.exceptions.RayTaskError, match="must not lag"):
        ray.get(feed.epoch_shard.remote(0, 0, 2))


@pytest.mark.ray
def test_learner_streams_serve_every_epoch_and_equal_the_independent_recomputation(ray_cluster):
    """Two learners' persistent streams (one each, across all epochs) deliver every train id once per
    epoch, in the shard's order, and after the device-side crop and flip (stage_rows, on CPU here) the
    frames equal final_augment(partial_augment(render)) with the documented seeds; a stream restarted
    mid-epoch at a position (a realignment) serves exactly the rest."""
    from raytrain_seq.runtime.learner_feed import LearnerFeed
    from raytrain_seq.training.staging import stage_rows

    config = _config()
    feed = create_feed(Parts.of(config).feed, videos_per_task=8)
    videos = _videos(config)
    catalog = videos.catalog("train")
    position = {v: i for i, v in enumerate(catalog.ids.tolist())}
    schedule = RefurbishSchedule(len(catalog), reuse=3, seed=SEED)
    learners = [LearnerFeed(feed, epochs=3, blocks_per_batch=3) for _ in range(2)]
    checked = 0
    try:
        for epoch in range(3):
            seen = []
            for rank, learner in enumerate(learners):
                view, total = learner.epoch_rows(epoch, rank, 2)
                shard_ = ray_cluster.get(feed.epoch_shard.remote(epoch, rank, 2))
                parts = []
                while (rows := view.take(2)) is not None:
                    parts.append(stage_rows(rows, "cpu", crop=config.data.crop, flow=False))
                frames = torch_cat([p["frames"] for p in parts])
                assert total == len(shard_.blocks) == frames.shape[0] and view.frames == shard_.frames
                computed = epoch - schedule.age(epoch)
                for b, spec in enumerate(shard_.blocks):
                    seen.extend(spec.ids)
                    for slot, (video, start, length) in enumerate(
                        zip(spec.ids, spec.starts, spec.lengths, strict=True)
                    ):
                        rng = np.random.default_rng(
                            [SEED, PARTIAL_STREAM, video, int(computed[position[video]])]
                        )
                        cached = partial_augment(videos.render(video), size=16, rng=rng)
                        rng = np.random.default_rng([SEED, FINAL_STREAM, epoch, spec.plan_index, slot])
                        expect = final_augment(cached, crop=config.data.crop, rng=rng)
                        assert np.array_equal(frames[b, start : start + length].numpy(), expect), (
                            epoch,
                            video,
                        )
                        checked += 1
            assert sorted(seen) == catalog.ids.tolist()
        # A realignment: a fresh stream at (epoch 2, 3 rows done) serves the shard's rows from the fourth on.
        again = LearnerFeed(feed, epochs=3)
        view, total = again.epoch_rows(2, 0, 2, skip=3)
        rest = []
        while (rows := view.take(4)) is not None:
            rest.extend(rows["block"].tolist())
        assert rest == list(range(total - 3)) and total > 3
        again.close()
    finally:
        for learner in learners:
            learner.close()
    assert checked >= 120


@pytest.mark.ray
def test_a_stream_whose_group_changed_at_an_epochs_end_serves_the_new_share(ray_cluster):
    """A learner alone (rank 0 of 1) reads epoch 0 to its end while its stream reads epoch 1 ahead; the
    group grows to 2 there (a newcomer joined at the epoch's last round) and this learner becomes rank 1:
    its epoch-1 rows are rank 1 of 2's shard, not the whole epoch read ahead for rank 0 of 1 (which
    trained rows twice in the lost-node fault test, docs/LOG.md)."""
    from raytrain_seq.runtime.learner_feed import LearnerFeed

    config = _config()
    feed = create_feed(Parts.of(config).feed, videos_per_task=8)
    learner = LearnerFeed(feed, epochs=3, blocks_per_batch=3)
    try:
        view, alone = learner.epoch_rows(0, 0, 1)
        while view.take(4) is not None:
            pass
        view, total = learner.epoch_rows(1, 1, 2)
        ids: list[int] = []
        while (rows := view.take(4)) is not None:
            ids.extend(int(i) for i in rows["ids"].flatten().tolist() if i >= 0)
        share = ray_cluster.get(feed.epoch_shard.remote(1, 1, 2))
        assert total == len(share.blocks) < alone
        assert sorted(ids) == sorted(i for spec in share.blocks for i in spec.ids)
    finally:
        learner.close()


def test_a_feed_call_is_retried_at_most_a_second_apart_until_the_restarted_feed_answers():
    """``LearnerFeed``'s default retries (``FEED_BACKOFF``): a call that fails while the feed restarts
    (here 8 times: a restarted feed serving no epoch yet) is tried again after 0.25 s, 0.5 s, then every
    second until it answers, so a feed back from a restart is found within a second; the retries stop
    within two minutes."""
    from raytrain_seq.feed.cache import EpochNotServedError
    from raytrain_seq.runtime.learner_feed import FEED_BACKOFF, LearnerFeed

    class Method:
        def remote(self) -> str:
            return "ref"

    class Handle:
        model_spec = Method()

    slept: list[float] = []
    calls: list[str] = []

    def get(ref):
        calls.append(ref)
        if len(calls) <= 8:
            raise EpochNotServedError("the restarted feed serves no epoch yet")
        return "spec"

    feed = LearnerFeed(Handle(), get=get, sleep=slept.append)
    assert feed.model_spec() == "spec" and len(calls) == 9 and feed.recoveries == 1
    assert slept == [0.25, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert max(FEED_BACKOFF.delays()) == 1.0 and 110.0 < sum(FEED_BACKOFF.delays()) <= 120.0


def _kill_and_lose(ray, feed, monkeypatch) -> None:
    """Kill the feed; the stream's next read of an array raises OwnerDiedError. On one node the dead
    owner's arrays stay readable from the local object store for a while (measured: over 30 s here); a
    learner on another node, which must fetch them through the owner, gets this error at once."""
    ray.kill(feed, no_restart=False)
    real_get, lost = ray.get, []

    def get(refs, *args, **kwargs):
        if not lost and isinstance(refs, list) and refs and isinstance(refs[0], ray.ObjectRef):
            lost.append(refs[0])
            raise ray.exceptions.OwnerDiedError(refs[0].hex(), None, "")
        return real_get(refs, *args, **kwargs)

    monkeypatch.setattr(ray, "get", get)


@pytest.mark.ray
def test_a_killed_feed_restarts_and_the_streams_lose_no_row(ray_cluster, tmp_path, monkeypatch):
    """Issue 16: the feed actor is killed while a learner's stream is inside epoch 1 (its producer one
    batch ahead, the arrays it has not read owned by the dead feed). Ray restarts the feed, the stream
    retries, re-borrows refs from it, and the restarted feed recomputes the lost partial augmentations
    with the same seeds: every id comes once per epoch and every frame equals the independent
    recomputation, as without the kill; the feed's stats list the restart."""
    from raytrain_seq.members.retry import Backoff
    from raytrain_seq.runtime.feed import RESTARTS_FILE
    from raytrain_seq.runtime.learner_feed import LearnerFeed
    from raytrain_seq.training.staging import stage_rows

    ray = ray_cluster
    config = _config(storage_path=str(tmp_path), run_name="feed-restart", feed_max_restarts=2)
    feed = create_feed(Parts.of(config).feed, videos_per_task=8)
    videos = _videos(config)
    catalog = videos.catalog("train")
    position = {v: i for i, v in enumerate(catalog.ids.tolist())}
    schedule = RefurbishSchedule(len(catalog), reuse=3, seed=SEED)
    learner = LearnerFeed(feed, epochs=3, blocks_per_batch=1, depth=1, backoff=Backoff(0.2, 1.0, 60.0))
    checked = 0
    try:
        for epoch in range(3):
            shard_ = ray.get(feed.epoch_shard.remote(epoch, 0, 1))
            view, total = learner.epoch_rows(epoch, 0, 1)
            parts = []
            while (rows := view.take(1)) is not None:
                parts.append(stage_rows(rows, "cpu", crop=config.data.crop, flow=False))
                if epoch == 1 and len(parts) == 2:
                    _kill_and_lose(ray, feed, monkeypatch)
            frames = torch_cat([p["frames"] for p in parts])
            assert total == len(shard_.blocks) == frames.shape[0]
            computed = epoch - schedule.age(epoch)
            seen = []
            for b, spec in enumerate(shard_.blocks):
                seen.extend(spec.ids)
                for slot, (video, start, length) in enumerate(
                    zip(spec.ids, spec.starts, spec.lengths, strict=True)
                ):
                    rng = np.random.default_rng([SEED, PARTIAL_STREAM, video, int(computed[position[video]])])
                    cached = partial_augment(videos.render(video), size=16, rng=rng)
                    rng = np.random.default_rng([SEED, FINAL_STREAM, epoch, spec.plan_index, slot])
                    expect = final_augment(cached, crop=config.data.crop, rng=rng)
                    assert np.array_equal(frames[b, start : start + length].numpy(), expect), (epoch, video)
                    checked += 1
            assert sorted(seen) == catalog.ids.tolist()
    finally:
        learner.close()
    stats = ray.get(feed.stats.remote(wait=True))
    assert [r["kind"] for r in stats.restarts] == ["feed_restart"], stats.restarts
    assert (tmp_path / "feed-restart" / RESTARTS_FILE).is_file()
    assert learner.recoveries >= 1  # not vacuous: the stream did hit the dead feed and came back
    assert checked >= 3 * len(catalog)
    ray.kill(feed, no_restart=True)
