"""The AAVG ablation at equal N (``bench/averaging.py --only ablation``): AAVG1..3 under both batch-size
rules, from scratch and from a warm start, over seeds; AAVG4 and the two-stream fusion over seeds on a
miniature real-video set.

The paper fixes the steps N and compares AAVG1 (constant batch) < AAVG2 (adaptive batch) < AAVG3 (+ merged
Adam moments and BatchNorm statistics); AAVG4 starts flow from RGB. Here, every run ``driver.run`` on the
synthetic set with 2 learners: 1. a warm start (AAVG1 for ``warm_epochs``, the warm variants'
``--init-from``); 2. per start and seed, AAVG1, then AAVG2 and AAVG3 under each ``train.batch_rule``, each
``--steps N`` (switches ``adaptive_batch``, ``merge_moments``, ``merge_bn_stats``); 3. on the miniature
UCF101, per seed: RGB, flow ``--init-from`` it (AAVG4), flow from scratch, both at a tenth of the rate,
and the fusion. Per variant the mean and se over seeds; differences paired by seed are a gain or a loss
only when n >= 3 and |diff| > se (``benchlib.seed_word``).

    python bench/averaging.py --only ablation --json   # --seeds 0 1: fewer (none called a gain below 3)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import local_ray, mean_se, pct, pct_mean_se, seed_gap_text, seed_word, spread_keys

ROOT = Path(__file__).resolve().parent

# Per size: synthetic videos, warm-start epochs, N, seeds; the miniature UCF101 (classes, groups, clips),
# the epochs and seeds of its runs.
SIZES = {
    "tiny": {"videos": 40, "warm_epochs": 1, "steps": 8, "seeds": [0, 1], "ucf": (3, 6, 2), "video_epochs": 1,
             "video_seeds": [0, 1]},
    "default": {"videos": 200, "warm_epochs": 6, "steps": 64, "seeds": [0, 1, 2], "ucf": (3, 6, 2),
                "video_epochs": 4, "video_seeds": [0, 1, 2]},
    "full": {"videos": 1000, "warm_epochs": 3, "steps": 400, "seeds": [0, 1, 2, 3, 4], "ucf": (5, 9, 2),
             "video_epochs": 8, "video_seeds": [0, 1, 2, 3, 4]},
}  # fmt: skip
# Averaging every K steps and validating every M rounds gives the batch-size rule chances to act.
K = 4
M = 2
MAX_B = (
    576  # the paper's cap; the rows a learner has per epoch cap B first here (batchsize.AdaptiveBatchSize)
)
RULES = ("paper", "noise-aware")
HEADLINE_RULE, HEADLINE_START = "paper", "warm"  # the paper's setting: its rule, a pretrained start
STARTS = ("warm", "scratch")
VARIANTS = {
    "AAVG1": {"adaptive_batch": False, "merge_moments": False, "merge_bn_stats": False},
    "AAVG2": {"adaptive_batch": True, "merge_moments": False, "merge_bn_stats": False},
    "AAVG3": {"adaptive_batch": True, "merge_moments": True, "merge_bn_stats": True},
}
PAPER = {"AAVG1": 81.6, "AAVG2": 83.7, "AAVG3": 85.6}
PAPER_GAPS = {("AAVG2", "AAVG1"): 2.1, ("AAVG3", "AAVG2"): 1.9}
VIDEO_RUNS = ("rgb", "flow", "flow_scratch", "flow_low_lr", "flow_scratch_low_lr")


# -------------------------------------------------------------------------------------- pure helpers
def variant_stats(runs: list[dict]) -> dict:
    """One variant's runs -> {val_mean, val_se, val_n, test_mean, test_se, test_n, steps, seeds, max_b,
    epochs, by_seed} (n: the seeds whose run has that accuracy); ``steps`` is the one step count every run
    took, or the sorted distinct counts when they differ."""
    vals = [r["val"] for r in runs if r["val"] is not None]
    tests = [r["test"] for r in runs if r["test"] is not None]
    val, test = mean_se(vals), mean_se(tests)
    steps = sorted({r["steps"] for r in runs})
    return {
        "val_mean": val[0], "val_se": val[1], "val_n": len(vals), "test_mean": test[0], "test_se": test[1],
        "test_n": len(tests),
        "steps": steps[0] if len(steps) == 1 else steps, "seeds": [r["seed"] for r in runs],
        "max_b": max(r["max_b"] for r in runs), "epochs": [r["epochs"] for r in runs],
        "by_seed": {r["seed"]: {"val": r["val"], "test": r["test"]} for r in runs},
    }  # fmt: skip


def paired(diffs: list[float]) -> tuple[float | None, float | None, int]:
    """(mean, standard error, n) of differences paired by seed: [+5, -2] -> (+1.5, 3.5, 2)."""
    return (*mean_se(diffs), len(diffs))


def gap(a: dict, b: dict, key: str = "val") -> tuple[float | None, float | None, int]:
    """(a - b in points, the standard error of the differences paired by seed, n), over the seeds both ran.

    a by seed {0: .70, 1: .60}, b {0: .65, 1: .62}: differences +5, -2 -> (+1.5, 3.5, 2)."""
    seeds = sorted(set(a["by_seed"]) & set(b["by_seed"]))
    diffs = [
        100 * (a["by_seed"][s][key] - b["by_seed"][s][key])
        for s in seeds
        if a["by_seed"][s][key] is not None and b["by_seed"][s][key] is not None
    ]
    return paired(diffs)


def gap_text(diff: float | None, se: float | None, n: int) -> str:
    """'+2.0 +- 2.7 (n = 3, within noise)': a difference with its standard error, n and what it is worth
    (a gain or a loss only when n >= 3 and |diff| > se: benchlib.seed_word)."""
    return seed_gap_text(diff, se, n)


def gaps(variants: dict) -> dict:
    """The paper's two steps, AAVG2 - AAVG1 and AAVG3 - AAVG2, in validation and test points (paired)."""
    out = {}
    for hi, lo in PAPER_GAPS:
        for key in ("val", "test"):
            d, se, n = gap(variants[hi], variants[lo], key)
            out[f"{hi.lower()}_minus_{lo[-1]}_{key}"] = {
                "diff": d,
                "se": se,
                "n": n,
                "text": gap_text(d, se, n),
            }
    return out


def _public(stats: dict) -> dict:
    keep = ("val_mean", "val_se", "val_n", "test_mean", "test_se", "test_n", "steps", "max_b")
    return {k: stats[k] for k in keep}


def headline(res: dict) -> dict:
    """The JSON last line: {"rule", "start", "steps", "seeds", "variants": {name: {val_mean, val_se, steps,
    ...}} (the paper's rule from the warm start), "by_rule": {rule: {start: {"variants", "gaps"}}}, "aavg4",
    "two_stream", "equal_steps"} (accuracies in [0, 1], gaps in points)."""
    grid = res["grid"]
    by_rule = {
        rule: {
            start: {"variants": {n: _public(s) for n, s in grid[start][rule].items()}, "gaps": gaps(grid[start][rule])}
            for start in grid
        }
        for rule in RULES
    }  # fmt: skip
    main = grid[HEADLINE_START][HEADLINE_RULE]
    equal = all(
        s["steps"] == res["steps"] for start in grid.values() for v in start.values() for s in v.values()
    )
    return {
        "rule": HEADLINE_RULE, "start": HEADLINE_START, "steps": res["steps"], "seeds": res["seeds"],
        "variants": {n: _public(s) for n, s in main.items()}, "by_rule": by_rule,
        "aavg4": res.get("aavg4"), "two_stream": res.get("two_stream"), "equal_steps": equal,
    }  # fmt: skip


def grid_rows(res: dict) -> list[list[str]]:
    """One row per (start, rule, variant); AAVG1 (no batch rule) once per start."""
    rows = []
    for start, rules in res["grid"].items():
        for rule, variants in rules.items():
            for name, s in variants.items():
                if name == "AAVG1" and rule != RULES[0]:
                    continue
                switch = VARIANTS[name]
                rows.append([
                    start, "-" if name == "AAVG1" else rule, name, str(switch["merge_moments"]),
                    str(switch["merge_bn_stats"]), str(s["steps"]), f"{sum(s['epochs']) / len(s['epochs']):.1f}",
                    str(s["max_b"]), pct_mean_se(s["val_mean"], s["val_se"], s["val_n"]),
                    pct_mean_se(s["test_mean"], s["test_se"], s["test_n"]),
                    f"{PAPER[name]:.1f} %",
                ])  # fmt: skip
    return rows


def video_rows(video: dict) -> list[list[str]]:
    labels = {
        "rgb": ("RGB", "scratch", "preset"), "flow": ("flow (AAVG4)", "RGB run", "preset"),
        "flow_scratch": ("flow", "scratch", "preset"), "flow_low_lr": ("flow (AAVG4)", "RGB run", "preset / 10"),
        "flow_scratch_low_lr": ("flow", "scratch", "preset / 10"),
    }  # fmt: skip
    rows = []
    for key, (run, init, lr) in labels.items():
        s = video["stats"][key]
        rows.append([
            run, init, lr, pct_mean_se(s["first_val_mean"], s["first_val_se"], s["first_val_n"]),
            pct_mean_se(s["test_mean"], s["test_se"], s["test_n"]),
        ])  # fmt: skip
    fused = video["fused"]
    rows.append(
        [
            "two-stream fusion (RGB + AAVG4 flow)",
            "-",
            "-",
            "-",
            pct_mean_se(fused["mean"], fused["se"], fused["n"]),
        ]
    )
    return rows


def tables(res: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    header = ["start", "rule", "variant", "merge Adam", "merge BN stats", "steps", "epochs (mean)", "largest B",
              "val acc (mean +- se, n seeds)", "test acc (mean +- se, n seeds)", "paper (UCF101 RGB val)"]  # fmt: skip
    out = [
        (f"AAVG1..3 at N = {res['steps']} steps per learner, seeds {res['seeds']}:", header, grid_rows(res))
    ]
    gheader = [
        "start",
        "rule",
        "AAVG2 - AAVG1 val",
        "AAVG3 - AAVG2 val",
        "AAVG2 - AAVG1 test",
        "AAVG3 - AAVG2 test",
    ]
    grows = [
        [start, rule] + [g[k]["text"] for k in ("aavg2_minus_1_val", "aavg3_minus_2_val", "aavg2_minus_1_test",
                                                  "aavg3_minus_2_test")]
        for start, rules in res["grid"].items()
        for rule, variants in rules.items()
        for g in [gaps(variants)]
    ]  # fmt: skip
    out.append(("Differences in points, paired by seed (+- the standard error of the paired differences, n the "
                "seeds paired; a gain or a loss only when n >= 3 and |difference| > se, else within noise; the "
                "paper: +2.1 and +1.9):", gheader, grows))  # fmt: skip
    video = res.get("video")
    if video:
        vheader = ["run", "init", "learning rate", "val after epoch 1 (mean +- se, n seeds)",
                   "test acc (mean +- se, n seeds)"]  # fmt: skip
        out.append((f"AAVG4 and the two streams on the miniature UCF101 ({video['test_videos']} test videos, "
                    f"seeds {video['seeds']}):", vheader, video_rows(video)))  # fmt: skip
    return out


def step_call(cell: dict, paper: float) -> str:
    """One paper step's reading: a gain beyond one se (n >= 3) is set beside the paper's; a loss or a
    difference within noise measures no gain. {"diff": 2.0, "se": 5.8, "n": 3} -> 'within noise (n = 3):
    no gain is measured'."""
    word, n = seed_word(cell["diff"], cell["se"], cell["n"]), cell["n"]
    if word.startswith("a gain"):
        return f"{word} (n = {n}); the paper {paper:+.1f}"
    return f"{word} (n = {n}): no gain is measured" + (
        "" if word == "within noise" else f"; the paper {paper:+.1f}"
    )


def gap_verdicts(res: dict) -> list[str]:
    """Each start and rule: the paper's two steps, set beside the paper's gains only when beyond one se over
    n >= 3 seeds."""
    out = []
    for start, rules in res["grid"].items():
        for rule, variants in rules.items():
            g, parts = gaps(variants), []
            for (hi, lo), paper in PAPER_GAPS.items():
                cell = g[f"{hi.lower()}_minus_{lo[-1]}_val"]
                points = cell["text"].split(" (")[0]
                parts.append(f"{hi} - {lo} {points} validation points, {step_call(cell, paper)}")
            grew = variants["AAVG2"]["max_b"]
            out.append(
                f"{start.capitalize()} start, {rule} rule (B grew to {grew}): " + "; ".join(parts) + "."
            )
    return out


def aavg4_verdicts(video: dict) -> list[str]:
    """AAVG4 against the flow stream from scratch at the preset's and a tenth of its learning rate; a gap is
    called a gain or a loss only beyond one se over n >= 3 seeds (benchlib.seed_word)."""
    s, n = video["stats"], video["test_videos"]
    lines = []
    for tag, flow, scratch in (
        ("preset", "flow", "flow_scratch"),
        ("preset / 10", "flow_low_lr", "flow_scratch_low_lr"),
    ):
        d, se, k = video["diffs"][f"{flow}-{scratch}"]
        lines.append(
            f"AAVG4 at the {tag} learning rate: the flow stream from the RGB run "
            f"{pct_mean_se(s[flow]['test_mean'], s[flow]['test_se'], s[flow]['test_n'])} test accuracy against "
            f"{pct_mean_se(s[scratch]['test_mean'], s[scratch]['test_se'], s[scratch]['test_n'])} from scratch (paired "
            f"{gap_text(d, se, k)} points; after epoch 1: {pct(s[flow]['first_val_mean'])} against "
            f"{pct(s[scratch]['first_val_mean'])} validation)"
        )
    d, se, k = video["diffs"]["flow-flow_scratch"]
    word = seed_word(d, se, k)
    low_word = seed_word(*video["diffs"]["flow_low_lr-flow_scratch_low_lr"])
    if word == "within noise":
        why = (
            f"the reversal of the earlier single run is within noise over {k} seeds on {n} test videos (one "
            f"video is {100 / n:.1f} points)"
        )
        why += (
            "; at a tenth of the rate the transferred start is ahead beyond one se: the preset's rate after "
            "the transfer is what erases the RGB start's lead"
            if low_word.startswith("a gain")
            else ": the finding is that this set cannot tell transfer from scratch"
        )
    elif word.startswith("a gain"):
        why = f"the transferred start is ahead at the preset's learning rate beyond one se (n = {k})"
    elif not low_word.startswith("a loss"):
        why = "the transfer loses at the preset's learning rate and not at a tenth of it: the rate after transfer is the cause"
    else:
        why = "the transfer loses at both learning rates: reported as the finding, not fixed"
    return ["; ".join(lines) + f". So {why}."]


def verdicts(res: dict) -> list[str]:
    warm, chance = res.get("warm"), 1 / res.get("num_classes", 10)
    lines = []
    if warm is not None:
        lines.append(
            f"Warm start: AAVG1 from scratch for {warm['epochs']} epochs reached {pct(warm['val'])} validation "
            f"and {pct(warm['test'])} test accuracy (chance {pct(chance)}); 'scratch' rows start from a fresh "
            "initialisation instead."
        )
    equal = headline(res)["equal_steps"]
    lines.append(
        f"Steps: every run took {res['steps']} optimizer steps per learner whatever its B."
        if equal
        else "Steps: the runs did NOT all take the same steps (see the table)."
    )
    lines += gap_verdicts(res)
    lines.append(
        f"BatchNorm statistics: the model here (the demo model, GroupNorm) has {res['bn_pairs']} BatchNorm (mean, "
        "var) pairs, so Algorithm 2's m^b/v^b merge (merge_bn_stats) is not exercised by these runs: AAVG3 "
        "differs from AAVG2 by the merged Adam moments alone. The merge is checked by tests/test_averaging.py "
        "(averaging.merge_mean_var), not measured here."
    )
    if res.get("video"):
        lines += aavg4_verdicts(res["video"])
    return lines


# ------------------------------------------------------------------------------------------ the runs
def _config(size: dict, storage: str, name: str, seed: int, rule: str, **overrides):
    from raytrain_seq.config import Config

    return Config.from_preset(
        "demo", max_videos=size["videos"], batch_size=1, micro_batch_size=1, learners=2, k=K, validate_every=M,
        batch_rule=rule, max_batch_size=MAX_B, checkpoint_every=10**9, keep_checkpoints=1, tracker="none",
        storage_path=storage, run_name=name, seed=seed, **overrides,
    )  # fmt: skip


def _run(config) -> dict:
    from raytrain_seq.runtime.driver import run

    began = time.perf_counter()
    summary = run(config)
    history = [h for h in summary.val_accuracy_history if h["accuracy"] is not None]
    sizes = [h["batch_size"] for h in summary.batch_size_history] or [config.train.batch_size]
    return {
        "name": config.run.run_name, "seed": config.data.seed, "val": history[-1]["accuracy"] if history else None,
        "first_val": history[0]["accuracy"] if history else None, "rounds": summary.rounds,
        "test": summary.test_accuracy, "steps": summary.steps, "epochs": summary.epochs, "max_b": max(sizes),
        "test_videos": int(summary.videos.get("test", 0)), "wall_s": time.perf_counter() - began,
    }  # fmt: skip


def _say(label: str, out: dict) -> None:
    print(f"{label}: {out['steps']} steps ({out['epochs']:.2f} epochs), val {pct(out['val'])}, test "
          f"{pct(out['test'])}, B max {out['max_b']}, {out['wall_s']:.0f} s", flush=True)  # fmt: skip


def bn_pair_count() -> int:
    """BatchNorm (mean, var) pairs in the ablation's model (the demo preset's)."""
    from raytrain_seq.algorithms.averaging import bn_pairs
    from raytrain_seq.config import Config
    from raytrain_seq.models.factory import build_model_for

    state = build_model_for(Config.from_preset("demo").model, num_classes=10, in_channels=3).state_dict()
    return len(bn_pairs(list(state), state))


def run_synthetic(size: dict, storage: str) -> dict:
    """The warm start, then per seed and start AAVG1 and both rules' AAVG2 and AAVG3 (seeds outermost, so
    that a shared machine's load falls on every variant alike)."""
    warm = _run(
        _config(size, storage, "warm", 0, "noise-aware", epochs=size["warm_epochs"], **VARIANTS["AAVG1"])
    )
    _say(f"warm start (AAVG1, {size['warm_epochs']} epochs)", warm)
    runs: dict = {start: {rule: {n: [] for n in VARIANTS} for rule in RULES} for start in STARTS}
    for seed in size["seeds"]:
        for start in STARTS:
            init = {"init_from": str(Path(storage) / "warm")} if start == "warm" else {}
            common = {"steps": size["steps"], **init}
            one = _run(_config(size, storage, f"{start}-aavg1-s{seed}", seed, "noise-aware", **common,
                               **VARIANTS["AAVG1"]))  # fmt: skip
            _say(f"{start} AAVG1 seed {seed}", one)
            for rule in RULES:
                runs[start][rule]["AAVG1"].append(one)
                for name in ("AAVG2", "AAVG3"):
                    tag = f"{start}-{rule}-{name.lower()}-s{seed}"
                    out = _run(_config(size, storage, tag, seed, rule, **common, **VARIANTS[name]))
                    _say(f"{start} {rule} {name} seed {seed}", out)
                    runs[start][rule][name].append(out)
    grid = {
        s: {r: {n: variant_stats(v) for n, v in rules.items()} for r, rules in by.items()}
        for s, by in runs.items()
    }
    return {"warm": warm, "runs": runs, "grid": grid}


def _video_seed(size: dict, storage: str, data: Path, seed: int) -> dict:
    """One seed's RGB run, the flow runs from it and from scratch (at the preset's and a tenth of its
    learning rate) and the fusion of RGB and the AAVG4 flow."""
    from raytrain_seq.config import Config
    from raytrain_seq.runtime.fuse import run_fuse

    def config(name: str, **overrides) -> Config:
        return Config.from_preset("mini-video", dataset="ucf101", data_root=str(data), storage_path=storage,
                                  run_name=f"{name}-s{seed}", epochs=size["video_epochs"], seed=seed,
                                  tracker="none", **overrides)  # fmt: skip

    rgb = str(Path(storage) / f"ucf-rgb-s{seed}")
    low = Config.from_preset("mini-video").train.lr / 10
    out = {"rgb": _run(config("ucf-rgb"))}
    out["flow"] = _run(config("ucf-flow", stream="flow", init_from=rgb))
    out["flow_scratch"] = _run(config("ucf-flow-scratch", stream="flow"))
    out["flow_low_lr"] = _run(config("ucf-flow-low", stream="flow", init_from=rgb, lr=low))
    out["flow_scratch_low_lr"] = _run(config("ucf-flow-scratch-low", stream="flow", lr=low))
    for key in VIDEO_RUNS:
        _say(f"ucf {key} seed {seed}", out[key])
    fused = run_fuse(config("ucf-fuse", stream="fuse", fuse=(rgb, str(Path(storage) / f"ucf-flow-s{seed}"))))
    out["fused"] = fused.extra["fuse"]["fused_accuracy"]
    out["test_videos"] = fused.extra["fuse"]["test_videos"]
    return out


def run_video(size: dict, storage: str) -> dict:
    """Every seed's video runs on one miniature UCF101, with means, standard errors and paired gaps."""
    sys.path.insert(0, str(ROOT.parent / "tests"))
    from video_fixtures import make_mini_ucf101

    data = Path(tempfile.mkdtemp(prefix="mini-ucf-", dir=storage))
    make_mini_ucf101(data, *size["ucf"])
    by_seed = {seed: _video_seed(size, storage, data, seed) for seed in size["video_seeds"]}
    stats = {}
    for key in VIDEO_RUNS:
        test = paired([s[key]["test"] for s in by_seed.values()])
        first = paired([s[key]["first_val"] for s in by_seed.values() if s[key]["first_val"] is not None])
        stats[key] = dict(zip(("test_mean", "test_se", "test_n", "first_val_mean", "first_val_se", "first_val_n"),
                              (*test, *first), strict=True))  # fmt: skip
    diffs = {
        f"{a}-{b}": paired([100 * (s[a]["test"] - s[b]["test"]) for s in by_seed.values()])
        for a, b in (
            ("flow", "flow_scratch"),
            ("flow_low_lr", "flow_scratch_low_lr"),
            ("flow", "flow_low_lr"),
        )
    }
    fused = paired([s["fused"] for s in by_seed.values()])
    test_videos = next(iter(by_seed.values()))["test_videos"]
    return {"by_seed": by_seed, "stats": stats, "diffs": diffs,
            "fused": dict(zip(("mean", "se", "n"), fused, strict=True)),
            "test_videos": test_videos, "seeds": list(by_seed)}  # fmt: skip


def _points(gap3: tuple[float | None, float | None, int]) -> dict:
    """A (difference, se, n) in points as the JSON keeps it, with its reading."""
    return {"diff": gap3[0], "se": gap3[1], "n": gap3[2], "text": gap_text(*gap3)}


def run(size_name: str, seeds: list[int] | None = None) -> dict:
    """Every run of the ablation at ``size_name``; ``seeds`` replaces the size's seeds (synthetic and video
    runs alike) where a shared machine's time allows fewer."""
    size = dict(SIZES[size_name])
    if seeds is not None:
        size.update(seeds=list(seeds), video_seeds=list(seeds))
    storage = tempfile.mkdtemp(prefix="bench-ablation-")
    began = time.perf_counter()
    try:
        with local_ray(4):
            res = run_synthetic(size, storage)
            video = run_video(size, storage)
    finally:
        import shutil

        shutil.rmtree(storage, ignore_errors=True)  # the runs' checkpoints: the summaries are read
    res.update(size=size, steps=size["steps"], seeds=size["seeds"], video=video, bn_pairs=bn_pair_count())
    s = video["stats"]
    res["aavg4"] = {
        "flow_test": s["flow"]["test_mean"], "flow_test_se": s["flow"]["test_se"],
        "flow_scratch_test": s["flow_scratch"]["test_mean"], "flow_scratch_test_se": s["flow_scratch"]["test_se"],
        "rgb_test": s["rgb"]["test_mean"], "flow_minus_scratch": _points(video["diffs"]["flow-flow_scratch"]),
        "flow_minus_scratch_low_lr": _points(video["diffs"]["flow_low_lr-flow_scratch_low_lr"]),
        "test_videos": video["test_videos"], "seeds": video["seeds"],
    }  # fmt: skip
    res["two_stream"] = {"fused": video["fused"]["mean"], "fused_se": video["fused"]["se"],
                         "rgb": s["rgb"]["test_mean"], "flow": s["flow"]["test_mean"],
                         "test_videos": video["test_videos"]}  # fmt: skip
    res["wall_s"] = time.perf_counter() - began
    return res


def notes(res: dict) -> list[str]:
    s, video = res["size"], res["video"]
    return [
        f"Synthetic set: {s['videos']} training videos (val and test up to as many), 2 learners of 1 CPU thread on a "
        f"local Ray cluster (num_cpus=4), the demo model, B = 1 block at the start (at most the paper's {MAX_B}, "
        f"and at most the rows a learner has per epoch), K = {K}, validation every {M} rounds; rules: 'paper' "
        "(train.batch_rule paper: grow when validation < 1.0 x its best, b2 = 2) and 'noise-aware' (the job's "
        "default: grow when validation < its best - the binomial standard error); every variant --steps "
        f"{s['steps']} (batch_growth 'steps', the default, lets B grow under a step budget); warm start: AAVG1 "
        f"for {s['warm_epochs']} epochs from scratch (seed 0), the --init-from of every 'warm' run; seeds "
        f"{s['seeds']} (data.seed: the videos, plans, augmentations and initial weights). 'val acc' is each "
        f"run's last validation (every {M} rounds), 'test acc' its final model's; n is the seeds behind a mean "
        "or a paired difference, and a difference is called a gain or a loss only when n >= 3 and |difference| "
        "> its se (benchlib.seed_word, as bench/batch_rule.py), else within noise.",
        f"Miniature UCF101 (tests/video_fixtures.py: {s['ucf'][0]} classes x {s['ucf'][1]} groups x {s['ucf'][2]} "
        f"clips, {video['test_videos']} test videos), preset mini-video (learning rate 1e-2; 'preset / 10' = "
        f"1e-3), {s['video_epochs']} epochs, seeds {video['seeds']}; the fusion averages the softmax of the RGB "
        f"and the AAVG4 flow run per test video. Whole section: {res['wall_s'] / 60:.1f} min.",
    ]


def report_headline(res: dict) -> dict:
    """The headline keys docs/BENCHMARKS.md's table reads: each paper step with its se, per rule (warm)."""
    head = headline(res)
    out = {}
    for rule in RULES:
        g = head["by_rule"][rule][HEADLINE_START]["gaps"]
        key = rule.replace("-", "_")
        for step in ("aavg2_minus_1", "aavg3_minus_2"):
            gap = g[f"{step}_val"]
            out[f"{key}_{step}"] = gap["text"]
            spread_keys(out, f"{key}_{step}", gap["n"], gap["se"])
    gap = res["aavg4"]["flow_minus_scratch"]
    out["aavg4_minus_scratch"] = gap["text"]
    spread_keys(out, "aavg4_minus_scratch", gap["n"], gap["se"])
    return {**out, **head}
