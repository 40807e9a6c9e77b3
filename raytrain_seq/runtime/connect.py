"""Connecting to Ray and the checks a run makes before it starts anything: storage, cluster size.

``check_storage`` needs no cluster: the run folder must be writable, and new unless resuming, so a bad
``--storage-path`` stops the job before Ray is touched. ``connect`` joins the cluster the job runs in
(``RAY_ADDRESS``, set by ``ray job submit``), else the one ``ray start`` runs on this machine, else starts
a local one with a logical CPU per learner plus the data tasks'. ``check_cpus`` refuses a cluster whose
learners would leave no CPU for the data tasks (training would wait forever).
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from raytrain_seq.config import RunSetupError
from raytrain_seq.parts import ConnectSettings

logger = logging.getLogger(__name__)

NAMESPACE = "raytrain_seq"

# Ray kills idle task workers beyond one per logical CPU after a second. The driver-side actors and the
# learners already hold that many, so every epoch's data tasks would start fresh Python workers (seconds
# of imports each on a small machine). Keeping idle workers a minute lets each epoch reuse the last
# epoch's. `make demo` passes the same settings to `ray start` as RAY_* environment variables.
WORKER_REUSE = {"idle_worker_killing_time_threshold_ms": 60_000}
# Without preallocation the object store maps (and page-faults) fresh shared memory for every large
# object and unmaps it when the object is freed, so each averaging round's puts pay the kernel's page
# faults again: several times a memcpy (docs/ARCHITECTURE.md, "Measurements behind the code"). Preallocated, the store maps its
# whole size once at start (seconds per GB on a small machine) and the puts are plain copies.
# On a cluster started with `ray start` the same is RAY_preallocate_plasma_memory=1 (cluster.yaml).
PREALLOCATE = {"preallocate_plasma_memory": True}
# A call to an actor whose process died fails only after Ray's grace for the death's cause
# (``timeout_ms_task_wait_for_death_info``). At 0 cluster-wide a learner whose averager died defers its
# round at once, the driver and the averager hear of a learner's or a shard's death at once, and the
# learners need no runtime env of their own (``fleet.LEARNER_ENV``): where the job has none either, a
# replacement starts in a worker Ray prestarted on its node (docs/ARCHITECTURE.md, "Measurements behind
# the code"). Every cluster a run starts sets it; cluster.yaml and `make demo` export it as
# RAY_timeout_ms_task_wait_for_death_info=0.
DEATH_AT_ONCE = {"timeout_ms_task_wait_for_death_info": 0}
DEATH_AT_ONCE_ENV = "RAY_" + next(iter(DEATH_AT_ONCE))  # as `ray start` reads it from the environment
__all__ = [
    "DEATH_AT_ONCE",
    "DEATH_AT_ONCE_ENV",
    "NAMESPACE",
    "PREALLOCATE",
    "WORKER_REUSE",
    "check_cpus",
    "check_storage",
    "choose_device",
    "connect",
    "death_at_once",
    "device_decision",
    "store_options",
]


def store_options(object_store_gb: float | None) -> dict:
    """``ray.init`` keywords for a cluster this process starts: the object store's size, preallocated
    (``run.object_store_gb``); Ray's default store (30 % of memory, mapped as objects come) for None."""
    if object_store_gb is None:
        return {"_system_config": {**WORKER_REUSE, **DEATH_AT_ONCE}}
    return {
        "object_store_memory": int(object_store_gb * 1e9),
        "_system_config": {**WORKER_REUSE, **DEATH_AT_ONCE, **PREALLOCATE},
    }


def death_at_once(own_cluster: bool) -> bool:
    """Whether the cluster fails a call to a dead actor at once (``DEATH_AT_ONCE``): one this run started,
    or one whose `ray start` exported ``DEATH_AT_ONCE_ENV``=0 (cluster.yaml, `make demo`), which reaches
    this driver (a job's driver inherits the environment Ray's processes run in)."""
    return own_cluster or os.environ.get(DEATH_AT_ONCE_ENV) == "0"


def check_storage(settings: ConnectSettings) -> Path:
    """The run folder, checked before any training: writable, and new unless resuming."""
    if settings.run_dir is None:
        raise ValueError(
            "run.run_name is not set, so the run has no folder yet: pass --run-name NAME, or call "
            "Config.named() first (the driver does when a run starts)"
        )
    run_dir = Path(settings.run_dir)
    if run_dir.exists() and not settings.resume and any(run_dir.iterdir()):
        raise RunSetupError(
            f"run folder {run_dir} already exists: pass --resume to continue it, or a new --run-name"
        )
    if settings.resume and not run_dir.exists():
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


def connect(settings: ConnectSettings) -> bool:
    """Join the cluster the job runs in (RAY_ADDRESS), else the one `ray start` runs here, else start one;
    whether it started one (its resources are then all there will be: no autoscaler adds nodes)."""
    import ray

    if ray.is_initialized():
        return False
    # ray.init sets its own logger's level (INFO by default): "Connecting to existing Ray cluster", ...
    level = {} if settings.verbose else {"logging_level": logging.WARNING}
    if os.environ.get("RAY_ADDRESS"):
        # Inside `ray job submit` (or with RAY_ADDRESS set): join that cluster.
        ray.init(address=os.environ["RAY_ADDRESS"], namespace=NAMESPACE, **level)
        _store_not_ours(settings.object_store_gb)
        return False
    try:
        # A cluster started on this machine with `ray start` (python jobs/ucf101.py run beside it).
        ray.init(address="auto", namespace=NAMESPACE, **level)
        _store_not_ours(settings.object_store_gb)
        return False
    except ConnectionError as exc:
        if "multiple" in str(exc):
            raise RunSetupError(f"{exc} (export RAY_ADDRESS=HOST:PORT to pick one)") from exc
        logger.info("no running Ray cluster found: starting a local one")
    # No cluster: a local one, with a logical CPU for every learner and for the data tasks (logical
    # CPUs may exceed the cores; torch in each learner uses a thread).
    cpus = max(os.cpu_count() or 1, settings.max_learners + 2)
    gb = settings.object_store_gb
    try:
        ray.init(num_cpus=cpus, namespace=NAMESPACE, include_dashboard=False, **store_options(gb), **level)
    except Exception as exc:
        # Ray gives its node 30 s to start; mapping a large preallocated store can take longer.
        if gb is not None and "timed out during startup" in str(exc):
            raise RunSetupError(
                f"Ray's node did not start in time while preallocating run.object_store_gb={gb:g} GB of "
                "object store: lower --object-store-gb, or leave it unset for Ray's default store"
            ) from exc
        raise
    return True


def _store_not_ours(object_store_gb: float | None) -> None:
    """run.object_store_gb sizes only a cluster this run starts: say so when it joined a running one."""
    if object_store_gb is not None:
        logger.warning(
            "run.object_store_gb=%g is ignored: this run joined a running Ray cluster, whose object store "
            "is set where it was started (`RAY_preallocate_plasma_memory=1 ray start ... "
            "--object-store-memory BYTES`, as in cluster.yaml)",
            object_store_gb,
        )


def gpu_share(gpus: float, learners: int) -> float:
    """The largest ``--gpus-per-learner`` of two decimals whose ``learners`` shares fit in ``gpus``
    (rounded down: 6 learners on 1 GPU get 0.16, as 0.17 x 6 = 1.02 would not fit); 0 when not even
    0.01 each fits (or no GPU)."""
    if gpus <= 0 or learners < 1:
        return 0.0
    # The 1e-9 keeps a share that is exact in decimal (1 / 2 = 0.5) from flooring one cent low.
    cents = math.floor(gpus / learners * 100 + 1e-9)
    while cents > 0 and learners * cents / 100 > gpus + 1e-9:
        cents -= 1
    return min(cents, 100) / 100


def device_decision(use_gpu: bool | None, gpus: float, learners: int, per_learner: float) -> tuple[bool, str]:
    """Whether the learners train on GPUs, and why in one line, from ``train.use_gpu``, the cluster's GPU
    count and what the learners need (``learners`` x ``per_learner``). ``use_gpu=True`` on a cluster
    with too few GPUs is a ``RunSetupError`` (the learners would wait for them forever); None picks the GPUs
    when they are enough. E.g. 1 GPU, 2 learners at 1 GPU each: the CPU, and "--gpus-per-learner 0.5"."""
    need = learners * per_learner
    hint = gpu_share(gpus, learners)
    share = f"--gpus-per-learner {hint:g}" if hint else ""
    if use_gpu is False:
        return False, "training on CPUs: train.use_gpu is False"
    if gpus + 1e-9 >= need:
        why = "train.use_gpu is True" if use_gpu else "the cluster has enough GPUs (train.use_gpu is none)"
        return (
            True,
            f"training on GPUs: {learners} learners x {per_learner:g} GPU of the cluster's {gpus:g} ({why})",
        )
    if use_gpu:
        if not gpus:
            fix = "start Ray on a node with GPUs"
        else:
            fix = f"share them ({share}), lower --learners" if share else "lower --learners"
        raise RunSetupError(
            f"--use-gpu: the Ray cluster has {gpus:g} GPUs and {learners} learners x {per_learner:g} GPU need "
            f"{need:g}, so the learners would wait forever; {fix}, or add GPU nodes"
        )
    if not gpus:
        return False, "training on CPUs: the cluster has no GPU"
    fix = f"pass {share} to share them" if share else "lower --learners"
    return False, (
        f"training on CPUs: the cluster's {gpus:g} GPUs cannot hold {learners} learners x {per_learner:g} GPU; "
        f"{fix}, or --no-use-gpu to silence this"
    )


def choose_device(
    settings: ConnectSettings, *, own_cluster: bool, sleep: Callable[[float], None] = time.sleep
) -> bool:
    """``device_decision`` on the connected cluster, logged once: whether the learners hold GPUs.

    ``--use-gpu`` on a cluster short of GPUs fails at once when this job started the cluster (nothing
    will add any). A joined cluster may be bringing GPU nodes up (an autoscaler, cluster.yaml): it gets
    ``train.worker_start_timeout_s`` for them, checked every second, then fails the same way."""
    import ray

    train = settings

    def decide() -> tuple[bool, str]:
        gpus = ray.cluster_resources().get("GPU", 0)
        return device_decision(train.use_gpu, gpus, train.min_learners, train.gpus_per_learner)

    deadline, told = time.monotonic() + train.worker_start_timeout_s, False
    while True:
        try:
            use, why = decide()
            break
        except RunSetupError:
            if own_cluster or time.monotonic() >= deadline:
                raise
            if not told:
                logger.info("--use-gpu: waiting up to %g s for GPU nodes", train.worker_start_timeout_s)
                told = True
            sleep(1.0)
    logger.info("%s", why)
    return use


def check_cpus(settings: ConnectSettings) -> None:
    """Fail fast where the data tasks could never run: each learner holds a CPU, they need one more."""
    import ray

    cpus, least = ray.cluster_resources().get("CPU", 0), settings.min_learners
    if cpus < least + 1:
        raise RunSetupError(
            f"the Ray cluster has {cpus:g} CPUs: the {least} learners (at least) hold one each and the "
            f"data tasks need at least one more, so training would wait forever; start Ray with "
            f"--num-cpus {least + 2} (logical CPUs may exceed the cores) or lower --learners"
        )
