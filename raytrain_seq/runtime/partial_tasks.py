"""The partial-augmentation Ray tasks of the feed, and the objects their videos travel in.

A task computes ``videos_per_task`` videos (``data.task_bodies``: ``augment_videos``, and for the flow stream
``flow_videos`` once per video then ``window_videos`` per refurbish) and returns them as a few objects plus
one report: consecutive small videos share an object of at least ``OBJECT_BYTES`` (``object_bounds``), a
larger video is an object of its own. The feed (``runtime.feed``) keeps, per video, a ``CachedArray``
(the object and the video's index in it) and lends those; a reader turns them into arrays with one
``ray.get`` of their distinct objects (``fetch_arrays``). ``task_chunks`` cuts a launch into tasks whose
videos share a key (the epoch that recomputes them), so an object leaves the cache whole.

Why objects are shared: with one object per video, a video under Ray's 100 KiB inline limit (the demo's
21 x 36 x 36 x 3 bytes) lived in the feed's own memory and reached a learner through the feed's RPCs,
which cost the feed and the learners CPU every epoch (docs/ARCHITECTURE.md, "Measurements behind the code"). Why a large video stays
alone: a learner on another node then pulls only the videos it reads.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from raytrain_seq.data.task_bodies import augment_videos, flow_videos, window_videos

__all__ = [
    "OBJECT_BYTES",
    "CachedArray",
    "augment_task",
    "eval_lanes",
    "fetch_arrays",
    "flow_task",
    "lane_waits",
    "object_bounds",
    "placed",
    "task_chunks",
    "window_task",
]


@dataclasses.dataclass(frozen=True)
class CachedArray:
    """Where one video's cached array lives: item ``index`` of the list that the task output ``ref`` holds."""

    ref: Any
    index: int


def fetch_arrays(
    cached: Sequence[CachedArray], get: Callable[[list[Any]], list[Any]] | None = None
) -> list[np.ndarray]:
    """The arrays of ``cached``, in order: one ``get`` (``ray.get`` unless given) of their distinct task
    outputs."""
    if get is None:
        import ray

        get = ray.get
    refs = list(dict.fromkeys(c.ref for c in cached))
    outputs = dict(zip(refs, get(refs), strict=True))
    return [outputs[c.ref][c.index] for c in cached]


OBJECT_BYTES = 1 << 20  # a task's videos share objects of at least this size (a larger video is its own)


def object_bounds(sizes: Sequence[int], target: int) -> list[tuple[int, int]]:
    """Consecutive videos share an object until it holds ``target`` bytes; returns ``(lo, hi)`` per object.

    Sizes [600, 600, 600, 2000, 100] KiB at 1024 KiB: [(0, 2), (2, 4), (4, 5)]. Small videos share
    (a lone 80 KiB video would be inlined by Ray and served by the owner's RPCs); a video of a
    megabyte or more stays alone, so a learner on another node pulls only the videos it reads.
    """
    bounds, lo, held = [], 0, 0
    for k, size in enumerate(sizes):
        held += size
        if held >= target:
            bounds.append((lo, k + 1))
            lo, held = k + 1, 0
    if lo < len(sizes):
        bounds.append((lo, len(sizes)))
    return bounds


def task_chunks(count: int, per_task: int, keys: Sequence[Any] | None) -> list[list[int]]:
    """Positions ``0 .. count - 1`` cut into tasks of at most ``per_task``, positions of one key together,
    tasks in the order of their first position. Keys [a, b, a, a], 2 a task: [[0, 2], [1], [3]]."""
    groups: dict[Any, list[int]] = {}
    for k in range(count):
        groups.setdefault(None if keys is None else keys[k], []).append(k)
    tasks = [g[lo : lo + per_task] for g in groups.values() for lo in range(0, len(g), per_task)]
    return sorted(tasks, key=lambda task: task[0])


def lane_waits(tasks: int, lanes: int | None) -> list[int | None]:
    """For each of ``tasks`` tasks, the task it waits for, so that at most ``lanes`` run at once (None:
    all at once). Task k waits for task k - lanes: 6 tasks over 2 lanes run 0 -> 2 -> 4 and 1 -> 3 -> 5,
    i.e. [None, None, 0, 1, 2, 3]."""
    if lanes is None:
        return [None] * tasks
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
        raise ValueError(f"lanes must be an int >= 1 or None, got {lanes!r}")
    return [k - lanes if k >= lanes else None for k in range(tasks)]


def eval_lanes(cpus: int, learners: int, *, before_learners: bool) -> int:
    """Lanes of an evaluation split's tasks: the CPUs beyond one per learner (at least one), and at most
    one per learner while the learners are not running yet (``FeedTasks._waits`` says why). 16 CPUs, 2
    learners: 14 lanes, 2 before the learners run; 3 CPUs, 2 learners: 1 either way."""
    lanes = max(1, cpus - learners)
    return min(lanes, max(1, learners)) if before_learners else lanes


def placed(
    items: Sequence[Any], bounds: list[tuple[int, int]], refs: Sequence[Any]
) -> dict[Any, CachedArray]:
    """``items[k]`` (one per video of a task) -> where its array is among the task's object ``refs``."""
    return {
        items[k]: CachedArray(ref, k - lo)
        for (lo, hi), ref in zip(bounds, refs, strict=True)
        for k in range(lo, hi)
    }


def _grouped(arrays: list[np.ndarray], bounds: list[tuple[int, int]]) -> tuple[list[np.ndarray], ...]:
    if bounds[-1][1] != len(arrays):
        raise ValueError(f"object bounds {bounds} do not cover the task's {len(arrays)} videos")
    return tuple(arrays[lo:hi] for lo, hi in bounds)


def _chunk_of(body):
    """A task body's ``(*arrays, info)`` as ``(*objects, info)``: the arrays grouped by ``bounds`` (one
    list per object), the report its own object (the feed reads reports without fetching arrays)."""

    # ``after``: the report of the task this one waits for (lane_waits). Its value is not used: Ray starts
    # a task only once its arguments exist, and the report is a few bytes, where the arrays would travel.
    def task(*args, bounds: list[tuple[int, int]], after: Any = None):
        *arrays, info = body(*args)
        return (*_grouped(arrays, bounds), info)

    # The body's name in the dashboard; not functools.wraps, whose __wrapped__ would make Ray check
    # the call against the body's signature, which has no ``bounds``.
    task.__name__ = task.__qualname__ = body.__name__
    return task


def _windows_of_chunks(ids, epochs, seed, size, cost, where, *chunks, bounds):
    """``window_videos`` on stored flows given as flow-task objects: ``chunks`` are top-level arguments
    (so Ray hands the task their lists) and ``where[k] = (chunk position, index)`` is video k's flow."""
    flows = [chunks[c][i] for c, i in where]
    *arrays, info = window_videos(ids, epochs, seed, size, cost, *flows)
    return (*_grouped(arrays, bounds), info)


@functools.cache
def augment_task():
    """The Ray remote function, made on first use (nothing happens at import)."""
    import ray

    return ray.remote(_chunk_of(augment_videos))


@functools.cache
def flow_task():
    """The flow stream's once-per-video task (whole-frame optical flow), made on first use."""
    import ray

    return ray.remote(_chunk_of(flow_videos))


@functools.cache
def window_task():
    """The flow stream's refurbish task (a window of the stored flow), made on first use."""
    import ray

    return ray.remote(_windows_of_chunks)
