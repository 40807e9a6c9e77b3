"""The bodies of the feed's partial-augmentation tasks: plain functions ``runtime.partial_tasks`` submits.

``augment_videos`` is the expensive, cached half of Revamper's split augmentation for a batch of ids: it
loads each video through this process's source (``sources.get_source``: decode in one thread, the task
holds one CPU; resize to ``data.cache_size``; the partial augmentation seeded by ``seeds.partial_rng(seed,
video, computing epoch)``), so a recompute anywhere gives the same bytes; ``epoch=None`` is the
deterministic evaluation resize. The flow stream computes each video's flow ONCE over the whole frame
(``flow_videos``) and the feed keeps it; its refurbish is ``window_videos``, a slice
``flow.flow_window(flow, size, sources.flow_offset(seed, video, epoch))``. Contract: each returns one
uint8 array per video, then one report dict (``data.task_costs`` reads it); a video that fails to decode
is an all-zero clip of the catalog length, listed in the report's ``failed``.
"""

from __future__ import annotations

import time

import numpy as np

from raytrain_seq.data.flow import flow_window
from raytrain_seq.data.sources import flow_offset, get_source

__all__ = ["augment_videos", "busy", "flow_videos", "window_videos"]


def busy(seconds: float) -> None:
    """Burn ``seconds`` of this thread's CPU time (``data.augment_cost``: makes augmentation the
    bottleneck on purpose). CPU time, not wall time: on a loaded machine a wall-clock spin would get
    only its share of a core, and the cost it stands for would shrink with the load."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def augment_videos(
    source: tuple,
    video_ids: list[int],
    epochs: list[int | None],
    seed: int,
    size: int,
    cost: float,
    frame_cost: float = 0.0,
) -> tuple:
    """Task body: decode + partial augmentation of each video; epoch None = evaluation resize.

    ``cost`` busy CPU seconds per video (``data.augment_cost``), and ``frame_cost`` per frame of a
    training video (``data.augment_cost_per_frame``: a per-frame transform such as RandAugment; the
    evaluation resize has none). Returns one uint8 array per video, then ``{"ids", "epochs", "seconds",
    "failed", "refit", "flow_method"}`` (one extra return): ``failed`` lists ``[path, reason]`` of videos
    served as zero clips, ``refit`` ``[path, decoded, catalog]`` of lengths fixed to the catalog's.
    """
    videos = get_source(source)
    began, cpu = time.perf_counter(), time.process_time()
    out, failed, refit = [], [], []
    stages: dict[str, float] = {}
    cache = {"hits": 0, "misses": 0}
    for video, epoch in zip(video_ids, epochs, strict=True):
        frames, report = videos.load(video, epoch, seed, size)
        out.append(frames)
        failed += report.get("failed", [])
        refit += report.get("refit", [])
        for key, value in report.get("stages", {}).items():
            stages[key] = stages.get(key, 0.0) + value
        for key, value in report.get("frame_cache", {}).items():
            cache[key] += value
        busy(cost + (frame_cost * len(frames) if epoch is not None else 0.0))
    info = {
        "ids": list(video_ids),
        "epochs": list(epochs),
        "seconds": time.perf_counter() - began,
        # CPU of the whole process (decoder threads included) while it ran the body: a task worker runs
        # one task at a time, so this is the task's cost in CPU-seconds, which holds on a busy machine.
        "cpu_s": time.process_time() - cpu,
        "wall": [time.time() - (time.perf_counter() - began), time.time()],  # when it ran (epoch seconds)
        "frames": [len(frames) for frames in out],
        "stages": stages,
        "frame_cache": cache,
        "failed": failed,
        "refit": refit,
        "flow_method": videos.flow_method,
    }
    return (*out, info)


def flow_videos(source: tuple, video_ids: list[int], epochs: list[int | None], size: int) -> tuple:
    """Task body of the flow stream's once-per-video half: ``RealVideos.flow`` of each video.

    Returns one uint8 ``[T, H, W, 2]`` whole-frame flow per video (short side ``size``), then ``{"kind":
    "flow", "ids", "epochs", "seconds", "cpu_s", "frames", "flow_seconds", "failed", "refit", "flow_method"}``:
    ``flow_seconds`` is each video's CPU seconds of decoding and flow (this thread's CPU time, so a busy
    machine does not inflate it): what a recompute of that video would pay again. ``epochs`` are the
    computing epochs that first needed each flow (None: evaluation), echoed for the feed's statistics;
    the flow does not depend on them.
    """
    videos = get_source(source)
    began, process = time.perf_counter(), time.process_time()
    out, each, failed, refit = [], [], [], []
    for video in video_ids:
        cpu = time.thread_time()
        flow, report = videos.flow(video, size)
        each.append(time.thread_time() - cpu)
        out.append(flow)
        failed += report.get("failed", [])
        refit += report.get("refit", [])
    info = {
        "kind": "flow",
        "ids": list(video_ids),
        "epochs": list(epochs),
        "seconds": time.perf_counter() - began,
        "cpu_s": time.process_time() - process,  # as augment_videos': the feed's cost in CPU-seconds
        "frames": [len(flow) for flow in out],
        "flow_seconds": each,
        "failed": failed,
        "refit": refit,
        "flow_method": videos.flow_method,
    }
    return (*out, info)


def window_videos(
    video_ids: list[int], epochs: list[int | None], seed: int, size: int, cost: float, *flows: np.ndarray
) -> tuple:
    """Task body of the flow stream's refurbish: each stored flow's window for ``(seed, video, epoch)``.

    ``flows`` are ``flow_videos``'s arrays (Ray resolves the refs passed in their place). Returns one
    uint8 ``[T, size, size, 2]`` per video, then ``{"kind": "window", "ids", "epochs", "seconds", "cpu_s", "frames",
    "failed", "refit", "flow_method"}`` (no decode happens here, so nothing fails or is refitted).
    """
    if len(flows) != len(video_ids):
        raise ValueError(f"window_videos needs one flow per video, got {len(flows)} for {len(video_ids)} ids")
    began, process = time.perf_counter(), time.process_time()
    out = []
    for video, epoch, flow in zip(video_ids, epochs, flows, strict=True):
        out.append(flow_window(flow, size, flow_offset(seed, video, epoch)))
        busy(cost)
    info = {
        "kind": "window",
        "ids": list(video_ids),
        "epochs": list(epochs),
        "seconds": time.perf_counter() - began,
        "cpu_s": time.process_time() - process,
        "frames": [len(window) for window in out],
        "failed": [],
        "refit": [],
        "flow_method": None,
    }
    return (*out, info)
