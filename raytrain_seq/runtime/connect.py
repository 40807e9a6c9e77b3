"""Connecting to Ray and the checks a run makes before it starts anything: storage, cluster size.

``check_storage`` needs no cluster: the run folder must be writable, and new unless resuming, so a bad
``--storage-path`` stops the job before Ray is touched. ``connect`` joins the cluster the job runs in
(``RAY_ADDRESS``, set by ``ray job submit``), else the one ``ray start`` runs on this machine, else starts
a local one with a logical CPU per learner plus the data tasks'. ``check_cpus`` refuses a cluster whose
learners would leave no CPU for the data tasks (training would wait forever).
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

from raytrain_seq.config import Config, RunSetupError

logger = logging.getLogger(__name__)

NAMESPACE = "raytrain_seq"

# Ray kills idle task workers beyond one per logical CPU after a second. The driver-side actors and the
# learners already hold that many, so every epoch's data tasks would start fresh Python workers (seconds
# of imports each on a small machine). Keeping idle workers a minute lets each epoch reuse the last
# epoch's. `make demo` passes the same settings to `ray start` as RAY_* environment variables.
WORKER_REUSE = {"idle_worker_killing_time_threshold_ms": 60_000}
__all__ = ["NAMESPACE", "WORKER_REUSE", "check_cpus", "check_storage", "connect"]


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


def connect(config: Config) -> None:
    """Join the cluster the job runs in (RAY_ADDRESS), else the one `ray start` runs here, else start one."""
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


def check_cpus(config: Config) -> None:
    """Fail fast where the data tasks could never run: each learner holds a CPU, they need one more."""
    import ray

    cpus, least = ray.cluster_resources().get("CPU", 0), config.train.min_learners
    if cpus < least + 1:
        raise RunSetupError(
            f"the Ray cluster has {cpus:g} CPUs: the {least} learners (at least) hold one each and the "
            f"data tasks need at least one more, so training would wait forever; start Ray with "
            f"--num-cpus {least + 2} (logical CPUs may exceed the cores) or lower --learners"
        )
