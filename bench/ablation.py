"""The AAVG ablation at equal N (``bench/averaging.py --only ablation``): AAVG1..3 from one warm start,
several seeds, and AAVG4 with the two-stream fusion on a miniature real-video set.

The paper (Cong et al., "Accelerating deep neural network training for action recognition on a cluster
of GPUs"; UCF101 RGB stream, ResNet-152 from ImageNet weights) fixes the number of steps N (Algorithm 1)
and reports AAVG1 (constant batch) 81.6 % < AAVG2 (adaptive batch) 83.7 % < AAVG3 (adaptive batch +
merged Adam moments and BatchNorm statistics, Algorithm 2) 85.6 % validation accuracy; AAVG4 initialises
the flow stream from the RGB one, and the two streams are fused. Here, on the synthetic set with 2
learners on a local Ray cluster, every run is ``raytrain_seq.runtime.driver.run``:

1. warm start: one AAVG1 run from scratch for ``warm_epochs`` epochs; its run folder is the
   ``--init-from`` of every variant (standing in for the paper's ImageNet start, so that the batch-size
   rule does not act on the noise of a from-scratch plateau);
2. AAVG1/2/3 x seeds, each ``--steps N`` from that warm start: the same N optimizer steps per learner
   whatever the batch size, so a grown batch sees more data, as in the paper; the switches are
   ``adaptive_batch``, ``merge_moments`` and ``merge_bn_stats`` (AAVG1 and AAVG2 merge neither moments
   nor BatchNorm statistics);
3. the miniature UCF101 of ``tests/video_fixtures.py``: an RGB run, a flow run ``--init-from`` the RGB
   run (AAVG4: cross-modality initialisation), a flow run from scratch (its baseline) and the fusion of
   RGB and AAVG4 flow on the test videos (``runtime.fuse.run_fuse``).

Per variant: the mean over seeds of the last validation accuracy of each run and its standard error
(sample standard deviation / sqrt(seeds)), the test accuracy of each run's final model the same way, and
the steps each run took (from its summary).
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Per size: synthetic videos, warm-start epochs, N, seeds, the miniature UCF101 (classes, groups, clips)
# and the epochs of its runs.
SIZES = {
    "tiny": {"videos": 40, "warm_epochs": 1, "steps": 8, "seeds": [0, 1], "ucf": (3, 6, 2), "video_epochs": 1},
    "default": {"videos": 200, "warm_epochs": 6, "steps": 64, "seeds": [0, 1, 2], "ucf": (3, 6, 2),
                "video_epochs": 4},
    "full": {"videos": 1000, "warm_epochs": 3, "steps": 400, "seeds": [0, 1, 2, 3, 4], "ucf": (5, 9, 2),
             "video_epochs": 8},
}  # fmt: skip
# Averaging every K steps and validating every M rounds gives the batch-size rule chances to act. B1 is
# the paper's growth test (grow when validation falls below its best at all): from a warm start there is no
# chance-level plateau for it to fire on. MAX_B caps B so that a grown batch's N steps fit the time budget
# (every run here starts its own Ray Train group, a fixed cost before its first step that the budget pays
# per run: docs/LOG.md, 2026-11-24, figures moved out of comments).
K = 4
M = 2
B1 = 1.0
MAX_B = 4
VARIANTS = {
    "AAVG1": {"adaptive_batch": False, "merge_moments": False, "merge_bn_stats": False},
    "AAVG2": {"adaptive_batch": True, "merge_moments": False, "merge_bn_stats": False},
    "AAVG3": {"adaptive_batch": True, "merge_moments": True, "merge_bn_stats": True},
}
PAPER = {"AAVG1": 81.6, "AAVG2": 83.7, "AAVG3": 85.6}


# -------------------------------------------------------------------------------------- pure helpers
def mean_se(values: list[float]) -> tuple[float | None, float | None]:
    """(mean, standard error = sample std / sqrt(n)); se None below 2 values, both None for none.

    [0.5, 0.7, 0.6] -> (0.6, 0.0577...).
    """
    if not values:
        return None, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, statistics.stdev(values) / math.sqrt(len(values))


def variant_stats(runs: list[dict]) -> dict:
    """One variant's runs -> {val_mean, val_se, test_mean, test_se, steps, seeds, max_b}; ``steps`` is
    the one step count every run took, or the sorted distinct counts when they differ."""
    val = mean_se([r["val"] for r in runs if r["val"] is not None])
    test = mean_se([r["test"] for r in runs if r["test"] is not None])
    steps = sorted({r["steps"] for r in runs})
    return {
        "val_mean": val[0], "val_se": val[1], "test_mean": test[0], "test_se": test[1],
        "steps": steps[0] if len(steps) == 1 else steps, "seeds": [r["seed"] for r in runs],
        "max_b": max(r["max_b"] for r in runs), "epochs": [r["epochs"] for r in runs],
    }  # fmt: skip


def gap(a: dict, b: dict) -> tuple[float | None, float | None]:
    """(a - b in validation points, its standard error sqrt(se_a^2 + se_b^2) in points)."""
    if a["val_mean"] is None or b["val_mean"] is None:
        return None, None
    diff = 100 * (a["val_mean"] - b["val_mean"])
    if a["val_se"] is None or b["val_se"] is None:
        return diff, None
    return diff, 100 * math.hypot(a["val_se"], b["val_se"])


def headline(res: dict) -> dict:
    """The JSON last line: {"steps", "seeds", "variants": {name: {val_mean, val_se, steps}}, "aavg4",
    "two_stream"} (accuracies in [0, 1])."""
    variants = {
        name: {k: s[k] for k in ("val_mean", "val_se", "test_mean", "test_se", "steps", "max_b")}
        for name, s in res["variants"].items()
    }
    return {
        "steps": res["steps"], "seeds": res["seeds"], "variants": variants,
        "aavg4": res.get("aavg4"), "two_stream": res.get("two_stream"),
        "equal_steps": all(s["steps"] == res["steps"] for s in res["variants"].values()),
    }  # fmt: skip


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _pm(mean: float | None, se: float | None) -> str:
    if mean is None:
        return "n/a"
    return f"{100 * mean:.1f} %" + ("" if se is None else f" +- {100 * se:.1f}")


def tables(res: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    header = ["variant", "adaptive batch", "merge Adam", "merge BN stats", "steps", "epochs", "largest B",
              "val acc (mean +- se)", "test acc (mean +- se)", "paper (UCF101 RGB val)"]  # fmt: skip
    rows = []
    for name, s in res["variants"].items():
        switch = VARIANTS[name]
        epochs = ", ".join(f"{e:.2f}" for e in s["epochs"])
        rows.append([
            name, str(switch["adaptive_batch"]), str(switch["merge_moments"]), str(switch["merge_bn_stats"]),
            str(s["steps"]), epochs, str(s["max_b"]), _pm(s["val_mean"], s["val_se"]),
            _pm(s["test_mean"], s["test_se"]), f"{PAPER[name]:.1f} %",
        ])  # fmt: skip
    out = [(f"AAVG1..3 at N = {res['steps']} steps per learner from one warm start, seeds {res['seeds']}:",
            header, rows)]  # fmt: skip
    video = res.get("video")
    if video:
        header = ["run", "init", "epochs", "last val", "test acc"]
        rows = [
            ["RGB", "scratch", str(video["rgb"]["epochs"]), _pct(video["rgb"]["val"]), _pct(video["rgb"]["test"])],
            ["flow (AAVG4)", "RGB run (cross-modality)", str(video["flow"]["epochs"]), _pct(video["flow"]["val"]),
             _pct(video["flow"]["test"])],
            ["flow", "scratch", str(video["flow_scratch"]["epochs"]), _pct(video["flow_scratch"]["val"]),
             _pct(video["flow_scratch"]["test"])],
            ["two-stream fusion (RGB + AAVG4 flow)", "-", "-", "-", _pct(video["fused"]["fused"])],
        ]  # fmt: skip
        out.append((f"AAVG4 and the two streams on the miniature UCF101 ({video['test_videos']} test videos):",
                    header, rows))  # fmt: skip
    return out


def verdicts(res: dict) -> list[str]:
    v = res["variants"]
    lines = []
    warm, chance = res.get("warm"), 1 / res.get("num_classes", 10)
    if warm is not None:
        at_chance = warm["val"] is None or warm["val"] < 1.5 * chance
        lines.append(
            f"Warm start: AAVG1 from scratch for {warm['epochs']} epochs reached {_pct(warm['val'])} validation and "
            f"{_pct(warm['test'])} test accuracy (chance {_pct(chance)})"
            + (
                ": still on the from-scratch plateau, so the paper's pretrained start is not reproduced and the "
                "batch-size rule may act on that plateau's noise."
                if at_chance
                else ", so every variant starts past the from-scratch plateau (the paper starts from ImageNet weights)."
            )
        )
    equal = all(s["steps"] == res["steps"] for s in v.values())
    lines.append(
        f"Steps: every run of every variant took {res['steps']} optimizer steps per learner."
        if equal
        else f"Steps: the variants did NOT take equal steps ({ {n: s['steps'] for n, s in v.items()} })."
    )
    for hi, lo, paper in (("AAVG2", "AAVG1", 2.1), ("AAVG3", "AAVG2", 1.9)):
        d, se = gap(v[hi], v[lo])
        if d is None:
            continue
        met = se is not None and d >= -se
        lines.append(
            f"{hi} - {lo}: {d:+.1f} validation points (se {_num(se)}; the paper +{paper}): the target "
            f"(>= -1 se) is {'met' if met else 'missed'}."
        )
    grew = v["AAVG2"]["max_b"] > 1 or v["AAVG3"]["max_b"] > 1
    lines.append(
        f"Batch size: the adaptive variants reached B = {v['AAVG2']['max_b']} (AAVG2) and {v['AAVG3']['max_b']} "
        "(AAVG3) blocks from 1, so at equal N they saw more data than AAVG1."
        if grew
        else "Batch size: the adaptive rule never grew B in this run (no validation fell below the growth "
        "threshold), so AAVG2 differs from AAVG1 only in its seeds' noise: the paper's condition that the "
        "rule fires is absent at this size."
    )
    lines.append(
        "BatchNorm statistics: merge_bn_stats is off in AAVG1/AAVG2 and on in AAVG3, but the model here (the "
        f"small CNN with GroupNorm) has {res['bn_pairs']} BatchNorm (mean, var) pairs, so the switch changes "
        "nothing in these runs; AAVG3 differs from AAVG2 by the merged Adam moments alone. (ResNets here use "
        "frozen BatchNorm, whose statistics never change, so the merge is an identity for them too.)"
    )
    video = res.get("video")
    if video:
        f, s, r, fu = (
            video["flow"]["test"],
            video["flow_scratch"]["test"],
            video["rgb"]["test"],
            video["fused"],
        )
        lines.append(
            f"AAVG4: the flow stream initialised from the RGB run reaches {_pct(f)} test accuracy against "
            f"{_pct(s)} from scratch in the same {video['flow']['epochs']} epochs; RGB {_pct(r)}, the fusion "
            f"{_pct(fu['fused'])} on {video['test_videos']} test videos (one seed: a difference of one video "
            f"is {100 / max(video['test_videos'], 1):.1f} points)."
        )
    return lines


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


# ------------------------------------------------------------------------------------------ the runs
def _config(size: dict, storage: str, name: str, seed: int, **overrides):
    from raytrain_seq.config import Config

    return Config.from_preset(
        "demo", max_videos=size["videos"], batch_size=1, micro_batch_size=1, learners=2, k=K,
        validate_every=M, b1=B1, max_batch_size=MAX_B, checkpoint_every=10**9, storage_path=storage, run_name=name, seed=seed, **overrides,
    )  # fmt: skip


def _run(config) -> dict:
    from raytrain_seq.runtime.driver import run

    began = time.perf_counter()
    summary = run(config)
    history = [h for h in summary.val_accuracy_history if h["accuracy"] is not None]
    sizes = [h["batch_size"] for h in summary.batch_size_history] or [config.train.batch_size]
    return {
        "name": config.run.run_name, "seed": config.data.seed, "val": history[-1]["accuracy"] if history else None,
        "val_round": history[-1]["round"] if history else None, "rounds": summary.rounds,
        "test": summary.test_accuracy, "steps": summary.steps, "epochs": summary.epochs, "max_b": max(sizes),
        "wall_s": time.perf_counter() - began,
    }  # fmt: skip


def bn_pair_count() -> int:
    """BatchNorm (mean, var) pairs in the ablation's model (the demo preset's)."""
    from raytrain_seq.averaging import bn_pairs
    from raytrain_seq.config import Config
    from raytrain_seq.models.factory import build_model_for

    state = build_model_for(Config.from_preset("demo"), num_classes=10, in_channels=3).state_dict()
    return len(bn_pairs(list(state), state))


def run_synthetic(size: dict, storage: str) -> dict:
    warm = _config(size, storage, "warm", 0, epochs=size["warm_epochs"], **VARIANTS["AAVG1"])
    warmed = _run(warm)
    print(f"warm start (AAVG1, {size['warm_epochs']} epochs): val {_pct(warmed['val'])}, "
          f"{warmed['wall_s']:.0f} s", flush=True)  # fmt: skip
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for seed in size["seeds"]:
        for name, switches in VARIANTS.items():
            config = _config(size, storage, f"{name.lower()}-s{seed}", seed, steps=size["steps"],
                             init_from=str(Path(storage) / "warm"), **switches)  # fmt: skip
            out = _run(config)
            runs[name].append(out)
            print(f"{name} seed {seed}: {out['steps']} steps ({out['epochs']:.2f} epochs), val {_pct(out['val'])} "
                  f"(round {out['val_round']} of {out['rounds']}), test {_pct(out['test'])}, B max {out['max_b']}, "
                  f"{out['wall_s']:.0f} s", flush=True)  # fmt: skip
    return {"warm": warmed, "runs": runs, "variants": {n: variant_stats(r) for n, r in runs.items()}}


def run_video(size: dict, storage: str) -> dict:
    """RGB, flow --init-from RGB (AAVG4), flow from scratch, fuse(RGB, AAVG4 flow) on a miniature UCF101."""
    from raytrain_seq.config import Config
    from raytrain_seq.runtime.fuse import run_fuse

    sys.path.insert(0, str(ROOT / "tests"))
    from video_fixtures import make_mini_ucf101

    classes, groups, clips = size["ucf"]
    data = Path(tempfile.mkdtemp(prefix="mini-ucf-", dir=storage))
    make_mini_ucf101(data, classes, groups, clips)

    def config(name: str, **overrides) -> Config:
        return Config.from_preset("mini-video", dataset="ucf101", data_root=str(data), storage_path=storage,
                                  run_name=name, epochs=size["video_epochs"], **overrides)  # fmt: skip

    out = {"rgb": _run(config("ucf-rgb"))}
    out["flow"] = _run(config("ucf-flow", stream="flow", init_from=str(Path(storage) / "ucf-rgb")))
    out["flow_scratch"] = _run(config("ucf-flow-scratch", stream="flow"))
    fused = run_fuse(config("ucf-fuse", stream="fuse", fuse=(str(Path(storage) / "ucf-rgb"),
                                                               str(Path(storage) / "ucf-flow"))))  # fmt: skip
    info = fused.extra["fuse"]
    out["fused"] = {k: info[f"{k}_accuracy"] for k in ("rgb", "flow", "fused")}
    out["test_videos"] = info["test_videos"]
    for name in ("rgb", "flow", "flow_scratch"):
        print(f"ucf {name}: val {_pct(out[name]['val'])}, test {_pct(out[name]['test'])}", flush=True)
    print(f"ucf fused: {_pct(out['fused']['fused'])} on {out['test_videos']} test videos", flush=True)
    return out


def run(size_name: str) -> dict:
    import logging

    import ray

    from raytrain_seq.runtime.connect import WORKER_REUSE

    size = SIZES[size_name]
    storage = tempfile.mkdtemp(prefix="bench-ablation-")
    ray.init(address="local", num_cpus=4, namespace="raytrain_seq", include_dashboard=False,
             log_to_driver=False, _system_config=WORKER_REUSE)  # fmt: skip
    logging.getLogger("ray").setLevel(logging.WARNING)
    began = time.perf_counter()
    try:
        res = run_synthetic(size, storage)
        video = run_video(size, storage)
    finally:
        ray.shutdown()
        import shutil

        shutil.rmtree(storage, ignore_errors=True)  # the runs' checkpoints: the summaries are read
    res.update(size=size, steps=size["steps"], seeds=size["seeds"], video=video, bn_pairs=bn_pair_count())
    res["aavg4"] = {"flow_val": video["flow"]["val"], "flow_test": video["flow"]["test"],
                    "flow_scratch_test": video["flow_scratch"]["test"], "rgb_test": video["rgb"]["test"]}  # fmt: skip
    res["two_stream"] = {**video["fused"], "test_videos": video["test_videos"]}
    res["wall_s"] = time.perf_counter() - began
    return res
