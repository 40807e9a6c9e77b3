"""The path a user would otherwise take on a GPU: a plain PyTorch loop over a ``DataLoader``.

The baseline of the Ray job's useful frames/s on the same videos (``scripts/gpu_checks.sh`` runs both):
a map-style dataset over the synthetic training videos renders each video, applies the partial
augmentation on every use (r = 1) and the final crop and flip, in ``--workers`` one-thread workers; the
collate pads a batch to its longest video, into pinned memory; the main process steps the job's model,
optimizer, precision and micro-batch streaming (``step.InnerStep``). The model encodes real frames only,
so padding costs host work and copies, not compute: what is compared is the data path. ``shm_need``
refuses to start when ``/dev/shm`` is too small, naming the fix. Prints useful frames/s per epoch and
over all (the DataLoader's start included); ``--json`` prints one JSON last line. No ray:

    python bench/dataloader_loop.py --preset ucf101-rgb --precision bf16 --max-videos 1500 --json
    python bench/dataloader_loop.py --preset demo --epochs 1 --workers 2      # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raytrain_seq.algorithms.augment import final_augment, partial_augment
from raytrain_seq.config import PRECISIONS, Config
from raytrain_seq.data.synthetic import SyntheticVideos
from raytrain_seq.models.factory import build_model_for
from raytrain_seq.seeds import partial_rng
from raytrain_seq.training.step import InnerStep, build_optimizer

_BASELINE_STREAM = 0x444C4F4F  # "DLOO": the baseline's final-augmentation stream
PREFETCH = 4  # batches each worker keeps ready (DataLoader's prefetch_factor)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def one_thread_worker(worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn``: one torch thread, and one for any OMP/MKL/OpenBLAS pool
    started in the worker from here on."""
    del worker_id
    for name in THREAD_VARIABLES:
        os.environ[name] = "1"
    torch.set_num_threads(1)


def shm_need(config: Config, lengths: np.ndarray, *, videos: int, workers: int) -> int:
    """Bytes of shared memory the workers' batches hold at once: ``workers`` x ``PREFETCH`` batches of
    ``videos`` cropped uint8 videos padded to the batch's longest, estimated as the length a video of
    the catalog exceeds once in ``videos + 1`` draws (0 with no workers: batches stay in-process)."""
    if workers == 0 or len(lengths) == 0:
        return 0
    longest = float(np.quantile(lengths, 1.0 - 1.0 / (videos + 1)))
    frame = config.data.crop**2 * 3
    return int(workers * PREFETCH * videos * longest * frame)


def check_shm(need: int, path: str = "/dev/shm") -> str | None:
    """None when ``path`` has ``need`` bytes free, else what is short and the fix, in one sentence."""
    if need == 0:
        return None
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        free = 0
    if free >= need:
        return None
    return (
        f"{path} has {free / 2**30:.1f} GiB free and the DataLoader's workers need about {need / 2**30:.1f} "
        f"GiB of it for their batches: lower --workers or --videos, or give the machine more shared memory "
        f"(docker run --shm-size=16g, or mount -o remount,size=16G {path})"
    )


class Clips(torch.utils.data.Dataset):
    """The training videos of ``config``'s synthetic set, augmented on every use, one video an item."""

    def __init__(self, config: Config, epoch: int) -> None:
        d = config.data
        self.videos = SyntheticVideos(
            d.num_classes, d.stride, max(8, d.cache_size), d.seed, d.max_videos, val_fraction=d.val_fraction
        )
        self.catalog = self.videos.catalog("train")
        self.config, self.epoch = config, epoch

    def __len__(self) -> int:
        return len(self.catalog)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        d = self.config.data
        video = int(self.catalog.ids[index])
        frames = self.videos.render(video)
        frames = partial_augment(frames, size=d.cache_size, rng=partial_rng(d.seed, video, self.epoch))
        rng = np.random.default_rng([d.seed, _BASELINE_STREAM, self.epoch, video])
        return final_augment(frames, crop=d.crop, rng=rng), int(self.catalog.labels[index])


def pad_collate(items: list[tuple[np.ndarray, int]]) -> dict[str, torch.Tensor]:
    """Videos padded with zero frames to the batch's longest, as block rows of one sequence each: lengths
    37 and 12 -> frames [2, 37, H, W, C], the second row's frames 12..36 zero."""
    longest = max(len(frames) for frames, _ in items)
    batch = np.zeros((len(items), longest, *items[0][0].shape[1:]), dtype=np.uint8)
    for row, (frames, _) in enumerate(items):
        batch[row, : len(frames)] = frames
    n = len(items)
    return {
        "frames": torch.from_numpy(batch),
        "starts": torch.zeros((n, 1), dtype=torch.int64),
        "lengths": torch.tensor([[len(frames)] for frames, _ in items], dtype=torch.int64),
        "labels": torch.tensor([[label] for _, label in items], dtype=torch.int64),
        "num_sequences": torch.ones(n, dtype=torch.int64),
    }


def run(config: Config, *, videos: int, workers: int, epochs: int, device: torch.device) -> dict:
    """``epochs`` passes of the loop: per epoch its wall seconds, useful frames, steps and padded frames."""
    num_classes = config.data.num_classes
    torch.manual_seed(config.data.seed)
    model = build_model_for(config.model, num_classes=num_classes, in_channels=3).to(device)
    t = config.train
    optimizer = build_optimizer(t.optimizer, model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    step = InnerStep(
        model, optimizer, micro_batch_size=t.micro_batch_size, device=device, precision=t.precision
    )
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = []
    for epoch in range(epochs):
        sync()
        began = time.perf_counter()
        loader = torch.utils.data.DataLoader(
            Clips(config, epoch),
            batch_size=videos,
            shuffle=True,
            num_workers=workers,
            collate_fn=pad_collate,
            pin_memory=device.type == "cuda",
            prefetch_factor=PREFETCH if workers else None,
            worker_init_fn=one_thread_worker if workers else None,
            generator=torch.Generator().manual_seed(epoch),
        )
        frames = padded = steps = 0
        for batch in loader:
            stats = step(batch)
            frames += stats.frames
            padded += int(batch["frames"].shape[0] * batch["frames"].shape[1]) - stats.frames
            steps += 1
        sync()
        del loader
        out.append({"epoch": epoch, "seconds": time.perf_counter() - began, "frames": frames,
                    "padded": padded, "steps": steps})  # fmt: skip
    return {"epochs": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--preset", default="ucf101-rgb" if cuda else "demo", help="model and videos")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--precision", choices=PRECISIONS, default=None, help="default: the preset's")
    parser.add_argument("--num-classes", type=int, default=10, help="classes of the synthetic set")
    parser.add_argument("--max-videos", type=int, default=1500, help="training videos (a balanced subset)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--videos", type=int, default=64, help="videos a step (one DataLoader batch)")
    parser.add_argument("--workers", type=int, default=8, help="DataLoader worker processes")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of the main process")
    parser.add_argument("--json", action="store_true", help="print the headline as one JSON last line")
    args = parser.parse_args(argv)
    for name in ("num_classes", "max_videos", "epochs", "videos", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.workers < 0:
        parser.error(f"--workers must be >= 0, got {args.workers}")
    device = torch.device(args.device)
    if device.type == "cuda" and not cuda:
        parser.error(f"--device {args.device}: torch sees no CUDA device; pass --device cpu")
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    overrides = {"dataset": "synthetic", "data_root": None, "num_classes": args.num_classes,
                 "max_videos": args.max_videos}  # fmt: skip
    if args.precision:
        overrides["precision"] = args.precision
    config = Config.from_preset(args.preset, **overrides)
    short = check_shm(
        shm_need(config, Clips(config, 0).catalog.lengths, videos=args.videos, workers=args.workers)
    )
    if short is not None:
        parser.error(short)
    result = run(config, videos=args.videos, workers=args.workers, epochs=args.epochs, device=device)
    epochs = result["epochs"]
    frames = sum(e["frames"] for e in epochs)
    seconds = sum(e["seconds"] for e in epochs)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    d, t = config.data, config.train
    print(
        f"DataLoader loop, {args.preset} ({config.model.backbone}, {t.precision}) on {name}: "
        f"{len(Clips(config, 0))} synthetic videos, cache {d.cache_size} -> crop {d.crop}, {args.videos} "
        f"videos a step, {args.workers} workers, micro-batch {t.micro_batch_size}"
    )
    for e in epochs:
        share = e["padded"] / max(e["padded"] + e["frames"], 1)
        print(f"  epoch {e['epoch']}: {e['frames'] / e['seconds']:.0f} useful frames/s over {e['seconds']:.1f} s, "
              f"{e['steps']} steps, {share:.1%} of the frames sent are padding")  # fmt: skip
    rate = frames / seconds
    print(f"all epochs: {rate:.0f} useful frames/s")
    if args.json:
        print(json.dumps({"preset": args.preset, "precision": t.precision, "device": name,
                          "workers": args.workers, "videos_per_step": args.videos,
                          "frames_s": round(rate, 1), "epochs": epochs}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
