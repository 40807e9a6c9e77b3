"""The AAVG parameter-averaging actor: one averaging round per K local steps of every learner.

Algorithm: AAVG (Cong et al.): Algorithm 1 line 12 (weights become their mean), Algorithm 2 (Adam's
moments merged) and lines 13-21 (every m rounds validation decides whether B grows). ``ParameterAverager``
is a thin asyncio shell over ``rounds/`` and ``dataplane/``: the ``RoundBook`` closes a round when every
expected learner has arrived or ``timeout_s`` after the first arrival, dropping the missing ones with a
logged reason; every learner of a round gets the same ``RoundResult``, and the latest ``AveragedState``
is kept for joins. It is the control plane only: it hands shard i the refs of every learner's slice i
(``runtime.shards``) and hands out the merged slices' refs, or, once a group is linked, reads them from
the channels (``dataplane.generations``). The validations are one ``ValidationMachine`` it feeds and
obeys; ``report_test`` sums the test pass's shares. Restartable: it reloads the run folder's newest
checkpoint and ``events.jsonl``, and the first learner ahead re-seeds it (``join(seed=...)``). Live
groups (``settings.live``, ``rounds.group``): ``lose`` and newcomers change the group at a round's close.
Learners call it through ``rounds.client.AveragerClient`` (docs/ARCHITECTURE.md, "The averaging round").
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytrain_seq import checkpoint
from raytrain_seq.checks import check_number
from raytrain_seq.dataplane.channel_session import ChannelSession
from raytrain_seq.dataplane.generations import ChannelBook, Channelled, Link
from raytrain_seq.dataplane.hub_load import HubLoad
from raytrain_seq.dataplane.placement import ShardPlacement
from raytrain_seq.dataplane.stores import InProcessShards, ShardPool
from raytrain_seq.members.errors import StaleRoundError
from raytrain_seq.members.ids import LearnerId, check_learner, ordered
from raytrain_seq.outputs.reports import AveragingReport, JoinedProcess
from raytrain_seq.outputs.tracking import make_tracker
from raytrain_seq.rounds.arrivals import Arrivals
from raytrain_seq.rounds.batch_rule import BatchRule
from raytrain_seq.rounds.book import RoundBook, RoundClose
from raytrain_seq.rounds.current_round import RoundPhase
from raytrain_seq.rounds.events import EVENTS_FILE, RunHistory
from raytrain_seq.rounds.group import GroupChanges
from raytrain_seq.rounds.held_state import HeldState
from raytrain_seq.rounds.merging import LOST, RoundMerge
from raytrain_seq.rounds.recovery import GroupRecovery
from raytrain_seq.rounds.round_wait import RoundWait
from raytrain_seq.rounds.run_folder import RunFolder
from raytrain_seq.rounds.settings import AveragerSettings
from raytrain_seq.rounds.state import AveragedState, CheckpointHistory, JoinReply, RoundResult
from raytrain_seq.rounds.test_pass import TestPass, TestTotals
from raytrain_seq.rounds.validation import (
    Averaged,
    Joined,
    NewGroup,
    Reported,
    Reseeded,
    ShareArrived,
    ValidationMachine,
    validation_near,
)
from raytrain_seq.rounds.validation_runner import ValidationRunner
from raytrain_seq.runtime.channels import read_round
from raytrain_seq.runtime.probes import LearnerProbes

if TYPE_CHECKING:
    from torch import Tensor

logger = logging.getLogger(__name__)


__all__ = ["ParameterAverager", "create_averager", "get_averager"]


class ParameterAverager:
    """Asyncio averaging server; create_averager makes it a Ray actor (0 CPUs, on the driver's node).

    A thin shell: each call hands its decisions to plain parts (the round book, ``rounds.book``; the
    checks of a round's senders, ``rounds.arrivals``; the batch-size rule, ``rounds.batch_rule``; the
    validations' state machine, ``rounds.validation``, whose actions ``rounds.validation_runner`` runs;
    the test pass, ``rounds.test_pass``; the round's mean and result, ``rounds.merging``; the open
    round's future and timer, ``rounds.round_wait``; a new group's or a re-seed's recovery,
    ``rounds.recovery``; the run folder, ``rounds.run_folder``; the latest round's copy in this process,
    ``rounds.held_state``; the channel generations, ``dataplane.channel_session``; the shards' placement,
    ``dataplane.placement``; the hub load, ``dataplane.hub_load``; the run history, ``rounds.events``) and
    keeps its tasks and the latest state itself.

    settings: ``rounds.settings.AveragerSettings`` (from the config's ``train`` section). run_dir: the run
    folder, whose latest checkpoint is reloaded at construction (a --resume, or a restart by Ray).
    shard_pool: who merges flat payloads (``runtime.shards.RayShards`` in a cluster; in process by
    default). validator: scores validation rounds off the learners' path (None: the learners score
    their shares). actor_id: returns this actor's id, which tells a restart by Ray from a first start
    (None: Ray's).
    """

    def __init__(
        self,
        settings: AveragerSettings,
        *,
        run_dir: str | Path | None = None,
        shard_pool: Callable[[int], ShardPool] | None = None,
        validator: Callable[[AveragedState], Awaitable[Mapping[str, float]]] | None = None,
        actor_id: Callable[[], str | None] | None = None,
    ) -> None:
        if not isinstance(settings, AveragerSettings):
            raise TypeError(f"settings must be an AveragerSettings, not {type(settings).__name__}")
        self.settings = settings
        self._state = AveragedState(batch_size=settings.batch_size)  # round 0: nothing averaged yet
        self._tasks: set[asyncio.Task] = set()
        self._validator = validator
        self._nodes: dict[str, str] = {}  # incarnation -> the node its process joined from
        self._build_data_plane(shard_pool)
        actor = (actor_id or _actor_id)() if run_dir is not None else None
        self._build_rounds(run_dir, actor)
        if run_dir is not None:
            self._state = self._folder.load(
                Path(run_dir), restarted_by_ray=actor is not None, state=self._state
            )
            if self._book.restarted:
                # The shards died with the process before: the new ones start now, while the learners
                # rejoin, not on the first round's path. Their nodes are not known yet (no hints).
                self._pool.prepare()
        # What loads torch starts at once, or after a restart once a round closed near a validation.
        self._loading = self._book.restarted
        if not self._loading:
            _start_loading(self._validator)

    def _build_data_plane(self, shard_pool: Callable[[int], ShardPool] | None) -> None:
        """The parts that move bytes: the shard pool, its placement, the channels and the hub load."""
        settings = self.settings
        # Who merges flat payloads: shard actors in a cluster (runtime.shards.RayShards), else this process.
        self._pool = (shard_pool or InProcessShards)(settings.shard_count)
        self._loads = HubLoad()  # per round: the bytes each averaging actor moved
        self._placement = ShardPlacement(self._pool)  # the learners' nodes: where the shards go
        # Channel generations (dataplane.generations): the bytes of a stable group's rounds go through
        # shared-memory channels, which this actor reads too (its copy of each round, in place). Only a
        # pool of shard actors has channels.
        self._channels = ChannelSession(
            ChannelBook(enabled=settings.channels and self._pool.supports_channels),
            pool=self._pool,
            timeout_s=float(settings.timeout_s),
            self_reader=_self_reader,
            read_round=read_round,
        )

    def _build_rounds(self, run_dir: str | Path | None, actor: str | None) -> None:
        """The parts that decide: the batch rule, the validation machine and the test pass, the history,
        the round book and its arrivals, the merge, the run folder and the group recovery."""
        settings = self.settings
        self._batch = BatchRule(settings)  # what a validation's accuracy makes of B
        # The learners score the validations, each its share, unless an evaluator does (runtime/evaluator.py).
        self._validation = ValidationMachine.from_settings(settings, by_learners=self._validator is None)
        self._test = TestPass(float(settings.timeout_s))  # the final test pass: each learner's share
        # Live tracking (TensorBoard by default) of what the history records, written under the run folder.
        live = make_tracker(settings.tracker, run_dir)  # no torch: outputs.event_file
        events = None if run_dir is None else Path(run_dir) / EVENTS_FILE
        self._history = RunHistory(events, actor=actor, tracker=live)
        book = {"timeout_s": settings.timeout_s, "min_learners": settings.min_learners, "live": settings.live}
        self._book = RoundBook(settings.world_size, **book, sink=self._history.on_member)
        self._changes = GroupChanges()  # live groups: wakes the newcomers when a close takes them in
        # Who may send a round, the rows cap they send, and how long each waited for the others.
        self._arrivals = Arrivals(self._book, shards=self._pool.count, merge_moments=settings.merge_moments)
        # The open round's future, which its senders await, and the timer that closes it at the deadline.
        # The actors the learners joined from: a round that waits for one whose process does not answer
        # (stopped, or its node cut off) closes without it before its deadline (``settings.probe_s``).
        self._probes = LearnerProbes()
        self._wait = RoundWait(
            self._book, self._arrivals, spawn=self._spawn, close=self._close_round,
            probe=self._probes.answers, probe_s=settings.probe_s,
        )  # fmt: skip
        self._merge = RoundMerge(
            settings, pool=self._pool, book=self._book, channels=self._channels, loads=self._loads,
            batch=self._batch, elapsed=self._history.clock.elapsed, latest=lambda: self._state,
            rows_cap=lambda: self._arrivals.rows_cap,
        )  # fmt: skip
        # What a start reloads from the run folder (the events log, the latest checkpoint), and restores.
        self._folder = RunFolder(
            book=self._book, batch=self._batch, validation=self._validation, history=self._history
        )
        self._recovery = GroupRecovery(book=self._book, batch=self._batch, history=self._history)
        # The latest flat state read into this process once (off the learners' path): what a (re)joining
        # group and a checkpoint get, since the merged slices live on the learners' nodes and die with them.
        self._held = HeldState(
            channels=self._channels, pool=self._pool, loads=self._loads, batch=self._batch,
            history=self._history, latest=lambda: self._state,
        )  # fmt: skip
        # What the validation machine decides, done: scores and misses recorded, the evaluator started.
        self._validating = ValidationRunner(
            self._validation, validator=self._validator, batch=self._batch, history=self._history,
            book=self._book, test=self._test, held=self._held, rows_cap=lambda: self._arrivals.rows_cap,
            spawn=self._spawn,
        )  # fmt: skip

    # ----------------------------------------------------------------------------------- the rounds
    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # the loop holds only weak references to tasks
        task.add_done_callback(self._tasks.discard)
        return task

    async def _close_round(self, closed: RoundClose, future: asyncio.Future) -> None:
        try:
            if closed.error is not None:
                raise closed.error
            await self._validating.settle(closed)
            senders = [learner for learner, _ in closed.present]
            probes = self._spawn(self._wait.probe_merging(senders, _forgetting(self._merge, self._pool)))
            try:
                closed, result = await self._merge.result(closed)
            finally:
                probes.cancel()
            if result.group is None:  # a group that changes at this close links no channels
                result = await _plan_channels(self._channels, self._book, result)
            self._history.record_round(
                result.state.round,
                seconds=result.seconds,
                batch_size=result.state.batch_size,
                position=result.state.position,
                stats=[(learner, arrival.stats) for learner, arrival in closed.present],
                processes={
                    p.learner: {"incarnation": p.incarnation, "node": p.node}
                    for p in _processes(self._book, self._nodes)
                },
            )
            self._state = result.state
            if result.state.flat is not None:
                self._held.reading = self._spawn(self._held.read(result.state))
            self._book.finish(ok=True)
            if result.group is not None:
                self._changes.changed()  # the newcomers it took in start from this state
            # A validation round: the evaluator starts on it, or its result asks the learners to score it.
            step = self._validation.on(Averaged(result.state.round, result.state.position))
            if self._validating.act(step, result.state):
                result = dataclasses.replace(result, validate=True)
            if self._loading and validation_near(self.settings.validate_every, result.state.round):
                self._loading = False
                _start_loading(self._validator)
            future.set_result(result)
        except Exception as exc:
            # Handed to every learner of the round (each one's await re-raises it): nobody is left waiting.
            if self._book.current.phase is RoundPhase.CLOSING:
                self._book.finish(ok=False)
            self._history.record_failed_round(closed.round, exc)
            future.set_exception(exc)
        finally:
            if self._wait.future is future:
                self._wait.future = None

    # -------------------------------------------------------------------------------- channels
    async def link(self, generation: int, learner: LearnerId, link: Link) -> list[Any] | None:
        """A member's channels for ``generation`` (``ChannelSession.link``); None: its rounds go through
        the store."""
        return await self._channels.link(generation, learner, link)

    # ------------------------------------------------------------------------------ learner-facing
    async def join(
        self,
        learner: LearnerId,
        world_size: int | None = None,
        incarnation: str | None = None,
        seed: AveragedState | None = None,
        node: str | None = None,
        process: Any = None,
    ) -> JoinReply:
        """Register a learner (again); returns where it starts: the latest averaged state and its position.

        incarnation: one id per learner process; the first join of a new process starts a new group
        (Ray Train restarted or resized it). seed: the learner's last averaged state, adopted when newer
        than the averager's (after an averager restart), so no finished round is lost. node: the
        learner's node id, where shard ``learner`` is placed (a hint). process: the learner's actor
        handle or its ``handle_bytes``, probed while a round waits (``runtime.probes``). Live: a newcomer
        (or a new process of a member) waits for the close that takes it in; the reply carries the group,
        or ``ended`` when training ended before it came.
        """
        check_learner(learner)
        self._recovery.check_seed(seed)
        if node is not None:
            self._placement.place(learner, node, self._book.world_size)
        self._history.clock.start()
        while self._book.current.phase is RoundPhase.CLOSING and self._wait.future is not None:
            await asyncio.wait({self._wait.future})  # the round's outcome is its senders' business
        ended = self._validation.ends_training(self._state.position)
        if ended and world_size is None and self._book.live is not None:  # a newcomer after the last round:
            return JoinReply.after_end(self._state, self._book.world_size)  # no close takes it in
        self._channels.end(f"learner {learner!r} (re)joined")
        generation, live = self._book.generation, self._book.live
        changes = None if live is None else live.changes
        self._book.join(learner, world_size, incarnation)
        self._probes.note(learner, process)
        if incarnation is not None and node is not None:
            self._nodes[incarnation] = node  # a process never moves: kept once its join is accepted
        live = self._book.live  # a new generation starts a new one
        if live is not None and live.waiting(learner, incarnation):
            if live.changes != changes:
                self._changes.changed()  # applied at once: nobody was left to close a round
            await self._changes.admitted(live, learner, incarnation)
        elif self._book.generation != generation:
            self._channels.end("the learner group was restarted")
            self._wait.fail("the learner group was restarted")
            self._recovery.on_new_group(self._state)
            self._validation.on(NewGroup())  # the new group scores its own shares
        if seed is not None:
            self._adopt(learner, seed)
        state = await self._held.held(tensors=False)  # flat: the learner unpacks it, this process no torch
        # A due validation of the state it starts from (a resumed run's): the evaluator starts on it, or
        # the learners are asked to score it.
        validate = self._validating.act(self._validation.on(Joined(state.round, state.position)), state)
        return JoinReply(
            state=state,
            next_round=self._book.next_round_for(learner),
            world_size=self._book.world_size,
            shards=self._pool.count,
            validate=validate,
            group=None if self._book.live is None else self._book.live.group,
            took_part=learner in self._history.learners_of(state.round),
        )

    def _adopt(self, learner: LearnerId, seed: AveragedState) -> None:
        """Take a rejoining learner's last averaged state when it is newer than ours, or its bytes of the
        same round when ours are not yet read from the checkpoint."""
        same = self._recovery.in_hand(learner, seed, self._state)
        if same is not None:
            self._state = same
        elif self._recovery.newer(seed, self._state):
            why = f"learner {learner!r} re-seeded round {seed.round}"
            self._channels.end(why)
            self._wait.fail(why)
            self._state = self._recovery.adopt(learner, seed, held=self._state.round)
            self._validating.act(
                self._validation.on(Reseeded(self._state.round))
            )  # an open validation is gone

    async def average(
        self,
        learner: LearnerId,
        round: int,
        world_size: int,
        params: Mapping[str, Tensor],
        optimizer_state: Mapping | None,
        stats: Mapping[str, float] | None = None,
        weight: float = 1.0,
        position: Mapping | None = None,
        incarnation: str | None = None,
        rows: int | None = None,
    ) -> RoundResult:
        """Send this learner's round n; returns the round's result once it closes (see the module doc).

        weight: the learner's share in the mean (e.g. samples seen); stats: numeric totals for summary();
        position: ``EpochPosition.as_dict()`` after this round's rows; incarnation: as in join(); rows: the
        rows each learner has in its current layout (every learner has as many), the batch-size rule's
        cap and where the layout ends (``rounds.position.settle``).
        """
        self._arrivals.check_sender(learner, rows)
        start = self._arrivals.now()
        try:
            arrival = self._arrivals.admit(
                learner,
                round,
                world_size,
                params,
                optimizer_state,
                stats,
                weight,
                position,
                incarnation,
                rows,
            )
            opening = self._book.current.phase is RoundPhase.IDLE
            complete = self._book.arrive(learner, round, world_size, arrival, incarnation)
            if opening:
                self._wait.open()
            future = self._wait.future
            if complete:
                self._wait.start_close()
            result = await asyncio.shield(future)
            if learner in result.dropped:
                # Its slices could not be read: the round was averaged without it, so it rejoins.
                raise StaleRoundError(learner, round, result.state.round + 1, "its round was not readable")
            return result
        finally:
            self._history.add_averaging_time(learner, *self._arrivals.timed(round, start))

    async def report_validation(
        self,
        round: int,
        accuracy: float,
        learner: LearnerId = "validator",
        epoch: int | None = None,
        *,
        val_size: int | None = None,
        rows_cap: int | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> int:
        """The validation accuracy of the averaged model of `round`; returns the batch size decided.

        val_size: the validation sequences behind it (the noise-aware batch rule needs it); rows_cap: the
        rows one learner has this epoch (B never exceeds it); metrics: top-5 and mean class accuracy.
        """
        step = self._validation.on(Reported(round, accuracy, learner, epoch, val_size, rows_cap, metrics))
        if step.refused is not None:
            raise step.refused  # a round not due: the caller's error
        self._validating.act(step)
        return self._batch.size

    async def report_validation_share(
        self,
        learner: LearnerId,
        round: int,
        tallies: Mapping[str, Any],
        world_size: int,
        *,
        epoch: int | None = None,
        rows_cap: int | None = None,
    ) -> bool:
        """One learner's tallies (``EvalResult.tallies``) of its share of the validation split, scored
        with round ``round``'s averaged model; once ``world_size`` learners' shares are in, their sum is
        reported as the round's validation (``report_validation``). Returns whether the share was taken
        (a share of a validation no longer due, e.g. already missed, is not). Answers at once: the
        learner goes on training, and the round after waits for nothing (``ValidationRunner.settle``)."""
        cap = rows_cap if rows_cap is not None else self._arrivals.rows_cap
        step = self._validation.on(ShareArrived(learner, round, tallies, world_size, epoch, cap))
        self._validating.act(step)
        return step.taken

    async def report_test(
        self, learner: LearnerId, tallies: Mapping[str, Any], world_size: int
    ) -> TestTotals:
        """One learner's test tallies ({"correct", "sequences", "per_class": {label: [correct, total]}})
        of its shard of the test split; returns the sums once ``world_size`` learners reported (waiting at
        most ``timeout_s``; then the sums of those that did, with ``learners`` saying how many)."""
        return await self._test.report(learner, tallies, world_size)

    async def watch(self) -> None:
        """Never answers: a learner keeps this call open, and its failure tells the learner at once that
        this process died (``runtime.transport.RayTransport.away``), where a round of its sent to the
        restarting actor would fail only after Ray's grace for the death."""
        await asyncio.Event().wait()

    async def lose(self, learner: LearnerId, incarnation: str | None = None) -> bool:
        """Live groups: ``learner``'s process is dead (the driver saw its actor fail). The open round
        stops waiting for it and closes if everyone else is in; the group shrinks at that close. Returns
        whether anything changed (an unknown or already replaced incarnation: nothing)."""
        changes = self._book.live.changes if self._book.live is not None else None
        if not self._book.lose(learner, incarnation):
            return False
        self._channels.end(f"learner {learner!r} was lost")
        node = self._nodes.get(incarnation) if incarnation is not None else None
        if node is not None and (replaced := self._pool.node_lost(node)):
            logger.warning("shards %s on learner %r's node %s replaced", replaced, learner, node[:8])
        _forgetting(self._merge, self._pool)(learner, LOST)  # its slices die with it: stop waiting
        if self._book.complete:
            self._wait.start_close()
        if self._book.live.changes != changes:
            self._changes.changed()  # applied at once: nobody was left to close a round
        return True

    # ------------------------------------------------------------------------ checkpoints, summary
    async def latest(self) -> AveragedState:
        """The latest averaged state (round 0, params None before the first round)."""
        return await self._held.held()

    async def checkpoint_contents(self) -> tuple[AveragedState, CheckpointHistory]:
        """A checkpoint of the latest round: the state (flat when a round's: the learner unpacks it), history."""
        history = self._history.checkpoint_part(due=self._validation.due, dropped=self._book.dropped_log)
        return await self._held.held(tensors=False), history

    async def restore(self, found: checkpoint.Checkpoint) -> None:
        """Continue from a loaded checkpoint (``checkpoint.load``), e.g. after a crash."""
        if not isinstance(found, checkpoint.Checkpoint):
            raise TypeError(f"restore takes a checkpoint.Checkpoint, not {type(found).__name__}")
        self._state = self._folder.restore(found)

    async def shard_actors(self) -> list[Any]:
        """The averaging shard actors (created now if not yet); empty when this process merges."""
        return self._pool.handles()

    async def summary(self, *, settle: bool = False) -> AveragingReport:
        """Per-learner totals, histories, drops, membership and recoveries, B and validations: a
        ``reports.AveragingReport``.

        settle: first wait (at most ``timeout_s``) for a validation still being scored. At the run's end
        no next round waits for the final round's accuracy, and the history should hold it."""
        if settle:
            await self._validating.settle_last()
        return AveragingReport(
            **self._history.summary(),
            next_round=self._book.round,
            open_round={"phase": self._book.current.phase.value, "arrived": self._book.current.arrived},
            world_size=self._book.world_size,
            generation=self._book.generation,
            dropped=list(self._book.dropped_log),
            membership=list(self._book.membership_log),
            position=self._state.position,
            shards=self._pool.count,
            channels=self._channels.report(),
            hub_load=self._loads.as_list(),
            test=self._test.totals(),
            validator_error=self._validating.validator_error(),  # the driver raises it: none was scored
            processes=_processes(self._book, self._nodes),
        )


async def _plan_channels(channels: ChannelSession, book: RoundBook, result: RoundResult) -> RoundResult:
    """A round that every member took part in, through the store, plans a channel generation for them
    (``dataplane.generations``): the result tells them to link."""
    flat = result.state.flat is not None and not isinstance(result.state.flat.parts[0], Channelled)
    plan = await channels.plan(result.learners, book.current.expected, result.dropped, flat, book.world_size)
    return result if plan is None else dataclasses.replace(result, channels=plan)


def _start_loading(validator: Any) -> None:
    """Start what loads torch, on its thread: the evaluator. A restarted averager starts it once a round near
    a validation closed (``validation_near``): the build shares the GIL with the rejoins and the rounds."""
    if hasattr(validator, "start"):
        validator.start()  # runtime.validator.ThreadValidator


def _forgetting(merge: RoundMerge, pool: ShardPool) -> Callable[[LearnerId, str], None]:
    """What becomes of a sender that stops answering while its round merges (``RoundWait.probe_merging``):
    the shards stop waiting for its slices, which cannot be read, and it is dropped for ``why``."""

    def forget(learner: LearnerId, why: str) -> None:
        if (lost := merge.lost(learner, why)) is not None:
            pool.forget(*lost)

    return forget


def _processes(book: RoundBook, nodes: Mapping[str, str]) -> tuple[JoinedProcess, ...]:
    """The book's current group of learner processes that joined: id, incarnation and node (``nodes``:
    incarnation -> node), in learner order."""
    joined = [(learner, book.incarnations[learner]) for learner in ordered(book.incarnations)]
    return tuple(
        JoinedProcess(learner=learner, incarnation=incarnation, node=nodes.get(incarnation))
        for learner, incarnation in joined
    )


def _self_reader() -> tuple[Any, str]:
    """This actor as a reader of a shard's channel: (its handle, its node)."""
    import ray
    from ray.experimental.channel.utils import get_self_actor

    return get_self_actor(), ray.get_runtime_context().get_node_id()


def _actor_id() -> str | None:
    """This actor's id (the same across its restarts), or None outside a Ray actor."""
    import ray

    return ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None


# --------------------------------------------------------------------------------------------- ray glue
def create_averager(
    name: str,
    settings: AveragerSettings,
    *,
    namespace: str | None = None,
    max_concurrency: int | None = None,
    max_restarts: int = 0,
    run_dir: str | Path | None = None,
    validator: Callable[[AveragedState], Awaitable[Mapping[str, float]]] | None = None,
):
    """Start the named ParameterAverager actor on the driver's node, with 0 CPUs and 0 GPUs.

    settings were checked when they were built (``AveragerSettings``), in the driver. Each waiting
    average()/join() call holds a concurrency slot, so the default leaves room for several per learner.
    max_restarts: how often Ray restarts the actor after it dies (-1: always). Calls in flight are not
    retried by Ray (max_task_retries=0): the learners retry, since a round must be resent after a rejoin.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raytrain_seq.runtime.shards import RayShards, ShardNames

    if not isinstance(settings, AveragerSettings):
        raise TypeError(f"settings must be an AveragerSettings, not {type(settings).__name__}")
    if not ray.is_initialized():
        raise RuntimeError("ray is not initialised: call ray.init() (or run inside a Ray job) first")
    driver_node = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    concurrency = max_concurrency or max(64, 4 * settings.world_size + 16)
    options = {"name": name, "namespace": namespace, "get_if_exists": False, "num_cpus": 0, "num_gpus": 0}
    options.update(scheduling_strategy=driver_node, max_concurrency=concurrency)
    options.update(max_restarts=check_number("max_restarts", max_restarts, -1), max_task_retries=0)
    # The data plane: shard actors, created by the averager when needed and found again by its restart.
    shard_pool = functools.partial(RayShards, names=ShardNames.of(name, namespace))
    wiring = {"run_dir": None if run_dir is None else str(run_dir), "validator": validator}
    return (
        ray.remote(num_cpus=0)(ParameterAverager)
        .options(**options)
        .remote(settings, shard_pool=shard_pool, **wiring)
    )


def get_averager(name: str, *, namespace: str | None = None):
    """The handle of a running averager started by create_averager."""
    import ray

    return ray.get_actor(name, namespace=namespace)
