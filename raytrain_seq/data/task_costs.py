"""What the feed's tasks cost: their reports tallied by the epoch they computed for, and a run's feed block.

A partial-augmentation task (``data.task_bodies.augment_videos``, and the flow stream's two) reports its ids,
computing epochs, wall seconds, process CPU-seconds (``cpu_s``), kept frames, CPU by stage (decode and
probe, cache read, partial augmentation) and frame-cache hits and misses. ``task_tallies`` sums them per
computing epoch (None: evaluation) for ``BlockFeed.stats``; ``feed_cost`` turns the feed's report and
rank 0's into ``summary.json``'s ``feed``: CPU-seconds per kept frame served, cold (epoch 0) and warm,
and the learners' wait. Pure: no Ray; docs/ARCHITECTURE.md, "The frame cache", says where it is read.
"""

from __future__ import annotations

from typing import Any

from raytrain_seq.outputs.reports import FeedReport, LearnerReport

__all__ = ["feed_cost", "partial_cost", "task_tallies"]


def task_tallies(infos: list[dict[str, Any]]) -> tuple[dict, dict, dict, dict, dict]:
    """The tasks' reports by computing epoch (None: evaluation): the video ids each ran, their seconds,
    the flow stream's flows and each flow's CPU seconds, and ``partial_cost``'s CPU, frames and stages."""
    ran: dict[int | None, list[int]] = {}  # computing epoch (None: evaluation) -> video ids
    seconds: dict[int | None, float] = {}
    flowed: dict[int | None, list[int]] = {}  # flow stream: epoch -> ids whose flow it computed
    flow_cpu: dict[int, float] = {}  # flow stream: video id -> CPU seconds of its decode + flow
    costs: dict[int | None, dict[str, Any]] = {}  # epoch -> partial_cost's CPU, frames and stages
    for info in infos:
        flow = info.get("kind") == "flow"
        if "cpu_s" in info:
            partial_cost(costs, info)
        for k, (video, epoch) in enumerate(zip(info["ids"], info["epochs"], strict=True)):
            (flowed if flow else ran).setdefault(epoch, []).append(video)
            seconds[epoch] = seconds.get(epoch, 0.0) + info["seconds"] / len(info["ids"])
            if flow:
                flow_cpu[video] = info["flow_seconds"][k]
    return ran, seconds, flowed, flow_cpu, costs


def partial_cost(costs: dict[int | None, dict[str, Any]], info: dict[str, Any]) -> None:
    """Add one augment task's report to ``costs[epoch]``: ``partial_cpu_s`` (its process CPU, shared out
    over its videos by frames), ``partial_frames``, ``stages`` (CPU seconds by stage) and ``frame_cache``
    (hits, misses). A task of 2 videos of 30 and 10 frames and 4 CPU-seconds gives 3 s to the first's
    epoch and 1 s to the second's. The cache counts are whole: a task computes for one epoch (the feed
    launches an epoch's recomputes together), and one of several epochs gets them all."""
    frames = info["frames"]
    total = sum(frames) or 1
    stages = info.get("stages", {})
    for epoch, count in zip(info["epochs"], frames, strict=True):
        entry = costs.setdefault(
            epoch, {"partial_cpu_s": 0.0, "partial_frames": 0, "stages": {}, "frame_cache": {}}
        )
        share = count / total
        entry["partial_cpu_s"] += info["cpu_s"] * share
        entry["partial_frames"] += count
        for key, value in stages.items():
            entry["stages"][key] = entry["stages"].get(key, 0.0) + value * share
    if info["epochs"]:
        first = costs[info["epochs"][0]]
        if "wall" in info:  # for stats(ids=True): [start, end, CPU-seconds] of each task
            first.setdefault("spans", []).append([*info["wall"], info["cpu_s"]])
        counts = first["frame_cache"]
        for key, value in info.get("frame_cache", {}).items():
            counts[key] = counts.get(key, 0) + value


def feed_cost(feed: FeedReport, metrics: LearnerReport) -> dict[str, Any]:
    """What the feed cost in CPU-seconds (the actor and its tasks) per kept frame served, and what the
    learners waited for it (rank 0's data wait, the cold epoch's included).

    Epoch 0 is cold (every video decoded and augmented); later epochs are warm (decoded frames read from
    the frame cache, 1/r of the videos augmented again). A task's CPU counts in the epoch it computed
    for; the actor's own CPU is shared over the frames served. E.g. epochs 0 and 1 serving 1,000 frames
    each, their tasks' CPU 2 and 0.5 seconds, the actor's 0.2: cold 2.1e-3 CPU-seconds a frame, warm 6e-4.
    """
    served = {int(e): entry for e, entry in feed.epochs.items() if entry.get("kept_frames")}
    cold = served.get(0, {})
    warm = [entry for e, entry in served.items() if e >= 1]
    kept = sum(entry["kept_frames"] for entry in served.values())
    actor = float(feed.totals.get("actor_cpu_s", 0.0))
    share = actor / kept if kept else 0.0
    warm_frames = sum(entry["kept_frames"] for entry in warm)
    stages: dict[str, float] = {}
    for entry in [*feed.epochs.values(), feed.eval]:
        for key, value in entry.get("stages", {}).items():
            stages[key] = stages.get(key, 0.0) + value
    tasks = sum(float(entry.get("partial_cpu_s", 0.0)) for entry in [*feed.epochs.values(), feed.eval])
    return {
        "kept_frames": kept,
        "cpu_s": tasks + actor,
        "cpu_s_per_kept_frame_cold": (
            cold.get("partial_cpu_s", 0.0) / cold["kept_frames"] + share if cold else None
        ),
        "cpu_s_per_kept_frame_warm": (
            sum(entry.get("partial_cpu_s", 0.0) for entry in warm) / warm_frames + share
            if warm_frames
            else None
        ),
        "learner_wait_s": float(metrics.data_wait_s) + float(metrics.cold_epoch_s),
        "stages_cpu_s": stages,
        "actor_cpu_s": actor,
    }
