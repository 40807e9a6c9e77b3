"""BLoad Table I on the synthetic set: naive padding vs sampling vs mix pad vs chunk vs bload vs optimal packing.

The paper's Table I columns (padding frames, frames deleted, time per epoch, recall@20; here top-1 and
top-5 accuracy) for the job's model trained on the synthetic set with each strategy, same epochs, seed
and initial weights, single process, no Ray (the job's ``assemble_rows`` and ``step.InnerStep``),
round-robin within each epoch. Two times per epoch: the job's model never encodes padding; beside it
``EncodeEveryFrame`` encodes every frame as the paper's model did. ``sampling`` is the paper's baseline
(pieces of round(mean length), every tail and shorter video deleted: ``benchlib.sampling_plan``);
``chunk`` keeps shorter videos whole; ``mix`` is the paper's "mix pad" (``benchlib.mix_pad_plan``).
Equal optimizer steps per epoch and micro-batch frame budget for all; accuracy on whole test videos.

    python bench/bload_table.py [--tiny | --full]   # 1000 videos, 5 epochs; seconds; 3000 videos, 10
    python bench/bload_table.py --videos 300 --epochs 3 --runs 3   # make bench and the README: 3 seeds
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    SAMPLING_SENTENCE,
    LocalData,
    Result,
    add_size_flags,
    command_line,
    fmt,
    load_average,
    machine_info,
    mean_se,
    new_figure,
    seed_gap_text,
    try_plot,
    write_results,
)

from raytrain_seq.config import Config
from raytrain_seq.models.factory import build_model_for
from raytrain_seq.training.evaluation import evaluate
from raytrain_seq.training.step import InnerStep, build_optimizer

logger = logging.getLogger(__name__)

STRATEGIES = ("pad", "sampling", "mix", "chunk", "bload", "optimal")
CUTTING = ("sampling", "mix", "chunk")  # the baselines that cut at round(mean length)
TOP_K = 5  # evaluate's top-5 accuracy stands in for the paper's recall@20 (5 of 10 synthetic classes)
# Table I of the paper: naive padding ("0 padding"), sampling, mix pad, block pad (BLoad).
PAPER = {
    "padding": {"pad": 534_831, "sampling": 0, "mix": 37_712, "bload": 3_695},
    "deleted": {"sampling": 92_271, "mix": 40_289},
    "minutes": {"pad": 170, "sampling": 18, "mix": 40, "bload": 41},
    "recall": {"sampling": 41.2, "mix": 42.1, "bload": 43.3},
    "train_frames": 166_785,  # Action Genome training set
}
SIZES = {
    "tiny": {"videos": 30, "epochs": 1, "batch": 2},
    "default": {"videos": 1000, "epochs": 5, "batch": 4},
    "full": {"videos": 3000, "epochs": 10, "batch": 4},
}


def steps_and_rows(blocks: dict[str, int], reference: str, batch: int) -> tuple[int, dict[str, list[int]]]:
    """Steps per epoch (the reference's ``ceil(blocks / batch)``) and each strategy's rows per step.

    Every strategy's blocks are cut into exactly that many steps, sizes differing by at most one (the
    larger first). Blocks {optimal: 50, pad: 200} at batch 4: 13 steps; optimal 11 steps of 4 and 2 of
    3; pad 5 steps of 16 and 8 of 15. A strategy with fewer blocks than steps gets one row a step.
    """
    if batch < 1 or reference not in blocks:
        raise ValueError(
            f"batch must be >= 1 and reference one of {sorted(blocks)}, got {batch}, {reference!r}"
        )
    steps = math.ceil(blocks[reference] / batch)
    rows = {}
    for name, n in blocks.items():
        parts = min(steps, n)
        base, extra = divmod(n, parts)
        rows[name] = [base + 1] * extra + [base] * (parts - extra)
    return steps, rows


def micro_rows(micro: int, t_max_reference: int, t_max: int) -> int:
    """Rows per micro-batch holding the same frame budget: 4 rows of 222 frames -> 38 rows of 23."""
    return max(1, (micro * t_max_reference) // t_max)


def chunk_t_max(lengths: np.ndarray) -> int:
    """The cutting baselines' piece length: the mean sequence length, rounded (as in the paper)."""
    return max(1, round(float(np.mean(lengths))))


class _PaddedEncoder(nn.Module):
    """The frame encoder, given ``extra`` zero frames beside the real ones in the same batched call."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.out_dim, self.extra = inner, inner.out_dim, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        real = x.shape[0]
        if self.extra:
            x = torch.cat([x, x.new_zeros(self.extra, *x.shape[1:])])
        return self.inner(x)[:real]


class EncodeEveryFrame(nn.Module):
    """The job's model made to encode every frame of its rows, padding included, as the paper's DDS does:
    each forward encodes ``rows x t_max`` frames (the real ones, then the padding as zero frames, in one
    call) and drops the padding's features, so the logits are the job's model's and the cost is the
    paper's. Rows of 3 x 100 frames holding 240 real ones encode 300 frames instead of 240."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        model.encoder = _PaddedEncoder(model.encoder)
        self.model = model

    def forward(self, frames, starts, lengths, num_sequences):
        real = int(lengths.clamp(min=0).sum())
        self.model.encoder.extra = frames.shape[0] * frames.shape[1] - real
        return self.model(frames, starts, lengths, num_sequences)


class Arm:
    """One strategy's model (``every_frame``: wrapped in ``EncodeEveryFrame``), optimizer and tallies."""

    def __init__(
        self, name: str, config: Config, data: LocalData, t_max: int, micro: int, every_frame: bool = False
    ) -> None:
        self.name, self.t_max, self.every_frame = name, t_max, every_frame
        torch.manual_seed(config.data.seed)  # the same initial weights for every strategy
        model = build_model_for(config.model, num_classes=data.num_classes, in_channels=3)
        self.model = EncodeEveryFrame(model) if every_frame else model
        optimizer = build_optimizer("adam", self.model.parameters(), lr=config.train.lr)
        self.step = InnerStep(self.model, optimizer, micro_batch_size=micro)
        self.micro = micro
        self.seconds: list[float] = []
        self.frames = self.steps = self.sequences = 0
        self.stats: dict | None = None
        self.rows_per_step = 0.0
        self.losses: list[float] = []

    def train_epoch(self, data: LocalData, arrays, epoch: int, rows_per_step: list[int]) -> None:
        plan = data.epoch_plan(self.name, epoch, self.t_max)
        if self.stats is None:
            self.stats = plan.stats()
        began = time.perf_counter()
        loss_sum = seqs = 0.0
        for batch in data.rows("train", plan, arrays, epoch=epoch, batch_rows=rows_per_step, center=False):
            out = self.step(batch)
            self.frames += out.frames
            self.sequences += out.sequences
            self.steps += 1
            loss_sum += out.loss * out.sequences
            seqs += out.sequences
        self.seconds.append(time.perf_counter() - began)
        self.losses.append(loss_sum / max(seqs, 1))


def build_arms(args: argparse.Namespace, config: Config, data: LocalData) -> tuple[dict, dict]:
    """Per strategy: the job's model (``arms``) and the same model encoding every frame (``dense``)."""
    t_max = {name: data.t_max for name in STRATEGIES}
    for name in CUTTING:
        t_max[name] = chunk_t_max(data.catalogs["train"].lengths)

    def arm(name: str, every_frame: bool) -> Arm:
        return Arm(
            name, config, data, t_max[name], micro_rows(args.micro, data.t_max, t_max[name]), every_frame
        )

    arms = {name: arm(name, False) for name in args.strategies}
    dense = {name: arm(name, True) for name in args.strategies} if args.every_frame else {}
    return arms, dense


def train_all(data: LocalData, arms: dict, dense: dict, epochs: int, batch: int) -> float:
    """Every epoch: the partial augmentations once (untimed), then each strategy's two models in turn on
    the same steps per epoch (so load on a shared machine hits them alike). Returns the untimed seconds."""
    ids = data.catalogs["train"].ids
    partial_s = 0.0
    for epoch in range(epochs):
        began = time.perf_counter()
        arrays = {int(v): data.partial(int(v), epoch) for v in ids}
        partial_s += time.perf_counter() - began
        blocks = {name: len(data.epoch_plan(name, epoch, a.t_max).blocks) for name, a in arms.items()}
        reference = "optimal" if "optimal" in blocks else next(iter(blocks))
        steps, rows = steps_and_rows(blocks, reference, batch)
        for name, arm in arms.items():
            for each in (arm, dense.get(name)):
                if each is not None:
                    each.rows_per_step = float(np.mean(rows[name]))
                    each.train_epoch(data, arrays, epoch, rows[name])
        print(
            f"epoch {epoch + 1}/{epochs}: {steps} steps; "
            + ", ".join(
                f"{n} {a.seconds[-1]:.1f} s"
                + (f" ({dense[n].seconds[-1]:.1f} s every frame)" if n in dense else "")
                for n, a in arms.items()
            ),
            flush=True,
        )
    return partial_s


def score(data: LocalData, arm: Arm, dense: Arm | None, epochs: int) -> dict:
    """One strategy's row of the table: plan stats, times, rates and test accuracy (whole test videos; a
    cutting baseline also on test pieces cut like its training)."""
    test = evaluate(arm.model, data.eval_batches("test"), micro_batch_size=16)
    entry = {
        "t_max": arm.t_max, "stats": arm.stats, "rows_per_step": arm.rows_per_step, "micro_rows": arm.micro,
        "steps_per_epoch": arm.steps / epochs, "epoch_s": float(np.mean(arm.seconds)),
        "frames_per_s": arm.frames / sum(arm.seconds), "test_accuracy": test.accuracy,
        "test_top_k": test.top5_accuracy, "test_sequences": test.sequences, "final_loss": arm.losses[-1],
    }  # fmt: skip
    if dense is not None:
        entry["epoch_s_every_frame"] = float(np.mean(dense.seconds))
        entry["test_accuracy_every_frame"] = evaluate(
            dense.model, data.eval_batches("test"), micro_batch_size=16
        ).accuracy
    if arm.name in CUTTING:
        cut = data.eval_batches("test", strategy=arm.name, t_max=arm.t_max)
        pieces = evaluate(arm.model, cut, micro_batch_size=16)
        entry["piece_accuracy"], entry["piece_sequences"] = pieces.accuracy, pieces.sequences
    return entry


def run(args: argparse.Namespace, seed: int) -> dict:
    """One run of every strategy at ``seed`` (the synthetic set, the plans and the initial weights)."""
    size = SIZES[args.size]
    videos = args.videos or size["videos"]
    epochs = args.epochs or size["epochs"]
    batch = args.batch or size["batch"]
    torch.set_num_threads(args.threads)
    config = Config.from_preset(
        "demo",
        max_videos=videos,
        epochs=epochs,
        batch_size=batch,
        micro_batch_size=args.micro,
        seed=seed,
    )
    data = LocalData(config)
    arms, dense = build_arms(args, config, data)
    before = load_average()
    partial_s = train_all(data, arms, dense, epochs, batch)
    results = {name: score(data, arm, dense.get(name), epochs) for name, arm in arms.items()}
    return {
        "results": results, "videos": len(data.catalogs["train"]), "test_videos": len(data.catalogs["test"]),
        "epochs": epochs, "batch": batch, "t_max": data.t_max, "top_k": TOP_K, "classes": data.num_classes,
        "partial_s": partial_s, "threads": args.threads, "every_frame": bool(dense), "seed": seed,
        "load": [before, load_average()],
    }  # fmt: skip


def run_all(args: argparse.Namespace) -> dict:
    """``args.runs`` runs one after another (seeds ``args.seed``, ``args.seed + 1``, ...; within each the
    strategies take turns every epoch, so load hits them alike), and their mean per strategy."""
    runs = []
    for i in range(args.runs):
        print(f"run {i + 1}/{args.runs}, seed {args.seed + i}, load average {load_average():.2f}", flush=True)
        runs.append(run(args, args.seed + i))
    merged = {**runs[0], "results": _mean_tree([r["results"] for r in runs]), "runs": runs}
    merged["partial_s"] = float(np.mean([r["partial_s"] for r in runs]))
    return merged


def _mean_tree(items: list):
    """The mean of same-shaped results, leaf by leaf; an int leaf equal in every item stays that int."""
    first = items[0]
    if isinstance(first, dict):
        return {k: _mean_tree([i[k] for i in items]) for k in first if all(k in i for i in items)}
    if isinstance(first, bool | str | list) or first is None:
        return first
    if isinstance(first, int) and all(i == first for i in items):
        return first
    return float(np.mean(items))


def _per_run(res: dict, strategy: str, *keys: str) -> list[float]:
    """One figure of ``strategy`` in every run: ``_per_run(res, "pad", "stats", "padding")``."""
    out = []
    for one in res["runs"]:
        value = one["results"][strategy]
        for key in keys:
            value = value[key]
        out.append(float(value))
    return out


def put(head: dict, key: str, values: list[float]) -> tuple[float | None, float | None]:
    """Headline ``key``: the mean over runs, beside it ``key_se`` (the standard error over runs; None for
    one run), ``key_n`` and ``key_runs`` (each run's value). Returns (mean, se)."""
    mean, se = mean_se(values)
    head.update({key: mean, f"{key}_se": se, f"{key}_n": len(values), f"{key}_runs": list(values)})
    return mean, se


def pm(mean: float | None, se: float | None, spec: str, unit: str = "") -> str:
    """'3.43x +- 0.05x'; without a standard error (one run) '3.43x'."""
    if mean is None:
        return "n/a"
    return f"{mean:{spec}}{unit}" + ("" if se is None else f" +- {se:{spec}}{unit}")


def runs_phrase(n: int) -> str:
    """'one run' or 'mean +- se over 3 runs'."""
    return "one run" if n == 1 else f"mean +- se over n = {n} runs"


def _cut(pad: float, own: float) -> float:
    return pad / own if own else float("inf")


def padding_verdicts(res: dict, head: dict) -> list[str]:
    """Naive padding's padding over each packer's (named), per run, beside the paper's 145x."""
    r = res["results"]
    if "pad" not in r:
        return []
    paper_cut = PAPER["padding"]["pad"] / PAPER["padding"]["bload"]
    pad = _per_run(res, "pad", "stats", "padding")
    parts = []
    for name, label in (
        ("bload", "bload (the paper's random fill)"),
        ("optimal", "optimal (the job's default packer)"),
        ("mix", "mix pad"),
    ):
        if name in r:
            own = _per_run(res, name, "stats", "padding")
            cuts = [_cut(p, o) for p, o in zip(pad, own, strict=True)]
            mean, se = put(head, f"padding_cut_{name}", cuts)
            if name == "mix":
                paper = f"the paper's mix pad {PAPER['padding']['pad'] / PAPER['padding']['mix']:.0f}x"
            else:
                word = "above" if min(cuts) > paper_cut else "below" if max(cuts) < paper_cut else "around"
                paper = f"{word} the paper's {paper_cut:,.0f}x on Action Genome"
            parts.append(f"{label} {np.mean(own):,.0f}, {pm(mean, se, ',.1f', 'x')} less ({paper})")
    return [
        f"Padding ({runs_phrase(len(pad))}, each run its own synthetic set): naive padding adds "
        f"{np.mean(pad):,.0f} frames per epoch; " + "; ".join(parts) + "."
    ]


def deleted_verdicts(r: dict) -> list[str]:
    """Frames each strategy deletes (mean over runs): none for the packers, the baselines' share beside the
    paper's."""
    deleted = {n: r[n]["stats"]["deleted"] for n in r}
    kept = [n for n in ("bload", "optimal", "pad") if n in deleted]
    if not kept:
        return []
    zero = all(deleted[n] == 0 for n in kept)
    line = f"Frames deleted: {', '.join(f'{n} {deleted[n]:,.0f}' for n in kept)}" + (
        " (none, as in the paper)" if zero else " (NOT zero: a defect)"
    )
    total = PAPER["train_frames"]
    how = {
        "sampling": f"the paper's sampling deleted {PAPER['deleted']['sampling'] / total:.0%} of its frames, 0 padding",
        "mix": f"the paper's mix pad deleted {PAPER['deleted']['mix'] / total:.0%} and padded "
        f"{PAPER['padding']['mix'] / total:.0%} of its frames",
        "chunk": "it keeps short videos whole and pads them: not a baseline of the paper",
    }
    for name in ("sampling", "mix", "chunk"):
        if name in deleted:
            st = r[name]["stats"]
            frames = st["frames"] + deleted[name]
            line += (
                f"; {name} deletes {deleted[name]:,.0f} ({deleted[name] / frames:.0%} of the frames) and pads "
                f"{st['padding']:,.0f} ({st['padding'] / frames:.0%}; {how[name]})"
            )
    return [line + "."]


def time_verdicts(res: dict, head: dict) -> list[str]:
    """Time per epoch against naive padding, per run: like for like (every frame encoded) and with the
    job's model."""
    out, r = [], res["results"]
    minutes = PAPER["minutes"]
    n = len(res["runs"])
    if all("epoch_s_every_frame" in r.get(k, {}) for k in ("pad", "bload")):
        dense = {k: _per_run(res, k, "epoch_s_every_frame") for k in r if "epoch_s_every_frame" in r[k]}
        parts = []
        for name in ("bload", "optimal"):
            if name in dense:
                ratios = [a / b for a, b in zip(dense["pad"], dense[name], strict=True)]
                parts.append(
                    f"naive / {name} "
                    + pm(*put(head, f"epoch_speedup_{name}_vs_pad_every_frame", ratios), ".2f", "x")
                )
        line = (
            "Time per epoch on this machine's CPU, like for like (the model encodes every frame it is given, as "
            f"the paper's DDS does; {runs_phrase(n)}): "
            + ", ".join(parts)
            + f" (the paper, on 8 A100 GPUs: naive / block pad {minutes['pad'] / minutes['bload']:.1f}x)"
        )
        for base in ("mix", "sampling"):
            if base in dense:
                ratios = [a / b for a, b in zip(dense[base], dense["bload"], strict=True)]
                text = pm(*put(head, f"epoch_ratio_{base}_vs_bload_every_frame", ratios), ".2f", "x")
                line += f"; {base} / bload {text} (the paper, GPUs: {minutes[base] / minutes['bload']:.2f}x)"
        out.append(line + ".")
    if "pad" in r and "bload" in r:
        ratios = [
            a / b
            for a, b in zip(_per_run(res, "pad", "epoch_s"), _per_run(res, "bload", "epoch_s"), strict=True)
        ]
        text = pm(*put(head, "epoch_speedup_bload_vs_pad", ratios), ".2f", "x")
        out.append(
            f"Time per epoch with the job's model on the CPU (it gathers the real frames and never encodes padding; "
            f"{runs_phrase(n)}): naive / bload {text}, since padding costs it only row assembly and per-row "
            "overhead; that model's gain is in compute never spent, which the like-for-like column shows the "
            "paper's kind of model pays."
        )
    return out


def accuracy_levels(res: dict, head: dict) -> list[str]:
    """Each strategy's test accuracy on whole test videos, mean +- se over the runs' seeds, beside chance."""
    chance = 1 / res["classes"]
    head["chance"] = chance
    parts = []
    for name in res["results"]:
        mean, se = put(head, f"test_accuracy_{name}", _per_run(res, name, "test_accuracy"))
        parts.append(f"{name} {pm(100 * mean, None if se is None else 100 * se, '.1f')} %")
    n = len(res["runs"])
    return [
        f"Test accuracy after {res['epochs']} epochs on the {res['test_videos']} whole test videos "
        f"({runs_phrase(n).replace('runs', 'seeds')}; chance {100 * chance:.0f} %): "
        + ", ".join(parts)
        + ". "
        + chance_sentence(head, list(res["results"]), n)
    ]


def chance_sentence(head: dict, names: list[str], n: int) -> str:
    """Which arms this size leaves near chance (mean within two se of it, or one seed only), and so whether
    it can show accuracy at all: the accuracy gaps below compare with a baseline at chance otherwise."""
    chance = head["chance"]
    near = [
        name
        for name in names
        if head[f"test_accuracy_{name}_se"] is None
        or head[f"test_accuracy_{name}"] - 2 * head[f"test_accuracy_{name}_se"] <= chance
    ]
    if n < 3:
        return f"Over {n} seed(s) this run cannot show accuracy (a gain or a loss needs 3 or more)."
    if {"sampling", "mix"} & set(near):
        return (
            f"Within two se of chance: {', '.join(near)}; this size cannot show accuracy against the paper's "
            "baselines (they barely learn in it), so the gaps below say how far a packer got past an arm at "
            "chance, not the paper's comparison."
        )
    return f"Within two se of chance: {', '.join(near) or 'none'}."


def accuracy_verdicts(res: dict, head: dict) -> list[str]:
    """Each packer's test accuracy against the cutting baselines, paired by seed: the mean difference, its
    standard error over seeds and ``seed_word``'s call (a gain or a loss only over 3 seeds or more)."""
    out, r = [], res["results"]
    labels = {
        "sampling": "the paper's sampling baseline (the paper's comparison: block pad +2.1 recall@20 over it)",
        "mix": "the paper's mix pad (the paper: block pad +1.2 recall@20 over it)",
        "chunk": "chunk (pads short videos, deletes only tails: not a baseline of the paper)",
    }
    for baseline, label in labels.items():
        for name in ("bload", "optimal"):
            if baseline not in r or name not in r:
                continue
            gaps = {}
            for metric, key in (("test_accuracy", "accuracy_points"), ("test_top_k", f"top{TOP_K}_points")):
                diffs = [
                    100 * (a - b)
                    for a, b in zip(_per_run(res, name, metric), _per_run(res, baseline, metric), strict=True)
                ]
                mean, se = put(head, f"{key}_{name}_minus_{baseline}", diffs)
                gaps[metric] = seed_gap_text(mean, se, len(diffs))
            head[f"accuracy_{name}_minus_{baseline}_text"] = gaps["test_accuracy"]
            pieces = r[baseline].get("piece_accuracy")
            out.append(
                f"Accuracy against {label}: {name} - {baseline} top-1 {gaps['test_accuracy']} points, paired by "
                f"seed; top-{TOP_K} {gaps['test_top_k']} points"
                + (
                    f"; {baseline} on test pieces cut like its training: {100 * pieces:.1f} %."
                    if pieces is not None
                    else "."
                )
            )
    return out


def verdicts(res: dict) -> tuple[list[str], dict]:
    """Sentences comparing the measured numbers with the paper's Table I and with the baselines, and the
    headline: each figure's mean over runs with its se, n and per-run values."""
    head: dict = {}
    lines = (
        padding_verdicts(res, head)
        + deleted_verdicts(res["results"])
        + time_verdicts(res, head)
        + accuracy_levels(res, head)
        + accuracy_verdicts(res, head)
    )
    loads = [x for one in res["runs"] for x in one["load"]]
    head.update(
        runs=len(res["runs"]), seeds=[one["seed"] for one in res["runs"]], load=[min(loads), max(loads)]
    )
    return lines, head


def _count(value: float) -> str:
    """A count, or a mean count over runs: 79 -> '79', 79.33 -> '79.3'."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def table(res: dict) -> tuple[list[str], list[list[str]]]:
    header = [
        "strategy", "t_max", "blocks", "padding frames", "padding %", "frames deleted", "sequences cut",
        "rows/step", "steps/epoch", "time/epoch s (real frames)", "time/epoch s (every frame)",
        "useful frames/s", "test accuracy", f"test top-{res.get('top_k', TOP_K)}",
    ]  # fmt: skip
    rows = []
    for name, e in res["results"].items():
        s = e["stats"]

        def spread(*keys: str, scale: float = 1.0, spec: str = ".2f", unit: str = "", name=name) -> str:
            mean, se = mean_se([scale * v for v in _per_run(res, name, *keys)])
            return pm(mean, se, spec, unit)

        rows.append(
            [
                name, str(e["t_max"]), _count(s["blocks"]), _count(s["padding"]), f"{100 * s['padding_fraction']:.2f}",
                _count(s["deleted"]), _count(s["cut"]), fmt(e["rows_per_step"], ".1f"), fmt(e["steps_per_epoch"], ".0f"),
                spread("epoch_s"), spread("epoch_s_every_frame") if "epoch_s_every_frame" in e else "n/a",
                fmt(e["frames_per_s"], ",.0f"), spread("test_accuracy", scale=100, spec=".1f", unit=" %"),
                spread("test_top_k", scale=100, spec=".1f", unit=" %"),
            ]
        )  # fmt: skip
    return header, rows


def plot(res: dict):
    fig, (a1, a2, a3) = new_figure(3, width=4.2)
    names = list(res["results"])
    r = res["results"]
    colours = ["#999999" if n in ("pad", *CUTTING) else "#1f77b4" for n in names]
    a1.bar(names, [max(r[n]["stats"]["padding"], 1) for n in names], color=colours)
    a1.set_yscale("log")
    a1.set_title("padding frames per epoch (log)")
    x = np.arange(len(names))
    a2.bar(x - 0.2, [r[n]["epoch_s"] for n in names], width=0.4, color=colours, label="real frames")
    a2.bar(x + 0.2, [r[n].get("epoch_s_every_frame", 0) for n in names], width=0.4, color="#ff7f0e",
           label="every frame")  # fmt: skip
    a2.set_xticks(x, names)
    a2.legend(fontsize=7)
    a2.set_title("time per epoch (s)")
    a3.bar(names, [100 * r[n]["test_accuracy"] for n in names], color=colours)
    a3.set_title("test accuracy (%), whole videos")
    fig.suptitle(
        f"BLoad Table I on the synthetic set ({res['videos']} videos, {res['epochs']} epochs, "
        f"mean of {len(res['runs'])} run(s), CPU)"
    )
    return fig


def _machine_words() -> str:
    info = machine_info()
    return (
        f"{info['cpu']}, {info['cores']} CPU cores, no GPU"
        if info["gpu"] == "none"
        else f"{info['cpu']}, GPU {info['gpu']}"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_flags(parser)
    parser.add_argument("--videos", type=int, default=None, help="training videos (default: by size)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs (default: by size)")
    parser.add_argument("--batch", type=int, default=None, help="optimal's rows per step (default: by size)")
    parser.add_argument("--micro", type=int, default=4, help="micro-batch: rows of the longest t_max")
    parser.add_argument("--seed", type=int, default=0, help="the first run's seed")
    parser.add_argument(
        "--runs", type=int, default=1, help="runs, one after another, at seeds --seed, --seed + 1, ..."
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: what a learner gets)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument(
        "--no-every-frame", dest="every_frame", action="store_false", help="skip the every-frame models"
    )
    args = parser.parse_args(argv)
    for name in ("videos", "epochs", "batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    if args.micro < 1 or args.threads < 1 or args.runs < 1:
        parser.error("--micro, --threads and --runs must be >= 1")
    res = run_all(args)
    header, rows = table(res)
    lines, head = verdicts(res)
    notes = [
        f"{res['videos']} training videos, {res['test_videos']} test videos, {res['epochs']} epochs, "
        f"{len(res['runs'])} run(s) at seeds {head['seeds']} (each seed its own synthetic set, plans and initial "
        "weights; the table's counts and rates are means over the runs, its times and accuracies mean +- se), "
        f"t_max {res['t_max']} in the first run (the longest video; sampling, mix and chunk: round(mean length)), "
        f"{res['threads']} "
        "torch thread(s), one process, no Ray: the pipeline's row assembly and the learner's InnerStep, "
        "not 4 Ray jobs (much cheaper; the Ray path adds the same per-row work for every strategy).",
        "Every strategy takes the same optimizer steps per epoch (rows per step scale with its blocks) and "
        "the same micro-batch frame budget; the partial augmentation (computed once per epoch for all "
        f"strategies, {res['partial_s']:.1f} s in total) is outside 'time/epoch'.",
        "'padding frames' counts one epoch's plan (epoch 0); bload's count varies by seed.",
        "Machine: "
        + _machine_words()
        + "; the 1-minute load average before and after each run: "
        + ", ".join(f"seed {one['seed']} {one['load'][0]:.1f} -> {one['load'][1]:.1f}" for one in res["runs"])
        + ". Times are wall-clock, so load moves them; the ratios compare arms that took turns every epoch.",
        "'time/epoch s (every frame)': the same model, steps and rows made to encode every frame of its rows "
        "(EncodeEveryFrame: the padding as zero frames in the encoder's batched call, their features dropped), "
        "trained from the same initial weights beside the job's model; its test accuracy is the job's model's "
        "within float rounding (in the JSON).",
        f'sampling is the paper\'s baseline (its Fig. 4 caption: "{SAMPLING_SENTENCE}"; Table I: 0 padding): '
        "pieces of exactly round(mean length) frames, tails and shorter videos deleted. mix is the paper's 'mix "
        "pad' as Table I's counts pin it (deleted + padding = videos x 22 frames, its mean length): each video "
        "padded or trimmed to one sample of round(mean length) frames. chunk keeps shorter videos whole and "
        "pads them.",
        f"test top-{res['top_k']}: the label among the {res['top_k']} highest logits of {res['classes']} classes, the "
        "classification stand-in for the paper's recall@20 (a scene-graph metric).",
    ]
    result = Result(
        name="bload_table",
        title="BLoad Table I: packing strategies on the synthetic set (`bench/bload_table.py`)",
        command=command_line(argv, "bload_table.py"),
        size=args.size,
        header=header,
        rows=rows,
        notes=notes,
        verdicts=lines,
        headline=head,
    )
    write_results(result, args.results, try_plot(plot, res))
    return res


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
