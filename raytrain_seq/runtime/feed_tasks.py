"""The feed's Ray tasks: ``FeedTasks.launch`` submits the partial augmentations a planner's ``Launch`` names.

A task takes up to ``videos_per_task`` videos of one renewal epoch and one home node (the node whose frame
cache has them, ``frame_cache.home_nodes``), returns them in objects of at least ``OBJECT_BYTES`` (one
extra return reports ids and seconds) and is sent to that node with a soft affinity that spills. An
evaluation split's tasks run in lanes (``lane_waits``). The flow stream computes a training video's
whole-frame flow once, keeps its ref for the run, and cuts every refurbish's window out of it. It returns
where each video's array will be (``CachedArray``), in order; the reports' refs wait in ``reports`` for
``stats()``. Only what Ray needs lives here; which videos and epochs to compute is the planner's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raytrain_seq.data.frame_cache import home_nodes
from raytrain_seq.data.sources import source_kwargs
from raytrain_seq.parts import FeedSettings
from raytrain_seq.runtime.partial_tasks import (
    OBJECT_BYTES,
    CachedArray,
    augment_task,
    eval_lanes,
    flow_task,
    lane_waits,
    object_bounds,
    placed,
    task_chunks,
    window_task,
)

__all__ = ["FeedTasks"]


class FeedTasks:
    """Submits a feed's partial-augmentation tasks; keeps the flow stream's flows and the tasks' reports."""

    def __init__(
        self,
        settings: FeedSettings,
        frames: dict[int, int],
        channels: int,
        *,
        videos_per_task: int,
        partial_cpus: float,
    ) -> None:
        self._data, self._max_learners = settings.data, settings.max_learners
        self._frames, self._channels = frames, channels  # video id -> cached frames; frame channels
        self._videos_per_task, self._partial_cpus = videos_per_task, partial_cpus
        self._flow_once = settings.data.stream == "flow"
        # Flow once: a flow run computes each training video's whole-frame flow once and keeps its ref for
        # the run (Ray spills it when the store is full); a refurbish then only cuts a window out of it.
        self._flows: dict[int, CachedArray] = {}  # training video id -> its whole-frame flow
        self.reports: list[Any] = []  # refs of the tasks' reports not collected yet
        # True while an evaluation split is launched before the learners run (``prefetch_eval``): its
        # tasks then take at most one lane per learner, however many CPUs the cluster has (``_waits``).
        self.before_learners = False

    def launch(
        self, videos: list[int], epochs: list[int | None], renewal: Sequence[int] | None = None
    ) -> list[CachedArray]:
        """Submit partial augmentation tasks; returns where each video's array will be, in order.

        ``renewal``: per video, the epoch that recomputes it next; a task holds videos of one renewal epoch
        only, so its objects leave the cache whole instead of pinning older copies.
        """
        if self._flow_once:
            return self._launch_windows(videos, epochs, renewal)
        task = augment_task()
        source, data, seed = source_kwargs(self._data), self._data, self._data.seed
        placed_at: dict[int, CachedArray] = {}  # position in videos -> where its array will be
        # A task holds videos of one renewal epoch and one home node (the node whose frame cache has them).
        home = self._homes(videos)
        keys = [(None if renewal is None else renewal[k], home.get(v)) for k, v in enumerate(videos)]
        chunks = task_chunks(len(videos), self._videos_per_task, keys)
        waits = self._waits(len(chunks), epochs)
        reports: list[Any] = []
        for chunk, wait in zip(chunks, waits, strict=True):
            ids = [videos[k] for k in chunk]
            bounds = self._bounds(ids)
            options = {"num_returns": len(bounds) + 1, "num_cpus": self._partial_cpus}
            if ids[0] in home:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                # Soft, and spilled when the home node has no free CPU now: a node that is gone, or whose
                # CPUs the learners hold, yields to any node, which decodes (and caches) the videos itself
                # instead of the task waiting there for ever. Ray's option for it is marked private; Ray
                # Data's locality-aware scheduling spills the same way.
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                    node_id=home[ids[0]], soft=True, _spill_on_unavailable=True
                )
            out = task.options(**options).remote(
                source, ids, [epochs[k] for k in chunk], seed, data.cache_size, data.augment_cost,
                data.augment_cost_per_frame, bounds=bounds, after=None if wait is None else reports[wait],
            )  # fmt: skip
            placed_at.update(placed(chunk, bounds, out[:-1]))
            reports.append(out[-1])
            self.reports.append(out[-1])
        return [placed_at[k] for k in range(len(videos))]

    def _homes(self, videos: list[int]) -> dict[int, str]:
        """Each video's home node (``frame_cache.home_nodes`` over the alive nodes with CPUs, weighted by
        them) when real RGB videos go through the frame cache, else none (any node will do)."""
        data = self._data
        if data.dataset == "synthetic" or data.stream != "rgb" or data.frame_cache_gib == 0:
            return {}
        import ray

        nodes = {
            n["NodeID"]: float(n["Resources"].get("CPU", 0.0))
            for n in ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0.0) > 0
        }
        return home_nodes(videos, nodes)

    def _waits(self, tasks: int, epochs: Sequence[int | None]) -> list[int | None]:
        """``lane_waits`` of a launch's ``tasks``: an evaluation split's (every epoch None) run in as many
        lanes as the cluster has CPUs beyond one per learner (at least one), and in at most one per
        learner when launched before the learners run (``prefetch_eval``); an epoch's run as CPUs come
        free. The validation rows are launched as the feed starts, before the learners are placed:
        all at once, their tasks took every free CPU, each in a worker process of its own (most of them
        then stayed idle for the run), and slowed the learners' start (docs/ARCHITECTURE.md, "Measurements behind the code"). In lanes of the CPUs beyond the learners, a node with more logical CPUs started more
        of those processes: Ray starts a bounded number of worker processes at once, so Ray Train's
        controller, helpers and learners queued behind them (bench/startup.py at 16 logical CPUs, "Start-up"
        in docs/ARCHITECTURE.md). Nobody needs the validation rows before the first round, so a lane per
        learner starts with the job and the rest of the cluster's CPUs are left to the learners' start."""
        if not all(e is None for e in epochs):
            return lane_waits(tasks, None)
        import ray

        cpus = int(ray.cluster_resources().get("CPU", 1))
        learners = self._max_learners
        return lane_waits(tasks, eval_lanes(cpus, learners, before_learners=self.before_learners))

    def _launch_windows(
        self, videos: list[int], epochs: list[int | None], renewal: Sequence[int] | None = None
    ) -> list[CachedArray]:
        """Flow stream: the whole-frame flow of each video that has none yet, then every video's window.

        A training video's flow is kept for the run, so its later refurbishes are window tasks on the
        stored flow; an evaluation video's (epoch None) is dropped once its one window is cut.
        """
        source, data, seed = source_kwargs(self._data), self._data, self._data.seed
        flows = {v: self._flows[v] for v in videos if v in self._flows}
        todo = [(v, e) for v, e in zip(videos, epochs, strict=True) if v not in flows]
        chunks = task_chunks(len(todo), self._videos_per_task, None)
        # In lanes as in launch; the window tasks then follow their flows' (each waits for its inputs).
        waits = self._waits(len(chunks), [e for _, e in todo])
        reports: list[Any] = []
        for chunk, wait in zip(chunks, waits, strict=True):
            ids, chunk_epochs = [todo[k][0] for k in chunk], [todo[k][1] for k in chunk]
            bounds = self._bounds(ids)
            out = (
                flow_task()
                .options(num_returns=len(bounds) + 1, num_cpus=self._partial_cpus)
                .remote(
                    source, ids, chunk_epochs, data.cache_size, bounds=bounds,
                    after=None if wait is None else reports[wait],
                )
            )  # fmt: skip
            reports.append(out[-1])
            made = placed(ids, bounds, out[:-1])
            flows.update(made)
            self._flows.update((v, made[v]) for v, e in zip(ids, chunk_epochs, strict=True) if e is not None)
            self.reports.append(out[-1])
        placed_at: dict[int, CachedArray] = {}
        for chunk in task_chunks(len(videos), self._videos_per_task, renewal):
            ids = [videos[k] for k in chunk]
            # The flow objects go in as top-level arguments, so Ray hands the task their lists.
            sources = list(dict.fromkeys(flows[v].ref for v in ids))
            at = {ref: k for k, ref in enumerate(sources)}
            bounds = self._bounds(ids)
            out = (
                window_task()
                .options(num_returns=len(bounds) + 1, num_cpus=self._partial_cpus)
                .remote(
                    ids, [epochs[k] for k in chunk], seed, data.cache_size, data.augment_cost,
                    [(at[flows[v].ref], flows[v].index) for v in ids], *sources, bounds=bounds,
                )
            )  # fmt: skip
            placed_at.update(placed(chunk, bounds, out[:-1]))
            self.reports.append(out[-1])
        return [placed_at[k] for k in range(len(videos))]

    def _bounds(self, ids: list[int]) -> list[tuple[int, int]]:
        """How a task's videos share objects: of at least ``OBJECT_BYTES`` each, or one video if larger."""
        size, channels = self._data.cache_size, self._channels
        return object_bounds([self._frames[v] * size * size * channels for v in ids], OBJECT_BYTES)
