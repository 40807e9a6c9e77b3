"""One learner's step on its device: the useful frames/s it consumes, three ways of staging its rows.

A GPU learner's rate is what the data pipeline must outrun. For a preset's model and row shape, rows
laid out by the packer from the real UCF101 split-1 lengths (random pixels), three ways interleaved:
1. **learner** (``runtime.learner``'s): uncropped rows collated ahead into pinned memory
   (``staging.RowPrefetcher``), each micro-batch copied, cropped and flipped on the device
   (``staging.MicroBatchStage``) while the previous one computes; 2. **whole batch**: the same rows staged
   whole (``stage_rows``) between steps; 3. **host crop**: rows cropped on the host beforehand (the same
   frames). Prints each one's useful frames/s, learner / whole batch and learner / host crop, the staging
   share, and on CUDA the peak memory. ``--memory-cap-gib G --batch-size 576`` (CUDA) checks instead that
   the streamed learner (``"auto"``) trains where the whole batch runs out of memory. ``--backbone``
   swaps the encoder (video backbones included). ``--json``: one JSON last line. No ray:

    python bench/learner_device.py --precision bf16 --batch-size 576 --memory-cap-gib 8 --json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raytrain_seq.algorithms.augment import final_augment_batch
from raytrain_seq.algorithms.packing import pack
from raytrain_seq.config import BACKBONES, PRECISIONS, Config
from raytrain_seq.data.lengths import strided, ucf101_lengths
from raytrain_seq.models.factory import build_model_for
from raytrain_seq.training.staging import MicroBatchStage, RowPrefetcher, stage_rows
from raytrain_seq.training.step import InnerStep, build_optimizer

DRAWS = ("tops", "lefts", "flips")


def make_rows(config: Config, count: int, seed: int) -> tuple[list[dict[str, np.ndarray]], int]:
    """``count`` mini-batches of uncropped rows with crop draws, laid out by the packer; and t_max."""
    d = config.data
    lengths = strided(ucf101_lengths("train")[0], d.stride)
    plan = pack(lengths, d.t_max, strategy="optimal", seed=seed)
    rng = np.random.default_rng(seed)
    per_row = max(len(block.ids) for block in plan.blocks)
    batches = []
    for b in range(count):
        blocks = plan.blocks[b * config.train.batch_size : (b + 1) * config.train.batch_size]
        n = len(blocks)
        table = {key: np.full((n, per_row), -1, dtype=np.int64) for key in ("starts", "lengths", "labels")}
        draws = {key: np.zeros((n, per_row), dtype=np.int64) for key in DRAWS}
        for row, block in enumerate(blocks):
            k = len(block.ids)
            table["starts"][row, :k] = block.starts
            table["lengths"][row, :k] = block.lengths
            table["labels"][row, :k] = rng.integers(0, 101, k)
            draws["tops"][row, :k] = rng.integers(0, d.cache_size - d.crop + 1, k)
            draws["lefts"][row, :k] = rng.integers(0, d.cache_size - d.crop + 1, k)
            draws["flips"][row, :k] = rng.integers(0, 2, k)
        frames = rng.integers(0, 256, (n, plan.t_max, d.cache_size, d.cache_size, 3), dtype=np.uint8)
        for row, block in enumerate(blocks):
            frames[row, sum(block.lengths) :] = 0  # padding is zero in real rows
        num_sequences = np.array([len(block.ids) for block in blocks], dtype=np.int64)
        batches.append({"frames": frames, **table, "num_sequences": num_sequences, **draws})
    return batches, plan.t_max


def host_cropped(rows: dict[str, np.ndarray], crop: int) -> dict[str, np.ndarray]:
    """The rows as the pipeline sent them before issue 13: cropped and flipped, no draws."""
    frames = final_augment_batch(
        torch.from_numpy(rows["frames"]),
        **{k: rows[k] for k in ("starts", "lengths", *DRAWS)},
        crop=crop,
        flow=False,
    )
    return {**{k: v for k, v in rows.items() if k not in DRAWS and k != "frames"}, "frames": frames.numpy()}


def run_way(step: InnerStep, batches: list[dict], prefetcher: RowPrefetcher | None, device: torch.device,
            crop: int) -> dict[str, float]:  # fmt: skip
    """The learner's loop over ``batches``, one mini-batch collated ahead into host memory (``prefetcher``
    None: staged whole on the device by ``stage_rows``, in place): wall seconds, seconds the loop spent
    staging, useful frames."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def stage(rows):
        if prefetcher is None:
            return stage_rows(rows, device, crop=crop, flow=False)
        return prefetcher.submit(rows)

    def ready(staged):
        return staged if prefetcher is None else prefetcher.wait(staged)

    sync()
    began = time.perf_counter()
    t = time.perf_counter()
    ahead = stage(batches[0])
    staged_s = time.perf_counter() - t
    frames = 0
    for i in range(len(batches)):
        t = time.perf_counter()
        batch = ready(ahead)
        if i + 1 < len(batches):
            ahead = stage(batches[i + 1])
        staged_s += time.perf_counter() - t
        frames += step(batch).frames
    sync()
    return {"wall": time.perf_counter() - began, "staged_s": staged_s, "frames": frames}


def build_steps(config: Config, device: torch.device, micro_batch_size: int | str) -> dict[str, InnerStep]:
    """One model and optimizer, two steps over them: streamed (``MicroBatchStage``: the micro-batches'
    input copied and cropped on the device) and plain (the batch's tensors moved as they are)."""
    t, d = config.train, config.data
    torch.manual_seed(0)
    model = build_model_for(config.model, num_classes=101, in_channels=3).to(device)
    optimizer = build_optimizer(t.optimizer, model.parameters(), lr=t.lr)
    common = {"micro_batch_size": micro_batch_size, "device": device, "precision": t.precision}
    stage = MicroBatchStage(device, crop=d.crop, flow=False)
    return {
        "streamed": InnerStep(model, optimizer, **common, stage=stage),
        "plain": InnerStep(model, optimizer, **common),
    }


def memory_cap(config: Config, device: torch.device, cap_gib: float | None) -> dict[str, object]:
    """One step of B rows streamed (``micro_batch_size="auto"``) and one staged whole, under a memory cap
    the whole staged mini-batch exceeds: whether each trained, the micro-batch "auto" settled on, and
    the peak device memory."""
    d = config.data
    batches, t_max = make_rows(config, 1, seed=0)
    rows = batches[0]
    whole_input = rows["frames"].nbytes + rows["frames"].nbytes * (d.crop / d.cache_size) ** 2
    cap = cap_gib * 2**30 if cap_gib is not None else 0.8 * whole_input
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    steps = build_steps(config, device, "auto")
    outcome: dict[str, object] = {
        "batch_size": int(rows["frames"].shape[0]),
        "t_max": t_max,
        "whole_input_gib": round(whole_input / 2**30, 2),
        "cap_gib": round(cap / 2**30, 2),
    }
    prefetcher = RowPrefetcher(device)
    host = prefetcher.wait(prefetcher.submit(rows))  # pinned host memory: what the learner streams from
    prefetcher.close()
    for way in ("streamed", "whole batch"):
        step = steps["streamed" if way == "streamed" else "plain"]
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        try:
            batch = host if way == "streamed" else stage_rows(rows, device, crop=d.crop, flow=False)
            stats = step(batch)
        except torch.cuda.OutOfMemoryError as exc:
            outcome[way] = {"trained": False, "error": str(exc).splitlines()[0][:160]}
        else:
            outcome[way] = {
                "trained": True,
                "frames": stats.frames,
                "seconds": round(time.perf_counter() - began, 2),
                "micro_batch": step.sizer.known(step.model, batch) or outcome["batch_size"],
            }
        batch = None
        outcome[way]["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--preset", default="ucf101-rgb" if cuda else "demo", help="model and row shape")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--steps", type=int, default=6, help="timed mini-batches per way per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the median is reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (a CPU learner's one)")
    parser.add_argument(
        "--precision", choices=PRECISIONS, default=None, help="train.precision (default: the preset's)"
    )
    parser.add_argument("--batch-size", type=int, default=None, help="rows a step (default: the preset's)")
    parser.add_argument("--backbone", choices=BACKBONES, default=None, help="encoder (default: the preset's)")
    parser.add_argument(
        "--memory-cap-gib", type=float, default=None, nargs="?", const=0.0,
        help="the streaming check under a CUDA memory cap (0 or no value: 0.8 x the whole batch's input)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the headline as one JSON last line")
    args = parser.parse_args(argv)
    for name in ("steps", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    device = torch.device(args.device)
    if device.type == "cuda" and not cuda:
        parser.error(f"--device {args.device}: torch sees no CUDA device; pass --device cpu")
    if device.type == "cuda" and device.index is None:
        # The memory cap (set_per_process_memory_fraction) and the peak counters take a device with an
        # index and raise ValueError on a bare "cuda": that means the current device.
        device = torch.device("cuda", torch.cuda.current_device())
    if args.memory_cap_gib is not None and device.type != "cuda":
        parser.error("--memory-cap-gib caps CUDA memory: run it on a GPU (--device cuda)")
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("raytrain_seq.algorithms.microbatch").setLevel(logging.INFO)  # what "auto" settled on
    overrides = {"precision": args.precision} if args.precision else {}
    if args.backbone is not None:
        overrides["backbone"] = args.backbone
    if args.batch_size is not None:
        overrides.update(batch_size=args.batch_size, max_batch_size=max(args.batch_size, 576))
    config = Config.from_preset(args.preset, **overrides)
    if args.memory_cap_gib is not None:
        outcome = memory_cap(config, device, args.memory_cap_gib or None)
        name = torch.cuda.get_device_name(device)
        print(f"{args.preset} ({config.train.precision}) on {name}: B={outcome['batch_size']} rows x t_max "
              f"{outcome['t_max']}, {outcome['whole_input_gib']} GiB of input staged whole, cap "
              f"{outcome['cap_gib']} GiB")  # fmt: skip
        for way in ("streamed", "whole batch"):
            print(f"  {way:<12} {outcome[way]}")
        if args.json:
            print(json.dumps({"preset": args.preset, "precision": config.train.precision, "device": name,
                              "memory_cap": outcome}))  # fmt: skip
        return 0
    return interleaved(config, args, device)


def interleaved(config: Config, args: argparse.Namespace, device: torch.device) -> int:
    """The three ways, interleaved round by round; prints the rates, ratios and the JSON line."""
    d, m, t = config.data, config.model, config.train
    batches, t_max = make_rows(config, args.steps, seed=0)
    cropped = [host_cropped(rows, d.crop) for rows in batches]
    prefetcher = RowPrefetcher(device)
    steps = build_steps(config, device, t.micro_batch_size)
    # way -> (rows, prefetcher or None for staging the whole batch in place, step)
    ways = {
        "learner": (batches, prefetcher, steps["streamed"]),
        "whole batch": (batches, None, steps["plain"]),
        "host crop": (cropped, prefetcher, steps["plain"]),
    }
    # Warm-up, untimed: cuDNN's algorithm choice, the allocator, "auto"'s micro-batch probe, every way.
    for rows, staging, step in ways.values():
        run_way(step, rows[:2], staging, device, d.crop)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, (rows, staging, step) in ways.items():
            results[name].append(run_way(step, rows, staging, device, d.crop))
    prefetcher.close()
    rate = {name: statistics.median(r["frames"] / r["wall"] for r in runs) for name, runs in results.items()}
    staged = {
        name: statistics.median(r["staged_s"] / r["wall"] for r in runs) for name, runs in results.items()
    }
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    rows_mb = batches[0]["frames"].nbytes / 2**20
    print(
        f"{args.preset} on {name}: {m.backbone} encoder, {t.batch_size} rows x t_max {t_max}, cache "
        f"{d.cache_size} -> crop {d.crop}, micro-batch {t.micro_batch_size} ({t.precision}), "
        f"{rows_mb:.0f} MiB of uncropped frames a mini-batch; median of {args.rounds} interleaved rounds "
        f"of {args.steps} steps"
    )
    print(f"{'way':<12}{'useful frames/s':>17}{'staging share of wall':>23}  (the training thread's)")
    for way in ways:
        print(f"{way:<12}{rate[way]:>17.0f}{staged[way]:>22.1%}")
    ratio = rate["learner"] / rate["host crop"]
    gain = rate["learner"] / rate["whole batch"]
    print(
        f"learner / whole batch: {gain:.3f}x (streamed input against the mini-batch staged whole); "
        f"learner / host crop: {ratio:.3f}x (1.0: the crop and flip cost the learner nothing)"
        + (f"; peak device memory {peak:.1f} GiB" if peak is not None else "")
    )
    if args.json:
        headline = {
            "preset": args.preset,
            "backbone": m.backbone,
            "precision": t.precision,
            "device": name,
            "learner_frames_s": round(rate["learner"], 1),
            "whole_batch_frames_s": round(rate["whole batch"], 1),
            "host_crop_frames_s": round(rate["host crop"], 1),
            "learner_vs_whole_batch": round(gain, 3),
            "learner_vs_host_crop": round(ratio, 3),
            "staging_share": {way: round(share, 3) for way, share in staged.items()},
            "peak_gib": None if peak is None else round(peak, 2),
        }
        print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
