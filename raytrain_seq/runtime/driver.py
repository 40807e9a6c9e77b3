"""The driver of a run: connect to Ray, start the feed and the averager, run the learners, write the summary.

``run(config)`` is what ``jobs/ucf101.py`` calls: it connects to the cluster (or starts a local one),
creates the driver-side actors (``BlockFeed``, ``ParameterAverager``), runs the learners as a fleet of
Ray actors, one per slot (``runtime.fleet``), then joins rank 0's final metrics with the actors' reports
into ``summary.json`` and its plots. No Ray Train: its worker group restarts every learner when one is
lost or added, where averaging learners are independent between rounds; Ray's own actor restarts, the
autoscaler's view of pending actors and ``ray.wait`` serve instead (docs/ARCHITECTURE.md, "Failure and recovery").
Elastic learners: ``train.learners`` = (min, max) gives max slots; the first group is what the cluster
holds, a slot that comes up later joins alone, a lost learner's slot is restarted by Ray (at most
``train.max_failures`` losses). New learners start from the averager's latest state; the summary records
membership, recoveries and each slot's incarnations. Resume: the averager is given the run folder and
reloads its newest checkpoint itself (also when Ray restarts it), so the learners start from it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raytrain_seq import checkpoint, preflight
from raytrain_seq.config import Config, RunSetupError
from raytrain_seq.data.geometry import Geometry
from raytrain_seq.data.task_costs import feed_cost
from raytrain_seq.outputs import accounting
from raytrain_seq.outputs.reports import AveragingReport, FeedReport, LearnerReport
from raytrain_seq.outputs.summary import RunSummary, load_plotting, plot_confusion, plot_curves
from raytrain_seq.outputs.tracking import make_tracker
from raytrain_seq.parts import Parts
from raytrain_seq.rounds.events import EVENTS_FILE, membership_entries, recovery_entries
from raytrain_seq.runtime.connect import (
    NAMESPACE,
    check_cpus,
    check_storage,
    choose_device,
    connect,
    death_at_once,
)
from raytrain_seq.runtime.feed import feed_restarts
from raytrain_seq.runtime.launch import LearnerLaunch
from raytrain_seq.runtime.logs import quiet_driver

logger = logging.getLogger(__name__)

__all__ = ["build_summary", "run"]


@dataclasses.dataclass
class _Run:
    """What the phases of one run hand each other: its folder, names and start-up marks, then its actors."""

    config: Config
    began: float  # perf_counter at the job's start: the summary's total
    began_wall: float  # time.time at the job's start: the timeline's zero
    run_dir: Path
    resumed: checkpoint.Checkpoint | None
    learner_resources: dict[str, float]
    geometry: Geometry | None  # the preflight's (data.geometry.data_geometry)
    parts: Parts  # each part's settings, the preflight's (parts.Parts.of)
    use_gpu: bool = False
    death_at_once: bool = False  # the cluster fails a call to a dead actor at once (connect.death_at_once)
    launch: LearnerLaunch | None = None  # what every learner is launched with (runtime/launch.py)
    marks: dict[str, float] = dataclasses.field(default_factory=dict)
    feed: Any = None
    averager: Any = None
    slots: dict[str, Any] = dataclasses.field(default_factory=dict)  # fleet.LearnerFleet.records()
    tracker: Any = None  # the test scores' (outputs.tracking): made at the fit, written at the end


def run(config: Config, *, learner_resources: Mapping[str, float] | None = None) -> RunSummary:
    """Train as ``config`` says; returns the summary, already written to ``run_dir/summary.json``.

    learner_resources: Ray resources each learner holds besides its CPU (and its GPU share,
    ``train.gpus_per_learner``), e.g.
    ``{"learner_slot": 1}`` so that learners run only on nodes that advertise ``learner_slot`` (the
    fault tests put the learners on the nodes they kill this way; a cluster can keep learners off
    some nodes). Elastic ranges count the learners those resources can hold.

    Four phases, in the order docs/ARCHITECTURE.md ("Start-up order") gives the reasons for: prepare
    (preflight, resume, connect), start the driver-side actors, fit the learners, finish (the summary).
    """
    # The job's clock starts before the imports (ray, torch): the user waits for them too.
    began, began_wall = time.perf_counter(), time.time()
    config = config.named()  # a run without --run-name gets its dated folder here, once
    state = _prepare(config, learner_resources, began, began_wall)
    try:
        _start_actors(state)
        return _finish(state, _fit(state))
    finally:
        # Whatever ended the run (an error, a stop, the summary written), its driver-side actors end
        # with it: a caller's own Ray session (a notebook, a test) outlives the run and must not keep them.
        _release(state.averager, state.feed)


def _prepare(
    config: Config, learner_resources: Mapping[str, float] | None, began: float, began_wall: float
) -> _Run:
    """Everything knowable before the actors start: the checks, the run folder, a resume, Ray, the device."""
    if config.data.stream == "fuse":
        raise RunSetupError(
            "data.stream='fuse' evaluates two finished runs and trains nothing: run jobs/fuse.py "
            "RGB_RUN FLOW_RUN (or raytrain_seq.runtime.fuse.run_fuse) instead"
        )
    quiet_driver(config.run.verbose)
    # The job's own check of this config already ran, so this one only takes its result (the catalogs).
    checked = preflight.check(config, reuse=True)
    parts = checked.parts
    run_dir = check_storage(parts.connect)
    resumed = checkpoint.load_latest(run_dir) if config.run.resume else None
    if config.run.resume and resumed is None:
        if checkpoint.candidates(run_dir) or not (run_dir / EVENTS_FILE).is_file():
            raise RunSetupError(
                f"--resume: {run_dir} holds no checkpoint that loads: start it again under a new --run-name"
            )
        # Its driver stopped before the first checkpoint: nothing was kept, so the run starts over.
        logger.warning("--resume: %s holds no checkpoint yet: the run starts from the beginning", run_dir)
    extra = _check_learner_resources(learner_resources)
    state = _Run(config, began, began_wall, run_dir, resumed, extra, checked.geometry, parts)
    own_cluster = connect(parts.connect)
    check_cpus(parts.connect)
    # A GPU count that cannot hold the learners fails here, not in an endless wait for them.
    state.use_gpu = choose_device(parts.connect, own_cluster=own_cluster)
    state.death_at_once = death_at_once(own_cluster)
    state.marks["connected"] = time.time()
    suffix = uuid.uuid4().hex[:8]
    state.launch = LearnerLaunch(
        averager=f"averager-{suffix}",
        feed=f"feed-{suffix}",
        namespace=NAMESPACE,
        fresh=resumed is None,  # rank 0 then starts epoch 0 as soon as it runs (BlockFeed.start)
    )
    return state


def _check_learner_resources(learner_resources: Mapping[str, float] | None) -> dict[str, float]:
    extra = dict(learner_resources or {})
    if any(not isinstance(v, int | float) or isinstance(v, bool) or v <= 0 for v in extra.values()):
        raise ValueError(
            f"learner_resources {extra} must map resource names to amounts > 0, e.g. {{'slot': 1}}"
        )
    if {"CPU", "GPU"} & set(extra):
        raise ValueError(
            f"learner_resources {extra} names CPU or GPU: a learner holds one CPU, and its GPU share is "
            "train.gpus_per_learner (--gpus-per-learner 0.5: two learners per GPU) with train.use_gpu"
        )
    return extra


def _start_actors(state: _Run) -> None:
    """The feed, then (its process starting) the averager."""
    from raytrain_seq.runtime.feed import create_feed  # no torch: the feed starts before torch loads

    config, train, launch, parts = state.config, state.config.train, state.launch, state.parts
    feed = create_feed(
        parts.feed, name=launch.feed, namespace=NAMESPACE, prefetch=False, geometry=state.geometry
    )
    state.feed = feed
    if train.validate_every:
        # A failure to launch them is raised again by the evaluator's own eval_shard call.
        feed.prefetch_eval.remote("val")
    # The averager starts while the feed's process loads its catalog (the reasons for this order:
    # docs/ARCHITECTURE.md, "Start-up order"); its module loads no torch here, its process on a thread.
    from raytrain_seq.runtime.averager import create_averager
    from raytrain_seq.runtime.validator import ThreadValidator

    # Validation rounds: a CPU cluster's evaluator on a thread of the averager, or the GPU learners
    # (docs/ARCHITECTURE.md, "Validation").
    validator = None
    by_evaluator = train.validator == "evaluator" or (train.validator == "auto" and not state.use_gpu)
    if train.validate_every and by_evaluator:
        validator = ThreadValidator(parts.evaluator, feed_name=launch.feed, namespace=NAMESPACE)
        state.launch = dataclasses.replace(launch, evaluator=True)
    state.averager = create_averager(
        launch.averager,
        # Live groups: a lost learner leaves and a newcomer joins at a round boundary, the others
        # training on (rounds/, docs/ARCHITECTURE.md "Failure and recovery"); the fleet tells it of losses.
        dataclasses.replace(parts.averager, live=True),
        namespace=NAMESPACE,
        max_restarts=train.averager_max_restarts,
        run_dir=state.run_dir,  # the averager reloads the latest checkpoint (resume, or its own restart)
        validator=validator,
    )
    state.marks["actors_started"] = time.time()
    if state.resumed is not None:
        logger.info("resuming %s from %s", config.run.run_name, state.resumed.folder.name)


def _fit(state: _Run) -> LearnerReport:
    """The learner fleet trains; rank 0's final metrics (``learner.Learner.finish``'s return)."""
    from raytrain_seq.runtime.fleet import LearnerFleet
    from raytrain_seq.runtime.progress import RunProgress, averager_position_reader, feed_rows_reader

    train = state.config.train
    # Made now, so that an MLflow run spans the fit; it writes the test scores at the end.
    state.tracker = make_tracker(state.config.run.tracker, state.config.run_dir())
    fleet = LearnerFleet(
        _fleet_settings(state), learner=state.parts.learner, launch=state.launch, averager=state.averager
    )
    progress = RunProgress(
        train.epochs,
        position=averager_position_reader(state.averager),
        rows=feed_rows_reader(state.feed),
        steps=train.steps,
    ).start()
    # matplotlib loads while the learners train (the driver only waits), not after them.
    threading.Thread(target=load_plotting, name="load-plotting", daemon=True).start()
    state.marks["fit"] = time.time()
    try:
        fleet.start()
        result = fleet.supervise()
    finally:
        progress.close()
        fleet.shutdown()
        state.slots = fleet.records()
    state.marks["fit_returned"] = time.time()
    if not isinstance(result, LearnerReport):  # the learner at a checkpoint could not write it
        raise checkpoint.stopped_error(state.run_dir, result.message)
    return result


def _fleet_settings(state: _Run) -> Any:
    """What the learner fleet reads of ``train`` and of the driver's resource choice."""
    from raytrain_seq.runtime.fleet import LEARNER_ENV, FleetSettings

    train = state.config.train
    return FleetSettings(
        min_learners=train.min_learners,
        max_learners=train.max_learners,
        max_failures=train.max_failures,
        start_timeout_s=train.worker_start_timeout_s,
        poll_interval_s=train.poll_interval_s,
        gpus=train.gpus_per_learner if state.use_gpu else 0.0,
        resources=state.learner_resources,
        env_vars={} if state.death_at_once else LEARNER_ENV,
    )


def _finish(state: _Run, metrics: LearnerReport) -> RunSummary:
    """The summary from rank 0's metrics and the actors' statistics, and its plots."""
    import ray

    config, averager, feed = state.config, state.averager, state.feed
    # With the final round's validation.
    averaging: AveragingReport = ray.get(averager.summary.remote(settle=True))
    if averaging.validator_error:  # every validation failed; the checkpoints are in the run folder
        raise RuntimeError(
            "the evaluator could not be built or its validation rows assembled: "
            f"{averaging.validator_error} (the averager's log says more)"
        )
    stats: FeedReport = ray.get(feed.stats.remote(wait=True))
    summary = build_summary(
        config, metrics, averaging, stats, list(ray.get(feed.model_spec.remote()).class_names)
    )
    # Wall-clock stamps from rank 0 (same clock on one node; NTP-close across nodes): start-up ends at
    # its first step, "write" runs from its final metrics (checkpoint, the learners' shutdown, summary).
    if metrics.first_step_wall is not None:
        summary.seconds["startup"] = max(0.0, metrics.first_step_wall - state.began_wall)
    marks = state.marks
    marks.update(metrics.timeline)
    marks["summarised"] = time.time()
    plot_curves(summary, state.run_dir / "curves.png")
    plot_confusion(summary, metrics.confusion, state.run_dir / "confusion.png")
    _track_test(state.tracker, summary)
    marks["plotted"] = time.time()
    # When each step of start-up, the test pass and the write ended, in seconds from the job's start.
    began_wall = state.began_wall
    summary.extra["timeline"] = {k: round(v - began_wall, 3) for k, v in sorted(marks.items(), key=_second)}
    summary.extra["learner_slots"] = state.slots  # each slot's incarnations, nodes, losses, restarts
    summary.seconds["write"] = max(0.0, time.time() - metrics.final_report_wall)
    summary.seconds["total"] = time.perf_counter() - state.began  # only the summary's own write follows
    summary.write(state.run_dir)
    return summary


def _release(*actors: Any) -> None:
    """End the run's driver-side actors that were started (Ray would not restart them: the run is over)."""
    import ray

    for actor in actors:
        if actor is not None:
            ray.kill(actor, no_restart=True)


def _second(item: tuple[str, float]) -> float:
    return item[1]


def _whole(epochs: float) -> int | float:
    """An epoch count as an int when it is whole (3.0 -> 3), else the float (2.5)."""
    return int(epochs) if float(epochs).is_integer() else float(epochs)


def _track_test(tracker: Any, summary: RunSummary) -> None:
    """The test scores, once, beside the averager's per-round scalars (step = the last round)."""
    values = {"test/top1": summary.test_accuracy, "test/top5": summary.top5_accuracy}
    values["test/mean_class_accuracy"] = summary.mean_class_accuracy
    tracker.scalars(values, summary.rounds)
    tracker.close()


def build_summary(
    config: Config,
    metrics: LearnerReport,
    averaging: AveragingReport,
    feed: FeedReport,
    class_names: list[str] | None = None,
) -> RunSummary:
    """Join rank 0's final metrics with the averager's and the feed's reports.

    The histories come from the averager (it outlives learner-group restarts); ``per_class_accuracy``
    names the learners' summed test tallies {class index: [correct, total]} with ``class_names``.
    """
    learners = averaging.learners
    means = _learner_means(learners)
    # Per learner, its sums of the stats it sent with its rounds (a learner may have sent none yet).
    frames = int(sum(t.get("frames", 0.0) for t in learners.values()))
    names = class_names or []
    return RunSummary(
        test_views=config.data.test_views,
        dataset=config.data.dataset,
        learners=int(averaging.world_size),
        # What the learners trained (train.steps may end a run inside an epoch).
        epochs=_whole(metrics.epochs_trained),
        steps=int(metrics.steps_trained or 0),
        test_accuracy=metrics.test_accuracy,
        top5_accuracy=metrics.top5_accuracy,
        mean_class_accuracy=metrics.mean_class_accuracy,
        **_histories(averaging),
        rounds=int(averaging.rounds_completed),
        frames_total=frames,
        **_packing(config, feed),
        # Useful frames per second of the whole run's training loop (all learners together).
        frames_per_second=frames / metrics.learner_seconds if metrics.learner_seconds else 0.0,
        seconds=_seconds(metrics),
        refurbish=_refurbish(config, feed),
        config=config.to_dict(),
        membership=membership_entries(averaging.membership),
        recoveries=[
            *recovery_entries(averaging.recoveries),
            *feed_restarts(feed.restarts, metrics.first_step_wall),
        ],
        videos=dict(feed.videos),
        stream=config.data.stream,
        flow_method=feed.flow_method,
        per_class_accuracy=_per_class_accuracy(metrics, names),
        extra={
            "per_class_test": metrics.per_class,
            "class_names": names,
            "averager": {
                "dropped": averaging.dropped,
                "membership": averaging.membership,
                "failed_rounds": averaging.failed_rounds,
                "channels": averaging.channels,
            },
            "learner_seconds": metrics.learner_seconds,
            "feed": feed_cost(feed, metrics),
            # averaging_wait: the part of averaging spent waiting for the round's last learner to arrive.
            "learners_mean_s": means,
            # Per epoch, {count, sum, sumsq} of the video ids in the averaged rounds (accounting.py).
            "trained_ids": {str(e): c for e, c in accounting.per_epoch(learners).items()},
        },
    )


def _packing(config: Config, feed: FeedReport) -> dict[str, Any]:
    """The packing fields: frames deleted and padding over every epoch, the first epoch's blocks against
    their lower bound. E.g. 2 epochs of 10 blocks of t_max 8 with 3 padding frames each: 6 padding
    frames, a padding fraction of 6 / (20 * 8)."""
    plans = [e["packing"] for e in feed.epochs.values() if "packing" in e]  # epochs the feed packed
    padding = sum(p["padding"] for p in plans)
    blocks = sum(p["blocks"] for p in plans)
    return {
        "frames_deleted": sum(p["deleted"] for p in plans),
        "padding_frames": padding,
        "padding_fraction": padding / (blocks * feed.t_max) if blocks and feed.t_max else 0.0,
        "packing": {
            "strategy": config.data.packing,
            "blocks": plans[0]["blocks"] if plans else 0,
            "lower_bound_blocks": plans[0]["lower_bound_blocks"] if plans else 0,
        },
    }


def _learner_means(learners: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Each time bucket's mean over the learners (the whole run, every group)."""
    n = max(len(learners), 1)
    keys = {"compute": "compute_s", "averaging": "averaging_s", "averaging_wait": "waiting_s"}
    keys["data_wait"] = "data_wait_s"
    return {name: sum(t.get(key, 0.0) for t in learners.values()) / n for name, key in keys.items()}


def _histories(averaging: AveragingReport) -> dict[str, list[dict[str, Any]]]:
    """The validations scored (missed ones left out), the batch sizes and the finite losses, per round."""
    return {
        "val_accuracy_history": [
            {
                "round": v["round"],
                "epoch": v["epoch"],
                "accuracy": v["accuracy"],
                "time_s": v["time_s"],
                **{k: v[k] for k in ("top5_accuracy", "mean_class_accuracy") if k in v},
            }
            for v in averaging.validation_history
            if not v["missed"]
        ],
        "batch_size_history": [
            {"round": b["round"], "batch_size": b["batch_size"], "time_s": b["time_s"]}
            for b in averaging.batch_size_history
        ],
        "loss_history": [h for h in averaging.loss_history if not math.isnan(h["loss"])],
    }


def _seconds(metrics: LearnerReport) -> dict[str, float]:
    """One timeline, rank 0's, so the buckets add up to the total: rank 0 validates while the others
    train and then wait for it in the round, so their means would count that time twice (the means over
    the learners are kept in extra["learners_mean_s"])."""
    return {
        "total": 0.0,
        "compute": float(metrics.compute_s),
        "averaging": float(metrics.averaging_s),
        "data_wait": float(metrics.data_wait_s),
        # Rank 0's own clock: it waits for epoch 0's partial augmentations, validates and tests.
        "cold_epoch": float(metrics.cold_epoch_s),
        "validation": float(metrics.validation_s),
        "test": float(metrics.test_s),
    }


def _refurbish(config: Config, feed: FeedReport) -> dict[str, Any]:
    """Partial augmentations recomputed and reused; a flow stream's flow computed once per video."""
    totals = feed.totals
    flow = ("flow_videos", "flow_seconds", "flow_seconds_saved") if feed.flow_once else ()
    return {
        "reuse": config.data.reuse,
        "recomputed": int(totals["recomputed"]),
        "reused": int(totals["reused"]),
        **{key: totals[key] for key in flow},
    }


def _per_class_accuracy(metrics: LearnerReport, names: list[str]) -> dict[str, float]:
    """Each tested class's accuracy, keyed by its name (its index when the names do not cover it)."""
    return {
        (names[int(k)] if int(k) < len(names) else str(k)): correct / total
        for k, (correct, total) in metrics.per_class.items()
        if total
    }
