"""AAVG batch-size rule: growing B under epochs and under the paper's step budget, against a fixed batch.

Runs the job (``runtime.driver.run``, local Ray, CPU) and compares test accuracy paired by seed (mean
and se of the per-seed differences): at equal epochs, ``always`` (``--batch-growth always``) against
``fixed`` (``--no-adaptive-batch``) on the synthetic set with 10 and 1,000 validation videos and on a
miniature UCF101 of real .avi files (the default holds B under epochs, so it is the fixed run); under the
paper's budget, ``default --steps N`` against the fixed run of the same seed and N steps. A difference
is a gain or loss only when |diff| > se over n >= 3 seeds, else "within noise". A run whose Ray Train
group fails to start is tried once more.

    python bench/batch_rule.py            # the default size
    python bench/batch_rule.py --tiny     # one short run per set, rule and seed
    python bench/batch_rule.py --json     # last line: the headline as one JSON object
    python bench/batch_rule.py --runs-dir DIR   # keep each run's numbers: a rerun skips the runs done
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    ROOT,
    Result,
    add_size_flags,
    command_line,
    new_figure,
    seed_gap_text,
    seed_word,
    try_plot,
    write_results,
)

logger = logging.getLogger(__name__)

UCF101_TRAIN_VIDEOS = 9537  # the synthetic set's train + val pool (UCF101 split 1's training list)
# The arms at equal epochs. The job's default ("steps") is not among them: under epochs it holds B, so it
# is the fixed run (batchsize.batch_may_grow, pinned by tests/test_bench.py); it runs under --steps N.
RULES = {
    "fixed": {"adaptive_batch": False},
    "always": {"batch_growth": "always"},
}
# Per size: the sets (synthetic: training videos, validation videos, epochs; video: classes, groups,
# clips per group, epochs), the seeds, and the cap of B in the --steps runs (each step of a grown B reads
# more rows, so the cap bounds their time).
SIZES = {
    "tiny": {
        "sets": {
            "synthetic-10": {"kind": "synthetic", "videos": 60, "val": 10, "epochs": 2},
            "synthetic-1000": {"kind": "synthetic", "videos": 60, "val": 1000, "epochs": 2},
            "mini-ucf101": {"kind": "video", "classes": 4, "groups": 6, "clips": 1, "epochs": 2},
        },
        "seeds": [0, 1],
        "steps_max_b": 8,
    },
    "default": {
        "sets": {
            "synthetic-10": {"kind": "synthetic", "videos": 300, "val": 10, "epochs": 20},
            "synthetic-1000": {"kind": "synthetic", "videos": 1000, "val": 1000, "epochs": 5},
            "mini-ucf101": {"kind": "video", "classes": 4, "groups": 9, "clips": 3, "epochs": 30},
        },
        "seeds": [0, 1, 2],
        "steps_max_b": 16,
    },
    "full": {
        "sets": {
            "synthetic-10": {"kind": "synthetic", "videos": 3000, "val": 10, "epochs": 10},
            "synthetic-1000": {"kind": "synthetic", "videos": 3000, "val": 1000, "epochs": 10},
            "mini-ucf101": {"kind": "video", "classes": 4, "groups": 25, "clips": 4, "epochs": 30},
        },
        "seeds": [0, 1, 2, 3, 4],
        "steps_max_b": 64,
    },
}


# -------------------------------------------------------------------------------------- pure helpers
def val_fraction(val_videos: int) -> float:
    """``data.val_fraction`` that holds out ``val_videos`` of the synthetic set's 9,537: the set keeps
    round(fraction x 9537) for validation (10 -> 0.0010486, 1000 -> 0.10486)."""
    return (val_videos + 0.25) / UCF101_TRAIN_VIDEOS


def paired_gap(rule: list[float | None], fixed: list[float | None]) -> tuple[float | None, float | None, int]:
    """(mean of rule - fixed per seed, in points; its standard error = sample std / sqrt(n); n pairs).

    Seeds whose run has no accuracy are left out; se is None below two pairs.
    [0.5, 0.7, 0.6] against [0.6, 0.7, 0.7]: differences -10, 0, -10 -> (-6.67, 3.33, 3).
    """
    diffs = [100 * (a - b) for a, b in zip(rule, fixed, strict=True) if a is not None and b is not None]
    if not diffs:
        return None, None, 0
    mean = statistics.fmean(diffs)
    return mean, (statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None), len(diffs)


def call(diff: float | None, se: float | None, n: int) -> str:
    """What a paired difference may be called (benchlib.seed_word): a gain or a loss only when |diff| > se
    over n >= 3 pairs.

    +9.3 +- 4.9, n 3 -> "a gain beyond one se (n = 3)"; -6.6 +- 5.9 -> "a loss beyond one se (n = 3)";
    +2.0 +- 2.7, n 3, or any difference with n 2 -> "within noise (n = 3)" / "(n = 2)".
    """
    return "not measured" if diff is None else f"{seed_word(diff, se, n)} (n = {n})"


def gap_text(diff: float | None, se: float | None, n: int) -> str | None:
    """A paired gap for the summary table: +0.0 +- 5.8 over 3 seeds -> '+0.0 +- 5.8 (n = 3, within noise)'."""
    return None if diff is None else seed_gap_text(diff, se, n)


def first_growth(batch_history: list[dict]) -> int | None:
    """The round at which B first grew, None if it never did: sizes (4 @1, 4 @2, 8 @3) -> 3."""
    entries = sorted(batch_history, key=lambda e: e["round"])
    for before, after in itertools.pairwise(entries):
        if after["batch_size"] > before["batch_size"]:
            return int(after["round"])
    return None


def set_stats(runs: dict[str, list[dict]]) -> dict:
    """One set's runs per rule (seed order) -> per rule: test mean, se, paired gap to fixed, B, steps."""
    out = {}
    fixed = [r["test"] for r in runs["fixed"]]
    for rule, rs in runs.items():
        tests = [r["test"] for r in rs]
        valid = [t for t in tests if t is not None]
        mean = statistics.fmean(valid) if valid else None
        se = statistics.stdev(valid) / math.sqrt(len(valid)) if len(valid) > 1 else None
        diff, diff_se, n = paired_gap(tests, fixed) if rule != "fixed" else (None, None, 0)
        out[rule] = {
            "test_mean": mean, "test_se": se, "diff": diff, "diff_se": diff_se, "n": n,
            "call": call(diff, diff_se, n), "max_b": max(r["max_b"] for r in rs),
            "grew_runs": sum(r["first_growth"] is not None for r in rs), "steps": [r["steps"] for r in rs],
            "tests": tests,
        }  # fmt: skip
    return out


def steps_stats(steps_runs: list[dict]) -> dict:
    """The --steps N runs, each carrying its fixed run's test accuracy and epochs (``fixed_test``,
    ``fixed_epochs``): the paired gap default - fixed (points, se, n), its call, B's growth, epochs read."""
    diff, se, n = paired_gap([r["test"] for r in steps_runs], [r["fixed_test"] for r in steps_runs])
    return {
        "diff": diff, "se": se, "n": n, "call": call(diff, se, n),
        "grew": sum(r["first_growth"] is not None for r in steps_runs), "runs": len(steps_runs),
        "max_b": max((r["max_b"] for r in steps_runs), default=None),
        "epochs": [r["epochs"] for r in steps_runs], "fixed_epochs": [r["fixed_epochs"] for r in steps_runs],
    }  # fmt: skip


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _pts(d: float | None, se: float | None) -> str:
    if d is None:
        return "n/a"
    return f"{d:+.1f}" + ("" if se is None else f" +- {se:.1f}")


def _nums(xs: list[float]) -> str:
    return ", ".join(f"{x:g}" for x in xs)


def headline(res: dict) -> dict:
    """The JSON last line: the paired default - fixed under --steps N (the headline), and per set the
    paired always - fixed at equal epochs, each with its se, n and call."""
    sets = {}
    for name, s in res["sets"].items():
        a, f = s["stats"]["always"], s["stats"]["fixed"]
        sets[name] = {
            "val_videos": s["val_videos"], "epochs": s["epochs"], "fixed_test_mean": f["test_mean"],
            "always_test_mean": a["test_mean"], "always_minus_fixed": a["diff"], "always_minus_fixed_se": a["diff_se"],
            "n": a["n"], "call": a["call"], "always_max_b": a["max_b"], "always_grew_runs": a["grew_runs"],
        }  # fmt: skip
    st = steps_stats(res.get("steps_runs") or [])
    always_text = ", ".join(
        f"{n} {_pts(s['always_minus_fixed'], s['always_minus_fixed_se'])}" for n, s in sets.items()
    )
    ns = sorted({s["n"] for s in sets.values()})
    return {
        "seeds": res["seeds"], "sets": sets,
        "always_minus_fixed_text": f"{always_text} (n = {', '.join(map(str, ns))})" if sets else None,
        "default_at_equal_epochs": "the fixed run (B held, batchsize.batch_may_grow): pinned by a unit test, not run",
        "steps_set": res.get("steps_set"),
        "steps_default_minus_fixed": st["diff"], "steps_default_minus_fixed_se": st["se"], "steps_n": st["n"],
        "steps_call": st["call"],
        "steps_default_minus_fixed_text": gap_text(st["diff"], st["se"], st["n"]),
        "steps_budget_grew": st["grew"], "steps_runs": st["runs"], "steps_max_b": st["max_b"],
        "steps_epochs_read": st["epochs"], "steps_fixed_epochs": st["fixed_epochs"],
    }  # fmt: skip


def table(res: dict) -> tuple[list[str], list[list[str]]]:
    header = ["set", "val videos", "epochs", "rule", "B largest", "runs that grew B", "steps per seed",
              "test acc (mean +- se)", "always - fixed, points (+- se)", "reading"]  # fmt: skip
    rows = []
    for name, s in res["sets"].items():
        for rule, st in s["stats"].items():
            rows.append([
                name, str(s["val_videos"]), str(s["epochs"]), rule, str(st["max_b"]),
                f"{st['grew_runs']} of {len(st['steps'])}", ", ".join(map(str, st["steps"])),
                _pct(st["test_mean"]) + ("" if st["test_se"] is None else f" +- {100 * st['test_se']:.1f}"),
                "-" if rule == "fixed" else _pts(st["diff"], st["diff_se"]),
                "-" if rule == "fixed" else st["call"],
            ])  # fmt: skip
    return header, rows


def steps_table(res: dict) -> tuple[str, list[str], list[list[str]]]:
    header = ["seed", "--steps N", "epochs read (fixed's)", "B over the run", "first growth (round)",
              "test acc", "fixed's test acc", "default - fixed, points"]  # fmt: skip
    rows = [
        [str(r["seed"]), str(r["steps"]), f"{r['epochs']:.1f} ({r['fixed_epochs']:g})", r["b_path"],
         str(r["first_growth"] or "never"), _pct(r["test"]), _pct(r["fixed_test"]),
         "n/a" if r["test"] is None or r["fixed_test"] is None else f"{100 * (r['test'] - r['fixed_test']):+.1f}"]
        for r in res.get("steps_runs", [])
    ]  # fmt: skip
    name = res.get("steps_set", "mini-ucf101")
    caption = (f"The paper's budget on {name}: `default` with `--steps N`, paired with the `fixed` run of the same "
               f"seed, which took the same N optimizer steps (N taken from it; B capped at {res.get('steps_max_b')}):")  # fmt: skip
    return caption, header, rows


def verdicts(res: dict) -> list[str]:
    lines = []
    for name, s in res["sets"].items():
        a = s["stats"]["always"]
        lines.append(
            f"{name} ({s['val_videos']} validation videos, {s['epochs']} epochs): growing B under epochs "
            f"(always) - fixed {_pts(a['diff'], a['diff_se'])} points, {a['call']}; largest B {a['max_b']}, B "
            f"grew in {a['grew_runs']} of {len(a['steps'])} runs, which took {', '.join(map(str, a['steps']))} "
            f"steps against fixed's {', '.join(map(str, s['stats']['fixed']['steps']))}."
        )
    lines.append(
        'The default (batch_growth="steps") is not run at equal epochs: under an epoch budget it holds B at its '
        "start (batchsize.batch_may_grow), so it IS the fixed run. This is pinned by a unit test "
        "(tests/test_bench.py), not measured."
    )
    steps = res.get("steps_runs") or []
    if steps:
        st = steps_stats(steps)
        lines.append(
            f"Under the paper's budget ({res.get('steps_set')}, --steps N = the fixed run's steps): default - "
            f"fixed {_pts(st['diff'], st['se'])} points, {st['call']}. The default grew B in {st['grew']} of "
            f"{st['runs']} runs (largest {st['max_b']}); the runs read {_nums(st['epochs'])} epochs against "
            f"fixed's {_nums(st['fixed_epochs'])}: a grown B reads more rows per step, so this pair is equal "
            "steps, not equal data."
        )
    return lines


def plot(res: dict):
    fig, (ax,) = new_figure(1, width=6.0)
    names = list(res["sets"])
    diffs = [res["sets"][n]["stats"]["always"]["diff"] or 0.0 for n in names]
    ses = [res["sets"][n]["stats"]["always"]["diff_se"] or 0.0 for n in names]
    ax.bar(range(len(names)), diffs, width=0.5, yerr=ses, capsize=3, label="always - fixed, equal epochs")
    labels = list(names)
    st = steps_stats(res.get("steps_runs") or [])
    if st["diff"] is not None:
        ax.bar([len(names)], [st["diff"]], width=0.5, yerr=[st["se"] or 0.0], capsize=3,
               label="default - fixed, equal steps (--steps N)")  # fmt: skip
        labels.append(f"{res.get('steps_set')}\n--steps N")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("test accuracy - fixed batch (points)")
    ax.set_title("AAVG batch-size rule, CPU (mean +- se over seeds, paired)")
    ax.legend(fontsize=8)
    return fig


# ------------------------------------------------------------------------------------------ the runs
def _run(config, runs_dir: Path | None = None) -> dict:
    """One job run's numbers. With ``runs_dir``, a run already recorded there with the same config is
    read back instead of run again (a long bench that stopped goes on where it was); a run that fails is
    tried once more (a worker lost on a busy box), and the second failure is raised."""
    record = None if runs_dir is None else runs_dir / f"{config.run.run_name}.json"
    # The run folder and where the generated videos were written do not change what a run measures.
    wanted = {k: v for k, v in config.to_dict().items() if k != "run"}
    wanted["data"] = {**wanted["data"], "data_root": None}
    if record is not None and record.exists():
        saved = json.loads(record.read_text())
        if saved["config"] == json.loads(json.dumps(wanted)):
            return saved["run"]
    try:
        out = _run_once(config)
    except Exception as exc:
        logger.warning("run %s failed (%r); trying it once more", config.run.run_name, exc)
        print(f"{config.run.run_name} failed ({type(exc).__name__}); trying it once more", flush=True)
        config.run.run_name += "-again"
        out = _run_once(config)
    if record is not None:
        record.write_text(json.dumps({"config": wanted, "run": out}))
    return out


def _run_once(config) -> dict:
    from raytrain_seq.runtime.driver import run

    began = time.perf_counter()
    summary = run(config)
    history = sorted(summary.batch_size_history, key=lambda e: e["round"])
    sizes = [h["batch_size"] for h in history] or [config.train.batch_size]
    path = [sizes[0]] + [b for a, b in itertools.pairwise(sizes) if b != a]
    return {
        "name": config.run.run_name, "seed": config.data.seed, "test": summary.test_accuracy,
        "steps": summary.steps, "epochs": float(summary.epochs), "max_b": max(sizes),
        "first_growth": first_growth(history), "b_path": " -> ".join(map(str, path)),
        "val_videos": summary.videos.get("val"), "wall_s": time.perf_counter() - began,
    }  # fmt: skip


def _configs(spec: dict, storage: str, data_root: str | None):
    """(preset, overrides) of a set: the demo's synthetic set or the mini-video preset on real files."""
    from raytrain_seq.config import Config

    common = {"storage_path": storage, "tracker": "none", "checkpoint_every": 10**9, "epochs": spec["epochs"]}
    if spec["kind"] == "synthetic":
        sizes = {"max_videos": spec["videos"], "val_fraction": val_fraction(spec["val"])}

        def make(name: str, seed: int, **over) -> Config:
            return Config.from_preset("demo", run_name=name, seed=seed, **{**common, **sizes, **over})
    else:

        def make(name: str, seed: int, **over) -> Config:
            return Config.from_preset(
                "mini-video",
                dataset="ucf101",
                data_root=data_root,
                run_name=name,
                seed=seed,
                **{**common, **over},
            )

    return make


def run_set(name: str, spec: dict, seeds: list[int], storage: str, runs_dir: Path | None = None) -> dict:
    data_root = None
    if spec["kind"] == "video":
        sys.path.insert(0, str(ROOT / "tests"))
        from video_fixtures import make_mini_ucf101

        data_root = str(Path(storage) / f"{name}-data")
        make_mini_ucf101(data_root, spec["classes"], spec["groups"], spec["clips"], colours="clip")
    make = _configs(spec, storage, data_root)
    runs: dict[str, list[dict]] = {rule: [] for rule in RULES}
    for seed in seeds:
        for rule, over in RULES.items():
            out = _run(make(f"{name}-{rule}-s{seed}", seed, **over), runs_dir)
            runs[rule].append(out)
            print(f"{name} {rule} seed {seed}: test {_pct(out['test'])}, {out['steps']} steps, B {out['b_path']}, "
                  f"{out['val_videos']} val videos, {out['wall_s']:.0f} s", flush=True)  # fmt: skip
    val_videos = runs["fixed"][0]["val_videos"]
    return {"spec": spec, "epochs": spec["epochs"], "val_videos": val_videos, "runs": runs,
            "stats": set_stats(runs), "make": make}  # fmt: skip


def run_steps(res: dict, name: str, max_b: int, runs_dir: Path | None = None) -> list[dict]:
    """``default`` with ``--steps N`` (N = each seed's fixed run's steps) on the set ``name``; each run
    carries its fixed run's test accuracy and epochs (``fixed_test``, ``fixed_epochs``) for the pair."""
    s = res["sets"][name]
    out = []
    for fixed in s["runs"]["fixed"]:
        seed, steps = fixed["seed"], fixed["steps"]
        # epochs only bounds the run here (train.steps ends it): room for B to grow to max_b.
        epochs = s["epochs"] * max_b
        config = s["make"](f"{name}-steps-s{seed}", seed, steps=steps, max_batch_size=max_b, epochs=epochs)
        run = {**_run(config, runs_dir), "fixed_test": fixed["test"], "fixed_epochs": fixed["epochs"]}
        out.append(run)
        print(f"{name} default --steps {steps} seed {seed}: test {_pct(run['test'])} (fixed {_pct(fixed['test'])}), "
              f"{run['epochs']:.1f} epochs, B {run['b_path']}, {run['wall_s']:.0f} s", flush=True)  # fmt: skip
    return out


def run(
    size_name: str,
    only: list[str] | None = None,
    steps_set: str = "mini-ucf101",
    runs_dir: Path | None = None,
) -> dict:
    import ray

    from raytrain_seq.runtime.connect import WORKER_REUSE

    size = SIZES[size_name]
    storage = tempfile.mkdtemp(prefix="bench-batch-rule-")
    ray.init(address="local", num_cpus=4, namespace="raytrain_seq", include_dashboard=False,
             log_to_driver=False, _system_config=WORKER_REUSE)  # fmt: skip
    logging.getLogger("ray").setLevel(logging.WARNING)
    began = time.perf_counter()
    res: dict = {"size": size_name, "seeds": size["seeds"], "sets": {}, "steps_max_b": size["steps_max_b"]}
    try:
        for name, spec in size["sets"].items():
            if only is None or name in only:
                res["sets"][name] = run_set(name, spec, size["seeds"], storage, runs_dir)
        if steps_set in res["sets"]:
            res["steps_set"] = steps_set
            res["steps_runs"] = run_steps(res, steps_set, size["steps_max_b"], runs_dir)
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)  # the runs' folders: their summaries are read
    for s in res["sets"].values():
        s.pop("make")
    res["wall_s"] = time.perf_counter() - began
    return res


def _without_runs_dir(argv: list[str] | None) -> list[str]:
    """The command line less ``--runs-dir DIR`` (a cache of this machine's: the numbers are the same)."""
    args = list(sys.argv[1:] if argv is None else argv)
    out = []
    for arg in args:
        if out and out[-1] == "--runs-dir":
            out.pop()
        elif not arg.startswith("--runs-dir="):
            out.append(arg)
    return out[:-1] if out and out[-1] == "--runs-dir" else out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_flags(parser)
    parser.add_argument(
        "--sets",
        nargs="+",
        default=None,
        help="run only these sets (synthetic-10, synthetic-1000, mini-ucf101)",
    )
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="keep each run's numbers here; a rerun reads back the runs recorded with the same config",
    )
    parser.add_argument("--json", action="store_true", help="print the headline as one JSON last line")
    args = parser.parse_args(argv)
    if args.runs_dir is not None:
        args.runs_dir.mkdir(parents=True, exist_ok=True)
    known = set(SIZES[args.size]["sets"])
    if args.sets is not None and not set(args.sets) <= known:
        parser.error(f"--sets takes {', '.join(sorted(known))}, got {args.sets}")
    res = run(args.size, args.sets, runs_dir=args.runs_dir)
    header, rows = table(res)
    head = headline(res)
    notes = [
        "Synthetic sets: the demo preset (model, learning rate 3e-3, 2 learners of 1 CPU thread, B = 4 blocks at "
        "the start) with --max-videos training videos (test up to as many) and --val-fraction holding out the "
        "validation videos shown; miniature UCF101: tests/video_fixtures.py make_mini_ucf101 (classes x groups x "
        "clips as in the spec below, colours='clip': the class is in the motion only), preset mini-video "
        "(1 learner, B = 4, learning rate 1e-2), its validation videos held out by whole groups.",
        "Every run is raytrain_seq.runtime.driver.run on one local Ray cluster (num_cpus=4, CPU only), validating every "
        "round (one round per epoch), the noise-aware growth test (train.b1 none), b2 = 2, B capped by "
        "max_batch_size and the rows a learner has per epoch. 'test acc' is the final model's test top-1; each "
        "difference is paired by seed (same split, plans, augmentations and initial weights): the mean of the "
        "per-seed differences and its standard error (sample std / sqrt(n)). A difference is called a gain or a "
        "loss only when it exceeds its standard error over n >= 3 seeds; otherwise it is within noise.",
        "Specs: "
        + "; ".join(f"{n}: {json.dumps(s['spec'])}" for n, s in res["sets"].items())
        + f". Whole run: {res['wall_s'] / 60:.1f} min.",
    ]
    extra = [steps_table(res)] if res.get("steps_runs") else []
    result = Result(
        name="batch_rule",
        title="AAVG batch-size rule: growing B under epochs and under the paper's step budget, against a fixed "
        "batch (`bench/batch_rule.py`)",
        command=command_line(_without_runs_dir(argv), "batch_rule.py"),
        size=args.size,
        header=header,
        rows=rows,
        notes=notes,
        verdicts=verdicts(res),
        headline=head,
        extra_tables=extra,
    )
    write_results(result, args.results, try_plot(plot, res))
    if args.json:
        print(json.dumps(head, default=float), flush=True)
    return head


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
