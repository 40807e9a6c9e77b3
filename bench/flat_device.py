"""A learner's side of an averaging round on its device: its state to the host and the merged state back.

``FlatStorage`` keeps a learner's state in flat buffers: on CUDA a round copies each to a reused pinned
host buffer (``slices``) and writes the merged slices back one copy per slice and buffer
(``load_slices``); the plain way copies per tensor (``.cpu()``, ``load_state_dict``). For the bench
learner's state (``averager_cost.adam_payload``) this times, interleaved round by round, the median of:
flat out, per tensor out, pinned out (the link's bound); flat in from pageable slices, one copy in, per
tensor in, pinned in; and on CUDA flat in from a shared mapping named as Ray's store, populated and
registered with CUDA as a learner's ``RayStore`` does. Prints GB/s per way and the ratios; ``--json``
one JSON last line. On a CPU the figures mean little. ``--threads`` as in ``runtime.learner``. No ray:

    python bench/flat_device.py --json
    python bench/flat_device.py --tensors 8,500 --megabytes 400
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from averager_cost import adam_payload

from raytrain_seq.dataplane.flat_storage import FlatStorage
from raytrain_seq.dataplane.payload import FlatLayout
from raytrain_seq.runtime.store_memory import StoreMemory, cuda_host_register, cuda_host_unregister

WAYS = ("flat out", "per tensor out", "pinned out", "flat in", "one copy in", "per tensor in", "pinned in")
# CUDA only: "flat in" from store memory registered with CUDA, as a CUDA learner's store is.
REGISTERED = "flat in, store registered"


class Learner:
    """One learner's state of ``params`` fp32 values in ``tensors`` tensors on ``device``, bound to flat
    buffers, and the host copies the ways read from."""

    def __init__(self, params: int, tensors: int, device: torch.device, shards: int) -> None:
        weights, moments = adam_payload(params, tensors, seed=0)
        self.device, self.shards = device, shards
        self.weights = {key: t.to(device) for key, t in weights.items()}
        self.moments = {
            i: {name: (v if name == "step" else v.to(device)) for name, v in entry.items()}
            for i, entry in moments.items()
        }
        layout = FlatLayout.of(self.weights, self.moments)
        why = FlatStorage.unsupported(layout, self.weights, self.moments)
        if why is not None:
            raise RuntimeError(f"the bench's state cannot be bound to flat buffers: {why}")
        self.storage = FlatStorage(layout, device)
        self.storage.bind(self.weights, self.moments)
        self.extras = layout.extras(self.weights, self.moments)
        # What a round reads back: pageable host slices (copies, as the store's memory is not the
        # learner's pinned staging), and per tensor the host tensors a state_dict would hold.
        self.merged = [{key: np.array(a) for key, a in part.items()} for part in self.storage.slices(shards)]
        self.host = [t.to("cpu", copy=True) for t in self.tensors()]
        self.pinned = torch.empty(self.nbytes() // 4, dtype=torch.float32, pin_memory=device.type == "cuda")
        # Written, not only allocated: a copy from never-touched pages reads the kernel's zero page.
        self.pageable = torch.cat([torch.from_numpy(a) for part in self.merged for a in part.values()])
        self._mapping: mmap.mmap | None = None
        self._registered_at: int | None = None
        self.registered = self._in_registered_store(self.merged) if device.type == "cuda" else None

    def close(self) -> None:
        """Unregister and unmap the store stand-in (the next learner's mapping may get its addresses)."""
        if self._registered_at is not None:
            torch.cuda.synchronize(self.device)
            cuda_host_unregister(self._registered_at)
            self._registered_at = None
        if self._mapping is not None:
            self.registered = None  # its views hold the mapping's buffer
            self._mapping.close()
            self._mapping = None

    def _in_registered_store(self, parts: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """The merged slices copied into a shared mapping named as Ray's store is (``/dev/shm/plasma...``),
        populated and registered with CUDA by ``StoreMemory`` as a CUDA learner's ``RayStore`` does it:
        the memory a learner's install reads from. Read-only views, as ``ray.get`` gives."""
        size = sum(a.nbytes for part in parts for a in part.values())
        path = f"/dev/shm/plasma-flat-device-{os.getpid()}"
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self._mapping = mmap.mmap(fd, size, mmap.MAP_SHARED)
        finally:
            os.close(fd)
            os.unlink(path)  # the mapping stays, "(deleted)" in /proc/self/maps like the store's
        anchor = ctypes.c_char.from_buffer(self._mapping)
        start = ctypes.addressof(anchor)
        del anchor  # an exported buffer would keep the mapping from closing
        maps = Path("/proc/self/maps")
        ours = lambda: "\n".join(m for m in maps.read_text().splitlines() if m.startswith(f"{start:x}-"))  # noqa: E731
        memory = StoreMemory(rounds=1, read_maps=ours, register=cuda_host_register)
        memory.expect(len(self._mapping) + mmap.PAGESIZE)  # the mapping ends on a page: cover it whole
        memory.wait()
        self._registered_at = start if memory.registered_bytes else None
        if memory.registered_bytes < size:
            raise RuntimeError(
                f"the bench's store mapping was not registered with CUDA ({memory.decision}; "
                f"registration: {memory.register_error!r})"
            )
        out, at = [], 0
        for part in parts:
            views = {}
            for key, array in part.items():
                view = np.frombuffer(self._mapping, dtype=array.dtype, count=array.size, offset=at)
                view[:] = array
                view.flags.writeable = False
                views[key], at = view, at + array.nbytes
            out.append(views)
        return out

    def tensors(self) -> list[torch.Tensor]:
        return [
            *self.weights.values(),
            *(e[n] for e in self.moments.values() for n in ("exp_avg", "exp_avg_sq")),
        ]

    def nbytes(self) -> int:
        return self.storage.nbytes()

    def way(self, name: str) -> None:
        """Run one way once, to completion on the device."""
        if name == "flat out":
            self.storage.slices(self.shards)  # synchronises itself
        elif name == "per tensor out":
            [t.to("cpu", copy=True) for t in self.tensors()]  # each waits for its copy
        elif name in ("pinned out", "pinned in", "one copy in"):
            (buffer,) = self.storage.buffers.values()  # fp32 weights and moments: one buffer
            host = self.pageable if name == "one copy in" else self.pinned
            if name == "pinned out":
                host.copy_(buffer, non_blocking=True)
            else:
                buffer.copy_(host, non_blocking=True)
            self.sync()
        elif name in ("flat in", REGISTERED):
            parts = self.merged if name == "flat in" else self.registered
            self.storage.load_slices(parts, self.extras, into_params=self.weights, into_moments=self.moments)
            self.sync()
        elif name == "per tensor in":
            with torch.no_grad():
                for tensor, host in zip(self.tensors(), self.host, strict=True):
                    tensor.copy_(host)
            self.sync()
        else:
            raise ValueError(f"unknown way {name!r}: one of {WAYS}")

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def measure(learner: Learner, rounds: int) -> dict[str, float]:
    """The median seconds of each way over ``rounds`` interleaved rounds, after one untimed round."""
    ways = WAYS if learner.registered is None else (*WAYS, REGISTERED)
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(rounds + 1):
        for name in ways:
            began = time.perf_counter()
            learner.way(name)
            if r:
                seconds[name].append(time.perf_counter() - began)
    return {name: statistics.median(s) for name, s in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--megabytes", type=float, default=100.0, help="weights + moments per learner")
    parser.add_argument("--tensors", default="8,500", help="comma-separated tensor counts, one run each")
    parser.add_argument("--shards", type=int, default=2, help="S: the slices a round cuts each buffer into")
    parser.add_argument("--rounds", type=int, default=9, help="timed interleaved rounds (the median)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (a learner's one)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON last line")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.tensors.split(",") if c.strip()]
    if not counts or min(counts) < 1:
        parser.error(f"--tensors {args.tensors!r}: give positive tensor counts, e.g. 8,500")
    for name in ("megabytes", "shards", "rounds", "threads"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not cuda:
        parser.error(f"--device {args.device}: torch sees no CUDA device; pass --device cpu")
    torch.set_num_threads(args.threads)
    params = int(args.megabytes * 1e6 / 12)  # a weight and its two moments: 12 bytes
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result: dict[str, Any] = {"device": name, "megabytes": params * 12 / 1e6, "threads": args.threads}
    gb_s: dict[str, dict[str, float]] = {}
    for count in counts:
        learner = Learner(params, count, device, args.shards)
        try:
            seconds = measure(learner, args.rounds)
        finally:
            learner.close()
        gb_s[str(count)] = {way: learner.nbytes() / s / 1e9 for way, s in seconds.items()}
        del learner
    ratios = {
        count: {
            "flat_vs_per_tensor_out": g["flat out"] / g["per tensor out"],
            "flat_vs_per_tensor_in": g["flat in"] / g["per tensor in"],
            "flat_vs_one_copy_in": g["flat in"] / g["one copy in"],
            **({"registered_vs_flat_in": g[REGISTERED] / g["flat in"]} if REGISTERED in g else {}),
        }
        for count, g in gb_s.items()
    }
    print(f"{params * 12 / 1e6:.0f} MB of fp32 weights + Adam moments on {name}, S = {args.shards}, "
          f"{args.threads} torch thread(s); GB/s, median of {args.rounds} interleaved rounds")  # fmt: skip
    print(f"{'way':<26}" + "".join(f"{c + ' tensors':>14}" for c in gb_s))
    for way in (*WAYS, REGISTERED):
        if all(way in g for g in gb_s.values()):
            print(f"{way:<26}" + "".join(f"{g[way]:>14.2f}" for g in gb_s.values()))
    for key in next(iter(ratios.values())):
        print(f"{key:<26}" + "".join(f"{r[key]:>13.2f}x" for r in ratios.values()))
    result["gb_s"] = {c: {w: round(v, 2) for w, v in g.items()} for c, g in gb_s.items()}
    result["ratios"] = {c: {k: round(v, 2) for k, v in r.items()} for c, r in ratios.items()}
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
