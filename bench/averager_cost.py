"""The averager's cost: its measured bandwidth, and a cost model for a large cluster.

AAVG (Cong et al.) averages the learners' weights and merges their Adam moments every K steps through
one ParameterAverager actor (``raytrain_seq.runtime.averager``): a star. ``bandwidth`` measures how many
MB/s of fp32 weights + moments one round of 2 learners pushes through the actor on this machine
(serialisation, the object store and the arithmetic included) against a plain numpy mean of the same
arrays and the library arithmetic (``averaging.average_states`` + ``merge_adam_states``) in one
process. ``cost_model`` extrapolates a round to P learners of a given size over a NIC of a given speed
and compares it with DDP's ring all-reduce of the gradients per epoch.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from raytrain_seq.averaging import average_states, merge_adam_states

NAMESPACE = "raytrain_seq"


def cost_model(
    learners: int, params: float, nic_gbit: float, mean_gbps: float, *, steps: int, moments: int = 2
) -> dict[str, float]:
    """Seconds per averaging round of the star-shaped averager vs a ring all-reduce per epoch.

    Per learner the averager receives and returns S = params * 4 B * (1 + moments) (weights + Adam
    moments, fp32). Its NIC carries 2 P S per round (P learners in, P results out) and it averages P S
    bytes: T_round = 2 P S / B_nic + P S / B_mean. A ring all-reduce of the fp32 gradients (DDP) moves
    2 (P - 1) / P * G per learner per step with G = params * 4 B: T_epoch = steps * 2 (P - 1) / P * G / B_nic.
    ResNet-152 (60.2M), P 16, 100 Gbit/s, B_mean 5 GB/s: S = 722.4 MB, 2 P S = 23.1 GB -> 1.85 s on the
    wire + 11.6 GB / 5 GB/s = 2.31 s of arithmetic.
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


def bandwidth(megabytes: float, rounds: int = 5) -> dict:
    """MB/s averaged by the actor (2 learners), by a numpy mean, and by the library arithmetic in process.

    Best of ``rounds`` for each (a shared machine only ever slows a run down).
    """
    import ray

    from raytrain_seq.runtime.averager import create_averager

    params = int(megabytes * 1e6 / 4 / 3)  # weights + 2 Adam moments, fp32
    payloads = [adam_payload(params, 8, seed) for seed in (1, 2)]
    total_mb = 2 * 3 * params * 4 / 1e6  # what one round averages: 2 learners x (weights + 2 moments)
    arrays = [[t.numpy() for t in w.values()] + [v.numpy() for e in s.values() for v in (e["exp_avg"], e["exp_avg_sq"])] for w, s in payloads]  # fmt: skip
    numpy_s = []
    for _ in range(rounds):
        began = time.perf_counter()
        [np.mean(np.stack(pair), axis=0) for pair in zip(*arrays, strict=True)]
        numpy_s.append(time.perf_counter() - began)
    library_s = []
    for _ in range(rounds):
        began = time.perf_counter()
        average_states([w for w, _ in payloads])
        merge_adam_states([s for _, s in payloads])
        library_s.append(time.perf_counter() - began)
    averager = create_averager(f"bandwidth-{os.getpid()}", namespace=NAMESPACE, world_size=2, timeout_s=300.0)
    ray.get([averager.join.remote(j, 2) for j in (0, 1)])
    actor_s = []
    for round_ in range(1, rounds + 1):
        began = time.perf_counter()
        ray.get([averager.average.remote(j, round_, 2, w, s) for j, (w, s) in enumerate(payloads)])
        actor_s.append(time.perf_counter() - began)
    ray.kill(averager)
    best = {name: min(v) for name, v in (("numpy", numpy_s), ("library", library_s), ("actor", actor_s))}
    return {"mb": total_mb, "seconds": best, "mbps": {k: total_mb / v for k, v in best.items()}}
