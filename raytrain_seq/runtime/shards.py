"""The averaging data plane on Ray: S shard actors merge the slices; learners put and get through the store.

``ParameterAverager`` stays the one control plane (membership, B, position, checkpoints, drop and rejoin);
the bytes never pass through it. A learner puts slice i of its flat buffers in the object store once
(``RayStore.put``) and sends the S references; when a round closes the control plane calls
``AveragingShard.merge`` on shard i with the references to every learner's slice i (nested in a list, so
Ray does not resolve them in the control plane: the shard reads them itself, zero-copy where they are on
its node). The merged slice is the task's return value, so it lives in the object store once, owned by
the caller (the control plane): it survives the shard actor, and every learner reads that one object
(``RayStore.get``). With S = number of learners each shard handles about one learner's bytes in and out
per round, as in a reduce-scatter + all-gather, where the star's single actor handled 2 P of them.

A learner frozen just after it sent its round (a stall, a swapped-out host) owns slices that a shard on
another node cannot read until it thaws, although every learner has arrived; a learner whose node died
took its slices with it. So a shard waits for its slices at most the round's timeout and otherwise names
the unreadable or lost ones instead of merging (``ShardMerge.unreadable``); the control plane drops
those learners and merges the others again.

Placement: shard i goes to the node of learner i (``NodeAffinitySchedulingStrategy(soft=True)``: another
node when that one is gone), known from the learners' joins; the actors are created once the group's learners (or S of them) have
joined (``prepare``), so that their start-up overlaps the first round's training.
Shards hold no state between rounds that a merge depends on (a shard keeps its last result's arrays
only to write the next one into them): a merge is a pure function of the learners' slices, which the
learners hold (their ``average`` call is waiting) until the round's answer. So a lost shard needs no
re-seeding: Ray restarts the actor (``max_restarts=-1``) and re-runs the interrupted merge on it
(``max_task_retries``), and the control plane keeps the latest averaged state (its object references;
the learners hold it in tensors and re-seed a restarted control plane with it).

Object loss: the merged slices live on the shards' nodes, which are learners' nodes. The control plane
reads each round's merged state once into its own process, off the learners' path (a copy on its node,
which Ray also uses to recover a lost primary), and gives (re)joining groups and checkpoints tensors
made from them, so a group restarted after a learner node died does not wait for objects that died with
it.

Page faults: a shard's first merge, and a learner's first round (``RayStore.expect``), start mapping the
object store's memory into that process in a background thread when the rounds would touch it all soon
anyway (``store_memory``), so that later rounds copy at memory speed instead of faulting page by page.

Hub load: each shard counts the bytes of the slices it read and of the slice it produced times the
learners of the round (each learner fetches it; the object store serves the fetch, so this counts what
the shard's node sends if every learner reads from there, an upper bound). ray is imported only inside
the functions that talk to a cluster.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

# Numpy only: a shard's process loads no torch (elastic.merge says why); FlatPayload is a type here.
from raytrain_seq.elastic.merge import ShardMerge, merge_parts, part_nbytes
from raytrain_seq.elastic.rounds import Learner, check_number
from raytrain_seq.runtime.store_memory import StoreMemory, cuda_host_register

if TYPE_CHECKING:
    from raytrain_seq.elastic.payload import FlatPayload

__all__ = ["AveragingShard", "RayShards", "RayStore"]

# A merge interrupted by the shard's death is re-run on the restarted actor this many times.
MERGE_RETRIES = 3
# The control plane's read of a round's merged slices gives up after this long (their node may be gone).
FETCH_TIMEOUT_S = 120.0


class AveragingShard:
    """One slice of the flat vector: merges slice i of every learner of a round (stateless)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.memory = StoreMemory()
        # The last merge's arrays, overwritten by the next (merge_parts says why). Safe: Ray copies a
        # task's return value into the object store before this (synchronous, one-call-at-a-time) actor
        # runs its next call, so nobody reads these arrays any more once merge is called again.
        self._result: dict[str, Any] | None = None

    def merge(
        self, round: int, parts: list[Any], weights: list[float], readers: int, timeout_s: float | None = None
    ) -> tuple[dict | None, dict]:
        """The merged slice and the bytes moved; ``parts``: references to every learner's slice. A slice
        not on this node within ``timeout_s``, or lost, gives no merge (None) and its index in
        ``load["unreadable"]``."""
        import ray

        began = time.perf_counter()
        # Waited for first, with a deadline: a slice on another node is found through its owner, the
        # learner that put it, and a learner frozen after it sent its round answers nobody until it thaws.
        # Every learner has arrived, so without the deadline the round would neither merge nor time out.
        refs = list(parts)
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s, fetch_local=True)
        late = set(pending)
        unreadable = [i for i, ref in enumerate(refs) if ref in late]
        arrays: list[Any] = []
        if not unreadable:
            try:  # one call for every slice: a call per slice pays Ray's fixed cost per call each time
                arrays = ray.get(refs)
            except ray.exceptions.ObjectLostError:  # an owner died (a learner's node): name whose
                unreadable = _lost(refs)
                if not unreadable:  # every one reads on its own now: not a loss this merge can name
                    raise
        if unreadable:
            load = {"seconds": time.perf_counter() - began, "shard": self.index, "round": round}
            return None, {**load, "received": 0, "sent": 0, "unreadable": unreadable}
        merged = self._result = merge_parts(arrays, weights, reuse=self._result)
        received = sum(part_nbytes(part) for part in arrays)
        # Every round reads the learners' slices and writes the merged one into the store.
        self.memory.expect(received + part_nbytes(merged))
        load = {
            "seconds": time.perf_counter() - began,
            "shard": self.index,
            "round": round,
            "received": received,
            "sent": part_nbytes(merged) * readers,
        }
        return merged, load

    def store_memory(self, timeout: float | None = None) -> dict:
        """Whether this shard populates its mapping of the object store ahead (decided at its first merge)
        and how long that took (``StoreMemory.report``)."""
        return self.memory.report(timeout)


def _lost(refs: list[Any]) -> list[int]:
    """The indices of the references whose objects are lost (their owners died)."""
    import ray

    lost = []
    for i, ref in enumerate(refs):
        try:
            ray.get(ref)
        except ray.exceptions.ObjectLostError:
            lost.append(i)
    return lost


class RayShards:
    """The pool of ``count`` AveragingShard actors the control plane (an actor) creates and owns."""

    def __init__(self, count: int) -> None:
        self.count = check_number("shards", count, 1)
        self._nodes: dict[int, str] = {}
        self._handles: list[Any] | None = None

    def place(self, learner: Learner, node: str | None) -> None:
        if node is not None and isinstance(learner, int):
            self._nodes[learner] = node

    def _ensure(self) -> list[Any]:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._handles is None:
            known = [self._nodes[k] for k in sorted(self._nodes)]
            handles = []
            for i in range(self.count):
                options: dict[str, Any] = {
                    "num_cpus": 0,
                    "max_restarts": -1,
                    "max_task_retries": MERGE_RETRIES,
                }
                node = self._nodes.get(i) or (known[i % len(known)] if known else None)
                if node is not None:
                    options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=True)
                handles.append(ray.remote(AveragingShard).options(**options).remote(i))
            self._handles = handles
        return self._handles

    def prepare(self) -> None:
        self._ensure()

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
    ) -> ShardMerge:
        calls = [
            shard.merge.options(num_returns=2).remote(
                round, [payload.parts[i] for payload in payloads], list(weights), len(payloads), timeout_s
            )
            for i, shard in enumerate(self._ensure())
        ]
        loads = await asyncio.gather(*(load for _, load in calls))
        unreadable = frozenset(i for load in loads for i in load.get("unreadable", ()))
        if unreadable:
            return ShardMerge(loads=tuple(loads), unreadable=unreadable)
        return ShardMerge(tuple(merged for merged, _ in calls), tuple(loads))


class RayStore:
    """``ObjectStore`` over Ray's object store: ``ray.put`` (one copy in), ``ray.get`` (zero-copy out
    for numpy arrays on this node: read-only views, which ``FlatLayout.unpack`` only reads). ``expect``
    maps the store's memory into this process ahead of the rounds when they will touch it all
    (``store_memory.StoreMemory``) and, with ``cuda`` (a learner training on a GPU), registers it with
    CUDA, so that installing a merged state on the device copies at the link's speed."""

    def __init__(self, timeout_s: float | None = None, *, cuda: bool = False) -> None:
        import ray

        self.timeout_s = timeout_s
        # Only in an actor's process (a Ray Train worker is one), whose mapping of the store lasts as long
        # as the process. A driver that shut Ray down and started it again could map a new store where a
        # registered one was: CUDA keeps the old registration of those addresses, for pages no longer
        # mapped there, and refuses the new one (store_memory.cuda_host_unregister).
        register = cuda and ray.get_runtime_context().get_actor_id() is not None
        self.memory = StoreMemory(register=cuda_host_register if register else None)

    def expect(self, nbytes: int) -> bool:
        return self.memory.expect(nbytes)

    def put(self, value: Any) -> Any:
        import ray

        return ray.put(value)

    def get(self, refs: Sequence[Any]) -> list[Any]:
        import ray

        return ray.get(list(refs), timeout=self.timeout_s)
