"""The averager's cost: its measured bandwidth, and a cost model for a large cluster.

AAVG (Cong et al.) averages the learners' weights and merges their Adam moments every K steps through
one ParameterAverager actor (``raytrain_seq.runtime.averager``): a star. ``bandwidth`` measures how many
MB/s of fp32 weights + moments one round of 2 learners pushes through the actor on this machine
(serialisation, the object store and the arithmetic included) against a plain numpy mean of the same
arrays and the library arithmetic (``averaging.average_states`` + ``merge_adam_states``) in one
process, and how a round's wall time and the busiest actor's bytes grow with the learners (the sharded
data plane, ``runtime/shards.py``), through the transport a run uses by default
(``train.averager_channels``: shared-memory channels once a group is linked, ``dataplane.generations``) and,
for 2 learners, through the other one beside it. ``cost_model`` extrapolates a round to P learners of a given size over a NIC of a given speed
and compares it with DDP's ring all-reduce of the gradients per epoch.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

import numpy as np
import torch

from raytrain_seq.algorithms.averaging import average_states, merge_adam_states
from raytrain_seq.training.heap import keep_freed_memory

NAMESPACE = "raytrain_seq"
# A learner's payload: its weights in this many tensors, each with its two Adam moments.
TENSORS = 8
# A second round of 2 learners splits the same bytes into about as many tensors as a large model has
# (the project's ResNet-152 encoder with group norm: 465 parameter tensors, `models.resnet`): what a
# round costs per tensor, beside what it costs per byte.
MANY_TENSORS = 500


def cost_model(
    learners: int, params: float, nic_gbit: float, mean_gbps: float, *, steps: int, moments: int = 2
) -> dict[str, float]:
    """Seconds per averaging round of the star-shaped averager, of the sharded one, and a ring all-reduce
    per epoch.

    Per learner the averager receives and returns S = params * 4 B * (1 + moments) (weights + Adam
    moments, fp32). Its NIC carries 2 P S per round (P learners in, P results out) and it averages P S
    bytes: T_round = 2 P S / B_nic + P S / B_mean. A ring all-reduce of the fp32 gradients (DDP) moves
    2 (P - 1) / P * G per learner per step with G = params * 4 B: T_epoch = steps * 2 (P - 1) / P * G / B_nic.
    ResNet-152 (60.2M), P 16, 100 Gbit/s, B_mean 5 GB/s: S = 722.4 MB, 2 P S = 23.1 GB -> 1.85 s on the
    wire + 11.6 GB / 5 GB/s = 2.31 s of arithmetic.
    Sharded (S = P shards, shard i on learner i's node): each shard receives P slices of S / P and its
    result of S / P is read by P learners, so each node's NIC carries about 2 S per round and each shard
    averages S bytes, in parallel: T_sharded = 2 S / B_nic + S / B_mean, flat in P (same example: 0.12 s
    + 0.14 s).
    """
    nic = nic_gbit * 1e9 / 8
    size = params * 4 * (1 + moments)
    grad = params * 4
    wire = 2 * learners * size / nic
    arithmetic = learners * size / (mean_gbps * 1e9)
    ring = steps * 2 * (learners - 1) / learners * grad / nic
    return {
        "payload_mb": size / 1e6,
        "wire_s": wire,
        "mean_s": arithmetic,
        "round_s": wire + arithmetic,
        "ring_epoch_s": ring,
        "sharded_wire_s": 2 * size / nic,
        "sharded_mean_s": size / (mean_gbps * 1e9),
        "sharded_round_s": 2 * size / nic + size / (mean_gbps * 1e9),
    }


def adam_payload(params: int, tensors: int, seed: int) -> tuple[dict, dict]:
    """A learner's payload: ``params`` fp32 values in ``tensors`` tensors, and an Adam state for them."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [params // tensors + (1 if i < params % tensors else 0) for i in range(tensors)]
    weights = {f"w{i}": torch.randn(n, generator=gen) for i, n in enumerate(sizes)}
    state = {
        i: {"step": torch.tensor(10.0), "exp_avg": torch.randn(n, generator=gen), "exp_avg_sq": torch.rand(n, generator=gen)}
        for i, n in enumerate(sizes)
    }  # fmt: skip
    return weights, state


class FlatState:
    """A bench learner's weights and Adam moments kept in the layout's flat buffers (``FlatStorage``),
    bound at the first round and written back after each, as ``LocalRounds.sync`` and ``install`` do."""

    def __init__(self, params: int, seed: int, tensors: int) -> None:
        from raytrain_seq.dataplane.flat_storage import FlatStorage
        from raytrain_seq.dataplane.payload import FlatLayout

        self.weights, self.moments = adam_payload(params, tensors, seed)
        self.layout = FlatLayout.of(self.weights, self.moments)
        why = FlatStorage.unsupported(self.layout, self.weights, self.moments)
        if why is not None:
            raise RuntimeError(f"the bench's state cannot be bound to flat buffers: {why}")
        self.storage = None  # a FlatStorage, bound at the first round

    def bind(self) -> None:
        """As LocalRounds.sync: the bound storage's layout while it holds the live state, else the
        layout of the live state, bound (the first round)."""
        from raytrain_seq.dataplane.flat_storage import FlatStorage
        from raytrain_seq.dataplane.payload import FlatLayout

        if self.storage is None or not self.storage.holds(self.weights, self.moments):
            self.layout = FlatLayout.of(self.weights, self.moments)
            if self.storage is None or self.storage.layout.signature != self.layout.signature:
                self.storage = FlatStorage(self.layout)
            self.storage.bind(self.weights, self.moments)

    def pack(self, shards: int) -> tuple[list, Any]:
        """The buffers' ``shards`` slices (views) and the layout's extras, bound first."""
        self.bind()
        return self.storage.slices(shards), self.layout.extras(self.weights, self.moments)

    def load(self, parts: list, extras: Any) -> None:
        """Write merged slices into the bound buffers (``FlatStorage.load_slices``)."""
        self.storage.load_slices(parts, extras, into_params=self.weights, into_moments=self.moments)


class NumpyFloor:
    """A round's copies and merge done with numpy alone, as the round's processes do them, on a learner's
    bound buffers: "put" copies its 100 MB into other memory (a put's copy), "merge" merges two 50 MB
    slices as a shard does (``merge_parts``), "return" copies the 50 MB merged slice into other memory
    (the shard's return value). The memory is written once beforehand, as the store's is (populated),
    so no pass faults."""

    def __init__(self, storage: Any) -> None:
        (self.key, buffer), *_ = storage.buffers.items()  # fp32 weights and moments: one buffer
        self.flat = buffer.numpy()
        half = len(self.flat) // 2
        self.into = np.ones_like(self.flat)
        self.parts = [{self.key: self.flat[:half]}, {self.key: self.flat[half : 2 * half]}]
        self.merged = None
        self.back = np.ones(half, dtype=self.flat.dtype)

    def seconds(self, phase: str) -> float:
        """One phase's seconds."""
        from raytrain_seq.dataplane.merge import merge_parts

        began = time.perf_counter()
        if phase == "put":
            np.copyto(self.into, self.flat)
        elif phase == "merge":
            self.merged = merge_parts(self.parts, [0.37, 0.63], reuse=self.merged)
        elif phase == "return":
            np.copyto(self.back, self.merged[self.key])
        else:
            raise ValueError(f"unknown phase {phase!r}: put, merge or return")
        return time.perf_counter() - began


def bench_client(averager: Any, rank: int, world_size: int, channels: bool) -> Any:
    """A bench learner's ``AveragerClient`` over Ray, as a learner's (its node, the store, channels)."""
    import uuid

    import ray

    from raytrain_seq.rounds.client import AveragerClient
    from raytrain_seq.runtime.channels import RayChannelEnds
    from raytrain_seq.runtime.ray_store import RayStore
    from raytrain_seq.runtime.transport import RayTransport

    return AveragerClient(
        RayTransport(averager), learner=rank, world_size=world_size, incarnation=uuid.uuid4().hex,
        round_timeout_s=600.0, store=RayStore(), node=ray.get_runtime_context().get_node_id(),
        channels=RayChannelEnds() if channels else None,
    )  # fmt: skip


def learner_class():
    """The bench's learner actor, defined here so that Ray pickles it by value (bench/ is not a package
    the workers can import). It does what ``LocalRounds.sync`` does, without a model: its weights and
    moments live in the layout's flat buffers (``FlatState``), it puts each buffer's S slices once,
    sends the references through ``AveragerClient`` and reads the merged state back (``materialise``);
    ``install`` then writes it into its buffers, as ``LocalRounds.install`` does, outside the timed
    round."""
    from raytrain_seq.dataplane.payload import FlatPayload

    class BenchLearner:
        def __init__(self, params: int, seed: int, tensors: int = TENSORS) -> None:
            torch.set_num_threads(1)
            self.flat = FlatState(params, seed, tensors)
            self.state = None  # the last round's averaged state (views of the merged objects)
            self.client = None
            self._floor: NumpyFloor | None = None  # made at the first call of ``floor``

        def join(self, averager, rank: int, world_size: int, channels: bool = False) -> int:
            self.client = bench_client(averager, rank, world_size, channels)
            self.client.join()
            # As LocalRounds.sync does at its first round: a learner then trains its next K steps while
            # the store's mapping is populated, so the bench waits for it here and reports its seconds.
            self.client.store.expect(2 * self.flat.layout.nbytes)
            return {"payload": self.flat.layout.nbytes, "populate_s": self.client.store.memory.wait()}

        def buffers(self) -> dict[str, np.ndarray]:
            """A copy of this learner's flat buffers (its weights and moments), bound first."""
            self.flat.bind()
            return {key: buffer.numpy().copy() for key, buffer in self.flat.storage.buffers.items()}

        def round(self) -> dict[str, float]:
            """One round; the seconds of its phases as this learner saw them, and the wall-clock times
            (``time.time``: one clock for every process of a node) at which it began and held the result."""
            began_at = time.time()
            began = time.perf_counter()
            flat = self.flat
            slices, extras = flat.pack(self.client.shards)
            packed = time.perf_counter()
            parts = self.client.send(slices)
            put = time.perf_counter()
            decision = self.client.average(
                FlatPayload(flat.layout, parts, extras), None, stats={}, position=None
            )
            self.state = decision.result.state
            if self.state.flat is None or not self.state.flat.local:
                raise RuntimeError("the round's state was not fetched: the learner must hold its slices")
            end = time.perf_counter()
            return {
                "pack_s": packed - began, "put_s": put - packed, "average_s": end - put,
                "began_at": began_at, "held_at": time.time(),
            }  # fmt: skip

        def wait_linked(self) -> bool:
            """Wait for the channel link the warm-up round started (a learner trains meanwhile)."""
            return self.client.wait_linked(120.0)

        def payload_slices(self, count: int) -> list[int]:
            """The bytes of each of ``count`` slices of this learner's buffers."""
            from raytrain_seq.dataplane.merge import part_nbytes

            return [part_nbytes(part) for part in self.flat.storage.slices(count)]

        def floor(self, phase: str) -> float:
            """One phase of a round's copies and merge done with numpy alone (``NumpyFloor``); its seconds."""
            if self._floor is None:
                self._floor = NumpyFloor(self.flat.storage)
            return self._floor.seconds(phase)

        def install(self) -> dict[str, float]:
            """Write the last round's merged slices into the bound buffers (``FlatStorage.load_slices``, as
            ``LocalRounds.install`` does); its seconds."""
            began = time.perf_counter()
            self.flat.load(self.state.flat.parts, self.state.flat.extras)
            return {"install_s": time.perf_counter() - began}

    return BenchLearner


class Baselines:
    """The one-process references for a round of 2 learners: a numpy mean of the same arrays and the library
    arithmetic (``average_states`` + ``merge_adam_states``), timed one pass at a time so that each pass
    can run just before one of the actor rounds. Interleaved, a drift of the machine's speed during the
    bench (a shared VM's memory bandwidth moves from minute to minute) reaches both sides of
    ``actor_vs_numpy`` alike, instead of only the side that happened to be measured at a slow moment.

    Each pass also counts the page faults of its thread (``faults``). Numpy's temporaries are fresh
    memory each pass, and where the allocator has handed freed memory back to the kernel a pass faults
    once per 4 KiB page of them: it then measures the kernel zeroing pages, not the mean (the averaging
    actors map the store's memory once, ``store_memory``). So the bench's process keeps freed memory
    (``heap.keep_freed_memory``, as a learner does), and prints the faults beside the figure."""

    def __init__(self, params: int) -> None:
        keep_freed_memory()
        self.payloads = [adam_payload(params, TENSORS, seed) for seed in (1, 2)]
        self.arrays = [
            [t.numpy() for t in w.values()]
            + [v.numpy() for e in s.values() for v in (e["exp_avg"], e["exp_avg_sq"])]
            for w, s in self.payloads
        ]
        self.seconds: dict[str, list[float]] = {"numpy": [], "library": []}
        self.faults: dict[str, list[float]] = {"numpy": [], "library": []}

    def time_once(self) -> None:
        """One pass of each, appended to ``seconds`` and ``faults``."""
        self._timed("numpy", self._numpy_mean)
        self._timed(
            "library",
            lambda: (
                average_states([w for w, _ in self.payloads]),
                merge_adam_states([s for _, s in self.payloads]),
            ),
        )

    def numpy_once(self) -> float:
        """One numpy pass's seconds, not kept in ``seconds``: a reference for the rounds through the other
        transport (``bandwidth``'s ``other_round_s``)."""
        began = time.perf_counter()
        self._numpy_mean()
        return time.perf_counter() - began

    def _numpy_mean(self) -> list[np.ndarray]:
        return [np.mean(np.stack(pair), axis=0) for pair in zip(*self.arrays, strict=True)]

    def _timed(self, name: str, work) -> None:
        faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        began = time.perf_counter()
        work()
        self.seconds[name].append(time.perf_counter() - began)
        self.faults[name].append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults)

    def summary(self, skip: int = 0) -> dict[str, float]:
        """``summarise`` of the passes timed so far."""
        return summarise(self.seconds, skip)

    def faults_per_pass(self, skip: int = 0) -> dict[str, float]:
        """The median page faults of a pass of each, the first ``skip`` left out."""
        return {name: float(np.median(values[skip:])) for name, values in self.faults.items()}


def summarise(seconds: dict[str, list[float]], skip: int = 0) -> dict[str, float]:
    """Median and fastest (``NAME_best``) of each list of seconds, its first ``skip`` left out.

    Example: ``{"numpy": [9.0, 3.0, 1.0, 2.0]}``, skip 1 -> ``{"numpy": 2.0, "numpy_best": 1.0}``."""
    out = {}
    for name, values in seconds.items():
        kept = values[skip:]
        if not kept:
            raise ValueError(f"no {name} pass timed after the first {skip}: time more passes or skip fewer")
        out[name] = float(np.median(kept))
        out[f"{name}_best"] = float(min(kept))
    return out


def bandwidth(
    megabytes: float,
    learners: tuple[int, ...] = (1, 2, 4, 8),
    rounds: int = 9,
    star: tuple[int, ...] = (2, 8),
    many_tensors: int | None = MANY_TENSORS,
    channels: bool | None = None,
    other: bool = True,
) -> dict:
    """One averaging round of n learners (n concurrent actor processes, each sending ``megabytes`` MB of
    fp32 weights + 2 Adam moments) through the data plane, n in ``learners``, default sharding (S = n);
    and the one-process numpy mean and library arithmetic of 2 learners' bytes.

    ``round_s[n]``: the median over ``rounds`` rounds of the wall time from the first learner starting to
    pack until the last one holds the averaged state, on the learners' clocks
    (``split_s[n]["driver_round_s"]``: the same rounds on the driver's, which adds its dispatch of each
    round and the learners' replies). Before them: each learner's one-time mapping of the object store
    (``store_memory``: a learner starts it at its first round and trains on meanwhile), one warm-up
    round, which creates the shard actors, and the shards' own one-time mapping, which their first merge
    starts; the longest of each is ``split_s[n]["populate_s"]`` and ``["shard_populate_s"]``.
    ``hub_load[n]``: the most bytes any one averaging actor received plus sent in the last round (counted
    by the actors: ``ParameterAverager.summary().hub_load``), over one learner's payload; the same with
    one shard (the star) for n in ``star``. ``round_s_2_by_tensors``: the round of 2 learners as above
    (their weights in ``TENSORS`` tensors) and with the same bytes in ``many_tensors`` tensors (None: not
    measured), so that what a round costs per tensor shows beside what it costs per byte (its split is
    ``split_s["2xN"]``). ``seconds`` (and ``mbps``, over 2 x megabytes): ``"actor"`` the round of 2 learners, ``"numpy"`` and ``"library"`` the median of the one-process passes, one timed
    just before each of those rounds (``Baselines``), ``"numpy_best"`` and ``"library_best"`` their
    fastest; ``reference_faults`` the median page faults of their passes. ``split_s[n]``: the median
    learner's slicing ("pack_s"; the device-to-host copy on CUDA), put and average-call seconds (the last:
    from its send to holding the merged state) and the slowest shard's read + merge seconds, per round:
    where a round's time goes; and "install_s", the median learner's writing of the merged state into
    its buffers after the round (``FlatStorage.load``, not part of ``round_s``). ``floor_s``: the round of
    2 learners' copies and merge done with numpy alone by the same two learner processes after each of
    those rounds (``BenchLearner.floor``: "put", "merge", "return", each the slower learner's, and their
    "total"), medians: what the round costs without Ray's part. ``channels``: whether the rounds go
    through the shared-memory channels once the learners are linked (the first, warm-up round goes
    through the object store and plans them; ``dataplane.generations``), None: as a run does by default
    (``TrainConfig.averager_channels``); ``transport`` says which. ``other_round_s``: with ``other``,
    the median of ``rounds`` rounds of the same 2 learners through the other transport, and
    ``other_numpy_s`` the median of numpy passes timed one before each of those rounds, else None.
    """
    import ray

    from raytrain_seq.config import TrainConfig

    if channels is None:
        channels = TrainConfig().averager_channels
    if 2 not in learners:
        raise ValueError(f"learners={learners}: the comparison with numpy is at 2 learners, so include 2")
    bench = Rounds(
        ray, int(megabytes * 1e6 / 4 / 3), channels, max(learners)
    )  # weights + 2 Adam moments, fp32
    round_s, hub_load, split = bench.by_learners(learners, rounds)
    other_s = other_numpy_s = None
    if other:
        other_s, other_numpy_s, split["2-other"] = bench.other_transport(rounds)
    # One round (its warm-up, through the store): only its bytes are used, so nothing links channels.
    star_load = {str(n): bench.measure(n, 1, 0, channels=False)[1] for n in star}
    for actor in bench.actors:
        ray.kill(actor)
    by_tensors = {str(TENSORS): round_s["2"]}
    if many_tensors:
        by_tensors[str(many_tensors)], split[f"2x{many_tensors}"] = bench.many_tensors(many_tensors, rounds)
    return {
        **bench.reference_seconds(round_s["2"]),
        "round_s": round_s,
        "round_s_2_by_tensors": by_tensors,
        "hub_load": hub_load,
        "hub_load_star": star_load,
        "split_s": split,
        "shards": "one per learner",
        "payload_mb": 3 * bench.params * 4 / 1e6,
        "reference_faults": bench.baselines.faults_per_pass(skip=1),
        "floor_s": bench.floor_medians(),
        "transport": "channels" if channels else "object store",
        "other_round_s": other_s,
        "other_numpy_s": other_numpy_s,
    }


class Rounds:
    """``bandwidth``'s rounds: the learner actors (``learner_class``), an averager per measurement, the
    one-process references timed beside the rounds of 2 (``Baselines``) and the numpy floor passes."""

    def __init__(self, ray: Any, params: int, channels: bool, learners: int) -> None:
        self.ray, self.params, self.channels = ray, params, channels
        self.baselines = Baselines(params)
        self.learner_cls = ray.remote(num_cpus=0)(learner_class())
        self.actors = [self.learner_cls.remote(params, seed) for seed in range(learners)]
        # The tensors each list's learners hold (to start fresh ones in their place).
        self.tensors_of = {id(self.actors): TENSORS}
        self.floors: list[dict[str, float]] = []

    def floor_pass(self, pair: list) -> dict[str, float]:
        """One pass of the round's copies and merge without Ray, the two learners doing each phase at
        once (as in a round: both learners put, then both shards merge, then both return): the slower
        one's seconds per phase."""
        ray = self.ray
        return {
            phase: max(ray.get([a.floor.remote(phase) for a in pair])) for phase in ("put", "merge", "return")
        }

    def measure(
        self,
        n: int,
        shards: int | None,
        count: int,
        actors=None,
        channels: bool | None = None,
        reference=None,
    ) -> tuple[list[float], float, dict]:
        """``count`` rounds (after one warm-up) of the first ``n`` of ``actors`` (default: the bench's
        learners) through a fresh averager of ``shards`` shards (None: one per learner): the rounds'
        seconds, the hub load of the last over one payload, and where a round's time goes (``split``)."""
        ray = self.ray
        actors = self.actors if actors is None else actors
        channels = self.channels if channels is None else channels
        averager = self._averager(n, shards, len(actors), channels)
        try:
            joined = ray.get([a.join.remote(averager, j, n, channels) for j, a in enumerate(actors[:n])])
            interleaved = reference is None and n == 2 and shards is None and actors is self.actors
            seen = self._rounds(averager, actors[:n], count, channels, interleaved, reference)
            rounds_ = ray.get(averager.summary.remote()).hub_load
            hub = (
                max(a["received"] + a["sent"] for a in rounds_[-1]["actors"].values()) / joined[0]["payload"]
            )
            seen["merge_s"] = [max(a.get("seconds", 0.0) for a in r["actors"].values()) for r in rounds_[1:]]
        finally:
            ray.kill(averager)
            if channels:
                # A channel's buffer stays in the object store until the process that made it exits
                # (dataplane.generations): fresh learner processes for the next measure, so that the store
                # does not fill with this one's channels.
                for j, actor in enumerate(actors[:n]):
                    ray.kill(actor)
                    actors[j] = self.learner_cls.remote(self.params, j, self.tensors_of[id(actors)])
        populated = [j["populate_s"] for j in joined if j["populate_s"] is not None]
        return seen["times"][1:], hub, _split(seen, populated, count)

    def _averager(self, n: int, shards: int | None, learners: int, channels: bool) -> Any:
        from raytrain_seq.rounds.settings import AveragerSettings
        from raytrain_seq.runtime.averager import create_averager

        extra = {} if shards is None else {"shards": shards}
        name = f"bandwidth-{os.getpid()}-{n}-{shards}-{learners}-{channels}"
        settings = AveragerSettings(world_size=n, timeout_s=600.0, channels=channels, **extra)
        return create_averager(name, settings, namespace=NAMESPACE)

    def _rounds(
        self, averager, actors: list, count: int, channels: bool, interleaved: bool, reference
    ) -> dict:
        """The warm-up round and ``count`` more: each one's seconds on the learners' and the driver's
        clocks, its phases, the references timed just before it, and the shards' one-time mapping."""
        ray = self.ray
        seen = {"times": [], "driver_times": [], "phases": [], "shard_memory": [], "references": []}
        for i in range(count + 1):
            # The references, each pass just before a round of the payload they are the mean of.
            if interleaved:
                self.baselines.time_once()
            elif reference is not None:
                seen["references"].append(reference())
            began = time.perf_counter()
            sent = ray.get([a.round.remote() for a in actors])
            seen["driver_times"].append(time.perf_counter() - began)
            # The round: from the first learner starting to pack to the last one holding the result,
            # on the learners' own clocks. The driver's wall time above also holds its dispatch of the
            # round to the learners and their replies to it, which training has no counterpart of.
            seen["times"].append(max(s.pop("held_at") for s in sent) - min(s.pop("began_at") for s in sent))
            # What a learner does next with the state (LocalRounds.install), timed apart: not the round.
            for phase, installed in zip(sent, ray.get([a.install.remote() for a in actors]), strict=True):
                phase.update(installed)
            seen["phases"].append({k: float(np.median([s[k] for s in sent])) for k in sent[0]})
            if interleaved:  # the same bytes without Ray, in the same learners, right after the round
                self.floors.append(self.floor_pass(actors[:2]))
            if i == 0 and channels:  # the rounds measured go through the channels the warm-up linked
                linked = ray.get([a.wait_linked.remote() for a in actors])
                if not all(linked):
                    raise RuntimeError(f"{len(actors)} learners: the channels did not link ({linked})")
            if i == 0:  # the shards decide at their first merge: the rounds measured start once done
                shard_actors = ray.get(averager.shard_actors.remote())
                seen["shard_memory"] = ray.get([s.store_memory.remote(120.0) for s in shard_actors])
        return seen

    def by_learners(self, learners: tuple[int, ...], rounds: int) -> tuple[dict, dict, dict]:
        """Rounds of n learners for n in ``learners``, one shard each: the median round, hub load, split."""
        round_s, hub_load, split = {}, {}, {}
        for n in learners:
            began = time.perf_counter()
            times, hub_load[str(n)], split[str(n)] = self.measure(n, None, rounds)
            round_s[str(n)] = float(np.median(times))
            print(f"  {n} learner(s): rounds {[round(t, 3) for t in times]} s ({time.perf_counter() - began:.0f} s with set-up)", file=sys.stderr, flush=True)  # fmt: skip
        return round_s, hub_load, split

    def other_transport(self, rounds: int) -> tuple[float, float, dict]:
        """Rounds of 2 learners through the transport the bench does not use by default, each after a
        numpy pass: the median round, the median numpy pass and the split."""
        times, _, beside = self.measure(
            2, None, rounds, channels=not self.channels, reference=self.baselines.numpy_once
        )
        name = "the object store" if self.channels else "channels"
        print(f"  2 learners through {name}: rounds {[round(t, 3) for t in times]} s", file=sys.stderr, flush=True)  # fmt: skip
        return float(np.median(times)), beside["reference_s"], beside

    def many_tensors(self, tensors: int, rounds: int) -> tuple[float, dict]:
        """Rounds of 2 fresh learners holding the same bytes in ``tensors`` tensors: median round, split."""
        many = [self.learner_cls.remote(self.params, seed, tensors) for seed in range(2)]
        self.tensors_of[id(many)] = tensors
        try:
            times, _, split = self.measure(2, None, rounds, actors=many)
        finally:
            for actor in many:
                self.ray.kill(actor)
        print(f"  2 learners of {tensors} tensors: rounds {[round(t, 3) for t in times]} s", file=sys.stderr, flush=True)  # fmt: skip
        return float(np.median(times)), split

    def reference_seconds(self, actor_s: float) -> dict[str, Any]:
        """``mb``, ``seconds`` and ``mbps``: the round of 2 learners against the one-process passes."""
        total_mb = 2 * 3 * self.params * 4 / 1e6  # what one round of 2 learners averages
        seconds = self.baselines.summary(skip=1)  # as the rounds: the first pass (a warm-up) is left out
        seconds["actor"] = actor_s
        return {"mb": total_mb, "seconds": seconds, "mbps": {k: total_mb / v for k, v in seconds.items()}}

    def floor_medians(self) -> dict[str, float]:
        """The floor passes' medians per phase and of their total (the warm-up's left out)."""
        floors = self.floors
        floor = (
            {phase: float(np.median([f[phase] for f in floors[1:]])) for phase in floors[0]} if floors else {}
        )
        if floor:
            floor["total"] = float(np.median([sum(f.values()) for f in floors[1:]]))
        return floor


def _split(seen: dict, populated: list[float], count: int) -> dict[str, float]:
    """Where a round's time goes: the median learner's phases and the slowest shard's merge, per round
    (the warm-up left out), and each process's one-time mapping of the store (absent where not done)."""
    phases = seen["phases"]
    split = {k: float(np.median([p[k] for p in phases[1:]])) for k in phases[0]} if count else {}
    if seen["merge_s"]:
        split["shard_merge_s"] = float(np.median(seen["merge_s"]))
    # Once per process, before its first round (learners) or after its first merge (shards):
    # store_memory.StoreMemory; absent where it was not populated.
    if populated:
        split["populate_s"] = float(max(populated))
    shard_populated = [m.seconds for m in seen["shard_memory"] if m.seconds is not None]
    if shard_populated:
        split["shard_populate_s"] = float(max(shard_populated))
    if count:
        split["driver_round_s"] = float(np.median(seen["driver_times"][1:]))
    if seen["references"]:
        split["reference_s"] = float(np.median(seen["references"][1:]))
    return split
