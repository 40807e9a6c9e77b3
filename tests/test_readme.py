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
    "bload_table": "bench/bload_table.py --videos 300 --epochs 3 --runs 3",
    "packing": "bench/packing.py --out bench/results/packing.md",
}


def _points(value: str) -> str:
    """A headline text such as '+2.0 +- 2.7 (within noise)' as the README writes it: '+2.0 +- 2.7'."""
    return value.split(" (")[0]


# technique (bold in the README's first column) -> [(result, headline key, how the README writes it)]; a
# write of two arguments gets the figure's se (``key_se``) too, so the README's "+- se" is backed as well.
CLAIMS: dict[str, list[tuple[str, str, Callable]]] = {
    # Three runs of the table (their load as a setting), the UCF101 lists' padding over 5 seeds beside the
    # synthetic set's, and the baseline's accuracy that says this size cannot show accuracy.
    "BLoad": [
        ("bload_table", "runs", lambda v: f"{v} runs of 300 synthetic videos"),
        ("bload_table", "load", lambda v: f"load {v[0]:.0f}-{v[1]:.0f}"),
        (
            "bload_table",
            "padding_cut_optimal",
            lambda v, se: f"the job's packer {v:,.0f}x +- {se:,.0f}x less padding",
        ),
        (
            "bload_table",
            "padding_cut_bload",
            lambda v, se: f"the paper's random fill {v:,.0f}x +- {se:,.0f}x",
        ),
        (
            "packing",
            "train_stride1_padding_cut_bload",
            lambda v, se: f"lengths the random fill {v:,.0f}x +- {se:,.0f}x",
        ),
        ("packing", "train_stride1_padding_cut_optimal", lambda v: f"the job's packer {v:,.0f}x"),
        (
            "bload_table",
            "epoch_speedup_optimal_vs_pad_every_frame",
            lambda v, se: f"job's packer {v:.2f}x +- {se:.2f}x faster",
        ),
        (
            "bload_table",
            "epoch_speedup_bload_vs_pad_every_frame",
            lambda v, se: f"random fill {v:.2f}x +- {se:.2f}x",
        ),
        (
            "bload_table",
            "test_accuracy_sampling",
            lambda v, se: f"sampling baseline {100 * v:.1f} +- {100 * se:.1f} %",
        ),
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
        # Algorithm 2 with BatchNorm that trains: the paired test difference.
        (
            "bn_merge",
            "test_diff_text",
            lambda v: (
                f"Algorithm 2's merge of its running statistics against their plain mean {v} test points"
            ),
        ),
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
    # 300: the run's videos (bench/bload_table.py --videos 300 --epochs 3 --runs 3); 2 cores, n = 3 and 5
    # seeds, 3 epochs, chance 10 % (10 classes); A100 and UCF101: names, not figures.
    "BLoad": {"145", "4.1", "300", "2", "3", "5", "8", "10", "100", "101"},
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
        args = (
            (headline[key], headline.get(f"{key}_se"))
            if write.__code__.co_argcount == 2
            else (headline[key],)
        )
        text = write(*args)
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


# Quoted headline keys that are a run's count or setting (how many runs, the load it ran under), not a
# measured figure with a spread of its own.
SETTINGS = {
    ("averaging", "runs"),
    ("refurbish_real", "load"),
    ("bload_table", "runs"),
    ("bload_table", "load"),
}
SINGLE_RUN = re.compile(r"\b(one run|a single run)\b")


def spread_problem(headline: dict, key: str, row: str) -> str | None:
    """Why a quoted figure breaks the rule of issue 52, or None: its result gives ``key_n`` (the seeds or
    runs behind it) and ``key_se`` (its standard error over them) beside it; n = 1 is allowed only with
    ``key_se`` null and a README row that calls it one run ("one run" or "a single run")."""
    n, se = headline.get(f"{key}_n"), headline.get(f"{key}_se", "absent")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return f"no {key}_n (an int >= 1) beside {key}"
    if se == "absent":
        return f"no {key}_se beside {key}"
    if n == 1:
        if se is not None:
            return f"{key}_n is 1 but {key}_se is {se!r}: one run has no standard error"
        return None if SINGLE_RUN.search(row) else f"{key} is one run (n = 1) and the row does not say so"
    if not isinstance(se, int | float) or isinstance(se, bool) or se != se or se < 0:
        return f"{key}_n is {n} but {key}_se is {se!r}, not a standard error"
    return None


def claims_without_spread(results: Path, claims: dict, row_of: Callable[[str], str]) -> list[str]:
    """Every quoted figure of ``claims`` (technique -> [(result, key, _)]) whose result under ``results``
    gives no n and se beside it, as 'technique: result.json: why'."""
    out = []
    for technique, items in claims.items():
        row = row_of(technique)
        for name, key, _ in items:
            if (name, key) in SETTINGS:
                continue
            headline = json.loads((results / f"{name}.json").read_text())["headline"]
            problem = spread_problem(headline, key, row)
            if problem:
                out.append(f"{technique}: bench/results/{name}.json: {problem}")
    return out


def test_every_quoted_figure_has_its_n_and_se_in_its_result():
    """Issue 52's rule: each figure the README's table quotes stands in its bench/results/ JSON with n and
    se beside it (se over seeds or runs), or is a single run that the README's row calls one run."""
    assert claims_without_spread(RESULTS, CLAIMS, _row) == []


def test_a_quoted_figure_without_its_spread_is_caught(tmp_path):
    """The spread check is not vacuous: planted results whose quoted figure has no n, no se, a se for one
    run, or n = 1 in a row that does not say one run are each reported; a complete one is not."""
    plants = {
        "bare": {"x": 1.5},
        "no_se": {"x": 1.5, "x_n": 3},
        "null_se": {"x": 1.5, "x_n": 3, "x_se": None},
        "one_run_with_se": {"x": 1.5, "x_n": 1, "x_se": 0.2},
        "one_run_unsaid": {"x": 1.5, "x_n": 1, "x_se": None},
        "good": {"x": 1.5, "x_n": 3, "x_se": 0.2},
        "good_one_run": {"x": 1.5, "x_n": 1, "x_se": None},
    }
    for name, headline in plants.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"headline": headline}))
    rows = {name: "3 seeds: 1.5x" for name in plants}
    rows["good_one_run"] = "one run: 1.5x"
    claims = {name: [(name, "x", str)] for name in plants}
    found = claims_without_spread(tmp_path, claims, rows.__getitem__)
    assert [line.split(":")[0] for line in found] == [
        "bare", "no_se", "null_se", "one_run_with_se", "one_run_unsaid",
    ]  # fmt: skip
    assert "the row does not say so" in found[-1]


def _sentences(text: str) -> list[str]:
    """Sentences of a Markdown page: each line and table cell apart, split after '. '."""
    out = []
    for line in text.splitlines():
        for cell in line.split(" | "):
            out += [s for s in re.split(r"(?<=\.)\s+", cell) if s.strip()]
    return out


# A time or rate figure (what a CPU and a GPU measure differently) and the words that name the hardware.
TIMED = re.compile(r"time per|samples/s|per sample|faster|time to|epoch time|throughput", re.I)
HARDWARE = re.compile(r"\b(CPUs?|GPUs?|A100s?|V100s?|H200s?|TPUs?)\b")


def cpu_beside_gpu(text: str) -> list[str]:
    """Sentences that set a timed figure beside the paper's without naming the hardware of either."""
    return [
        s
        for s in _sentences(text)
        if "paper" in s and re.search(r"\d", s) and TIMED.search(s) and not HARDWARE.search(s)
    ]


def test_timed_figures_beside_the_papers_name_the_hardware():
    """A time or rate measured here sits beside a paper's (measured on GPUs) only in a sentence that says on
    which hardware (README and docs/BENCHMARKS.md); the check is not vacuous."""
    assert cpu_beside_gpu("r = 3 trains 1.6x the useful samples/s (the paper 1.03-2.04x).") != []
    assert (
        cpu_beside_gpu("on 2 CPU cores r = 3 trains 1.6x the useful samples/s (the paper's GPUs 1.03x).")
        == []
    )
    for page in ("README.md", "docs/BENCHMARKS.md"):
        assert cpu_beside_gpu((ROOT / page).read_text()) == [], page


CALLED = re.compile(r"\b(a gain|a loss|beats|trails)\b")
SEEDS_N = re.compile(r"\bn (?:=|>=) (\d+)")


def gains_without_seeds(text: str) -> list[str]:
    """Sentences that call a difference a gain or a loss (or say one arm beats or trails another) without
    n >= 3 seeds named in the same sentence; a comparison with a paper's own figure is not one of them."""
    out = []
    for s in _sentences(text):
        for called in CALLED.finditer(s):
            tail = s[called.end() : called.end() + 30]
            if "paper" in tail or "its best figure" in tail:
                continue
            if not any(int(n) >= 3 for n in SEEDS_N.findall(s)):
                out.append(s)
                break
    return out


def test_a_gain_or_a_loss_is_called_only_over_three_seeds():
    """README and docs/BENCHMARKS.md call a difference a gain or a loss only beside n >= 3 (seeds or runs);
    the check is not vacuous."""
    assert gains_without_seeds("bload 19.7 % vs sampling 13.3 % (+6.3 +- 3.0 points: bload beats sampling).")
    assert gains_without_seeds("+5.8 +- 2.1 (n = 2, a gain beyond one se).")
    assert not gains_without_seeds("+5.8 +- 2.1 (n = 3, a gain beyond one se).")
    for page in ("README.md", "docs/BENCHMARKS.md"):
        assert gains_without_seeds((ROOT / page).read_text()) == [], page


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
