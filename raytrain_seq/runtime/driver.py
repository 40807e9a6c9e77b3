"""The driver of a run: connect to Ray, start the feed and the averager, fit the learners, write the summary.

``run(config)`` is what ``jobs/ucf101.py`` calls. It connects to the Ray cluster the job runs in (or starts
a local one), creates the two driver-side actors (``BlockFeed``: catalog, refurbishing cache, packing
plans; ``ParameterAverager``: AAVG rounds), runs a Ray Train V2 ``TorchTrainer`` whose workers are the
AAVG learners (``raytrain_seq.runtime.learner``), then joins the learners' last report with the actors'
statistics into ``summary.json`` and ``curves.png`` in the run folder.

Elastic learners: ``train.learners`` = (min, max) becomes Ray Train V2's ``ScalingConfig(num_workers=
(min, max))``, whose controller restarts the whole worker group with as many learners as the cluster
holds when a learner fails (at most ``train.max_failures`` times) or, every ``train.resize_interval_s``,
when there is room for more; ``train.worker_start_timeout_s`` bounds each wait for a group to start
(Ray reads it from ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``, which the driver passes to the
controller). The new learners start from the averager's latest averaged state (see ``learner``), and
the summary records each change of the learner count (``membership``) and each recovery.

Resume: Ray Train V2 keeps a run's checkpoints under ``storage_path/run_name``. The averager is given
the run folder and reloads its latest checkpoint itself (also when Ray restarts it after a crash), so
the learners start from its averaged state and skip the rows already trained.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from raytrain_seq.config import Config, RunSetupError
from raytrain_seq.elastic.state import latest_checkpoint, membership_entries, recovery_entries
from raytrain_seq.summary import RunSummary, plot_curves

logger = logging.getLogger(__name__)

NAMESPACE = "raytrain_seq"

# Ray kills idle task workers beyond one per logical CPU after a second. The driver-side actors and the
# learners already hold that many, so every epoch's data tasks would start fresh Python workers (seconds
# of imports each on a small machine). Keeping idle workers a minute lets each epoch reuse the last
# epoch's. `make demo` passes the same settings to `ray start` as RAY_* environment variables.
WORKER_REUSE = {"idle_worker_killing_time_threshold_ms": 60_000}
# Read by Ray Train's worker group in the controller actor; the driver's value travels there with the
# controller's runtime environment (ray.train.v2 get_env_vars_to_propagate).
WORKER_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
__all__ = ["NAMESPACE", "WORKER_REUSE", "check_storage", "latest_checkpoint", "run"]


def check_storage(config: Config) -> Path:
    """The run folder, checked before any training: writable, and new unless resuming."""
    run_dir = config.run_dir()
    if run_dir.exists() and not config.run.resume and any(run_dir.iterdir()):
        raise RunSetupError(
            f"run folder {run_dir} already exists: pass --resume to continue it, or a new --run-name"
        )
    if config.run.resume and not run_dir.exists():
        raise RunSetupError(f"--resume: no run folder {run_dir}: check --storage-path and --run-name")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{uuid.uuid4().hex}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise RunSetupError(
            f"cannot write the run folder {run_dir} ({exc.strerror}): pass a writable --storage-path"
        ) from exc
    return run_dir


def _connect(config: Config) -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        # Inside `ray job submit` (or with RAY_ADDRESS set): join that cluster.
        ray.init(address=os.environ["RAY_ADDRESS"], namespace=NAMESPACE)
        return
    try:
        # A cluster started on this machine with `ray start` (python jobs/ucf101.py run beside it).
        ray.init(address="auto", namespace=NAMESPACE)
        return
    except ConnectionError as exc:
        if "multiple" in str(exc):
            raise RunSetupError(f"{exc} (export RAY_ADDRESS=HOST:PORT to pick one)") from exc
        logger.info("no running Ray cluster found: starting a local one")
    # No cluster: a local one, with a logical CPU for every learner and for the data tasks (logical
    # CPUs may exceed the cores; torch in each learner uses a thread).
    cpus = max(os.cpu_count() or 1, config.train.max_learners + 2)
    ray.init(num_cpus=cpus, namespace=NAMESPACE, include_dashboard=False, _system_config=WORKER_REUSE)


def _check_cpus(config: Config) -> None:
    """Fail fast where the data tasks could never run: each learner holds a CPU, they need one more."""
    import ray

    cpus, least = ray.cluster_resources().get("CPU", 0), config.train.min_learners
    if cpus < least + 1:
        raise RunSetupError(
            f"the Ray cluster has {cpus:g} CPUs: the {least} learners (at least) hold one each and the "
            f"data tasks need at least one more, so training would wait forever; start Ray with "
            f"--num-cpus {least + 2} (logical CPUs may exceed the cores) or lower --learners"
        )


def _use_gpu(config: Config) -> bool:
    import ray

    if config.train.use_gpu is not None:
        return bool(config.train.use_gpu)
    return ray.cluster_resources().get("GPU", 0) >= config.train.min_learners


@contextlib.contextmanager
def _train_env(config: Config) -> Iterator[None]:
    """Ray Train's worker-group start timeout from the config, for this fit only."""
    before = os.environ.get(WORKER_START_TIMEOUT_ENV)
    os.environ[WORKER_START_TIMEOUT_ENV] = f"{config.train.worker_start_timeout_s:g}"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(WORKER_START_TIMEOUT_ENV, None)
        else:
            os.environ[WORKER_START_TIMEOUT_ENV] = before


def run(config: Config, *, learner_resources: Mapping[str, float] | None = None) -> RunSummary:
    """Train as ``config`` says; returns the summary, already written to ``run_dir/summary.json``.

    learner_resources: Ray resources each learner holds besides its CPU (and its GPU), e.g.
    ``{"learner_slot": 1}`` so that learners run only on nodes that advertise ``learner_slot`` (the
    fault tests put the learners on the nodes they kill this way; a cluster can keep learners off
    some nodes). Elastic ranges count the learners those resources can hold.
    """
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raytrain_seq.runtime.averager import create_averager
    from raytrain_seq.runtime.feed import create_feed
    from raytrain_seq.runtime.learner import train_loop_per_worker

    if config.data.stream == "fuse":
        # No training: evaluate two finished runs (RGB, flow) and fuse their predictions.
        from raytrain_seq.runtime.fuse import run_fuse

        return run_fuse(config)
    began = time.perf_counter()
    run_dir = check_storage(config)
    if config.run.resume and latest_checkpoint(run_dir) is None:
        raise RunSetupError(f"--resume: {run_dir} holds no checkpoint yet: start it again without --resume")
    extra = dict(learner_resources or {})
    if any(not isinstance(v, int | float) or isinstance(v, bool) or v <= 0 for v in extra.values()):
        raise ValueError(
            f"learner_resources {extra} must map resource names to amounts > 0, e.g. {{'slot': 1}}"
        )
    _connect(config)
    _check_cpus(config)
    train = config.train
    suffix = uuid.uuid4().hex[:8]
    names = {"averager": f"averager-{suffix}", "feed": f"feed-{suffix}", "namespace": NAMESPACE}
    feed = create_feed(
        config, name=names["feed"], namespace=NAMESPACE, prefetch_world_size=train.max_learners
    )
    averager = create_averager(
        names["averager"],
        namespace=NAMESPACE,
        max_restarts=train.averager_max_restarts,
        world_size=train.max_learners,  # each group's first learner sets its own size
        timeout_s=train.averager_timeout_s,
        validate_every=train.validate_every,
        batch_size=train.batch_size,
        b1=train.b1,
        b2=train.b2,
        max_batch_size=train.max_batch_size,
        adaptive_batch=train.adaptive_batch,
        merge_moments=train.merge_moments,
        run_dir=str(run_dir),  # the averager reloads the latest checkpoint (resume, or its own restart)
    )
    if config.run.resume:
        logger.info("resuming %s from %s", config.run.run_name, latest_checkpoint(run_dir).name)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": config.to_dict(), "names": names, "torch_threads": 1},
        scaling_config=ScalingConfig(
            num_workers=train.learners,
            use_gpu=_use_gpu(config),
            resources_per_worker={"CPU": 1, **extra},
            elastic_resize_monitor_interval_s=train.resize_interval_s,
        ),
        run_config=RunConfig(
            name=config.run.run_name,
            storage_path=str(run_dir.parent),
            failure_config=FailureConfig(max_failures=train.max_failures),
        ),
    )
    with _train_env(config):
        result = trainer.fit()
    if result.error is not None:
        raise result.error
    summary = _summary(
        config,
        result.metrics or {},
        ray.get(averager.summary.remote()),
        ray.get(feed.stats.remote(wait=True)),
        ray.get(feed.model_spec.remote())["class_names"],
    )
    summary.seconds["total"] = time.perf_counter() - began
    summary.write(run_dir)
    plot_curves(summary, run_dir / "curves.png")
    for actor in (averager, feed):
        ray.kill(actor, no_restart=True)
    return summary


def _summary(
    config: Config,
    metrics: dict[str, Any],
    averaging: dict[str, Any],
    feed: dict[str, Any],
    class_names: list[str] | None = None,
) -> RunSummary:
    """Join rank 0's last report with the averager's and the feed's statistics.

    The histories come from the averager (it outlives learner-group restarts); ``per_class_accuracy``
    names rank 0's test tallies {class index: [correct, total]} with ``class_names``.
    """
    learners = averaging.get("learners", {})
    n = max(len(learners), 1)
    compute = sum(t.get("compute_s", 0.0) for t in learners.values()) / n
    data_wait = sum(t.get("data_wait_s", 0.0) for t in learners.values()) / n
    averaging_s = sum(t.get("averaging_s", 0.0) for t in learners.values()) / n
    frames = int(sum(t.get("frames", 0.0) for t in learners.values()))
    epochs = feed.get("epochs", {})
    packing_epochs = [e["packing"] for e in epochs.values() if "packing" in e]
    padding = sum(p.get("padding", 0) for p in packing_epochs)
    blocks = sum(p.get("blocks", 0) for p in packing_epochs)
    t_max = feed.get("t_max", 0)
    names = class_names or []
    per_class = {
        (names[int(k)] if int(k) < len(names) else str(k)): correct / total
        for k, (correct, total) in metrics.get("per_class", {}).items()
        if total
    }
    return RunSummary(
        dataset=config.data.dataset,
        learners=int(averaging.get("world_size", config.train.min_learners)),
        epochs=config.train.epochs,
        test_accuracy=metrics.get("test_accuracy"),
        val_accuracy_history=[
            {
                "round": v["round"],
                "epoch": v.get("epoch"),
                "accuracy": v["accuracy"],
                "time_s": v.get("time_s", 0.0),
            }
            for v in averaging.get("validation_history", [])
            if not v.get("missed")
        ],
        batch_size_history=[
            {"round": b["round"], "batch_size": b["batch_size"], "time_s": b.get("time_s", 0.0)}
            for b in averaging.get("batch_size_history", [])
        ],
        loss_history=[h for h in averaging.get("loss_history", []) if not math.isnan(h["loss"])],
        rounds=int(averaging.get("rounds_completed", 0)),
        frames_total=frames,
        frames_deleted=sum(p.get("deleted", 0) for p in packing_epochs),
        padding_frames=padding,
        padding_fraction=padding / (blocks * t_max) if blocks and t_max else 0.0,
        # Useful frames per second of the whole run's training loop (all learners together).
        frames_per_second=frames / metrics["learner_seconds"] if metrics.get("learner_seconds") else 0.0,
        seconds={"total": 0.0, "compute": compute, "averaging": averaging_s, "data_wait": data_wait},
        packing={
            "strategy": config.data.packing,
            "blocks": packing_epochs[0]["blocks"] if packing_epochs else 0,
            "lower_bound_blocks": packing_epochs[0]["lower_bound_blocks"] if packing_epochs else 0,
        },
        refurbish={
            "reuse": config.data.reuse,
            "recomputed": int(feed.get("totals", {}).get("recomputed", 0)),
            "reused": int(feed.get("totals", {}).get("reused", 0)),
        },
        config=config.to_dict(),
        membership=membership_entries(averaging),
        recoveries=recovery_entries(averaging),
        videos=dict(feed.get("videos", {})),
        stream=config.data.stream,
        flow_method=feed.get("flow_method"),
        per_class_accuracy=per_class,
        extra={
            "per_class_test": metrics.get("per_class", {}),
            "averager": {k: averaging.get(k) for k in ("dropped", "membership", "failed_rounds")},
            "learner_seconds": metrics.get("learner_seconds"),
        },
    )
