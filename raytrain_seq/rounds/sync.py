"""AAVG's outer loop as one object the learner loop calls: K local steps, then one averaging round.

Algorithm (Cong et al., AAVG, Algorithm 1): every learner starts from the same averaged weights, takes K
local steps, sends its weights and Adam moments and continues from the mean (K = -1: one round at the
end of every epoch). ``LocalRounds`` counts the local steps (``step()`` says when K are done;
``pending`` whether an epoch's last steps still need a round), sends the round through an
``AveragerClient`` and installs what comes back: the round's averaged state or, when the others went on
without this learner, their latest (a ``Deferred`` one: nothing, its steps stay counted). The round
travels as flat buffers (``dataplane.payload``) in which the learner's tensors live
(``dataplane.flat_storage``, bound at the first round): each slice is one put, the mean is written back
in place. The shape of torchft's ``LocalSGD`` (a step counter and a ``sync``), the weights going through
the averager, not a collective. ``Tally`` is the work since the last round (frames, sequences, steps,
seconds, loss, first step's wall time, longest gap between steps, wait for a CPU), sent as the stats. A
held round goes out later from a host copy (``hold``, ``restore``, ``keep_steps``: ``Learner``). No ray.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from raytrain_seq.checkpoint import is_due
from raytrain_seq.dataplane.flat_storage import FlatStorage
from raytrain_seq.dataplane.payload import FlatLayout, FlatPayload
from raytrain_seq.models.recurrent import compact_recurrent, recurrent_keys
from raytrain_seq.rounds.client import Averaged, AveragerClient, Deferred, Realigned
from raytrain_seq.rounds.position import EpochPosition
from raytrain_seq.rounds.state import AveragedState
from raytrain_seq.training.run_queue import run_queue_wait_s
from raytrain_seq.training.step import load_averaged

__all__ = [
    "HELD_RETRY_S",
    "Held",
    "HeldRound",
    "LocalRounds",
    "Stats",
    "Tally",
    "TrainedIds",
    "missed_checkpoint_rounds",
]

Held = tuple[dict, dict | None]
"""A host copy of a learner's live state: (parameters and buffers, moments or None) (``LocalRounds.hold``)."""

Stats = dict[str, float]
"""A round's work as a learner sends it (``Tally.flush``), with its rows' accounting."""
TrainedIds = dict[int, list[int]]
"""Per epoch, the video ids a learner trained since its last round."""

# A held round that found the averager away again is tried again no sooner than this, between steps: each
# try copies the whole state to the host and back, and puts it.
HELD_RETRY_S = 0.25

logger = logging.getLogger(__name__)


@dataclass
class Tally:
    """Work done since the last round (sent to the averager, which sums it per learner) and in total."""

    frames: int = 0
    sequences: int = 0
    steps: int = 0
    compute_s: float = 0.0
    data_wait_s: float = 0.0
    # Seconds the training thread was runnable but waited for a CPU (``training.run_queue``), read at each
    # flush on that thread; None where the kernel does not say (the stat is then not sent).
    cpu_wait_s: float | None = None
    loss_sum: float = 0.0
    first_step_wall: float | None = None  # wall time of the first step since the last flush
    # The longest wall time from one step's end to the next one's since the last flush: a learner that
    # waited on a round (or anything else) shows it here. The last step's time is kept across flushes, so
    # the wait for a round counts in the next round's stats, where the first step after it falls.
    longest_gap_s: float = 0.0
    last_step_wall: float | None = None
    totals: dict[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = field(default=time.time, repr=False)  # wall time (a fake in tests)
    run_queue: Callable[[], float | None] = field(default=run_queue_wait_s, repr=False)  # a fake in tests
    # (thread, ``run_queue``'s reading) at the last flush, or at the first step: the reading is per thread,
    # so a difference is taken only on the thread that read last (the training thread's steps and rounds).
    _queued_at: tuple[int, float] | None = field(default=None, repr=False)
    _read_once: bool = field(default=False, repr=False)  # read since made: a step reads no more after it

    def _read_run_queue(self) -> None:
        """Add the run-queue wait since the last reading on this thread to ``cpu_wait_s``."""
        now, thread, self._read_once = self.run_queue(), threading.get_native_id(), True
        if now is not None and self._queued_at is not None and self._queued_at[0] == thread:
            self.cpu_wait_s = (self.cpu_wait_s or 0.0) + now - self._queued_at[1]
        self._queued_at = None if now is None else (thread, now)

    def add_step(self, frames: int, sequences: int, seconds: float, loss: float) -> None:
        now = self.clock()
        if not self._read_once:  # the first step: the run-queue wait counts from here; later steps read
            self._read_run_queue()  # nothing (a kernel without the figure is asked once a round, not a step)
        if self.first_step_wall is None:
            self.first_step_wall = now
        if self.last_step_wall is not None:
            self.longest_gap_s = max(self.longest_gap_s, now - self.last_step_wall)
        self.last_step_wall = now
        self.frames += frames
        self.sequences += sequences
        self.steps += 1
        self.compute_s += seconds
        self.loss_sum += loss * sequences

    def carry(self, delta: Mapping[str, float]) -> None:
        """Take back a ``flush`` whose round was deferred: the next one sends it with its own."""
        for key in ("frames", "sequences", "steps", "compute_s", "data_wait_s"):
            self.totals[key] -= delta[key]
        self.frames += int(delta["frames"])
        self.sequences += int(delta["sequences"])
        self.steps += int(delta["steps"])
        self.compute_s += delta["compute_s"]
        self.data_wait_s += delta["data_wait_s"]
        if "cpu_wait_s" in delta:
            self.totals["cpu_wait_s"] -= delta["cpu_wait_s"]
            self.cpu_wait_s = (self.cpu_wait_s or 0.0) + delta["cpu_wait_s"]
        if delta["sequences"]:
            self.loss_sum += delta["loss"] * delta["sequences"]
        if "first_step_wall" in delta:
            self.first_step_wall = delta["first_step_wall"]
        self.longest_gap_s = max(self.longest_gap_s, delta.get("longest_gap_s", 0.0))

    def drop(self) -> None:
        """Forget the work since the last flush, which no round will hold (the steps after a held round
        that closed elsewhere: ``Learner``); the totals never counted it."""
        self._read_run_queue()
        self.cpu_wait_s = None
        self.frames = self.sequences = self.steps = 0
        self.compute_s = self.data_wait_s = self.loss_sum = self.longest_gap_s = 0.0
        self.first_step_wall = None

    def flush(self) -> dict[str, float]:
        """The deltas since the last flush, for a round's stats; resets them."""
        delta = {
            "frames": float(self.frames),
            "sequences": float(self.sequences),
            "steps": float(self.steps),
            "compute_s": self.compute_s,
            "data_wait_s": self.data_wait_s,
        }
        self._read_run_queue()
        if self.cpu_wait_s is not None:
            delta["cpu_wait_s"] = self.cpu_wait_s
        for key, value in delta.items():
            self.totals[key] = self.totals.get(key, 0.0) + value
        mean_loss = self.loss_sum / self.sequences if self.sequences else float("nan")
        if self.first_step_wall is not None:
            # A time, not a total: the averager keeps it apart (``rounds.events.RunHistory.record_round``).
            delta["first_step_wall"] = self.first_step_wall
            delta["longest_gap_s"] = self.longest_gap_s
        self.frames = self.sequences = self.steps = 0
        self.compute_s = self.data_wait_s = self.loss_sum = self.longest_gap_s = 0.0
        self.first_step_wall = self.cpu_wait_s = None
        delta["loss"] = mean_loss
        return delta


@dataclass(frozen=True)
class HeldRound:
    """A layout's last round held back while the averager was away (``Learner``): where it stood
    (``at``; ``rows`` a learner in that layout), the state it sends (``held``), its work and video ids."""

    at: EpochPosition
    rows: int
    held: Held
    delta: Stats
    ids: TrainedIds


class LocalRounds:
    """K local steps between averaging rounds of one learner's model and optimizer."""

    def __init__(
        self,
        client: AveragerClient,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        k: int,
        merge_moments: bool = True,
        merge_bn_stats: bool = True,
        device: torch.device | str = "cpu",
    ) -> None:
        if k == 0 or k < -1:
            raise ValueError(f"k must be -1 (one round per epoch) or >= 1 local steps, got {k}")
        self.client, self.model, self.optimizer = client, model, optimizer
        self.k, self.merge_moments, self.device = k, merge_moments, device
        self.merge_bn_stats = merge_bn_stats  # the layout decides the shards' rule for BatchNorm pairs
        self.local_steps = 0
        self.averaging_s = 0.0  # inside averaging calls, waiting included
        self.last_seconds = 0.0
        self._staging: dict[str, torch.Tensor] = {}  # on CUDA: the pinned packed buffers, reused
        self.storage: FlatStorage | None = None  # where the tensors live once bound (the first round)
        # A recurrent module's weights stay in their own chunk (cuDNN's layout): mirrored, not bound.
        self.mirrored = recurrent_keys(model)
        self.unsupported: str | None = None  # why the state is put piece by piece instead, if it is

    def step(self) -> bool:
        """Count one local optimizer step; True at every K steps since the last round (2K, 3K, ...: the
        round was deferred)."""
        self.local_steps += 1
        return self.k > 0 and self.local_steps % self.k == 0

    @property
    def pending(self) -> bool:
        """Whether the steps since the last round still need one (K = -1: every epoch ends with one)."""
        return self.k < 0 or self.local_steps > 0

    def install(self, state: AveragedState) -> None:
        """Load an averaged state into the model and optimizer: in place into the flat buffers once they
        hold the tensors and the state has their layout (a round's merged slices, one copy a slice; a
        state in tensors, one copy a tensor), else by ``load_state_dict``. Either way the optimizer gets
        copies of the moments: it updates them in place, and the held originals are what a restarted
        averager is re-seeded with. Recurrent modules' weights end in one chunk each, cuDNN's layout on
        CUDA (``models.recurrent``), so no forward copies them into a fresh buffer."""
        if state.empty:
            return
        self._load(state)
        compact_recurrent(self.model)

    def _load(self, state: AveragedState) -> None:
        storage = self.storage
        flat = state.flat
        if (
            storage is not None
            and flat is not None
            and flat.local
            and flat.layout.signature == storage.layout.signature
        ):
            params, moments = self._live()
            storage.load_slices(flat.parts, flat.extras, into_params=params, into_moments=moments)
            return
        state = state.materialise(self.client.store.get)
        if storage is not None and storage.matches(
            state.params, state.optimizer_state, merge_bn_stats=self.merge_bn_stats
        ):
            params, moments = self._live()
            storage.load(state.params, state.optimizer_state, into_params=params, into_moments=moments)
            return
        moments = (
            None if state.optimizer_state is None else _to_device(state.optimizer_state, "cpu", copy=True)
        )
        load_averaged(self.model, self.optimizer, _to_device(state.params, self.device), moments)

    def sync(
        self,
        *,
        stats: Mapping[str, float],
        position: EpochPosition,
        rows: int | None = None,
        defer: bool = False,
    ) -> Averaged | Realigned | Deferred:
        """Send this learner's round (``position``: where training stands once it is averaged; ``rows``:
        its rows this epoch; ``defer``: ``AveragerClient.average``'s) and install the outcome: the round's
        mean, or the others' latest state after a realignment; nothing when it was deferred."""
        began = time.perf_counter()
        if defer and (early := self.client.defers()) is not None:
            # Before the slices are put (a device-to-host copy and a put of the whole state, each try):
            # nothing is sent while the averager is known down.
            self.last_seconds = time.perf_counter() - began
            self.averaging_s += self.last_seconds
            return early
        params, moments = self._live()
        storage = self.storage
        if storage is not None and storage.holds(params, moments):
            layout = storage.layout  # what FlatLayout.of would build: nothing moved since the last round
        else:
            layout = FlatLayout.of(params, moments, merge_bn_stats=self.merge_bn_stats)
            storage = self._bound(layout, params, moments)
        if storage is not None:
            slices, extras = storage.slices(self.client.shards), layout.extras(params, moments)
        else:
            slices, extras, self._staging = layout.slices(params, moments, self.client.shards, self._staging)
        store = self.client.store
        store.expect(2 * layout.nbytes)  # each round puts the payload and reads the merged one back
        parts = self.client.send(slices)
        payload = FlatPayload(layout, parts, extras)
        decision = self.client.average(
            payload, None, stats=stats, position=position.as_dict(), rows=rows, defer=defer
        )
        self.last_seconds = time.perf_counter() - began
        self.averaging_s += self.last_seconds
        if isinstance(decision, Deferred):
            return decision  # the steps stay counted: the next try sends them with its own
        self.install(decision.result.state if isinstance(decision, Averaged) else decision.reply.state)
        self.local_steps = 0
        return decision

    def hold(self) -> Held:
        """A host copy of the live state (the tensors a round sends): a round held back while the
        averager is away is sent from it later (``restore``), the steps since then kept on top of its
        mean (``keep_steps``). Host memory, so that a device full of the model still holds it."""
        params, moments = self._live()
        with torch.no_grad():  # copies of the parameters, not nodes of their graph
            held_params = _to_device(params, "cpu", copy=True)
            held_moments = None if moments is None else _to_device(moments, "cpu", copy=True)
        return held_params, held_moments

    def restore(self, held: Held) -> None:
        """Copy a held state back into the live tensors, in place (the flat storage stays bound)."""
        params, moments = self._live()
        with torch.no_grad():
            _copy_into(params, held[0])
            if moments is not None and held[1] is not None:
                _copy_into(moments, held[1])

    def keep_steps(self, now: Held, held: Held) -> None:
        """After the mean of a round sent from ``held`` is installed: the local steps taken since (``now``
        minus ``held``) go on top of it, each parameter += now - held; buffers and moments are ``now``'s,
        this learner's own, which the next round merges."""
        params, moments = self._live()
        with torch.no_grad():
            for name, live in params.items():
                if isinstance(live, torch.nn.Parameter):
                    live.add_((now[0][name] - held[0][name]).to(live.device))
                elif torch.is_tensor(live):
                    live.copy_(now[0][name])
            if moments is not None and now[1] is not None:
                _copy_into(moments, now[1])

    def _live(self) -> tuple[dict[str, torch.Tensor], dict | None]:
        """The model's parameters and buffers themselves (not detached copies) and the optimizer's state,
        keyed as their state_dicts; the moments only when they are averaged."""
        moments = self.optimizer.state_dict()["state"] if self.merge_moments else None
        return self.model.state_dict(keep_vars=True), moments

    def _bound(self, layout: FlatLayout, params: Mapping, moments: Mapping | None) -> FlatStorage | None:
        """The flat storage of ``layout`` with every tensor in it (moved there now where one is not: the
        first round moves them all), or None when the state cannot live in it (logged once)."""
        device = next((layout.tensor_of(params, moments, s).device for s in layout.slots), self.device)
        storage = self.storage
        if storage is None or storage.layout.signature != layout.signature or storage.device != device:
            why = FlatStorage.unsupported(layout, params, moments)
            if why is not None:
                if why != self.unsupported:
                    logger.info("the learner's state is put piece by piece (%s)", why)
                self.storage, self.unsupported = None, why
                return None
            self.storage, self.unsupported = FlatStorage(layout, device, mirrored=self.mirrored), None
        self.storage.bind(params, moments)
        return self.storage


def missed_checkpoint_rounds(first: int, latest: int, *, every: int, latest_is_final: bool) -> list[int]:
    """The checkpoint rounds among ``first`` .. ``latest`` (inclusive), which a learner that missed them
    still owes Ray Train a report for (its report is a barrier: the others wait at it).

    E.g. first=5, latest=7, every=2: [6]; the final round is not a checkpoint round (``is_due``).
    """
    rounds = range(first, latest + 1)
    return [r for r in rounds if is_due(r, every=every, final=latest_is_final and r == latest)]


def _copy_into(live: Mapping, copy: Mapping) -> None:
    """Each tensor of ``copy`` into the same place of ``live``, in place."""
    for key, value in live.items():
        if isinstance(value, Mapping):
            _copy_into(value, copy[key])
        elif torch.is_tensor(value):
            value.copy_(copy[key])


def _to_device(tree: Mapping, device, *, copy: bool = False) -> dict:
    """Tensors of a (nested) dict moved to ``device``; ``copy`` makes new tensors even where they are."""
    return {
        key: _to_device(value, device, copy=copy) if isinstance(value, Mapping)
        else value.to(device, copy=copy) if torch.is_tensor(value) else value
        for key, value in tree.items()
    }  # fmt: skip
