"""Kept frames per CPU-second of the job's feed on real footage, beside a plain DataLoader, in one run.

The feed is drained without a model by the job's own path (``create_feed``, the frame cache on, one
``LearnerFeed`` row stream per learner) on the real-footage set (``--footage DIR`` or one made here), per
codec (.avi, .mp4), stride (1, 8) and r (1, 3), crop 112 of frames cached at short side 128: **whole**,
CPU-seconds of every process per kept frame, epoch 0 cold and later epochs warm (``startup_cpu_s`` and
``frame_cache_bytes`` beside); **stages**, ``decode``, ``cache_read``, ``partial_augment``,
``task_other``, ``row_streams``, ``ray``. The plain path in the same run: a ``DataLoader`` decoding with
PyAV and augmenting with torchvision v2, ``--cpus`` one-thread workers. Results:
``bench/results/video_feed.{md,json}`` (``--json``'s last line is the headline); docs/BENCHMARKS.md has
the table; "The frame cache" in docs/ARCHITECTURE.md says how it works.

    python bench/video_feed.py --clips-per-class 8 --json    # the size docs/BENCHMARKS.md shows
    python bench/video_feed.py --clips-per-class 2 --codecs avi --strides 8 --reuse 1  # a quick look
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import RESULTS, Result, TreeCpu, command_line, load_average, write_results
from dataloader_loop import THREAD_VARIABLES, one_thread_worker
from pipeline import tree_cpu_seconds

from raytrain_seq.config import Config
from raytrain_seq.parts import Parts

LEARNERS = 2
CACHE_SIZE, CROP = 128, 112
STAGES = ("decode", "cache_read", "partial_augment", "task_other", "row_streams", "ray")
logger = logging.getLogger(__name__)


def one_thread_env() -> None:
    """BLAS and OpenMP at one thread in this process and the processes it starts (as a Ray task runs)."""
    for name in THREAD_VARIABLES:
        os.environ[name] = "1"


def feed_config(footage: Any, codec: str, stride: int, reuse: int, epochs: int, cache_dir: str) -> Config:
    """The job's configuration for the footage set of ``codec``: the list dataset, crop 112 of 128."""
    return Config.from_preset(
        None,
        dataset="list",
        data_root=str(footage.roots[codec]),
        train_list=str(footage.list_file(codec, "train")),
        test_list=str(footage.list_file(codec, "test")),
        class_names=str(footage.class_file(codec)),
        stride=stride,
        reuse=reuse,
        cache_size=CACHE_SIZE,
        crop=CROP,
        epochs=epochs,
        learners=LEARNERS,
        batch_size=4,
        micro_batch_size=4,
        frame_cache_dir=cache_dir,
    )


def drain_feed(config: Config, videos_per_task: int) -> dict[str, Any]:
    """Every epoch's rows through ``LEARNERS`` row streams; per epoch the window in which its rows were
    drained (wall clock, the CPU of every process and of this one), and the feed report's epochs with
    each task's span."""
    import ray

    from raytrain_seq.runtime.feed import create_feed
    from raytrain_seq.runtime.learner_feed import LearnerFeed

    # Start-up (the catalog's probe, the actor's process) is the run's, not an epoch's: it is measured
    # on its own, and epoch 0's window opens when the feed can serve (its first epoch_shard launches
    # epoch 0's tasks).
    # TreeCpu keeps each process's last reading: the CPU of a process that exits (a killed feed actor of
    # the previous row, a task worker) stays where it was spent instead of leaving the sum.
    tree_cpu = TreeCpu()
    tree0, own0 = tree_cpu(), time.process_time()
    feed = create_feed(Parts.of(config).feed, videos_per_task=videos_per_task, prefetch=False)
    ray.get(feed.model_spec.remote())
    tree, own, wall = tree_cpu(), time.process_time(), time.time()
    startup = {"tree_cpu_s": tree - tree0, "own_cpu_s": own - own0}
    streams = [LearnerFeed(feed, epochs=config.train.epochs) for _ in range(LEARNERS)]
    windows = []
    for epoch in range(config.train.epochs):
        views: list = [None] * LEARNERS

        def drain(rank: int, epoch: int = epoch, views: list = views) -> None:
            view, _ = streams[rank].epoch_rows(epoch, rank, LEARNERS)
            views[rank] = view
            while view.take(config.train.batch_size) is not None:
                pass

        threads = [threading.Thread(target=drain, args=(rank,)) for rank in range(LEARNERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        now_tree, now_own, now = tree_cpu(), time.process_time(), time.time()
        windows.append(
            {
                "served": sum(v.frames for v in views),
                "wall": [wall, now],
                "tree_cpu_s": now_tree - tree,
                "own_cpu_s": now_own - own,
            }
        )
        tree, own, wall = now_tree, now_own, now
    for stream in streams:
        stream.close()
    stats = ray.get(feed.stats.remote(wait=True, ids=True))
    ray.kill(feed)
    return {"windows": windows, "epochs": stats.epochs, "startup": startup}


def overlap(span: list[float], window: list[float]) -> float:
    """The share of ``span`` = [start, end, ...] inside ``window`` = [start, end]: [0, 4] in [3, 9]: 1/4."""
    length = max(span[1] - span[0], 1e-9)
    return max(0.0, min(span[1], window[1]) - max(span[0], window[0])) / length


def feed_rows(run: dict[str, Any], codec: str, stride: int, reuse: int) -> list[dict[str, Any]]:
    """The cold and warm rows of one drained run.

    The tasks' CPU counts in the epoch it computed for (the learners' streams run ahead, so a window
    holds tasks of later epochs too); the CPU of everything else (Ray's daemons, the actor, this
    process's row streams, start-up in epoch 0) counts in the epoch whose window it was spent in: a
    window's CPU less the tasks' CPU inside it (each task's CPU spread evenly over its span).
    """
    epochs = {int(e): entry for e, entry in run["epochs"].items()}
    spans = [span for entry in epochs.values() for span in entry.get("task_spans", [])]
    windows = run["windows"]
    for window in windows:
        inside = sum(span[2] * overlap(span, window["wall"]) for span in spans)
        window["other_cpu_s"] = window["tree_cpu_s"] - inside
    rows: list[dict[str, Any]] = []
    for name, which in (("cold", [0]), ("warm", list(range(1, len(windows))))):
        frames = sum(windows[e]["served"] for e in which)
        if not frames:
            continue
        task_cpu = sum(float(epochs.get(e, {}).get("partial_cpu_s", 0.0)) for e in which)
        stage = {key: 0.0 for key in STAGES}
        for e in which:
            for key, value in epochs.get(e, {}).get("stages", {}).items():
                stage[key] += value
        stage["task_other"] = task_cpu - sum(stage[k] for k in ("decode", "cache_read", "partial_augment"))
        stage["row_streams"] = sum(windows[e]["own_cpu_s"] for e in which)
        other = sum(windows[e]["other_cpu_s"] for e in which)
        stage["ray"] = other - stage["row_streams"]
        cpu = task_cpu + other
        rows.append(
            {
                "codec": codec,
                "stride": stride,
                "r": reuse,
                "epoch": name,
                "kept_frames": frames,
                "cpu_s": round(cpu, 4),
                "frames_per_cpu_s": round(frames / cpu, 1),
                "stages": {key: round(value / frames * 1e3, 5) for key, value in stage.items()},
                "startup_cpu_s": round(run["startup"]["tree_cpu_s"], 3),
            }
        )
    return rows


class PlainClips:
    """The plain path's dataset: PyAV decode of the kept frames at 171x128, then torchvision v2's crop,
    flip and colour jitter on the whole clip (one draw per clip)."""

    def __init__(self, paths: list[str], stride: int) -> None:
        self.paths, self.stride = paths, stride
        self._transform = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        import av
        import numpy as np
        import torch
        from torchvision import tv_tensors
        from torchvision.transforms import v2

        if self._transform is None:
            self._transform = v2.Compose(
                [v2.RandomCrop(CROP), v2.RandomHorizontalFlip(), v2.ColorJitter(0.3, 0.3, 0.4, 0.08)]
            )
        with av.open(self.paths[index]) as container:
            stream = container.streams.video[0]
            stream.thread_count = 1
            frames = [
                frame.to_ndarray(format="rgb24", width=171, height=128)
                for k, frame in enumerate(container.decode(stream))
                if k % self.stride == 0
            ]
        clip = tv_tensors.Video(torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2))
        return self._transform(clip)


def drain_loader(paths: list[str], stride: int, workers: int) -> dict[str, Any]:
    """One epoch of the plain path: its kept frames and the loader's process tree's CPU. Its imports are
    made here first, as a training script makes them, so the forked workers inherit them."""
    import av  # noqa: F401
    import torch
    from torchvision import tv_tensors  # noqa: F401
    from torchvision.transforms import v2  # noqa: F401

    loader = torch.utils.data.DataLoader(
        PlainClips(paths, stride),
        batch_size=None,
        shuffle=True,
        num_workers=workers,
        worker_init_fn=one_thread_worker,
        persistent_workers=False,
    )
    cpu0 = tree_cpu_seconds()
    frames = sum(int(clip.shape[0]) for clip in loader)
    cpu = tree_cpu_seconds() - cpu0
    return {"kept_frames": frames, "cpu_s": round(cpu, 4), "frames_per_cpu_s": round(frames / cpu, 1)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--footage", type=Path, help="where to make the set (default: a temporary folder)")
    parser.add_argument("--clips-per-class", type=int, default=8, help="the size of the set made")
    parser.add_argument("--codecs", nargs="+", default=["avi", "mp4"], choices=["avi", "mp4"])
    parser.add_argument("--strides", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--reuse", nargs="+", type=int, default=[1, 3])
    parser.add_argument("--epochs", type=int, default=4, help="epoch 0 is cold, the rest warm")
    parser.add_argument("--cpus", type=int, default=2, help="Ray's CPUs, and the DataLoader's workers")
    parser.add_argument("--videos-per-task", type=int, default=16, help="as the job's feed (create_feed)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of video_feed.md and .json")
    parser.add_argument("--json", action="store_true", help="print the results as the last line")
    return parser.parse_args(argv)


def measure(args: argparse.Namespace, footage: Any) -> dict[str, Any]:
    import ray

    rows, loader = [], []
    load = {"start": load_average()}
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    try:
        # One unmeasured epoch first, so that the task workers' processes exist (a run starts them once).
        with tempfile.TemporaryDirectory(prefix="frame-cache-") as cache_dir:
            drain_feed(
                feed_config(footage, args.codecs[0], args.strides[-1], 1, 1, cache_dir), args.videos_per_task
            )
        for codec in args.codecs:
            for stride in args.strides:
                for reuse in args.reuse:
                    with tempfile.TemporaryDirectory(prefix="frame-cache-") as cache_dir:
                        config = feed_config(footage, codec, stride, reuse, args.epochs, cache_dir)
                        run = drain_feed(config, args.videos_per_task)
                        cached = sum(p.stat().st_size for p in Path(cache_dir).glob("*.npy"))
                    rows += [
                        {**row, "frame_cache_bytes": cached} for row in feed_rows(run, codec, stride, reuse)
                    ]
                    print_rows(rows[-2:])
    finally:
        ray.shutdown()
    load["feed_end"] = load_average()
    for codec in args.codecs:
        paths = train_paths(footage, codec)
        for stride in args.strides:
            loader.append({"codec": codec, "stride": stride, **drain_loader(paths, stride, args.cpus)})
            print(f"dataloader {codec} stride {stride}: {loader[-1]['frames_per_cpu_s']:,.0f} frames/CPU-s")
    load["end"] = load_average()
    return {
        "feed": "real", "rows": rows, "dataloader": loader, "decoders": decoder_rows(footage, args), "load": load,
    }  # fmt: skip


def decoder_rows(footage: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each installed decoder backend alone on one thread (bench/decoder_rates.py), on four clips a codec."""
    try:
        from decoder_rates import measure as decoder_measure
    except ImportError:
        return []
    paths = [path for codec in args.codecs for path in train_paths(footage, codec)[:4]]
    return decoder_measure(paths, None, args.strides, size=CACHE_SIZE)


def train_paths(footage: Any, codec: str) -> list[str]:
    """The training clips of the ``codec`` set, in the order of its list."""
    root = footage.roots[codec]
    return [
        str(root / line.split()[0]) for line in footage.list_file(codec, "train").read_text().splitlines()
    ]


def ratios(results: dict[str, Any]) -> None:
    """Each feed row gets ``x_dataloader``: its rate over the plain path's of the same codec and stride."""
    plain = {(d["codec"], d["stride"]): d["frames_per_cpu_s"] for d in results["dataloader"]}
    for row in results["rows"]:
        base = plain.get((row["codec"], row["stride"]))
        row["x_dataloader"] = round(row["frames_per_cpu_s"] / base, 2) if base else None


def verdicts(results: dict[str, Any]) -> list[str]:
    """The issue's targets, each against every row it covers: warm r = 1 >= 2,000 kept frames per
    CPU-second, warm >= 5x the DataLoader, cold >= 1.5x the DataLoader."""
    rows = results["rows"]
    checks = (
        ("warm epochs at r = 1: >= 2,000 kept frames per CPU-second", lambda r: r["epoch"] == "warm" and r["r"] == 1,
         lambda r: r["frames_per_cpu_s"] >= 2000, lambda r: f"{r['frames_per_cpu_s']:,.0f}"),
        ("warm epochs: >= 5x the DataLoader", lambda r: r["epoch"] == "warm",
         lambda r: (r["x_dataloader"] or 0) >= 5, lambda r: f"{r['x_dataloader']}x"),
        ("the cold epoch: >= 1.5x the DataLoader", lambda r: r["epoch"] == "cold",
         lambda r: (r["x_dataloader"] or 0) >= 1.5, lambda r: f"{r['x_dataloader']}x"),
    )  # fmt: skip
    out = []
    for text, covers, met, shown in checks:
        mine = [r for r in rows if covers(r)]
        missed = [r for r in mine if not met(r)]
        where = ", ".join(f"{r['codec']} stride {r['stride']} r {r['r']}: {shown(r)}" for r in missed)
        out.append(
            f"{text}: met in {len(mine) - len(missed)} of {len(mine)} rows"
            + (f"; not in {where}" if missed else "")
        )
    return out


def result(results: dict[str, Any], argv: list[str] | None, size: str) -> Result:
    """The table (a row per codec, stride, r and epoch) for docs/BENCHMARKS.md; the JSON is the headline."""
    load = results["load"]
    header = ["codec", "stride", "r", "epoch", "kept frames", "frames / CPU-s", "x DataLoader",
              *[f"{k} ms" for k in STAGES]]  # fmt: skip
    rows = [
        [r["codec"], r["stride"], r["r"], r["epoch"], r["kept_frames"], f"{r['frames_per_cpu_s']:,.0f}",
         r["x_dataloader"], *[f"{r['stages'][k]:.3f}" for k in STAGES]]
        for r in results["rows"]
    ]  # fmt: skip
    plain = [
        [d["codec"], d["stride"], d["kept_frames"], f"{d['frames_per_cpu_s']:,.0f}"]
        for d in results["dataloader"]
    ]
    decoders = [[d["backend"], d["version"], d["codec"], d["stride"], f"{d['frames_per_cpu_s']:,.0f}"]
                for d in results["decoders"]]  # fmt: skip
    rows, plain, decoders = (
        [[str(cell) for cell in row] for row in table] for table in (rows, plain, decoders)
    )
    return Result(
        name="video_feed",
        title="The feed on real footage: kept frames per CPU-second (`bench/video_feed.py`)",
        command=command_line(argv, "video_feed.py"),
        size=size,
        header=header,
        rows=rows,
        notes=[
            "One run: every figure above is a single measurement (no seeds: the feed's cost does not depend on "
            "them); CPU-seconds of every process (user + system, /proc), which a busy machine inflates less than "
            "wall time but not at all only when quiet (its caches and memory bandwidth are shared): the 1-minute "
            f"load average was {load['start']:.1f} at the start, {load['feed_end']:.1f} after the feed's rows and "
            f"{load['end']:.1f} at the end. "
            "Stages in CPU ms per kept frame; decode includes the probe. Start-up CPU (catalog probe, feed actor) "
            "is per row in the JSON (startup_cpu_s), not in the epochs.",
            "The plain path: a DataLoader whose workers decode with PyAV and apply torchvision.transforms.v2 "
            "RandomCrop 112, RandomHorizontalFlip and ColorJitter to each clip, on the same CPUs.",
        ],
        verdicts=verdicts(results),
        headline=results,
        extra_tables=[
            (
                "The plain DataLoader path, same run:",
                ["codec", "stride", "kept frames", "frames / CPU-s"],
                plain,
            ),
            (
                "Decoder backends alone, one thread, one clip (bench/decoder_rates.py):",
                ["backend", "version", "codec", "stride", "frames / CPU-s"],
                decoders,
            ),
        ],
    )


def print_rows(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        stages = ", ".join(f"{k} {v:.3f}" for k, v in row["stages"].items())
        print(
            f"feed {row['codec']} stride {row['stride']} r {row['r']} {row['epoch']}: "
            f"{row['frames_per_cpu_s']:,.0f} kept frames/CPU-s ({row['kept_frames']} frames); ms a frame: {stages}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    one_thread_env()
    logging.basicConfig(level=logging.WARNING)
    from raytrain_seq.data.footage import make_footage

    with tempfile.TemporaryDirectory(prefix="footage-") as scratch:
        footage = make_footage(args.footage or Path(scratch), clips_per_class=args.clips_per_class)
        results = measure(args, footage)
    ratios(results)
    write_results(
        result(results, argv, f"{args.clips_per_class} clips a class, {args.epochs} epochs"), args.results
    )
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
