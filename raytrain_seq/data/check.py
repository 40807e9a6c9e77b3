"""Check a data root before anyone spends GPU hours: every listed video probed, counts and the plan's padding.

    python -m raytrain_seq.data.check --dataset ucf101 --data-root DIR --split 1 [--stride 8] [--workers 8] \
        [--decoder auto]
    python -m raytrain_seq.data.check --dataset list --data-root DIR --train-list F --test-list F \
        [--val-list F] [--class-names F]

Reads the split's lists (errors name file and line), probes every listed video's header in threads
(``data.video.probe`` with the job's ``--decoder``: no decoding) and prints, per side of the split: the
videos listed, missing and unreadable, the frame counts before and after the stride, and the training
side's packing (blocks and padding of the ``optimal`` plan at its longest strided length, against padding
every video to it). Exit code: 0 when every listed video is readable, 1 when some are missing or
unreadable (a run would skip and list them), 2 when the lists themselves are unusable.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from raytrain_seq.data.decoders import DECODERS

__all__ = ["check", "main"]


def _probe(path: str, decoder: str) -> tuple[str, Any]:
    """("ok", frames) / ("missing", None) / ("unreadable", reason) for one listed video."""
    from raytrain_seq.data.video import VideoError, probe

    if not os.path.exists(path):
        return "missing", None
    try:
        return "ok", probe(path, decoder=decoder).frames
    except VideoError as exc:
        return "unreadable", exc.reason


def _entries(
    dataset: str, data_root: str, split: int, lists: dict[str, str | None] | None, class_names: str | None
) -> tuple[tuple[str, ...], dict[str, list[tuple[int, int, str]]]]:
    if dataset == "list":
        from raytrain_seq.data.video_list import list_entries

        return list_entries(data_root, lists or {}, class_names)
    if dataset == "ucf101":
        from raytrain_seq.data.ucf101 import ucf101_entries as entries
    elif dataset == "hmdb51":
        from raytrain_seq.data.hmdb51 import hmdb51_entries as entries
    else:
        raise ValueError(f"--dataset must be ucf101, hmdb51 or list, got {dataset!r}")
    return entries(data_root, split)


def check(
    dataset: str,
    data_root: str,
    split: int,
    *,
    stride: int = 1,
    workers: int = 8,
    progress: Callable[[int, int], Any] | None = None,
    lists: dict[str, str | None] | None = None,
    class_names: str | None = None,
    decoder: str = "auto",
) -> dict[str, Any]:
    """The report as a dict: per side (train, test, val) the counts, problems, frame statistics; the packing.

    ``lists`` (side -> file) and ``class_names`` are the annotation lists of ``dataset="list"``.
    ``progress(done, total)`` is called after each probed video. ``decoder`` probes (``data.decoders``; the
    report's ``"decoder"`` is the backend it resolved to). ValueError when the lists cannot be read (it
    names the file and line); ImportError naming the ``pip install`` when the decoder is not installed.
    """
    from raytrain_seq.algorithms.packing import pack
    from raytrain_seq.data.decoders import resolve
    from raytrain_seq.data.video import strided_length

    decoder = resolve(decoder)
    class_names, sides = _entries(dataset, data_root, split, lists, class_names)
    report: dict[str, Any] = {
        "dataset": dataset,
        "split": split,
        "sides": list(sides),
        "classes": len(class_names),
        "stride": stride,
        "decoder": decoder,
    }
    total, done = sum(len(rows) for rows in sides.values()), 0
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for side, rows in sides.items():
            paths = [path for _, _, path in rows]
            results = []
            for result in pool.map(lambda p: _probe(p, decoder), paths):
                results.append(result)
                done += 1
                if progress is not None:
                    progress(done, total)
            frames = np.array([value for kind, value in results if kind == "ok"], dtype=np.int64)
            strided = np.array([strided_length(int(n), stride) for n in frames], dtype=np.int64)
            report[side] = {
                "listed": len(paths),
                "readable": int(frames.size),
                "missing": [p for p, (kind, _) in zip(paths, results, strict=True) if kind == "missing"],
                "unreadable": [
                    [p, why] for p, (kind, why) in zip(paths, results, strict=True) if kind == "unreadable"
                ],
                "frames": _stats(frames),
                "strided_frames": _stats(strided),
            }
            if side == "train" and strided.size:
                t_max = int(strided.max())
                plan = pack(strided, t_max, strategy="optimal").stats()
                report["packing"] = {
                    "t_max": t_max,
                    "blocks": plan["blocks"],
                    "lower_bound_blocks": plan["lower_bound_blocks"],
                    "padding_fraction": plan["padding_fraction"],
                    "pad_padding_fraction": 1 - strided.sum() / (strided.size * t_max),
                }
    return report


def _stats(values: np.ndarray) -> dict[str, float] | None:
    if not values.size:
        return None
    return {
        "min": int(values.min()),
        "median": float(np.median(values)),
        "mean": float(values.mean()),
        "max": int(values.max()),
    }


def _print(report: dict[str, Any]) -> None:
    which = "lists" if report["dataset"] == "list" else f"split {report['split']}"
    print(
        f"{report['dataset']} {which}: {report['classes']} classes, stride {report['stride']}, "
        f"decoder {report['decoder']}"
    )
    for side in report["sides"]:
        r = report[side]
        print(f"  {side}: {r['listed']} listed, {r['readable']} readable, {len(r['missing'])} missing, "
              f"{len(r['unreadable'])} unreadable")  # fmt: skip
        for name in ("frames", "strided_frames"):
            s = r[name]
            if s:
                print(
                    f"    {name:>14}: min {s['min']}, median {s['median']:g}, mean {s['mean']:.1f}, max {s['max']}"
                )
        for path in r["missing"][:10]:
            print(f"    missing: {path}")
        for path, why in r["unreadable"][:10]:
            print(f"    unreadable: {path}: {why}")
        hidden = (
            len(r["missing"])
            + len(r["unreadable"])
            - min(len(r["missing"]), 10)
            - min(len(r["unreadable"]), 10)
        )
        if hidden > 0:
            print(f"    ... and {hidden} more")
    p = report.get("packing")
    if p:
        print(
            f"  packing (train, optimal, t_max {p['t_max']}): {p['blocks']} blocks (lower bound "
            f"{p['lower_bound_blocks']}), padding {p['padding_fraction']:.2%}; padding every video to t_max: "
            f"{p['pad_padding_fraction']:.2%}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raytrain_seq.data.check", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("--dataset", required=True, choices=("ucf101", "hmdb51", "list"))
    parser.add_argument(
        "--data-root",
        required=True,
        metavar="DIR",
        help="where the official archives unpack (list: the videos' root)",
    )
    for side in ("train", "test", "val"):
        parser.add_argument(
            f"--{side}-list", metavar="FILE", help=f"--dataset list: the {side} annotation list"
        )
    parser.add_argument("--class-names", metavar="FILE", help="--dataset list: class names, one per line")
    parser.add_argument("--split", type=int, default=1, choices=(1, 2, 3), help="official split [default 1]")
    parser.add_argument(
        "--stride", type=int, default=1, metavar="S", help="temporal stride for lengths [default 1]"
    )
    parser.add_argument("--workers", type=int, default=8, metavar="N", help="probing threads [default 8]")
    parser.add_argument(
        "--decoder", default="auto", choices=DECODERS, help="video decoder (auto: the fastest installed)"
    )
    args = parser.parse_args(argv)
    if args.stride < 1 or args.workers < 1:
        print("error: --stride and --workers must be >= 1", file=sys.stderr)
        return 2
    from tqdm import tqdm

    def advance(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        with tqdm(desc="probing videos", unit="video", file=sys.stderr) as bar:
            report = check(
                args.dataset,
                args.data_root,
                args.split,
                stride=args.stride,
                workers=args.workers,
                progress=advance,
                lists={"train": args.train_list, "test": args.test_list, "val": args.val_list},
                class_names=args.class_names,
                decoder=args.decoder,
            )
    except (ValueError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    _print(report)
    bad = sum(len(report[s]["missing"]) + len(report[s]["unreadable"]) for s in report["sides"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
