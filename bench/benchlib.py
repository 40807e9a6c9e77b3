"""Shared pieces of the benchmark scripts: result files, tables, plots, machine facts, single-process data.

Every table script ends with ``write_results``: ``bench/results/<name>.md`` (title, command, table,
notes, verdicts built from the numbers just measured) and ``<name>.json`` (the same plus the headline),
which ``report.py`` assembles into ``docs/BENCHMARKS.md``. ``LocalData`` gives the benchmarks the job's
data path without Ray (synthetic catalogs, augmentations, packing, ``rows.assembly``), byte for byte the
rows a Ray learner receives for the same seed, epoch and plan. ``seed_word`` calls a difference a gain or
a loss only with n >= 3 seeds and |diff| > se. The run-level helpers (``mean_se``, ``tree_cpu_seconds``,
``CpuSampler``, ``local_ray``) serve the benchmarks that run the whole job. Nothing here imports ray at
import time (``local_ray`` does when called); matplotlib only inside ``new_figure``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

# The scripts run as `python bench/x.py`; the repository root makes raytrain_seq importable uninstalled.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raytrain_seq.algorithms.augment import partial_augment, resize_video
from raytrain_seq.algorithms.packing import Block, PackPlan, pack
from raytrain_seq.config import Config
from raytrain_seq.data.synthetic import SyntheticVideos
from raytrain_seq.rows.assembly import EpochShard, assemble_rows, max_sequences_bound, plan_specs, shard_items
from raytrain_seq.seeds import partial_rng, plan_seed
from raytrain_seq.training.staging import collate_rows

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SIZES = ("tiny", "default", "full")


# ------------------------------------------------------------------------------------------ arguments
def add_size_flags(parser) -> None:
    """``--tiny`` (seconds: tests and smoke checks), default (``make bench`` on a 2-core box), ``--full``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--tiny", action="store_const", dest="size", const="tiny", help="seconds-long check")
    group.add_argument("--full", action="store_const", dest="size", const="full", help="GPU-cluster size")
    parser.set_defaults(size="default")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help=f"folder for the .md/.json/.png (default {RESULTS})"
    )


def command_line(argv: Sequence[str] | None, script: str) -> str:
    """The command that reproduces this run, as written in docs/BENCHMARKS.md."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([".venv/bin/python", f"bench/{script}", *args])


# --------------------------------------------------------------------------------------------- tables
def fmt(value: float | None, spec: str = ".2f", missing: str = "n/a") -> str:
    return missing if value is None or (isinstance(value, float) and np.isnan(value)) else format(value, spec)


def compare_accuracy(a: float, b: float, n: int) -> tuple[float, float, str]:
    """Points a - b, the standard error of that difference (two independent runs scored on n items),
    and "beats" / "trails" / "is within noise of" (|difference| below two standard errors).

    a 0.75, b 0.72, n 1000: +3.0 points, se sqrt(.75*.25/1000 + .72*.28/1000) = 1.96 points: noise.
    """
    diff = 100.0 * (a - b)
    se = 100.0 * float(np.sqrt((a * (1 - a) + b * (1 - b)) / max(n, 1)))
    word = "beats" if diff > 2 * se else "trails" if diff < -2 * se else "is within noise of"
    return diff, se, word


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """GitHub table: the first column left-aligned, the others right-aligned."""
    if any(len(r) != len(header) for r in rows):
        raise ValueError(f"every row needs {len(header)} cells like the header {list(header)}")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def plain_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The same table for a terminal: padded columns and a rule under the header."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    out = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in [list(header), *rows]
    ]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


@dataclass
class Result:
    """One script's output: a titled table plus the notes and verdicts that report.py puts under it."""

    name: str
    title: str
    command: str
    size: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    headline: dict[str, Any] = field(default_factory=dict)
    extra_tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)

    def markdown(self, figure: bool = False) -> str:
        """The result as markdown; ``figure``: a ``<name>.png`` is written beside it, so link it."""
        parts = [f"## {self.title}", "", f"`{self.command}` (size: {self.size})", ""]
        parts += [markdown_table(self.header, self.rows), ""]
        for caption, header, rows in self.extra_tables:
            parts += [caption, "", markdown_table(header, rows), ""]
        if self.verdicts:
            parts += ["**Against the paper and the baseline**", ""]
            parts += [f"- {v}" for v in self.verdicts] + [""]
        if self.notes:
            parts += ["Notes:", ""] + [f"- {n}" for n in self.notes] + [""]
        if figure:
            parts.append(f"![{self.name}]({self.name}.png)")
        return "\n".join(parts) + "\n"

    def text(self) -> str:
        parts = [self.title, plain_table(self.header, self.rows)]
        for caption, header, rows in self.extra_tables:
            parts += ["", caption, plain_table(header, rows)]
        parts += [""] + [f"* {v}" for v in self.verdicts] + [""] + [f"- {n}" for n in self.notes]
        return "\n".join(parts)


def write_results(result: Result, out_dir: Path, figure=None) -> list[Path]:
    """Print the table and write ``<name>.md``, ``<name>.json`` (and ``<name>.png``) under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    print(result.text(), flush=True)
    written = []
    md = out_dir / f"{result.name}.md"
    md.write_text(result.markdown(figure=figure is not None))
    written.append(md)
    data = {
        "name": result.name,
        "title": result.title,
        "command": result.command,
        "size": result.size,
        "header": result.header,
        "rows": result.rows,
        "notes": result.notes,
        "verdicts": result.verdicts,
        "headline": result.headline,
        "machine": machine_info(),
    }
    js = out_dir / f"{result.name}.json"
    js.write_text(json.dumps(data, indent=1, default=float))
    written.append(js)
    if figure is not None:
        png = out_dir / f"{result.name}.png"
        figure.savefig(png, dpi=110, bbox_inches="tight")
        written.append(png)
    print("wrote " + ", ".join(str(p) for p in written), flush=True)
    return written


def new_figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    """A matplotlib Figure on a private Agg canvas (no pyplot state) and its axes (a list)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def try_plot(plot: Callable[[Any], Any], res: Any):
    """``plot(res)``, or None with a printed note where matplotlib is missing (a bare GPU machine)."""
    try:
        return plot(res)
    except ImportError as exc:
        print(f"no plot: {exc} (install matplotlib for the PNG)")
        return None


# -------------------------------------------------------------------------------------------- machine
def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


# Fields of /proc/PID/stat after the ")" that ends the command, 0-based: 1 ppid, 11 utime, 12 stime,
# 13 cutime, 14 cstime (the last four in clock ticks).
STAT_PPID, STAT_UTIME, STAT_STIME, STAT_CUTIME, STAT_CSTIME = 1, 11, 12, 13, 14


def processes(*, titles: bool = False) -> dict[int, tuple[list[str], str]]:
    """Every live process: pid -> (its /proc/PID/stat fields after the command, its title: the first word
    of its command line, "" unless ``titles``). A process that ends while it is read is left out (its CPU
    time goes to its parent's cutime and cstime)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            title = ""
            if titles:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    title = f.read(200).split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        out[int(entry)] = (fields, title)
    return out


def machine_info() -> dict[str, Any]:
    """Cores, memory, CPU model, GPU, versions and the date: the header of docs/BENCHMARKS.md."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        ram = float("nan")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(ram, 1),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": _version("ray"),
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


# ----------------------------------------------------------------------------------------- whole runs
def mean_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, standard error = sample std / sqrt(n)); se None below 2 values, both None for none.

    [0.5, 0.7, 0.6] -> (0.6, 0.0577...).
    """
    values = list(values)
    if not values:
        return None, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, statistics.stdev(values) / math.sqrt(len(values))


def within_noise(diff: float | None, se: float | None) -> str:
    """How a difference stands against its standard error: "within noise" (|diff| <= 2 se), "above" or
    "below" noise, or "no standard error" (fewer than 2 runs). +2.0 with se 2.7 -> "within noise".

    bench/refurbish.py's reading, with which its committed results were written; a difference paired
    over seeds is called by ``seed_word`` (bench/batch_rule.py, bench/ablation.py)."""
    if diff is None or se is None:
        return "no standard error"
    if abs(diff) <= 2 * se:
        return "within noise"
    return "above noise" if diff > 0 else "below noise"


# A difference paired over seeds is called a gain or a loss only over this many seeds or more.
MIN_SEEDS_TO_CALL = 3


def seed_word(diff: float | None, se: float | None, n: int) -> str:
    """What a difference paired over ``n`` seeds may be called, the one rule of the seeded benches: "a gain
    beyond one se" or "a loss beyond one se" only when n >= 3 and |diff| > se, else "within noise".

    +9.3 +- 4.9, n 3 -> "a gain beyond one se"; -6.6 +- 5.9, n 3 -> "a loss beyond one se"; +2.0 +- 2.7,
    n 3, or any difference over 2 seeds -> "within noise". One nonzero pair of three gives |mean| == se
    exactly, which is not beyond it whatever the float rounding.
    """
    if diff is not None and se is not None and n >= MIN_SEEDS_TO_CALL and abs(diff) > se + 1e-9:
        return ("a gain" if diff > 0 else "a loss") + " beyond one se"
    return "within noise"


def pct(x: float | None) -> str:
    """An accuracy as a percentage: 0.6234 -> '62.3 %'; None -> 'n/a'."""
    return "n/a" if x is None else f"{100 * x:.1f} %"


def pct_mean_se(mean: float | None, se: float | None, n: int) -> str:
    """'62.3 % +- 2.3 (n = 3)': a mean accuracy over n seeds with its standard error."""
    if mean is None:
        return "n/a"
    return f"{100 * mean:.1f} %" + ("" if se is None else f" +- {100 * se:.1f}") + f" (n = {n})"


def seed_gap_text(diff: float | None, se: float | None, n: int) -> str:
    """A paired difference in points with its se, n and call: '+0.0 +- 5.8 (n = 3, within noise)'."""
    if diff is None:
        return "n/a"
    points = f"{diff:+.1f}" + ("" if se is None else f" +- {se:.1f}")
    return f"{points} (n = {n}, {seed_word(diff, se, n)})"


def spread_keys(head: dict, key: str, n: int, se: float | None) -> None:
    """Beside headline ``key``: ``key_n``, the seeds or runs behind it, and ``key_se``, its standard error
    over them (None for one run). tests/test_readme.py requires both of every figure the README quotes.

    spread_keys(head, "share_k1", 1, None) -> head["share_k1_n"] == 1, head["share_k1_se"] is None."""
    head[f"{key}_n"], head[f"{key}_se"] = n, se


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds (user + system) of process ``root`` (default: this one) and every live descendant,
    plus the children they already reaped (``cutime``/``cstime``), read from /proc: Ray's raylet, GCS and
    workers are descendants of the driver that ``ray.init`` started them from. CPU time is what the work
    costs whatever else runs on the box."""
    root = os.getpid() if root is None else root
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for pid, (fields, _) in processes().items():
        parent[pid] = int(fields[STAT_PPID])
        cpu[pid] = sum(int(fields[k]) for k in (STAT_UTIME, STAT_STIME, STAT_CUTIME, STAT_CSTIME)) / tick
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    tree, frontier = {root}, [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(cpu.get(pid, 0.0) for pid in tree)


# Field 19 of /proc/PID/stat after the command: the process's start time, which tells a reused pid apart.
STAT_STARTTIME = 19


class TreeCpu:
    """The CPU seconds (user + system) every process of a tree has spent, counting the ones that exited.

    ``tree_cpu_seconds`` loses a process's CPU when it exits and its parent does not collect it (Ray's
    workers, and Ray Train's when their placement group goes: the reading then drops). Called repeatedly,
    this keeps each process's last reading, keyed by (pid, start time), so the sum only grows; a process
    born and gone between two calls, and the CPU of one after its last reading, are not counted (the
    interval bounds that loss)."""

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self._last: dict[tuple[int, str], float] = {}

    def __call__(self) -> float:
        tick = os.sysconf("SC_CLK_TCK")
        procs = processes()
        children: dict[int, list[int]] = {}
        for pid, (fields, _) in procs.items():
            children.setdefault(int(fields[STAT_PPID]), []).append(pid)
        tree, frontier = {self.root}, [self.root]
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in tree:
                    tree.add(child)
                    frontier.append(child)
        for pid in tree & procs.keys():
            fields = procs[pid][0]
            self._last[(pid, fields[STAT_STARTTIME])] = (
                int(fields[STAT_UTIME]) + int(fields[STAT_STIME])
            ) / tick
        return sum(self._last.values())


class CpuSampler:
    """A thread that reads a process tree's CPU (``TreeCpu``) every ``interval_s`` with the wall clock
    (time.time()); ``between(a, b)`` interpolates the CPU seconds spent between two wall times, so a run's
    phases (its warm epochs, say) get their own CPU from stamps the run reports afterwards."""

    def __init__(self, interval_s: float = 0.25, read: Callable[[], float] | None = None) -> None:
        self._interval, self._read = interval_s, read if read is not None else TreeCpu()
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)

    def _loop(self) -> None:
        while True:
            self.samples.append((time.time(), self._read()))
            if self._stop.wait(self._interval):
                self.samples.append((time.time(), self._read()))
                return

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, when: float) -> float:
        """The CPU reading at wall time ``when``, linear between the samples around it (clamped)."""
        times = [t for t, _ in self.samples]
        values = [c for _, c in self.samples]
        return float(np.interp(when, times, values))

    def between(self, start: float, end: float) -> float:
        return self.at(end) - self.at(start)


@contextlib.contextmanager
def local_ray(num_cpus: int = 4) -> Iterator[None]:
    """A private in-process Ray cluster for a benchmark's runs (never someone else's: address "local"),
    shut down on the way out; ``raytrain_seq.runtime.connect`` then uses it."""
    import ray

    from raytrain_seq.runtime.connect import WORKER_REUSE

    ray.init(address="local", num_cpus=num_cpus, namespace="raytrain_seq", include_dashboard=False,
             log_to_driver=False, _system_config=WORKER_REUSE)  # fmt: skip
    logging.getLogger("ray").setLevel(logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


def load_average() -> float:
    """The machine's 1-minute load average (how shared it was while a run took its wall-clock time)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


# ------------------------------------------------------------------------------------------ baselines
SAMPLING_SENTENCE = (
    "Sampling solution, where each sequence is trimmed to match a smaller size, usually the "
    "length of the average entry in the dataset. In this approach, one sequence might be broken into "
    "several smaller portions"
)
"""The BLoad paper's description of its "sampling" baseline (Fig. 4 caption); Table I gives it 0 padding."""


def sampling_plan(lengths, t_max: int, *, seed: int = 0) -> PackPlan:
    """The BLoad paper's "sampling" baseline: pieces of exactly ``t_max`` frames and nothing else.

    Each sequence is cut into ``length // t_max`` pieces of exactly ``t_max`` frames (``t_max``: the
    mean length, as the Fig. 4 caption says); the tail and every sequence shorter than ``t_max`` are
    deleted, so no block is padded (Table I: 0 padding). ``chunk`` differs in one point only: it keeps a
    short sequence whole and pads its block. Lengths [50, 30, 10] at t_max 22: pieces (0, 0), (0, 22)
    and (1, 0); deleted 6 + 8 + 10 = 24 frames, padding 0 (chunk keeps id 2 and pads 12 frames).
    """
    plan = pack(lengths, t_max, strategy="chunk", seed=seed)
    short = [block for block in plan.blocks if block.frames < t_max]
    blocks = [block for block in plan.blocks if block.frames == t_max]
    return PackPlan(
        blocks,
        t_max,
        "sampling",
        seed,
        plan.sequences,
        deleted=plan.deleted + sum(block.frames for block in short),
        cut=plan.cut,
    )


def mix_pad_plan(lengths, t_max: int, *, seed: int = 0) -> PackPlan:
    """The BLoad paper's "mix pad" baseline as its Table I's numbers pin it: every sequence padded or trimmed
    to one sample of exactly ``t_max`` frames (the mean length), one sample per sequence.

    The text never describes "mix pad", but Table I does: on Action Genome's 7,464 training videos (166,785
    frames) it deletes 40,289 frames and pads 37,712; 166,785 - 40,289 + 37,712 = 164,208 = 7,464 x 22
    exactly, and 22 is the mean length (166,785 / 7,464 = 22.3). So each video becomes one sample of 22
    frames: a longer one keeps its first 22 (the rest deleted), a shorter one is padded. (Sampling's
    166,785 - 92,271 = 74,514 = 3,387 x 22 frames fit the pieces of ``sampling_plan`` the same way.)
    Lengths [50, 30, 10] at t_max 22: samples of 22, 22 and 10 (+12 padding), deleted 28 + 8 = 36.
    ``seed`` only shuffles the sample order.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(lengths))
    blocks = [Block(ids=(int(i),), starts=(0,), lengths=(int(min(lengths[i], t_max)),)) for i in order]
    over = np.clip(lengths - t_max, 0, None)
    return PackPlan(
        blocks, t_max, "mix", seed, len(lengths), deleted=int(over.sum()), cut=int((over > 0).sum())
    )


# ------------------------------------------------------------------------------------ single process
def busy(seconds: float) -> None:
    """Burn CPU for ``seconds`` (a calibrated stand-in for augmentation work the set does not have)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@dataclass
class LocalData:
    """The job's synthetic data path in one process: catalogs, augmentations, plans, block rows.

    ``videos`` renders at ``cache_size`` (what ``runtime.feed`` does for the synthetic set), so the
    partial augmentation's resize is the identity and evaluation frames are a centre crop of the render.
    """

    config: Config
    videos: SyntheticVideos = field(init=False)
    catalogs: dict[str, Any] = field(init=False)
    t_max: int = field(init=False)
    max_sequences: int = field(init=False)

    def __post_init__(self) -> None:
        d = self.config.data
        self.videos = SyntheticVideos(
            d.num_classes, d.stride, max(8, d.cache_size), d.seed, d.max_videos, val_fraction=d.val_fraction
        )
        self.catalogs = {split: self.videos.catalog(split) for split in ("train", "val", "test")}
        longest = max(int(c.lengths.max()) for c in self.catalogs.values())
        self.t_max = d.t_max if d.t_max is not None else longest
        every = np.concatenate([c.lengths for c in self.catalogs.values()])
        self.max_sequences = max_sequences_bound(every, self.t_max)

    @property
    def num_classes(self) -> int:
        return int(self.config.data.num_classes)

    def partial(self, video: int, epoch: int, *, extra_ops: int = 0) -> np.ndarray:
        """Decode (render) + the partial augmentation the job computes for ``video`` in ``epoch``."""
        d = self.config.data
        frames = self.videos.render(int(video))
        return partial_augment(
            frames, size=d.cache_size, rng=partial_rng(d.seed, int(video), epoch), extra_ops=extra_ops
        )

    def eval_frames(self, video: int) -> np.ndarray:
        """The evaluation input of a video: deterministic resize (identity here), no augmentation."""
        return resize_video(self.videos.render(int(video)), self.config.data.cache_size)

    def plan(self, split: str, strategy: str, t_max: int, seed: int) -> PackPlan:
        """``pack``'s plan, or the baselines outside ``pack``: ``sampling_plan`` ("sampling") and
        ``mix_pad_plan`` ("mix")."""
        if strategy == "sampling":
            return sampling_plan(self.catalogs[split].lengths, t_max, seed=seed)
        if strategy == "mix":
            return mix_pad_plan(self.catalogs[split].lengths, t_max, seed=seed)
        return pack(self.catalogs[split].lengths, t_max, strategy=strategy, seed=seed)

    def epoch_plan(self, strategy: str, epoch: int, t_max: int | None = None) -> PackPlan:
        """The training plan of ``epoch`` with the job's per-epoch packing seed."""
        return self.plan("train", strategy, t_max or self.t_max, plan_seed(self.config.data.seed, epoch))

    def rows(
        self,
        split: str,
        plan: PackPlan,
        arrays: dict[int, np.ndarray],
        *,
        epoch: int | None,
        batch_rows: int | Sequence[int],
        center: bool,
        max_sequences: int | None = None,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Mini-batches of block rows (collated tensors), in the plan's order.

        ``batch_rows``: rows per mini-batch, or the row count of each mini-batch in turn (``[3, 3, 2]``
        cuts 8 rows into 3 steps).
        ``arrays[video id]`` holds the partially augmented frames; ``center`` selects the evaluation
        crop instead of the seeded random crop and flip (``assembly.assemble_rows`` either way).
        """
        catalog = self.catalogs[split]
        specs = plan_specs(plan, 1, catalog.ids.tolist(), catalog.labels.tolist(), None)[0]
        d = self.config.data
        shard = EpochShard(
            split=split, epoch=epoch, rank=0, world_size=1, blocks=tuple(specs), t_max=plan.t_max,
            max_sequences=max_sequences or self.max_sequences, crop=d.crop, channels=3, seed=d.seed,
            center=center, recomputed=0, reused=0,
        )  # fmt: skip
        items = shard_items(shard)
        fmt_ = shard.row_format
        if isinstance(batch_rows, int):
            batch_rows = [batch_rows] * -(-len(items) // batch_rows)
        if sum(batch_rows) < len(items):
            raise ValueError(f"batch_rows {list(batch_rows)} do not cover the {len(items)} rows of the plan")
        lo = 0
        for count in batch_rows:
            part = items[lo : lo + count]
            lo += count
            if not part:
                break
            batch = {key: np.stack([item[key] for item in part]) for key in part[0]}
            yield collate_rows(assemble_rows(batch, arrays, fmt_))

    def eval_batches(self, split: str, strategy: str = "optimal", t_max: int | None = None) -> list:
        """Every row of an evaluation split, packed once (fixed seed), centre crop: a list of batches."""
        catalog = self.catalogs[split]
        t_max = t_max or self.t_max
        seed = plan_seed(self.config.data.seed, -1 if split == "val" else -2)
        plan = self.plan(split, strategy, t_max, seed)
        arrays = {int(v): self.eval_frames(int(v)) for v in catalog.ids}
        bound = max_sequences_bound(catalog.lengths, t_max)
        return list(
            self.rows(split, plan, arrays, epoch=None, batch_rows=16, center=True, max_sequences=bound)
        )
