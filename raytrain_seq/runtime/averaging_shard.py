"""One averaging shard: an actor that merges slice i of every learner's flat payload in a round.

The control plane (``runtime.shards.RayShards``) calls ``merge`` with every learner's slice i (nested
references, or ``Channelled`` markers once a channel generation is live) and gets the merged slice back as
the call's return value; a slice not readable within the round's timeout, lost with its owner, or
forgotten (``forget``: its learner was lost) is named, not waited for. The shard holds no state a round
needs: Ray restarts a lost one. One made for a named pool (``RayShards``' ``ShardNames``) is detached, so
that it outlives a restart of the control plane, its creator, and ends itself once that control plane's
actor is gone for good (looked up every ``OWNER_POLL_S``): a run's end, or its driver's death, leaves no
shard behind. Its process loads no torch (``dataplane.merge`` says why).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from raytrain_seq.dataplane.merge import merge_parts, part_nbytes
from raytrain_seq.runtime.store_memory import MemoryReport, StoreMemory

logger = logging.getLogger(__name__)

__all__ = ["AveragingShard"]

# A merge waiting for slices looks this often whether their learners were lost (``AveragingShard.forget``).
FORGET_POLL_S = 0.25
# A detached shard looks this often whether the control plane it serves still exists (a restarting one
# does: its name stays registered while Ray restarts it).
OWNER_POLL_S = 2.0


class AveragingShard:
    """One slice of the flat vector: merges slice i of every learner of a round (stateless)."""

    def __init__(self, index: int, owner: tuple[str, str | None] | None = None) -> None:
        """``owner``: the (name, namespace) of the control plane's actor, for a detached shard."""
        self.index = index
        self.memory = StoreMemory()
        # The last merge's arrays, overwritten by the next (merge_parts says why). Safe: Ray copies a
        # task's return value into the object store before this (synchronous, one-call-at-a-time) actor
        # runs its next call, so nobody reads these arrays any more once merge is called again; a merge
        # written into the channels copies them there, and ``result`` returns them (a copy) on request.
        self._result: dict[str, Any] | None = None
        self._result_round: int | None = None
        # The live channel generation (dataplane.generations): its number, every member's channel to this
        # shard (member order), this shard's channel to the members, and the parts read this round (a
        # merge run again without an unreadable learner must not read a channel twice).
        self._generation: int | None = None
        self._inputs: list[Any] = []
        self._output: Any = None
        self._read: tuple[int, dict[int, Any]] = (0, {})
        # Per round, the slices (references) of lost learners not to wait for (``forget``).
        self._forgotten: dict[int, set[Any]] = {}
        if owner is not None:
            name = f"shard-{index}-owner"
            threading.Thread(target=_end_with, args=(*owner, index), name=name, daemon=True).start()

    def forget(self, round: int, parts: list[Any]) -> None:
        """Stop waiting for the slices ``parts`` of ``round``: their learner was lost, and they die with
        it. Runs in the ``control`` concurrency group, beside a merge that waits for them (Ray would find
        them lost only once it learns of their owner's death), or before a merge made again; by
        reference, so that a merge made again without that learner, whose indices moved, is unaffected."""
        self._forgotten = {r: p for r, p in self._forgotten.items() if r >= round - 2}
        self._forgotten.setdefault(round, set()).update(parts)

    def watch(self) -> None:
        """Never returns (the ``watch`` concurrency group): the control plane's standing call, which fails
        once this process dies, so that it merges this shard's slices itself until a new one is up."""
        threading.Event().wait()

    def node(self) -> str:
        """The node this shard runs on (a member's channel to it names it)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def open_channels(
        self, generation: int, inputs: list, readers: list, nbytes: int, timeout_s: float | None = None
    ) -> Any:
        """Generation ``generation``: read member j's slices from ``inputs[j]``; returns this shard's
        channel of merged slices, which ``readers`` (every member: (handle, node)) read.

        Ray's set-up of a channel calls each reader on another node and waits for it without a deadline:
        a reader whose node died and whose actor waits for room to restart held this one-call-at-a-time
        actor, and every merge queued behind it, until a node came (the fault tests' lost node). So the
        set-up runs in a thread, waited for at most ``timeout_s``; then TimeoutError (the averager ends
        the generation) and a channel the thread makes later is dropped."""
        from ray.experimental.channel.shared_memory_channel import BufferedSharedMemoryChannel
        from ray.experimental.channel.utils import get_self_actor

        from raytrain_seq.runtime.channels import OUTPUT_BUFFERS, channel_slack

        me, made = get_self_actor(), {}

        def make() -> None:
            try:
                made["channel"] = BufferedSharedMemoryChannel(
                    me, [tuple(r) for r in readers], OUTPUT_BUFFERS, channel_slack(nbytes)
                )
            except BaseException as exc:  # handed to the caller below, raised there
                made["error"] = exc

        thread = threading.Thread(target=make, name=f"shard-{self.index}-channels", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError(
                f"shard {self.index}: generation {generation}'s channel waited {timeout_s:g} s for its "
                "readers (one is on a lost node, or restarting): the rounds go through the store"
            )
        if "error" in made:
            raise made["error"]
        self._generation, self._inputs, self._read = generation, list(inputs), (0, {})
        self._output = made["channel"]
        return self._output

    def result(self, round: int) -> dict | None:
        """The merged slice of ``round`` when it is this shard's last merge (the control plane's copy of a
        round whose slices went through the channels), else None."""
        return self._result if self._result_round == round else None

    def merge(
        self,
        round: int,
        parts: list[Any],
        weights: list[float],
        readers: int,
        timeout_s: float | None = None,
        write: bool = False,
    ) -> tuple[dict | None, dict]:
        """The merged slice and the bytes moved; ``parts``: every learner's slice, as a reference or a
        ``Channelled`` marker (read from that member's channel). A slice not on this node within
        ``timeout_s``, or lost, gives no merge (None) and its index in ``load["unreadable"]``; a marker
        of a generation this shard does not have (Ray restarted it) gives ``load["lost_channels"]``.
        ``write``: put the merged slice into this shard's channel (every member reads it) and return
        None in its place, ``load["channelled"]`` saying so (False when the write failed: then it is
        returned)."""
        from raytrain_seq.dataplane.generations import Channelled

        began = time.perf_counter()
        load: dict[str, Any] = {"shard": self.index, "round": round, "received": 0, "sent": 0}
        marked = {j: part for j, part in enumerate(parts) if isinstance(part, Channelled)}
        if any(part.generation != self._generation for part in marked.values()):
            return None, {**load, "seconds": time.perf_counter() - began, "lost_channels": True}
        arrays, unreadable, lost = self._gather(round, parts, marked, timeout_s)
        if lost or unreadable:
            load.update(seconds=time.perf_counter() - began, lost_channels=lost, unreadable=unreadable)
            return None, load
        merged = self._result = merge_parts(arrays, weights, reuse=self._result)
        self._result_round = round
        received = sum(part_nbytes(part) for part in arrays)
        del arrays  # the channels' views: a member's next write waits until they are let go
        written = write and self._write(round, merged, timeout_s)
        # Every round reads the learners' slices and writes the merged one into the store.
        self.memory.expect(received + part_nbytes(merged))
        load.update(
            seconds=time.perf_counter() - began,
            received=received,
            sent=part_nbytes(merged) * readers,
            channelled=written,
        )
        return (None if written else merged), load

    def _gather(
        self, round: int, parts: list[Any], marked: dict[int, Any], timeout_s: float | None
    ) -> tuple[list[Any], list[int], bool]:
        """Every learner's slice (arrays), the indices of those unreadable within ``timeout_s``, and
        whether a channel was closed under this shard (its generation ended)."""
        import ray
        from ray.exceptions import RayChannelError, RayChannelTimeoutError

        from raytrain_seq.dataplane.generations import ChannelLost
        from raytrain_seq.runtime.channels import read_round

        stored_at = [j for j in range(len(parts)) if j not in marked]
        refs = [parts[j] for j in stored_at]
        unreadable: list[int] = []
        # Waited for first, with a deadline: a slice on another node is found through its owner, the
        # learner that put it, and a learner frozen after it sent its round answers nobody until it thaws.
        # Every learner has arrived, so without the deadline the round would neither merge nor time out.
        # In short waits: a lost learner's parts (``forget``) end the wait at once, named unreadable.
        if refs:
            deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
            pending = list(refs)
            while pending:
                forgotten = self._forgotten.get(round, ())  # read each pass: forget() runs beside this
                if gone := [j for j in stored_at if parts[j] in forgotten and parts[j] in pending]:
                    return [], gone, False
                left = min(FORGET_POLL_S, deadline - time.monotonic())
                if left <= 0:
                    break
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=left, fetch_local=True)
            late = set(pending)
            unreadable = [j for j in stored_at if parts[j] in late]
        # A channel's value is read once: a merge run again (a learner dropped) takes the round's reads.
        if self._read[0] != round:
            self._read = (round, {})
        read = self._read[1]
        for j, part in marked.items():
            if part.writer in read:
                continue
            try:
                read[part.writer] = read_round(self._inputs[part.writer], part.round, timeout_s)
            except RayChannelTimeoutError:
                unreadable.append(j)
            except (RayChannelError, ChannelLost):
                return [], [], True
        if unreadable:
            return [], sorted(unreadable), False
        stored: list[Any] = []
        if refs:
            try:  # one call for every slice: a call per slice pays Ray's fixed cost per call each time
                stored = ray.get(refs)
            except ray.exceptions.ObjectLostError:  # an owner died (a learner's node): name whose
                lost = _lost(refs)
                if not lost:  # every one reads on its own now: not a loss this merge can name
                    raise
                positions = [j for j in range(len(parts)) if j not in marked]
                return [], [positions[i] for i in lost], False
        from_store = iter(stored)
        arrays = [read.pop(parts[j].writer) if j in marked else next(from_store) for j in range(len(parts))]
        return arrays, [], False

    def _write(self, round: int, merged: dict, timeout_s: float | None) -> bool:
        """Put ``merged`` into this shard's channel; whether it went (a closed channel: the generation ended)."""
        from ray.exceptions import RayChannelError

        if self._output is None:
            return False
        try:
            self._output.write((round, merged), timeout=timeout_s)
        except RayChannelError as exc:
            logger.warning("shard %d: writing generation %s's merged slice failed (%r): returned instead",
                           self.index, self._generation, exc)  # fmt: skip
            return False
        return True

    def store_memory(self, timeout: float | None = None) -> MemoryReport:
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


def _end_with(owner: str, namespace: str | None, index: int) -> None:
    """End this detached shard once the control plane that made it, the actor named ``owner`` now, no
    longer exists: it ended with its run, or its driver died. A control plane that Ray restarts keeps its
    name and its actor meanwhile; another actor of that name (a resumed run's) is not this shard's."""
    import ray

    made_by = None
    while True:
        try:
            now = ray.get_actor(owner, namespace=namespace)
        except ValueError:
            now = None
        except Exception:  # the GCS unreachable a while (its restart): looked up again
            logger.warning("shard %d: looking up the control plane %r failed", index, owner, exc_info=True)
            time.sleep(OWNER_POLL_S)
            continue
        made_by = now if made_by is None else made_by  # handles compare by actor id
        if now is None or now != made_by:
            logger.info("shard %d: the control plane %r that made it is gone: this shard ends", index, owner)
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
            return
        time.sleep(OWNER_POLL_S)
