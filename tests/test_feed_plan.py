"""The feed's planner (raytrain_seq/feed/) without Ray: plans, shards, the refurbish cache's keys, the
evaluation splits, the counters and the restart log."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from raytrain_seq.config import Config
from raytrain_seq.data.geometry import data_geometry
from raytrain_seq.feed.cache import EpochNotServedError, Launch
from raytrain_seq.feed.planner import FeedPlanner, check_rank
from raytrain_seq.feed.report import RESTARTS_FILE, EpochCounts, RestartLog
from raytrain_seq.outputs.reports import FeedReport
from raytrain_seq.parts import Parts


def _config(**overrides) -> Config:
    return Config.from_preset("smoke", **{"epochs": 8, **overrides})


def _planner(config: Config, *, keep: int = 2, restarted: bool = False) -> FeedPlanner:
    return FeedPlanner(
        Parts.of(config).feed, data_geometry(config.data, warn=False), keep=keep, restarted=restarted
    )


def _serve(planner: FeedPlanner, epoch: int, world_size: int, launches: list[Launch]) -> None:
    """What the actor shell does for a learner's first epoch_shard(epoch): launch, serve, prefetch e+1."""
    how = planner.serving(epoch)
    if how == "again":
        launch = planner.again(epoch, world_size)
        launches.append(launch)
        planner.launched(launch, world_size)
        return
    if how == "served":
        return
    for target in (epoch, epoch + 1):
        launch = planner.prefetch(target, world_size)
        if launch is not None:
            launches.append(launch)
            planner.launched(launch)
        if target == epoch:
            planner.activate(epoch, world_size)


def _train_ids(config: Config) -> list[int]:
    return data_geometry(config.data, warn=False).catalogs["train"].ids.tolist()


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("packing", ["optimal", "bload", "pad"])
def test_every_training_video_is_read_once_an_epoch_in_equal_shards(world_size, packing):
    """Across a world size's learners every training video is read exactly once per epoch, whole; every
    learner gets as many blocks as the others, and each shard says how many copies the epoch
    recomputed (the chunk baseline cuts videos by definition and is left out)."""
    config = _config(packing=packing, reuse=2)
    catalog = data_geometry(config.data, warn=False).catalogs["train"]
    lengths = dict(zip(catalog.ids.tolist(), catalog.lengths.tolist(), strict=True))
    planner, launches = _planner(config), []
    for epoch in range(3):
        _serve(planner, epoch, world_size, launches)
        shards = [planner.train_shard(epoch, rank, world_size) for rank in range(world_size)]
        assert len({len(s.blocks) for s in shards}) == 1
        read = [
            (video, length)
            for shard in shards
            for block in shard.blocks
            for video, length in zip(block.ids, block.lengths, strict=True)
        ]
        assert sorted(read) == sorted(lengths.items())
        counts = planner.tally.epochs[epoch]
        assert all(s.recomputed == counts.recomputed and s.reused == counts.reused for s in shards)
        assert counts.recomputed + counts.reused == len(lengths) and counts.kept_frames == sum(
            lengths.values()
        )


@pytest.mark.parametrize("reuse", [1, 2, 3])
def test_each_partial_augmentation_is_reused_r_times_and_renewed_in_balanced_slices(reuse):
    """Epoch 0 computes every video; each later epoch recomputes floor(N/r) or ceil(N/r); each copy
    computed in epoch c >= 1 is served in exactly r epochs (c .. c + r - 1) and renewed in c + r, which
    is the renewal its launch named; nothing is launched twice in a straight run."""
    epochs = 10
    config = _config(reuse=reuse, epochs=epochs)
    ids = _train_ids(config)
    n = len(ids)
    planner, launches = _planner(config), []
    served: Counter = Counter()
    for epoch in range(epochs):
        _serve(planner, epoch, 2, launches)
        served.update(planner.keys(ids, epoch))
    launched = [key for launch in launches for key in launch.keys()]  # noqa: SIM118
    assert len(launched) == len(set(launched))  # every copy once
    by_epoch = Counter(epoch for _, epoch in launched)
    assert by_epoch[0] == n
    assert all(by_epoch[e] in (n // reuse, -(-n // reuse)) for e in range(1, epochs))
    for (video, computed), count in served.items():
        if computed >= 1 and computed + reuse <= epochs:
            assert count == reuse, (video, computed, count)
        assert count <= reuse
    renewal = {key: r for launch in launches for key, r in zip(launch.keys(), launch.renewal, strict=True)}
    for (video, computed), when in renewal.items():
        assert when == computed + served[(video, computed)] or computed + served[(video, computed)] == epochs


def test_same_seed_same_plan_and_another_seed_another():
    """Two planners of one seed launch the same copies in the same order and shard the same blocks;
    another seed packs another plan."""

    def run(seed: int):
        planner, launches = _planner(_config(seed=seed, reuse=2)), []
        shards = []
        for epoch in range(4):
            _serve(planner, epoch, 3, launches)
            shards.append([planner.train_shard(epoch, rank, 3) for rank in range(3)])
        return [(launch.keys(), launch.renewal) for launch in launches], shards

    assert run(0) == run(0)
    assert run(0)[1] != run(1)[1]


def test_a_restarted_planner_rebuilds_the_same_epochs():
    """A restarted feed (nothing cached) asked for epoch 3, then the older epoch 2 by a learner behind,
    serves both with the blocks and the copies (video, computing epoch) of the uninterrupted run (it
    recomputes them all, so only its counts differ); a feed that was not restarted refuses the older
    epoch."""
    config = _config(reuse=3)
    ids = _train_ids(config)
    straight, launches = _planner(config, keep=3), []
    for epoch in range(4):
        _serve(straight, epoch, 2, launches)
    restarted, relaunched = _planner(config, restarted=True), []
    assert not restarted.fresh and straight.prefetch(2, 2) is None
    _serve(restarted, 3, 2, relaunched)
    assert sorted(relaunched[0].keys()) == sorted(straight.keys(ids, 3))
    assert restarted.serving(2) == "again"
    _serve(restarted, 2, 2, relaunched)
    assert relaunched[-1].again and restarted.keys(ids, 2) == straight.keys(ids, 2)
    assert {key for key in restarted.keys(ids, 3)} <= restarted.live()
    for epoch in (2, 3):
        for rank in range(2):
            again, first = restarted.train_shard(epoch, rank, 2), straight.train_shard(epoch, rank, 2)
            assert (
                again.blocks == first.blocks and again.recomputed >= first.recomputed
            )  # all lost: recomputed
    plain, ignored = _planner(config), []
    _serve(plain, 3, 2, ignored)
    with pytest.raises(ValueError, match="older than the served epochs"):
        plain.serving(2)


def test_a_restarted_planner_launches_an_older_epoch_from_the_asking_learners_block():
    """``again`` with ``first`` (``upcoming``: every learner's blocks from 3 on, in the order they need
    them) launches those of its missing copies first, then the rest, the same copies as without;
    ``upcoming`` from block 0 is the plain order."""
    config = _config(reuse=3)
    restarted, plain = _planner(config, restarted=True), _planner(config, restarted=True)
    for planner in (restarted, plain):
        _serve(planner, 3, 2, [])
    first = restarted.upcoming(2, 2, (), 3)
    launch, plain_launch = restarted.again(2, 2, first), plain.again(2, 2)
    missing = set(plain_launch.videos)  # epoch 3's copies that epoch 2 shares are cached: not launched
    ahead = [video for video in first if video in missing]
    assert 0 < len(ahead) < len(launch.videos) and list(launch.videos[: len(ahead)]) == ahead
    assert sorted(launch.keys()) == sorted(plain_launch.keys()) and launch.videos != plain_launch.videos
    plain_order = [video for video in restarted.upcoming(2, 2, (), 0) if video in missing]
    assert plain_order == list(plain_launch.videos)


def test_the_cache_keeps_the_newest_epochs_and_names_what_it_dropped():
    """Only the newest keep epochs are served; the keys of an older epoch's copies that no served, current
    or pending copy shares leave live() (the actor then drops their refs)."""
    config = _config(reuse=1)
    ids = _train_ids(config)
    planner, launches = _planner(config, keep=2), []
    for epoch in range(3):
        _serve(planner, epoch, 2, launches)
    assert planner.cache.served_epochs == [1, 2]
    assert not set(planner.keys(ids, 1)) - planner.live()
    assert (ids[0], 0) not in planner.live() and (ids[0], 3) in planner.live()  # epoch 3 is pending
    with pytest.raises(EpochNotServedError, match="epoch 0 is not served"):
        planner.keys(ids, 0)
    with pytest.raises(ValueError, match="not in the cache of epoch 1"):
        planner.keys([-5], 1)


@pytest.mark.parametrize("split", ["val", "test"])
def test_an_evaluation_split_is_launched_once_and_read_whole_by_any_group(split):
    config = _config()
    catalog = data_geometry(config.data, warn=False).catalogs[split]
    planner = _planner(config)
    launch = planner.eval_launch(split)
    assert launch is not None and set(launch.epochs) == {None} and planner.eval_launch(split) is None
    with pytest.raises(ValueError, match="not in the cache of epoch None"):
        planner.keys(launch.videos[:1], None)
    planner.launched(launch)
    assert planner.keys(launch.videos[:2], None) == [(v, None) for v in launch.videos[:2]]
    for world_size in (1, 2, 3):
        shards = [planner.eval_shard(split, rank, world_size) for rank in range(world_size)]
        assert all(s.center and s.epoch is None for s in shards)
        videos = Counter(v for s in shards for b in s.blocks for v in b.ids)
        assert sorted(videos) == sorted(catalog.ids.tolist())


def test_the_report_has_stats_keys_and_the_restart_log_round_trips(tmp_path):
    """The tally's report is a FeedReport whose dict has stats()'s keys; EpochCounts is the per-epoch
    entry; the restart log appends one JSON line per restart in the run folder."""
    config = _config(storage_path=str(tmp_path), run_name="plan")
    planner, launches = _planner(config), []
    _serve(planner, 0, 2, launches)
    counts = planner.tally.epochs[0]
    assert isinstance(counts, EpochCounts) and list(counts.as_dict()) == [
        "recomputed",
        "reused",
        "kept_frames",
        "packing",
    ]
    info = {"ids": [launches[0].videos[0]], "epochs": [0], "seconds": 2.0, "cpu_s": 1.0, "frames": [5]}
    report = planner.report([info], ids=True, tasks_pending=1, actor_cpu_s=0.5)
    assert type(report) is FeedReport
    assert report.epochs[0]["partial_ids"] == [launches[0].videos[0]] and report.totals["tasks_pending"] == 1
    assert report.restarts == [] and report.reuse == config.data.reuse
    log = planner.restart_log()
    assert log.path == tmp_path / "plan" / RESTARTS_FILE
    log.record(12.5)
    RestartLog(tmp_path / "plan").record(13.0)
    lines = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert [r["time"] for r in lines] == [12.5, 13.0] and {r["kind"] for r in lines} == {"feed_restart"}
    assert planner.report([], ids=False, tasks_pending=0, actor_cpu_s=0.0).restarts == lines
    unnamed = _planner(_config())  # no run folder: no log, and no restarts to report
    assert unnamed.restart_log() is None
    assert unnamed.report([], ids=False, tasks_pending=0, actor_cpu_s=0.0).restarts == []


def test_ranks_are_checked_by_name():
    assert check_rank(1, 2) == (1, 2)
    with pytest.raises(ValueError, match="rank 2 >= world_size 2"):
        check_rank(2, 2)
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        check_rank(0, 0)
