"""One averaging shard's merge: slice i of every learner's flat buffers, merged buffer by buffer by its rule.

A learner's flat payload (``dataplane.payload``) holds one buffer per merge rule and dtype, keyed
``"RULE/DTYPE"`` with RULE in ``RULES``: ``mean`` (the weighted mean), ``pmean`` and ``pvar`` (a
BatchNorm-style (mean, variance) pair at the same offsets of two buffers, merged by the law of total
variance) and ``max`` (AMSGrad's max). ``merge_parts`` merges one shard's slice of every learner with
``elementwise``'s numpy arithmetic, chunk by chunk, so that the merged slice equals that slice of
``averaging.average_states`` bit for bit. It imports numpy and the core's ``elementwise`` only: a shard's
process (``runtime.shards``) loads no torch, and starts about a CPU-second sooner (docs/ARCHITECTURE.md, "Measurements behind the code"): at a run's start the shards start beside the learners' first steps, and a shard
that Ray restarts mid-run does so on a round's critical path.

``ShardMerge`` is what a pool of shards returns for a round (``stores.ShardPool``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raytrain_seq.algorithms.elementwise import (
    accumulation_dtype,
    merge_mean_var,
    weighted_max,
    weighted_mean,
)

__all__ = ["CHUNK", "RULES", "ShardMerge", "merge_parts", "part_nbytes"]

RULES = ("mean", "pmean", "pvar", "max")
# Elements merged per step: the temporaries of a chunk (at most 3 x 1 MiB for float32 buffers, 3 x 2 MiB
# for float64 ones, allocated once per merge) stay in the last-level cache, and a 50 MB slice takes ~50
# steps, so the per-call overhead of the numpy ops is negligible (smaller chunks were slower:
# docs/ARCHITECTURE.md, "Measurements behind the code").
CHUNK = 1 << 18


@dataclass(frozen=True)
class ShardMerge:
    """What a pool's merge of one round gives: the merged parts (one per shard) and, per shard, the bytes
    it received and sent and the seconds it took to read and merge; or, when some shard could not read
    them in time, the indices of those payloads (``unreadable``), and no parts: the caller drops those
    learners and merges the others again (a learner frozen after it sent its round owns slices that a
    reader on another node waits for). With channels (``dataplane.generations``) the merged slices may be
    in the channels instead (``channelled``), or a shard may have lost them (``lost_channels``)."""

    parts: tuple[Any, ...] = ()
    loads: tuple[dict[str, float], ...] = ()
    unreadable: frozenset[int] = frozenset()
    channelled: bool = False
    """The merged slices were written into the generation's channels (``dataplane.generations``), not returned:
    ``parts`` is then empty."""
    lost_channels: bool = False
    """A shard no longer has the channels its parts name (Ray restarted it): no parts, nothing merged."""


def part_nbytes(part: Mapping[str, Any]) -> int:
    """Bytes of one part's arrays (a buffer's slice is an array, or a sequence of pieces of one)."""
    return sum(int(np.asarray(a).nbytes) for value in part.values() for a in _pieces(value))


def _pieces(value: Any) -> list[np.ndarray]:
    """A buffer's slice as its list of pieces (a flat array is one piece)."""
    return [value] if isinstance(value, np.ndarray) else list(value)


def _segments(slices: Sequence[Any], n: int) -> Iterator[tuple[int, int, list[np.ndarray]]]:
    """The [lo, hi) windows of ``n`` elements, CHUNK long (the last shorter), with every learner's
    elements of it: a view where the window lies inside one piece of that learner's slice, else the
    pieces' parts gathered into a staging array that the next window overwrites (so use each window
    before asking for the next). Why gather: a model of many small tensors gives slices of many small
    pieces, and merging piece by piece would pay the numpy calls' fixed cost once per piece.
    E.g. pieces (4, 6) and (10,), CHUNK 8: [0, 8) gathers t0 and t1[0:4] of the first learner and views
    the second's [0:8]; [8, 10) views both."""
    pieces = [_pieces(value) for value in slices]
    starts = [[0, *itertools.accumulate(len(p) for p in learner)] for learner in pieces]
    staging: list[np.ndarray | None] = [None] * len(pieces)
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        views = []
        for j, (learner, begin) in enumerate(zip(pieces, starts, strict=True)):
            i = bisect.bisect_right(begin, lo) - 1
            if hi <= begin[i + 1]:
                views.append(np.asarray(learner[i][lo - begin[i] : hi - begin[i]]))
                continue
            if staging[j] is None:
                staging[j] = np.empty(min(CHUNK, n), dtype=np.asarray(learner[i]).dtype)
            out, at = staging[j][: hi - lo], lo
            while at < hi:  # piece i holds [begin[i], begin[i + 1]); empty pieces are skipped
                take = min(hi, begin[i + 1]) - at
                out[at - lo : at - lo + take] = learner[i][at - begin[i] : at - begin[i] + take]
                at += take
                i += 1
            views.append(out)
        yield lo, hi, views


def _buffer(reuse: Mapping[str, np.ndarray] | None, key: str, n: int) -> np.ndarray:
    """A writable flat array of ``n`` elements of buffer ``key``'s dtype: ``reuse[key]`` when it is one."""
    dtype = np.dtype(key.split("/")[1])
    old = None if reuse is None else reuse.get(key)
    if isinstance(old, np.ndarray) and old.shape == (n,) and old.dtype == dtype and old.flags.writeable:
        return old
    return np.empty(n, dtype=dtype)


def merge_parts(
    parts: Sequence[Mapping[str, Any]],
    weights: Sequence[float],
    reuse: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Merge one shard's slice of every learner (``parts[j]``: learner j's), by each buffer's rule. A
    buffer's slice is a flat array or a sequence of pieces (``FlatLayout.slices``); the result is flat.

    ``reuse``: the result of an earlier call, whose arrays are overwritten where a buffer's length and
    dtype match (the caller must be done with them). Why: a fresh result is fresh memory, which the
    kernel zeroes page by page as the merge first writes it, an extra pass over the result's bytes in
    every round of a shard, whose rounds are memory-bound."""
    if not parts:
        raise ValueError("parts is empty: pass one part per learner of the round")
    keys = set(parts[0])
    lengths = [{k: sum(len(p) for p in _pieces(part[k])) for k in part} for part in parts]
    for j, part in enumerate(parts):
        if set(part) != keys or lengths[j] != lengths[0]:
            raise ValueError(f"learner {j}'s part differs from learner 0's in buffers or lengths")
    out: dict[str, np.ndarray] = {}
    # One scratch per accumulation dtype (3 x 1 MiB of float32 for float32 buffers), allocated once per merge.
    width = min(CHUNK, max(lengths[0].values(), default=0))
    workspaces: dict[np.dtype, np.ndarray] = {}
    for key in sorted(keys):
        rule = key.split("/")[0]
        if rule not in RULES:
            raise ValueError(f"unknown buffer {key!r}: buffers are named RULE/DTYPE with RULE in {RULES}")
        if rule == "pvar":
            continue  # merged with its pmean
        n = lengths[0][key]
        out[key] = _buffer(reuse, key, n)
        var_key = "pvar/" + key.split("/")[1]
        if rule == "pmean":
            out[var_key] = _buffer(reuse, var_key, n)
            # A pair's mean and variance lie at the same offsets (FlatLayout.of): the same windows serve both.
            values = [(part[key], part[var_key]) for part in parts]
            segments = zip(
                _segments([m for m, _ in values], n), _segments([v for _, v in values], n), strict=True
            )
            for (lo, hi, means), (_, _, variances) in segments:
                out[key][lo:hi], out[var_key][lo:hi] = merge_mean_var(means, variances, weights)
            continue
        for lo, hi, views in _segments([part[key] for part in parts], n):
            if rule == "mean":
                acc_dtype = accumulation_dtype(views[0].dtype)
                if acc_dtype not in workspaces:
                    workspaces[acc_dtype] = np.empty((3, width), dtype=acc_dtype)
                weighted_mean(views, weights, out=out[key][lo:hi], workspace=workspaces[acc_dtype])
            else:
                out[key][lo:hi] = weighted_max(views, weights)
    return out
