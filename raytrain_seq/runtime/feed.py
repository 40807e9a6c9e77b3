"""The refurbishing feed's actor shell: ``BlockFeed`` launches what its planner names and lends the refs.

Algorithm: data refurbishing (Lee et al., "Refurbish Your Training Data", USENIX ATC '21, the Revamper
system) feeding BLoad blocks (Iftekhar, Ruschel et al.). The decisions are the Ray-free planner's
(``raytrain_seq.feed``: each epoch's plan and shards, which partial augmentations are current, reused r
times and renewed, the evaluation splits, the counters, the restart log). ``BlockFeed`` (a 0-CPU threaded
actor on the driver's node, ``create_feed``) launches the Ray tasks a planner's ``Launch`` names
(``runtime.feed_tasks``: home nodes, lanes, flow once's flows), keeps their ``CachedArray`` refs under
the planner's ``(video, computing epoch)`` keys, drops the keys the planner no longer names, and serves
``epoch_shard`` / ``eval_shard`` (block specs), ``refs`` (the arrays a shard reads) and ``stats``
(a ``reports.FeedReport``). Epoch e+1's recompute starts as soon as e is served; e's refs stay
until the newest ``keep_epochs`` move past it. A restarted actor (``train.feed_max_restarts``)
recomputes what a learner asks for from the source with the same seeds, from its next block on first.
docs/ARCHITECTURE.md ("The pipeline, call by call", "Data refurbishing").
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from raytrain_seq.config import DataConfig
from raytrain_seq.data.geometry import Geometry, ModelSpec, data_geometry
from raytrain_seq.feed.cache import Key, Launch
from raytrain_seq.feed.planner import FeedPlanner, check_int, check_rank
from raytrain_seq.feed.plans import EVAL_KEYS
from raytrain_seq.feed.report import RESTARTS_FILE, RestartLog
from raytrain_seq.outputs.reports import FeedReport
from raytrain_seq.parts import FeedSettings
from raytrain_seq.rounds.position import parse_history
from raytrain_seq.rows.assembly import EpochShard
from raytrain_seq.runtime.feed_tasks import FeedTasks
from raytrain_seq.runtime.partial_tasks import CachedArray

logger = logging.getLogger(__name__)

__all__ = [
    "RESTARTS_FILE",
    "BlockFeed",
    "FeedUnavailableError",
    "create_feed",
    "feed_geometry",
    "feed_restarts",
    "get_feed",
]


class FeedUnavailableError(RuntimeError):
    """The feed actor stayed unreachable (dead past train.feed_max_restarts) through a learner's retries."""


def feed_geometry(data: DataConfig, *, warn: bool = True) -> Geometry:
    """The run's data geometry (``data.geometry.data_geometry``: catalogs, t_max, max_sequences, the
    evaluation strategy, channels, class names, skipped videos, flow method); RunSetupError for a bad fit."""
    return data_geometry(data, warn=warn)


def _reconstructed(verbose: bool = False) -> bool:
    """Whether this process is a Ray actor that Ray restarted (False outside an actor, e.g. in a test)."""
    import ray

    if not ray.is_initialized():
        return False
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:
        return False
    with warnings.catch_warnings():
        if not verbose:
            # Ray 2.60's was_current_actor_reconstructed reads its own deprecated actor_id property and warns
            # about that: a warning about Ray's code that the user can do nothing with (runtime/logs.py).
            warnings.simplefilter("ignore", DeprecationWarning)
        return context.was_current_actor_reconstructed


class BlockFeed:
    """The pipeline's driver-side actor shell over a ``FeedPlanner``; ``create_feed`` runs it in Ray.

    Public methods (all thread-safe): ``start(world_size)``, ``prefetch(epoch, world_size)``,
    ``prefetch_eval(split)``, ``epoch_shard(epoch, rank, world_size, history, from_block) -> EpochShard``,
    ``eval_shard(split, rank, world_size) -> EpochShard``, ``refs(ids, epoch) -> list[CachedArray]``
    (epoch None: evaluation cache), ``model_spec()``, ``stats(wait=False, ids=False)``.
    """

    def __init__(
        self,
        settings: FeedSettings,
        *,
        videos_per_task: int = 16,
        partial_cpus: float = 1.0,
        keep_epochs: int = 2,
        geometry: Geometry | None = None,
        launch: Callable[[list[int], list[int | None], Sequence[int] | None], list[Any]] | None = None,
    ) -> None:
        """``geometry``: the driver's ``feed_geometry(settings.data)``, so a run probes its videos once (a pass over
        full UCF101 opens every file); None computes it here. ``launch(videos, epochs, renewal)``: what
        starts the partial augmentations and says where each video's array will be; None = Ray tasks
        (tests plan and serve epochs without Ray by passing placeholders)."""
        if not isinstance(settings, FeedSettings):
            raise TypeError(
                f"BlockFeed needs a raytrain_seq.parts.FeedSettings, got {type(settings).__name__}"
            )
        videos_per_task = check_int(videos_per_task, "videos_per_task", 1, "use e.g. 16")
        keep = check_int(keep_epochs, "keep_epochs", 1, "keep at least the current epoch")
        if geometry is None:
            geometry = feed_geometry(settings.data, warn=False)
        self.t_max, self.max_sequences = geometry.t_max, geometry.max_sequences
        self._max_epochs = settings.max_epochs
        # Ray restarted this actor (train.feed_max_restarts): the cache and every object the dead one owned
        # are gone. Each epoch a learner asks for is recomputed from the source with the same seeds (the
        # resume path), and the restart is written down, since this process lost its predecessor's totals.
        restarted = _reconstructed(settings.verbose)
        self._planner = FeedPlanner(settings, geometry, keep=keep, restarted=restarted)
        self._tasks = FeedTasks(
            settings, self._planner.frames, geometry.channels, videos_per_task=videos_per_task,
            partial_cpus=float(partial_cpus),
        )  # fmt: skip
        self._launcher = launch if launch is not None else self._tasks.launch
        self._arrays: dict[Key, CachedArray] = {}  # the planner's keys -> where the arrays are
        self._lock = threading.RLock()
        self._cpu_began = time.process_time()  # the actor's own CPU (planning, serving) counts as the feed's
        if restarted:
            log = self._planner.restart_log()
            if log is not None:
                log.record(time.time())
            logger.warning("feed: %s", RestartLog.DETAIL)

    # ---------------------------------------------------------------------------------- launching
    def _run(self, launch: Launch, world_size: int | None = None) -> int:
        """Launch what ``launch`` names, keep the refs under its keys, tell the planner; the videos."""
        renewal = None if launch.renewal is None else list(launch.renewal)
        refs = self._launcher(list(launch.videos), list(launch.epochs), renewal)
        self._arrays.update(zip(launch.keys(), refs, strict=True))
        self._planner.launched(launch, world_size)
        if launch.epoch is not None:
            self._drop_stale()
        return len(launch.videos)

    def _drop_stale(self) -> None:
        """Let go of the training arrays no current, pending or served copy names (evaluation's stay)."""
        live = self._planner.live()
        self._arrays = {key: ref for key, ref in self._arrays.items() if key[1] is None or key in live}

    def start(self, world_size: int) -> int:
        """Launch epoch 0's partial augmentation now, unless this feed has launched or served an epoch: a
        fresh run's rank 0 calls it as soon as its process runs, so that the tasks overlap the learners'
        model building and join. A restarted group (or feed) goes on from the learners' ``epoch_shard``
        calls, and a resumed run does not call it. Returns the videos launched."""
        with self._lock:
            if not self._planner.fresh:
                return 0
            return self.prefetch(0, world_size)

    def prefetch(self, epoch: int, world_size: int, first: Sequence[int] = ()) -> int:
        """Start the recompute that ``epoch`` will need (in the learners' order, the videos ``first``
        first); returns videos launched."""
        epoch = check_int(epoch, "epoch", 0, "epochs count from 0")
        world_size = check_int(world_size, "world_size", 1, "pass the number of learners")
        with self._lock:
            launch = self._planner.prefetch(epoch, world_size, first)
            if launch is None:
                return 0
            launched = self._run(launch)
            logger.info("feed: prefetching epoch %d: %d partial augmentations launched", epoch, launched)
            return launched

    def _activate(self, epoch: int, world_size: int, history: tuple, block: int) -> None:
        """Make ``epoch`` the served epoch: reuse what is cached, take or launch the recomputes; those of
        the asking learner's layout (``world_size``, ``history``) from its block ``block`` on first."""
        how = self._planner.serving(epoch)
        if how == "served":
            return
        # A learner asking from inside the epoch (a restarted feed, a resumed run) needs the rows from its
        # block on before those trained already, which the next epochs reuse.
        first = self._planner.upcoming(epoch, world_size, history, block) if block else []
        world_size = history[0][0] if history else world_size  # the epoch's plan is its first layout's
        if how == "again":
            # A restarted feed asked for an epoch older than one it already serves (another learner's
            # stream ran ahead and asked first): the older epoch's cache is computed on its own, the newer
            # one's and its recompute in flight stay as they are. The bytes are the first serving's.
            recomputed = self._run(self._planner.again(epoch, world_size, first), world_size)
            logger.warning("feed: epoch %d served again after a restart: %d recomputed", epoch, recomputed)
            return
        self.prefetch(epoch, world_size, first)
        counts = self._planner.activate(epoch, world_size)
        self._drop_stale()
        logger.info(
            "feed: epoch %d served: %d recomputed, %d reused", epoch, counts.recomputed, counts.reused
        )
        if epoch + 1 < self._max_epochs:
            self.prefetch(epoch + 1, world_size)

    # ---------------------------------------------------------------------------------- serving
    def epoch_shard(
        self, epoch: int, rank: int, world_size: int, history: Sequence = (), from_block: int = 0
    ) -> EpochShard:
        """Learner ``rank``'s blocks of ``epoch`` (plans it and starts epoch+1's recompute on first call).

        ``history``: the layouts the epoch already ran under (``EpochPosition.history``: world size, rows
        each, and the rows no averaged round received); the blocks are then what those learners left,
        re-split over this group. ``from_block``: the first of them the learner has not read yet; a
        recompute this call launches starts there (``FeedPlanner.upcoming``).
        """
        epoch = check_int(epoch, "epoch", 0, "epochs count from 0")
        rank, world_size = check_rank(rank, world_size)
        block = check_int(from_block, "from_block", 0, "pass the index of the learner's next block")
        history = parse_history(history)
        with self._lock:
            self._activate(epoch, world_size, history, block)
            return self._planner.train_shard(epoch, rank, world_size, history)

    def eval_shard(self, split: str, rank: int = 0, world_size: int = 1) -> EpochShard:
        """Validation or test blocks: packed once, resized once and cached, centre crop, no flip."""
        if split not in EVAL_KEYS:
            raise ValueError(
                f"eval_shard split must be 'val' or 'test', got {split!r}: train uses epoch_shard"
            )
        rank, world_size = check_rank(rank, world_size)
        with self._lock:
            self._launch_eval(split)
            return self._planner.eval_shard(split, rank, world_size)

    def prefetch_eval(self, split: str) -> int:
        """Launch ``split``'s partial augmentations before anyone asks for its rows; returns the videos
        launched (0: launched already). The driver launches the validation split's as the feed starts."""
        if split not in EVAL_KEYS:
            raise ValueError(f"prefetch_eval split must be 'val' or 'test', got {split!r}")
        with self._lock:
            self._tasks.before_learners = True
            try:
                return self._launch_eval(split)
            finally:
                self._tasks.before_learners = False

    def _launch_eval(self, split: str) -> int:
        """Pack ``split`` and launch its partial augmentations, once (the caller holds the lock)."""
        launch = self._planner.eval_launch(split)
        return 0 if launch is None else self._run(launch)

    def refs(self, ids: Sequence[int], epoch: int | None) -> list[CachedArray]:
        """Where the cached arrays of ``ids`` are, as served in ``epoch`` (None: evaluation cache); read
        them with ``fetch_arrays``."""
        with self._lock:
            return [self._arrays[key] for key in self._planner.keys(ids, epoch)]

    def model_spec(self) -> ModelSpec:
        """What the learners' model must take (``data.geometry.ModelSpec``)."""
        return self._planner.model_spec()

    def stats(self, wait: bool = False, ids: bool = False) -> FeedReport:
        """Per epoch: recomputed, reused, packing stats, partial-augmentation videos and seconds; totals
        (a ``reports.FeedReport``, built by the planner's ``FeedTally``).

        A flow run (flow once) adds per epoch and in the totals: ``flow_videos`` (whole-frame flows
        computed for the epoch), ``flow_seconds`` (their CPU seconds of decoding and flow) and
        ``flow_seconds_saved`` (what recomputing the flow of the epoch's refurbished videos would have
        cost, at each video's measured flow seconds). ``partial_seconds`` counts flow and window tasks.

        Task reports are collected when finished (``wait=True`` waits for every launched task); with
        ``ids=True`` each epoch also lists the video ids its partial augmentations actually ran for, and
        ``task_spans``: ``[start, end, CPU-seconds]`` of each of its tasks (wall clock of the task's node).
        """
        import ray

        with self._lock:
            refs, self._tasks.reports = self._tasks.reports, []
        timeout = None if wait else 0
        ready, not_ready = ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
        infos = ray.get(ready)
        with self._lock:
            self._tasks.reports.extend(not_ready)
            report = self._planner.report(
                infos, ids=ids, tasks_pending=len(self._tasks.reports),
                actor_cpu_s=time.process_time() - self._cpu_began,
            )  # fmt: skip
            return report


def feed_restarts(restarts: list[dict[str, Any]], since: float | None) -> list[dict[str, Any]]:
    """The run summary's ``feed_restart`` recoveries from ``stats().restarts`` (``FeedReport.restarts``):
    ``{time_s, kind, detail}``, time_s counted from ``since`` (rank 0's first step, the start of the
    training clock; None: wall time)."""
    return [
        {"time_s": r["time"] - (since or 0.0), "kind": r["kind"], "detail": r["detail"]} for r in restarts
    ]


# --------------------------------------------------------------------------------------------- ray glue
def create_feed(
    settings: FeedSettings,
    *,
    name: str | None = None,
    namespace: str | None = None,
    videos_per_task: int = 16,
    partial_cpus: float = 1.0,
    prefetch: bool = True,
    prefetch_world_size: int | None = None,
    geometry: Geometry | None = None,
):
    """Start the BlockFeed actor (0 CPUs, on the driver's node) and, with ``prefetch``, its epoch-0 partial
    augmentation (without it, the first ``epoch_shard`` call starts it).

    The configuration is checked here first (or given: ``geometry``, the preflight's ``feed_geometry``),
    so a bad t_max fails in the driver; the actor gets the catalogs built for that check instead of
    probing the videos again. ``prefetch_world_size`` (default ``settings.learners``) orders epoch 0's
    tasks by the learners' consumption.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not isinstance(settings, FeedSettings):
        raise TypeError(f"create_feed needs a raytrain_seq.parts.FeedSettings, got {type(settings).__name__}")
    geometry = geometry if geometry is not None else feed_geometry(settings.data)
    if not ray.is_initialized():
        raise RuntimeError("ray is not initialised: call ray.init() (or run inside a Ray job) first")
    driver_node = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    options = {"num_cpus": 0, "num_gpus": 0, "scheduling_strategy": driver_node, "max_concurrency": 32}
    # A killed feed is restarted by Ray with the same arguments; calls in flight then are resent to it
    # (every method may run twice: planning and serving an epoch are idempotent).
    restarts = settings.max_restarts
    options.update(max_restarts=restarts, max_task_retries=-1 if restarts else 0)
    if name is not None:
        options.update(name=name, namespace=namespace, get_if_exists=False)
    feed = (
        ray.remote(BlockFeed)
        .options(**options)
        .remote(settings, videos_per_task=videos_per_task, partial_cpus=partial_cpus, geometry=geometry)
    )
    if prefetch:
        feed.prefetch.remote(0, prefetch_world_size or settings.learners)
    return feed


def get_feed(name: str, *, namespace: str | None = None):
    """The handle of a feed started by ``create_feed(settings, name=name)``."""
    import ray

    return ray.get_actor(name, namespace=namespace)
