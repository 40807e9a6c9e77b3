"""Useful frames/s: the refurbishing Ray Data pipeline (2 consumers) vs a plain DataLoader vs the model.

Three rates in one run, on the same synthetic videos and augmentations (``--augment-cost`` busy seconds
per video beside ``partial_augment``): 1. **ray**: ``create_feed`` and one persistent ``LearnerFeed``
row stream per learner, drained by 2 consumers (cached partial augmentations reused ``--reuse`` times;
rows uncropped); 2. **dataloader**: a ``DataLoader`` that renders and augments every video on every use
and pads each to ``t_max``, with the cluster's CPU budget (``--cpus``); 3. **model**: the device-side
crop and ``InnerStep`` on the pipeline's rows, one torch thread a learner, times 2. CPU: every process
of each pipeline, from /proc, per 1,000 useful frames over the warm epochs (it holds on a busy machine).
A second table says how long each consumer was blocked in ``take`` and what the feed was computing.

    python bench/pipeline.py                                  # the size make bench runs
    python bench/pipeline.py --json                           # ... and a JSON last line
    python bench/pipeline.py --videos 400 --epochs 4 --reuse 3 --augment-cost 0.01
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import STAT_CSTIME, STAT_CUTIME, STAT_PPID, STAT_STIME, STAT_UTIME, processes

from raytrain_seq.algorithms.augment import final_augment, partial_augment
from raytrain_seq.config import Config
from raytrain_seq.data.synthetic import SyntheticVideos
from raytrain_seq.models import build_model
from raytrain_seq.parts import Parts
from raytrain_seq.seeds import partial_rng
from raytrain_seq.training.staging import stage_rows
from raytrain_seq.training.step import InnerStep, build_optimizer

CONSUMERS = 2
_BASELINE_STREAM = 0x42415345  # "BASE": the baseline's final-augmentation stream


def make_config(args: argparse.Namespace) -> Config:
    return Config.from_preset(
        "smoke",
        max_videos=args.videos,
        epochs=args.epochs,
        reuse=args.reuse,
        augment_cost=args.augment_cost,
        learners=CONSUMERS,
        batch_size=args.batch,
    )


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds (user + system) of process ``root`` (default: this one) and every live descendant,
    plus the children they already reaped (``cutime``/``cstime``), read from /proc: Ray's raylet, GCS and
    workers are descendants of the driver that ``ray.init`` started them from, DataLoader workers of
    the loader's process. CPU time is what a pipeline costs whatever else runs on the box."""
    root = os.getpid() if root is None else root
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for pid, (fields, _) in processes().items():
        parent[pid] = int(fields[STAT_PPID])
        cpu[pid] = sum(int(fields[k]) for k in (STAT_UTIME, STAT_STIME, STAT_CUTIME, STAT_CSTIME)) / tick
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        children = [c for c, p in parent.items() if p == pid and c not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(cpu.get(pid, 0.0) for pid in tree)


def run_ray(config: Config, args: argparse.Namespace, pace: float | None = None) -> dict:
    """Each consumer drains its learner's persistent row stream (``LearnerFeed``: one stream across all
    epochs, rows uncropped, the crop left to the learner); keeps some epoch-1 rows for the model.

    ``pace`` (useful frames/s of one learner) makes each consumer sleep as long as that learner would
    compute on every mini-batch (a learner on its own device), so its wait is what a real learner waits.
    """
    import ray

    from raytrain_seq.runtime.feed import create_feed
    from raytrain_seq.runtime.learner_feed import LearnerFeed

    began = time.perf_counter()
    feed = create_feed(Parts.of(config).feed, videos_per_task=args.videos_per_task)
    learners = [LearnerFeed(feed, epochs=config.train.epochs) for _ in range(CONSUMERS)]
    epochs, sample = [], []
    keep_epoch = min(1, config.train.epochs - 1)
    for epoch in range(config.train.epochs):
        views: list = [None] * CONSUMERS
        t0, cpu0 = time.perf_counter(), tree_cpu_seconds()

        def drain(rank: int, epoch: int, views: list) -> None:
            view, _ = learners[rank].epoch_rows(epoch, rank, CONSUMERS)
            views[rank] = view
            while (rows := view.take(config.train.batch_size)) is not None:
                if epoch == keep_epoch and rank == 0 and len(sample) < args.model_batches:
                    sample.append(rows)
                if pace:
                    time.sleep(np.clip(rows["lengths"], 0, None).sum() / pace)

        threads = [threading.Thread(target=drain, args=(rank, epoch, views)) for rank in range(CONSUMERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall, cpu = time.perf_counter() - t0, tree_cpu_seconds() - cpu0
        epochs.append(
            {
                "epoch": epoch,
                "wall": wall,
                "cpu": cpu,
                "frames": sum(v.frames for v in views),
                "rows": sum(v.rows for v in views),
                "wait": [v.wait_seconds for v in views],
            }
        )
    seconds = time.perf_counter() - began
    for learner in learners:
        learner.close()
    stats = ray.get(feed.stats.remote(wait=True))
    for e in epochs:
        e["recomputed"] = stats.epochs.get(e["epoch"], {}).get("recomputed", 0)
    ray.kill(feed)
    return {"epochs": epochs, "seconds": seconds, "stats": stats, "sample": sample}


class PaddedVideos(torch.utils.data.Dataset):
    """The plain pipeline: every use renders, partial- and final-augments one video, padded to t_max."""

    def __init__(self, config: Config, t_max: int, epoch: int) -> None:
        d = config.data
        self.videos = SyntheticVideos(
            d.num_classes, d.stride, max(8, d.cache_size), d.seed, d.max_videos, val_fraction=d.val_fraction
        )
        self.catalog = self.videos.catalog("train")
        self.config, self.t_max, self.epoch = config, t_max, epoch

    def __len__(self) -> int:
        return len(self.catalog)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        d = self.config.data
        video = int(self.catalog.ids[index])
        frames = self.videos.render(video)
        frames = partial_augment(frames, size=d.cache_size, rng=partial_rng(d.seed, video, self.epoch))
        end = time.perf_counter() + d.augment_cost
        while time.perf_counter() < end:
            pass
        rng = np.random.default_rng([d.seed, _BASELINE_STREAM, self.epoch, video])
        frames = final_augment(frames, crop=d.crop, rng=rng)
        row = np.zeros((self.t_max, *frames.shape[1:]), dtype=np.uint8)
        row[: len(frames)] = frames
        return {
            "frames": row,
            "starts": np.array([0]),
            "lengths": np.array([len(frames)]),
            "labels": np.array([int(self.catalog.labels[index])]),
            "num_sequences": np.int64(1),
        }


def run_dataloader(config: Config, t_max: int, args: argparse.Namespace) -> dict:
    began = time.perf_counter()
    epochs = []
    for epoch in range(config.train.epochs):
        t0, frames, rows, cpu0 = time.perf_counter(), 0, 0, tree_cpu_seconds()
        loader = torch.utils.data.DataLoader(
            PaddedVideos(config, t_max, epoch),
            batch_size=config.train.batch_size,
            shuffle=True,
            num_workers=args.cpus,
            generator=torch.Generator().manual_seed(epoch),
        )
        for batch in loader:
            frames += int(batch["lengths"].sum())
            rows += len(batch["lengths"])
        del loader  # its workers end and are reaped: their CPU lands in this process's cutime
        epochs.append(
            {
                "epoch": epoch,
                "wall": time.perf_counter() - t0,
                "cpu": tree_cpu_seconds() - cpu0,
                "frames": frames,
                "rows": rows,
            }
        )
    return {"seconds": time.perf_counter() - began, "epochs": epochs}


def run_model(config: Config, sample: list[dict[str, np.ndarray]]) -> dict:
    """One learner's InnerStep on the pipeline's own rows, one torch thread; the first step is warm-up.

    The timed work is what the learner does per mini-batch: ``stage_rows`` (to the device, the crop and
    flip there: work moved off the pipeline is charged to the model) and the step."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = config.model
    model = build_model(config.data.num_classes, 3, m.width, m.depth, m.hidden, m.temporal, m.backbone)
    optimizer = build_optimizer("adam", model.parameters(), lr=config.train.lr)
    step = InnerStep(model, optimizer, micro_batch_size=config.train.micro_batch_size)
    crop = config.data.crop
    step(stage_rows(sample[0], "cpu", crop=crop, flow=False))
    seconds = frames = 0
    for rows in sample[1:] or sample:
        began = time.perf_counter()
        stats = step(stage_rows(rows, "cpu", crop=crop, flow=False))
        seconds += time.perf_counter() - began
        frames += stats.frames
    return {"seconds": seconds, "frames": frames, "steps": max(1, len(sample) - 1)}


def _steady(epochs: list[dict]) -> float:
    """Useful frames/s over epochs >= 1 (the warm cache), or over all when there is one epoch."""
    warm = epochs[1:] or epochs
    return sum(e["frames"] for e in warm) / sum(e["wall"] for e in warm)


def _cpu_ms_per_1k(epochs: list[dict]) -> float:
    """CPU milliseconds of every process of the pipeline per 1,000 useful frames, warm epochs."""
    warm = epochs[1:] or epochs
    return 1e6 * sum(e["cpu"] for e in warm) / max(1, sum(e["frames"] for e in warm))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = make_config(args)
    runs = measure(config, args)
    rates = print_rates(config, args, runs)
    print_waits(runs)
    cpu = print_cpu(runs)
    if args.json:
        print(json.dumps(headline(rates, cpu)))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The bench's flags, checked (parser.error names the flag and its range)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=600, help="training videos (max_videos)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs for both pipelines")
    parser.add_argument("--reuse", type=int, default=3, help="refurbish reuse factor r of the Ray pipeline")
    parser.add_argument(
        "--augment-cost", type=float, default=0.0, help="busy seconds per partial augmentation"
    )
    parser.add_argument("--batch", type=int, default=4, help="rows per take / DataLoader batch")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="CPU budget of both pipelines")
    parser.add_argument(
        "--videos-per-task", type=int, default=16, help="videos per partial-augmentation task"
    )
    parser.add_argument("--model-batches", type=int, default=6, help="mini-batches timed through the model")
    parser.add_argument("--vs-reuse-1", action="store_true", help="also drain the Ray pipeline with reuse=1")
    parser.add_argument(
        "--json", action="store_true", help="print the headline figures as one JSON last line"
    )
    args = parser.parse_args(argv)
    for name in ("videos", "epochs", "reuse", "batch", "cpus", "videos_per_task", "model_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.augment_cost < 0:
        parser.error(f"--augment-cost must be >= 0, got {args.augment_cost}")
    return args


def measure(config: Config, args: argparse.Namespace) -> dict[str, Any]:
    """The runs, on a private Ray: the Ray pipeline drained, the model's rate, the pipeline paced at it
    (and drained at reuse 1 with --vs-reuse-1); then, Ray shut down, the DataLoader baseline."""
    import ray

    ray.init(
        address="local",
        num_cpus=args.cpus,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    logging.getLogger("ray").setLevel(logging.WARNING)
    # Start the worker processes before timing: a Ray job on a live cluster does not pay that per epoch.
    ray.data.range(8, override_num_blocks=args.cpus).map_batches(lambda b: b).take_all()
    drained = run_ray(config, args)
    model = run_model(config, drained["sample"])
    learner_rate = model["frames"] / model["seconds"]
    paced = run_ray(config, args, pace=learner_rate)
    reuse_1 = (
        run_ray(make_config(argparse.Namespace(**{**vars(args), "reuse": 1})), args)
        if args.vs_reuse_1
        else None
    )
    ray.shutdown()
    t_max = drained["stats"].t_max
    loader = run_dataloader(config, t_max, args)
    return {
        "drained": drained,
        "model": model,
        "learner_rate": learner_rate,
        "paced": paced,
        "reuse_1": reuse_1,
        "t_max": t_max,
        "loader": loader,
    }


def print_rates(
    config: Config, args: argparse.Namespace, runs: dict[str, Any]
) -> dict[str, tuple[float, float]]:
    """The useful frames per second of each source (whole run and warm epochs) against the DataLoader
    and the model, and the padding of each; returns the rates by source."""
    drained, loader, reuse_1 = runs["drained"], runs["loader"], runs["reuse_1"]
    learner_rate, t_max, model = runs["learner_rate"], runs["t_max"], runs["model"]
    ray_frames = sum(e["frames"] for e in drained["epochs"])
    loader_frames = sum(e["frames"] for e in loader["epochs"])
    rates = {
        "ray pipeline, 2 consumers": (ray_frames / drained["seconds"], _steady(drained["epochs"])),
        "DataLoader, naive padding": (loader_frames / loader["seconds"], _steady(loader["epochs"])),
        "model, 1 learner x 2": (2 * learner_rate, 2 * learner_rate),
    }
    if reuse_1 is not None:
        frames_1 = sum(e["frames"] for e in reuse_1["epochs"])
        rates["ray pipeline, reuse 1"] = (frames_1 / reuse_1["seconds"], _steady(reuse_1["epochs"]))
    base, need = rates["DataLoader, naive padding"], rates["model, 1 learner x 2"]
    print(
        f"\n{args.videos} videos, {args.epochs} epochs, reuse {args.reuse}, augment_cost {args.augment_cost} s, "
        f"{args.cpus} CPUs, batch {args.batch}, t_max {t_max}, crop {config.data.crop}"
    )
    print("useful frames/s: 'all' = whole run (Ray: from feed creation, epoch 0 cold); 'warm' = epochs >= 1")
    print(f"{'source':<28}{'all':>9}{'warm':>9}{'all vs DL':>11}{'warm vs DL':>12}{'warm vs model':>15}")
    for name, (whole, warm) in rates.items():
        print(
            f"{name:<28}{whole:>9.0f}{warm:>9.0f}{whole / base[0]:>10.2f}x{warm / base[1]:>11.2f}x"
            f"{warm / need[1]:>14.2f}x"
        )
    ray_rows = sum(e["rows"] for e in drained["epochs"])
    loader_rows = sum(e["rows"] for e in loader["epochs"])
    print(
        f"rows: ray {ray_rows} blocks ({1 - ray_frames / (ray_rows * t_max):.1%} padding), DataLoader "
        f"{loader_rows} padded videos ({1 - loader_frames / (loader_rows * t_max):.1%} padding); model: "
        f"{learner_rate:.0f} useful frames/s per learner (1 torch thread, {model['steps']} steps)"
    )
    return rates


def print_waits(runs: dict[str, Any]) -> None:
    """Per epoch: the partial augmentations recomputed and their CPU, and the paced consumers' waits."""
    drained, paced, learner_rate = runs["drained"], runs["paced"], runs["learner_rate"]
    stats = drained["stats"].epochs
    print(
        f"\nwhere the learners wait: consumers paced at the model's rate ({learner_rate:.0f} frames/s each), "
        "so a wait is time a learner with its own device would idle"
    )
    print(
        f"{'epoch':>5}{'recomputed':>11}{'partial CPU s':>14}{'drain frames/s':>15}{'paced wall s':>13}{'paced wait s':>16}{'wait %':>8}"
    )
    for d, p in zip(drained["epochs"], paced["epochs"], strict=True):
        waits = "/".join(f"{w:.2f}" for w in p["wait"])
        share = sum(p["wait"]) / (len(p["wait"]) * p["wall"])
        partial = stats.get(d["epoch"], {}).get("partial_seconds", 0.0)
        print(
            f"{d['epoch']:>5}{d['recomputed']:>11}{partial:>14.2f}{d['frames'] / d['wall']:>15.0f}"
            f"{p['wall']:>13.2f}{waits:>16}{share:>8.0%}"
        )
    print(
        "epoch 0 is cold: every partial augmentation is computed while the learners wait. From epoch 1 the\n"
        "evicted videos were recomputed in the background during the previous epoch and each learner's\n"
        "persistent stream has run ahead into the epoch, so what remains is copying the cached arrays into\n"
        "rows and the CPUs that the background recompute and the two streams share."
    )


def print_cpu(runs: dict[str, Any]) -> dict[str, float]:
    """The CPU of every process per 1,000 useful frames in the warm epochs, pipeline against DataLoader."""
    cpu = {
        "pipeline": _cpu_ms_per_1k(runs["drained"]["epochs"]),
        "dataloader": _cpu_ms_per_1k(runs["loader"]["epochs"]),
    }
    print(
        f"\nCPU of every process per 1,000 useful frames, warm epochs: ray pipeline {cpu['pipeline']:.1f} ms, "
        f"DataLoader {cpu['dataloader']:.1f} ms ({cpu['pipeline'] / cpu['dataloader']:.2f}x)"
    )
    return cpu


def headline(rates: dict[str, tuple[float, float]], cpu: dict[str, float]) -> dict[str, Any]:
    """The --json last line's figures."""
    base, need = rates["DataLoader, naive padding"], rates["model, 1 learner x 2"]
    return {
        "pipeline_frames_s_warm": round(rates["ray pipeline, 2 consumers"][1], 1),
        "model_frames_s": round(need[1], 1),
        "pipeline_vs_model_warm": round(rates["ray pipeline, 2 consumers"][1] / need[1], 3),
        "dataloader_frames_s_warm": round(base[1], 1),
        "cpu_ms_per_1k_frames": {key: round(value, 2) for key, value in cpu.items()},
    }


if __name__ == "__main__":
    sys.exit(main())
