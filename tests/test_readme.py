"""The README's headline table quotes the committed benchmark results, and nothing else that was measured.

Each row of the table "measured here" names its numbers in ``CLAIMS``: the result file under
``bench/results/``, the headline key and how the README writes it. A rerun that changes a committed result
therefore fails here until the README says the new number; a number in a row that is neither a claim nor
one of the row's ``FIXED`` figures (the papers' own, the settings) fails too, so no measured figure can be
typed into the table by hand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# The command that writes each result (what to rerun when one is missing).
SCRIPTS = {
    "averaging_ablation": "bench/averaging.py --only ablation",
    "refurbish_real": "bench/refurbish.py --real",
    "gpu/microbatch_micro16": "bench/microbatch.py on a GPU (scripts/gpu_checks.sh)",
    "gpu/microbatch_micro512": "bench/microbatch.py --micro 512 --width 64 --max-size 16384 on a GPU",
}


def _points(value: str) -> str:
    """A headline text such as '+2.0 +- 2.7 (within noise)' as the README writes it: '+2.0 +- 2.7'."""
    return value.split(" (")[0]


# technique (bold in the README's first column) -> [(result, headline key, how the README writes it)]
CLAIMS: dict[str, list[tuple[str, str, Callable]]] = {
    "BLoad": [
        ("bload_table", "padding_cut_optimal", lambda v: f"{v:,.0f}x less padding"),
        ("bload_table", "padding_cut_bload", lambda v: f"random fill: {v:,.0f}x"),
        (
            "bload_table",
            "epoch_speedup_optimal_vs_pad_every_frame",
            lambda v: f"job's packer {v:.2f}x faster",
        ),
        ("bload_table", "epoch_speedup_bload_vs_pad_every_frame", lambda v: f"random fill {v:.2f}x"),
    ],
    # The averaging share beside the same run's DDP baseline and its n (one seed); the ablation's steps
    # with their se, n and call ('+0.0 +- 0.9 (n = 3, within noise)').
    "AAVG": [
        ("averaging", "runs", lambda v: "one run:" if v == 1 else f"{v} runs:"),
        ("averaging", "share_k_epoch", lambda v: f"{100 * v:.1f} % of learner time averaging"),
        ("averaging", "share_k1", lambda v: f"({100 * v:.1f} % at K = 1)"),
        (
            "averaging",
            "ddp_over_aavg_time",
            lambda v: f"DDP reached the same validation accuracy in {v:.2f}x AAVG's time",
        ),
        ("averaging", "test_aavg_k_epoch", lambda v: f"test accuracy AAVG (K = epoch) {100 * v:.1f} %"),
        ("averaging", "test_aavg_k1", lambda v: f"AAVG (K = 1) {100 * v:.1f} %"),
        ("averaging", "test_ddp", lambda v: f"DDP {100 * v:.1f} %"),
        ("averaging_ablation", "paper_aavg2_minus_1", lambda v: f"AAVG2 - AAVG1 {v}"),
        ("averaging_ablation", "paper_aavg3_minus_2", lambda v: f"AAVG3 - AAVG2 {v}"),
        # Algorithm 2 with BatchNorm that trains: the paired test difference and the direct check.
        (
            "bn_merge",
            "test_diff_text",
            lambda v: (
                f"Algorithm 2's merge of its running statistics against their plain mean {v} test points"
            ),
        ),
        ("bn_merge", "var_excess_mean", lambda v: f"merged variances {v:.1e}".replace("e-0", "e-")),
    ],
    "Refurbishing": [
        ("refurbish_real", "r3_cpu_saving_text", lambda v: f"CPU-seconds per sample, r = 1 over r = 3: {v}"),
        ("refurbish_real", "r3_speedup_text", lambda v: f"{v} the useful samples/s"),
        ("refurbish_real", "load", lambda v: f"load {v[0]:.0f}-{v[1]:.0f}"),
        ("refurbish_real", "r3_accuracy_text", lambda v: f"{_points(v)} test points"),
    ],
    "Micro-batch streaming": [
        ("microbatch", "overhead_vs_fit_median", lambda v: f"{100 * v:+.1f} % time per sample"),
        ("microbatch", "grad_diff", lambda v: f"{v:.1e}".replace("e-0", "e-")),
        ("gpu/microbatch_micro16", "overhead_vs_fit_median", lambda v: f"of 16 cost {100 * v:+.1f} % time"),
        ("gpu/microbatch_micro512", "overhead_vs_fit_median", lambda v: f"of 512 {100 * v:+.1f} % time"),
        ("gpu/microbatch_micro512", "grad_diff", lambda v: "gradient " + f"{v:.1e}".replace("e-0", "e-")),
    ],
}
# Figures a row may hold besides its claims: the papers' own and the settings it names.
FIXED: dict[str, set[str]] = {
    "BLoad": {"145", "4.1", "2.1", "300"},  # 300: the run's videos (bench/bload_table.py --videos 300)
    "AAVG": {"1", "2.1", "1.9"},
    "Refurbishing": {"3", "1", "1.03", "2.04", "2"},
    "Micro-batch streaming": {"16", "512", "0.3", "5.1", "32", "200"},  # float32, H200: names, not figures
}
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")


def _row(technique: str) -> str:
    """The table row whose first cell names ``technique`` in bold, its last cell (what was measured)."""
    lines = [
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith(f"| **{technique}**")
    ]
    assert len(lines) == 1, f"README.md needs one headline row for **{technique}**, found {len(lines)}"
    return lines[0].rstrip(" |").rsplit(" | ", 1)[1]


@pytest.mark.parametrize("technique", list(CLAIMS))
def test_readme_headline_quotes_the_committed_results(technique):
    """Every claim of the row is the committed result as the README writes it, and every other number in
    the row is one of the papers' figures or a setting (not vacuous: each row makes two claims or more)."""
    row = _row(technique)
    quoted = []
    for name, key, write in CLAIMS[technique]:
        headline = json.loads((RESULTS / f"{name}.json").read_text())["headline"]
        script = SCRIPTS.get(name, f"bench/{name}.py")
        assert key in headline, f"bench/results/{name}.json has no headline {key!r}: rerun {script}"
        text = write(headline[key])
        assert text in row, f"README's {technique} row should say {text!r} (bench/results/{name}.json, {key})"
        quoted.append(text)
    assert len(quoted) >= 2
    strays = unbacked(row, quoted, FIXED[technique])
    assert not strays, (
        f"README's {technique} row has numbers no result backs: {strays} (add a claim or drop them)"
    )


def unbacked(row: str, quoted: list[str], fixed: set[str]) -> list[str]:
    """The numbers of ``row`` outside its quoted claims that are not among the ``fixed`` figures."""
    for text in quoted:
        row = row.replace(text, " ")
    return [n for n in NUMBER.findall(row) if n.lstrip("+-") not in fixed]


def test_a_figure_typed_beside_the_claims_is_caught():
    """The stray check is not vacuous: a number beside the claims that no result backs is reported, a
    paper's figure and the claims' own numbers are not."""
    row = "r = 3 trains 1.62x the useful samples/s (the paper: 1.03-2.04x), 2.5x less CPU, +0.4 +- 1.1 points"
    quoted = ["1.62x the useful samples/s", "+0.4 +- 1.1 points"]
    assert unbacked(row, quoted, FIXED["Refurbishing"]) == ["2.5"]
    assert unbacked(row.replace(", 2.5x less CPU", ""), quoted, FIXED["Refurbishing"]) == []


def test_the_readme_is_read_in_one_sitting():
    """A newcomer's page: at most 200 lines, and the sections a first user needs, in the order they need
    them (real video and their own videos before the cluster)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README.md is over 200 lines: move detail to docs/"
    order = ["## Two commands", "## What a run writes", "## Real video", "## Your own videos", "## Scale out"]
    at = [text.find(heading) for heading in order]
    assert -1 not in at and at == sorted(at), dict(zip(order, at, strict=True))


def test_the_architecture_is_read_in_one_sitting():
    """docs/ARCHITECTURE.md is the design a newcomer reads in one sitting: at most 5,000 words (history
    and figures go to docs/LOG.md and docs/BENCHMARKS.md)."""
    words = len((ROOT / "docs" / "ARCHITECTURE.md").read_text().split())
    assert words <= 5000, f"docs/ARCHITECTURE.md has {words} words: move history and figures to docs/LOG.md"


def feed_claims(headline: dict) -> list[str]:
    """How the README's "Real video" section writes bench/video_feed.py's range over its rows: warm
    epochs' kept frames per CPU-second and their ratio to the DataLoader, and the cold epoch's ratio."""
    warm = [r for r in headline["rows"] if r["epoch"] == "warm"]
    cold = [r for r in headline["rows"] if r["epoch"] == "cold"]
    rate = [r["frames_per_cpu_s"] for r in warm]
    return [
        f"warm epochs serve {min(rate):,.0f} to {max(rate):,.0f} kept frames per CPU-second",
        f"{min(r['x_dataloader'] for r in warm):.0f}-{max(r['x_dataloader'] for r in warm):.0f}x a",
        f"the cold epoch {min(r['x_dataloader'] for r in cold):.2f}-{max(r['x_dataloader'] for r in cold):.2f}x",
    ]


def test_readme_quotes_the_real_footage_feed_from_its_results():
    """The "Real video" section's feed figures are bench/results/video_feed.json's, as feed_claims writes
    them (a rerun that changes them fails here until the README says the new ones)."""
    headline = json.loads((RESULTS / "video_feed.json").read_text())["headline"]
    text = " ".join((ROOT / "README.md").read_text().split())
    for claim in feed_claims(headline):
        assert claim in text, (
            f"README should say {claim!r} (bench/results/video_feed.json; rerun bench/video_feed.py)"
        )
