"""A job's start-up, accounted: the CPU each process spends before the learners' first step, beside the
start of a bare Ray Train trainer on the same machine.

Two runs, each on a fresh local Ray cluster of ``--cpus`` logical CPUs: 1. **bare**: a Ray Train
``DataParallelTrainer`` polling as the job's driver does, whose function imports torch and
builds Adam, ``fit()`` to a torch learner ready: the floor Ray Train sets here; 2. **job**: ``driver.run``
of the demo preset, a thread reading every process's CPU from /proc every ``SAMPLE_S``, with the
summary's ``seconds.startup`` and timeline. Printed: each role's CPU between ``fit()`` and the first
step, ``fit()`` to first step against the bare ``fit()`` to ready, the run's end beside the bare one's,
and each Ray process started in that window in order with its CPU. ``--json``: one JSON last line.

    python bench/startup.py --json
    python bench/startup.py --epochs 1 --cpus 4
    python bench/startup.py --epochs 1 --cpus 16 --gpus-per-learner 0.5   # a GPU node, 2 learners a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import STAT_STIME, STAT_UTIME, processes

from raytrain_seq.config import Config

SAMPLE_S = 0.25
# Process title -> role. Ray names a worker process "ray::<actor class or task>" (plus ".method" while a
# method runs); an idle task worker is "ray::IDLE". The first matching prefix wins.
ROLES = (
    ("ray::LearnerProcess", "learners"),
    ("ray::RayTrainWorker", "learners (Ray Train workers)"),
    ("ray::TrainController", "Ray Train: controller"),
    ("ray::SynchronizationActor", "Ray Train: helpers"),
    ("ray::PlacementGroupCleaner", "Ray Train: helpers"),
    ("ray::DatasetManager", "Ray Train: helpers"),
    ("ray::PreemptionWatcher", "Ray Train: helpers"),
    ("ray::_AutoscalingCoordinatorActor", "Ray Train: helpers"),
    ("ray::BlockFeed", "ours: feed"),
    ("ray::ParameterAverager", "ours: averager"),
    ("ray::AveragingShard", "ours: averaging shards"),
    ("ray::augment_videos", "ours: data tasks (and idle task workers)"),
    ("ray::IDLE", "ours: data tasks (and idle task workers)"),
)


def role(title: str, driver: int, pid: int) -> str:
    if pid == driver:
        return "driver"
    for prefix, name in ROLES:
        if title.startswith(prefix):
            return name
    if title.startswith("ray::"):
        return "Ray: other workers"
    return "Ray: raylet, GCS, dashboard, agents" if "ray" in title else "other processes"


class ProcSampler:
    """Every ``SAMPLE_S``: {pid: (CPU seconds, title)} of every process, read from /proc."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, dict[int, tuple[float, str]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proc-sampler", daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> ProcSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            rows = {
                pid: ((int(fields[STAT_UTIME]) + int(fields[STAT_STIME])) / self._tick, title)
                for pid, (fields, title) in processes(titles=True).items()
            }
            self.samples.append((now, rows))
            self._stop.wait(SAMPLE_S)


def sample_at(samples: list, when: float) -> dict[int, tuple[float, str]]:
    """The last of ``samples`` (``ProcSampler.samples``) taken at or before ``when`` (empty before the first)."""
    rows: dict[int, tuple[float, str]] = {}
    for t, sample in samples:
        if t > when:
            break
        rows = sample
    return rows


def cpu_by_role(samples: list, begin: float, end: float, name: Callable[[str, int], str]) -> dict[str, list]:
    """role -> [CPU seconds in [begin, end], processes], from the samples nearest before each end: a
    process born inside counts from zero; one that ended inside is missed (none of the start-up's
    processes end before the first step). ``name(title, pid)`` gives a process's role."""
    first, last = sample_at(samples, begin), sample_at(samples, end)
    out: dict[str, list] = {}
    for pid, (cpu, title) in last.items():
        spent = cpu - first.get(pid, (0.0, ""))[0]
        if spent > 0:
            entry = out.setdefault(name(title, pid), [0.0, 0])
            entry[0] += spent
            entry[1] += 1
    return out


def births(samples: list, begin: float, end: float) -> list[tuple[float, str, float]]:
    """The Ray processes first seen in [begin, end], in the order they started: (seconds from ``begin``,
    the name Ray gave them (a worker is "ray::IDLE" until it takes an actor or a task, which may be after
    ``end``: the last other name wins), their CPU seconds until ``end``). A process born between two
    samples is dated by the later one, at most ``SAMPLE_S`` late."""
    first: dict[int, float] = {}
    names: dict[int, str] = {}
    cpu: dict[int, float] = {}
    for t, rows in samples:
        for pid, (spent, title) in rows.items():
            if t <= end:
                first.setdefault(pid, t)
                cpu[pid] = spent
            if title.startswith("ray::") and (title != "ray::IDLE" or pid not in names):
                names[pid] = title.split(".")[0]
    return sorted(
        (t - begin, names.get(pid, "?"), cpu[pid]) for pid, t in first.items() if t >= begin and pid in names
    )


def _bare_function(config: dict) -> None:
    import time

    started = time.time()
    import ray.train
    import ray.train.torch
    import torch

    torch.set_num_threads(1)
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # as a GPU learner does: its CUDA context is part of the floor
    model = torch.nn.Linear(8, 8).to(device)
    torch.optim.Adam(model.parameters())  # a process's first optimizer imports torch._dynamo
    ready = time.time()
    # Rank 0's return value is the Result's return_value (the job's learners end the same way).
    return {"started": started, "ready": ready, "ended": time.time()}


def run_bare(config: Config, storage: Path) -> tuple[dict[str, float], dict[str, list]]:
    """One bare trainer on the current cluster: (seconds from ``fit()`` to its function and to ready, and
    from the function's return to ``fit()`` returning; the CPU by role between ``fit()`` and ready)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    gpu = bool(config.train.use_gpu)
    resources = {"CPU": 1, **({"GPU": config.train.gpus_per_learner} if gpu else {})}
    trainer = DataParallelTrainer(
        _bare_function,
        scaling_config=ScalingConfig(
            num_workers=config.train.max_learners, use_gpu=gpu, resources_per_worker=resources
        ),
        run_config=RunConfig(name=f"bare-{time.time_ns()}", storage_path=str(storage)),
    )
    with ProcSampler() as sampler, _poll_env(config.train.poll_interval_s):
        fit = time.time()
        result = trainer.fit()
        returned = time.time()
    if result.error is not None:
        raise result.error
    metrics = result.return_value
    by_role = cpu_by_role(sampler.samples, fit, metrics["ready"], _role_of_this_driver)
    times = {"function_started": metrics["started"] - fit, "ready": metrics["ready"] - fit}
    return {**times, "end": returned - metrics["ended"]}, by_role


@contextlib.contextmanager
def _poll_env(seconds: float):
    """Ray Train's controller polls its workers every ``seconds`` (its env var, carried to the controller),
    as the job's driver checks its learners (``train.poll_interval_s``); restored afterwards."""
    name, before = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    os.environ[name] = f"{seconds:g}"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _role_of_this_driver(title: str, pid: int) -> str:
    return role(title, os.getpid(), pid)


def run_job(config: Config) -> tuple[dict[str, Any], dict[str, list]]:
    from raytrain_seq.runtime.driver import run

    with ProcSampler() as sampler:
        began = time.time()
        summary = run(config)
    timeline = summary.extra["timeline"]
    by_role = cpu_by_role(
        sampler.samples,
        began + timeline["fit"],
        began + timeline["first_step"],
        _role_of_this_driver,
    )
    started = births(sampler.samples, began + timeline["fit"], began + timeline["first_step"])
    job = {"seconds": summary.seconds, "timeline": timeline, "accuracy": summary.test_accuracy}
    return {**job, "births": started}, by_role


def _cluster(cpus: int) -> None:
    import ray

    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    logging.getLogger("ray").setLevel(logging.WARNING)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the demo preset's job")
    parser.add_argument(
        "--cpus", type=int, default=max(os.cpu_count() or 1, 3), help="logical CPUs of each local cluster"
    )
    parser.add_argument(
        "--bare-runs", type=int, default=3, help="bare trainers (each on a fresh cluster); the median counts"
    )
    parser.add_argument(
        "--gpus-per-learner", type=float, default=None,
        help="learners on GPUs, this share of one each (the job's --use-gpu --gpus-per-learner); default: CPUs",
    )  # fmt: skip
    parser.add_argument(
        "--json", action="store_true", help="print the headline figures as one JSON last line"
    )
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    if args.bare_runs < 1:
        parser.error(f"--bare-runs must be >= 1, got {args.bare_runs}")
    if args.cpus < 3:
        parser.error(f"--cpus must be >= 3 (2 learners and the data tasks), got {args.cpus}")
    if args.gpus_per_learner is not None and not 0 < args.gpus_per_learner <= 1:
        parser.error(f"--gpus-per-learner must be in (0, 1], got {args.gpus_per_learner}")
    return args


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, list], list]:
    """The bare trainers, then the job, each on a fresh local cluster: (the job, its CPU by role, the
    bare runs)."""
    import ray

    gpu = (
        {} if args.gpus_per_learner is None else {"use_gpu": True, "gpus_per_learner": args.gpus_per_learner}
    )
    bares = []
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as storage:
        config = Config.from_preset(
            "demo", epochs=args.epochs, storage_path=storage, run_name="job", tracker="none", **gpu
        )
        for _ in range(args.bare_runs):
            _cluster(args.cpus)
            try:
                bares.append(run_bare(config, Path(storage)))
            finally:
                ray.shutdown()
        _cluster(args.cpus)
        try:
            job, by_role = run_job(config)
        finally:
            ray.shutdown()
    return job, by_role, bares


def report(args: argparse.Namespace, job: dict[str, Any], by_role: dict[str, list], bares: list) -> dict:
    """Prints the timelines, the CPU by role and the processes started; returns the headline figures."""
    bare, bare_roles = sorted(bares, key=lambda run: run[0]["ready"])[(len(bares) - 1) // 2]
    line = job["timeline"]
    window = line["first_step"] - line["fit"]
    cores = os.cpu_count() or 1
    marks = ("fit", "loop_entered", "learner_built", "joined", "first_step")
    where = (
        "CPU learners" if args.gpus_per_learner is None else f"GPU learners at {args.gpus_per_learner:g} GPU"
    )
    print(f"\ndemo preset, {args.epochs} epochs, {args.cpus} logical CPUs, {cores} cores, {where}")
    print("job timeline (s from the driver's start): " + ", ".join(f"{k} {line[k]:.1f}" for k in marks))
    print(f"job seconds.startup {job['seconds']['startup']:.1f} s; fit() to the first step {window:.1f} s")
    readies = ", ".join(f"{run['ready']:.1f}" for run, _ in bares)
    print(
        f"bare Ray Train trainer (median of {len(bares)}): fit() to the function {bare['function_started']:.1f} s, "
        f"to a torch learner ready {bare['ready']:.1f} s (runs: {readies})"
    )
    print(f"fit() to the first step vs the bare trainer's fit() to ready: {window / bare['ready']:.2f}x")
    # The run's end: from rank 0's final metrics (then its final checkpoint) to fit() returning, against
    # the bare function's return to fit() returning: what Ray Train takes to see the group end and stop it.
    job_end = line["fit_returned"] - line["final_report"]
    ends = ", ".join(f"{run['end']:.2f}" for run, _ in bares)
    print(
        f"the end: the job's final metrics to fit() returning {job_end:.2f} s; the bare function's return to "
        f"fit() returning {bare['end']:.2f} s (runs: {ends})\n"
    )
    total, bare_total = (sum(cpu for cpu, _ in roles.values()) for roles in (by_role, bare_roles))
    print_roles(by_role, bare_roles, total, bare_total, window * cores, bare["ready"] * cores, cores)
    print_births(job["births"], {k: line[k] - line["fit"] for k in marks[1:]})
    return {
        "startup_s": round(job["seconds"]["startup"], 2),
        "fit_to_first_step_s": round(window, 2),
        "bare_fit_to_ready_s": round(bare["ready"], 2),
        "bare_fit_to_function_s": round(bare["function_started"], 2),
        "fit_to_first_step_vs_bare": round(window / bare["ready"], 3),
        "end_s": round(job_end, 2),
        "bare_end_s": round(bare["end"], 2),
        "cpu_s": {name: round(cpu, 2) for name, (cpu, _) in sorted(by_role.items())},
        "cpu_s_all": round(total, 2),
        "bare_cpu_s_all": round(bare_total, 2),
        "cores": cores,
        "gpus_per_learner": args.gpus_per_learner,
    }


def print_roles(by_role: dict, bare_roles: dict, total: float, bare_total: float, window_cores: float,
                bare_cores: float, cores: int) -> None:  # fmt: skip
    """The CPU seconds of each role between fit() and the first step (the job) or ready (the bare)."""
    print(f"CPU seconds from fit() to the first step (job) and to ready (bare trainer); {cores} cores")
    print(f"{'role':<44}{'job':>8}{'share':>8}{'procs':>7}{'bare':>8}")
    for name in sorted(by_role.keys() | bare_roles.keys(), key=lambda k: -by_role.get(k, [0.0])[0]):
        cpu, procs = by_role.get(name, (0.0, 0))
        print(f"{name:<44}{cpu:>8.2f}{cpu / total:>8.1%}{procs:>7}{bare_roles.get(name, (0.0,))[0]:>8.2f}")
    print(f"{'all':<44}{total:>8.2f}{'':>15}{bare_total:>8.2f}")
    print(f"{'window x cores':<44}{window_cores:>8.2f}{'':>15}{bare_cores:>8.2f}")


def print_births(births: list, marks_from_fit: dict[str, float]) -> None:
    """The Ray processes started between fit() and the first step, each after the last mark it follows."""
    print(
        "\nRay processes started between fit() and the first step, in order (s from fit(); CPU to the first step)"
    )
    for at, name, cpu in births:
        passed = [k for k, t in marks_from_fit.items() if t <= at]
        print(f"{at:>6.1f}  {name:<44}{cpu:>6.2f}" + (f"   (after {passed[-1]})" if passed else ""))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    headline = report(args, *measure(args))
    if args.json:
        print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
