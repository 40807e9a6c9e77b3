"""AAVG Algorithm 2 with BatchNorm that trains: the merge of running statistics against their plain mean.

Algorithm 2 of AAVG merges each BatchNorm (mean, var) pair by the law of total variance: m = mean m_j,
v = mean v_j + mean (m_j - m)^2, where a plain mean of the variances leaves out how far apart the
learners' means are. The shipped models freeze BatchNorm or use GroupNorm, so the merge meets a real run
only under ``--norm batchnorm``, which this script uses. Per seed, two runs of the job (2 learners, local
Ray, CPU) on the demo preset's set and model: ``merge`` (the default) and ``plain``
(``--no-merge-bn-stats``). Training-mode BatchNorm never reads its running statistics and B is held under
epochs, so a seed's two runs should differ only in the statistics the validations and the test read; the
script checks it (the largest weight difference, and how far merged variances lie above plain ones: 0
would make the comparison vacuous). Reported per arm and seed, mean +- se (n), and the paired difference
called a gain or a loss only when n >= 3 and |difference| > se (``benchlib.seed_word``).

    python bench/bn_merge.py [--tiny] [--json]   # 3 seeds x 2 arms; --tiny: seconds, 2 seeds
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    Result,
    add_size_flags,
    command_line,
    load_average,
    local_ray,
    mean_se,
    new_figure,
    pct,
    pct_mean_se,
    seed_gap_text,
    seed_word,
    spread_keys,
    try_plot,
    write_results,
)

logger = logging.getLogger(__name__)

ARMS = {"merge": True, "plain": False}  # arm -> train.merge_bn_stats
# Per size: synthetic training videos (validation and test up to as many), epochs, seeds.
SIZES = {
    "tiny": {"videos": 40, "epochs": 1, "seeds": [0, 1]},
    "default": {"videos": 600, "epochs": 5, "seeds": [0, 1, 2]},
    "full": {"videos": 1000, "epochs": 6, "seeds": [0, 1, 2, 3, 4]},
}
HEADLINE_KEYS = (
    "seeds", "n", "merge_test_mean", "merge_test_se", "plain_test_mean", "plain_test_se", "test_diff",
    "test_diff_se", "test_call", "val_diff", "val_diff_se", "val_call", "weights_max_abs_diff",
    "var_excess_mean", "var_excess_max", "bn_channels", "arms_differ", "chance",
)  # fmt: skip


# -------------------------------------------------------------------------------------- pure helpers
def paired(merge: list[float | None], plain: list[float | None]) -> tuple[float | None, float | None, int]:
    """(mean of merge - plain per seed in points, its standard error, n pairs); seeds missing either value
    are left out. [0.5, 0.7, 0.6] against [0.6, 0.7, 0.7]: -10, 0, -10 -> (-6.67, 3.33, 3)."""
    diffs = [100 * (a - b) for a, b in zip(merge, plain, strict=True) if a is not None and b is not None]
    return (*mean_se(diffs), len(diffs))


def bn_compare(merge: dict, plain: dict) -> dict:
    """How two final models differ: ``merge`` and ``plain`` map state keys to tensors (the two arms of one
    seed). ``weights_max_abs_diff``: the largest |difference| over every floating tensor but the running
    statistics; ``mean_max_abs_diff``: over the running means; ``var_excess``: (var_merge - var_plain) /
    var_plain per BatchNorm channel, as its mean, max and the fraction of channels above 0.

    A model whose only channel has means 1 in both and variances 1.1 against 1.0 -> excess 0.1."""
    import torch

    weights, means, excess = 0.0, 0.0, []
    for key, a in merge.items():
        b = plain[key]
        if not a.is_floating_point():
            continue
        gap = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        if key.endswith("running_var"):
            excess.append(((a.double() - b.double()) / b.double().clamp_min(1e-12)).reshape(-1))
        elif key.endswith("running_mean"):
            means = max(means, gap)
        else:
            weights = max(weights, gap)
    ratio = torch.cat(excess) if excess else torch.zeros(0, dtype=torch.float64)
    return {
        "weights_max_abs_diff": weights, "mean_max_abs_diff": means, "channels": int(ratio.numel()),
        "var_excess_mean": float(ratio.mean()) if ratio.numel() else None,
        "var_excess_max": float(ratio.max()) if ratio.numel() else None,
        "var_above": float((ratio > 0).double().mean()) if ratio.numel() else None,
    }  # fmt: skip


def arm_stats(runs: list[dict]) -> dict:
    """One arm's runs (seed order) -> test and last-validation means with se and n."""
    tests = [r["test"] for r in runs if r["test"] is not None]
    vals = [r["val"] for r in runs if r["val"] is not None]
    (tm, ts), (vm, vs) = mean_se(tests), mean_se(vals)
    return {
        "test_mean": tm,
        "test_se": ts,
        "test_n": len(tests),
        "val_mean": vm,
        "val_se": vs,
        "val_n": len(vals),
    }


def headline(res: dict) -> dict:
    """The JSON last line: per arm mean +- se, the paired merge - plain in points with se, n and call,
    and the direct check (weights apart, the merged variances' excess over the plain ones)."""
    runs, checks = res["runs"], res["checks"]
    merge, plain = arm_stats(runs["merge"]), arm_stats(runs["plain"])
    td, tse, n = paired([r["test"] for r in runs["merge"]], [r["test"] for r in runs["plain"]])
    vd, vse, vn = paired([r["val"] for r in runs["merge"]], [r["val"] for r in runs["plain"]])
    excess = [c["var_excess_mean"] for c in checks if c["var_excess_mean"] is not None]
    top = [c["var_excess_max"] for c in checks if c["var_excess_max"] is not None]
    head = {
        "seeds": res["seeds"], "n": n, "merge_test_mean": merge["test_mean"], "merge_test_se": merge["test_se"],
        "plain_test_mean": plain["test_mean"], "plain_test_se": plain["test_se"], "test_diff": td,
        "test_diff_se": tse, "test_call": seed_word(td, tse, n), "test_diff_text": seed_gap_text(td, tse, n),
        "val_diff": vd, "val_diff_se": vse, "val_call": seed_word(vd, vse, vn),
        "weights_max_abs_diff": max((c["weights_max_abs_diff"] for c in checks), default=None),
        "var_excess_mean": mean_se(excess)[0], "var_excess_max": max(top, default=None),
        "bn_channels": checks[0]["channels"] if checks else 0,
        "arms_differ": any((c["var_excess_max"] or 0) > 0 for c in checks), "chance": res["chance"],
    }  # fmt: skip
    spread_keys(head, "test_diff_text", n, tse)
    spread_keys(head, "var_excess_mean", len(excess), mean_se(excess)[1] if len(excess) > 1 else None)
    return head


def table(res: dict) -> tuple[list[str], list[list[str]]]:
    seeds = res["seeds"]
    header = ["arm", "train.merge_bn_stats"] + [f"test, seed {s}" for s in seeds]
    header += ["test (mean +- se, n seeds)", "last val (mean +- se, n seeds)"]
    rows = []
    for arm, flag in ARMS.items():
        runs, st = res["runs"][arm], arm_stats(res["runs"][arm])
        rows.append([arm, str(flag), *(pct(r["test"]) for r in runs), pct_mean_se(st["test_mean"], st["test_se"], st["test_n"]),
                     pct_mean_se(st["val_mean"], st["val_se"], st["val_n"])])  # fmt: skip
    head = headline(res)
    rows.append(["merge - plain (points, paired)", "-", *(
        "n/a" if a["test"] is None or b["test"] is None else f"{100 * (a['test'] - b['test']):+.1f}"
        for a, b in zip(res["runs"]["merge"], res["runs"]["plain"], strict=True)
    ), head["test_diff_text"], seed_gap_text(head["val_diff"], head["val_diff_se"], head["n"])])  # fmt: skip
    return header, rows


def check_table(res: dict) -> tuple[str, list[str], list[list[str]]]:
    header = ["seed", "weights, largest abs(merge - plain)", "running means, largest abs(merge - plain)",
              "running var, (merge - plain) / plain: mean", "max", "channels above plain",
              "val curve, merge", "val curve, plain", "last train loss, merge / plain"]  # fmt: skip
    rows = []
    for seed, check, a, b in zip(
        res["seeds"], res["checks"], res["runs"]["merge"], res["runs"]["plain"], strict=True
    ):
        rows.append([
            str(seed), f"{check['weights_max_abs_diff']:.1e}", f"{check['mean_max_abs_diff']:.1e}",
            "n/a" if check["var_excess_mean"] is None else f"{check['var_excess_mean']:.2e}",
            "n/a" if check["var_excess_max"] is None else f"{check['var_excess_max']:.2e}",
            "n/a" if check["var_above"] is None else f"{100 * check['var_above']:.0f} % of {check['channels']}",
            " ".join(pct(v) for v in a["val_curve"]), " ".join(pct(v) for v in b["val_curve"]),
            f"{a['loss']:.3f} / {b['loss']:.3f}" if a["loss"] is not None and b["loss"] is not None else "n/a",
        ])  # fmt: skip
    caption = ("What the arms did, per seed: their final averaged models compared tensor by tensor (the "
               "weights; the running means; the running variances, merged against plain), each validation "
               "of the run in order, and the last round's mean training loss:")  # fmt: skip
    return caption, header, rows


def verdicts(res: dict) -> list[str]:
    head = headline(res)
    n = head["n"]
    lines = [
        f"Test accuracy: merge {pct_mean_se(head['merge_test_mean'], head['merge_test_se'], n)}, plain "
        f"{pct_mean_se(head['plain_test_mean'], head['plain_test_se'], n)} (chance {pct(head['chance'])}); merge - plain "
        f"{head['test_diff_text']} points. Last validation: merge - plain "
        f"{seed_gap_text(head['val_diff'], head['val_diff_se'], n)} points."
    ]
    weights = head["weights_max_abs_diff"]
    if not head["arms_differ"]:
        lines.append(
            "The merged running variances equal the plain ones in every channel: the merge did nothing in these "
            "runs, so the accuracy comparison above is vacuous."
        )
    else:
        same = "the same weights" if weights == 0 else f"weights apart by at most {weights:.1e}"
        lines.append(
            f"The arms do differ, and only where Algorithm 2 acts: their final models have {same}, while the "
            f"merged running variances lie above the plain ones by {head['var_excess_mean']:.1e} of the "
            f"variance on average over the {head['bn_channels']} BatchNorm channels (at most "
            f"{head['var_excess_max']:.1e}): the between-learner term mean (m_j - m)^2 is that small beside "
            "the learners' own variances, because both learners draw their batches from one distribution and "
            "their running statistics are averages over many batches."
        )
    word = head["test_call"]
    lines.append(
        "So on this set Algorithm 2's merge of BatchNorm statistics "
        + ("changes test accuracy " + word.replace("a gain", "upward").replace("a loss", "downward")
           if word != "within noise" else "makes no difference to test accuracy that these seeds can resolve")
        + f" (n = {n}); the paper reports Algorithm 2 only together with the merged Adam moments (AAVG3), "
        "so it has no figure for this switch alone."
    )  # fmt: skip
    return lines


def plot(res: dict):
    fig, (ax,) = new_figure(1, width=6.0)
    for arm, style in (("merge", "-"), ("plain", "--")):
        for i, r in enumerate(res["runs"][arm]):
            curve = [100 * v for v in r["val_curve"]]
            ax.plot(range(1, len(curve) + 1), curve, style, color=f"C{i}", marker=".",
                    label=f"{arm}, seed {r['seed']}")  # fmt: skip
    ax.set_xlabel("validation (one per round)")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title("AAVG with trained BatchNorm, CPU: merge vs plain mean of running stats")
    ax.legend(fontsize=7)
    return fig


# ------------------------------------------------------------------------------------------ the runs
def _config(size: dict, storage: str, arm: str, seed: int):
    from raytrain_seq.config import Config

    return Config.from_preset(
        "demo", norm="batchnorm", merge_bn_stats=ARMS[arm], max_videos=size["videos"], epochs=size["epochs"],
        storage_path=storage, run_name=f"{arm}-s{seed}", seed=seed, tracker="none", checkpoint_every=10**9,
        keep_checkpoints=1,
    )  # fmt: skip


def _run(config) -> tuple[dict, dict]:
    """One job run's numbers and its final averaged model (state key -> tensor); a run that fails is tried
    once more (a worker lost on a busy box), and the second failure is raised."""
    from raytrain_seq import checkpoint
    from raytrain_seq.runtime.driver import run

    began = time.perf_counter()
    try:
        summary = run(config)
    except Exception as exc:
        logger.warning("run %s failed (%r); trying it once more", config.run.run_name, exc)
        print(f"{config.run.run_name} failed ({type(exc).__name__}); trying it once more", flush=True)
        config.run.run_name += "-again"
        summary = run(config)
    final = checkpoint.load_latest(config.run_dir())
    if final is None:
        raise RuntimeError(f"{config.run_dir()} holds no checkpoint: the final model cannot be compared")
    curve = [h["accuracy"] for h in summary.val_accuracy_history if h["accuracy"] is not None]
    losses = [h["loss"] for h in summary.loss_history]
    out = {
        "seed": config.data.seed, "test": summary.test_accuracy, "val": curve[-1] if curve else None,
        "val_curve": curve, "loss": losses[-1] if losses else None, "steps": summary.steps,
        "epochs": float(summary.epochs), "rounds": summary.rounds, "wall_s": time.perf_counter() - began,
        "load": load_average(),
    }  # fmt: skip
    return out, {k: v.detach().cpu() for k, v in final.state.params.items()}


def run(size_name: str, seeds: list[int] | None = None) -> dict:
    """Per seed the merge run, then the plain run (seeds outermost: a shared box's load falls on both
    arms alike), and the comparison of their final models."""
    size = dict(SIZES[size_name])
    if seeds is not None:
        size["seeds"] = list(seeds)
    storage = tempfile.mkdtemp(prefix="bench-bn-merge-")
    began = time.perf_counter()
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    checks = []
    try:
        with local_ray(4):
            for seed in size["seeds"]:
                models = {}
                for arm in ARMS:
                    out, models[arm] = _run(_config(size, storage, arm, seed))
                    runs[arm].append(out)
                    print(f"{arm} seed {seed}: test {pct(out['test'])}, val {pct(out['val'])}, {out['steps']} "
                          f"steps, {out['wall_s']:.0f} s, load {out['load']:.1f}", flush=True)  # fmt: skip
                checks.append(bn_compare(models["merge"], models["plain"]))
    finally:
        shutil.rmtree(storage, ignore_errors=True)  # the runs' folders: the numbers are read
    from raytrain_seq.config import Config

    classes = Config.from_preset("demo").data.num_classes
    return {"size": size, "seeds": size["seeds"], "runs": runs, "checks": checks, "chance": 1 / classes,
            "wall_s": time.perf_counter() - began}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_flags(parser)
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="replace the size's seeds")
    parser.add_argument("--json", action="store_true", help="print the headline as one JSON last line")
    args = parser.parse_args(argv)
    res = run(args.size, args.seeds)
    header, rows = table(res)
    head = headline(res)
    s, loads = res["size"], [r["load"] for arm in res["runs"].values() for r in arm]
    notes = [
        f"Every run: raytrain_seq.runtime.driver.run on a local Ray cluster (num_cpus=4, CPU only), the demo preset "
        f"(2 learners of 1 CPU thread, the small model at width 16 and depth 3, B = 4 blocks, micro-batches of 4, "
        f"learning rate 3e-3, one averaging round and one validation per epoch) with --norm batchnorm (BatchNorm2d "
        f"after each of its 3 convolutions, momentum 0.1), {s['videos']} synthetic training videos (validation "
        f"and test up to as many), {s['epochs']} epochs; seeds {res['seeds']}; the arms differ only in "
        "train.merge_bn_stats. 'test' is the final model's test top-1, 'last val' the last validation's; a "
        "difference is paired by seed (mean and se = std / sqrt(n) of the per-seed differences) and called a "
        "gain or a loss only when n >= 3 and |difference| > se. The summary records no validation loss: the "
        "last column of the second table is the training loss the learners reported at the last round.",
        f"Machine: CPU only; 1-minute load average {min(loads):.1f} to {max(loads):.1f} at the ends of the runs; "
        f"whole run {res['wall_s'] / 60:.1f} min.",
    ]
    result = Result(
        name="bn_merge",
        title="AAVG Algorithm 2 with BatchNorm that trains: merged running statistics against their plain mean "
        "(`bench/bn_merge.py`)",
        command=command_line(argv, "bn_merge.py"), size=args.size, header=header, rows=rows, notes=notes,
        verdicts=verdicts(res), headline=head, extra_tables=[check_table(res)],
    )  # fmt: skip
    write_results(result, args.results, try_plot(plot, res))
    if args.json:
        print(json.dumps(head, default=float), flush=True)
    return head


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
