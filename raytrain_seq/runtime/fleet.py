"""The learners as a fleet of Ray actors, one per slot, and the driver's supervisor of them.

``LearnerProcess`` is one learner slot's process: its constructor starts the slow start-up (torch, the
device Ray gave it, the feed and averager handles, the client, the model) on a thread, so that Ray's
restart of a dead actor in place (``max_restarts``) brings a replacement up alone, and ``ready()`` says
the process is placed; ``run(group)`` waits for the start-up and trains until the end.
``LearnerFleet`` (the driver's) creates an actor per slot up to ``train.max_learners`` (a pending one is
demand the autoscaler sees), starts the first group with the ready ones, starts each later one alone
(``run(None)``: it joins the running group at a round boundary), tells the averager at once when a
learner's process is lost (``lose``), and ends when rank 0's final metrics came back and the others'
runs returned. No barrier between learners: the rank 0 of a checkpoint round puts it into the run folder
(``checkpoint.put``), and a ``CheckpointError`` there comes back as a ``LearnerStop`` that stops all.
A slot's incarnations, nodes and losses are recorded (``LearnerFleet.slots``: the summary keeps them).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from raytrain_seq import checkpoint
from raytrain_seq.config import RunSetupError
from raytrain_seq.outputs.reports import LearnerReport, LearnerStop, RoundMetrics
from raytrain_seq.parts import LearnerSettings
from raytrain_seq.runtime.connect import DEATH_AT_ONCE_ENV
from raytrain_seq.runtime.launch import LearnerLaunch

logger = logging.getLogger(__name__)

LEARNER_THREADS = 4  # a learner actor's call threads: run(), and Ray's own calls on it beside it
# On a cluster that keeps Ray's grace for the cause of a death (``connect.DEATH_AT_ONCE``; KubeRay sets it
# to 0 for Ray Serve), the learners' runtime env sets it to 0 for them alone: a learner whose averager died
# defers its round and trains on at once, not a grace later (docs/ARCHITECTURE.md, "Measurements behind
# the code"). The price: a learner's process is never a worker that Ray prestarted.
LEARNER_ENV = {DEATH_AT_ONCE_ENV: "0"}

__all__ = [
    "LEARNER_ENV",
    "FleetSettings",
    "LearnerFleet",
    "LearnerProcess",
    "SlotRecord",
    "first_group_size",
    "put_checkpoint",
]


# ------------------------------------------------------------------------------------ learner actor
class LearnerProcess:
    """One learner slot's process (a Ray actor once ``ray.remote`` is applied: ``LearnerFleet``)."""

    def __init__(self, settings: LearnerSettings, launch: LearnerLaunch, slot: int) -> None:
        import ray

        self.slot, self.launch, self.settings = slot, launch, settings
        self.incarnation = uuid.uuid4().hex  # this process: a restarted actor gets a new one
        self.node = ray.get_runtime_context().get_node_id()
        # The slow start-up runs beside the actor's calls: ready() answers once the process is placed (what
        # train.worker_start_timeout_s bounds), and run() waits for the start-up, raising its error.
        self._built: Future = Future()
        threading.Thread(target=self._start_up, name="learner-start-up", daemon=True).start()

    def _start_up(self) -> None:
        """torch, the device Ray gave this actor, the feed and averager handles, the client, the model."""
        try:
            self._built.set_result(self._build())
        except BaseException as exc:  # raised again by run(), in the actor's call
            self._built.set_exception(exc)

    def _build(self) -> Any:
        import ray

        from raytrain_seq.runtime.feed import get_feed
        from raytrain_seq.runtime.learner import Learner
        from raytrain_seq.runtime.learner_feed import LearnerFeed
        from raytrain_seq.runtime.logs import quiet_learner
        from raytrain_seq.runtime.metrics import LearnerMetrics
        from raytrain_seq.training.heap import keep_freed_memory

        entered, settings, launch, slot = time.time(), self.settings, self.launch, self.slot
        run_dir = Path(settings.run_dir)  # the driver's Parts.of a named Config: never None here
        if settings.keep_freed_memory:
            keep_freed_memory()  # every step reallocates what the last one freed (heap.py)
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        quiet_learner(settings.verbose)  # Ray's own INFO lines (runtime/logs.py)
        self.device = _device(ray.get_gpu_ids())
        self.feed = get_feed(launch.feed, namespace=launch.namespace)
        self.client = _client(settings, launch, slot, self.incarnation, self.device)
        put = functools.partial(put_checkpoint, run_dir=run_dir, keep=settings.keep_checkpoints)
        # The rank and world size are the group's, set by run() (a newcomer's come from its join).
        learner = Learner(
            settings, rank=0, world_size=1, device=self.device, client=self.client,
            feed=LearnerFeed(self.feed, epochs=settings.max_epochs), report=put, keep_final=put,
            # The run folder is where rank 0 puts this run's checkpoints (storage every node sees).
            checkpoint_seed=lambda: _latest_state(run_dir),
            metrics=LearnerMetrics(slot), validate=not launch.evaluator,  # an evaluator validates
        )  # fmt: skip
        learner.marks["loop_entered"] = entered
        return learner

    def ready(self) -> dict[str, Any]:
        """This process is up: its slot, incarnation, node and pid (cheap: the start-up runs beside it)."""
        return {"slot": self.slot, "incarnation": self.incarnation, "node": self.node, "pid": os.getpid()}

    def run(self, group: tuple[int, ...] | None) -> LearnerReport | LearnerStop | None:
        """Train to the end. ``group``: the first group's slots (this learner's rank is its index there);
        None: a newcomer or replacement, whose rank and group come from its join (a round boundary).

        Returns rank 0's final metrics, a ``LearnerStop`` when a checkpoint could not be written (the
        driver then stops every learner), or None (any other rank)."""
        import ray
        import torch

        rank = None if group is None else group.index(self.slot)
        world_size = None if group is None else len(group)
        logging.getLogger().setLevel(logging.INFO if rank == 0 else logging.WARNING)
        # A fresh run's epoch 0 starts now, while the model may still be built (the feed launches it
        # once); a later learner's epoch is the averager's.
        feed = self.feed if self._built.done() else None
        if feed is None:
            from raytrain_seq.runtime.feed import get_feed

            feed = get_feed(self.launch.feed, namespace=self.launch.namespace)
        started = feed.start.remote(world_size) if rank == 0 and self.launch.fresh else None
        learner = self._built.result()  # raises what the start-up raised
        learner.rank, learner.world_size, self.client.world_size = rank, world_size, world_size
        # Per thread: this call's thread steps (intra-op threads, the current CUDA device).
        torch.set_num_threads(self.launch.torch_threads)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        try:
            if started is not None:
                ray.get(started)  # raises here what the feed raised
            return learner.run()
        except checkpoint.CheckpointError as exc:
            # Only the learner that put the checkpoint raises it: its stop reaches the driver, which
            # stops the others and raises it (checkpoint.stopped_error).
            logger.error("learner slot %d stops: %s", self.slot, exc)
            return LearnerStop(reason="checkpoint", message=str(exc))


def put_checkpoint(metrics: RoundMetrics, folder: Path | None, *, run_dir: Path, keep: int | None) -> None:
    """A learner's ``report``: a checkpoint round's rank 0 hands the folder and puts it into the run
    folder (``checkpoint.put``, pruned to ``keep``); the others hand None and wait for nothing. A write
    that fails raises ``CheckpointError`` in that learner alone."""
    if folder is not None:
        checkpoint.put(folder, run_dir, metrics.round, keep=keep)


def _device(gpu_ids: list) -> Any:
    """The CUDA device Ray gave this actor (it sees only its own: index 0), else the CPU. Made the
    current device, so that pinned copies and new CUDA tensors land there."""
    import torch

    if gpu_ids and torch.cuda.is_available():
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _client(
    settings: LearnerSettings, launch: LearnerLaunch, slot: int, incarnation: str, device: Any
) -> Any:
    """The learner's ``AveragerClient``: learner id = its slot, this process's incarnation."""
    import ray

    from raytrain_seq.members.retry import Backoff
    from raytrain_seq.rounds.client import AveragerClient
    from raytrain_seq.runtime.averager import get_averager
    from raytrain_seq.runtime.channels import RayChannelEnds
    from raytrain_seq.runtime.probes import handle_bytes
    from raytrain_seq.runtime.ray_store import RayStore
    from raytrain_seq.runtime.transport import RayTransport

    # A round's send waits for the others (<= timeout) and for a validation (<= timeout) at most.
    timeout_s = 3 * settings.averager_timeout_s + 120.0
    transport = RayTransport(get_averager(launch.averager, namespace=launch.namespace))
    return AveragerClient(
        transport,
        learner=slot,
        world_size=None,  # the group's: run() sets it
        incarnation=incarnation,
        round_timeout_s=timeout_s,
        # A pause ends once a restarted averager takes calls (until_back); a short cap keeps a call that
        # failed for another reason from sleeping long after the averager answers again.
        backoff=Backoff(base_s=0.25, cap_s=1.0, budget_s=120.0),
        sleep=transport.until_back,  # a pause cut short once a restarted averager takes calls
        store=RayStore(timeout_s=timeout_s, cuda=device.type == "cuda"),
        node=ray.get_runtime_context().get_node_id(),  # the averager places a shard on this node
        # Probed by the averager when a round waits; pickled, so that its loop does not unpickle it.
        process=handle_bytes(ray.get_runtime_context().current_actor),
        channels=RayChannelEnds() if settings.averager_channels else None,
        away=transport.away,  # a restarting averager: the learner trains on, or waits, without calling it
    )


def _latest_state(run_dir: Path) -> Any:
    """The newest loadable checkpoint's state, as a seed for an averager that holds nothing."""
    found = checkpoint.load_latest(run_dir)
    return None if found is None else found.state


# -------------------------------------------------------------------------------------- supervisor
@dataclasses.dataclass(frozen=True, kw_only=True)
class FleetSettings:
    """What the supervisor reads of ``train`` (and the driver's resource choice)."""

    min_learners: int
    max_learners: int
    max_failures: int
    """Learner losses the run survives (-1: any); also each actor's ``max_restarts``."""
    start_timeout_s: float
    """``train.worker_start_timeout_s``: the wait for the first group, and for min_learners again."""
    poll_interval_s: float
    """``train.poll_interval_s``: the supervisor's ``ray.wait`` timeout."""
    gpus: float = 0.0
    """Each learner's GPU share (0: CPU learners)."""
    resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Extra Ray resources each learner holds (``driver.run``'s learner_resources)."""
    env_vars: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(LEARNER_ENV))
    """The learners' runtime env's variables; empty: none (the cluster fails calls at once itself)."""


@dataclasses.dataclass
class SlotRecord:
    """One slot's history: each process that came up in it, where, and its losses."""

    slot: int
    incarnations: list[str] = dataclasses.field(default_factory=list)
    nodes: list[str] = dataclasses.field(default_factory=list)
    losses: int = 0
    started: list[float] = dataclasses.field(default_factory=list)  # time.time() of each ready()
    causes: list[str] = dataclasses.field(default_factory=list)  # each loss's error, on one line

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "restarts": max(0, len(self.incarnations) - 1)}


def _brief(exc: BaseException, limit: int = 600) -> str:
    """An error on one line, cut to ``limit`` characters: why Ray says an actor died (its node, its
    process's exit, the memory monitor) comes a few lines into a message that runs to a page."""
    line = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def first_group_size(nodes: list[Mapping[str, Any]], need: Mapping[str, float], low: int, high: int) -> int:
    """How many learners the alive nodes' resources hold, within [low, high] (Ray Train's elastic policy
    counted so too). Two nodes of {CPU: 1, slot: 1} and a head of {CPU: 3} hold 2 of {CPU: 1, slot: 1}."""
    held = 0
    wanted = {k: v for k, v in need.items() if v > 0}
    for node in nodes:
        if node.get("Alive", True):
            have = node.get("Resources", {})
            held += int(min(have.get(k, 0.0) // v for k, v in wanted.items())) if wanted else high
    return max(low, min(high, held))


class LearnerFleet:
    """The driver's supervisor of the learner actors (the module docstring)."""

    def __init__(
        self,
        settings: FleetSettings,
        *,
        learner: LearnerSettings,
        launch: LearnerLaunch,
        averager: Any,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.learner, self.launch, self.averager = settings, learner, launch, averager
        self.clock = clock
        self.handles: dict[int, Any] = {}
        self.slots = {slot: SlotRecord(slot) for slot in range(settings.max_learners)}
        self._ready: dict[Any, int] = {}  # ready() refs of processes coming up -> slot
        self._running: dict[Any, int] = {}  # run() refs -> slot
        self._lose: list[Any] = []  # averager.lose() refs, checked as they return
        self.losses = 0
        self.final: LearnerReport | None = None
        self._short_since: float | None = None  # since when fewer than min_learners run
        self._again: dict[int, float] = {}  # slots restarting -> when to ask their ready() again

    # ------------------------------------------------------------------------------------ start
    def start(self) -> tuple[int, ...]:
        """Create an actor per slot, wait for the first group (as many as the cluster holds, at least
        ``min_learners``, within ``start_timeout_s``) and start it; returns its slots."""
        import ray

        settings = self.settings
        remote = ray.remote(LearnerProcess)
        need = {"CPU": 1.0, "GPU": settings.gpus, **settings.resources}
        target = first_group_size(ray.nodes(), need, settings.min_learners, settings.max_learners)
        runtime_env = {"env_vars": dict(settings.env_vars)} if settings.env_vars else None
        if runtime_env is not None:
            logger.info(
                "learners start with a runtime env of their own (%s): exporting it before `ray start` on "
                "every node, as cluster.yaml does, spares them that env",
                ", ".join(f"{k}={v}" for k, v in settings.env_vars.items()),
            )
        for slot in range(settings.max_learners):
            self.handles[slot] = remote.options(
                num_cpus=1, num_gpus=settings.gpus, resources=dict(settings.resources) or None,
                max_restarts=settings.max_failures, max_task_retries=0,
                # run() holds one thread for the whole run: others serve what Ray calls on the actor
                # meanwhile (a channel's set-up on a reader's node runs there), as Ray Train's workers did.
                max_concurrency=LEARNER_THREADS, runtime_env=runtime_env,
            ).remote(self.learner, self.launch, slot)  # fmt: skip
            self._ready[self.handles[slot].ready.remote()] = slot
        deadline = self.clock() + settings.start_timeout_s
        up: list[int] = []
        while len(up) < target and self.clock() < deadline:
            done, _ = ray.wait(list(self._ready), num_returns=1, timeout=max(0.0, deadline - self.clock()))
            for ref in done:
                slot = self._ready.pop(ref)
                if self._came_up(slot, ref, starting=True):
                    up.append(slot)
        if len(up) < settings.min_learners:
            self.shutdown()
            raise RunSetupError(
                f"{len(up)} of the {settings.min_learners} learners (at least) started within "
                f"train.worker_start_timeout_s={settings.start_timeout_s:g} s: the cluster has no room for "
                "them (each holds one CPU, its GPU share and the learner resources); raise "
                "--worker-start-timeout-s for nodes that start slowly, or lower --learners"
            )
        group = tuple(sorted(up))
        for slot in group:
            self._running[self.handles[slot].run.remote(group)] = slot
        logger.info("learners %s started (slots of %d)", list(group), settings.max_learners)
        return group

    def _came_up(self, slot: int, ref: Any, *, starting: bool = False) -> bool:
        """Record a ready() answer; True when the process is up. A constructor that raised fails the run;
        a process lost while it started is a loss (Ray restarts it: ready() is asked again)."""
        import ray

        try:
            info = ray.get(ref)
        except ray.exceptions.ActorUnavailableError:
            # Ray is restarting the process (its loss was counted when its run failed): ask again soon.
            self._again[slot] = self.clock() + self.settings.poll_interval_s
            return False
        except ray.exceptions.RayActorError as exc:
            if exc.actor_init_failed:
                self.shutdown()
                raise RuntimeError(f"learner slot {slot} could not start: {exc}") from exc
            self._lost(slot, exc, incarnation=None)
            return False
        record = self.slots[slot]
        record.incarnations.append(info["incarnation"])
        record.nodes.append(info["node"])
        record.started.append(time.time())
        if not starting:
            logger.warning("learner slot %d is up on node %s: it joins the group", slot, info["node"][:8])
        return True

    # -------------------------------------------------------------------------------- supervise
    def supervise(self) -> LearnerReport | LearnerStop:
        """Until rank 0's final metrics came back and the other runs returned (or a stop, or an error)."""
        import ray

        settings = self.settings
        ended_at: float | None = None
        while self._running or (self.final is None and (self._ready or self._again)):
            self._ask_again()
            refs = [*self._running, *self._ready, *self._lose]
            if not refs:  # only restarting slots: their ready() is asked again after the interval
                time.sleep(settings.poll_interval_s)
                continue
            done, _ = ray.wait(refs, num_returns=1, timeout=settings.poll_interval_s)
            if done:
                done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in done:
                stop = self._settle(ref)
                if stop is not None:
                    return stop
            if self.final is not None:
                ended_at = ended_at if ended_at is not None else self.clock()
                if self.clock() - ended_at > settings.start_timeout_s:
                    logger.warning(
                        "learner slots %s did not return within %g s of the final metrics: stopped",
                        sorted(self._running.values()), settings.start_timeout_s,
                    )  # fmt: skip
                    break
            else:
                self._check_enough()
        if self.final is None:
            raise RuntimeError(
                "every learner returned without rank 0's final metrics: see the learners' log lines"
            )
        return self.final

    def _settle(self, ref: Any) -> LearnerStop | None:
        """Act on one returned ref: a process up, a run returned or failed, a lose() answered."""
        import ray

        if ref in self._ready:
            slot = self._ready.pop(ref)
            if self._came_up(slot, ref) and self.final is None:
                self._running[self.handles[slot].run.remote(None)] = slot
            return None
        if ref in self._lose:
            self._lose.remove(ref)
            try:
                logger.info("averager.lose: %s", ray.get(ref))
            except ray.exceptions.RayActorError as exc:  # the averager restarts: learners rejoin it
                logger.warning("the averager could not be told of a lost learner: %s", exc)
            return None
        slot = self._running.pop(ref)
        try:
            value = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            incarnations = self.slots[slot].incarnations
            self._lost(slot, exc, incarnation=incarnations[-1] if incarnations else None)
            return None
        if isinstance(value, LearnerStop):
            return value
        if isinstance(value, LearnerReport):
            self.final = value
        return None

    def _ask_again(self) -> None:
        """ready() again of the restarting slots whose wait is over."""
        now = self.clock()
        for slot in [s for s, at in self._again.items() if at <= now and self.final is None]:
            del self._again[slot]
            self._ready[self.handles[slot].ready.remote()] = slot

    def _lost(self, slot: int, exc: BaseException, *, incarnation: str | None) -> None:
        """A slot's process died: the averager stops waiting for it at once, Ray restarts it (ready()
        is asked again, and a replacement starts alone); past ``max_failures`` losses the run fails."""
        self.losses += 1
        self.slots[slot].losses += 1
        self.slots[slot].causes.append(_brief(exc))
        if incarnation is not None:
            self._lose.append(self.averager.lose.remote(slot, incarnation))
        limit = self.settings.max_failures
        logger.warning("learner slot %d lost (%d so far): %s", slot, self.losses, exc)
        if limit != -1 and self.losses > limit:
            self.shutdown()
            raise RuntimeError(
                f"{self.losses} learner losses exceed train.max_failures={limit} (the last: slot {slot}, "
                f"{exc}): raise --max-failures, or see why the learners' nodes die"
            ) from exc
        if self.final is None:
            self._ready[self.handles[slot].ready.remote()] = slot

    def _check_enough(self) -> None:
        """Fewer than ``min_learners`` running for ``start_timeout_s`` fails the run."""
        settings = self.settings
        if len(self._running) >= settings.min_learners:
            self._short_since = None
            return
        now = self.clock()
        self._short_since = self._short_since if self._short_since is not None else now
        if now - self._short_since > settings.start_timeout_s:
            self.shutdown()
            raise RuntimeError(
                f"only {len(self._running)} learners ran for {settings.start_timeout_s:g} s "
                f"(train.worker_start_timeout_s), fewer than train.min_learners={settings.min_learners}: "
                "the cluster lost the room for them; add nodes, or lower the MIN of --learners MIN:MAX"
            )

    # ------------------------------------------------------------------------------------- end
    def shutdown(self) -> None:
        """End every learner actor (no restart: the run is over)."""
        import ray

        for handle in self.handles.values():
            ray.kill(handle, no_restart=True)
        self._running.clear()
        self._ready.clear()

    def records(self) -> dict[str, Any]:
        """Per slot, its incarnations, nodes, losses and restarts (the summary's ``learner_slots``)."""
        return {str(slot): record.as_dict() for slot, record in self.slots.items()}
