"""Elastic and fault-tolerant learners, without a cluster: re-split, positions, backoff, the summary's logs.

Contracts pinned: the blocks an epoch has left are re-split over a new group with equal counts, each
block exactly once and nothing dropped, whatever chain of group sizes the epoch went through; an
``EpochPosition`` survives JSON and describes that chain; the learners' retry schedule is bounded and
exponential; the averager's membership log becomes the summary's
``membership`` (one entry per change of the learner count) and ``recoveries``; the driver refuses a
storage path it cannot write before it starts anything.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter

import numpy as np
import pytest
import torch
from averager_fixtures import local_averager

from raytrain_seq.algorithms.packing import pack
from raytrain_seq.config import Config, RunSetupError
from raytrain_seq.members.retry import Backoff
from raytrain_seq.outputs.reports import FeedReport, LearnerReport
from raytrain_seq.parts import Parts
from raytrain_seq.rounds.book import RoundBook
from raytrain_seq.rounds.events import membership_entries, recovery_entries
from raytrain_seq.rounds.position import EpochPosition, layout_specs, resplit
from raytrain_seq.rows.assembly import plan_specs, spread_fresh


def _plan(n: int = 53, seed: int = 3):
    """A real packing plan of n random lengths, with ids/labels/fresh masks as the feed builds them."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 60, size=n)
    plan = pack(lengths, 64, seed=seed)
    ids, labels = (np.arange(n) + 1000).tolist(), (np.arange(n) % 4).tolist()
    fresh = rng.random(n) < 0.4
    return plan, lambda w: plan_specs(plan, w, ids, labels, fresh)


def _key(block) -> tuple:
    return (block.ids, block.offsets)


def _plan_keys(plan) -> list[tuple]:
    """The plan's blocks as spec keys (plan positions -> catalog ids, position + 1000)."""
    return [(tuple(1000 + i for i in b.ids), b.offsets) for b in plan.blocks]


def _real(blocks) -> list[tuple]:
    return [_key(b) for b in blocks if b.ids]


# ------------------------------------------------------------------------------------------ re-split
@pytest.mark.parametrize(("old", "rows", "new"), [(4, 3, 3), (2, 5, 3), (3, 0, 1), (1, 7, 4)])
def test_resplit_equal_counts_each_remaining_block_once(old, rows, new):
    """resplit: every new shard has the same length; consumed + re-split = the plan, each block once."""
    plan, split = _plan()
    specs = split(old)
    assert len({len(s) for s in specs}) == 1 and rows < len(specs[0])
    out = resplit(specs, rows, new)
    assert len(out) == new and len({len(s) for s in out}) == 1  # equal counts
    consumed = [_key(b) for s in specs for b in s[:rows] if b.ids]
    remaining = [k for s in out for k in _real(s)]
    everything = Counter(consumed + remaining)
    assert set(everything.values()) == {1}, "a block was trained twice"
    assert set(everything) == set(_plan_keys(plan)), "a block was dropped"
    fillers = sum(1 for s in out for b in s if not b.ids)
    assert fillers == (-len(remaining)) % new and all(b.weight == 0.0 for s in out for b in s if not b.ids)
    # Not vacuous: the old layout really had blocks left that now moved to other shards.
    assert remaining and (old != new or rows == 0)


def test_resplit_balances_frames_and_rejects_bad_arguments():
    """The re-dealt shards' frames differ by at most one block's; bad rows or sizes raise ValueError."""
    _, split = _plan(n=80, seed=5)
    out = resplit(split(3), 4, 2)
    frames = [sum(sum(b.lengths) for b in s) for s in out]
    biggest = max(sum(b.lengths) for s in out for b in s)
    assert abs(frames[0] - frames[1]) <= biggest
    with pytest.raises(ValueError, match="rows_done"):
        resplit(split(3), 10_000, 2)
    with pytest.raises(ValueError, match="unequal"):
        resplit([split(2)[0], split(2)[1][:-1]], 0, 2)


def test_resplit_deals_a_lost_ranks_blocks_last_in_every_new_shard():
    """gone=(1,): each new shard holds the blocks it would without gone, the lost rank's (its unreached
    and its missed ones) after all the others, each part in spread_fresh's order; the chain replays it."""
    _, split = _plan(n=90, seed=13)
    specs, rows, missed = split(3), 4, ((1, 2, 4), (2, 3, 4))
    plain = resplit(specs, rows, 2, missed)
    out = resplit(specs, rows, 2, missed, gone=(1,))
    lost = {_key(b) for b in [*specs[1][2:4], *specs[1][rows:]] if b.ids}
    for before, after in zip(plain, out, strict=True):
        assert Counter(map(_key, before)) == Counter(map(_key, after))  # the same deal
        kinds = [_key(b) in lost for b in after if b.ids]
        tail = kinds.index(True)
        assert tail > 0 and all(kinds[tail:]), "the lost rank's blocks are not all at the end"
        early = [b for b in after if _key(b) not in lost]
        assert early == [early[i] for i in spread_fresh([b.fresh_frames for b in early])]
    assert out != plain  # not vacuous: the order changed
    # The chain's layout with missed rows deals from rank 1 (layout_specs' make-up turn).
    assert layout_specs(split, ((3, rows, missed, (1,)),), 2) == resplit(specs, rows, 2, missed, 1, (1,))
    with pytest.raises(ValueError, match="lost ranks"):
        EpochPosition(0, (), 3, 4).for_group(2, gone=[3])


def test_layout_chain_trains_every_block_exactly_once():
    """An epoch run by 4, then 2, then 3 learners (rows taken in between) covers the plan exactly once."""
    plan, split = _plan(n=90, seed=11)
    chain = [(4, 3), (2, 2)]  # 4 learners took 3 rows each, then 2 learners 2 rows each; now 3 learners
    trained: list[tuple] = []
    for depth in range(len(chain) + 1):
        specs = layout_specs(split, chain[:depth], chain[depth][0] if depth < len(chain) else 3)
        rows = chain[depth][1] if depth < len(chain) else None
        trained += [_key(b) for s in specs for b in s[:rows] if b.ids]
    assert Counter(trained) == Counter(_plan_keys(plan))
    final = layout_specs(split, chain, 3)
    assert len({len(s) for s in final}) == 1 and len(final) == 3
    # Deterministic: another process rebuilding the same chain gets the same shards.
    assert layout_specs(split, chain, 3) == final


# ------------------------------------------------------------------------------------------ position
def test_epoch_position_for_group_and_json_round_trip():
    """for_group keeps the layout for the same size, replaces an untouched one, chains a started one."""
    start = EpochPosition(2)
    assert start.for_group(3) == EpochPosition(2, (), 3, 0)
    running = EpochPosition(2, (), 3, 0).after(5)
    assert running.for_group(3) is running  # same size: same shards, no re-split
    moved = running.for_group(2)
    assert moved == EpochPosition(2, ((3, 5),), 2, 0)
    assert moved.after(0).for_group(4) == EpochPosition(2, ((3, 5),), 4, 0)  # nothing taken: replaced
    text = json.dumps(moved.after(1).as_dict())
    assert EpochPosition.from_dict(json.loads(text)) == moved.after(1)
    lost = running.for_group(2, gone=[2])  # rank 2's learner was lost: recorded, with no missed range
    assert lost == EpochPosition(2, ((3, 5, (), (2,)),), 2, 0)
    assert EpochPosition.from_dict(json.loads(json.dumps(lost.as_dict()))) == lost
    # A loss at a layout's end: the untouched make-up layout's entry (same group size) names the rank.
    make_up = EpochPosition(2, (), 2, 6, missed=((1, 4, 6),)).close_layout()
    assert make_up.for_group(1, gone=[1]) == EpochPosition(2, ((2, 6, ((1, 4, 6),), (1,)),), 1, 0)
    assert moved.for_group(1, gone=[1]) == EpochPosition(2, ((3, 5),), 1, 0)  # another group's entry: kept
    with pytest.raises(ValueError, match="for_group"):
        start.after(4)  # rows taken under no layout could not be found again by another group
    for bad in (
        {"epoch": -1},
        {"rows_done": 2},
        {"epoch": 0, "history": [[0, 3]]},
        {"epoch": 0, "history": [[3, 5, [], [3]]]},
        {"epoch": 0, "history": [[3, 5, [], [1], []]]},
    ):
        with pytest.raises(ValueError, match="epoch position"):
            EpochPosition.from_dict(bad)


def test_epoch_position_carries_the_run_step_count_through_layouts_and_json():
    """train.steps counts on from the position: for_group and after keep the count, JSON keeps it, a
    position written before the count existed reads as 0 steps, and a negative count is refused."""
    moved = EpochPosition(2, (), 3, 0, steps=40).after(5).for_group(2)
    assert moved == EpochPosition(2, ((3, 5),), 2, 0, steps=40)
    later = moved.after(1).with_steps(41)
    assert EpochPosition.from_dict(json.loads(json.dumps(later.as_dict()))) == later
    assert EpochPosition.from_dict({"epoch": 1, "world_size": 2, "rows_done": 3}).steps == 0
    with pytest.raises(ValueError, match="epoch position"):
        EpochPosition.from_dict({"epoch": 1, "steps": -1})


def test_epochs_trained_counts_the_share_of_rows_over_every_layout():
    from raytrain_seq.rounds.position import epochs_trained

    assert epochs_trained(EpochPosition(3, steps=9), 10) == 3.0
    assert epochs_trained(EpochPosition(1, (), 1, 2), 8) == 1.25
    # 8 rows each by 4 learners, then 2 of 10 each by 3: (32 + 6) / (32 + 30).
    assert epochs_trained(EpochPosition(2, ((4, 8),), 3, 2), 10) == pytest.approx(2 + 38 / 62)


# ------------------------------------------------------------------------------------------- backoff
def test_backoff_is_bounded_and_exponential():
    """Delays double from base up to cap and their sum stays within the budget."""
    assert Backoff(0.5, 4.0, 10.0).delays() == [0.5, 1.0, 2.0, 4.0]
    delays = Backoff(0.25, 2.0, 30.0).delays()
    assert delays[:4] == [0.25, 0.5, 1.0, 2.0] and set(delays[3:]) == {2.0}
    assert sum(delays) <= 30.0 < sum(delays) + 2.0
    for base, cap, budget in [(0.0, 0.0, 1.0), (0.5, 0.25, 1.0), (0.5, 1.0, -1.0)]:  # 0: a loop never ending
        with pytest.raises(ValueError, match="need base_s > 0"):
            Backoff(base, cap, budget)


# ------------------------------------------------------------------------------- membership, summary
def test_membership_log_becomes_the_summary_entries():
    """Each change of the learner count (start, shrink, drop, rejoin, grow) is one membership entry."""
    book = RoundBook(2, timeout_s=1.0, clock=lambda: 0.0)
    for rank in (0, 1):
        book.join(rank, 2, incarnation=f"a{rank}")
    book.join(0, 1, incarnation="b0")  # Ray Train restarted with 1 learner
    for rank in (0, 1):
        book.join(rank, 2, incarnation=f"c{rank}")  # and grew back to 2
    book.arrive(0, 1, 2, incarnation="c0")
    book.current.deadline = -1.0  # past the deadline: rank 1 is dropped
    book.close()
    book.finish()
    book.join(1, 2, incarnation="c1")
    for i, record in enumerate(book.membership_log):
        record["elapsed_s"] = float(i)
    entries = membership_entries(book.membership_log)
    assert [e["learners"] for e in entries] == [2, 1, 2, 1, 2]
    reasons = [e["reason"] for e in entries]
    assert reasons[0] == "learners started" and "fewer" in reasons[1] and "more" in reasons[2]
    assert "dropped from round 1" in reasons[3] and "rejoined" in reasons[4]
    assert [e["time_s"] for e in entries] == sorted(e["time_s"] for e in entries)
    assert len(book.membership_log) > len(entries)  # plain joins are not changes
    recoveries = recovery_entries([{"elapsed_s": 3.0, "kind": "dropped", "detail": "x"}])
    assert recoveries == [{"time_s": 3.0, "kind": "dropped", "detail": "x"}]


def final_metrics(**fields) -> LearnerReport:
    """Rank 0's final metrics of a short run, with ``fields`` replaced."""
    metrics = dict(round=1, epoch=1, batch_size=4, learner_seconds=2.0, averaging_s=0.1, compute_s=1.5)
    metrics.update(data_wait_s=0.1, cold_epoch_s=0.0, validation_s=0.0, test_s=0.2, first_step_wall=None)
    metrics.update(timeline={}, steps_trained=3, epochs_trained=1.0, test_sequences_mine=3)
    metrics.update(test_accuracy=None, test_sequences=6, test_learners=2, per_class={})
    metrics.update(top5_accuracy=None, mean_class_accuracy=None, confusion={}, final_report_wall=0.0)
    return LearnerReport(**{**metrics, **fields})


def test_summary_fills_elastic_and_video_fields():
    """build_summary: learners = final group, membership/recoveries from the averager, per-class by name."""
    from raytrain_seq.runtime.driver import build_summary

    async def averaged():
        averager = local_averager(2, timeout_s=30.0, validate_every=1, batch_size=4)
        for rank in (0, 1):
            await averager.join(rank, 2, incarnation=f"a{rank}")
        await averager.join(0, 1, incarnation="b0")  # the group shrank to one learner
        result = await averager.average(
            0, 1, 1, {"w": torch.ones(2)}, None, {"frames": 7.0, "loss": 0.5, "sequences": 2.0}
        )
        await averager.report_validation(1, 0.75, epoch=0)
        return result, await averager.summary()

    result, averaging = asyncio.run(asyncio.wait_for(averaged(), 20))
    config = Config.from_preset("smoke")
    feed = FeedReport(
        videos={"train": 3, "val": 1, "test": 1, "skipped": []},
        flow_method=None,
        flow_once=False,
        epochs={},
        eval={"videos": 0, "seconds": 0.0},
        totals={
            "recomputed": 0,
            "reused": 0,
            "partial_videos": 0,
            "partial_seconds": 0.0,
            "tasks_pending": 0,
        },
        t_max=8,
        max_sequences=4,
        reuse=1,
        restarts=[],
    )
    metrics = final_metrics(test_accuracy=0.5, per_class={"0": [1, 2], "2": [0, 0], "3": [3, 3]})
    summary = build_summary(config, metrics, averaging, feed, ["walk", "run", "jump", "swim"])
    assert summary.learners == 1 and summary.frames_total == 7 and result.state.round == 1
    assert [m["learners"] for m in summary.membership] == [2, 1]
    assert [r["kind"] for r in summary.recoveries] == ["restart_from_scratch"]
    assert summary.per_class_accuracy == {"walk": 0.5, "swim": 1.0}  # a class with no test video is left out
    assert summary.videos["train"] == 3 and summary.stream == "rgb" and summary.flow_method is None
    assert summary.val_accuracy_history == [
        {
            "round": 1,
            "epoch": 0,
            "accuracy": 0.75,
            "time_s": pytest.approx(summary.val_accuracy_history[0]["time_s"]),
        }
    ]
    assert summary.loss_history[0]["loss"] == 0.5


def test_storage_path_that_cannot_be_written_is_refused_before_ray(tmp_path):
    """A --storage-path that cannot hold the run folder stops the run with RunSetupError, Ray untouched."""
    import ray

    from raytrain_seq.runtime.driver import run

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # a path under a file cannot be created, even by root
    config = Config.from_preset("smoke", storage_path=str(blocker / "runs"), run_name="x")
    was_up = ray.is_initialized()
    with pytest.raises(RunSetupError, match=r"cannot write the run folder .*pass a writable --storage-path"):
        run(config)
    assert ray.is_initialized() == was_up
    assert os.path.isfile(blocker)


def test_the_fields_only_ray_train_read_are_refused_naming_what_replaced_them(tmp_path):
    """train.resize_interval_s and train.preemption_watcher went with Ray Train: a preset override, a
    config file or a flag that sets one is refused naming the fleet's behaviour instead; an older run's
    record, which holds them at their defaults, still loads (fusion and export read those records)."""
    from raytrain_seq import cli

    for key, value in (("resize_interval_s", 5.0), ("preemption_watcher", True)):
        with pytest.raises(ValueError, match=rf"train\.{key} was retired with Ray Train"):
            Config.from_preset("smoke", **{key: value})
        record = Config.from_preset("smoke").to_dict()
        record["train"][key] = value
        with pytest.raises(ValueError, match=rf"train\.{key} was retired"):
            Config.from_dict(record)
    old = Config.from_preset("smoke").to_dict()
    old["train"].update(resize_interval_s=60.0, preemption_watcher=False)
    assert Config.from_dict(old) == Config.from_preset("smoke")
    for flag in ("--resize-interval-s=2", "--preemption-watcher", "--no-preemption-watcher"):
        with pytest.raises(SystemExit):
            cli.parse([flag])
    with pytest.raises(ValueError, match=r"train\.poll_interval_s"):
        Config.from_preset("smoke", poll_interval_s=0)


def test_the_first_group_is_what_the_alive_nodes_hold_within_the_learner_range():
    """Like Ray Train's elastic policy: per alive node, how many learners its resources hold."""
    from raytrain_seq.runtime.fleet import first_group_size

    head = {"Alive": True, "Resources": {"CPU": 3.0}}
    slot = {"Alive": True, "Resources": {"CPU": 1.0, "learner_slot": 1.0}}
    dead = {"Alive": False, "Resources": {"CPU": 8.0, "learner_slot": 8.0}}
    need = {"CPU": 1.0, "GPU": 0.0, "learner_slot": 1.0}
    assert first_group_size([head, slot, slot, dead], need, 1, 4) == 2
    assert first_group_size([head, slot], need, 2, 4) == 2  # never below the minimum: the wait decides
    assert first_group_size([head], {"CPU": 1.0}, 1, 2) == 2
    gpu = {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}}
    assert first_group_size([gpu], {"CPU": 1.0, "GPU": 0.5}, 1, 4) == 2


def test_feed_start_launches_epoch_0_once_and_epoch_shard_serves_it_without_a_second_launch():
    """BlockFeed.start (a fresh run's rank 0, as soon as it runs) launches epoch 0 in the learners' order;
    a second start, or one after any epoch was served, launches nothing; epoch_shard(0) then serves the
    launched arrays and launches only epoch 1's recompute."""
    from raytrain_seq.runtime.feed import BlockFeed

    calls: list[tuple[list[int], list]] = []

    def launch(videos, epochs, renewal=None):
        if videos:  # an epoch with nothing left to launch calls it with no videos
            calls.append((list(videos), list(epochs)))
        return [object() for _ in videos]

    config = Config.from_preset("smoke", epochs=3)
    feed = BlockFeed(Parts.of(config).feed, launch=launch)
    started = feed.start(2)
    assert started > 0 and len(calls) == 1 and set(calls[0][1]) == {0}  # epoch 0's partial augmentations
    assert feed.start(2) == 0 and len(calls) == 1
    shard = feed.epoch_shard(0, 0, 2)
    assert len(calls) == 2 and set(calls[1][1]) == {1}  # only epoch 1's recompute was launched next
    served = {video for block in shard.blocks for video in block.ids}
    assert served <= set(calls[0][0]) and served  # not vacuous: epoch 0's rows come from the first launch
    other = BlockFeed(Parts.of(config).feed, launch=launch)
    other.epoch_shard(0, 0, 2)
    assert other.start(2) == 0  # a group restarted after the feed served an epoch: nothing again


def test_feed_prefetch_eval_launches_a_split_once_and_its_shards_serve_those_arrays():
    """BlockFeed.prefetch_eval (the driver's, for the validation rows, as the feed starts) launches every
    video of the split once, as an evaluation cache (epoch None); eval_shard then serves those arrays
    without a second launch, and a bad split is refused by name."""
    from raytrain_seq.runtime.feed import BlockFeed

    calls: list[tuple[list[int], list]] = []

    def launch(videos, epochs, renewal=None):
        calls.append((list(videos), list(epochs)))
        return [object() for _ in videos]

    feed = BlockFeed(Parts.of(Config.from_preset("smoke")).feed, launch=launch)
    launched = feed.prefetch_eval("val")
    assert launched > 0 and len(calls) == 1 and set(calls[0][1]) == {None}
    assert feed.prefetch_eval("val") == 0 and len(calls) == 1
    shard = feed.eval_shard("val", 0, 1)
    assert len(calls) == 1  # served from the prefetched launch
    assert sorted(v for block in shard.blocks for v in block.ids) == sorted(calls[0][0])
    with pytest.raises(ValueError, match="'val' or 'test'"):
        feed.prefetch_eval("train")


def test_evaluation_lanes_grow_with_the_cpus_but_not_before_the_learners_run():
    """The validation split launched as the job starts (before Ray Train places the learners) takes one
    lane per learner, whatever the cluster's CPUs, so that a node with more logical CPUs does not start
    more worker processes ahead of Ray Train's; once the learners run, a split takes every CPU beyond
    theirs."""
    from raytrain_seq.runtime.partial_tasks import eval_lanes

    assert eval_lanes(16, 2, before_learners=True) == 2 and eval_lanes(16, 2, before_learners=False) == 14
    assert eval_lanes(3, 2, before_learners=True) == eval_lanes(3, 2, before_learners=False) == 1
    assert eval_lanes(64, 8, before_learners=True) == 8 and eval_lanes(2, 4, before_learners=False) == 1


@pytest.mark.parametrize("history", [(), ((2, 5),)])
def test_a_feed_asked_from_inside_an_epoch_launches_its_recompute_from_the_learners_next_blocks(history):
    """A feed that has not launched the epoch (a restarted one, or a resumed run's) asked by a learner from
    its block 4 on: the epoch's copies are launched once, the videos of every learner's blocks 4 on first
    (in the order they need them), then the rest; the same copies as asked from block 0, which launches
    in the plain order. Also in a layout after a resize (``history``: two learners took 5 rows each)."""
    from raytrain_seq.runtime.feed import BlockFeed

    def feed_asked(block: int) -> tuple[BlockFeed, list[tuple[int, object]]]:
        launched: list[tuple[int, object]] = []

        def launch(videos, epochs, renewal=None):
            launched.extend(zip(videos, epochs, strict=True))
            return [object() for _ in videos]

        feed = BlockFeed(Parts.of(Config.from_preset("smoke", epochs=4)).feed, launch=launch)
        feed.epoch_shard(1, 0, 3, history=history, from_block=block)
        return feed, launched

    (_, inside), (plain_feed, plain) = feed_asked(4), feed_asked(0)
    shards = [plain_feed.epoch_shard(1, rank, 3, history=history) for rank in range(3)]
    upcoming = list(
        dict.fromkeys(v for k in range(4, len(shards[0].blocks)) for s in shards for v in s.blocks[k].ids)
    )
    assert 0 < len(upcoming) < len(plain) // 2  # not vacuous: a real head, much shorter than the epoch
    assert [v for v, _ in inside[: len(upcoming)]] == upcoming
    assert sorted(inside) == sorted(plain) and inside != plain  # the same copies, in another order
    earlier = {v for s in shards for b in s.blocks[:4] for v in b.ids}
    assert [v for v, _ in plain[: len(earlier)]] != [v for v, _ in inside[: len(earlier)]]
    with pytest.raises(ValueError, match="from_block"):
        plain_feed.epoch_shard(1, 0, 3, history=history, from_block=-1)


def test_a_learners_stream_asks_a_restarted_feed_for_its_epoch_from_its_next_block():
    """LearnerFeed: the stream of a learner restarted at block 2 of its shard (``skip``) asks the feed for
    the epoch from block 2; when an array read fails (a feed that died: ObjectLostError) after it has
    assembled blocks 2-4, it asks again from block 5, and reads the rest; no row is read twice."""
    import ray.exceptions

    from raytrain_seq.members.retry import Backoff
    from raytrain_seq.runtime.feed import BlockFeed
    from raytrain_seq.runtime.learner_feed import LearnerFeed
    from raytrain_seq.runtime.partial_tasks import CachedArray

    config = Config.from_preset("smoke", epochs=1)
    feed = BlockFeed(Parts.of(config).feed, launch=lambda v, e, r=None: list(v))
    side = config.data.cache_size  # each video's cached frames: as long as any block of the smoke set
    frames = np.zeros((feed.t_max, side, side, 3), np.uint8)
    asked, reads = [], []

    class Call:
        def __init__(self, method):
            self.method = method

        def remote(self, *args, **kwargs):
            return (self.method, args, kwargs)

    class Handle:
        epoch_shard, refs = Call("epoch_shard"), Call("refs")

    def get(call):
        if isinstance(call, list):  # the task outputs of CachedArray refs: one video's frames each
            reads.append(list(call))
            if len(reads) == 4:
                raise ray.exceptions.ObjectLostError(str(call[0]), None, "")
            return [[frames] for _ in call]
        method, args, kwargs = call
        if method == "epoch_shard":
            asked.append(kwargs["from_block"])
            return feed.epoch_shard(*args, **kwargs)
        return [CachedArray(("video", v), 0) for v in feed.refs(*args)]

    learner = LearnerFeed(
        Handle(), epochs=1, blocks_per_batch=1, depth=1, get=get, backoff=Backoff(0.01, 0.01, 1.0)
    )
    view, total = learner.epoch_rows(0, 0, 2, skip=2)
    taken = 0
    try:
        while view.take(1) is not None:
            taken += 1
    finally:
        learner.close()
    assert total > 6 and taken == total - 2  # not vacuous: blocks beyond the failed read came
    assert asked == [2, 5] and learner.recoveries == 1


def test_feed_serves_the_resplit_layout():
    """BlockFeed.epoch_shard(history=...): the new group's shards + the old group's taken rows = the epoch."""
    from raytrain_seq.runtime.feed import BlockFeed

    launched: list[int] = []

    def launch(videos, epochs, renewal=None):  # no Ray: placeholders for where the arrays would be
        launched.extend(videos)
        return [object() for _ in videos]

    feed = BlockFeed(Parts.of(Config.from_preset("smoke")).feed, launch=launch)
    old = [feed.epoch_shard(1, rank, 2) for rank in range(2)]
    new = [feed.epoch_shard(1, rank, 3, history=[[2, 5]]) for rank in range(3)]
    assert len({len(s.blocks) for s in new}) == 1 and all(s.world_size == 3 for s in new)
    taken = [_key(b) for s in old for b in s.blocks[:5] if b.ids]
    rest = [_key(b) for s in new for b in s.blocks if b.ids]
    assert Counter(taken + rest) == Counter(_key(b) for s in old for b in s.blocks if b.ids)
    assert set(taken).isdisjoint(rest) and len(rest) > 0
    with pytest.raises(ValueError, match="history"):
        feed.epoch_shard(1, 0, 3, history=[[0, 5]])
    assert launched  # not vacuous: the injected launcher started epoch 1's partial augmentations
