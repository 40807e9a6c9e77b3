"""The learners' object store on Ray: ``RayStore`` puts a learner's slices and gets the merged ones.

``put`` is ``ray.put`` (one copy in); ``get`` is ``ray.get`` with the round's timeout (zero-copy out for
numpy arrays on this node) and turns Ray's lost-object errors into ``SlicesLost``, which the client
answers by rejoining (``rounds.client``). The shards that merge the slices: ``runtime.shards``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from raytrain_seq.dataplane.stores import SlicesLost
from raytrain_seq.runtime.store_memory import StoreMemory, cuda_host_register

__all__ = ["RayStore"]


class RayStore:
    """``ObjectStore`` over Ray's object store: ``ray.put`` (one copy in), ``ray.get`` (zero-copy out
    for numpy arrays on this node: read-only views, which ``FlatLayout.unpack`` only reads). ``expect``
    maps the store's memory into this process ahead of the rounds when they will touch it all
    (``store_memory.StoreMemory``) and, with ``cuda`` (a learner training on a GPU), registers it with
    CUDA, so that installing a merged state on the device copies at the link's speed."""

    def __init__(
        self, timeout_s: float | None = None, *, cuda: bool = False, get: Callable[..., Any] | None = None
    ) -> None:
        import ray

        self.timeout_s = timeout_s
        self._get = get or ray.get  # an asyncio actor's thread passes runtime.off_loop.off_loop_get
        # Only in an actor's process (a learner is one), whose mapping of the store lasts as long
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
        from ray.exceptions import ObjectLostError

        try:
            return self._get(list(refs), timeout=self.timeout_s)
        except ObjectLostError as exc:  # OwnerDiedError among them: the averager died after it merged
            raise SlicesLost(f"{type(exc).__name__}: the objects are gone with their owner") from exc
