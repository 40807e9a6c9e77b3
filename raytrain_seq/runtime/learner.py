"""An AAVG learner: a plain PyTorch loop around the Ray-free pieces (its process: ``runtime.fleet``).

Per epoch the learner takes its shard of the plan (``LearnerFeed``: equal rows for every learner), steps
on mini-batches of B rows (``step.InnerStep``: micro-batch streaming, its own Adam) and lets
``rounds.sync.LocalRounds`` average every K steps (K = -1: once an epoch) through the ``AveragerClient``;
a round the averager, away, cannot take is deferred: the learner trains on to the layout's end, whose
round waits (the learners meet there) unless training goes on past it: then it is held back and the
learner trains the next layout on (``_end_layout``); one it closed but never answered keeps the steps
since (``rounds.lost_answer``). Every m rounds the averaged model is validated, by the averager's
evaluator or by the learners' shares (``RoundResult.validate``); a later result carries B for everyone,
so all take the same steps and meet at the same rounds. A learner begins from the averager's latest
state and position (else the newest checkpoint); a layout's end settles on the next epoch or a make-up
layout (``rounds.position.settle``), so every row reaches one averaged round; a ``Realigned`` learner
takes the others' state. Checkpoint rounds: ``runtime.checkpoint_rounds``. Fakes come in the constructor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from raytrain_seq import checkpoint
from raytrain_seq.algorithms.augment import test_views
from raytrain_seq.models.factory import build_model_for
from raytrain_seq.outputs import accounting
from raytrain_seq.outputs.reports import LearnerReport
from raytrain_seq.parts import LearnerSettings
from raytrain_seq.rounds.client import Averaged, AveragerClient, Deferred, Realigned
from raytrain_seq.rounds.events import describe_position, describe_progress
from raytrain_seq.rounds.group import place
from raytrain_seq.rounds.lost_answer import LostAnswer
from raytrain_seq.rounds.position import EpochPosition, epochs_trained
from raytrain_seq.rounds.state import AveragedState
from raytrain_seq.rounds.sync import HELD_RETRY_S, Held, HeldRound, LocalRounds, Stats, Tally, TrainedIds
from raytrain_seq.runtime.checkpoint_rounds import CheckpointRounds, Report
from raytrain_seq.training.eval_rows import EvalRows
from raytrain_seq.training.evaluation import eval_micro_batch_size, evaluate
from raytrain_seq.training.staging import MicroBatchStage, RowPrefetcher, Staged
from raytrain_seq.training.step import InnerStep, LearningRate, build_optimizer

logger = logging.getLogger(__name__)

# The test rows' assembly starts this many epochs before training ends. With one, a busy node (the 2-core
# box: the split's augmentation tasks and the copy into rows share the learners' cores) finished it after
# the last step, with the learners idle meanwhile (docs/ARCHITECTURE.md, "Measurements behind the code").
TEST_LEAD_EPOCHS = 2

__all__ = ["Learner"]


class _NoMetrics:
    def set(self, name: str, value: float) -> None:
        pass

    def add(self, name: str, amount: float) -> None:
        pass


class Learner:
    """One AAVG learner: ``run()`` trains every epoch, then scores its share of the test split."""

    def __init__(
        self,
        settings: LearnerSettings,
        *,
        rank: int,
        world_size: int,
        device: torch.device | str,
        client: AveragerClient,
        feed: Any,
        report: Report,
        keep_final: Report | None = None,
        checkpoint_seed: Callable[[], AveragedState | None] = lambda: None,
        metrics: Any = None,
        validate: bool = True,
    ) -> None:
        self.settings, self.rank, self.world_size, self.device = settings, rank, world_size, device
        self.client, self.feed, self.report = client, feed, report
        self.keep_final = keep_final or report  # rank 0's final checkpoint and metrics (``finish``)
        self.checkpoint_seed = checkpoint_seed
        # True: the learners score validation shares (no evaluator), so this one assembles its share of
        # the validation rows ahead; the averager asks for each validation (``RoundResult.validate``).
        self.validates = validate and bool(settings.validate_every)
        self.metrics = metrics or _NoMetrics()
        step = settings.step
        # Algorithm 1 line 1: one initial w~ for every learner, so every learner seeds the same way.
        torch.manual_seed(settings.seed)
        spec = self.model_spec = feed.model_spec()
        self.checkpoints = CheckpointRounds(
            client, report, every=settings.checkpoint_every, config=settings.config_record(), model_spec=spec
        )
        self.in_channels = spec.in_channels  # 2: optical flow, whose flip negates x
        self.model = build_model_for(
            settings.model, num_classes=spec.num_classes, in_channels=spec.in_channels
        ).to(device)
        self.optimizer = build_optimizer(
            step.optimizer, self.model.parameters(), lr=step.lr, weight_decay=step.weight_decay
        )
        schedule = None
        if step.lr_schedule != "constant" or step.warmup_steps:
            schedule = LearningRate(step.lr, step.lr_schedule, step.warmup_steps)
        self.step = InnerStep(
            self.model,
            self.optimizer,
            micro_batch_size=step.micro_batch_size,
            device=device,
            precision=step.precision,
            lr=schedule,
            # The mini-batch stays in (pinned) host memory; each micro-batch is copied to the device and
            # cropped there while the previous one computes (micro-batch streaming, input included).
            stage=MicroBatchStage(device, crop=settings.crop, flow=self.in_channels == 2),
        )
        self.rounds = LocalRounds(
            client, self.model, self.optimizer, k=settings.k, merge_moments=settings.merge_moments,
            merge_bn_stats=settings.merge_bn_stats, device=device,
        )  # fmt: skip
        # The next mini-batch is collated (on CUDA into pinned memory, in a thread) while this one trains.
        self.prefetcher = RowPrefetcher(device)
        self.tally = Tally()
        self.started = time.perf_counter()
        # The job's time outside compute, averaging and warm data waits (summary seconds), this process.
        self.times = {"cold_epoch": 0.0, "validation": 0.0, "test": 0.0}
        self.first_step_wall: float | None = None  # time.time() of the first step: the end of start-up
        self._wait_counted = 0.0  # set per epoch (train_epoch)
        # time.time() of this process's start-up, test and final steps (summary extra["timeline"]).
        self.marks: dict[str, float] = {}
        # The test split's rows stay uncropped when its views are cut by evaluate.
        multi = settings.test_views != "center"
        self.eval_rows = EvalRows(feed, uncropped=lambda split: multi and split == "test", marks=self.marks)
        self.shard_rows = 0
        # Optimizer steps each learner took over the run (the averaged position's count, then this
        # process's steps): the same on every learner, since they take equal rows with the same B.
        self.steps_done = 0
        self._trained_ids: TrainedIds = {}  # per epoch, the video ids trained since the last round
        self._crossing: HeldRound | None = None  # a layout's last round held back while the averager is away
        self._cross_again_at = 0.0  # time.monotonic() before which no held round is tried again
        self.lost = LostAnswer(self.rounds)  # a round whose answer died with the averager

    # ------------------------------------------------------------------------------------- training
    def run(self) -> LearnerReport | None:
        """Train, test, keep the final checkpoint; rank 0 returns the final metrics (``finish``)."""
        position = self.start()
        if position is None:  # a newcomer that came after the last round: nothing to do
            self.prefetcher.close()
            return None
        while not self.finished(position):
            position = self.train_epoch(position)
        close = getattr(self.feed, "close", None)
        if close is not None:
            close()  # a --steps run may end mid-epoch with the row stream still producing
        self.prefetcher.close()
        return self.finish(position)

    def finished(self, position: EpochPosition) -> bool:
        """Whether training ends at ``position`` (``train.steps`` steps, else ``train.epochs`` epochs)."""
        return position.ends_training(epochs=self.settings.epochs, steps=self.settings.steps)

    def start(self) -> EpochPosition | None:
        """Join the averager and take its latest state; returns where this group starts (None: a
        newcomer whose join came after training ended)."""
        self.marks["learner_built"] = time.time()
        launched = self.rank is not None  # a newcomer (None) learns its rank from the group it joins
        if self.validates and launched:
            self.eval_rows.ahead("val", self._where(True))  # this learner's validation rows, while it joins
        reply = self.client.start(self.checkpoint_seed)
        if reply.ended:
            logger.warning("learner %s joined after training ended: it leaves", self.client.learner)
            return None
        if reply.group is not None:  # live groups: a newcomer's rank and world size are its group's
            self.rank, self.world_size = place(reply.group, self.client.learner)
        if self.validates and not launched:
            self.eval_rows.ahead("val", self._where(True))
        self.marks["joined"] = time.time()
        self.rounds.install(reply.state)
        self.started = time.perf_counter() - reply.state.elapsed_s  # the run's clock, not this process's
        position = EpochPosition.of_state(reply.state.position).for_group(self.world_size)
        self.steps_done = position.steps  # a restarted group or a resumed run counts on from here
        if reply.validate:  # a resumed run whose last round's validation is due: its share first
            self._validate_share(reply.state.round, position)
        if not reply.state.empty:
            logger.info(
                "learner %d of %d starts from round %d (%s state): epoch %d, layouts %s",
                self.rank, self.world_size, reply.state.round, reply.state.source, position.epoch + 1,
                [*position.history, (position.world_size, position.rows_done)],
            )  # fmt: skip
        return position

    def train_epoch(self, position: EpochPosition) -> EpochPosition:
        """Train the rest of ``position``'s epoch; returns where the next one starts (or, after a
        realignment, where the others are)."""
        position = position.for_group(self.world_size)  # an epoch's start: this group's layout
        # A learner that went on past a held round reads no epoch ahead: the feed would drop the epoch
        # before, where the round may still send it or another learner back (``RowStream.epoch_rows``).
        stream, shard_rows = self.feed.epoch_rows(
            position.epoch, self.rank, self.world_size, history=position.history, skip=position.rows_done,
            ahead=self._crossing is None,
        )  # fmt: skip
        self.shard_rows = shard_rows  # the rows a learner has in this layout: B never grows past them
        self._wait_counted = 0.0  # of this epoch's stream.wait_seconds, the part counted as a wait
        rows_done = position.rows_done
        limit = self.settings.steps
        cold = position.epoch == 0  # the feed computes every partial augmentation while epoch 0 waits
        ahead = self._stage(stream, self.client.batch_size, cold)
        while ahead is not None:
            batch, staged_s = self._fill(stream, ahead, cold)  # B may have grown at the last round
            # One mini-batch ahead: its staging (on CUDA a thread and a side stream) overlaps this step.
            ahead = self._stage(stream, self.client.batch_size, cold)
            if self.first_step_wall is None:
                self.first_step_wall = self.marks["first_step"] = time.time()
            # The run's progress drives a cosine rate: every learner is at the same place, so the same rate.
            if limit is not None:
                progress = self.steps_done / limit
            else:
                progress = (position.epoch + rows_done / max(shard_rows, 1)) / self.settings.epochs
            if "ids" in batch:
                self._trained_ids.setdefault(position.epoch, []).extend(batch.pop("ids").flatten().tolist())
            stats = self.step(batch, progress=progress)  # steps even on fillers: Adam steps stay in lockstep
            self.steps_done += 1
            if not self.eval_rows.pending("test") and self._near_end(position.epoch, shard_rows):
                self.eval_rows.ahead("test", self._where(True))
            rows_done += int(batch["num_sequences"].shape[0])
            # The crop and flip moved onto the learner: they are compute, as in the model's rate.
            self.tally.add_step(stats.frames, stats.sequences, stats.seconds + staged_s, stats.loss)
            self.metrics.set("loss", stats.loss)
            self.metrics.set("frames_per_second", stats.frames / max(stats.seconds, 1e-9))
            self.metrics.add("frames", stats.frames)
            if self._crossing is not None and time.monotonic() >= self._cross_again_at and self.client.up():
                moved = self._end_crossing(defer=True)  # the averager is back: the held round goes out
                if isinstance(moved, EpochPosition):
                    return moved  # the layout did not close as this learner guessed: its steps are dropped
            last = limit is not None and self.steps_done >= limit
            if self.rounds.step() or last:
                # The N-th step ends the run with a round wherever it falls, so it ends averaged.
                at = position.after(rows_done).with_steps(self.steps_done)
                moved = self.average(at, defer=not last)
                if moved is not None:
                    return moved  # the layout ended (next epoch, or a make-up layout), or a realignment
                if last:
                    return at
        if stream is not None:
            self.metrics.add("data_wait_seconds", stream.wait_seconds)
        if self.rounds.pending:
            # K=-1 averages once per epoch; with K>0 the epoch's last few steps still get a round, so
            # every epoch ends on an averaged model (the same for every learner: equal rows and B).
            moved = self._end_layout(position.after(rows_done).with_steps(self.steps_done))
            if moved is not None:
                return moved
        # Nothing left to average here (an empty make-up layout, or a shard already done): the epoch ends.
        return EpochPosition(position.epoch + 1).with_steps(self.steps_done)

    # ------------------------------------------------------------------------------------ data loop
    def _stage(self, stream: Any, size: int, cold: bool) -> tuple[Staged, Any, float] | None:
        """The next ``size`` rows on their way to host memory (``RowPrefetcher``: pinned on CUDA; the step
        streams them to the device and crops them there), their video ids, and the seconds staging took
        here; None at the end of the shard. Time blocked on the stream is data wait (epoch 0:
        ``cold_epoch``)."""
        if stream is None:
            return None
        rows = stream.take(size)
        # Blocked since the last count: an epoch's first take also counts the wait for its shard (long
        # after a group change, whose new stream reads the shard afresh).
        blocked, self._wait_counted = stream.wait_seconds - self._wait_counted, stream.wait_seconds
        if self.first_step_wall is None:
            blocked = 0.0  # before the first step the wait belongs to start-up: counted once, there
        if cold:
            self.times["cold_epoch"] += blocked
        else:
            self.tally.data_wait_s += blocked
        if rows is None:
            return None
        began = time.perf_counter()
        ids = rows.pop("ids", None)  # accounting only: kept on the host, never sent to the device
        return self.prefetcher.submit(rows), ids, time.perf_counter() - began

    def _ready(self, staged: tuple[Staged, Any, float]) -> tuple[dict[str, torch.Tensor], float]:
        """A staged mini-batch, once collated, and the seconds staging cost this thread."""
        pending, ids, seconds = staged
        began = time.perf_counter()
        batch = self.prefetcher.wait(pending)
        if ids is not None:
            batch["ids"] = torch.from_numpy(ids)
        return batch, seconds + time.perf_counter() - began

    def _fill(
        self, stream: Any, staged: tuple[Staged, Any, float], cold: bool
    ) -> tuple[dict[str, torch.Tensor], float]:
        """``staged`` collated, topped up to the current B (it was staged before a round that may have
        grown B)."""
        batch, seconds = self._ready(staged)
        missing = self.client.batch_size - int(batch["num_sequences"].shape[0])
        if missing > 0:
            more = self._stage(stream, missing, cold)
            if more is not None:
                extra, extra_s = self._ready(more)
                batch = {key: torch.cat([batch[key], extra[key]]) for key in batch}
                seconds += extra_s
        return batch, seconds

    def average(self, position: EpochPosition, *, defer: bool = False) -> EpochPosition | None:
        """One averaging round; ``position`` is where training stands once it is averaged (at a layout's
        end: its last row). Returns the position to continue from when it is not ``position``'s place (the
        layout ended: the next epoch or a make-up layout of rows a dropped learner missed; the others went
        on without this learner, or were further on; or a live group moved its rank: its shard is
        re-read), else None. ``defer``: an averager that is away defers the round (None: train on)."""
        if self._crossing is not None:  # the held round goes first
            moved = self._end_crossing(defer=defer)
            if moved is not None:
                return None if isinstance(moved, Deferred) else moved
        now = self.lost.now(defer)
        delta = self.tally.flush()
        # The epochs of the rows since the last round: one, as an epoch ends on a round (position.epoch - 1
        # when the position is the next epoch's start), or two after a crossing kept its steps.
        ids, self._trained_ids = self._trained_ids, {}
        decision, stats = self._sync(position, delta, ids, self.shard_rows, defer=defer)
        if isinstance(decision, Deferred):
            if not decision.answer_lost:  # else they went with it, kept as ``self.lost``
                self._carry(delta, ids)
            return None
        if self._kept(decision, now, position, since=(delta, ids)):
            return self.average(position, defer=defer)  # the steps since, as the next round
        return self._apply(decision, position, self.shard_rows, stats["loss"])

    def _carry(self, delta: Stats, ids: TrainedIds) -> None:
        """Take back a round's work and rows that no round holds: the next one sends them."""
        self.tally.carry(delta)
        for epoch, trained in ids.items():
            self._trained_ids.setdefault(epoch, [])[:0] = trained

    def _kept(
        self, decision: Any, now: Held | None, position: EpochPosition, since: tuple | None = None
    ) -> bool:
        """Whether the steps since the lost round (``self.lost``) stay: ``decision`` found it averaged with
        this learner in it, and in this layout and group. The live state is then its mean plus the steps
        since (``now``: the state before the round); ``since``: their work and rows, taken back for the
        next round. Else they are dropped, as for any realignment."""
        lost = self.lost.closed_with(decision)
        if lost is None or now is None:
            return False
        reply = decision.reply
        group = self.world_size if reply.group is None else len(reply.group)
        moved = reply.group is not None and place(reply.group, self.client.learner) != (self.rank, group)
        closed_at = EpochPosition.of_state(reply.state.position).for_group(group)
        if moved or closed_at.layout != position.for_group(group).layout:
            return False
        self.checkpoints.catch_up(decision, finished=self.finished)
        self.lost.rebase(now, lost)
        if since is not None:
            self.rounds.local_steps = int(since[0]["steps"])
            self._carry(*since)
        logger.warning(
            "learner %s: round %d closed with it before the averager died: its steps since are kept",
            self.client.learner, lost.round,
        )  # fmt: skip
        return True

    def _sync(
        self, position: EpochPosition, delta: Stats, ids: TrainedIds, rows: int, *, defer: bool
    ) -> tuple[Averaged | Realigned | Deferred, Stats]:
        """Send the round of ``delta``'s work and ``ids``' rows (``rows``: a learner's in its layout), after
        those of a round whose answer was lost (``self.lost``); returns the decision and the stats sent."""
        delta, ids = self.lost.merged(delta, ids)
        stats = dict(delta)
        for epoch, trained in (ids or {position.epoch - (position.rows_done == 0): []}).items():
            stats.update(accounting.round_stats(epoch, trained))
        decision = self.rounds.sync(stats=stats, position=position, rows=rows or None, defer=defer)
        self.metrics.add("averaging_seconds", self.rounds.last_seconds)
        self.lost.sent(decision, delta, ids)
        return decision, stats

    def _apply(
        self, decision: Averaged | Realigned, position: EpochPosition, rows: int, loss: float
    ) -> EpochPosition | None:
        """Act on a round's outcome: ``average``'s return, ``position`` and ``rows`` the round's."""
        self.metrics.set("batch_size", self.client.batch_size)
        before = (self.rank, self.world_size)
        group = decision.reply.group if isinstance(decision, Realigned) else decision.result.group
        if group is not None:  # live groups: the group changed at this close; the shard is re-read
            self.rank, self.world_size = place(group, self.client.learner)
        if isinstance(decision, Realigned):
            state = decision.reply.state
            self.checkpoints.catch_up(decision, finished=self.finished)
            realigned = EpochPosition.of_state(state.position).for_group(self.world_size)
            self.steps_done = realigned.steps  # the others' count: equal rows and B kept them together
            return realigned
        result = decision.result
        after = position.averaged(result.state.position, rows)
        # A learner that sent its round before the others' deferred ones goes on from their count: the
        # averaged position is theirs, its own rows since recorded as missed (ParameterAverager).
        self.steps_done = max(self.steps_done, after.steps)
        if self.rank == 0:
            logger.info(
                "[%5.0fs] round %d, %s: loss %.4f, B=%d, averaging %.2fs%s",
                time.perf_counter() - self.started, result.state.round,
                describe_progress(position, rows, self.settings.epochs), loss,
                self.client.batch_size, self.rounds.last_seconds,
                f", dropped {list(result.dropped)}" if result.dropped else "",
            )  # fmt: skip
        round_ = result.state.round
        if result.validate:
            self._validate_share(round_, position)
        final = self.finished(after)
        if checkpoint.is_due(round_, every=self.settings.checkpoint_every, final=final):
            self.checkpoints.reached(after, rank=self.rank, final=final)
        return None if after.same_place(position) and before == (self.rank, self.world_size) else after

    # ------------------------------------------------------------------------- a layout's end, crossed
    def _end_layout(self, at: EpochPosition) -> EpochPosition | None:
        """A layout's last round. The learners meet there (none may be a layout ahead of another: the
        averager records where a learner stopped short of the others only inside a layout), so it waits
        for an averager that is away, unless training goes on past it: then the round is held back
        (``HeldRound``) and the learner trains on into the layout this one closes on as far as it knows
        (``close_layout``: the next epoch, or a make-up of the rows it knows missed); once the averager is
        back the held round goes out, and the steps since are kept on top of its mean, or dropped when
        the layout closed elsewhere."""
        closes_on = at.close_layout()
        if self._crossing is not None or self.finished(closes_on):
            return self.average(at)
        now = self.lost.now(True)
        delta = self.tally.flush()
        ids, self._trained_ids = self._trained_ids, {}
        decision, stats = self._sync(at, delta, ids, self.shard_rows, defer=True)
        if self._kept(decision, now, at, since=(delta, ids)):
            return self._end_layout(at)  # the steps since, as this layout's last round
        if not isinstance(decision, Deferred):
            return self._apply(decision, at, self.shard_rows, stats["loss"])
        self._crossing = self.lost.into_held(
            HeldRound(at, self.shard_rows, self.rounds.hold(), delta, ids), decision
        )
        into = describe_position(closes_on.as_dict()) + (", a make-up layout" if closes_on.history else "")
        logger.warning(
            "learner %s: the averager is away at the end of a layout of epoch %d: training on into the %s, "
            "the layout's round held back", self.client.learner, at.epoch + 1, into,
        )  # fmt: skip
        return closes_on

    def _end_crossing(self, *, defer: bool) -> EpochPosition | Deferred | None:
        """Send the held round (``_end_layout``) from its held state. Returns ``Deferred`` (still away:
        training goes on), None (the layout closed on the one this learner went on into: the steps since
        stay, on top of the round's mean) or the position to go on from (they are dropped)."""
        crossing = self._crossing
        if defer and (early := self.client.defers()) is not None:
            return early
        now, local = self.rounds.hold(), self.rounds.local_steps
        self.rounds.restore(crossing.held)
        decision, stats = self._sync(crossing.at, crossing.delta, crossing.ids, crossing.rows, defer=defer)
        if isinstance(decision, Deferred):
            self._crossing = self.lost.into_held(crossing, decision)
            self.rounds.restore(now)
            self._cross_again_at = time.monotonic() + HELD_RETRY_S
            return decision
        if self._kept(decision, crossing.held, crossing.at):
            # An earlier round closed with this learner, its answer lost: the held state and the live one
            # go on top of its mean (the live now the held one plus the steps since), and the held round
            # goes out again, the next round.
            rebased = self.rounds.hold()
            self.rounds.keep_steps(now, crossing.held)
            self._crossing, self.rounds.local_steps = replace(crossing, held=rebased), local
            return self._end_crossing(defer=defer)
        self._crossing = None
        before, steps = (self.rank, self.world_size), self.steps_done
        # Where the round left training (None: where it was sent, the layout not closed).
        after = self._apply(decision, crossing.at, crossing.rows, stats["loss"]) or crossing.at
        guessed = crossing.at.close_layout()
        # Realigned to the held round itself: the averager closed it, then died before its reply came
        # (another learner re-seeded it); its mean holds what this learner sent, as an answer would.
        own = isinstance(decision, Realigned) and decision.reply.state.round == decision.first_missed
        own = own and decision.reply.took_part  # not a round that closed without it
        group = self.world_size  # a realigned position is the group's already (``_apply``)
        closed_there = after.for_group(group).layout == guessed.for_group(group).layout
        if (isinstance(decision, Averaged) or own) and closed_there and before == (self.rank, group):
            self.rounds.keep_steps(now, crossing.held)
            self.rounds.local_steps, self.steps_done = local, max(steps, self.steps_done)
            return None
        if isinstance(decision, Averaged):
            self.steps_done = after.steps
        logger.warning(
            "learner %s: the held round closed on %s, not on %s: the steps since are dropped",
            self.client.learner, describe_position(after.as_dict()), describe_position(guessed.as_dict()),
        )  # fmt: skip
        self.tally.drop()
        self._trained_ids = {}
        self.rounds.local_steps = 0
        return after

    # ----------------------------------------------------------------------------------- evaluation
    def _near_end(self, epoch: int, shard_rows: int) -> bool:
        """Whether training is within ``TEST_LEAD_EPOCHS`` epochs of its end (``train.steps``: within as
        many epochs' steps), where the test rows' assembly starts."""
        limit = self.settings.steps
        if limit is None:
            return epoch >= self.settings.epochs - TEST_LEAD_EPOCHS
        return (limit - self.steps_done) * self.client.batch_size <= TEST_LEAD_EPOCHS * shard_rows

    def _where(self, shard: bool) -> tuple[int, int]:
        """(rank, world size) of this learner's share of a split (``shard``), or (0, 1): all of it."""
        return (self.rank, self.world_size) if shard else (0, 1)

    def _validate_share(self, round_: int, position: EpochPosition) -> None:
        """Score this learner's share of the validation split with round ``round_``'s averaged model (the
        model it holds now) and send the tallies; the averager sums the group's shares into the round's
        validation, which decides B (``ParameterAverager.report_validation_share``)."""
        began = time.perf_counter()
        result = self.evaluate("val", shard=True)
        self.metrics.set("val_accuracy", result.accuracy)
        self.client.report_validation_share(
            round_, result.tallies(), epoch=position.epoch, rows_cap=self.shard_rows or None
        )
        self.times["validation"] += time.perf_counter() - began

    def evaluate(self, split: str, *, shard: bool = False):
        """Accuracy of the current (averaged) model on the val or test split, rows cached in memory;
        ``shard``: only this learner's share of it (``feed.eval_shard(split, rank, world_size)``)."""
        # The test split can be scored on several views (data.test_views): rows uncropped, views cut here.
        settings, views = self.settings, None
        if split == "test":
            views = test_views(settings.test_views, settings.cache_size, settings.crop)
        multi = views is not None and settings.test_views != "center"
        return evaluate(
            self.model,
            self.eval_rows.rows(split, self._where(shard)),
            views=views if multi else None,
            crop=settings.crop,
            flow=self.in_channels == 2,
            micro_batch_size=eval_micro_batch_size(self.settings.step.micro_batch_size, self.device),
            device=self.device,
            precision=self.settings.step.precision,
        )

    # ------------------------------------------------------------------------------- reports, finish
    def finish(self, position: EpochPosition | None = None) -> LearnerReport | None:
        """Every rank scores its share of the test split and the averager sums the tallies; rank 0 hands
        the final checkpoint and the summed test results to ``keep_final`` and returns those metrics (its
        process's ``run`` returns them to the driver: ``runtime.fleet``); the other ranks return None.

        Every learner holds the same final averaged model, so the shares add up to the whole split scored
        by that one model. ``position``: where training ended (the final checkpoint's position; by
        default the end of ``train.epochs``).
        """
        if position is None:
            position = EpochPosition(self.settings.epochs).with_steps(self.steps_done)
        self.marks["trained"] = time.time()
        totals = dict(self.tally.totals)
        extra: dict[str, Any] = {
            "learner_seconds": time.perf_counter() - self.started,
            "averaging_s": self.rounds.averaging_s,
            "compute_s": totals.get("compute_s", 0.0),
            "data_wait_s": totals.get("data_wait_s", 0.0),
            "first_step_wall": self.first_step_wall,
            "timeline": self.marks,
            # What was trained: N steps (train.steps) may end inside an epoch, so epochs is fractional.
            "steps_trained": position.steps,
            "epochs_trained": epochs_trained(position, self.shard_rows),
            **{f"{name}_s": seconds for name, seconds in self.times.items()},
        }
        began = time.perf_counter()
        self.marks["test_start"] = time.time()
        mine = self.evaluate("test", shard=True)
        self.eval_rows.free("test")  # scored once
        self.marks["test_scored"] = time.time()
        totals = self.client.report_test(mine.tallies())
        extra.update(test_sequences_mine=mine.sequences, test_s=time.perf_counter() - began)
        if self.rank == 0:
            extra.update(
                test_accuracy=totals.accuracy,
                test_sequences=totals.sequences,
                test_learners=totals.learners,
                per_class=totals.per_class,
                top5_accuracy=totals.top5_accuracy,
                mean_class_accuracy=totals.mean_class_accuracy,
                confusion=totals.confusion,
            )
            logger.info(
                "test accuracy %.4f (top-5 %.4f, mean class %.4f) over %d sequences (%d learners' shares)",
                totals.accuracy, totals.top5_accuracy, totals.mean_class_accuracy,
                totals.sequences, totals.learners,
            )  # fmt: skip
        extra["final_report_wall"] = time.time()  # from here on: the final checkpoint and the summary
        self.marks["final_report"] = extra["final_report_wall"]
        if self.rank != 0:
            return None  # no barrier at the end: nothing waits for this learner
        metrics = LearnerReport(
            **self.checkpoints.metrics(position).to_dict(), **extra
        )  # every field, checked
        with self.checkpoints.folder(position, metrics.round) as folder:
            self.keep_final(metrics, folder)
        return metrics
