"""Where a round's parts travel and who merges them: the store and shard-pool protocols, in process.

A learner puts each slice of its payload into an ``ObjectStore`` and sends the references; the averager
hands a round's payloads to a ``ShardPool``, whose shard i merges slice i of every learner
(``dataplane.merge``) and returns a ``ShardMerge``. Ray implements both (``runtime.shards``: ``RayStore``,
``RayShards``, which also opens channel generations); here are the in-process ones tests and one-process
runs use: ``InProcessStore`` (its objects are their own references; ``put`` copies, as ``ray.put``
does) and ``InProcessShards`` (the shards merged one after the other in a worker thread). Plain numpy:
no ray.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from raytrain_seq.dataplane.merge import ShardMerge, merge_parts, part_nbytes
from raytrain_seq.dataplane.payload import FlatPayload

__all__ = ["InProcessShards", "InProcessStore", "ObjectStore", "ShardPool", "SlicesLost"]


class SlicesLost(RuntimeError):
    """An ``ObjectStore.get`` found the objects gone: their owner (the averager, whose shards made a round's
    merged slices) died before they were read."""


class ObjectStore(Protocol):
    """Where a learner puts its parts and reads the merged ones."""

    def put(self, value: Any) -> Any: ...

    def get(self, refs: Sequence[Any]) -> list[Any]:
        """The objects; ``SlicesLost`` when they are gone with their owner."""
        ...

    def expect(self, nbytes: int) -> bool:
        """This process will move about ``nbytes`` through the store each round (a hint: a store may
        prepare for it); whether it does."""
        ...


class InProcessStore:
    """The objects are their own references; ``put`` copies the arrays, as ``ray.put`` does."""

    def put(self, value: Any) -> Any:
        return {
            key: np.array(array, copy=True) if isinstance(array, np.ndarray)
            else tuple(np.array(piece, copy=True) for piece in array)
            for key, array in value.items()
        }  # fmt: skip

    def get(self, refs: Sequence[Any]) -> list[Any]:
        return list(refs)

    def expect(self, nbytes: int) -> bool:
        return False  # the arrays live in this process's heap: nothing to prepare


class ShardPool(Protocol):
    """Merges a round's flat payloads, one shard per slice; ``count`` shards. A pool whose
    ``supports_channels`` is True also opens channel generations (``dataplane.generations``; ``RayShards``):
    ``targets``, ``open_channels``, and ``results`` (each shard's copy of a round it wrote into them)."""

    count: int
    supports_channels: bool

    def place(self, learner: Any, node: str | None) -> None:
        """Where learner ``learner`` runs (a hint: shard i goes to learner i's node)."""

    def handles(self) -> list[Any]:
        """The shard actors (empty in process)."""

    def prepare(self) -> None:
        """Start the shards now (the learners' nodes are known), so the first round does not wait."""

    def node_lost(self, node: str) -> list[int]:
        """A learner on ``node`` was lost: the shards placed there are replaced now, so that no merge waits
        for a node that may be gone; returns their indices (none in process)."""

    def forget(self, round: int, payload: FlatPayload) -> None:
        """A merge of ``round`` stops waiting for ``payload``'s slices (its learner was lost) and names it
        unreadable (``ShardMerge.unreadable``)."""

    async def fetch(self, refs: Sequence[Any]) -> list[Any]:
        """The merged parts behind ``refs`` (as ``ObjectStore.get``), for the control plane's own copy."""

    async def merge(
        self,
        round: int,
        payloads: Sequence[FlatPayload],
        weights: Sequence[float],
        timeout_s: float | None = None,
        write: bool = False,
    ) -> ShardMerge:
        """Merge every shard's slices, or say which payloads a shard could not read within ``timeout_s``.
        ``write``: into the live generation's channels (``ShardMerge.channelled``). Awaited on the
        control plane's event loop, which it must not block."""


class InProcessShards:
    """``count`` shards merged in this process, one after the other: the pool of tests and one-process
    runs. Bytes sent are counted as the merged part times the learners that read it. No channels: the
    parts are this process's arrays already."""

    supports_channels = False

    def __init__(self, count: int) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"shards must be an int >= 1, got {count!r}")
        self.count = count

    def place(self, learner: Any, node: str | None) -> None:
        pass

    def handles(self) -> list[Any]:
        return []

    def prepare(self) -> None:
        pass

    def node_lost(self, node: str) -> list[int]:
        return []

    def forget(self, round: int, payload: FlatPayload) -> None:
        pass  # the parts are this process's arrays: nothing is waited for

    async def fetch(self, refs: Sequence[Any]) -> list[Any]:
        return list(refs)

    async def merge(
        self,
        round: int,
        payloads: Sequence[FlatPayload],
        weights: Sequence[float],
        timeout_s: float | None = None,
        write: bool = False,
    ) -> ShardMerge:
        # The arithmetic runs in a worker thread: the caller's event loop keeps answering meanwhile. The
        # parts are in this process: every one is readable, so timeout_s has nothing to bound.
        return await asyncio.to_thread(self._merge, payloads, weights)

    def _merge(self, payloads: Sequence[FlatPayload], weights: Sequence[float]) -> ShardMerge:
        merged, loads = [], []
        for i in range(self.count):
            began = time.perf_counter()
            parts = [payload.parts[i] for payload in payloads]
            out = merge_parts(parts, weights)
            merged.append(out)
            received = sum(part_nbytes(p) for p in parts)
            sent = part_nbytes(out) * len(payloads)
            loads.append(
                {"shard": i, "received": received, "sent": sent, "seconds": time.perf_counter() - began}
            )
        return ShardMerge(tuple(merged), tuple(loads))
