"""The refurbishing feed: a BlockFeed actor owns the cache and its Ray tasks; learners assemble block rows.

Algorithm: data refurbishing (Lee et al., "Refurbish Your Training Data", USENIX ATC '21, the Revamper
system) feeding BLoad blocks (Iftekhar, Ruschel et al.). Per epoch e:

1. ``BlockFeed`` (a 0-CPU actor on the driver's node) holds the train/val/test catalogs, the
   ``RefurbishSchedule`` and the cache ``{video id: CachedArray}`` of partially augmented uint8 arrays
   ``[T, cache_size, cache_size, C]``. Only the ids whose cached copy is not the one epoch e needs are
   recomputed (``evicted(e)`` in a straight run; after a resume every id's computing epoch
   ``e - age(e)`` is recomputed with the same seed, so the data equal the uninterrupted run's). The work
   runs in Ray tasks of ``videos_per_task`` videos (``runtime.partial_tasks``: a task's small videos share
   objects, a larger video is its own; Ray spills to disk when the store is full; one extra return
   reports ids and seconds). A task holds videos that are recomputed in the same later epoch, so its
   objects leave the cache whole.
   Tasks are submitted in the order the learners consume the blocks, and epoch e+1's recompute starts
   as soon as epoch e is planned; epoch e's refs stay untouched until e+1 is requested.
2. The plan: ``pack(lengths, t_max, strategy, seed=plan_seed(seed, e))`` and ``shard(plan, world_size)``
   (equal blocks per learner, zero-weight fillers); each learner's blocks are ordered by
   ``assembly.spread_fresh`` so the fresh frames spread evenly over consecutive mini-batches.
3. A learner's ``LearnerFeed`` (``runtime.learner_feed``) runs one persistent
   ``rows.stream.RowStream`` across its epochs: a thread in the learner asks ``feed.epoch_shard(e, rank, world_size)`` for the block specs, borrows
   the refs of the whole shard in one ``feed.refs(ids, e)`` call, copies the cached arrays into uint8
   rows at the cache size with each sequence's seeded crop draws (``assembly.assemble_rows``), in
   order, and runs ahead into epoch e+1; the learner crops and flips on its device.

Validation and test splits are packed once ("optimal", fixed seed; "chunk" only when training chunks
and a video is longer than t_max), resized deterministically (``augment.resize_video``), cached once and
centre-cropped. The video sources live in ``data/sources.py``: the synthetic set renders at
``cache_size`` already, so its partial augmentation is the photometric transform (+ ``augment_cost``
busy CPU seconds, which stand for decoding and optical flow and so are spent on the evaluation videos too,
and ``augment_cost_per_frame`` per training frame, a per-frame transform such as RandAugment);
UCF101 / HMDB51 are decoded with PyAV. The flow stream (2 channels) computes each video's whole-frame
optical flow ONCE (a flow task; the feed keeps the ref of a training video's flow for the run, Ray
spills it when the store is full), and every partial augmentation of it, evaluation's included, is a
window task that cuts the epoch's seeded window out of that stored flow (``data/sources.py``). A real
video that fails to decode in a task becomes a zero clip listed in ``stats()["videos"]``.

Trade-off: with reuse r the partial-augmentation work per epoch drops to 1/r after epoch 0; the price
is object-store memory for one cached copy of every train video (+1/r for the next epoch's copies in
flight) and one refs call per learner and epoch. bench/pipeline.py measures the delivered rate beside a
plain DataLoader and what the learners consume (bench/results/pipeline.txt).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from raytrain_seq.config import Config
from raytrain_seq.data.frame_cache import home_nodes
from raytrain_seq.data.sources import Geometry, data_geometry
from raytrain_seq.data.sources import source_kwargs as _source_kwargs
from raytrain_seq.data.task_costs import task_tallies
from raytrain_seq.packing import PackPlan, pack
from raytrain_seq.refurbish import RefurbishSchedule
from raytrain_seq.reports import FeedReport
from raytrain_seq.rounds.position import layout_specs, parse_history
from raytrain_seq.rows.assembly import BlockSpec, EpochShard, cache_aware_plan, consumption_order, plan_specs
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
from raytrain_seq.seeds import plan_seed

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

RESTARTS_FILE = "feed_restarts.jsonl"  # in the run folder: one line per restart of the feed actor


class FeedUnavailableError(RuntimeError):
    """The feed actor stayed unreachable (dead past train.feed_max_restarts) through a learner's retries."""


SPLITS = ("train", "val", "test")
_EVAL_KEYS = {"val": -1, "test": -2}  # plan_seed keys of the evaluation splits (epochs are >= 0)


def feed_geometry(config: Config, *, warn: bool = True) -> Geometry:
    """The run's data geometry (``data.sources.data_geometry``: catalogs, t_max, max_sequences, the
    evaluation strategy, channels, class names, skipped videos, flow method); RunSetupError for a bad fit."""
    return data_geometry(config, warn=warn)


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


def _int(value: Any, name: str, minimum: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}: {fix}")
    return int(value)


def _rank(rank: Any, world_size: Any) -> tuple[int, int]:
    world_size = _int(world_size, "world_size", 1, "pass the number of learners")
    rank = _int(rank, "rank", 0, f"pass a rank in 0..{world_size - 1}")
    if rank >= world_size:
        raise ValueError(f"rank {rank} >= world_size {world_size}: pass a rank in 0..{world_size - 1}")
    return rank, world_size


class BlockFeed:
    """The pipeline's driver-side state; ``create_feed`` runs it as a threaded Ray actor.

    Public methods (all thread-safe): ``start(world_size)``, ``prefetch(epoch, world_size)``,
    ``prefetch_eval(split)``, ``epoch_shard(epoch, rank, world_size) -> EpochShard``,
    ``eval_shard(split, rank, world_size) -> EpochShard``, ``refs(ids, epoch) -> list[CachedArray]``
    (epoch None: evaluation cache), ``stats(wait=False, ids=False)``.
    """

    def __init__(
        self,
        config: Config,
        *,
        videos_per_task: int = 16,
        partial_cpus: float = 1.0,
        keep_epochs: int = 2,
        geometry: Geometry | None = None,
        launch: Callable[[list[int], list[int | None], Sequence[int] | None], list[Any]] | None = None,
    ) -> None:
        """``geometry``: the driver's ``feed_geometry(config)``, so a run probes its videos once (a pass over
        full UCF101 opens 13,320 files); None computes it here. ``launch(videos, epochs, renewal)``: what
        starts the partial augmentations and says where each video's array will be; None = Ray tasks
        (tests plan and serve epochs without Ray by passing placeholders)."""
        if not isinstance(config, Config):
            raise TypeError(f"BlockFeed needs a raytrain_seq.config.Config, got {type(config).__name__}")
        self._config = config
        self._launcher = launch if launch is not None else self._launch
        self._videos_per_task = _int(videos_per_task, "videos_per_task", 1, "use e.g. 16")
        self._partial_cpus = float(partial_cpus)
        self._keep = _int(keep_epochs, "keep_epochs", 1, "keep at least the current epoch")
        if geometry is None:
            geometry = feed_geometry(config, warn=False)
        self._catalogs = geometry.catalogs
        self.t_max, self.max_sequences = geometry.t_max, geometry.max_sequences
        self._eval_strategy, self._channels = geometry.eval_strategy, geometry.channels
        self._class_names: list[str] = list(geometry.class_names)
        self._skipped: list[str] = list(geometry.skipped)  # unreadable videos left out of the catalogs
        self._flow_method: str | None = geometry.flow_method  # the optical flow algorithm of a flow stream
        train = self._catalogs["train"]
        self._train_ids, self._train_labels = train.ids.tolist(), train.labels.tolist()
        self._train_index = {video: k for k, video in enumerate(self._train_ids)}  # id -> schedule position
        # Video id -> cached frames (the catalog length), every split: sizes the objects tasks return.
        self._frames = {
            int(v): int(n)
            for split in SPLITS
            for v, n in zip(self._catalogs[split].ids, self._catalogs[split].lengths, strict=True)
        }
        self._schedule = RefurbishSchedule(len(train), reuse=config.data.reuse, seed=config.data.seed)
        self._lock = threading.RLock()
        # True while an evaluation split is launched before the learners run (``prefetch_eval``): its
        # tasks then take at most one lane per learner, however many CPUs the cluster has (``_waits``).
        self._before_learners = False
        self._plans: dict[tuple[int, int], tuple[PackPlan, list[list[BlockSpec]]]] = {}
        # video id -> (computing epoch, where its array is), newest epoch
        self._cache: dict[int, tuple[int, CachedArray]] = {}
        self._pending: dict[int, tuple[int, CachedArray]] = {}  # the next epoch's recomputes, in flight
        self._served: dict[int, dict[int, CachedArray]] = {}  # epoch -> {video id: array} for refs()
        self._eval_refs: dict[int, CachedArray] = {}
        # Flow once: a flow run computes each training video's whole-frame flow once and keeps its ref for
        # the run (Ray spills it when the store is full); a refurbish then only cuts a window out of it.
        self._flow_once = config.data.stream == "flow"
        self._flows: dict[int, CachedArray] = {}  # training video id -> its whole-frame flow
        self._eval_plans: dict[str, tuple[PackPlan, dict[int, list[list[BlockSpec]]]]] = {}
        self._epoch_stats: dict[int, dict[str, Any]] = {}
        self._info_refs: list[Any] = []
        self._infos: list[dict[str, Any]] = []
        # Ray restarted this actor (train.feed_max_restarts): the cache and every object the dead one owned
        # are gone. Each epoch a learner asks for is recomputed from the source with the same seeds (the
        # resume path), and the restart is written down, since this process lost its predecessor's totals.
        self._restarted = _reconstructed(config.run.verbose)
        self._cpu_began = time.process_time()  # the actor's own CPU (planning, serving) counts as the feed's
        if self._restarted:
            self._log_restart()

    # ------------------------------------------------------------------------------------------- plans
    def _plan(
        self, epoch: int, world_size: int, history: tuple = ()
    ) -> tuple[PackPlan, list[list[BlockSpec]]]:
        """The epoch's plan and every learner's block specs; ``history`` (``EpochPosition.history``) gives
        the layouts the epoch ran under before this group of ``world_size`` (``layout_specs``)."""
        key = (epoch, world_size, history)
        if history and key not in self._plans:
            specs = layout_specs(lambda w: self._plan(epoch, w)[1], history, world_size)
            self._plans[key] = (self._plan(epoch, history[0][0])[0], specs)
        if key not in self._plans:
            lengths = self._catalogs["train"].lengths
            plan = pack(
                lengths, self.t_max, strategy=self._config.data.packing, seed=plan_seed(self._seed, epoch)
            )
            fresh = self._schedule.is_fresh(epoch)
            plan = cache_aware_plan(plan, lengths, fresh)  # every block its share of fresh frames
            self._plans[key] = (
                plan,
                plan_specs(plan, world_size, self._train_ids, self._train_labels, fresh),
            )
            for old in [k for k in self._plans if k[0] < epoch - self._keep]:
                del self._plans[old]
        return self._plans[key]

    @property
    def _seed(self) -> int:
        return self._config.data.seed

    # -------------------------------------------------------------------------------------- the cache
    def _launch(
        self, videos: list[int], epochs: list[int | None], renewal: Sequence[int] | None = None
    ) -> list[CachedArray]:
        """Submit partial augmentation tasks; returns where each video's array will be, in order.

        ``renewal``: per video, the epoch that recomputes it next (``_renewal``); a task holds videos of one
        renewal epoch only, so its objects leave the cache whole instead of pinning older copies.
        """
        if self._flow_once:
            return self._launch_windows(videos, epochs, renewal)
        task = augment_task()
        source, data = _source_kwargs(self._config), self._config.data
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
                source, ids, [epochs[k] for k in chunk], self._seed, data.cache_size, data.augment_cost,
                data.augment_cost_per_frame, bounds=bounds, after=None if wait is None else reports[wait],
            )  # fmt: skip
            placed_at.update(placed(chunk, bounds, out[:-1]))
            reports.append(out[-1])
            self._info_refs.append(out[-1])
        return [placed_at[k] for k in range(len(videos))]

    def _homes(self, videos: list[int]) -> dict[int, str]:
        """Each video's home node (``frame_cache.home_nodes`` over the alive nodes with CPUs, weighted by
        them) when real RGB videos go through the frame cache, else none (any node will do)."""
        data = self._config.data
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
        free. The validation rows are launched as the feed starts, before Ray Train places the learners:
        all at once, their tasks took every free CPU, each in a worker process of its own (most of them
        then stayed idle for the run), and slowed the learners' start (docs/ARCHITECTURE.md, "Measurements behind the code"). In lanes of the CPUs beyond the learners, a node with more logical CPUs started more
        of those processes: Ray starts a bounded number of worker processes at once, so Ray Train's
        controller, helpers and learners queued behind them (bench/startup.py at 16 logical CPUs, "Start-up"
        in docs/ARCHITECTURE.md). Nobody needs the validation rows before the first round, so a lane per
        learner starts with the job and the rest of the cluster's CPUs are left to Ray Train's start."""
        if not all(e is None for e in epochs):
            return lane_waits(tasks, None)
        import ray

        cpus = int(ray.cluster_resources().get("CPU", 1))
        learners = self._config.train.max_learners
        return lane_waits(tasks, eval_lanes(cpus, learners, before_learners=self._before_learners))

    def _launch_windows(
        self, videos: list[int], epochs: list[int | None], renewal: Sequence[int] | None = None
    ) -> list[CachedArray]:
        """Flow stream: the whole-frame flow of each video that has none yet, then every video's window.

        A training video's flow is kept for the run, so its later refurbishes are window tasks on the
        stored flow; an evaluation video's (epoch None) is dropped once its one window is cut.
        """
        source, data = _source_kwargs(self._config), self._config.data
        flows = {v: self._flows[v] for v in videos if v in self._flows}
        todo = [(v, e) for v, e in zip(videos, epochs, strict=True) if v not in flows]
        chunks = task_chunks(len(todo), self._videos_per_task, None)
        # In lanes as in _launch; the window tasks then follow their flows' (each waits for its inputs).
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
            self._info_refs.append(out[-1])
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
                    ids, [epochs[k] for k in chunk], self._seed, data.cache_size, data.augment_cost,
                    [(at[flows[v].ref], flows[v].index) for v in ids], *sources, bounds=bounds,
                )
            )  # fmt: skip
            placed_at.update(placed(chunk, bounds, out[:-1]))
            self._info_refs.append(out[-1])
        return [placed_at[k] for k in range(len(videos))]

    def _bounds(self, ids: list[int]) -> list[tuple[int, int]]:
        """How a task's videos share objects: of at least ``OBJECT_BYTES`` each, or one video if larger."""
        size, channels = self._config.data.cache_size, self._channels
        return object_bounds([self._frames[v] * size * size * channels for v in ids], OBJECT_BYTES)

    def _renewal(self, videos: list[int], epoch: int) -> list[int]:
        """The first epoch after ``epoch`` that recomputes each of ``videos``: when its array leaves."""
        upcoming = np.full(len(self._train_ids), -1, dtype=np.int64)
        for later in range(epoch + self._schedule.reuse, epoch, -1):  # the earliest one is written last
            upcoming[self._schedule.is_fresh(later)] = later
        return [int(upcoming[self._train_index[v]]) for v in videos]

    def _wanted(self, epoch: int) -> dict[int, int]:
        """Video id -> the epoch whose partial augmentation ``epoch`` serves (``epoch - age``)."""
        last = epoch - self._schedule.age(epoch)
        return dict(zip(self._train_ids, last.tolist(), strict=True))

    def start(self, world_size: int) -> int:
        """Launch epoch 0's partial augmentation now, unless this feed has launched or served an epoch: a
        fresh run's rank 0 calls it as soon as its process runs, so that the tasks overlap the learners'
        model building and join. A restarted group (or feed) goes on from the learners' ``epoch_shard``
        calls, and a resumed run does not call it. Returns the videos launched."""
        with self._lock:
            if self._served or self._pending or self._restarted:
                return 0
            return self.prefetch(0, world_size)

    def prefetch(self, epoch: int, world_size: int) -> int:
        """Start the recompute that ``epoch`` will need (in the learners' order); returns videos launched."""
        epoch = _int(epoch, "epoch", 0, "epochs count from 0")
        world_size = _int(world_size, "world_size", 1, "pass the number of learners")
        with self._lock:
            if epoch in self._served:
                return 0
            wanted = self._wanted(epoch)
            order = consumption_order(self._plan(epoch, world_size)[1])
            todo = [
                v for v in order
                if self._cache.get(v, (None,))[0] != wanted[v] and self._pending.get(v, (None,))[0] != wanted[v]
            ]  # fmt: skip
            refs = self._launcher(todo, [wanted[v] for v in todo], self._renewal(todo, epoch))
            self._pending.update({v: (wanted[v], ref) for v, ref in zip(todo, refs, strict=True)})
            logger.info("feed: prefetching epoch %d: %d partial augmentations launched", epoch, len(todo))
            return len(todo)

    def _log_restart(self) -> None:
        path = self._config.run_dir() / RESTARTS_FILE
        record = {"time": time.time(), "kind": "feed_restart"}
        record["detail"] = (
            "the feed actor was restarted; it recomputes each requested epoch's cache from the source"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        logger.warning("feed: %s", record["detail"])

    def _restarts(self) -> list[dict[str, Any]]:
        """Every restart of this run's feed actor so far (each restarted process appended one line)."""
        path = self._config.run_dir() / RESTARTS_FILE
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _serve_again(self, epoch: int, world_size: int) -> None:
        """A restarted feed asked for an epoch older than one it already serves (another learner's stream
        ran ahead and asked first): compute the older epoch's cache on its own, leaving the newer epoch's
        cache and recompute in flight as they are. The bytes are those of the first serving (same seeds)."""
        wanted = self._wanted(epoch)
        order = consumption_order(self._plan(epoch, world_size)[1])
        reuse = {v: ref for v, (e, ref) in self._cache.items() if e == wanted[v]}
        todo = [v for v in order if v not in reuse]
        launched = self._launcher(todo, [wanted[v] for v in todo], self._renewal(todo, epoch))
        fresh = dict(zip(todo, launched, strict=True))
        self._served[epoch] = {v: reuse.get(v, fresh.get(v)) for v in wanted}
        for old in sorted(self._served)[: -self._keep]:
            del self._served[old]
        self._epoch_stats.setdefault(epoch, self._epoch_counts(epoch, world_size, len(todo), len(wanted)))
        logger.warning("feed: epoch %d served again after a restart: %d recomputed", epoch, len(todo))

    def _epoch_counts(self, epoch: int, world_size: int, recomputed: int, videos: int) -> dict[str, Any]:
        stats = self._plan(epoch, world_size)[0].stats(world_size)
        return {
            "recomputed": recomputed,
            "reused": videos - recomputed,
            # Every training frame is served once an epoch, whether its partial augmentation is fresh or reused.
            "kept_frames": int(self._catalogs["train"].lengths.sum()),
            "packing": {k: stats[k] for k in ("blocks", "lower_bound_blocks", "padding", "deleted", "cut", "filler_blocks")},
        }  # fmt: skip

    def _activate(self, epoch: int, world_size: int) -> None:
        """Make ``epoch`` the served epoch: reuse what is cached, take or launch the recomputes."""
        if epoch in self._served:
            return
        if self._restarted and self._served and epoch < max(self._served):
            self._serve_again(epoch, world_size)
            return
        if self._served and epoch < max(self._served):
            # Serving an older epoch again would overwrite the newer epochs' cache under their learners.
            raise ValueError(
                f"epoch {epoch} is older than the served epochs {sorted(self._served)}: learners must not lag "
                f"more than {self._keep - 1} epoch(s) behind; raise keep_epochs or restart the feed to resume"
            )
        self.prefetch(epoch, world_size)
        wanted = self._wanted(epoch)
        cache, recomputed = {}, 0
        for video, want in wanted.items():
            current = self._cache.get(video)
            if current is not None and current[0] == want:
                cache[video] = current
            else:
                cache[video] = self._pending[video]
                recomputed += 1
        self._cache, self._pending = cache, {}
        self._served[epoch] = {video: ref for video, (_, ref) in cache.items()}
        for old in sorted(self._served)[: -self._keep]:
            del self._served[old]
        self._epoch_stats[epoch] = self._epoch_counts(epoch, world_size, recomputed, len(wanted))
        logger.info(
            "feed: epoch %d served: %d recomputed, %d reused", epoch, recomputed, len(wanted) - recomputed
        )
        if epoch + 1 < self._config.train.max_epochs:
            self.prefetch(epoch + 1, world_size)

    # ---------------------------------------------------------------------------------- public methods
    def epoch_shard(self, epoch: int, rank: int, world_size: int, history: Sequence = ()) -> EpochShard:
        """Learner ``rank``'s blocks of ``epoch`` (plans it and starts epoch+1's recompute on first call).

        ``history``: the layouts the epoch already ran under (``EpochPosition.history``: world size, rows
        each, and the rows no averaged round received); the blocks are then what those learners left,
        re-split over this group.
        """
        epoch = _int(epoch, "epoch", 0, "epochs count from 0")
        rank, world_size = _rank(rank, world_size)
        history = parse_history(history)
        with self._lock:
            self._activate(epoch, history[0][0] if history else world_size)
            specs = self._plan(epoch, world_size, history)[1][rank]
            counts = self._epoch_stats[epoch]
            return self._shard(
                "train", epoch, rank, world_size, specs, counts["recomputed"], counts["reused"]
            )

    def eval_shard(self, split: str, rank: int = 0, world_size: int = 1) -> EpochShard:
        """Validation or test blocks: packed once, resized once and cached, centre crop, no flip."""
        if split not in _EVAL_KEYS:
            raise ValueError(
                f"eval_shard split must be 'val' or 'test', got {split!r}: train uses epoch_shard"
            )
        rank, world_size = _rank(rank, world_size)
        with self._lock:
            catalog = self._catalogs[split]
            self._launch_eval(split)
            plan, by_world = self._eval_plans[split]
            if world_size not in by_world:
                by_world[world_size] = plan_specs(
                    plan, world_size, catalog.ids.tolist(), catalog.labels.tolist(), None
                )
            return self._shard(split, None, rank, world_size, by_world[world_size][rank], len(catalog), 0)

    def prefetch_eval(self, split: str) -> int:
        """Launch ``split``'s partial augmentations before anyone asks for its rows; returns the videos
        launched (0: launched already). The driver launches the validation split's as the feed starts."""
        if split not in _EVAL_KEYS:
            raise ValueError(f"prefetch_eval split must be 'val' or 'test', got {split!r}")
        with self._lock:
            self._before_learners = True
            try:
                return self._launch_eval(split)
            finally:
                self._before_learners = False

    def _launch_eval(self, split: str) -> int:
        """Pack ``split`` and launch its partial augmentations, once (the caller holds the lock)."""
        if split in self._eval_plans:
            return 0
        catalog = self._catalogs[split]
        seed = plan_seed(self._seed, _EVAL_KEYS[split])
        plan = pack(catalog.lengths, self.t_max, strategy=self._eval_strategy, seed=seed)
        self._eval_plans[split] = (plan, {})
        videos = catalog.ids.tolist()
        refs = self._launcher(videos, [None] * len(videos))
        self._eval_refs.update(zip(videos, refs, strict=True))
        return len(videos)

    def _shard(
        self, split: str, epoch: int | None, rank: int, world_size: int, specs, recomputed: int, reused: int
    ) -> EpochShard:
        data = self._config.data
        return EpochShard(
            split=split, epoch=epoch, rank=rank, world_size=world_size, blocks=tuple(specs), t_max=self.t_max,
            max_sequences=self.max_sequences, crop=data.crop, channels=self._channels, seed=self._seed,
            center=epoch is None, recomputed=recomputed, reused=reused, size=data.cache_size,
        )  # fmt: skip

    def refs(self, ids: Sequence[int], epoch: int | None) -> list[CachedArray]:
        """Where the cached arrays of ``ids`` are, as served in ``epoch`` (None: evaluation cache); read
        them with ``fetch_arrays``."""
        with self._lock:
            table = self._eval_refs if epoch is None else self._served.get(epoch)
            if table is None:
                raise ValueError(
                    f"epoch {epoch} is not served (served: {sorted(self._served)}): call epoch_shard({epoch}, "
                    f"...) first; only the newest {self._keep} epochs are kept"
                )
            missing = [i for i in ids if i not in table]
            if missing:
                raise ValueError(
                    f"video ids {missing[:5]} are not in the cache of epoch {epoch}: use a shard's ids"
                )
            return [table[i] for i in ids]

    def model_spec(self) -> dict[str, Any]:
        """What the learners' model must take: {"num_classes", "in_channels", "class_names"}."""
        names = list(self._class_names)
        return {"num_classes": len(names), "in_channels": self._channels, "class_names": names}

    @staticmethod
    def _flow_counts(windowed: list[int], flowed: list[int], flow_cpu: dict[int, float]) -> dict[str, Any]:
        """One epoch's flow-once counts: flows computed and their CPU seconds, and the CPU seconds of the
        flows a recompute-every-refurbish feed would have computed again (the windows cut from a flow
        computed for an earlier epoch, each at the CPU its one computation took)."""
        fresh = set(flowed)
        return {
            "flow_videos": len(flowed),
            "flow_seconds": sum(flow_cpu.get(v, 0.0) for v in flowed),
            "flow_seconds_saved": sum(flow_cpu.get(v, 0.0) for v in windowed if v not in fresh),
        }

    def stats(self, wait: bool = False, ids: bool = False) -> dict[str, Any]:
        """Per epoch: recomputed, reused, packing stats, partial-augmentation videos and seconds; totals
        (a ``reports.FeedReport`` as a dict).

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
            refs, self._info_refs = self._info_refs, []
        timeout = None if wait else 0
        ready, not_ready = ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
        infos = ray.get(ready)
        with self._lock:
            self._infos.extend(infos)
            self._info_refs.extend(not_ready)
            ran, seconds, flowed, flow_cpu, costs = task_tallies(self._infos)
            per_epoch = {}
            for epoch in sorted(set(self._epoch_stats) | {e for e in (*ran, *flowed) if e is not None}):
                entry = dict(self._epoch_stats.get(epoch, {}))
                entry.update(partial_videos=len(ran.get(epoch, [])), partial_seconds=seconds.get(epoch, 0.0))
                entry.update(costs.get(epoch, {}))
                if self._flow_once:
                    entry.update(self._flow_counts(ran.get(epoch, []), flowed.get(epoch, []), flow_cpu))
                spans = entry.pop("spans", [])
                if ids:
                    entry["partial_ids"] = sorted(ran.get(epoch, []))
                    entry["task_spans"] = sorted(spans)
                per_epoch[epoch] = entry
            keys = (
                "recomputed",
                "reused",
                "partial_videos",
                "partial_seconds",
                "kept_frames",
                "partial_cpu_s",
            )
            if self._flow_once:
                keys += ("flow_videos", "flow_seconds", "flow_seconds_saved")
            totals = {key: sum(entry.get(key, 0) for entry in per_epoch.values()) for key in keys}
            failed = {path: reason for info in self._infos for path, reason in info.get("failed", [])}
            methods = sorted({info["flow_method"] for info in self._infos if info.get("flow_method")})
            return FeedReport(
                videos={
                    **{split: len(self._catalogs[split]) for split in SPLITS},
                    # Unreadable at catalog time, then any that failed to decode in a task (zero clips).
                    "skipped": [*self._skipped, *sorted(set(failed) - set(self._skipped))],
                    "decode_failed": [{"path": p, "reason": r} for p, r in sorted(failed.items())],
                    "length_fixed": len({r[0] for info in self._infos for r in info.get("refit", [])}),
                },
                flow_method="+".join(methods) if methods else self._flow_method,
                flow_once=self._flow_once,
                epochs=per_epoch,
                eval={
                    "videos": len(ran.get(None, [])),
                    "seconds": seconds.get(None, 0.0),
                    **{key: value for key, value in costs.get(None, {}).items() if key != "spans"},
                },
                totals=dict(
                    totals,
                    tasks_pending=len(self._info_refs),
                    actor_cpu_s=time.process_time() - self._cpu_began,
                ),
                t_max=self.t_max,
                max_sequences=self.max_sequences,
                reuse=self._config.data.reuse,
                # Per-epoch counts and totals cover this process only: a restart loses the dead one's.
                restarts=self._restarts(),
            ).to_dict()


def feed_restarts(restarts: list[dict[str, Any]], since: float | None) -> list[dict[str, Any]]:
    """The run summary's ``feed_restart`` recoveries from ``stats()["restarts"]`` (``FeedReport.restarts``):
    ``{time_s, kind, detail}``, time_s counted from ``since`` (rank 0's first step, the start of the
    training clock; None: wall time)."""
    return [
        {"time_s": r["time"] - (since or 0.0), "kind": r["kind"], "detail": r["detail"]} for r in restarts
    ]


# --------------------------------------------------------------------------------------------- ray glue
def create_feed(
    config: Config,
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
    probing the videos again. ``prefetch_world_size`` (default ``config.train.learners``) orders epoch 0's
    tasks by the learners' consumption.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not isinstance(config, Config):
        raise TypeError(f"create_feed needs a raytrain_seq.config.Config, got {type(config).__name__}")
    geometry = geometry if geometry is not None else feed_geometry(config)
    if not ray.is_initialized():
        raise RuntimeError("ray is not initialised: call ray.init() (or run inside a Ray job) first")
    driver_node = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    options = {"num_cpus": 0, "num_gpus": 0, "scheduling_strategy": driver_node, "max_concurrency": 32}
    # A killed feed is restarted by Ray with the same arguments; calls in flight then are resent to it
    # (every method may run twice: planning and serving an epoch are idempotent).
    restarts = config.train.feed_max_restarts
    options.update(max_restarts=restarts, max_task_retries=-1 if restarts else 0)
    if name is not None:
        options.update(name=name, namespace=namespace, get_if_exists=False)
    feed = (
        ray.remote(BlockFeed)
        .options(**options)
        .remote(config, videos_per_task=videos_per_task, partial_cpus=partial_cpus, geometry=geometry)
    )
    if prefetch:
        feed.prefetch.remote(0, prefetch_world_size or config.train.learners)
    return feed


def get_feed(name: str, *, namespace: str | None = None):
    """The handle of a feed started by ``create_feed(config, name=name)``."""
    import ray

    return ray.get_actor(name, namespace=namespace)
