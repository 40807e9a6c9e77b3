"""The learner's side of AAVG without Ray: the averager client's decisions, the K-step rounds, the loop.

Contracts pinned: ``AveragerClient`` retries an unreachable averager on the backoff schedule and then
fails clearly, never resends a round that went silent, resends the same payload when a rejoin says the
same round is still due, and returns ``Realigned`` (not an exception) when the others went on; the
learner loop installs the others' state, makes the Ray Train reports of the checkpoint rounds it missed
and trains on from their position; and the whole loop, run against a real ``ParameterAverager`` in
this process with one learner, ends on exactly the weights of a plain PyTorch loop over the same rows
(averaging one learner is the identity), with a checkpoint at every due round.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from averager_fixtures import local_averager
from conftest import InProcess

from raytrain_seq import checkpoint
from raytrain_seq.config import Config
from raytrain_seq.data.geometry import ModelSpec
from raytrain_seq.dataplane.payload import FlatLayout, FlatPayload
from raytrain_seq.dataplane.stores import InProcessStore, SlicesLost
from raytrain_seq.members.errors import AveragerUnavailableError, MembershipError, StaleRoundError
from raytrain_seq.members.retry import Backoff
from raytrain_seq.models import is_compact
from raytrain_seq.models.factory import build_model_for
from raytrain_seq.outputs.reports import LearnerReport, RoundMetrics
from raytrain_seq.parts import Parts
from raytrain_seq.rounds.client import Averaged, AveragerClient, Realigned, Unreachable
from raytrain_seq.rounds.position import EpochPosition
from raytrain_seq.rounds.state import AveragedState, JoinReply, RoundResult
from raytrain_seq.rounds.sync import missed_checkpoint_rounds
from raytrain_seq.runtime.learner import Learner
from raytrain_seq.training.staging import collate_rows
from raytrain_seq.training.step import InnerStep, build_optimizer

T_MAX, SIZE, SLOTS, CLASSES = 12, 16, 3, 4


# ------------------------------------------------------------------------------------------- fakes
class Scripted:
    """A transport that answers each method from a list of scripted replies (an exception is raised)."""

    def __init__(self, **replies: list) -> None:
        self.replies = {name: list(values) for name, values in replies.items()}
        self.calls: list[tuple[str, tuple, dict]] = []

    def __call__(self, method, *args, timeout=None, **kwargs):
        self.calls.append((method, args, kwargs))
        reply = self.replies[method].pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply


class Rows:
    """What ``BlockRowStream`` reads: a dataset whose ``iter_batches`` yields the rows in batches of 3."""

    def __init__(self, rows: list[dict[str, np.ndarray]]) -> None:
        self.rows = rows

    def iter_batches(self, **_: object) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, len(self.rows), 3):
            part = self.rows[start : start + 3]
            yield {key: np.stack([row[key] for row in part]) for key in part[0]}


def _row(rng: np.random.Generator, lengths: list[int], block: int) -> dict[str, np.ndarray]:
    """A block row with sequences of ``lengths`` laid end to end (lengths [5, 7] -> starts [0, 5])."""
    frames = np.zeros((T_MAX, SIZE, SIZE, 3), dtype=np.uint8)
    used = sum(lengths)
    frames[:used] = rng.integers(0, 256, size=(used, SIZE, SIZE, 3), dtype=np.uint8)
    pad = SLOTS - len(lengths)
    return {
        "frames": frames,
        "starts": np.array([*np.cumsum([0, *lengths])[:-1], *[-1] * pad], dtype=np.int64),
        "lengths": np.array([*lengths, *[-1] * pad], dtype=np.int64),
        "labels": np.array([*rng.integers(0, CLASSES, len(lengths)), *[-1] * pad], dtype=np.int64),
        "num_sequences": np.array(len(lengths), dtype=np.int64),
        "weight": np.array(1.0 if lengths else 0.0, dtype=np.float32),
        "block": np.array(block, dtype=np.int64),
    }


def _rows(seed: int, n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    layouts = [[5, 7], [3, 3, 4], [12], [4, 4], [6, 2, 3], [9]]
    return [_row(rng, layouts[i % len(layouts)], i) for i in range(n)]


class Feed:
    """The learner's feed, in memory: ``ROWS`` rows per epoch (a different draw each epoch)."""

    ROWS = 8

    def __init__(self) -> None:
        self.epoch_calls: list[tuple[int, int]] = []
        self.not_ahead: list[int] = []  # the epochs opened with ahead=False (a learner past a held round)

    def model_spec(self) -> ModelSpec:
        return ModelSpec(
            num_classes=CLASSES, in_channels=3, class_names=tuple(f"c{i}" for i in range(CLASSES))
        )

    def epoch(self, epoch: int) -> list[dict[str, np.ndarray]]:
        return _rows(100 + epoch, self.ROWS)

    def epoch_rows(self, epoch, rank, world_size, *, history=(), skip=0, ahead=True):
        from raytrain_seq.rows.assembly import BlockRowStream

        self.epoch_calls.append((epoch, skip))
        if not ahead:
            self.not_ahead.append(epoch)
        rows = self.epoch(epoch)[skip:]
        return (BlockRowStream(Rows(rows)) if rows else None), self.ROWS

    def eval_rows(self, split, rank=0, world_size=1, *, uncropped=False):
        from raytrain_seq.rows.assembly import BlockRowStream

        return BlockRowStream(Rows(_rows(7, 6)[rank::world_size]))


def _config(**overrides) -> Config:
    base = dict(learners=1, epochs=2, k=2, batch_size=2, micro_batch_size=2, checkpoint_every=2)
    base.update(adaptive_batch=False, crop=SIZE, cache_size=SIZE, lr=1e-2)
    return Config.from_preset("smoke", **{**base, **overrides})


class RecordingStore(InProcessStore):
    """The in-process store, recording what each round told it to expect."""

    def __init__(self) -> None:
        self.expected: list[int] = []

    def expect(self, nbytes: int) -> bool:
        self.expected.append(nbytes)
        return False


def _client(transport, **kwargs) -> AveragerClient:
    options = dict(learner=0, world_size=1, incarnation="me", round_timeout_s=30.0)
    options.update(backoff=Backoff(0.1, 0.4, 1.0), sleep=lambda s: None)
    return AveragerClient(transport, **{**options, **kwargs})


def _state(round_: int, value: float, position: dict | None = None, batch_size: int = 2) -> AveragedState:
    params = {k: torch.full_like(v, value) for k, v in torch.nn.Linear(2, 1).state_dict().items()}
    return AveragedState(round=round_, params=params, batch_size=batch_size, position=position, source="live")


# -------------------------------------------------------------------------------------- the client
def test_client_retries_an_unreachable_averager_then_fails_clearly():
    """Unreachable is retried on the backoff schedule; when it runs out, AveragerUnavailableError says so."""
    sleeps: list[float] = []
    reply = JoinReply(state=AveragedState(batch_size=4), next_round=1, world_size=1)
    transport = Scripted(join=[Unreachable("restarting"), Unreachable("slow", silent=True), reply])
    client = _client(transport, sleep=sleeps.append)
    assert client.join() is reply and sleeps == [0.1, 0.2]
    assert (client.next_round, client.batch_size, client.held) == (1, 4, None)  # nothing averaged yet
    sleeps.clear()
    transport = Scripted(join=[Unreachable("gone")] * 10)
    with pytest.raises(AveragerUnavailableError, match="averager-max-restarts") as info:
        _client(transport, sleep=sleeps.append).join()
    assert info.value.attempts == 4 and sleeps == [0.1, 0.2, 0.4]  # 0.1 + 0.2 + 0.4 <= 1.0 < + 0.4


def test_client_never_resends_a_round_that_went_silent():
    """A silent average() may already be in the round: the client fails at once instead of resending."""
    transport = Scripted(average=[Unreachable("no answer", silent=True), "never sent"])
    with pytest.raises(AveragerUnavailableError) as info:
        _client(transport).average({"w": torch.ones(1)}, None, stats={}, position=None)
    assert info.value.attempts == 1 and len(transport.calls) == 1


def test_refused_round_is_resent_after_an_averager_restart():
    """A refusal, then a rejoin that says the same round is due: the same payload is resent; the rejoin
    offers the state the learner holds (a restarted averager is re-seeded with it)."""
    held = _state(4, 4.0)
    result = RoundResult(state=_state(5, 5.0), learners=(0, 1))
    rejoin = JoinReply(state=held, next_round=5, world_size=2)
    transport = Scripted(average=[MembershipError(0, 2, 3, "it is not registered"), result], join=[rejoin])
    client = _client(transport, world_size=2)
    client.held, client.next_round = held, 5
    sent = {"w": torch.ones(1)}
    decision = client.average(sent, None, stats={"frames": 1.0}, position=None)
    assert isinstance(decision, Averaged) and decision.result is result
    (_, first, _), (_, _, join_kwargs), (_, again, _) = transport.calls
    assert first == again and again[1] == 5 and again[3] is sent  # the same round, the same payload
    assert join_kwargs["seed"] is held
    assert (client.next_round, client.held) == (6, result.state)


class KeyedStore(InProcessStore):
    """An object store whose references are keys (like Ray's), counting the reads."""

    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.reads = 0

    def put(self, value):
        key = f"ref{len(self.objects)}"
        self.objects[key] = super().put(value)
        return key

    def get(self, refs):
        self.reads += 1
        return [self.objects[ref] for ref in refs]


def test_a_rounds_state_is_held_as_its_fetched_slices_and_reseeds_flat():
    """The client reads a round's merged slices once and holds them flat (the learner installs them a
    slice at a time); a rejoin after a refusal offers the averager that state flat, its slices the
    arrays in hand (a call pickles an array as its bytes, a tensor at a cost per tensor), equal to the
    merged state, without reading the store again."""
    params = torch.nn.Linear(3, 2).state_dict()
    layout = FlatLayout.of(params, None)
    store = KeyedStore()
    parts = tuple(store.put(part) for part in layout.split(layout.pack(params, None)[0], 2))
    flat = FlatPayload(layout, parts, layout.extras(params, None))
    merged = AveragedState(round=5, flat=flat, batch_size=2, source="live")
    result = RoundResult(state=merged, learners=(0, 1))
    rejoin = JoinReply(state=_state(5, 5.0), next_round=6, world_size=2)  # round 6 is still due
    resent = RoundResult(state=_state(6, 6.0), learners=(0, 1))
    transport = Scripted(
        average=[result, MembershipError(0, 6, 3, "it is not registered"), resent], join=[rejoin]
    )
    client = _client(transport, world_size=2, store=store)
    client.next_round = 5
    assert isinstance(client.average({"w": torch.ones(1)}, None, stats={}, position=None), Averaged)
    held = client.held
    assert held.params is None and held.flat.local and store.reads == 1
    assert [dict(p) for p in held.flat.parts] == [store.objects[r] for r in parts]
    assert client.average({"w": torch.ones(1)}, None, stats={}, position=None).result is resent
    seed = next(kwargs["seed"] for method, _, kwargs in transport.calls if method == "join")
    assert seed.params is None and seed.flat.local and seed.round == 5 and store.reads == 1
    assert [dict(p) for p in seed.flat.parts] == [store.objects[r] for r in parts]
    unpacked = seed.materialise(store.get).params  # local slices: no read
    assert store.reads == 1 and list(unpacked) == list(params)
    assert all(torch.equal(unpacked[k], v) for k, v in params.items())


def test_a_rounds_slices_gone_with_the_averager_rejoin_with_the_held_state():
    """The averager died after the round merged, before this learner read the merged slices (their
    owner): the store says SlicesLost, and the learner rejoins with the state it held, realigned to
    where the restarted averager stands, rather than failing."""

    class OwnerGone(KeyedStore):
        def get(self, refs):
            raise SlicesLost("OwnerDiedError: the objects are gone with their owner")

    params = torch.nn.Linear(3, 2).state_dict()
    layout = FlatLayout.of(params, None)
    store = OwnerGone()
    parts = tuple(store.put(part) for part in layout.split(layout.pack(params, None)[0], 2))
    merged = AveragedState(round=5, flat=FlatPayload(layout, parts, {}), batch_size=2, source="live")
    held = _state(4, 4.0)
    rejoin = JoinReply(state=_state(4, 4.0), next_round=5, world_size=2)  # round 5 is due again
    transport = Scripted(average=[RoundResult(state=merged, learners=(0, 1))], join=[rejoin])
    client = _client(transport, world_size=2, store=store)
    client.next_round, client.held = 5, held
    decision = client.average({"w": torch.ones(1)}, None, stats={}, position=None)
    assert isinstance(decision, Realigned) and decision.reply is rejoin and decision.first_missed == 5
    seed = next(kwargs["seed"] for method, _, kwargs in transport.calls if method == "join")
    assert seed is held and client.next_round == 5 and client.held.round == 4


def test_dropped_learner_gets_a_realigned_decision():
    """Dropped from round 5 while the others averaged 5-7: a Realigned decision with their state."""
    latest = _state(7, 7.0, EpochPosition(1, (), 2, 24).as_dict())
    transport = Scripted(
        average=[StaleRoundError(0, 5, 8, "it was dropped from round 5")],
        join=[JoinReply(state=latest, next_round=8, world_size=2)],
    )
    client = _client(transport, world_size=2)
    client.next_round = 5
    decision = client.average({"w": torch.ones(1)}, None, stats={}, position=None)
    assert isinstance(decision, Realigned) and decision.first_missed == 5
    assert decision.reply.state is latest and (client.next_round, client.held) == (8, latest)


def test_a_newcomer_told_that_training_ended_leaves_without_a_step():
    """A newcomer (no rank yet) whose join came after the last round gets ``ended``: ``run()`` returns
    None at once: it asks the feed for no rows, sends no round, reports nothing and is not seeded from a
    checkpoint (its reply carries no state)."""
    feed, reports, seeded = Feed(), [], []
    last = _state(6, 1.0, EpochPosition(2, (), 2, 0, steps=6).as_dict())
    transport = Scripted(join=[JoinReply.after_end(last, 2)])
    learner = Learner(
        Parts.of(_config()).learner, rank=None, world_size=None, device="cpu",
        client=_client(transport, world_size=None), feed=feed,
        report=lambda metrics, folder: reports.append(metrics), checkpoint_seed=lambda: seeded.append(1),
    )  # fmt: skip
    assert learner.run() is None
    assert [call[0] for call in transport.calls] == ["join"] and transport.calls[0][1][1] is None
    assert feed.epoch_calls == [] and reports == [] and seeded == [] and learner.steps_done == 0


def test_missed_checkpoint_rounds_follow_the_schedule():
    """Rounds 5-7 with every=2: 6 only; the run's final round is checkpointed by the end, not the schedule."""
    assert missed_checkpoint_rounds(5, 7, every=2, latest_is_final=False) == [6]
    assert missed_checkpoint_rounds(5, 8, every=2, latest_is_final=True) == [6]
    assert missed_checkpoint_rounds(5, 8, every=2, latest_is_final=False) == [6, 8]
    assert missed_checkpoint_rounds(5, 8, every=0, latest_is_final=False) == []


# ---------------------------------------------------------------------------------------- the loop
def _reference(config: Config, feed: Feed, steps: int | None = None) -> dict[str, torch.Tensor]:
    """A plain PyTorch loop over the same rows: the same seed, optimizer and mini-batches of B rows
    (``steps``: stop after that many steps, epochs or not)."""
    torch.manual_seed(config.data.seed)
    spec = feed.model_spec()
    model = build_model_for(config.model, num_classes=spec.num_classes, in_channels=spec.in_channels)
    train = config.train
    optimizer = build_optimizer(train.optimizer, model.parameters(), lr=train.lr)
    step = InnerStep(model, optimizer, micro_batch_size=train.micro_batch_size, device="cpu")
    for epoch in itertools.count():
        if steps is None and epoch == train.epochs:
            break
        rows = feed.epoch(epoch)
        for start in range(0, len(rows), train.batch_size):
            if step.steps == steps:
                return model.state_dict()
            step(collate_rows(rows[start : start + train.batch_size]))
    return model.state_dict()


def test_learner_loop_with_one_learner_matches_a_plain_loop(tmp_path):
    """One learner against a real in-process ParameterAverager ends on the plain loop's weights: averaging
    one learner (weights and Adam moments) is the identity, so the loop must neither skip, repeat nor
    reorder a step. Checkpoints are reported at the due rounds and load back."""
    config = _config()
    feed = Feed()
    averager = local_averager(1, timeout_s=30.0, validate_every=1, batch_size=2, adaptive_batch=False)
    transport = InProcess(averager)
    reports: list[tuple[RoundMetrics | LearnerReport, list[str]]] = []

    def report(metrics, folder: Path | None) -> None:
        saved = None
        if folder is not None:
            saved = checkpoint.load(folder)  # the folder is temporary: read it while it exists
        reports.append((metrics, saved))

    store = RecordingStore()
    try:
        learner = Learner(
            Parts.of(config).learner, rank=0, world_size=1, device="cpu", client=_client(transport, store=store), feed=feed,
            report=report,
        )  # fmt: skip
        learner.run()
    finally:
        transport.close()
    # Every round tells the store the bytes it moves: the payload put, and the merged one read back.
    layout = FlatLayout.of(learner.model.state_dict(), learner.optimizer.state_dict()["state"])
    assert store.expected == [2 * layout.nbytes] * 4 and layout.nbytes > 0
    expected = _reference(config, feed)
    got = learner.model.state_dict()
    assert all(torch.allclose(got[k], expected[k], rtol=0, atol=1e-6) for k in expected)
    # The model and Adam lived in the flat buffers from the first round on: bound once, never moved out
    # again by a step or an install (each of the 4 rounds would otherwise have moved them back). The
    # GRU's weights are mirrored instead: they stay in one chunk of their own (cuDNN's layout on CUDA).
    storage = learner.rounds.storage
    mirrored = [s for s in layout.slots if s.owner == "model" and s.key in storage.mirrored]
    assert storage is not None and len(storage.layout.slots) == len(layout.slots)
    assert len(mirrored) == 4 and storage.moved == len(layout.slots) - len(mirrored)
    gru = learner.model.temporal.gru
    assert is_compact(gru)
    spans = [(b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()) for b in storage.buffers.values()]
    assert not any(lo <= w.data_ptr() < hi for w in gru.parameters() for lo, hi in spans)
    # Not vacuous: training moved the weights away from the seeded initialisation.
    torch.manual_seed(config.data.seed)
    start = build_model_for(config.model, num_classes=CLASSES, in_channels=3).state_dict()
    assert any(not torch.allclose(start[k], expected[k]) for k in expected)
    # 8 rows / B=2 = 4 steps an epoch, K=2: rounds 1-2 in epoch 1, 3-4 in epoch 2; every=2 -> 2, final 4.
    rounds = [(m.round, saved is not None) for m, saved in reports]
    assert rounds == [(2, True), (4, True)]
    final = reports[-1][1]
    assert final.state.round == 4 and reports[-1][0].test_accuracy is not None
    assert all(torch.equal(final.state.params[k], got[k]) for k in got)
    assert final.position == {**EpochPosition(2, steps=8).as_dict(), "round": 4}
    assert reports[-1][0].steps_trained == 8 and reports[-1][0].epochs_trained == 2
    # Without an evaluator every round's result asks the learner to score its share (here: all of it).
    assert transport.calls.count("average") == 4 and transport.calls.count("report_validation_share") == 4
    history = averager._history.summary()["validation_history"]
    assert [v["round"] for v in history] == [1, 2, 3, 4] and not any(v.get("missed") for v in history)


def test_steps_end_the_run_mid_epoch_past_epochs_and_the_count_survives_a_restart(tmp_path):
    """train.steps=5 with epochs=1 (4 steps an epoch): the run goes on into epoch 2, ends after its first
    step with a final round (K=2: rounds at steps 2, 4 and the 5th) on the plain loop's 5-step weights,
    and the final checkpoint records 5 steps and 1.25 epochs. A new group started from the round-2
    checkpoint (an averager that holds nothing, seeded from it: a restart or a --resume) counts on from
    its 4 steps and takes exactly 1 more, to the same weights."""
    config = _config(epochs=1, steps=5)
    feed = Feed()

    def train(seed=lambda: None) -> tuple[Learner, list[tuple[dict, object]], list[str]]:
        averager = local_averager(1, timeout_s=30.0, validate_every=1, batch_size=2, adaptive_batch=False)
        transport = InProcess(averager)
        reports: list[tuple[RoundMetrics | LearnerReport, object]] = []

        def report(metrics, folder: Path | None) -> None:
            reports.append((metrics, None if folder is None else checkpoint.load(folder)))

        try:
            learner = Learner(
                Parts.of(config).learner, rank=0, world_size=1, device="cpu", client=_client(transport), feed=feed,
                report=report, checkpoint_seed=seed,
            )  # fmt: skip
            learner.run()
        finally:
            transport.close()
        return learner, reports, transport.calls

    learner, reports, calls = train()
    expected = _reference(config, feed, steps=5)
    got = learner.model.state_dict()
    assert all(torch.allclose(got[k], expected[k], rtol=0, atol=1e-6) for k in expected)
    # Not vacuous: 4 steps (the one epoch asked for) end elsewhere.
    four = _reference(config, feed, steps=4)
    assert any(not torch.allclose(four[k], expected[k], rtol=0, atol=1e-6) for k in expected)
    assert [(m.round, saved is not None) for m, saved in reports] == [(2, True), (3, True)]
    assert calls.count("average") == 3 and learner.step.steps == 5
    final_metrics, final = reports[-1]
    assert final.position == {**EpochPosition(1, (), 1, 2, steps=5).as_dict(), "round": 3}
    assert final_metrics.steps_trained == 5 and final_metrics.epochs_trained == 1.25
    resumed, _, calls = train(seed=lambda: reports[0][1].state)
    assert resumed.steps_done == 5 and resumed.step.steps == 1 and calls.count("average") == 1
    again = resumed.model.state_dict()
    assert all(torch.allclose(again[k], expected[k], rtol=0, atol=1e-6) for k in expected)


def test_dropped_learner_takes_the_others_state_and_makes_the_missed_reports():
    """The first round is refused while the others averaged rounds 1-3 and took 4 rows: the learner
    installs round 3's weights, reports checkpoint round 2 it missed, and trains on from row 4."""
    config = _config(epochs=1)
    feed = Feed()
    template = Learner(
        Parts.of(config).learner,
        rank=0,
        world_size=1,
        device="cpu",
        client=_client(Scripted()),
        feed=feed,
        report=lambda m, f: None,
    )
    others = {k: torch.full_like(v, 0.5) for k, v in template.model.state_dict().items()}
    position = EpochPosition(0, (), 1, 4, steps=2).as_dict()
    theirs = AveragedState(round=3, params=others, batch_size=2, position=position, source="live")
    sent: list[dict] = []

    def average(*args, **kwargs):
        sent.append(kwargs["position"])
        # One learner's mean is its own state: echo its flat payload (slices in process) as the result.
        state = AveragedState(round=args[1], flat=args[3], batch_size=2, position=kwargs["position"])
        return RoundResult(state=state, learners=(0,))

    class Others(Scripted):
        def __call__(self, method, *args, timeout=None, **kwargs):
            if method == "average" and self.replies["average"] == ["live"]:
                self.calls.append((method, args, kwargs))
                return average(*args, **kwargs)
            return super().__call__(method, *args, timeout=timeout, **kwargs)

    transport = Others(
        join=[
            JoinReply(state=AveragedState(batch_size=2), next_round=1, world_size=1),
            JoinReply(state=theirs, next_round=4, world_size=1),
        ],
        average=[StaleRoundError(0, 1, 4, "it was dropped from round 1"), "live"],
        report_validation_share=[True, True],
        checkpoint_contents=[],
    )
    reports: list[RoundMetrics] = []
    learner = Learner(
        Parts.of(config).learner,
        rank=0,
        world_size=1,
        device="cpu",
        client=_client(transport),
        feed=feed,
        report=lambda metrics, folder: reports.append(metrics),
    )
    installed: list[float] = []
    original = learner.rounds.install
    learner.rounds.install = lambda state: (installed.append(state.round), original(state))[1]
    position = learner.start()
    end = learner.train_epoch(position)
    assert end == EpochPosition(0, (), 1, 4, steps=2)  # the others' position: the loop continues from there
    assert learner.steps_done == 2  # and their step count (train.steps counts on from it)
    assert installed[-1] == 3 and all(
        torch.equal(v, others[k]) for k, v in learner.model.state_dict().items()
    )
    assert [r.round for r in reports] == [2]  # rounds 1 and 3 are no checkpoint rounds (every=2)
    final = learner.train_epoch(end)
    assert final == EpochPosition(1, steps=4)
    assert feed.epoch_calls == [(0, 0), (0, 4)]  # the second pass skipped the 4 rows the others took
    # Rows 4-7 (2 steps = K) end the layout in round 4: the learner sends its last row; the averager's
    # settled position (here echoed: the learner closes the layout itself) starts the next epoch.
    assert sent == [EpochPosition(0, (), 1, 8, steps=4).as_dict()]


def test_evaluator_validates_off_the_learner_and_test_shares_sum_to_the_whole_split():
    """With a validator the learner never validates: the averager scores each validation round's averaged
    state itself (here an in-process Evaluator reading the flat state) and reports it, so the validation
    history holds the Evaluator's accuracy of exactly those rounds; the last round's is scored only once
    the test pass is over (it would take CPU from it). The final test pass: each of two learners scores its
    share and the averager's sums equal one model scoring the whole split."""
    from raytrain_seq.dataplane.stores import InProcessStore
    from raytrain_seq.runtime.evaluator import Evaluator
    from raytrain_seq.runtime.validator import ThreadValidator
    from raytrain_seq.training.evaluation import evaluate

    class RecordingEvaluator(Evaluator):
        def validate(self, state):
            tested[state.round] = "report_test" in transport.calls
            scores[state.round] = super().validate(state)
            return scores[state.round]

    config = _config()
    feed = Feed()
    scores: dict[int, float] = {}
    tested: dict[int, bool] = {}  # round -> whether the test pass was over when its scoring began
    evaluator = RecordingEvaluator(Parts.of(config).evaluator, feed=feed, store=InProcessStore())
    # The run's validator: the averager starts it (an unstarted one refuses to score), and it scores on a
    # thread of the averager's process.
    validator = ThreadValidator(
        Parts.of(config).evaluator, feed_name="unused", namespace="unused", build=lambda: evaluator
    )
    averager = local_averager(
        1, timeout_s=30.0, validate_every=2, batch_size=2, adaptive_batch=False, validator=validator,
        epochs=config.train.epochs,
    )  # fmt: skip
    transport = InProcess(averager)
    try:
        learner = Learner(
            Parts.of(config).learner, rank=0, world_size=1, device="cpu", client=_client(transport), feed=feed,
            report=lambda m, f: None, validate=False,
        )  # fmt: skip
        learner.run()
        # The final round's validation may still be scoring on the evaluator thread: settle waits for it.
        summary = transport("summary", settle=True)
    finally:
        transport.close()
    assert "report_validation" not in transport.calls  # nobody on the learner's side validated
    assert evaluator.scored == [2, 4] and sorted(scores) == [2, 4]
    assert tested == {2: False, 4: True}  # round 4 ends the 2 epochs (4 steps each, K=2): after the test
    history = summary.validation_history
    assert [(v["round"], v["accuracy"]) for v in history] == [
        (r, s["accuracy"]) for r, s in sorted(scores.items())
    ]
    assert all(v["top5_accuracy"] == scores[v["round"]]["top5_accuracy"] for v in history)
    # The test pass in two shares against one model scoring every row.
    model = learner.model
    whole = evaluate(model, [collate_rows(_rows(7, 6))], micro_batch_size=4)
    shares = [evaluate(model, [collate_rows(_rows(7, 6)[r::2])], micro_batch_size=4) for r in (0, 1)]
    two = local_averager(2, timeout_s=30.0)

    async def report_both():
        return await asyncio.gather(*(
            two.report_test(r, {"correct": sum(c for c, _ in s.per_class.values()), "sequences": s.sequences,
                                "per_class": {str(k): list(v) for k, v in s.per_class.items()},
                                "top5_correct": s.top5_correct,
                                "confusion": {f"{t},{p}": n for (t, p), n in s.confusion.items()}}, 2)
            for r, s in enumerate(shares)
        ))  # fmt: skip

    first, second = asyncio.run(report_both())
    assert first == second and first.learners == 2
    assert first.sequences == whole.sequences and first.accuracy == whole.accuracy
    assert first.per_class == {str(k): list(v) for k, v in whole.per_class.items()}
    assert first.top5_accuracy == whole.top5_accuracy
    assert first.mean_class_accuracy == pytest.approx(whole.mean_class_accuracy)
    assert first.confusion == {f"{t},{p}": n for (t, p), n in whole.confusion.items()}
    assert 0 < shares[0].sequences < whole.sequences  # not vacuous: each share is a real part


class WideValFeed(Feed):
    """Validation rows enough for three batches of 16 (the evaluator's assembly size)."""

    def eval_rows(self, split, rank=0, world_size=1, *, uncropped=False):
        from raytrain_seq.rows.assembly import BlockRowStream

        return BlockRowStream(Rows(_rows(11, 40)[rank::world_size]))


def test_thread_validator_scores_what_its_evaluator_scores_and_reports_a_failed_build():
    """ThreadValidator: a validation starts it if start() was not called (a restarted averager starts it
    once a validation is near); it scores on its thread exactly what its Evaluator scores; it pickles (the
    driver hands it to the averager, and a restarted averager starts its own); a build that raises is
    raised by every validation and named by error(), which the averager's summary carries for the driver
    to raise."""
    import pickle

    from raytrain_seq.dataplane.stores import InProcessStore
    from raytrain_seq.runtime.evaluator import Evaluator
    from raytrain_seq.runtime.validator import ThreadValidator

    config = _config()
    feed = Feed()
    evaluator = Evaluator(Parts.of(config).evaluator, feed=feed, store=InProcessStore())
    model = build_model_for(config.model, num_classes=CLASSES, in_channels=3)
    state = AveragedState(params=dict(model.state_dict()), round=2, batch_size=2)
    validator = ThreadValidator(
        Parts.of(config).evaluator, feed_name="f", namespace="n", build=lambda: evaluator
    )
    first = asyncio.run(validator(state))  # not started: the call starts it
    validator.start()  # started already: nothing changes
    assert first == asyncio.run(validator(state)) == evaluator.validate(state)
    assert evaluator.scored == [2, 2, 2] and validator.error() is None
    copy = pickle.loads(
        pickle.dumps(ThreadValidator(Parts.of(config).evaluator, feed_name="f", namespace="n"))
    )
    assert (copy.feed_name, copy.namespace, copy.error()) == ("f", "n", None)

    def broken() -> Evaluator:
        raise OSError("the validation videos are gone")

    failing = ThreadValidator(Parts.of(config).evaluator, feed_name="f", namespace="n", build=broken)
    averager = local_averager(1, timeout_s=30.0, validate_every=2, batch_size=2, validator=failing)
    with pytest.raises(OSError, match="videos are gone"):
        asyncio.run(failing(state))
    assert "videos are gone" in failing.error()
    assert "videos are gone" in asyncio.run(averager.summary()).validator_error


def test_evaluator_threads_score_exactly_what_one_thread_scores():
    """Three scoring threads over disjoint parts of the rows give one thread's counts, per class and
    confusion; the model stays in eval mode (concurrent scorers never toggle it)."""
    from raytrain_seq.dataplane.stores import InProcessStore
    from raytrain_seq.runtime.evaluator import Evaluator

    torch.manual_seed(0)
    config = _config()
    evaluators = [
        Evaluator(Parts.of(config).evaluator, feed=WideValFeed(), store=InProcessStore(), threads=n)
        for n in (1, 3)
    ]
    params = {k: v.clone() for k, v in evaluators[0].model.state_dict().items()}
    state = AveragedState(round=1, params=params, batch_size=2, source="live")
    assert [e.prepare() for e in evaluators] == [3, 3]  # not vacuous: three batches to deal out
    one, three = (e.score(state) for e in evaluators)
    assert one.sequences == three.sequences > 40  # every real sequence of the 40 rows
    assert (one.accuracy, one.top5_correct) == (three.accuracy, three.top5_correct)
    assert one.per_class == three.per_class and one.confusion == three.confusion
    assert not evaluators[1].model.training
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        Evaluator(Parts.of(config).evaluator, feed=WideValFeed(), store=InProcessStore(), threads=0)


class TestRowsFeed(Feed):
    """The in-memory feed, recording when (epochs started so far) and on which thread the test share is
    asked for; ``fail``: its test rows cannot be assembled."""

    __test__ = False

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail, self.test_asks = fail, []

    def eval_rows(self, split, rank=0, world_size=1, *, uncropped=False):
        if split == "test":
            self.test_asks.append((len(self.epoch_calls), threading.current_thread().name))
            if self.fail:
                raise RuntimeError("the test rows cannot be assembled")
        return super().eval_rows(split, rank, world_size, uncropped=uncropped)


def _run_one(config: Config, feed: Feed) -> tuple[Learner, list[RoundMetrics | LearnerReport]]:
    """Rank 0 alone; the reports end with the final one (``keep_final``), which ``run`` also returns."""
    averager = local_averager(1, timeout_s=30.0, validate_every=1, batch_size=2, adaptive_batch=False)
    transport = InProcess(averager)
    reports: list[RoundMetrics] = []
    finals: list[tuple[LearnerReport, list[str]]] = []
    try:
        learner = Learner(
            Parts.of(config).learner, rank=0, world_size=1, device="cpu", client=_client(transport), feed=feed,
            report=lambda metrics, folder: reports.append(metrics),
            keep_final=lambda metrics, folder: finals.append((metrics, sorted(p.name for p in folder.iterdir()))),
        )  # fmt: skip
        returned = learner.run()
    finally:
        transport.close()
    # The final checkpoint goes to keep_final alone (no report: nothing waits for it) and holds the files
    # of checkpoint.save; the metrics handed over with it are the run's return value.
    assert len(finals) == 1 and finals[0][1] == sorted(
        [checkpoint.STATE_FILE, checkpoint.POSITION_FILE, checkpoint.VALIDATION_FILE]
    )
    assert returned is finals[0][0] and all(r.round < returned.round for r in reports)
    return learner, [*reports, returned]


def test_test_rows_are_assembled_while_the_last_epochs_train():
    """The test share is asked for once, in the second-last of 3 epochs (TEST_LEAD_EPOCHS = 2), on a thread
    of its own; the final test pass scores exactly those rows (one model scoring them in one go)."""
    from raytrain_seq.runtime.learner import TEST_LEAD_EPOCHS
    from raytrain_seq.training.evaluation import evaluate

    feed = TestRowsFeed()
    learner, reports = _run_one(_config(epochs=3), feed)
    assert TEST_LEAD_EPOCHS == 2 and len(feed.epoch_calls) == 3  # not vacuous: an epoch before the lead
    assert feed.test_asks == [(2, "test-rows")]  # asked once epoch 1's rows were: 2 epochs from the end
    final = reports[-1]
    expected = evaluate(learner.model, [collate_rows(_rows(7, 6))], micro_batch_size=4)
    assert final.test_accuracy == expected.accuracy and final.test_sequences == expected.sequences
    assert expected.sequences > 0  # not vacuous
    timeline = final.timeline
    assert timeline["test_rows"] <= timeline["trained"] <= timeline["test_scored"]


def test_a_failure_to_assemble_the_test_rows_ahead_stops_the_run():
    """What the background assembly raised is raised by the learner's test pass, not lost."""
    with pytest.raises(RuntimeError, match="test rows cannot be assembled"):
        _run_one(_config(), TestRowsFeed(fail=True))


def test_rounds_at_an_epochs_end_are_logged_as_the_epoch_done(caplog):
    """K = -1 averages at each epoch's last row: rank 0's round line says the epoch is done, not "8/0 rows"
    (the round carries the last row's position, 8 of the shard's 8 rows)."""
    with caplog.at_level(logging.INFO, logger="raytrain_seq.runtime.learner"):
        _run_one(_config(k=-1), Feed())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[")]
    assert len(lines) == 2  # not vacuous: one round an epoch
    assert [line.split(", ")[1].split(":")[0] for line in lines] == ["epoch 1/2 done", "epoch 2/2 done"]


class SlowShardFeed(Feed):
    """Its streams start having waited ``waits[epoch]`` seconds for their shard (as a stream opened after
    a group change waits for the feed)."""

    def __init__(self, waits: dict[int, float]) -> None:
        super().__init__()
        self.waits = waits

    def epoch_rows(self, epoch, rank, world_size, *, history=(), skip=0, ahead=True):
        stream, rows = super().epoch_rows(epoch, rank, world_size, history=history, skip=skip, ahead=ahead)
        stream.wait_seconds = self.waits[epoch]
        return stream, rows


def test_the_wait_for_an_epochs_shard_counts_as_data_wait():
    """An epoch's first take counts the wait for its shard: epoch 1's 3 s are data wait; epoch 0's 5 s
    come before the first step (start-up) and count nowhere in the rounds."""
    config = _config()
    averager = local_averager(1, timeout_s=30.0, validate_every=0, batch_size=2, adaptive_batch=False)
    transport = InProcess(averager)
    try:
        learner = Learner(
            Parts.of(config).learner, rank=0, world_size=1, device="cpu", client=_client(transport),
            feed=SlowShardFeed({0: 5.0, 1: 3.0}), report=lambda metrics, folder: None,
        )  # fmt: skip
        report = learner.run()
    finally:
        transport.close()
    assert 3.0 <= report.data_wait_s < 5.0, report.data_wait_s
    assert learner.times["cold_epoch"] < 5.0
