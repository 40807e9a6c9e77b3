"""The averaging data plane on Ray: S shard actors merge the slices; learners put and get through the store.

A learner puts slice i of its flat buffers once (``runtime.ray_store``) and sends the S refs; at a round's
close the control plane calls ``AveragingShard.merge`` (``runtime.averaging_shard``) on shard i with every
learner's slice i (nested, so the control plane never resolves them). The merged slice is the task's
return value, owned by the control plane: it survives the shard, and every learner reads that one object.
Once a channel generation is live, parts are ``Channelled`` markers read from the members' channels and the
merged slice is written to the shard's own. Shard i goes on learner i's node (soft affinity), started on a
thread at the learners' join (``prepare``). Named shards (``ShardNames``) are detached and outlive a
restart of the control plane, which finds them again by name; Ray restarts a lost shard; a lost learner's
node has its shards replaced (``node_lost``), a merge stops waiting for its slices (``forget``); the
control plane merges the slices of a shard starting or restarting (its ``watch`` call fails at its death);
another lost call is made again (``dataplane.shard_calls``); the first merge maps the store ahead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from raytrain_seq.checks import check_number

# Numpy only: a shard's process loads no torch (dataplane.merge says why); FlatPayload is a type here.
from raytrain_seq.dataplane.merge import ShardMerge, merge_parts, part_nbytes
from raytrain_seq.dataplane.shard_calls import answers
from raytrain_seq.members.ids import LearnerId
from raytrain_seq.runtime.averaging_shard import FORGET_POLL_S, AveragingShard

if TYPE_CHECKING:
    from raytrain_seq.dataplane.payload import FlatPayload

logger = logging.getLogger(__name__)

__all__ = ["RayShards", "ShardNames"]

# A merge the control plane cannot do itself, interrupted by the shard's death, is re-run this many times.
MERGE_RETRIES = 3
# The control plane's read of a round's merged slices gives up after this long (their node may be gone).
FETCH_TIMEOUT_S = 120.0
# While a shard starts (or for a dead shard's slice) the control plane merges a round itself only up to
# this many bytes in (every learner's payload): a big model's round would take it longer than a process
# start, and its heap must hold every slice at once.
HERE_MAX_BYTES = 256 * 2**20
# Such a round's slice is merged here too once its shard lags the first to answer this long: a merge sent
# to a process just dead waits for its restart (docs/ARCHITECTURE.md, "Measurements behind the code").
HEDGE_S = 0.25


def _watch(handle: Any) -> Any:
    """A shard's standing ``watch()`` call: not retried, so that it fails once the process dies."""
    return handle.watch.options(concurrency_group="watch", max_task_retries=0).remote()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardNames:
    """The names a pool's shards go by, so that a restarted control plane finds them alive.

    Shard i's n-th actor is ``{prefix}.{i}.{n}`` in ``namespace`` (a lost node's shard is replaced under
    the next n: a killed actor's name is released only later). ``owner``: the control plane's actor name,
    whose end ends the shards (``runtime.averaging_shard``). Made once per run by the driver
    (``create_averager``): a restart of the control plane, which gets the same arguments, has the same
    names."""

    prefix: str
    owner: str
    namespace: str | None = None

    @classmethod
    def of(cls, owner: str, namespace: str | None) -> ShardNames:
        """New names for the shards of the control plane ``owner`` (a run's own: no other run's are taken)."""
        return cls(prefix=f"{owner}.shard.{uuid.uuid4().hex[:12]}", owner=owner, namespace=namespace)

    def name(self, i: int, n: int) -> str:
        return f"{self.prefix}.{i}.{n}"

    def alive(self) -> dict[int, int]:
        """Per shard index, the newest n among the live actors of these names (none: an empty dict)."""
        import ray

        namespace = self.namespace if self.namespace is not None else ray.get_runtime_context().namespace
        newest: dict[int, int] = {}
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = entry["name"]
            if entry["namespace"] == namespace and name.startswith(self.prefix + "."):
                # "{prefix}.3.1": shard 3's second actor.
                i, n = (int(part) for part in name[len(self.prefix) + 1 :].split("."))
                newest[i] = max(newest.get(i, n), n)
        return newest


class RayShards:
    """The pool of ``count`` AveragingShard actors the control plane (an actor) creates: owned by it, or,
    with ``names``, detached and found again by a restarted control plane (``ShardNames``)."""

    def __init__(
        self, count: int, *, here_max_bytes: int = HERE_MAX_BYTES, names: ShardNames | None = None
    ) -> None:
        self.count = check_number("shards", count, 1)
        self.here_max_bytes = here_max_bytes  # the biggest round merged here while a shard starts
        self.names = names
        self._serial: dict[int, int] = {}  # per shard: the n of its actor's name (``ShardNames``)
        self._where: dict[int, Any] = {}  # per shard found alive: its node() call, until answered
        self._nodes: dict[int, str] = {}
        self._handles: list[Any] | None = None
        self._placed: list[str | None] = []  # the node each shard was asked to start on (a soft hint)
        self._up: list[Any] = []  # per shard: its actor's readiness call, done once its process is up
        self._watches: list[Any] = []  # per shard: its standing watch() call, done only if it dies
        self._forgotten: dict[int, set[Any]] = {}  # per round: lost learners' slices (``_read_here``)
        self._starting = threading.Lock()  # prepare()'s thread and the caller's both may start the actors

    def place(self, learner: LearnerId, node: str | None) -> None:
        if node is not None and isinstance(learner, int):
            self._nodes[learner] = node

    def _ensure(self) -> list[Any]:
        with self._starting:
            if self._handles is None:
                found: set[int] = set()
                if self.names is not None:  # a restarted control plane takes its shards back
                    self._serial = self.names.alive()
                    found = set(self._serial)
                started = [self._start(i) for i in range(self.count)]
                # Where those found alive run is learned in node_lost (``_placed_now``).
                self._where = {i: started[i][0].node.remote() for i in found if i < self.count}
                self._placed = [node for _, node in started]
                self._up = [handle.__ray_ready__.remote() for handle, _ in started]
                self._watches = [_watch(handle) for handle, _ in started]
                self._handles = [handle for handle, _ in started]
            return self._handles

    def _start(self, i: int) -> tuple[Any, str | None]:
        """Shard i's actor, on learner i's node when known, else on a known learner's node (soft)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        known = [self._nodes[k] for k in sorted(self._nodes)]
        # One byte of Ray's logical memory: Ray places an actor that asks for no resource on any node,
        # its soft node affinity ignored (ray-project/ray#25344 mended the hard case only); asking for
        # something, the shard goes where the hint says while that node lives.
        options: dict[str, Any] = {
            "num_cpus": 0, "memory": 1, "max_restarts": -1, "max_task_retries": MERGE_RETRIES,
        }  # fmt: skip
        node = self._nodes.get(i) or (known[i % len(known)] if known else None)
        if node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=True)
        # forget() runs beside a merge, in a group of its own; merge, node() and the rest stay one at a
        # time, in order (dataplane.shard_calls counts on it).
        actor = ray.remote(concurrency_groups={"control": 1, "watch": 1})(AveragingShard)
        if self.names is None:
            return actor.options(**options).remote(i), node
        # Detached, so that it outlives this control plane's process; a live actor of that name is taken.
        names = self.names
        options.update(name=names.name(i, self._serial.setdefault(i, 0)), namespace=names.namespace)
        options.update(lifetime="detached", get_if_exists=True)
        return actor.options(**options).remote(i, (names.owner, names.namespace)), node

    def prepare(self) -> None:
        """Start the actors on a thread of their own: creating them holds the calling thread for a while
        on a busy node, and the caller (the control plane's loop, a restarted one's constructor) takes
        the learners' joins meanwhile. A failure is logged; the next call that needs the shards raises it."""
        threading.Thread(target=self._start_ahead, name="shards-start", daemon=True).start()

    def _start_ahead(self) -> None:
        try:
            self._ensure()
        except Exception:
            logger.exception("the shard actors could not be started ahead: the next round starts them")

    def node_lost(self, node: str) -> list[int]:
        """Replace the shards placed on ``node`` now. Ray restarts an actor whose node died only once it
        has declared the node dead (missed heartbeats, seconds), and a merge sent to it waits that long;
        a shard holds no state, so a new actor on a live learner's node takes its calls at once
        (``_answers`` makes a lost call again on the current handle). The old actor is ended for good.
        A learner's process can die on a node that lives: its shards are then restarted for nothing, a
        process start off the learners' path."""
        import ray

        self._nodes = {k: v for k, v in self._nodes.items() if v != node}
        with self._starting:  # a start in flight (prepare's thread) places its shards first
            if self._handles is None:
                return []
            self._placed_now()
            replaced = [i for i, placed in enumerate(self._placed) if placed == node]
            for i in replaced:
                ray.kill(self._handles[i], no_restart=True)
                self._where.pop(i, None)  # the ended actor's node() answer is not the replacement's
                if self.names is not None:
                    self._serial[i] += 1  # the killed actor's name is not free yet
                handle, self._placed[i] = self._start(i)
                self._handles[i] = handle
                self._up[i], self._watches[i] = handle.__ray_ready__.remote(), _watch(handle)
            return replaced

    def _placed_now(self) -> None:
        """The nodes of the shards found alive (``ShardNames``) whose node() answered: they were placed by
        the control plane before a restart, on its learners' nodes then. One that died before it answered
        keeps the hint (Ray restarts it where it can)."""
        import ray

        if not self._where:
            return
        answered, _ = ray.wait(list(self._where.values()), num_returns=len(self._where), timeout=0)
        for i in [i for i, ref in self._where.items() if ref in answered]:
            ref = self._where.pop(i)
            try:
                self._placed[i] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                logger.info("shard %d died before it said where it runs (%s): placed as hinted", i, exc)

    def _down(self) -> set[int]:
        """The shards whose process is not up: starting (readiness unanswered), or dead since the last look
        (its watch failed: readiness asked again, a new watch sent; the restarted process answers both)."""
        import ray

        handles = self._ensure()
        failed, _ = ray.wait(self._watches, num_returns=len(self._watches), timeout=0)
        for i in [i for i, ref in enumerate(self._watches) if ref in failed]:
            self._up[i], self._watches[i] = handles[i].__ray_ready__.remote(), _watch(handles[i])
        ready, _ = ray.wait(self._up, num_returns=len(self._up), timeout=0)
        return {i for i, ref in enumerate(self._up) if ref not in ready}

    def forget(self, round: int, payload: FlatPayload) -> None:
        """Every shard stops waiting for its slice of ``payload`` in ``round`` (``AveragingShard.forget``;
        not awaited). The reference travels nested in a list, so the shard does not resolve it."""
        import ray

        self._forgotten = {r: p for r, p in self._forgotten.items() if r >= round - 2}
        for handle, part in zip(self._ensure(), payload.parts, strict=True):
            if isinstance(part, ray.ObjectRef):  # a channel's marker is read with its own timeout
                handle.forget.options(concurrency_group="control").remote(round, [part])
                self._forgotten.setdefault(round, set()).add(part)

    async def fetch(self, refs: Sequence[Any]) -> list[Any]:
        # Awaited, not ray.get: the control plane is an async actor, whose event loop must keep answering.
        return list(await asyncio.wait_for(asyncio.gather(*refs), FETCH_TIMEOUT_S))

    def handles(self) -> list[Any]:
        """The shard actors (created on first use): the fault tests kill one."""
        return self._ensure()

    async def merge(
        self,
        round: int,
        payloads: Sequence[FlatPayload],
        weights: Sequence[float],
        timeout_s: float | None = None,
        write: bool = False,
    ) -> ShardMerge:
        import ray

        shards = self._ensure()
        stored = all(isinstance(part, ray.ObjectRef) for p in payloads for part in p.parts)
        # A round this process can merge takes no shard's call while it starts or restarts (``_down``) and
        # waits for none that fails or lags (``HEDGE_S``): that slice is merged here (``_slice_here``).
        here = stored and not write and sum(p.layout.nbytes for p in payloads) <= self.here_max_bytes
        retries = {"max_task_retries": 0} if here else {}

        def submit(i: int) -> Any:
            return (
                shards[i]  # the current handle: node_lost may replace it between two calls
                .merge.options(num_returns=2, **retries)
                .remote(round, [p.parts[i] for p in payloads], list(weights), len(payloads), timeout_s, write)
            )

        def fallback(i: int) -> Awaitable[tuple[Any, dict]]:
            return self._slice_here(i, round, payloads, weights, timeout_s)

        # A merge waits up to timeout_s for the slices, for the channels' reads and for its write.
        wait_s = 3 * timeout_s + FETCH_TIMEOUT_S if timeout_s is not None else math.inf
        down = self._down() if here else set()
        calls, loads = await self._answers(
            "merge()", submit, give_up_s=wait_s, fallback=fallback if here else None,
            local=down, hedge_s=HEDGE_S if here else None,
        )  # fmt: skip
        for i in {load["shard"] for load in loads if load.get("here")} - down:  # it failed or lagged:
            self._up[i] = shards[i].__ray_ready__.remote()  # down until its process answers (``_down``)
        if any(load.get("lost_channels") for load in loads):
            return ShardMerge(loads=tuple(loads), lost_channels=True)
        unreadable = frozenset(i for load in loads for i in load.get("unreadable", ()))
        if unreadable:
            return ShardMerge(loads=tuple(loads), unreadable=unreadable)
        if all(load.get("channelled") for load in loads):
            return ShardMerge(loads=tuple(loads), channelled=True)
        if any(load.get("channelled") for load in loads):
            # Some shards wrote into the channels and some could not (the generation is ending): the
            # learners read every slice from the store, so the written ones are asked for again.
            calls = [
                (merged, None) if not load.get("channelled") else (shard.result.remote(round), None)
                for (merged, _), load, shard in zip(calls, loads, shards, strict=True)
            ]
        return ShardMerge(tuple(merged for merged, _ in calls), tuple(loads))

    async def _slice_here(
        self,
        i: int,
        round: int,
        payloads: Sequence[FlatPayload],
        weights: Sequence[float],
        timeout_s: float | None,
    ) -> tuple[Any, dict]:
        """Slice i merged in this process while shard i's process starts or restarts, rather than waited
        for, with the shards' ``merge_parts``: the merged slice's reference (in the store) and the load,
        as the shard's ``merge`` returns them (None and ``load["unreadable"]``: a learner's slice is
        lost, forgotten or late, as a shard names it). Its bytes go through this actor, the hub the shards
        exist to spare (``hub_load``'s "control"), for those rounds only."""
        import ray

        began = time.perf_counter()
        arrays, unreadable = await self._read_here(i, round, payloads, timeout_s)
        load: dict[str, Any] = {"shard": i, "round": round, "received": 0, "sent": 0, "here": True}
        if unreadable:
            return None, {**load, "unreadable": unreadable, "seconds": time.perf_counter() - began}
        merged = merge_parts(arrays, list(weights))
        load.update(
            received=sum(part_nbytes(part) for part in arrays), sent=part_nbytes(merged) * len(payloads)
        )
        return ray.put(merged), {**load, "seconds": time.perf_counter() - began}

    async def _read_here(
        self, i: int, round: int, payloads: Sequence[FlatPayload], timeout_s: float | None
    ) -> tuple[list[Any], list[int]]:
        """Every learner's slice i, or the learners whose slices are lost, forgotten (``forget``: their
        learner was lost) or not readable within ``timeout_s``, as a shard names them."""
        from ray.exceptions import RayError

        reads = {asyncio.ensure_future(p.parts[i]): j for j, p in enumerate(payloads)}  # learner j's slice
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        pending, failed = set(reads), set()
        try:
            while pending and not failed:
                forgotten = self._forgotten.get(round, set())  # read each pass: forget() runs beside this
                failed = {j for f, j in reads.items() if f in pending and payloads[j].parts[i] in forgotten}
                left = min(FORGET_POLL_S, deadline - time.monotonic())
                if left <= 0:
                    failed |= {reads[f] for f in pending}  # not readable within the round's timeout
                if failed:
                    break
                done, pending = await asyncio.wait(pending, timeout=left)
                for f in done:
                    if isinstance(f.exception(), RayError):  # lost with its owner (a learner's node)
                        failed.add(reads[f])
                    elif f.exception() is not None:
                        raise f.exception()
        finally:
            for f in pending:
                f.cancel()
        return ([], sorted(failed)) if failed else ([f.result() for f in reads], [])

    # Channels (dataplane.generations): what the control plane needs from the shards for a generation.
    supports_channels = True

    async def targets(self) -> list[tuple[Any, str]]:
        """Per shard, (its handle, its node): where every member's channel to it goes."""
        handles = self._ensure()
        _, nodes = await self._answers("node()", lambda i: (handles[i].node.remote(),))
        return list(zip(handles, nodes, strict=True))

    async def results(self, round: int) -> list[Any]:
        """Each shard's copy of ``round``'s merged slice, which it wrote into its channel (``result``):
        for the control plane when reading it from the channels failed. ChannelLost when a shard no
        longer has it (it merged a newer round, or Ray restarted it)."""
        from raytrain_seq.dataplane.generations import ChannelLost

        handles = self._ensure()
        _, parts = await self._answers("result()", lambda i: (handles[i].result.remote(round),))
        missing = [i for i, part in enumerate(parts) if part is None]
        if missing:
            raise ChannelLost(f"shards {missing} no longer hold round {round}'s merged slice")
        return parts

    async def _answers(
        self,
        what: str,
        submit: Callable[[int], Any],
        give_up_s: float = FETCH_TIMEOUT_S,
        **options: Any,
    ) -> tuple[list[Any], list[Any]]:
        """Every shard's answer to ``submit(i)``, a call made again (or ``fallback(i)`` awaited) where it
        was lost (``dataplane.shard_calls.answers``: when and why, and its ``options``)."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError

        handles = self._ensure()  # the list node_lost replaces handles in: a ping goes to the current one
        return await answers(
            what,
            self.count,
            submit,
            lambda i: handles[i].node.remote(),
            # Dead: a shard node_lost ended; its call is made again on the shard that replaced it.
            retry_on=(ActorUnavailableError, ActorDiedError),
            give_up_s=give_up_s,
            **options,
        )

    async def open_channels(
        self,
        generation: int,
        inputs: list[list[Any]],
        readers: list[tuple[Any, str]],
        nbytes: Sequence[int],
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Open generation ``generation`` on every shard (each waits for its readers at most
        ``timeout_s``: ``AveragingShard.open_channels``); shard i's channel of merged slices at i.

        A reader on shard i's node is named to it by shard i's own handle: a channel counts its readers
        on the writer's node and never calls them, and a shard that unpickled a learner's handle would
        load the learner's class, and torch with it (``runtime.channels.for_readers`` says what that
        cost). A reader on another node is named by its own handle: the channel has it make its copy of
        the buffer there."""
        # The shards' nodes as they are now (a shard Ray restarted since the plan may have moved).
        targets = await self.targets()

        def submit(i: int) -> Any:
            shard, node_i = targets[i]
            named = [(shard if node == node_i else handle, node) for handle, node in readers]
            return (shard.open_channels.remote(generation, inputs[i], named, nbytes[i], timeout_s),)

        wait_s = (timeout_s or 0.0) + FETCH_TIMEOUT_S
        _, channels = await self._answers("open_channels()", submit, give_up_s=wait_s)
        return channels
