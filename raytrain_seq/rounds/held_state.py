"""``HeldState``: the averager's own copy of the latest round's merged slices (asyncio, no Ray).

Once a round closes, its merged slices are read into the averager's process once, off the learners' path
(``read``): the merged slices live on the learners' nodes and die with them, so a (re)joining group, a
checkpoint and a channelled evaluation get this copy. Reading a channelled round copies its slices out of
the channels (when that fails, from the shards' copies, and the generation ends); the bytes count in the
round's hub load as received by this actor. ``held`` turns the copy into tensors only when asked (most
rounds' states never are) and stamps the batch size and the clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from raytrain_seq.checkpoint import DeferredTensors
from raytrain_seq.dataplane.channel_session import ChannelSession
from raytrain_seq.dataplane.generations import Channelled
from raytrain_seq.dataplane.hub_load import HubLoad
from raytrain_seq.dataplane.merge import part_nbytes
from raytrain_seq.dataplane.stores import ShardPool
from raytrain_seq.rounds.batch_rule import BatchRule
from raytrain_seq.rounds.events import RunHistory
from raytrain_seq.rounds.state import AveragedState

logger = logging.getLogger(__name__)

__all__ = ["HeldState"]


class HeldState:
    """The read of the latest round's merged slices (``reading``, a task of the averager's loop) and the
    state a join or a checkpoint gets from it; ``latest`` returns the averager's latest state (read anew
    after every wait: a round may close meanwhile)."""

    def __init__(
        self,
        *,
        channels: ChannelSession,
        pool: ShardPool,
        loads: HubLoad,
        batch: BatchRule,
        history: RunHistory,
        latest: Callable[[], AveragedState],
    ) -> None:
        self._channels, self._pool, self._loads = channels, pool, loads
        self._batch, self._history, self._latest = batch, history, latest
        self.reading: asyncio.Task | None = None  # the latest round's read (``read``), once one closed

    async def read(self, state: AveragedState) -> tuple[AveragedState, list[Any]]:
        """Read a round's merged slices into this process (a secondary copy on the control plane's node);
        counted in the round's hub load as bytes this actor received. The state and its parts: they
        become tensors only when a join or a checkpoint needs them (``held``), not every round,
        since a layout of many tensors takes milliseconds to unpack (docs/ARCHITECTURE.md, "Measurements behind the code") and most rounds' states are never asked for."""
        if isinstance(state.flat.parts[0], Channelled):
            try:
                parts = await self._channels.read(state.flat.parts)
            except Exception as exc:  # e.g. Ray's "Reader missed a value" after a member's node died
                # This actor's place among the channels' readers is lost: no later round could be read
                # either. The shards kept their copies of the round they wrote: read those instead.
                logger.warning("averager: reading round %d from the channels failed (%r): the "
                               "shards' copies instead", state.round, exc)  # fmt: skip
                self._channels.end(f"the averager could not read round {state.round} from its channels")
                parts = await self._pool.results(state.round)
            state = state.replace(flat=dataclasses.replace(state.flat, parts=tuple(parts)))
        else:
            parts = await self._pool.fetch(list(state.flat.parts))
        self._loads.add_received(state.round, sum(part_nbytes(part) for part in parts))
        return state, parts

    async def held(self, *, tensors: bool = True) -> AveragedState:
        """The latest state with its tensors in this process when it can be had: for joins and
        checkpoints. A failed read is logged and the references are handed out instead (their objects
        may be gone). ``tensors`` False: the read slices as they are, flat (a join or a learner's checkpoint:
        the learner unpacks them, so this process needs no torch, and arrays pickle as their bytes)."""
        task = self.reading
        if task is not None and self._latest().flat is not None:
            try:
                local, parts = await asyncio.shield(task)
                if local.round == self._latest().round and tensors:
                    local = await asyncio.to_thread(local.materialise, lambda refs: parts)
                elif local.round == self._latest().round:
                    local = local.replace(flat=dataclasses.replace(local.flat, parts=tuple(parts)))
            except Exception as exc:
                logger.error(
                    "averager: reading round %d's merged state failed: %r", self._latest().round, exc
                )
            else:
                if local.round == self._latest().round:
                    return self.current(local)
        params = self._latest().params
        if isinstance(params, DeferredTensors) and not params.loaded:
            # A checkpoint's tensors not read yet (a restarted averager's state, no learner ahead): read
            # off the loop, which pickling the reply would block.
            await asyncio.to_thread(params.load)
        return self.current(self._latest())

    def current(self, state: AveragedState) -> AveragedState:
        """``state`` with the batch size decided since and the clock's reading now."""
        return state.replace(
            batch_size=self._batch.size,
            adaptive_state=self._batch.state_dict(),
            elapsed_s=self._history.clock.elapsed(),
        )
