"""The AAVG parameter-averaging actor: one averaging round per K local steps of every learner.

Algorithm: AAVG (Cong et al., "Accelerating deep neural network training for action recognition on a
cluster of GPUs"): Algorithm 1 line 12 (the learners' weights become their mean, ``average_states``),
Algorithm 2 (Adam's moments are merged, ``merge_adam_states``) and lines 13-21 (every m rounds the
validation accuracy decides whether the batch size grows, ``AdaptiveBatchSize``). Around that arithmetic
this module adds what a cluster needs: every learner sends round n with the world size it believes in; the
round closes when every expected learner has arrived, or ``timeout_s`` after the FIRST arrival, when the
missing ones are dropped with a logged reason and the round finishes with those present
(``AveragingTimeoutError`` to them if fewer than ``min_learners`` came). All learners of a round receive
the same result; the latest averaged state is kept so that a learner that (re)joins starts from it.

Control plane and data plane. This actor decides (membership, B, position, checkpoints, drop and
rejoin) but moves no weights when learners send ``FlatPayload``s (``dataplane.payload``): it passes the
object references of every learner's slice i to shard i of its ``ShardPool`` (``runtime.shards.RayShards``
in a cluster, one actor per slice; ``InProcessShards`` in tests) and hands out the references of the
merged slices, owned by it, which every learner reads from the object store; once a group is linked
(``channels``, ``dataplane.generations``) the same round's parts and merged slices go through shared-memory
channels instead, and this actor reads the merged ones in place as its copy. Payloads of tensors (a
re-seed, direct callers) are still averaged here, in a worker thread. ``summary()["hub_load"]`` counts
the bytes each averaging actor moved per round.

Batch size: the averaged model of round r (r % m == 0) is validated, and the accuracy decides B for the
round after r+1, so every learner gets the same B. Who scores it: the injected ``validator``
(``runtime.evaluator.ThreadValidator``: an evaluator on a thread of this actor reads the state from the
object store while the learners train round r+1, and this actor reports its accuracy to itself; the
result of round r+1 waits for it at most ``timeout_s``), or, without one (GPU learners), the learners:
round r's result asks them to (``RoundResult.validate``), each scores its share of the validation split
on its device and sends the tallies (``report_validation_share``) before it sends round r+1, so the
shares are in when round r+1 closes and nothing waits; a share that did not come (a dropped learner)
makes the validation a missed one, at once. A validation due that nobody can score (a resumed or
restarted averager's) is started by the evaluator on the restored state, asked of the joining learners,
or missed at once: no round waits for it. Trade-off: one round of lag against the paper, where round
r+1 already trains with the new B, in exchange for validation staying off the critical path.
``report_test`` sums the learners' shares of the final test pass. The round that ends training
(``epochs``, ``steps``) has no round after it to wait for its accuracy: its validation starts once every
learner's test share is in, so that it takes no CPU from the test pass (only ``summary(settle=True)``
waits for it).
A stalled learner costs the others ``timeout_s`` once; it is not waited for again until it rejoins.

Elastic groups and crashes. Every round carries the learners' ``EpochPosition`` (epoch, rows consumed),
so the latest averaged state says where training stands: a group that Ray Train restarts or resizes
starts from it without a trip through storage ("live recovery"). The actor runs with Ray's
``max_restarts``; given the run folder it reloads the latest checkpoint on a restart, and since the
learners that are ahead of that checkpoint still hold their last averaged state, the first of them to
rejoin re-seeds the actor with it (``join(seed=state)``), so no finished round is lost; the others resend
the round they were in. Membership changes and recoveries go to ``run_dir/events.jsonl`` as they
happen, so a restarted actor (and a resumed run) keeps the whole story for the summary.

What it hands out is one type, ``rounds.state.AveragedState`` (inside a ``RoundResult`` or a
``JoinReply``); its run history (clock, totals, histories, recoveries, ``events.jsonl``) is an
``rounds.events.RunHistory`` it owns; checkpoints go through ``raytrain_seq.checkpoint``. The policy
(``RoundBook``) is plain Python, unit-tested without a cluster; the actor (``ParameterAverager``) is
asyncio and becomes a Ray actor in ``create_averager``. Learners reach it through
``rounds.client.AveragerClient`` over a ``runtime.transport.RayTransport``. ray is imported only inside the functions
that talk to a cluster, and nothing happens at import time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from raytrain_seq import checkpoint
from raytrain_seq.averaging import average_states, merge_adam_states
from raytrain_seq.dataplane.generations import ChannelBook, Channelled, Link
from raytrain_seq.dataplane.merge import part_nbytes
from raytrain_seq.dataplane.payload import FlatPayload, InProcessShards, ShardPool, merge_extras
from raytrain_seq.rounds.book import (
    LearnerId,
    RoundBook,
    RoundClose,
    RoundPhase,
    StaleRoundError,
    check_learner,
    check_number,
)
from raytrain_seq.rounds.events import EVENTS_FILE, RunHistory, describe_position
from raytrain_seq.rounds.position import EpochPosition, settle_dict
from raytrain_seq.rounds.settings import AveragerSettings
from raytrain_seq.rounds.state import AveragedState, JoinReply, RoundResult, check_payload
from raytrain_seq.rounds.tally import ShareTally
from raytrain_seq.rounds.validation import ValidationGate
from raytrain_seq.runtime.channels import read_round
from raytrain_seq.tracking import make_tracker

logger = logging.getLogger(__name__)


__all__ = ["ParameterAverager", "create_averager", "get_averager"]


class ParameterAverager:
    """Asyncio averaging server; create_averager makes it a Ray actor (0 CPUs, on the driver's node).

    A thin shell: each call hands its decisions to plain parts (the round book, ``rounds.book``; the
    batch-size rule and the learners' validation shares, ``rounds.validation``; the test pass's shares,
    ``rounds.tally``; the channel generations, ``dataplane.generations``; the run history,
    ``rounds.events``) and does the waiting, the merging through its shard pool and the I/O itself.

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
        epochs, steps = settings.epochs, settings.steps
        self._end = None if epochs is None else {"epochs": epochs, "steps": steps}
        # Who merges flat payloads: shard actors in a cluster (runtime.shards.RayShards), else this process.
        self._pool = (shard_pool or InProcessShards)(settings.shard_count)
        self._loads: list[dict[str, Any]] = []  # per round: the bytes each averaging actor moved
        self._closed_at: dict[int, float] = {}  # round -> when it closed (its last arrival or deadline)
        self._nodes: dict[LearnerId, str] = {}
        # Scores the averaged model of validation rounds off the learners' path (runtime/evaluator.py);
        # None: the learners score their shares of it (report_validation_share).
        self._validator = validator
        # The batch-size rule and, without a validator, the learners' shares of the due validation.
        self._gate = ValidationGate(settings, by_learners=validator is None)
        start = getattr(validator, "start", None)
        if start is not None:
            start()  # evaluator.ThreadValidator: builds the evaluator and its rows in the background
        self._test = ShareTally()  # the final test pass: each learner's share
        self._test_done: asyncio.Event | None = None
        self._tested = asyncio.Event()  # every learner's test share is in: training is over
        # The latest flat state read into this process once (off the learners' path): what a (re)joining
        # group and a checkpoint get, since the merged slices live on the learners' nodes and die with them.
        self._local: asyncio.Task | None = None
        # Channel generations (dataplane.generations): the bytes of a stable group's rounds go through
        # shared-memory channels, which this actor reads too (its copy of each round, in place). Only a
        # pool of shard actors has channels.
        self._channels = ChannelBook(enabled=settings.channels and self._pool.supports_channels)
        self._linked: asyncio.Event = asyncio.Event()
        self._channel_reads = asyncio.Lock()  # a channel's values are read in order, once each
        actor = (actor_id or _actor_id)() if run_dir is not None else None
        # Live tracking (TensorBoard by default) of what the history records, written under the run folder.
        live = make_tracker(settings.tracker, run_dir)
        self._history = RunHistory(
            None if run_dir is None else Path(run_dir) / EVENTS_FILE, actor=actor, tracker=live
        )
        book = {"timeout_s": settings.timeout_s, "min_learners": settings.min_learners}
        book["validate_every"] = settings.validate_every
        self._book = RoundBook(settings.world_size, **book, sink=self._history.on_member)
        self._state = AveragedState(batch_size=settings.batch_size)  # round 0: nothing averaged yet
        self._round_future: asyncio.Future | None = None
        self._validation_future: asyncio.Future | None = None
        self._timer: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._rows_cap: int | None = None  # the rows a learner has per epoch, sent with the rounds
        self._events_loaded = False
        if run_dir is not None:
            self._load_run(Path(run_dir), restarted_by_ray=actor is not None)

    # ------------------------------------------------------------------------------ the run folder
    def _load_run(self, run_dir: Path, *, restarted_by_ray: bool) -> None:
        """Reload the events log and the latest checkpoint; tell a restart by Ray (this actor id wrote
        the log before) from a first start (a new run, or a --resume)."""
        past = self._history.log.replay()
        self._events_loaded = bool(past["records"])
        self._book.membership_log, self._book.dropped_log = past["membership"], past["dropped"]
        self._history.adopt_log(past)
        restarted = restarted_by_ray and self._history.actor in past["actors"]
        self._history.mark_start()
        self._book.restarted = restarted
        found = checkpoint.load_latest(run_dir)
        if found is not None:
            self._restore(found)
        if restarted:
            self._history.start_clock()  # the run is under way: its clock keeps going
            self._history.replay_rounds(past, after=self._state.round)
            what = f"reloaded {found.folder.name}" if found else "no checkpoint yet"
            self._history.recover(
                "averager_restart", f"Ray restarted the averager; {what}: learners ahead of it re-seed it"
            )
        elif found is not None:
            self._history.recover("resumed", f"run resumed from {found.folder.name} (round {found.round})")

    def _restore(self, found: checkpoint.Checkpoint) -> None:
        history = found.history
        self._gate.load_state_dict(found.state.adaptive_state)
        # Drops since the checkpoint are in the events log when there is one: keep those.
        drops = None if self._events_loaded else history.get("dropped_log", ())
        self._book.restore(found.state.round, history.get("validation_due"), drops)
        self._state = found.state.replace(source="checkpoint")
        self._validation_future = None  # made when a round waits for the due validation
        self._history.restore_checkpoint_part(history, found.state.elapsed_s)

    def _current(self) -> AveragedState:
        """The latest averaged state with the batch size decided since and the clock's reading now."""
        return self._state.replace(
            batch_size=self._gate.size,
            adaptive_state=self._gate.state_dict(),
            elapsed_s=self._history.elapsed(),
        )

    # ----------------------------------------------------------------------------------- the rounds
    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # the loop holds only weak references to tasks
        task.add_done_callback(self._tasks.discard)
        return task

    async def _expire(self, opening: int, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        if self._book.phase is RoundPhase.OPEN and self._book.opening == opening:
            self._start_close()

    def _start_close(self) -> None:
        self._closed_at[self._book.round] = time.monotonic()  # the end of its senders' wait for the others
        if self._timer is not None and self._timer is not asyncio.current_task():
            self._timer.cancel()
        self._timer = None
        self._spawn(self._close_round(self._book.close(), self._round_future))

    def _fail_round(self, why: str) -> None:
        """Hand the open round's waiting senders a StaleRoundError (they rejoin); the book moved on."""
        self._end_channels(why)
        if self._timer is not None:
            self._timer.cancel()
        future, self._timer, self._round_future = self._round_future, None, None
        if future is not None and not future.done():
            future.set_exception(StaleRoundError("group", self._book.round, self._book.round, why))

    async def _close_round(self, closed: RoundClose, future: asyncio.Future) -> None:
        try:
            if closed.error is not None:
                raise closed.error
            await self._await_validation()
            closed, result = await self._compute(closed)
            result = await self._plan_channels(result)
            self._publish(closed, result)
            if result.state.flat is not None:
                self._local = self._spawn(self._read_local(result.state))
            self._book.finish(ok=True)
            if self._book.validation_due is not None:
                self._validation_future = asyncio.get_running_loop().create_future()
                if self._book.validation_due == result.state.round:
                    if self._validator is not None:
                        self._spawn(self._validate(result.state))
                    else:  # the learners score it, each its share, before they send the next round
                        self._gate.new_pass()
                        result = dataclasses.replace(result, validate=True)
            future.set_result(result)
        except Exception as exc:
            # Handed to every learner of the round (each one's await re-raises it): nobody is left waiting.
            if self._book.phase is RoundPhase.CLOSING:
                self._book.finish(ok=False)
            self._history.record_failed_round(closed.round, exc)
            future.set_exception(exc)
        finally:
            if self._round_future is future:
                self._round_future = None

    async def _read_local(self, state: AveragedState) -> tuple[AveragedState, list[Any]]:
        """Read a round's merged slices into this process (a secondary copy on the control plane's node);
        counted in the round's hub load as bytes this actor received. The state and its parts: they
        become tensors only when a join or a checkpoint needs them (``_held_state``), not every round,
        since a layout of many tensors takes milliseconds to unpack (docs/ARCHITECTURE.md, "Measurements behind the code") and most rounds' states are never asked for."""
        if isinstance(state.flat.parts[0], Channelled):
            async with self._channel_reads:
                inputs, timeout = self._channels.inputs, self._book.timeout_s
                parts = await asyncio.to_thread(
                    lambda: [read_round(inputs[p.writer], p.round, timeout) for p in state.flat.parts]
                )
            state = state.replace(flat=dataclasses.replace(state.flat, parts=tuple(parts)))
        else:
            parts = await self._pool.fetch(list(state.flat.parts))
        for record in reversed(self._loads):
            if record["round"] == state.round:
                record["actors"]["control"]["received"] += sum(part_nbytes(part) for part in parts)
                break
        return state, parts

    async def _held_state(self) -> AveragedState:
        """The latest state with its tensors in this process when it can be had: for joins and checkpoints.
        A failed read is logged and the references are handed out instead (their objects may be gone)."""
        task = self._local
        if task is not None and self._state.flat is not None:
            try:
                local, parts = await asyncio.shield(task)
                if local.round == self._state.round:
                    local = await asyncio.to_thread(local.materialise, lambda refs: parts)
            except Exception as exc:
                logger.error("averager: reading round %d's merged state failed: %r", self._state.round, exc)
            else:
                if local.round == self._state.round:
                    return local.replace(
                        batch_size=self._gate.size,
                        adaptive_state=self._gate.state_dict(),
                        elapsed_s=self._history.elapsed(),
                    )
        return self._current()

    async def _validate(self, state: AveragedState) -> None:
        """Have the validator score round ``state.round`` and report it; the learners go on meanwhile.
        The round that ends training is scored after the test pass (see the module docstring)."""
        epoch = None if state.position is None else int(state.position.get("epoch", 0))
        if self._ends_training(state):
            try:
                await asyncio.wait_for(self._tested.wait(), self._book.timeout_s)
            except asyncio.TimeoutError:  # the learners stopped before testing: score it now
                logger.warning("averager: no test pass in %g s after the last round", self._book.timeout_s)
        try:
            if state.flat is not None and isinstance(state.flat.parts[0], Channelled):
                state, _ = await asyncio.shield(self._local)  # the round's slices, read from the channels
            scores = dict(await self._validator(state))
        except Exception as exc:
            # The round after waits for this report: a failed evaluation is a missed one, at once.
            logger.error("averager: the evaluator failed on round %d: %r; B stays", state.round, exc)
            if self._validation_future is not None and not self._validation_future.done():
                self._validation_future.set_exception(exc)
            return
        try:
            await self.report_validation(
                state.round,
                scores["accuracy"],
                learner="evaluator",
                epoch=epoch,
                val_size=scores["sequences"],
                rows_cap=self._rows_cap,
                metrics={k: scores[k] for k in ("top5_accuracy", "mean_class_accuracy")},
            )
        except StaleRoundError as exc:  # a new group or a re-seed moved on: this report decides nothing
            logger.warning("averager: validation of round %d not taken (%s)", state.round, exc)

    def _ends_training(self, state: AveragedState) -> bool:
        if self._end is None or state.position is None:
            return False
        return EpochPosition.from_dict(state.position).ends_training(**self._end)

    async def _await_validation(self) -> None:
        """Before a round's result: the due validation's report, waited for only while it is being scored
        (the evaluator: at most ``timeout_s``). Learners send their shares before this round, so shares
        missing now will not come; a validation nobody scores is missed at once."""
        due = self._book.validation_due
        if due is None:
            return
        if self._validator is None:
            self._miss_validation(due, self._gate.missing(self._book.world_size))
            return
        if self._validation_future is None and not self._start_restored_validation():
            self._miss_validation(due, "nobody scores it (the averager restarted or the run resumed)")
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._validation_future), self._book.timeout_s)
        except (asyncio.TimeoutError, Exception) as exc:
            if not isinstance(exc, asyncio.TimeoutError):
                logger.warning("averager: validation of round %d failed (%r)", due, exc)
            self._miss_validation(due, f"not reported in {self._book.timeout_s:g} s")

    def _miss_validation(self, due: int, why: str) -> None:
        """Give the due validation up: B stays, and the history records the miss."""
        self._book.miss_validation()
        size = self._gate.size
        self._history.record_missed_validation(due, size)
        logger.warning("averager: validation of round %d missed (%s); B stays %d", due, why, size)

    def _start_restored_validation(self) -> bool:
        """A validation due in a restored state (a --resume, or Ray restarted this actor): the evaluator
        scores the state it is due for when this actor holds it; whether it started."""
        due, state = self._book.validation_due, self._state
        if self._validator is None or due is None or state.round != due or state.empty:
            return False
        if self._validation_future is None:
            self._validation_future = asyncio.get_running_loop().create_future()
            self._spawn(self._validate(state))
        return True

    async def _compute(self, closed: RoundClose) -> tuple[RoundClose, RoundResult]:
        """The round's mean: the shards merge flat payloads (awaited), tensors are merged in a worker
        thread; either way the event loop keeps answering. Learners whose slices a shard could not read
        within the timeout are dropped and the others merged again: the close that was averaged is
        returned with the result."""
        params = optimizer_state = flat = None
        if isinstance(closed.present[0][1].params, FlatPayload):
            closed, flat = await self._merge_flat(closed)
        arrivals = [arrival for _, arrival in closed.present]
        weights = [arrival.weight for arrival in arrivals]
        if flat is None:
            params, optimizer_state = await asyncio.to_thread(self._merge_tensors, arrivals, weights)
            self._record_load(closed.round, [], in_process=(arrivals, params, optimizer_state))
        positions = {json.dumps(a.position, sort_keys=True) for a in arrivals}
        if len(positions) > 1:
            logger.warning(
                "averager: round %d learners disagree on the position: %s", closed.round, positions
            )
        position = None if arrivals[0].position is None else dict(arrivals[0].position)
        if position is not None:
            # The rows of the layout's ranks absent from this round never reach an averaged state: the
            # position records them as missed, and the layout's end deals them again (rounds.position).
            present = [learner for learner, _ in closed.present]
            position = settle_dict(position, self._state.position, present, self._rows_cap)
        state = AveragedState(
            round=closed.round,
            params=params,
            optimizer_state=optimizer_state,
            flat=flat,
            batch_size=self._gate.size,
            adaptive_state=self._gate.state_dict(),
            position=position,
            elapsed_s=self._history.elapsed(),
            source="live",
        )
        result = RoundResult(
            state=state,
            learners=tuple(learner for learner, _ in closed.present),
            dropped=closed.dropped,
            seconds=time.monotonic() - closed.opened_at,
            weights=tuple(weights),
        )
        return closed, result

    def _merge_tensors(self, arrivals: list, weights: list[float]) -> tuple[dict, dict | None]:
        """The in-process arithmetic of payloads sent as tensors (the star's path)."""
        params = average_states(
            [a.params for a in arrivals], weights, merge_bn_stats=self.settings.merge_bn_stats
        )
        optimizer_state = None
        if arrivals[0].adam and self.settings.merge_moments:
            states = [a.optimizer_state for a in arrivals]
            optimizer_state = merge_adam_states(
                states, weights=weights, centred_pairs=self.settings.centred_pairs
            )
        return params, optimizer_state

    async def _merge_flat(self, closed: RoundClose) -> tuple[RoundClose, FlatPayload]:
        """The data plane: the shards merge the slices, read from the store or from the live channel
        generation's channels (this actor passes references or ``Channelled`` markers only), and write
        the result into the channels when every member sent through them. A learner whose slices a shard
        cannot read within the round's timeout, or finds lost, is dropped, and the others' slices are
        merged again (each try drops at least one learner, so this ends). A shard that lost the
        generation's channels (restarted) fails the round: its learners rejoin and resend it through
        the store."""
        while True:
            payloads = [arrival.params for _, arrival in closed.present]
            weights = [arrival.weight for _, arrival in closed.present]
            extras = merge_extras([p.extras for p in payloads])
            marked = [p.parts[0] for p in payloads if isinstance(p.parts[0], Channelled)]
            write = len(marked) == len(payloads) and self._channels.accepts(
                marked[0].generation, [learner for learner, _ in closed.present]
            )
            timeout = self._book.timeout_s
            merged = await self._pool.merge(closed.round, payloads, weights, timeout, write=write)
            present = [learner for learner, _ in closed.present]
            if self._channels.live and not self._channels.keeps(present, len(marked), merged.channelled):
                self._end_channels(f"round {closed.round}: a member is missing or left the channels")
            if merged.lost_channels:
                self._end_channels(f"round {closed.round}: a shard lost its channels (restarted)")
                raise StaleRoundError(
                    "group", closed.round, closed.round, "a shard lost the round's channels"
                )
            if not merged.unreadable:
                break
            unread = [closed.present[i][0] for i in sorted(merged.unreadable)]
            why = f"its slices were lost or unreadable for {self._book.timeout_s:g} s (the learner owns them)"
            closed = self._book.drop_unread(closed, unread, why)
            if closed.error is not None:
                raise closed.error
        self._record_load(closed.round, list(merged.loads))
        if merged.channelled:
            generation = self._channels.plan.generation
            parts = tuple(Channelled(generation, i, closed.round) for i in range(self._pool.count))
        else:
            parts = tuple(merged.parts)
            if write:  # a shard could not write: the learners read the store, and the generation ends
                self._end_channels(f"round {closed.round}: a shard's channel write failed")
        return closed, FlatPayload(payloads[0].layout, parts, extras)

    # -------------------------------------------------------------------------------- channels
    async def _plan_channels(self, result: RoundResult) -> RoundResult:
        """A round that every member took part in, through the store, plans a channel generation for
        them (``dataplane.generations``): the result tells them to link."""
        flat = result.state.flat is not None and not isinstance(result.state.flat.parts[0], Channelled)
        book = self._book
        if not self._channels.propose(result.learners, book.expected, result.dropped, flat, book.world_size):
            return result
        plan = self._channels.start(result.learners, await self._pool.targets())
        self._linked = asyncio.Event()
        return dataclasses.replace(result, channels=plan)

    async def link(self, generation: int, learner: LearnerId, link: Link) -> list[Any] | None:
        """A member's channels for ``generation``; once every member has linked, the shards open theirs:
        returns shard i's channel of merged slices at i, or None when the generation ended (or not every
        member linked within the timeout): the learner's rounds go through the store."""
        decision = self._channels.link(generation, learner, link)
        if decision == "refused":
            return None
        if decision == "complete":
            book, event = self._channels, self._linked
            readers = [*book.readers(), _self_reader()]
            try:
                inputs = await self._pool.open_channels(generation, book.shard_inputs(), readers, link.nbytes)
            except Exception as exc:
                logger.error("averager: opening generation %d's channels failed: %r", generation, exc)
                self._end_channels(f"generation {generation} could not be opened")
            else:
                if book.opened(generation, inputs):
                    logger.info("averager: channel generation %d is live (%d members)",
                                generation, len(book.plan.members))  # fmt: skip
            event.set()
        else:
            try:
                await asyncio.wait_for(self._linked.wait(), self._book.timeout_s)
            except asyncio.TimeoutError:
                self._end_channels(f"not every member linked generation {generation}")
        plan = self._channels.plan
        if plan is None or plan.generation != generation or not self._channels.live:
            return None
        return list(self._channels.inputs)

    def _end_channels(self, why: str) -> None:
        """End the planned or live generation: the rounds go through the store until the next full round
        plans another (its channels are not closed: ``dataplane.generations`` says why)."""
        generation = self._channels.end()
        self._linked.set()
        if generation is None:
            return
        logger.warning("averager: channel generation %d ends (%s)", generation, why)
        if self._channels.failed == self._channels.max_ended:
            logger.warning(
                "averager: %d channel generations ended early: the rounds go through the object store from "
                "now on (each generation's buffers stay in the store until its processes exit)",
                self._channels.failed,
            )

    def _record_load(self, round_: int, shard_loads: list[dict], in_process: tuple | None = None) -> None:
        """Bytes each averaging actor received and sent in a round (hub load). This actor counts the
        array bytes of the payloads it merged itself (the tensor path) and of the results it hands out,
        times the learners; on the flat path it moves object references only and counts 0."""
        received = sent = 0
        if in_process is not None:
            arrivals, params, moments = in_process
            received = sum(_tensor_bytes(a.params) + _tensor_bytes(a.optimizer_state) for a in arrivals)
            sent = (_tensor_bytes(params) + _tensor_bytes(moments)) * len(arrivals)
        actors = {"control": {"received": received, "sent": sent}}
        for load in shard_loads:
            actors[f"shard{load['shard']}"] = {k: load[k] for k in ("received", "sent", "seconds")}
        self._loads = [*self._loads[-63:], {"round": round_, "actors": actors}]

    def _publish(self, closed: RoundClose, result: RoundResult) -> None:
        state = result.state
        self._history.record_round(
            state.round,
            seconds=result.seconds,
            batch_size=state.batch_size,
            position=state.position,
            stats=[(learner, arrival.stats) for learner, arrival in closed.present],
        )
        self._state = state

    # ------------------------------------------------------------------------------ learner-facing
    async def join(
        self,
        learner: LearnerId,
        world_size: int | None = None,
        incarnation: str | None = None,
        seed: AveragedState | None = None,
        node: str | None = None,
    ) -> JoinReply:
        """Register a learner (again); returns where it starts: the latest averaged state and its position.

        incarnation: one id per learner process; the first join of a new process starts a new group
        (Ray Train restarted or resized it). seed: the learner's last averaged state, adopted when newer
        than the averager's (after an averager restart), so no finished round is lost. node: the
        learner's node id, where shard ``learner`` is placed (a hint).
        """
        check_learner(learner)
        if seed is not None and not isinstance(seed, AveragedState):
            raise TypeError(
                f"seed must be an AveragedState (the learner's held state), not {type(seed).__name__}"
            )
        if seed is not None and seed.flat is not None:
            raise TypeError("seed lives in the object store: send seed.materialise(get), its tensors")
        if node is not None:
            self._nodes[learner] = node
            self._pool.place(learner, node)
            if len(self._nodes) >= min(self._pool.count, self._book.world_size or 1):
                self._pool.prepare()  # start the shards while the first round trains
        self._history.start_clock()
        while self._book.phase is RoundPhase.CLOSING and self._round_future is not None:
            await asyncio.wait({self._round_future})  # the round's outcome is its senders' business
        self._end_channels(f"learner {learner!r} (re)joined")
        generation = self._book.generation
        self._book.join(learner, world_size, incarnation)
        if self._book.generation != generation:
            self._fail_round("the learner group was restarted")
            self._on_new_group()
        if seed is not None:
            self._adopt(learner, seed)
        state = await self._held_state()
        due = self._book.validation_due
        if due is not None and self._validator is not None and self._validation_future is None:
            self._start_restored_validation()  # scored while the group trains its first round
        return JoinReply(
            state=state,
            next_round=self._book.next_round_for(learner),
            world_size=self._book.world_size,
            shards=self._pool.count,
            # The learners score a due validation of the state they start from (a resumed run's).
            validate=self._validator is None and due is not None and due == state.round and not state.empty,
        )

    def _on_new_group(self) -> None:
        """A restarted or resized group: record where its learners' state comes from."""
        self._gate.new_pass()  # the new group scores its own shares
        if self._book.generation < 2:
            return  # the run's first group (or the learners rejoining a restarted averager)
        last, size, source = self._state.round, self._book.world_size, self._state.source
        where = describe_position(self._state.position)
        if last == 0:
            self._history.recover(
                "restart_from_scratch", f"the new group of {size} starts over: no round averaged yet"
            )
        else:
            kind = "checkpoint_recovery" if source == "checkpoint" else "live_recovery"
            how = "reloaded from a checkpoint" if source == "checkpoint" else "held by the averager"
            self._history.recover(
                kind, f"the new group of {size} starts from round {last}'s state {how} ({where})"
            )

    def _adopt(self, learner: LearnerId, seed: AveragedState) -> None:
        """Take a rejoining learner's last averaged state when it is newer than ours."""
        held = self._state.round
        if seed.round <= held:
            return
        check_payload(seed.params, seed.optimizer_state, None, 1.0, seed.position)
        self._fail_round(f"learner {learner!r} re-seeded round {seed.round}")
        self._book.abandon()
        from_checkpoint = seed.source == "checkpoint"
        self._state = seed.replace(source="checkpoint" if from_checkpoint else "seed")
        if seed.adaptive_state:
            self._gate.load_state_dict(seed.adaptive_state)
        self._book.restore(seed.round, None)
        kind = "checkpoint_recovery" if from_checkpoint else "reseeded"
        where = "the run's latest checkpoint" if from_checkpoint else "the state it held"
        self._history.recover(
            kind, f"learner {learner!r} re-seeded round {seed.round} from {where} (the averager had {held})"
        )

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
        check_learner(learner)
        if rows is not None:
            check_number("rows", rows, 1)
        start = time.monotonic()
        try:
            self._book.check(learner, round, world_size, incarnation)
            if rows is not None:
                # Taken from a sender of the open round only: a refused (stale) sender's rows may be those
                # of another layout, and the round's settled position ends its layout at these rows.
                self._rows_cap = int(rows)
            arrival = check_payload(params, optimizer_state, stats, weight, position)
            if isinstance(params, FlatPayload) and len(params.parts) != self._pool.count:
                raise ValueError(
                    f"learner {learner!r} sent {len(params.parts)} parts for {self._pool.count} shards: "
                    "split the buffers into JoinReply.shards slices"
                )
            if isinstance(params, FlatPayload) and params.layout.moments and not self.settings.merge_moments:
                raise ValueError(
                    f"learner {learner!r} sent Adam moments but merge_moments=False: send the weights only "
                    "(the AAVG2 ablation keeps each learner's own moments)"
                )
            first = self._book.first_payload
            # Checked against the round's first arrival, so that a mismatch fails only the learner that
            # sent it (the round goes on without it) rather than the arithmetic failing the whole round.
            if first is not None and (arrival.signature, arrival.adam) != (first.signature, first.adam):
                raise ValueError(
                    f"learner {learner!r} sent params (keys, shapes, dtypes) or an optimizer kind that differ "
                    "from the round's first learner's: every learner must run the same model and optimizer"
                )
            opening = self._book.phase is RoundPhase.IDLE
            complete = self._book.arrive(learner, round, world_size, arrival, incarnation)
            if opening:
                self._round_future = asyncio.get_running_loop().create_future()
                self._timer = self._spawn(self._expire(self._book.opening, self._book.deadline))
            future = self._round_future
            if complete:
                self._start_close()
            result = await asyncio.shield(future)
            if learner in result.dropped:
                # Its slices could not be read: the round was averaged without it, so it rejoins.
                raise StaleRoundError(learner, round, result.state.round + 1, "its round was not readable")
            return result
        finally:
            end = time.monotonic()
            waiting = min(max(0.0, self._closed_at.get(round, start) - start), end - start)
            self._history.add_averaging_time(learner, end - start, waiting)
            while len(self._closed_at) > 8:  # a few recent rounds: a late sender of one may still be here
                del self._closed_at[min(self._closed_at)]

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
        check_number("accuracy", accuracy, -math.inf, int | float)
        self._book.report_validation(round, learner)
        decided = self._gate.decide(accuracy, val_size=val_size, rows_cap=rows_cap)
        self._history.record_validation(
            round, accuracy, batch_size=decided.size, grew=decided.grew, epoch=epoch, metrics=metrics
        )
        if self._validation_future is not None and not self._validation_future.done():
            self._validation_future.set_result(decided.size)
        return decided.size

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
        learner goes on training, and the round after waits for nothing (``_await_validation``)."""
        check_learner(learner)
        check_number("round", round, 1)
        check_number("world_size", world_size, 1)
        share = self._gate.take_share(learner, round, tallies, world_size, due=self._book.validation_due)
        if not share.taken:
            logger.info(
                "averager: learner %r's validation share of round %d not taken (not due)", learner, round
            )
            return False
        if share.total is None:
            return True
        total = share.total
        await self.report_validation(
            round,
            total.accuracy,
            learner="learners",
            epoch=epoch,
            val_size=total.sequences,
            rows_cap=rows_cap if rows_cap is not None else self._rows_cap,
            metrics={"top5_accuracy": total.top5_accuracy, "mean_class_accuracy": total.mean_class_accuracy},
        )
        return True

    async def report_test(
        self, learner: LearnerId, tallies: Mapping[str, Any], world_size: int
    ) -> dict[str, Any]:
        """One learner's test tallies ({"correct", "sequences", "per_class": {label: [correct, total]}})
        of its shard of the test split; returns the sums once ``world_size`` learners reported (waiting at
        most ``timeout_s``; then the sums of those that did, with ``learners`` saying how many)."""
        check_learner(learner)
        check_number("world_size", world_size, 1)
        for key in ("correct", "sequences"):
            check_number(f"tallies[{key!r}]", tallies.get(key), 0)
        if self._test_done is None or (self._test_done.is_set() and learner in self._test.shares):
            self._test.clear()  # a new test pass (e.g. a restarted group)
            self._test_done = asyncio.Event()
        if self._test.add(learner, tallies, world_size):
            self._test_done.set()
            self._tested.set()
        try:
            await asyncio.wait_for(self._test_done.wait(), self._book.timeout_s)
        except asyncio.TimeoutError:
            logger.warning(
                "averager: %d of %d learners reported their test tallies in %g s: summing those",
                len(self._test), world_size, self._book.timeout_s,
            )  # fmt: skip
        return self._test.totals()

    async def set_world_size(self, world_size: int) -> None:
        """Resize the group (learners must send the new size from now on)."""
        self._end_channels(f"the group was resized to {world_size}")
        self._book.set_world_size(world_size)

    async def leave(self, learner: LearnerId) -> None:
        """Remove a learner for good; an open round stops waiting for it."""
        self._end_channels(f"learner {learner!r} left")
        self._book.leave(learner)
        if self._book.complete:
            self._start_close()

    # ------------------------------------------------------------------------ checkpoints, summary
    async def latest(self) -> AveragedState:
        """The latest averaged state (round 0, params None before the first round)."""
        return await self._held_state()

    async def checkpoint_contents(self) -> tuple[AveragedState, dict[str, Any]]:
        """What a checkpoint of the latest round holds: the state, and the history a restore needs."""
        history = self._history.checkpoint_part()
        history.update(validation_due=self._book.validation_due, dropped_log=list(self._book.dropped_log))
        return await self._held_state(), history

    async def restore(self, found: checkpoint.Checkpoint) -> None:
        """Continue from a loaded checkpoint (``checkpoint.load``), e.g. after a crash."""
        if not isinstance(found, checkpoint.Checkpoint):
            raise TypeError(f"restore takes a checkpoint.Checkpoint, not {type(found).__name__}")
        self._restore(found)

    async def shard_actors(self) -> list[Any]:
        """The averaging shard actors (created now if not yet); empty when this process merges."""
        return self._pool.handles()

    async def summary(self, *, settle: bool = False) -> dict[str, Any]:
        """Per-learner totals, histories, drops, membership and recoveries, B and validations.

        settle: first wait (at most ``timeout_s``) for a validation still being scored. At the run's end
        no next round waits for the final round's accuracy, and the history should hold it."""
        future = self._validation_future
        if settle and self._validator is not None and future is not None and not future.done():
            try:
                await asyncio.wait_for(asyncio.shield(future), self._book.timeout_s)
            except asyncio.TimeoutError:
                logger.warning("averager: round %s's validation not scored in %g s: the summary goes without it",
                               self._book.validation_due, self._book.timeout_s)  # fmt: skip
            except Exception as error:  # _validate logged the failure; this says what the summary lacks
                logger.warning("averager: round %s's validation failed (%r): the summary goes without it",
                               self._book.validation_due, error)  # fmt: skip
        out = self._history.summary()
        out.update(
            next_round=self._book.round,
            open_round={"phase": self._book.phase.value, "arrived": self._book.arrived},
            world_size=self._book.world_size,
            generation=self._book.generation,
            dropped=list(self._book.dropped_log),
            membership=list(self._book.membership_log),
            position=self._state.position,
            shards=self._pool.count,
            # Channel generations planned, whether the last is live, and how many ended early (a drop,
            # a join, a shard restarted: their rounds went through the store).
            channels={
                "enabled": self._channels.enabled,
                "generations": self._channels.generation,
                "live": self._channels.live,
                "ended": self._channels.failed,
            },
            hub_load=list(self._loads),
            test=self._test.totals() if self._test else None,
        )
        error = getattr(self._validator, "error", None)
        message = error() if error is not None else None
        if message is not None:
            out["validator_error"] = message  # the driver raises it: no validation round was scored
        return out


def _tensor_bytes(tree: Any) -> int:
    """Bytes of the tensors of a (nested) dict."""
    if isinstance(tree, Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, Mapping):
        return sum(_tensor_bytes(value) for value in tree.values())
    return 0


def _self_reader() -> tuple[Any, str]:
    """This actor as a reader of a shard's channel: (its handle, its node)."""
    import ray
    from ray.experimental.channel.utils import get_self_actor

    return get_self_actor(), ray.get_runtime_context().get_node_id()


def _actor_id() -> str | None:
    """This actor's id (the same across its restarts), or None outside a Ray actor."""
    import ray

    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_actor_id()


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

    settings are checked here first (without loading the run folder), so that a bad value fails in the
    driver. Each waiting average()/join() call holds a concurrency slot, so the default leaves room for
    several per learner. max_restarts: how often Ray restarts the actor after it dies (-1: always). Calls
    in flight are not retried by Ray (max_task_retries=0): the learners retry, since a round must be
    resent after a rejoin.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raytrain_seq.runtime.shards import RayShards

    ParameterAverager(settings)  # the checks, here; the actor starts the validator and loads the run
    if not ray.is_initialized():
        raise RuntimeError("ray is not initialised: call ray.init() (or run inside a Ray job) first")
    driver_node = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    concurrency = max_concurrency or max(64, 4 * settings.world_size + 16)
    options = {"name": name, "namespace": namespace, "get_if_exists": False, "num_cpus": 0, "num_gpus": 0}
    options.update(scheduling_strategy=driver_node, max_concurrency=concurrency)
    options.update(max_restarts=check_number("max_restarts", max_restarts, -1), max_task_retries=0)
    # The data plane: shard actors, created by the averager when needed.
    wiring = {
        "run_dir": None if run_dir is None else str(run_dir),
        "validator": validator,
        "shard_pool": RayShards,
    }
    return ray.remote(num_cpus=0)(ParameterAverager).options(**options).remote(settings, **wiring)


def get_averager(name: str, *, namespace: str | None = None):
    """The handle of a running averager started by create_averager."""
    import ray

    return ray.get_actor(name, namespace=namespace)
