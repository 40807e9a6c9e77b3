"""Flow once vs recompute every refurbish: the flow stream's CPU seconds per epoch, measured in one run.

Both ways on the same videos, epoch by epoch under the same balanced eviction (``--reuse``), in one
process, timed by this thread's CPU clock: **recompute** (the feed before flow once: decode the pairs,
cut the epoch's window, flow on the window) and **flow once** (epoch 0 computes the whole-frame flow,
``task_bodies.flow_videos``, then every refurbish cuts its window, ``task_bodies.window_videos``; the bytes differ
near the window's borders, where the solver now sees real pixels). The videos are
the miniature UCF101 of ``tests/video_fixtures.py``, decoded up to ``--size``; OpenCV runs one thread.
The table gives per epoch the videos recomputed and each mode's CPU seconds; the summary line the mean
over the epochs after the first and the ratio; ``--json`` adds one JSON last line.

    python bench/flow_once.py --json                 # the default size
    python bench/flow_once.py --tiny --json          # seconds (tests)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # video_fixtures: the miniature UCF101 the tests use


def window_first_flow(source, video: int, length: int, epoch: int, seed: int, size: int) -> np.ndarray:
    """The flow stream's partial augmentation before issue 13: window the frames, then the flow."""
    from raytrain_seq.algorithms.augment import resize_video
    from raytrain_seq.data.flow import pair_flow
    from raytrain_seq.data.sources import fit_length, flow_offset
    from raytrain_seq.data.video import decode_pairs

    first, second, last = decode_pairs(source.paths[video], stride=source.stride, size=size, threads=1)
    offset = flow_offset(seed, video, epoch)
    first, second = (resize_video(f, size, offset) for f in (first, second))
    return fit_length(pair_flow(first, second, last=last), length)


def cpu_seconds(work) -> tuple[float, object]:
    began = time.thread_time()
    out = work()
    return time.thread_time() - began, out


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="flow_once_") as root:
        return measure(args, Path(root))


def measure(args: argparse.Namespace, root: Path) -> dict:
    """Both modes over ``args.epochs`` epochs on a miniature UCF101 written under ``root``."""
    import cv2
    from video_fixtures import make_mini_ucf101

    from raytrain_seq.algorithms.refurbish import RefurbishSchedule
    from raytrain_seq.config import Config
    from raytrain_seq.data.geometry import load_catalogs
    from raytrain_seq.data.sources import get_source, source_kwargs
    from raytrain_seq.data.task_bodies import flow_videos, window_videos

    cv2.setNumThreads(1)  # one CPU per feed task: OpenCV's pool would count other cores' time
    make_mini_ucf101(root, classes=args.classes, groups=args.groups, clips=args.clips)
    config = Config.from_preset(
        None, dataset="ucf101", data_root=str(root), stream="flow", stride=args.stride, cache_size=args.size,
        crop=min(args.size, 112), seed=args.seed, reuse=args.reuse, epochs=args.epochs, run_name="flow_once",
    )  # fmt: skip
    kwargs = source_kwargs(config.data)
    source = get_source(kwargs)
    catalog = load_catalogs(config.data, warn=False)["catalogs"]["train"]
    train = catalog.ids.tolist()
    length = dict(zip(train, catalog.lengths.tolist(), strict=True))
    schedule = RefurbishSchedule(len(train), reuse=args.reuse, seed=args.seed)
    stored: dict[int, np.ndarray] = {}
    rows = []
    for epoch in range(args.epochs):
        ids = train if epoch == 0 else np.asarray(train)[schedule.evicted(epoch)].tolist()
        epochs = [epoch] * len(ids)
        recompute, old = cpu_seconds(
            lambda ids=ids, epoch=epoch: [
                window_first_flow(source, v, length[v], epoch, args.seed, args.size) for v in ids
            ]
        )
        flow_s = 0.0
        missing = [v for v in ids if v not in stored]
        if missing:
            flow_s, out = cpu_seconds(
                lambda missing=missing, epochs=epochs: flow_videos(kwargs, missing, epochs, args.size)
            )
            stored.update(zip(missing, out[:-1], strict=True))
        window_s, out = cpu_seconds(
            lambda ids=ids, epochs=epochs: window_videos(
                ids, epochs, args.seed, args.size, 0.0, *(stored[v] for v in ids)
            )
        )
        # The two modes must serve arrays of one shape (their bytes differ: the module docstring).
        if [a.shape for a in old] != [a.shape for a in out[:-1]]:
            raise RuntimeError("recompute and flow once served different shapes: the comparison is void")
        rows.append(
            {"epoch": epoch, "videos": len(ids), "recompute_s": recompute, "flow_once_s": flow_s + window_s,
             "flow_s": flow_s, "window_s": window_s}
        )  # fmt: skip
    steady = rows[1:]
    mean = {key: float(np.mean([r[key] for r in steady])) for key in ("recompute_s", "flow_once_s", "videos")}
    return {
        "videos": len(train),
        "epochs": args.epochs,
        "reuse": args.reuse,
        "size": args.size,
        "stride": args.stride,
        "flow_method": source.flow_method,
        "per_epoch": rows,
        "steady_videos_per_epoch": mean["videos"],
        "recompute_cpu_s_per_epoch": mean["recompute_s"],
        "flow_once_cpu_s_per_epoch": mean["flow_once_s"],
        "saved_cpu_s_per_epoch": mean["recompute_s"] - mean["flow_once_s"],
        "ratio": mean["recompute_s"] / mean["flow_once_s"] if mean["flow_once_s"] > 0 else float("inf"),
        "recompute_cpu_s_total": sum(r["recompute_s"] for r in rows),
        "flow_once_cpu_s_total": sum(r["flow_once_s"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=3, help="miniature UCF101 classes (default 3)")
    parser.add_argument("--groups", type=int, default=6, help="groups per class (default 6)")
    parser.add_argument("--clips", type=int, default=2, help="clips per group (default 2)")
    parser.add_argument(
        "--size", type=int, default=128, help="cache size, the flow's short side (default 128)"
    )
    parser.add_argument("--stride", type=int, default=1, help="frame stride (default 1)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs (default 4; at least 2)")
    parser.add_argument("--reuse", type=int, default=3, help="refurbish reuse r (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="2 classes, 3 groups, size 32, 3 epochs: seconds")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON last line")
    args = parser.parse_args(argv)
    if args.tiny:
        args.classes, args.groups, args.size, args.epochs = 2, 3, 32, 3
    if args.epochs < 2:
        parser.error("--epochs must be >= 2: the steady state is the epochs after the first")
    result = run(args)
    print(
        f"flow once vs recompute: {result['videos']} training videos, size {result['size']}, stride "
        f"{result['stride']}, r = {result['reuse']}, {result['flow_method']}; thread CPU seconds"
    )
    print(f"{'epoch':>5} {'videos':>6} {'recompute':>10} {'flow once':>10} {'(flow':>8} {'window)':>8}")
    for r in result["per_epoch"]:
        print(
            f"{r['epoch']:>5} {r['videos']:>6} {r['recompute_s']:>10.3f} {r['flow_once_s']:>10.3f} "
            f"{r['flow_s']:>8.3f} {r['window_s']:>8.4f}"
        )
    print(
        f"epochs >= 1, per epoch: recompute {result['recompute_cpu_s_per_epoch']:.3f} CPU-s, flow once "
        f"{result['flow_once_cpu_s_per_epoch']:.4f} CPU-s: saved {result['saved_cpu_s_per_epoch']:.3f} CPU-s "
        f"per epoch ({result['ratio']:.0f}x less); whole run {result['recompute_cpu_s_total']:.3f} vs "
        f"{result['flow_once_cpu_s_total']:.3f}"
    )
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
