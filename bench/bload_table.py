"""BLoad Table I on the synthetic set: naive padding vs sampling vs mix pad vs chunk vs bload vs optimal packing.

The paper's Table I columns (padding frames, frames deleted, time per epoch, recall@20; here top-1 and
top-5 accuracy) for the job's model trained on the synthetic set with each strategy, same epochs, seed
and initial weights, single process, no Ray (the job's ``assemble_rows`` and ``step.InnerStep``),
round-robin within each epoch. Two times per epoch: the job's model never encodes padding; beside it
``EncodeEveryFrame`` encodes every frame as the paper's model did. ``sampling`` is the paper's baseline
(pieces of round(mean length), every tail and shorter video deleted: ``benchlib.sampling_plan``);
``chunk`` keeps shorter videos whole; ``mix`` is the paper's "mix pad" (``benchlib.mix_pad_plan``).
Equal optimizer steps per epoch and micro-batch frame budget for all; accuracy on whole test videos.

    python bench/bload_table.py            # default size (the one make bench runs)
    python bench/bload_table.py --tiny     # seconds (tests)
    python bench/bload_table.py --full     # the demo's 3000 videos, 10 epochs
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
    compare_accuracy,
    fmt,
    new_figure,
    try_plot,
    write_results,
)

from raytrain_seq.config import Config
from raytrain_seq.models.factory import build_model_for
from raytrain_seq.training.step import InnerStep, build_optimizer, evaluate

logger = logging.getLogger(__name__)

STRATEGIES = ("pad", "sampling", "mix", "chunk", "bload", "optimal")
CUTTING = ("sampling", "mix", "chunk")  # the baselines that cut at round(mean length)
TOP_K = 5  # step.evaluate's top-5 accuracy stands in for the paper's recall@20 (5 of 10 synthetic classes)
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


def run(args: argparse.Namespace) -> dict:
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
        seed=args.seed,
    )
    data = LocalData(config)
    arms, dense = build_arms(args, config, data)
    partial_s = train_all(data, arms, dense, epochs, batch)
    results = {name: score(data, arm, dense.get(name), epochs) for name, arm in arms.items()}
    return {
        "results": results, "videos": len(data.catalogs["train"]), "test_videos": len(data.catalogs["test"]),
        "epochs": epochs, "batch": batch, "t_max": data.t_max, "top_k": TOP_K, "classes": data.num_classes,
        "partial_s": partial_s, "threads": args.threads, "every_frame": bool(dense),
    }  # fmt: skip


def _times(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:,.1f}x"


def padding_verdicts(r: dict, head: dict) -> list[str]:
    """Naive padding's padding over each packer's (named), beside the paper's 145x."""
    if "pad" not in r:
        return []
    paper_cut = PAPER["padding"]["pad"] / PAPER["padding"]["bload"]
    pad = r["pad"]["stats"]["padding"]
    parts = []
    for name, label in (
        ("bload", "bload (the paper's random fill)"),
        ("optimal", "optimal (the job's default packer)"),
    ):
        if name in r:
            own = r[name]["stats"]["padding"]
            cut = pad / own if own else float("inf")
            head[f"padding_cut_{name}"] = cut
            word = "beats" if cut > paper_cut else "trails"
            parts.append(f"{label} {own:,}, {_times(pad, own)} less ({word} the paper's {paper_cut:,.0f}x)")
    if "mix" in r:
        own = r["mix"]["stats"]["padding"]
        paper = PAPER["padding"]["pad"] / PAPER["padding"]["mix"]
        parts.append(f"mix pad {own:,}, {_times(pad, own)} less (the paper's mix pad {paper:.0f}x)")
    return (
        [f"Padding: naive padding adds {pad:,} frames per epoch; " + "; ".join(parts) + "."] if parts else []
    )


def deleted_verdicts(r: dict) -> list[str]:
    """Frames each strategy deletes: none for the packers, the baselines' share beside the paper's."""
    deleted = {n: r[n]["stats"]["deleted"] for n in r}
    kept = [n for n in ("bload", "optimal", "pad") if n in deleted]
    if not kept:
        return []
    zero = all(deleted[n] == 0 for n in kept)
    line = f"Frames deleted: {', '.join(f'{n} {deleted[n]:,}' for n in kept)}" + (
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
                f"; {name} deletes {deleted[name]:,} ({deleted[name] / frames:.0%} of the frames) and pads "
                f"{st['padding']:,} ({st['padding'] / frames:.0%}; {how[name]})"
            )
    return [line + "."]


def time_verdicts(r: dict, head: dict) -> list[str]:
    """Time per epoch against naive padding, like for like (every frame encoded) and with the job's model."""
    out = []
    dense = {n: e["epoch_s_every_frame"] for n, e in r.items() if "epoch_s_every_frame" in e}
    minutes = PAPER["minutes"]
    if "pad" in dense and "bload" in dense:
        pairs = [(n, dense["pad"] / dense[n]) for n in ("bload", "optimal") if n in dense]
        head.update({f"epoch_speedup_{n}_vs_pad_every_frame": v for n, v in pairs})
        line = (
            "Time per epoch, like for like (the model encodes every frame it is given, as the paper's DDS does): "
            + ", ".join(f"naive / {n} {v:.2f}x" for n, v in pairs)
            + f" (the paper: naive / block pad {minutes['pad'] / minutes['bload']:.1f}x)"
        )
        for base in ("mix", "sampling"):
            if base in dense:
                ratio = dense[base] / dense["bload"]
                head[f"epoch_ratio_{base}_vs_bload_every_frame"] = ratio
                line += f"; {base} / bload {ratio:.2f}x (the paper {minutes[base] / minutes['bload']:.2f}x)"
        out.append(line + ".")
    if "pad" in r and "bload" in r:
        speed = r["pad"]["epoch_s"] / r["bload"]["epoch_s"]
        head["epoch_speedup_bload_vs_pad"] = speed
        out.append(
            f"Time per epoch with the job's model (it gathers the real frames and never encodes padding): naive / "
            f"bload {speed:.2f}x, since padding costs it only row assembly and per-row overhead; that model's gain "
            "is in compute never spent, which the like-for-like column shows the paper's kind of model pays."
        )
    return out


def _noise(diff: float, se: float) -> str:
    """compare_accuracy's reading of a gap: within noise below two standard errors."""
    return "within noise" if abs(diff) <= 2 * se else "above noise" if diff > 0 else "below noise"


def accuracy_verdicts(r: dict, head: dict) -> list[str]:
    """Each packer's test accuracy against the cutting baselines, with the standard error of the gap."""
    out = []
    labels = {
        "sampling": "the paper's sampling baseline (the paper's comparison: block pad +2.1 recall@20 over it)",
        "mix": "the paper's mix pad (the paper: block pad +1.2 recall@20 over it)",
        "chunk": "chunk (pads short videos, deletes only tails: not a baseline of the paper)",
    }
    for baseline, label in labels.items():
        if baseline not in r:
            continue
        for name in ("bload", "optimal"):
            if name not in r:
                continue
            n = r[name]["test_sequences"]
            diff, se, word = compare_accuracy(r[name]["test_accuracy"], r[baseline]["test_accuracy"], n)
            k_diff, k_se, _ = compare_accuracy(r[name]["test_top_k"], r[baseline]["test_top_k"], n)
            head[f"accuracy_points_{name}_minus_{baseline}"] = diff
            head[f"accuracy_points_{name}_minus_{baseline}_se"] = se
            head[f"top{TOP_K}_points_{name}_minus_{baseline}"] = k_diff
            head[f"top{TOP_K}_points_{name}_minus_{baseline}_se"] = k_se
            head[f"accuracy_{name}_minus_{baseline}_text"] = f"{diff:+.1f} +- {se:.1f} ({_noise(diff, se)})"
            pieces = r[baseline].get("piece_accuracy")
            out.append(
                f"Accuracy against {label}: {name} {100 * r[name]['test_accuracy']:.1f} % vs {baseline} "
                f"{100 * r[baseline]['test_accuracy']:.1f} % top-1 on the {n} whole test videos ({diff:+.1f} +- "
                f"{se:.1f} points: {name} {word} {baseline}); top-{TOP_K} {k_diff:+.1f} +- {k_se:.1f} points"
                + (
                    f"; {baseline} on test pieces cut like its training: {100 * pieces:.1f} %."
                    if pieces is not None
                    else "."
                )
            )
    return out


def verdicts(res: dict) -> tuple[list[str], dict]:
    """Sentences comparing the measured numbers with the paper's Table I and with the baselines."""
    r, head = res["results"], {}
    lines = (
        padding_verdicts(r, head) + deleted_verdicts(r) + time_verdicts(r, head) + accuracy_verdicts(r, head)
    )
    return lines, head


def table(res: dict) -> tuple[list[str], list[list[str]]]:
    header = [
        "strategy", "t_max", "blocks", "padding frames", "padding %", "frames deleted", "sequences cut",
        "rows/step", "steps/epoch", "time/epoch s (real frames)", "time/epoch s (every frame)",
        "useful frames/s", "test accuracy", f"test top-{res.get('top_k', TOP_K)}",
    ]  # fmt: skip
    rows = []
    for name, e in res["results"].items():
        s = e["stats"]
        rows.append(
            [
                name, str(e["t_max"]), f"{s['blocks']:,}", f"{s['padding']:,}", f"{100 * s['padding_fraction']:.2f}",
                f"{s['deleted']:,}", f"{s['cut']:,}", fmt(e["rows_per_step"], ".1f"), fmt(e["steps_per_epoch"], ".0f"),
                fmt(e["epoch_s"], ".2f"), fmt(e.get("epoch_s_every_frame"), ".2f"), fmt(e["frames_per_s"], ",.0f"),
                f"{100 * e['test_accuracy']:.1f} %", f"{100 * e['test_top_k']:.1f} %",
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
    fig.suptitle(f"BLoad Table I on the synthetic set ({res['videos']} videos, {res['epochs']} epochs)")
    return fig


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_flags(parser)
    parser.add_argument("--videos", type=int, default=None, help="training videos (default: by size)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs (default: by size)")
    parser.add_argument("--batch", type=int, default=None, help="optimal's rows per step (default: by size)")
    parser.add_argument("--micro", type=int, default=4, help="micro-batch: rows of the longest t_max")
    parser.add_argument("--seed", type=int, default=0)
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
    if args.micro < 1 or args.threads < 1:
        parser.error("--micro and --threads must be >= 1")
    res = run(args)
    header, rows = table(res)
    lines, head = verdicts(res)
    notes = [
        f"{res['videos']} training videos, {res['test_videos']} test videos, {res['epochs']} epochs, seed "
        f"{args.seed}, t_max {res['t_max']} (the longest video; sampling, mix and chunk: round(mean length)), "
        f"{res['threads']} "
        "torch thread(s), one process, no Ray: the pipeline's row assembly and the learner's InnerStep, "
        "not 4 Ray jobs (much cheaper; the Ray path adds the same per-row work for every strategy).",
        "Every strategy takes the same optimizer steps per epoch (rows per step scale with its blocks) and "
        "the same micro-batch frame budget; the partial augmentation (computed once per epoch for all "
        f"strategies, {res['partial_s']:.1f} s in total) is outside 'time/epoch'.",
        "'padding frames' counts one epoch's plan (epoch 0); bload's count varies by seed.",
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
