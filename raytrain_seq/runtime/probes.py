"""Whether a learner's process answers: the averager's probe of a learner that a round waits for.

``LearnerProbes`` keeps the actor handle each learner joined from (``note``) and sends it Ray's built-in
readiness call, ``__ray_ready__``. ``answers(learner, within)``: True when the process answered within
``within`` seconds; False when it did not, or its actor is dead or restarting; None when no process of
the learner is known (nothing to ask). A stopped process, one in a paused VM or on a node cut off from
the head cannot answer. A learner that is only slow, busy in a step, answers from another of its
actor's threads (``fleet.LEARNER_THREADS``). ``rounds.round_wait.RoundWait`` asks it.

A learner sends its handle pickled (``handle_bytes``), unpickled here when a probe first needs it, on a
worker thread. Ray unpickles a call's arguments on an asyncio actor's event loop, and the first handle
of an actor class in a process imports that class's module tree, which held a restarted averager's loop,
and with it every learner's rejoin (docs/ARCHITECTURE.md, "Measurements behind the code").
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from typing import Any

from raytrain_seq.members.ids import LearnerId

logger = logging.getLogger(__name__)

__all__ = ["LearnerProbes", "handle_bytes"]


def handle_bytes(handle: Any) -> bytes:
    """An actor handle pickled (Ray's out-of-band form of a handle), for ``LearnerProbes.note``."""
    return pickle.dumps(handle)


class LearnerProbes:
    """The learners' actor handles, by learner id, and the probe that asks one (module docstring)."""

    def __init__(self) -> None:
        self._processes: dict[LearnerId, Any] = {}  # a handle, or ``handle_bytes`` of it

    def note(self, learner: LearnerId, process: Any) -> None:
        """``learner`` joined from ``process``: its actor handle or ``handle_bytes`` of it (None: unknown,
        the old one is kept)."""
        if process is not None:
            self._processes[learner] = process

    async def answers(self, learner: LearnerId, within: float) -> bool | None:
        """Whether ``learner``'s process answers a readiness call within ``within`` seconds."""
        import ray

        process = self._processes.get(learner)
        if isinstance(process, bytes):
            try:
                process = await asyncio.get_running_loop().run_in_executor(None, pickle.loads, process)
            except Exception:
                logger.exception("learner %s: its actor handle did not unpickle; it is not probed", learner)
                self._processes.pop(learner, None)
                return None
            self._processes[learner] = process
        if process is None:
            return None
        ref = process.__ray_ready__.remote()
        try:
            await asyncio.wait_for(asyncio.wrap_future(ref.future()), within)
        except TimeoutError:
            return False
        except ray.exceptions.RayActorError:
            return False  # dead or restarting: the fleet's lose() follows for a dead one
        return True
