"""Revamper on the job's own feed: refurbishing r = 1, 2, 3, 4 through the shipped pipeline, over seeds.

Every run is the job (``runtime.driver.run`` on a private local Ray): the feed's refurbishing cache, its
tasks an epoch ahead, the learners' row streams, AAVG once an epoch. The partial augmentation is made as
costly as the paper's (a 2-layer RandAugment timed here, ``randaugment.calibrate``, burnt per frame:
``data.augment_cost_per_frame``). Per seed, r = 1..4 run back to back, a seed fixing videos, plans,
augmentations and weights. Per run: useful samples/s over the warm epochs, CPU seconds per sample of
every process (``benchlib.CpuSampler``, from /proc) and test accuracy; per r the mean and se over seeds
and the paired differences to r = 1. The spread table (``refurbish_loader``): each step's CPU in the
served order beside the plan's order and the paper's ``RefurbishSchedule.compose``.

    python bench/refurbish.py --json     # the default size (make bench), JSON headline as the last line
    python bench/refurbish.py --tiny     # a minute's check of the whole path
    python bench/refurbish.py --videos 150 --epochs 5 --json   # fewer videos and epochs on a busy box
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    CpuSampler,
    Result,
    add_size_flags,
    command_line,
    fmt,
    load_average,
    local_ray,
    mean_se,
    new_figure,
    spread_keys,
    try_plot,
    within_noise,
    write_results,
)
from randaugment import calibrate
from refurbish_loader import (
    RowCost,
    composed_steps,
    job_feed,
    partial_costs,
    served_steps,
    spread,
    step_costs,
    unbalanced_steps,
)

from raytrain_seq.algorithms.refurbish import RefurbishSchedule
from raytrain_seq.config import Config

logger = logging.getLogger(__name__)

SIZES = {
    "tiny": {"videos": 40, "epochs": 3, "seeds": [0, 1], "reuse": [1, 3], "cost": 0.05},
    "default": {"videos": 500, "epochs": 8, "seeds": [0, 1, 2], "reuse": [1, 2, 3, 4], "cost": 1.0},
    "full": {"videos": 3000, "epochs": 10, "seeds": [0, 1, 2, 3, 4], "reuse": [1, 2, 3, 4], "cost": 1.0},
}  # fmt: skip
PAPER_SPEEDUP = (1.03, 2.04)  # the paper's throughput gain over the standard pipeline
TARGET_SPEEDUP = 1.5  # issue 44: r = 3 at >= 1.5x the useful samples/s of r = 1


# --real: the real-footage set's training clips, strided and cached small enough for a CPU learner, with
# torchvision's RandAugment (2 operations, magnitude 9: the paper's partial augmentation) in the tasks.
REAL = {"stride": 4, "cache_size": 64, "crop": 56, "randaugment_ops": 2, "randaugment_magnitude": 9}


def job_config(size: dict, reuse: int, seed: int, frame_cost: float, storage: str, footage=None) -> Config:
    """The demo preset at this size: 2 learners, B = 4 blocks, one averaging round per epoch; with
    ``footage`` (``data.footage.FootageSet``) on its MPEG-4 set with ``REAL``'s settings instead."""
    common = dict(
        epochs=size["epochs"], reuse=reuse, seed=seed, storage_path=storage, run_name=f"r{reuse}-s{seed}",
        tracker="none", checkpoint_every=10**9, keep_checkpoints=1,
    )  # fmt: skip
    if footage is None:
        return Config.from_preset(
            "demo", max_videos=size["videos"], augment_cost_per_frame=frame_cost, **common
        )
    return Config.from_preset(
        "demo", dataset="list", data_root=str(footage.roots["avi"]), num_classes=None, max_videos=None,
        train_list=str(footage.list_file("avi", "train")), test_list=str(footage.list_file("avi", "test")),
        class_names=str(footage.class_file("avi")), frame_cache_dir=str(Path(storage) / "frames"), **REAL, **common,
    )  # fmt: skip


def warm_window(summary, began: float) -> tuple[float, float, int]:
    """Wall times of the end of epoch 0 and of the last epoch, and the epochs between. One averaging round
    closes each epoch (train.k = -1); the rounds' times are on the averager's clock, which starts at the
    first learner's join, so they are anchored at rank 0's end of training (``timeline["trained"]``
    after ``began``, its last round's result): the window is the last round's time minus the first's,
    ending there."""
    rounds = sorted(summary.loss_history, key=lambda h: h["round"])
    if len(rounds) < 2:
        raise RuntimeError(f"run {summary.path}: {len(rounds)} averaging round(s), need one per epoch (>= 2)")
    end = began + summary.extra["timeline"]["trained"]
    return end - (rounds[-1]["time_s"] - rounds[0]["time_s"]), end, len(rounds) - 1


def run_job(config: Config, sampler: CpuSampler) -> dict:
    """One job; its warm-epoch rate and CPU per sample, test accuracy and the machine's load."""
    from raytrain_seq.runtime.driver import run

    load_before, began = load_average(), time.time()
    summary = run(config)
    start, end, epochs = warm_window(summary, began)
    samples = int(summary.videos["train"]) * epochs
    cpu = sampler.between(start, end)
    out = {
        "reuse": config.data.reuse, "seed": config.data.seed, "samples_s": samples / (end - start),
        "cpu_ms_per_sample": 1e3 * cpu / samples, "accuracy": summary.test_accuracy,
        "test_videos": int(summary.videos["test"]), "recomputed": summary.refurbish["recomputed"],
        "epochs": summary.epochs, "wall_s": time.time() - began, "load": [load_before, load_average()],
    }  # fmt: skip
    print(f"r={out['reuse']} seed {out['seed']}: {out['samples_s']:.1f} samples/s, {out['cpu_ms_per_sample']:.1f} "
          f"CPU ms/sample, test {100 * out['accuracy']:.1f} %, {out['wall_s']:.0f} s, load {out['load']}",
          flush=True)  # fmt: skip
    return out


def run_jobs(size: dict, frame_cost: float, footage=None) -> list[dict]:
    """Every (seed, r) job, r back to back within a seed, on one private Ray cluster."""
    storage = tempfile.mkdtemp(prefix="bench-refurbish-")
    runs = []
    try:
        with local_ray(4), CpuSampler(0.25) as sampler:
            for seed in size["seeds"]:
                for reuse in size["reuse"]:
                    config = job_config(size, reuse, seed, frame_cost, storage, footage)
                    runs.append(run_job(config, sampler))
    finally:
        import shutil

        shutil.rmtree(storage, ignore_errors=True)  # the runs' checkpoints: their summaries were read
    return runs


def spread_table(size: dict, frame_cost: float, footage=None) -> dict[int, dict]:
    """Per r: each step's CPU in the job's served order, without the cache-aware plan (spread_fresh alone,
    and the plan's order) and with Revamper's sample-level composition."""
    base = job_config(
        size, 1, size["seeds"][0], frame_cost, tempfile.mkdtemp(prefix="bench-refurbish-"), footage
    )
    _, geometry = job_feed(base)
    ids = geometry.catalogs["train"].ids.tolist()
    torch.set_num_threads(1)  # what a learner's process has
    partial, arrays = partial_costs(base, ids)
    row_cost = RowCost(base, arrays, geometry.t_max, geometry.max_sequences)

    world, batch, epochs = base.train.min_learners, base.train.batch_size, size["epochs"]
    out = {}
    for reuse in size["reuse"]:
        config = job_config(size, reuse, base.data.seed, frame_cost, base.run.storage_path, footage)
        feed, _ = job_feed(config, geometry)
        schedule = RefurbishSchedule(len(ids), reuse=reuse, seed=config.data.seed)

        def fresh_of(epoch, schedule=schedule):
            return {ids[k] for k in np.flatnonzero(schedule.is_fresh(epoch))}

        orders = {"served": served_steps(feed, epochs, world, batch)}
        for name, ordered in (("spread_only", True), ("plan", False)):
            orders[name] = unbalanced_steps(config, geometry, epochs, world, batch, spread=ordered)
        per_step = round(float(np.mean([sum(len(b.ids) for b in blocks) for _, blocks in orders["served"]])))
        orders["compose"] = composed_steps(config, geometry, epochs, per_step)
        out[reuse] = {
            name: _spread_entry(step_costs(steps, partial, row_cost, fresh_of))
            for name, steps in orders.items()
        }
    return out


def _spread_entry(c: dict) -> dict:
    return {**spread(c["cpu"]), "steps": len(c["cpu"]), "fresh_min": int(c["fresh"].min()),
            "fresh_max": int(c["fresh"].max()), "videos_per_step": float(c["videos"].mean()),
            "step_cpu": c["cpu"].tolist()}  # fmt: skip


def by_reuse(runs: list[dict], spreads: dict[int, dict]) -> dict[int, dict]:
    """Per r: mean and se over seeds of rate, CPU and accuracy; rate, CPU and accuracy against r = 1
    paired by seed (ratios and points, each with its se); the served order's step CPU spread."""
    base = {r["seed"]: r for r in runs if r["reuse"] == 1}
    out = {}
    for reuse in sorted({r["reuse"] for r in runs}):
        mine = [r for r in runs if r["reuse"] == reuse]
        paired = [(r, base[r["seed"]]) for r in mine if r["seed"] in base]
        entry = {}
        for key in ("samples_s", "cpu_ms_per_sample", "accuracy"):
            entry[key], entry[f"{key}_se"] = mean_se([r[key] for r in mine])
        entry["speedup"], entry["speedup_se"] = mean_se([a["samples_s"] / b["samples_s"] for a, b in paired])
        entry["cpu_saving"], entry["cpu_saving_se"] = mean_se(
            [b["cpu_ms_per_sample"] / a["cpu_ms_per_sample"] for a, b in paired]
        )
        points = [100 * (a["accuracy"] - b["accuracy"]) for a, b in paired]
        entry["acc_points"], entry["acc_points_se"] = mean_se(points)
        entry["step_cpu_cv"] = spreads.get(reuse, {}).get("served", {}).get("cv")
        entry["seeds"] = [r["seed"] for r in mine]
        out[reuse] = entry
    return out


def headline(stats: dict[int, dict]) -> dict:
    """The JSON last line: {"feed": "job", "by_r": {"1": {samples_s, cpu_ms_per_sample, step_cpu_cv,
    acc_mean, acc_se, ...}, ...}} (accuracies in [0, 1], speedups and differences against r = 1)."""
    by_r = {}
    for reuse, s in stats.items():
        by_r[str(reuse)] = {
            "samples_s": s["samples_s"], "cpu_ms_per_sample": s["cpu_ms_per_sample"],
            "step_cpu_cv": s["step_cpu_cv"], "acc_mean": s["accuracy"], "acc_se": s["accuracy_se"],
            "speedup": s["speedup"], "speedup_se": s["speedup_se"], "acc_points": s["acc_points"],
            "acc_points_se": s["acc_points_se"],
        }  # fmt: skip
    return {"feed": "job", "by_r": by_r}


def _pm(mean: float | None, se: float | None, spec: str = ".1f", unit: str = "") -> str:
    if mean is None:
        return "n/a"
    return f"{mean:{spec}}{unit}" + ("" if se is None else f" +- {se:{spec.replace('+', '')}}{unit}")


def throughput_verdicts(stats: dict[int, dict]) -> list[str]:
    """Rate and CPU of each r against r = 1 (paired by seed), r = 3 against the target and the paper."""
    out = []
    three = stats.get(3)
    if three is not None and three["speedup"] is not None:
        lo, hi = PAPER_SPEEDUP
        speed, se = three["speedup"], three["speedup_se"]
        place = "above" if speed > hi else "within" if speed >= lo else "below"
        out.append(
            f"Throughput: on the job's feed r = 3 trains {_pm(speed, se, '.2f')}x the useful samples/s of r = 1 "
            f"over the warm epochs (mean over seeds of the paired ratio, +- its standard error); target >= "
            f"{TARGET_SPEEDUP}x: {'met' if speed >= TARGET_SPEEDUP else 'NOT met'}; {place} the paper's {lo}-{hi}x, measured on GPUs (this run: CPU cores). "
            f"Its cluster spends {_pm(three['cpu_saving'], three['cpu_saving_se'], '.2f')}x less CPU per sample "
            "(every process of the job, from /proc: what another engineer's load on this machine cannot inflate)."
        )
    others = [
        f"r = {r}: {_pm(s['speedup'], s['speedup_se'], '.2f')}x the samples/s, "
        f"{_pm(s['cpu_saving'], s['cpu_saving_se'], '.2f')}x less CPU per sample"
        for r, s in stats.items()
        if r not in (1, 3) and s["speedup"] is not None
    ]
    if others:
        out.append("Against r = 1 likewise: " + "; ".join(others) + ".")
    return out


def accuracy_verdicts(stats: dict[int, dict]) -> list[str]:
    """Each r's test accuracy beside r = 1's: the paired difference, its se and whether it is noise."""
    one = stats.get(1)
    if one is None or one["accuracy"] is None:
        return []
    out = []
    for reuse, s in stats.items():
        if reuse == 1 or s["acc_points"] is None:
            continue
        gap = 100 * abs(s["accuracy"] - one["accuracy"])
        within_one = one["accuracy_se"] is not None and gap <= 100 * one["accuracy_se"]
        line = (
            f"Accuracy r = {reuse}: {_pm(100 * s['accuracy'], _scaled(s['accuracy_se']), unit=' %')} against r = 1's "
            f"{_pm(100 * one['accuracy'], _scaled(one['accuracy_se']), unit=' %')} (mean +- se over seeds); paired "
            f"by seed {_pm(s['acc_points'], s['acc_points_se'], '+.1f')} points, "
            f"{within_noise(s['acc_points'], s['acc_points_se'])}"
        )
        if reuse == 3:
            line += f"; target (within one standard error of r = 1's): {'met' if within_one else 'NOT met'}"
        out.append(line + ".")
    return out


def _scaled(se: float | None) -> float | None:
    return None if se is None else 100 * se


def spread_verdicts(spreads: dict[int, dict]) -> list[str]:
    """The served order's step CPU spread against the feed without its composition and Revamper's compose."""
    parts, better = [], []
    for reuse, s in spreads.items():
        cv = {k: s[k].get("cv") for k in ("served", "spread_only", "plan", "compose")}
        if None in cv.values():
            continue
        parts.append(
            f"r = {reuse}: {100 * cv['served']:.0f} % served, {100 * cv['spread_only']:.0f} % with spread_fresh "
            f"alone, {100 * cv['plan']:.0f} % in the plan's order, {100 * cv['compose']:.0f} % composed by samples"
        )
        if reuse > 1:
            better.append(cv["served"] <= cv["compose"])
    if not parts:
        return []
    word = "as even as or more even than" if better and all(better) else "NOT as even as"
    return [
        "Each step's CPU, std/mean over the steps of epochs >= 1 (a step's cost: the measured CPU of its fresh "
        "videos' partial augmentations and of its rows' assembly, crop and flip): " + "; ".join(parts) + ". "
        f"The served order (cache-aware plan + spread_fresh) is {word} Revamper's cache-aware composition at every "
        "r > 1 (docs/ARCHITECTURE.md, 'Data refurbishing', says why the feed composes blocks, not samples)."
    ]


def verdicts(res: dict) -> tuple[list[str], dict]:
    stats = res["stats"]
    lines = throughput_verdicts(stats) + accuracy_verdicts(stats) + spread_verdicts(res["spread"])
    loads = [x for r in res["runs"] for x in r["load"]]
    lines.append(
        f"Machine load: the 1-minute load average read before and after each run ranged {min(loads):.1f}-"
        f"{max(loads):.1f} on {res['cores']} cores: wall-clock rates are noisy where it is high; CPU per sample "
        "is not."
    )
    head = headline(stats)
    three = stats.get(3, {})
    head.update(
        r3_speedup=three.get("speedup"), r3_speedup_se=three.get("speedup_se"),
        r3_cpu_saving=three.get("cpu_saving"), r3_accuracy_points=three.get("acc_points"),
        r3_accuracy_points_se=three.get("acc_points_se"),
        r3_step_cv_served=res["spread"].get(3, {}).get("served", {}).get("cv"),
        r3_step_cv_compose=res["spread"].get(3, {}).get("compose", {}).get("cv"),
        r3_speedup_text=_pm(three.get("speedup"), three.get("speedup_se"), ".2f", "x"),
        r3_cpu_saving_text=_pm(three.get("cpu_saving"), three.get("cpu_saving_se"), ".2f", "x"),
        seeds=len({r["seed"] for r in res["runs"]}),
        load=[min(loads), max(loads)],
        r3_accuracy_text=_pm(three.get("acc_points"), three.get("acc_points_se"), "+.1f")
        + f" ({within_noise(three.get('acc_points'), three.get('acc_points_se'))})",
    )  # fmt: skip
    for key, se in (
        ("speedup", "speedup_se"),
        ("cpu_saving", "cpu_saving_se"),
        ("accuracy", "acc_points_se"),
    ):
        spread_keys(head, f"r3_{key}_text", head["seeds"], three.get(se))
    return lines, head


def tables(res: dict) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    header = ["r", "partial augs (warm epochs)", "samples/s (warm)", "vs r = 1 (paired)", "CPU ms/sample",
              "r = 1 / this", "step CPU std/mean", "test accuracy", "vs r = 1, points (paired)"]  # fmt: skip
    rows = []
    for reuse, s in res["stats"].items():
        recomputed = [r["recomputed"] for r in res["runs"] if r["reuse"] == reuse]
        rows.append([
            str(reuse), f"{np.mean(recomputed):,.0f}", _pm(s["samples_s"], s["samples_s_se"]),
            _pm(s["speedup"], s["speedup_se"], ".2f", "x"), _pm(s["cpu_ms_per_sample"], s["cpu_ms_per_sample_se"]),
            _pm(s["cpu_saving"], s["cpu_saving_se"], ".2f", "x"), fmt(_scaled(s["step_cpu_cv"]), ".0f") + " %",
            _pm(100 * s["accuracy"], _scaled(s["accuracy_se"]), unit=" %"),
            _pm(s["acc_points"], s["acc_points_se"], "+.1f"),
        ])  # fmt: skip
    sheader = ["r", "order", "steps", "videos/step", "fresh/step min-max", "CPU std/mean", "p95/median",
               "max/median"]  # fmt: skip
    names = {"served": "served: cache-aware plan + spread_fresh", "spread_only": "spread_fresh alone (before)",
             "plan": "plan order", "compose": "Revamper compose (samples)"}  # fmt: skip
    srows = [
        [str(reuse), names[k], str(v["steps"]), f"{v['videos_per_step']:.1f}", f"{v['fresh_min']}-{v['fresh_max']}",
         f"{100 * v.get('cv', 0):.0f} %", fmt(v.get("p95_median")), fmt(v.get("max_median"))]
        for reuse, s in res["spread"].items()
        for k, v in s.items()
    ]  # fmt: skip
    return header, rows, sheader, srows


def plot(res: dict):
    fig, (a1, a2, a3) = new_figure(3, width=4.4)
    stats = res["stats"]
    rs = list(stats)
    a1.errorbar(
        rs, [stats[r]["speedup"] for r in rs], yerr=[stats[r]["speedup_se"] or 0 for r in rs], marker="o"
    )
    a1.axhline(TARGET_SPEEDUP, color="red", lw=0.8, ls="--")
    a1.set(title="samples/s vs r = 1 (warm, paired)", xlabel="r")
    a2.errorbar(rs, [100 * stats[r]["accuracy"] for r in rs], yerr=[_scaled(stats[r]["accuracy_se"]) or 0 for r in rs],
                marker="o")  # fmt: skip
    a2.set(title="test accuracy (%), mean +- se", xlabel="r")
    three = res["spread"].get(3) or next(iter(res["spread"].values()))
    for name, values in three.items():
        a3.plot(1e3 * np.asarray(values["step_cpu"]), lw=0.8, label=name)
    a3.set(title="CPU ms per step (r = 3, epochs >= 1)", xlabel="step")
    a3.legend(fontsize=7)
    return fig


def run(args) -> dict:
    size = dict(SIZES[args.size])
    for key in ("videos", "epochs"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    if args.seeds is not None:
        size["seeds"] = args.seeds
    footage, per_image, frame_cost = None, None, 0.0
    if args.real:
        from raytrain_seq.data.footage import make_footage

        footage = make_footage(
            tempfile.mkdtemp(prefix="bench-footage-"), clips_per_class=args.clips_per_class
        )
        size["videos"] = sum(1 for clip in footage.clips if clip.split == "train")
    else:
        per_image = calibrate(args.calibrate_size)
        frame_cost = per_image * (args.cost_scale if args.cost_scale is not None else size["cost"])
        print(f"calibration: 2-layer RandAugment on {args.calibrate_size}px = {1e3 * per_image:.2f} ms CPU per image; "
              f"partial augmentation + {1e3 * frame_cost:.2f} ms per frame", flush=True)  # fmt: skip
    began = time.perf_counter()
    spreads = spread_table(size, frame_cost, footage)
    runs = run_jobs(size, frame_cost, footage)
    import os

    return {"runs": runs, "spread": spreads, "stats": by_reuse(runs, spreads), "size": size, "per_image": per_image,
            "frame_cost": frame_cost, "calibrate_size": args.calibrate_size, "cores": os.cpu_count(),
            "wall_s": time.perf_counter() - began, "real": REAL if args.real else None}  # fmt: skip


def notes(res: dict) -> list[str]:
    size, runs = res["size"], res["runs"]
    if res.get("real"):
        real = res["real"]
        return [
            f"Real footage (raytrain_seq.data.footage, MPEG-4 .avi, {size['videos']} training clips, 6 classes) "
            f"through the job's feed: decoded once into the frame cache, each partial augmentation a window, one "
            f"colour transform and torchvision's RandAugment ({real['randaugment_ops']} operations, magnitude "
            f"{real['randaugment_magnitude']}, one draw per video); stride {real['stride']}, cached at "
            f"{real['cache_size']} px, crop {real['crop']}; the demo model, 2 learners of 1 CPU thread, "
            f"{size['epochs']} epochs, seeds {size['seeds']}, r in {size['reuse']}. Whole benchmark: "
            f"{res['wall_s'] / 60:.1f} min.",
            "CPU ms per sample is the robust figure (user + system seconds of every process of the cluster over "
            "the warm epochs, which another engineer's load cannot inflate); samples/s is wall time and moves "
            "with the machine's load (each run's load average is in the JSON). The set's train and test clips "
            "share source frames: its accuracy says nothing about generalisation.",
        ]
    return [
        f"Calibration: a 2-layer RandAugment (magnitude 9, PIL) on a {res['calibrate_size']}px image took "
        f"{1e3 * res['per_image']:.2f} ms of CPU (median of 96) on this machine; each frame of a training video's "
        f"partial augmentation burns {1e3 * res['frame_cost']:.2f} ms of thread CPU (data.augment_cost_per_frame) "
        "on top of the synthetic set's render and photometric transform.",
        f"The job: the demo preset with {size['videos']} training videos (test up to as many: "
        f"{runs[0]['test_videos']}), {size['epochs']} epochs, 2 learners of 1 CPU thread, B = 4 blocks, one "
        f"averaging round per epoch, on a local Ray cluster (num_cpus=4); seeds {size['seeds']}; r in "
        f"{size['reuse']}. Whole benchmark: {res['wall_s'] / 60:.1f} min.",
        "'warm' = epochs >= 1, timed by the averager's round clock (end of epoch 0 to the last round); samples "
        "= training videos x warm epochs; CPU = user + system seconds of this process and every descendant "
        "(Ray's GCS, raylet, the feed, its tasks, the learners, the averager and its evaluator) over the same "
        "window, per sample. 'paired' = the mean over seeds of each seed's ratio or difference to r = 1.",
        "Spread table: the job's feed for seed 0 (its own BlockFeed class in this process, its tasks replaced by "
        "placeholders), every learner's full steps of B = 4 blocks in epochs >= 1; 'compose' cuts "
        "RefurbishSchedule.compose mini-batches of the served steps' mean video count; per-video CPU: the "
        "feed task's body (partial) and the row assembly, crop and flip (final), each timed on its own.",
    ]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_flags(parser)
    parser.add_argument("--videos", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument(
        "--cost-scale", type=float, default=None, help="partial cost per frame in RandAugment units"
    )
    parser.add_argument("--calibrate-size", type=int, default=112, help="side of the RandAugment image (px)")
    parser.add_argument(
        "--real",
        action="store_true",
        help="the real-footage set with torchvision's RandAugment (no busy loop)",
    )
    parser.add_argument("--clips-per-class", type=int, default=8, help="--real: the set's size")
    parser.add_argument(
        "--json", action="store_true", help="print the headline numbers as one JSON last line"
    )
    args = parser.parse_args(argv)
    if (args.epochs is not None and args.epochs < 2) or (args.videos is not None and args.videos < 10):
        parser.error("--epochs must be >= 2 (epoch 0 is cold) and --videos >= 10 (one per class)")
    res = run(args)
    header, rows, sheader, srows = tables(res)
    lines, head = verdicts(res)
    result = Result(
        name="refurbish_real" if args.real else "refurbish",
        title=f"Revamper on the job's feed{' on real footage' if args.real else ''}: refurbishing r = 1..4 (`bench/refurbish.py`)",
        command=command_line(argv, "refurbish.py"), size=args.size, header=header, rows=rows, notes=notes(res),
        verdicts=lines, headline=head, extra_tables=[("Each step's CPU on the job's feed (seed 0):", sheader, srows)],
    )  # fmt: skip
    write_results(result, args.results, try_plot(plot, res))
    if args.json:
        print(json.dumps(headline(res["stats"])), flush=True)
    return res


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
