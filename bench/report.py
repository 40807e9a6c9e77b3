"""Assemble docs/BENCHMARKS.md from the result files the benchmark scripts wrote to bench/results/.

Each table script writes ``<name>.md`` (its table, the verdict sentences built from its own numbers,
notes, a PNG link) and ``<name>.json`` (the same plus the headline numbers and the machine it ran on);
``bench/packing.py --out`` writes ``packing.md`` and ``make bench`` tees the output of
``bench/pipeline.py`` and ``bench/startup.py`` to ``pipeline.txt`` and ``startup.txt``. This script only
arranges them: the machine header (from the results' own JSON, i.e. where they were measured), a headline
table of the four papers' ratios (read from the JSON, never typed in), then every section with the
command that made it. A missing result is listed as missing.

    python bench/report.py [--results bench/results] [--out docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import RESULTS, ROOT, machine_info, markdown_table

# (name, title, command of a section whose script writes no JSON)
SECTIONS = (
    ("bload_table", "BLoad Table I", None),
    ("refurbish", "Revamper (data refurbishing)", None),
    ("refurbish_real", "Revamper on real footage with RandAugment", None),
    ("video_feed", "The feed on real footage", None),
    ("microbatch", "MBS Table 4 (micro-batch streaming)", None),
    ("averaging", "AAVG (model averaging)", None),
    ("averaging_ablation", "AAVG ablation at equal steps", None),
    ("batch_rule", "AAVG batch-size rule under epochs and under the step budget", None),
    ("bn_merge", "AAVG Algorithm 2 with BatchNorm that trains", None),
    ("packing", "Packing on the real UCF101 lengths", ".venv/bin/python bench/packing.py --out bench/results/packing.md"),
    ("pipeline", "Ray Data pipeline vs DataLoader", ".venv/bin/python bench/pipeline.py"),
    ("startup", "A job's start-up vs a bare Ray Train trainer", ".venv/bin/python bench/startup.py"),
)  # fmt: skip

# headline key -> (paper, label, format); the values come from each result's JSON.
HEADLINES = {
    "bload_table": [
        (
            "padding_cut_optimal",
            "padding, naive / optimal (the job's default packer)",
            "{:,.0f}x",
            "145x (naive / block pad)",
        ),
        ("padding_cut_bload", "padding, naive / bload (the paper's random fill)", "{:,.0f}x", "145x"),
        (
            "epoch_speedup_bload_vs_pad_every_frame",
            "time per epoch, naive / bload, a model that encodes every frame (as the paper's)",
            "{:.2f}x",
            "4.1x",
        ),
        (
            "epoch_ratio_mix_vs_bload_every_frame",
            "time per epoch, mix pad / bload, every frame encoded",
            "{:.2f}x",
            "0.98x",
        ),
        (
            "epoch_speedup_bload_vs_pad",
            "time per epoch, naive / bload, the job's model (it never encodes padding)",
            "{:.2f}x",
            "n/a (its model encodes padding)",
        ),
        (
            "accuracy_bload_minus_sampling_text",
            "test accuracy, bload - sampling (points +- se over seeds; see the section for the arms near chance)",
            "{}",
            "+2.1 (recall@20)",
        ),
        (
            "accuracy_bload_minus_mix_text",
            "test accuracy, bload - mix pad (points +- se over seeds; the same)",
            "{}",
            "+1.2 (recall@20)",
        ),
    ],
    "packing": [
        (
            "train_stride1_padding_cut_bload",
            "padding on UCF101 split-1's real train lengths, naive / bload (the paper's random fill), 5 seeds",
            "{:,.0f}x",
            "145x (Action Genome)",
        ),
        (
            "train_stride1_padding_cut_optimal",
            "the same, naive / optimal (the job's default packer; its plan does not depend on the seed)",
            "{:,.0f}x",
            "145x (naive / block pad)",
        ),
    ],
    "refurbish": [
        (
            "r3_speedup_text",
            "useful samples/s on the job's feed, r=3 / r=1 (paired, +- se)",
            "{}",
            "1.03-2.04x",
        ),
        ("r3_cpu_saving", "CPU per sample of the whole job, r=1 / r=3", "{:.2f}x", "n/a"),
        ("r3_accuracy_text", "test accuracy, r=3 - r=1 (points, paired, +- se)", "{}", "comparable"),
        ("r3_step_cv_served", "each step's CPU, std/mean, r=3, the job's feed", "{:.0%}", "n/a (kept equal)"),
        ("r3_step_cv_compose", "the same under Revamper's compose of samples", "{:.0%}", "n/a"),
    ],
    "microbatch": [
        (
            "overhead_vs_fit_median",
            "step time per sample, streamed / plain that fits",
            "{:+.1%}",
            "+0.3 to +5.1 %",
        ),
        ("grad_diff", "gradient, relative difference to whole batch (fp32)", "{:.1e}", "n/a"),
        ("grad_float64", "the same in float64", "{:.1e}", "n/a"),
    ],
    "averaging": [
        (
            "ddp_over_aavg_time",
            "time to equal val accuracy, DDP / AAVG (one run)",
            "{:.2f}x",
            "n/a (its 33.9x is over 1-GPU SGD)",
        ),
        ("share_k_epoch", "time averaging at K = epoch (the same run)", "{:.1%}", "low"),
        ("test_aavg_k_epoch", "test accuracy, AAVG at K = epoch (the same run)", "{:.1%}", "n/a"),
        ("test_ddp", "test accuracy, DDP (the same run)", "{:.1%}", "n/a"),
    ],
    "averaging_ablation": [
        (
            "paper_aavg2_minus_1",
            "val accuracy at equal steps, AAVG2 - AAVG1, paper rule (points +- se, n seeds)",
            "{}",
            "+2.1",
        ),
        (
            "paper_aavg3_minus_2",
            "val accuracy at equal steps, AAVG3 - AAVG2, paper rule (points +- se, n seeds)",
            "{}",
            "+1.9",
        ),
        (
            "noise_aware_aavg2_minus_1",
            "val accuracy at equal steps, AAVG2 - AAVG1, noise-aware rule (points +- se, n seeds)",
            "{}",
            "n/a",
        ),
        (
            "noise_aware_aavg3_minus_2",
            "val accuracy at equal steps, AAVG3 - AAVG2, noise-aware rule (points +- se, n seeds)",
            "{}",
            "n/a",
        ),
        (
            "aavg4_minus_scratch",
            "test accuracy, AAVG4 flow - flow from scratch (points +- se, n seeds)",
            "{}",
            "equal, sooner",
        ),
    ],
    "batch_rule": [
        (
            "steps_default_minus_fixed_text",
            "test accuracy under --steps N, default rule - fixed batch at the same N steps (the default grows B, "
            "so it reads more data), mini-UCF101, CPU, paired over n = 3 seeds (points +- se)",
            "{}",
            "+2.1 (AAVG2 adaptive - AAVG1 constant batch)",
        ),
        (
            "always_minus_fixed_text",
            "test accuracy at equal epochs, B grown (--batch-growth always) - fixed batch, per set, CPU, paired "
            "over n = 3 seeds (points +- se); the default holds B there, so it is the fixed run",
            "{}",
            "n/a (the paper fixes steps)",
        ),
    ],
    "bn_merge": [
        (
            "test_diff_text",
            "test accuracy, BatchNorm statistics merged (Algorithm 2) - their plain mean, --norm batchnorm, CPU, "
            "paired over n seeds (points +- se)",
            "{}",
            "n/a (only with the merged Adam moments, AAVG3)",
        ),
        (
            "var_excess_mean",
            "merged running variance over the plain mean's, final models, mean over channels and seeds",
            "{:+.1e}",
            "n/a",
        ),
    ],
}


def _shift_headings(text: str) -> str:
    """Headings one level deeper ('# x' -> '## x') when the text has an H1, so it sits under this page's."""
    if not any(line.startswith("# ") for line in text.splitlines()):
        return text
    return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())


def headline_rows(loaded: dict[str, dict]) -> list[list[str]]:
    rows = []
    for name, items in HEADLINES.items():
        head = loaded.get(name, {}).get("headline", {})
        for key, label, spec, paper in items:
            rows.append([name, label, headline_cell(head, key, spec), paper])
    return rows


def headline_cell(head: dict, key: str, spec: str) -> str:
    """A headline figure as the table writes it: with its se and n where the result gives them beside it
    and the figure is a number ('3.43x +- 0.05x (n = 3)'; one run: '5.02x (one run)')."""
    value = head.get(key)
    if value is None:
        return "not measured"
    text = spec.format(value)
    n, se = head.get(f"{key}_n"), head.get(f"{key}_se")
    if isinstance(value, str) or n is None:
        return text
    if n == 1 or se is None:
        return f"{text} (one run)" if n == 1 else f"{text} (n = {n})"
    return f"{text} +- {spec.format(se)} (n = {n})"


def build(results: Path, images: str) -> str:
    """The page; ``images`` is the results folder relative to the page (for the PNG links)."""
    loaded = {}
    for name, _, _ in SECTIONS:
        path = results / f"{name}.json"
        if path.exists():
            loaded[name] = json.loads(path.read_text())
    machine = next((d["machine"] for d in loaded.values() if "machine" in d), None) or machine_info()
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`bench/report.py` assembles the files the scripts wrote to `bench/results/`).",
        "Every number and every sentence under 'Against the paper' is produced by the script from its own run;",
        "ratios, not absolute times, are the headline. Sizes: the default size of each script fits a 2-core box;",
        "`--full` is for a GPU cluster.",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['ram_gib']} GiB RAM, GPU: {machine['gpu']}; "
        f"Python {machine['python']}, torch {machine['torch']}, ray {machine['ray']}, numpy {machine['numpy']}; "
        f"{machine['platform']}; measured {machine['date']}.",
        "",
        "## Headline ratios",
        "",
        markdown_table(
            [
                "benchmark",
                "ratio",
                "this project (the machine above; GPU runs at the end)",
                "the paper (GPUs)",
            ],
            headline_rows(loaded),
        ),
        "",
    ]
    for name, title, command in SECTIONS:
        md, txt = results / f"{name}.md", results / f"{name}.txt"
        if md.exists() and command is None:
            lines.append(_shift_headings(md.read_text()).replace(f"]({name}.png)", f"]({images}/{name}.png)"))
        elif md.exists():
            lines += [f"## {title}", "", f"`{command}`", "", _shift_headings(md.read_text())]
        elif txt.exists():
            lines += [f"## {title}", "", f"`{command}`", "", "```", txt.read_text().rstrip(), "```"]
        else:
            lines += [f"## {title}", "", f"Not run: no `bench/results/{name}.md` or `.txt`.", ""]
        lines.append("")
    lines += gpu_sections(results / "gpu", f"{images}/gpu")
    return "\n".join(lines).rstrip() + "\n"


def gpu_sections(folder: Path, images: str) -> list[str]:
    """The last ``scripts/gpu_checks.sh`` run's results (``bench/results/gpu/``), when a session had a GPU:
    MBS Table 4 with a real memory cap, and one learner's step on the GPU."""
    if not folder.is_dir():
        return []
    machine = (
        next((json.loads(p.read_text()).get("machine") for p in sorted(folder.glob("*.json"))), None) or {}
    )
    lines = [
        "## On a GPU (`scripts/gpu_checks.sh`)",
        "",
        f"Measured on {machine.get('gpu', 'a GPU')} ({machine.get('cores', '?')} CPU cores, torch "
        f"{machine.get('torch', '?')}, no Ray), by the checks a session runs when it is lent a GPU: the MBS "
        f"tables on {machine.get('date', 'an unrecorded date')}, each text file by its last run (dated in "
        "docs/LOG.md). The sections above are this page's CPU machine.",
        "",
    ]
    for md in sorted(folder.glob("*.md")):
        # One level under this section: '## MBS Table 4 ...' -> '### MBS Table 4 ...'.
        text = "\n".join("#" + line if line.startswith("#") else line for line in md.read_text().splitlines())
        lines += [text.replace(f"]({md.stem}.png)", f"]({images}/{md.stem}.png)"), ""]
    for txt in sorted(folder.glob("*.txt")):
        lines += [f"### `{txt.name}`", "", "```", txt.read_text().rstrip(), "```", ""]
    return lines


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        parser.error(f"--results {args.results} is not a folder: run the benchmarks first (make bench)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = build(args.results, os.path.relpath(args.results.resolve(), args.out.parent.resolve()))
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
