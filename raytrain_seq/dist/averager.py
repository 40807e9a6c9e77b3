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

Batch size: rank 0 validates the averaged model of round r (r % m == 0) while the others already train
round r+1, and the result of round r+1 is not computed before that report arrives (waiting at most
``timeout_s``), so every learner gets the same B. Trade-off: one round of lag against the paper, where
round r+1 already trains with the new B, in exchange for validation staying off the critical path.
Measured (4 learners x 1M float32 parameters with Adam state, loaded 2-core machine): ~0.1 s from the
first arrival to the result inside the actor, ~0.35-0.55 s from submitting the 4 calls to holding all 4
results (the rest is shipping 12 MB per learner each way). A stalled learner costs the others
``timeout_s`` once; it is not waited for again until it rejoins.

The policy (``RoundBook``) is plain Python, unit-tested without a cluster; the actor (``ParameterAverager``)
is asyncio and becomes a Ray actor in ``create_averager``. ray is imported only inside the two functions
that talk to a cluster, and nothing happens at import time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from torch import Tensor

from raytrain_seq.averaging import AdaptiveBatchSize, average_states, merge_adam_states
from raytrain_seq.dist.rounds import (
    AveragerError,
    AveragingTimeoutError,
    Learner,
    MembershipError,
    RoundBook,
    RoundClose,
    StaleRoundError,
    check_learner,
    check_number,
)

logger = logging.getLogger(__name__)


__all__ = [
    "AveragerError",
    "AveragingTimeoutError",
    "JoinInfo",
    "MembershipError",
    "ParameterAverager",
    "RoundBook",
    "RoundResult",
    "Snapshot",
    "StaleRoundError",
    "create_averager",
    "get_averager",
]


@dataclass(frozen=True)
class RoundResult:
    """What every learner of a round receives (the same object for all)."""

    round: int
    params: dict[str, Tensor]
    optimizer_state: dict | None  # merged Adam state; None when the optimizer keeps no Adam moments
    batch_size: int  # B for the next round
    learners: tuple[Learner, ...]  # averaged, in this order
    dropped: tuple[Learner, ...]
    seconds: float  # first arrival -> result
    weights: tuple[float, ...]


@dataclass(frozen=True)
class JoinInfo:
    """Where a (re)joining learner starts: the round to send next and the latest averaged state."""

    learner: Learner
    round: int
    params: dict[str, Tensor] | None
    optimizer_state: dict | None
    batch_size: int
    adaptive_state: dict
    world_size: int


@dataclass(frozen=True)
class Snapshot:
    """The latest averaged state and the logs a restarted averager needs; round 0 means none yet."""

    round: int
    params: dict[str, Tensor] | None
    optimizer_state: dict | None
    batch_size: int
    adaptive_state: dict
    validation_due: int | None = None
    dropped_log: tuple = ()
    batch_size_history: tuple = ()
    validation_history: tuple = ()


@dataclass(frozen=True)
class _Arrival:
    params: Mapping[str, Tensor]
    optimizer_state: Mapping | None
    stats: dict[str, float]
    weight: float
    adam: bool
    signature: tuple


def _has_adam_moments(state: Mapping | None) -> bool:
    """True if the optimizer keeps Adam moments; SGD without momentum keeps none (an empty state)."""
    kinds = {isinstance(entry, Mapping) and "exp_avg" in entry for entry in (state or {}).values()}
    if len(kinds) > 1:
        raise ValueError(
            "optimizer_state has exp_avg for some parameters only: send one optimizer's whole state"
        )
    return kinds == {True}


def _arrival(params: Any, optimizer_state: Any, stats: Any, weight: Any) -> _Arrival:
    """Validate one learner's payload."""
    if not isinstance(params, Mapping) or not all(isinstance(t, Tensor) for t in params.values()):
        raise TypeError(
            "params must be a dict of tensors: send {k: v.cpu() for k, v in model.state_dict().items()}"
        )
    if any(t.device.type != "cpu" for t in params.values()):
        raise ValueError("params must be CPU tensors (the averager has no GPU): move them with .cpu() first")
    if optimizer_state is not None and not isinstance(optimizer_state, Mapping):
        raise TypeError("optimizer_state must be optimizer.state_dict()['state'] (a dict) or None")
    if optimizer_state is not None and {"state", "param_groups"} <= set(optimizer_state):
        raise TypeError("optimizer_state is a whole optimizer.state_dict(): send its ['state'] entry")
    stats = dict(stats or {})
    bad = [
        key for key, value in stats.items() if isinstance(value, bool) or not isinstance(value, int | float)
    ]
    if bad:
        raise TypeError(f"stats {bad} are not numbers: send only numeric totals (frames, compute_s, ...)")
    weight = float(check_number("weight", weight, 0, int | float))
    signature = tuple((key, tuple(t.shape), t.dtype) for key, t in params.items())
    return _Arrival(params, optimizer_state, stats, weight, _has_adam_moments(optimizer_state), signature)


class ParameterAverager:
    """Asyncio averaging server; create_averager makes it a Ray actor (0 CPUs, on the driver's node)."""

    def __init__(
        self,
        world_size: int,
        *,
        timeout_s: float = 300.0,
        min_learners: int = 1,
        validate_every: int = 0,
        batch_size: int = 32,
        b1: float = 1.0,
        b2: float = 2,
        max_batch_size: int = 576,
        centred_pairs: tuple = (),
    ) -> None:
        self._book = RoundBook(
            world_size, timeout_s=timeout_s, min_learners=min_learners, validate_every=validate_every
        )
        self._batch = AdaptiveBatchSize(batch_size, b1=b1, b2=b2, max_size=max_batch_size)
        self._centred_pairs = tuple(centred_pairs)
        self._latest: tuple[int, dict | None, dict | None] = (0, None, None)  # round, params, optimizer
        self._round_future: asyncio.Future | None = None
        self._validation_future: asyncio.Future | None = None
        self._timer: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._totals: dict[Learner, dict[str, float]] = {}
        self._batch_history: list[dict] = []
        self._validation_history: list[dict] = []
        self._failed_rounds: list[dict] = []
        self._round_seconds: list[float] = []

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # the loop holds only weak references to tasks
        task.add_done_callback(self._tasks.discard)
        return task

    async def _expire(self, opening: int, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        if self._book.phase == "open" and self._book.opening == opening:
            self._start_close()

    def _start_close(self) -> None:
        if self._timer is not None and self._timer is not asyncio.current_task():
            self._timer.cancel()
        self._timer = None
        self._spawn(self._close_round(self._book.close(), self._round_future))

    async def _close_round(self, closed: RoundClose, future: asyncio.Future) -> None:
        try:
            if closed.error is not None:
                raise closed.error
            await self._await_validation()
            result = await asyncio.to_thread(self._compute, closed)
            self._publish(closed, result)
            self._book.finish(ok=True)
            if self._book.validation_due is not None:
                self._validation_future = asyncio.get_running_loop().create_future()
            future.set_result(result)
        except Exception as exc:
            # Handed to every learner of the round (each one's await re-raises it): nobody is left waiting.
            if self._book.phase == "closing":
                self._book.finish(ok=False)
            self._failed_rounds.append({"round": closed.round, "error": repr(exc), "time": time.time()})
            future.set_exception(exc)
        finally:
            self._round_future = None

    async def _await_validation(self) -> None:
        due = self._book.validation_due
        if due is None or self._validation_future is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._validation_future), self._book.timeout_s)
        except asyncio.TimeoutError:
            self._book.miss_validation()
            size = self._batch.size
            self._validation_history.append(
                {"round": due, "accuracy": None, "batch_size": size, "missed": True, "time": time.time()}
            )
            logger.warning(
                "averager: validation of round %d not reported in %g s; B stays %d",
                due,
                self._book.timeout_s,
                size,
            )

    def _compute(self, closed: RoundClose) -> RoundResult:
        """The arithmetic, run in a worker thread so that the event loop keeps answering."""
        arrivals = [arrival for _, arrival in closed.present]
        weights = [arrival.weight for arrival in arrivals]
        params = average_states([a.params for a in arrivals], weights)
        optimizer_state = None
        if arrivals[0].adam:
            states = [a.optimizer_state for a in arrivals]
            optimizer_state = merge_adam_states(states, weights=weights, centred_pairs=self._centred_pairs)
        learners = tuple(learner for learner, _ in closed.present)
        seconds = time.monotonic() - closed.opened_at
        batch = self._batch.size
        return RoundResult(
            closed.round, params, optimizer_state, batch, learners, closed.dropped, seconds, tuple(weights)
        )

    def _publish(self, closed: RoundClose, result: RoundResult) -> None:
        for learner, arrival in closed.present:
            totals = self._totals.setdefault(learner, {"rounds": 0, "averaging_s": 0.0})
            totals["rounds"] += 1
            for key, value in arrival.stats.items():
                totals[key] = totals.get(key, 0) + value
        self._batch_history.append({"round": result.round, "batch_size": result.batch_size})
        self._round_seconds.append(result.seconds)
        self._latest = (result.round, result.params, result.optimizer_state)

    async def join(self, learner: Learner, world_size: int | None = None) -> JoinInfo:
        """Register a learner (again); returns where it starts, after the round open at the call (if any)."""
        self._book.join(learner, world_size)
        waiting_for = self._round_future
        if self._book.complete:
            self._start_close()  # the joiner was the last learner the open round waited for
        if waiting_for is not None:
            await asyncio.wait({waiting_for})  # the round's outcome is its senders' business
        _, params, optimizer_state = self._latest
        next_round, size, adaptive = (
            self._book.next_round_for(learner),
            self._batch.size,
            self._batch.state_dict(),
        )
        return JoinInfo(learner, next_round, params, optimizer_state, size, adaptive, self._book.world_size)

    async def average(
        self,
        learner: Learner,
        round: int,
        world_size: int,
        params: Mapping[str, Tensor],
        optimizer_state: Mapping | None,
        stats: Mapping[str, float] | None = None,
        weight: float = 1.0,
    ) -> RoundResult:
        """Send this learner's round n; returns the round's result once it closes (see the module doc).

        weight: the learner's share in the mean (e.g. samples seen); stats: numeric totals for summary().
        """
        check_learner(learner)
        start = time.monotonic()
        try:
            self._book.check(learner, round, world_size)
            arrival = _arrival(params, optimizer_state, stats, weight)
            first = self._book.first_payload
            # Checked against the round's first arrival, so that a mismatch fails only the learner that
            # sent it (the round goes on without it) rather than the arithmetic failing the whole round.
            if first is not None and (arrival.signature, arrival.adam) != (first.signature, first.adam):
                raise ValueError(
                    f"learner {learner!r} sent params (keys, shapes, dtypes) or an optimizer kind that differ "
                    "from the round's first learner's: every learner must run the same model and optimizer"
                )
            opening = self._book.phase == "idle"
            complete = self._book.arrive(learner, round, world_size, arrival)
            if opening:
                self._round_future = asyncio.get_running_loop().create_future()
                self._timer = self._spawn(self._expire(self._book.opening, self._book.deadline))
            future = self._round_future
            if complete:
                self._start_close()
            return await asyncio.shield(future)
        finally:
            totals = self._totals.setdefault(learner, {"rounds": 0, "averaging_s": 0.0})
            totals["averaging_s"] += time.monotonic() - start

    async def report_validation(self, round: int, accuracy: float, learner: Learner = "validator") -> int:
        """Rank 0's validation accuracy of the averaged model of `round`; returns the batch size decided."""
        check_number("accuracy", accuracy, -math.inf, int | float)
        self._book.report_validation(round, learner)
        before, size = self._batch.size, self._batch.update(accuracy)
        record = {"round": round, "accuracy": float(accuracy), "batch_size": size, "grew": size > before}
        self._validation_history.append({**record, "missed": False, "time": time.time()})
        if self._validation_future is not None and not self._validation_future.done():
            self._validation_future.set_result(size)
        return size

    async def set_world_size(self, world_size: int) -> None:
        """Resize the group (learners must send the new size from now on)."""
        self._book.set_world_size(world_size)

    async def leave(self, learner: Learner) -> None:
        """Remove a learner for good; an open round stops waiting for it."""
        self._book.leave(learner)
        if self._book.complete:
            self._start_close()

    async def latest(self) -> Snapshot:
        """The latest averaged state (round 0, params None before the first round) and its logs."""
        last_round, params, optimizer_state = self._latest
        return Snapshot(
            last_round,
            params,
            optimizer_state,
            self._batch.size,
            self._batch.state_dict(),
            self._book.validation_due,
            tuple(self._book.dropped_log),
            tuple(self._batch_history),
            tuple(self._validation_history),
        )

    async def snapshot_state(self) -> dict[str, Any]:
        """latest() as a plain dict of tensors, numbers and strings: torch.load(weights_only=True) reads it."""
        snapshot = await self.latest()
        return {f.name: getattr(snapshot, f.name) for f in fields(snapshot)}

    async def restore(self, snapshot: Snapshot | Mapping[str, Any]) -> None:
        """Continue from a checkpoint (snapshot_state()'s dict or a Snapshot), e.g. after a crash."""
        if isinstance(snapshot, Mapping):
            snapshot = Snapshot(**snapshot)
        if not isinstance(snapshot, Snapshot):
            raise TypeError(
                f"restore takes snapshot_state()'s dict or a Snapshot, not {type(snapshot).__name__}"
            )
        batch = AdaptiveBatchSize(1)
        batch.load_state_dict(snapshot.adaptive_state)
        self._book.restore(snapshot.round, snapshot.validation_due, snapshot.dropped_log)
        self._batch, self._latest = batch, (snapshot.round, snapshot.params, snapshot.optimizer_state)
        if snapshot.validation_due is not None:
            self._validation_future = asyncio.get_running_loop().create_future()
        self._batch_history = list(snapshot.batch_size_history)
        self._validation_history = list(snapshot.validation_history)

    async def summary(self) -> dict[str, Any]:
        """Per-learner totals of their stats and averaging seconds; drops, membership, B, validations."""
        learners = {learner: dict(totals) for learner, totals in self._totals.items()}
        return {
            "rounds_completed": len(self._round_seconds),
            "next_round": self._book.round,
            "open_round": {"phase": self._book.phase, "arrived": self._book.arrived},
            "world_size": self._book.world_size,
            "learners": learners,
            "total_averaging_s": sum(t["averaging_s"] for t in learners.values()),
            "round_seconds": list(self._round_seconds),
            "dropped": list(self._book.dropped_log),
            "membership": list(self._book.membership_log),
            "failed_rounds": list(self._failed_rounds),
            "batch_size_history": list(self._batch_history),
            "validation_history": list(self._validation_history),
        }


# --------------------------------------------------------------------------------------------- ray glue
def create_averager(
    name: str, *, namespace: str | None = None, max_concurrency: int | None = None, **kwargs: Any
):
    """Start the named ParameterAverager actor on the driver's node, with 0 CPUs and 0 GPUs.

    kwargs go to ParameterAverager (world_size=..., timeout_s=..., ...) and are checked here first, so that
    a bad value fails in the driver. Each waiting average()/join() call holds a concurrency slot, so the
    default leaves room for several per learner.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ParameterAverager(**kwargs)
    if not ray.is_initialized():
        raise RuntimeError("ray is not initialised: call ray.init() (or run inside a Ray job) first")
    driver_node = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    concurrency = max_concurrency or max(64, 4 * kwargs["world_size"] + 16)
    options = {"name": name, "namespace": namespace, "get_if_exists": False, "num_cpus": 0, "num_gpus": 0}
    options.update(scheduling_strategy=driver_node, max_concurrency=concurrency)
    return ray.remote(num_cpus=0)(ParameterAverager).options(**options).remote(**kwargs)


def get_averager(name: str, *, namespace: str | None = None):
    """The handle of a running averager started by create_averager."""
    import ray

    return ray.get_actor(name, namespace=namespace)
