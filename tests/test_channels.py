"""Channel generations (dataplane.generations, runtime.channels): the policy without Ray, and rounds of real
learner actors through a real averager and its shards, checked against the mean of what they sent."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import adam_learners

from raytrain_seq.dataplane.generations import ChannelBook, ChannelPlan, Link

RAY_CLUSTER = {"log_to_driver": False}


# ------------------------------------------------------------------------------------------ the policy
def _link(shards: int = 2, tag: str = "x") -> Link:
    return Link(
        outputs=tuple(f"{tag}->{i}" for i in range(shards)), reader=(tag, "node"), nbytes=(8,) * shards
    )


def test_a_generation_is_planned_only_after_a_full_flat_round_with_channels_on():
    book = ChannelBook(enabled=True)
    assert book.propose([0, 1], [0, 1], (), flat=True, world_size=2)
    assert not book.propose([0], [0, 1], (), flat=True, world_size=2)  # a member missing
    assert not book.propose([0, 1], [0, 1], (2,), flat=True, world_size=3)  # someone dropped
    assert not book.propose([0], [0], (), flat=True, world_size=2)  # the group waits for 1 of 2
    assert not book.propose([0, 1], [0, 1], (), flat=False, world_size=2)  # tensors: no slices to move
    assert not ChannelBook(enabled=False).propose([0, 1], [0, 1], (), flat=True, world_size=2)
    plan = book.start([1, 0], [("s0", "n"), ("s1", "n")])
    assert (plan.generation, plan.members, plan.index(0)) == (1, (1, 0), 1)
    assert not book.propose([0, 1], [0, 1], (), flat=True, world_size=2)  # one generation at a time


def test_linking_completes_with_the_last_member_and_the_shards_read_members_in_plan_order():
    book = ChannelBook(enabled=True)
    plan = book.start([1, 0], [("s0", "n"), ("s1", "n")])
    assert book.link(plan.generation + 1, 0, _link(tag="a")) == "refused"  # another generation
    assert book.link(plan.generation, 7, _link(tag="a")) == "refused"  # not a member
    with pytest.raises(ValueError, match="3 channels for 2 shards"):
        book.link(plan.generation, 0, _link(3, tag="a"))
    assert book.link(plan.generation, 0, _link(tag="a")) == "waiting"
    assert book.link(plan.generation, 1, _link(tag="b")) == "complete"
    # Shard i reads member j's channel at j, members in the plan's order (1 first).
    assert book.shard_inputs() == [["b->0", "a->0"], ["b->1", "a->1"]]
    assert book.readers() == [("b", "node"), ("a", "node")]
    assert not book.live
    assert book.opened(plan.generation, ["out0", "out1"]) and book.live
    assert book.accepts(plan.generation, [0, 1]) and not book.accepts(plan.generation, [0])
    assert not book.accepts(plan.generation + 1, [0, 1])


def test_ending_a_generation_counts_it_once_and_refuses_late_links():
    book = ChannelBook(enabled=True)
    assert book.end() is None and book.failed == 0  # nothing planned: nothing ends
    plan = book.start([0, 1], [("s0", "n"), ("s1", "n")])
    book.link(plan.generation, 0, _link(tag="a"))
    book.link(plan.generation, 1, _link(tag="b"))
    book.opened(plan.generation, ["out0", "out1"])
    assert book.end() == plan.generation
    assert (book.live, book.failed, book.end()) == (False, 1, None)
    assert book.link(plan.generation, 0, _link(tag="a")) == "refused"
    assert not book.opened(plan.generation, ["out0", "out1"])  # opened after it ended: stays ended
    assert book.start([0, 1], []).generation == plan.generation + 1


def test_a_live_generation_waits_for_members_still_attaching_but_ends_on_a_missing_or_lapsed_one():
    """Members link in the background, so the first rounds of a live generation may mix channels and
    the store (kept); once a round went through the channels, a member back on the store ends it."""
    book = ChannelBook(enabled=True)
    plan = book.start([0, 1], [("s0", "n")])
    assert not book.keeps([0, 1], channelled=0, written=False)  # not live yet: nothing to keep
    book.link(plan.generation, 0, _link(1, tag="a"))
    book.link(plan.generation, 1, _link(1, tag="b"))
    book.opened(plan.generation, ["out0"])
    assert book.keeps([0, 1], channelled=1, written=False) and not book.used  # 1 not attached yet
    assert book.keeps([1, 0], channelled=2, written=True) and book.used
    assert not book.keeps([0, 1], channelled=1, written=False)  # a member left the channels
    assert not book.keeps([0], channelled=1, written=False)  # a member missing
    book.end()
    assert not book.used  # the next generation starts unused


def test_after_max_ended_generations_no_more_are_planned():
    """Each generation leaves its buffers in the store: only ``max_ended`` may end early in a run."""
    book = ChannelBook(enabled=True, max_ended=2)
    for _ in range(2):
        assert book.propose([0, 1], [0, 1], (), flat=True, world_size=2)
        plan = book.start([0, 1], [("s0", "n")])
        book.link(plan.generation, 0, _link(1, tag="a"))
        book.end()
    assert book.failed == 2 and not book.propose([0, 1], [0, 1], (), flat=True, world_size=2)


def test_a_plan_travels_by_value():
    plan = ChannelPlan(3, (0, 1), (("s", "n"),))
    assert copy.deepcopy(plan) == plan


# ------------------------------------------------------------------------------- rounds on a cluster
def _learner_class():
    import ray

    @ray.remote(num_cpus=0)
    class ChannelLearner:
        """A learner without a model: its state_dict and Adam state, sent each round as flat slices
        through ``AveragerClient.send`` (channels once linked) and replaced by the round's result."""

        def __init__(self, params: dict, moments: dict) -> None:
            self.params, self.moments = params, moments

        def join(self, averager, rank: int, world_size: int, channels: bool) -> int:
            import uuid

            from raytrain_seq.rounds.client import AveragerClient
            from raytrain_seq.runtime.channels import RayChannelEnds
            from raytrain_seq.runtime.ray_store import RayStore
            from raytrain_seq.runtime.transport import RayTransport

            self.rank = rank
            self.client = AveragerClient(
                RayTransport(averager), learner=rank, world_size=world_size, incarnation=uuid.uuid4().hex,
                round_timeout_s=60.0, store=RayStore(),
                node=ray.get_runtime_context().get_node_id(),
                channels=RayChannelEnds() if channels else None,
            )  # fmt: skip
            return self.client.join().shards

        def round(self, step: float) -> dict:
            """Move the weights by ``step`` * (rank + 1) (each learner its own way), send them, and hold
            the result; what was sent (numpy copies), how, and what came back."""
            import torch

            from raytrain_seq.dataplane.payload import FlatLayout, FlatPayload
            from raytrain_seq.rounds.client import Averaged

            self.client.wait_linked(60.0)  # a generation planned by the last round (linked meanwhile)
            with torch.no_grad():
                for key, value in self.params.items():
                    if value.is_floating_point() and "running" not in key:
                        value.add_(step * (self.rank + 1))
            sent = {k: v.numpy().copy() for k, v in self.params.items() if v.is_floating_point()}
            layout = FlatLayout.of(self.params, self.moments)
            slices, extras, _ = layout.slices(self.params, self.moments, self.client.shards)
            parts = self.client.send(slices)
            decision = self.client.average(FlatPayload(layout, parts, extras), None, stats={}, position=None)
            state = decision.result.state if isinstance(decision, Averaged) else decision.reply.state
            held = state.materialise(self.client.store.get)
            # Copies: the merged slices are views into the channels' buffers, which the next round reuses.
            self.params = {k: v.clone() for k, v in held.params.items()}
            self.moments = copy.deepcopy(held.optimizer_state)
            return {
                "sent": sent,
                "via": type(parts[0]).__name__,
                "round": state.round,
                "got": {k: v.numpy().copy() for k, v in self.params.items() if v.is_floating_point()},
                "averaged": isinstance(decision, Averaged),
                "generation": self.client.channels.generation if self.client.channels else None,
            }

    return ChannelLearner


def test_a_channel_copied_for_its_readers_holds_no_writer_handle_and_still_carries_values(ray_cluster):
    """``for_readers`` (which reaches into Ray's ``Channel``): every buffer of the copy has no writer
    handle, and a reader given the copy reads what the writer writes, round after round."""
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Writer:
        def open(self, reader, node):
            from ray.experimental.channel.shared_memory_channel import BufferedSharedMemoryChannel
            from ray.experimental.channel.utils import get_self_actor

            from raytrain_seq.runtime.channels import for_readers

            self.channel = BufferedSharedMemoryChannel(get_self_actor(), [(reader, node)], 1, 10_000)
            copy_ = for_readers(self.channel)
            assert all(buffer._writer is not None for buffer in self.channel._buffers)  # untouched
            return copy_, [buffer._writer for buffer in copy_._buffers]

        def write(self, value):
            self.channel.write(value, timeout=10)

    @ray.remote(num_cpus=0)
    class Reader:
        def take(self, channel):
            self.channel = channel

        def read(self):
            return self.channel.read(timeout=10)

    node = ray.get_runtime_context().get_node_id()
    writer, reader = Writer.remote(), Reader.remote()
    try:
        channel, writers = ray.get(writer.open.remote(reader, node))
        assert writers == [None]
        ray.get(reader.take.remote(channel))
        for value in (3, 5):
            ray.get(writer.write.remote(("round", value)))
            assert ray.get(reader.read.remote()) == ("round", value)
    finally:
        for actor in (writer, reader):
            ray.kill(actor)


def _check_mean(results: list[dict]) -> None:
    """Every learner got the equal-weight mean of what the learners sent (BatchNorm's statistics are
    merged by their own rule: left out), and the learners did send different weights (not vacuous)."""
    keys = [k for k in results[0]["sent"] if "running" not in k]
    assert any(not np.array_equal(results[0]["sent"][k], results[1]["sent"][k]) for k in keys)
    for key in keys:
        mean = np.mean([r["sent"][key] for r in results], axis=0)
        for r in results:
            np.testing.assert_allclose(r["got"][key], mean, rtol=1e-6, atol=1e-6)


def _group(ray, n: int, channels: bool, name: str, timeout_s: float = 20.0):
    from raytrain_seq.rounds.settings import AveragerSettings
    from raytrain_seq.runtime.averager import create_averager

    params, moments = adam_learners(n)
    cls = _learner_class()
    learners = [cls.remote(params[j], moments[j]) for j in range(n)]
    settings = AveragerSettings(world_size=n, timeout_s=timeout_s, channels=channels)
    averager = create_averager(name, settings, namespace="channels-test")
    assert ray.get([a.join.remote(averager, j, n, channels) for j, a in enumerate(learners)]) == [n] * n
    return averager, learners


def test_rounds_go_through_the_channels_once_linked_and_give_the_store_paths_mean(ray_cluster):
    """Round 1 goes through the store and plans generation 1; every later round goes through its
    channels; each round gives every learner the mean of what they sent, as the store's rounds do; the
    averager's own copy (``latest``) is the last round's mean."""
    ray = ray_cluster
    averager, learners = _group(ray, 2, channels=True, name="channels-rounds")
    store_averager, store_learners = _group(ray, 2, channels=False, name="store-rounds")
    try:
        for step in (0.5, -0.25, 0.125):
            results = ray.get([a.round.remote(step) for a in learners])
            _check_mean(results)
            expected = ray.get([a.round.remote(step) for a in store_learners])
            for r, e in zip(results, expected, strict=True):
                for key in e["got"]:
                    np.testing.assert_allclose(r["got"][key], e["got"][key], rtol=1e-6, atol=1e-6)
            assert [e["via"] for e in expected] == ["ObjectRef"] * 2
        vias = [r["via"] for r in results]
        assert vias == ["Channelled"] * 2 and [r["generation"] for r in results] == [1, 1]

        # The shards never unpickled a learner's handle (which would load the learner's class and torch
        # into them: runtime.channels.for_readers, RayShards.open_channels).
        def has_torch(_actor) -> bool:  # defined here: pickled by value into the shards
            import sys

            return "torch" in sys.modules

        shards = ray.get(averager.shard_actors.remote())
        assert ray.get([s.__ray_call__.remote(has_torch) for s in shards]) == [False, False]
        latest = ray.get(averager.latest.remote())
        assert latest.round == 3
        for key, value in latest.params.items():
            if key in results[0]["got"]:
                np.testing.assert_allclose(value.numpy(), results[0]["got"][key], rtol=1e-6, atol=1e-6)
    finally:
        for actor in (*learners, *store_learners, averager, store_averager):
            ray.kill(actor)


def test_a_shard_restarted_by_ray_ends_the_generation_and_the_round_is_resent_through_the_store(ray_cluster):
    """A shard killed (Ray restarts it without the generation's channels): the next round is refused
    (the averager ends the generation), resent through the store and averaged right; the round after
    plans generation 2, and the rounds go through its channels again."""
    ray = ray_cluster
    averager, learners = _group(ray, 2, channels=True, name="channels-shard-lost")
    try:
        for step in (0.5, -0.25):
            results = ray.get([a.round.remote(step) for a in learners])
        assert [r["via"] for r in results] == ["Channelled"] * 2
        shard = ray.get(averager.shard_actors.remote())[1]
        ray.kill(shard, no_restart=False)
        results = ray.get([a.round.remote(0.75) for a in learners])
        _check_mean(results)  # sent through channel 1, refused, resent through the store
        assert [r["round"] for r in results] == [3, 3] and all(r["averaged"] for r in results)
        results = ray.get([a.round.remote(-0.5) for a in learners])  # plans generation 2
        _check_mean(results)
        results = ray.get([a.round.remote(0.25) for a in learners])
        _check_mean(results)
        assert [r["via"] for r in results] == ["Channelled"] * 2 and [r["generation"] for r in results] == [
            2,
            2,
        ]
        summary = ray.get(averager.summary.remote())
        assert summary.next_round == 6
    finally:
        for actor in (*learners, averager):
            ray.kill(actor)


def test_a_member_that_misses_a_round_is_dropped_and_the_others_round_goes_through_the_store(ray_cluster):
    """Learner 1 misses a round of a live generation: learner 0's round closes at the timeout without it
    (merged from the channel it wrote, handed out through the store: the generation ends); learner 1's
    late round is refused and it realigns to the group's state; the next full round plans generation 2."""
    ray = ray_cluster
    averager, learners = _group(ray, 2, channels=True, name="channels-drop", timeout_s=3.0)
    try:
        for step in (0.5, -0.25):
            results = ray.get([a.round.remote(step) for a in learners])
        assert [r["via"] for r in results] == ["Channelled"] * 2
        alone = ray.get(learners[0].round.remote(0.75), timeout=60)
        assert alone["via"] == "Channelled" and alone["averaged"] and alone["round"] == 3
        for key, value in alone["got"].items():  # the mean of learner 0 alone: what it sent
            np.testing.assert_allclose(value, alone["sent"][key], rtol=1e-6, atol=1e-6)
        late = ray.get(learners[1].round.remote(0.75), timeout=60)
        # Its write went into the ended generation's channel (left open, unread: dataplane.generations says
        # why), its round was refused, and it took the group's round 3.
        assert late["via"] == "Channelled" and not late["averaged"] and late["round"] == 3
        for key, value in late["got"].items():  # realigned to the group's round 3
            np.testing.assert_allclose(value, alone["got"][key], rtol=1e-6, atol=1e-6)
        results = ray.get([a.round.remote(-0.5) for a in learners])  # both again: plans generation 2
        _check_mean(results)
        results = ray.get([a.round.remote(0.25) for a in learners])
        _check_mean(results)
        assert [r["via"] for r in results] == ["Channelled"] * 2 and [r["generation"] for r in results] == [
            2,
            2,
        ]
        assert [d["learner"] for d in ray.get(averager.summary.remote()).dropped] == [1]
    finally:
        for actor in (*learners, averager):
            ray.kill(actor)
