"""The result of one run: ``RunSummary`` -> summary.json, a terminal result table and curves.png.

What it records: the evidence each technique (docs/ARCHITECTURE.md) must show, in one place. BLoad packing
(Iftekhar, Ruschel et al.): frames deleted (0) and padding, and the block count against the lower bound
ceil(frames / t_max). AAVG (Cong et al.): validation accuracy per averaging round and the adaptive batch
size over time. Revamper refurbishing (Lee et al.): partial augmentations recomputed vs reused. Time split:
compute vs averaging vs waiting on data, the trade-off every technique moves.

Trade-off: the summary is plain data (lists of small dicts), so it is JSON as is and cheap to ship from a
worker; matplotlib is imported only inside ``plot_curves`` and draws on a private Agg canvas (no pyplot
global state), so importing this module costs nothing and plotting works on a headless node.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["SUMMARY_FILE", "RunSummary", "format_table", "load_plotting", "plot_curves"]

SUMMARY_FILE = "summary.json"

# Keys every history entry / breakdown must carry (more keys are kept as they are).
_HISTORY_KEYS = {
    "val_accuracy_history": ("round", "epoch", "accuracy", "time_s"),
    "batch_size_history": ("round", "batch_size", "time_s"),
    "loss_history": ("round", "loss", "time_s"),
}
_BREAKDOWN_KEYS = {
    "seconds": ("total", "compute", "averaging", "data_wait"),
    "packing": ("strategy", "blocks", "lower_bound_blocks"),
    "refurbish": ("reuse", "recomputed", "reused"),
}


@dataclass(kw_only=True)
class RunSummary:
    """The numbers of one finished run; ``write`` saves them as summary.json, ``load`` reads them back.

    ``path`` is the run folder (set by ``write``/``load``, not stored in the JSON); ``extra`` holds any
    further top-level keys (written beside the fields, and unknown keys of a loaded file land here).
    """

    dataset: str
    """Dataset name (config data.dataset)."""
    learners: int
    """Learners at the end of the run."""
    epochs: int | float
    """Epochs trained; a run ended by train.steps inside an epoch adds that epoch's share of rows done."""
    test_accuracy: float | None
    """Accuracy on the test set in [0, 1]; None when the run was not tested."""
    top5_accuracy: float | None = None
    """Test sequences whose label is among the model's 5 highest scores, in [0, 1]."""
    mean_class_accuracy: float | None = None
    """The mean over test classes of each class's accuracy (MMAction2's mean class accuracy)."""
    test_views: str = "center"
    """How each test video was scored: "center" (one centre crop) or the multi-view scheme used."""
    val_accuracy_history: list[dict[str, Any]] = field(default_factory=list)
    """One entry per validation: {round, epoch, accuracy, time_s}, accuracy in [0, 1]."""
    batch_size_history: list[dict[str, Any]] = field(default_factory=list)
    """The AAVG batch size from each averaging round on: {round, batch_size, time_s}."""
    loss_history: list[dict[str, Any]] = field(default_factory=list)
    """Mean training loss per averaging round: {round, loss, time_s}."""
    rounds: int = 0
    """Averaging rounds completed."""
    steps: int = 0
    """Optimizer steps each learner took (N in AAVG Algorithm 1 when train.steps set the run's end)."""
    frames_total: int = 0
    """Real (non-padding) frames trained on, summed over epochs."""
    frames_deleted: int = 0
    """Frames cut away by the packer (0 for every strategy except "chunk")."""
    padding_frames: int = 0
    """Zero frames added to fill blocks, summed over epochs."""
    padding_fraction: float = 0.0
    """padding_frames / (frames_total + padding_frames)."""
    frames_per_second: float = 0.0
    """Useful (non-padding) frames trained per second of wall time, all learners together."""
    seconds: dict[str, float] = field(
        default_factory=lambda: {"total": 0.0, "compute": 0.0, "averaging": 0.0, "data_wait": 0.0}
    )
    """Wall time split: {total, compute, averaging, data_wait}; newer runs take every bucket from rank
    0's timeline (data_wait: epochs >= 1) and add startup (driver start to rank 0's first step),
    cold_epoch (its data wait in epoch 0), validation, test and write (final checkpoint to summary)."""
    packing: dict[str, Any] = field(
        default_factory=lambda: {"strategy": "optimal", "blocks": 0, "lower_bound_blocks": 0}
    )
    """Packing of the training set per epoch: {strategy, blocks, lower_bound_blocks}."""
    refurbish: dict[str, Any] = field(default_factory=lambda: {"reuse": 1, "recomputed": 0, "reused": 0})
    """Partial augmentations over the run: {reuse, recomputed, reused}."""
    config: dict[str, Any] = field(default_factory=dict)
    """The run's Config.to_dict()."""
    membership: list[dict[str, Any]] = field(default_factory=list)
    """Learner joins and leaves, one entry per event."""
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    """Learners dropped from a round or restarted, with the logged reason."""
    videos: dict[str, Any] = field(default_factory=dict)
    """Videos per split and the ones skipped as unreadable: {train, val, test, skipped: [paths]}."""
    stream: str = "rgb"
    """What the model saw: "rgb", "flow" or "fuse" (config data.stream)."""
    flow_method: str | None = None
    """Optical flow algorithm of a flow stream ("tvl1" or "farneback"); None for rgb."""
    per_class_accuracy: dict[str, float] = field(default_factory=dict)
    """Test accuracy of each class, keyed by class name."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Any further top-level keys of summary.json."""
    path: Path | None = field(default=None, compare=False)
    """The run folder holding summary.json (not stored in the JSON)."""

    def __post_init__(self) -> None:
        for name, keys in {**_HISTORY_KEYS, **_BREAKDOWN_KEYS}.items():
            value = getattr(self, name)
            entries = value if name in _HISTORY_KEYS else [value]
            if not isinstance(value, list if name in _HISTORY_KEYS else dict):
                raise TypeError(f"RunSummary.{name} must be a {'list' if name in _HISTORY_KEYS else 'dict'}")
            for i, entry in enumerate(entries):
                missing = [k for k in keys if not isinstance(entry, dict) or k not in entry]
                if missing:
                    where = f"{name}[{i}]" if name in _HISTORY_KEYS else name
                    raise ValueError(f"RunSummary.{where} lacks {missing}: give every entry the keys {keys}")
        clash = sorted(set(self.extra) & _field_names())
        if clash:
            raise ValueError(f"RunSummary.extra keys {clash} clash with fields: set the fields themselves")

    @property
    def json_path(self) -> Path:
        """``path / "summary.json"``; ValueError before ``write``/``load`` set ``path``."""
        if self.path is None:
            raise ValueError("this RunSummary has no run folder yet: call write(run_dir) first")
        return self.path / SUMMARY_FILE

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: the fields (less ``path``, ``extra``) and ``extra``'s keys beside them."""
        out = _plain(
            {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _LOCAL}
        )
        out.update(_plain(self.extra))
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: Path | None = None) -> RunSummary:
        """Inverse of ``to_dict``: unknown top-level keys go to ``extra``."""
        names = _field_names()
        known = {k: v for k, v in d.items() if k in names and k not in _LOCAL}
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**known, extra=extra, path=path)

    def write(self, run_dir: str | Path) -> Path:
        """Write ``run_dir/summary.json`` (indent 2, sorted keys), set ``self.path``, return the file."""
        run_dir = Path(run_dir).expanduser()
        run_dir.mkdir(parents=True, exist_ok=True)
        target = run_dir / SUMMARY_FILE
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False)
        # Write then rename: a reader (or a crash) never sees half a file.
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(text + "\n")
        tmp.replace(target)
        self.path = run_dir
        logger.info("summary written to %s", target)
        return target

    @classmethod
    def load(cls, path: str | Path) -> RunSummary:
        """Read a summary.json (or the run folder holding one)."""
        path = Path(path).expanduser()
        if path.is_dir():
            path = path / SUMMARY_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no {SUMMARY_FILE} at {path}: pass a run folder or its summary.json")
        return cls.from_dict(json.loads(path.read_text()), path=path.parent)


def _field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(RunSummary)}


# Fields that are not written as keys of their own: the folder, and the bag whose keys sit at top level.
_LOCAL = ("path", "extra")


def _plain(value: Any) -> Any:
    """Deep copy into JSON types: numpy/torch values -> Python numbers/lists, NaN/inf -> None, Path -> str."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # Strict JSON has no NaN; null says "no value" honestly (e.g. a loss that diverged).
        return value if math.isfinite(value) else None
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays, without importing either
        return _plain(value.tolist())
    raise TypeError(f"summary value {value!r} of type {type(value).__name__} is not JSON-able: convert it")


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole else "n/a"


def _acc(value: float | None) -> str:
    return "n/a" if value is None else f"{100.0 * value:.1f} %"


# The time buckets of ``seconds`` in the table's order (older summaries lack the first and the last four).
_TIME_PARTS = (
    ("startup", "startup"),
    ("cold_epoch", "cold epoch wait"),
    ("compute", "compute"),
    ("averaging", "averaging"),
    ("data_wait", "data wait"),
    ("validation", "validation"),
    ("test", "test"),
    ("write", "write"),
)


def format_table(summary: RunSummary) -> str:
    """A readable, aligned result table for the terminal: accuracy, frames, time split, packing, reuse."""
    s = summary
    title = s.config.get("run", {}).get("run_name") or (s.path.name if s.path else "run")
    fuse = s.extra.get("fuse") if isinstance(s.extra.get("fuse"), dict) else None
    rows = _test_rows(s, fuse)  # (label, value, note): three aligned columns
    if fuse:
        # Nothing was trained: the training rows (frames, packing, refurbishing, rounds) would all be 0.
        rows.append(("test videos", f"{fuse.get('test_videos', 0):,}", "scored by both streams"))
        rows.append(("time total", f"{float(s.seconds['total']):,.1f} s", "evaluation of both runs"))
        return _table(f"{title}: {s.dataset}, two-stream fusion", rows)
    rows += [*_training_rows(s), *_time_rows(s.seconds), *_technique_rows(s)]
    epochs = f"{s.epochs:g}" if isinstance(s.epochs, float) else str(s.epochs)
    steps = f", {s.steps} steps" if s.steps else ""
    head = f"{title}: {s.dataset}, {s.learners} learners, {epochs} epochs{steps}, {s.rounds} averaging rounds"
    return _table(head, rows)


def _test_rows(s: RunSummary, fuse: dict | None) -> list[tuple[str, str, str]]:
    """The test scores (each stream's too for a fused run), the stream and the videos per split."""
    rows = [("test accuracy", _acc(s.test_accuracy), "mean of the two softmax" if fuse else "top-1")]
    if s.top5_accuracy is not None:
        rows.append(("  top-5", _acc(s.top5_accuracy), ""))
    if s.mean_class_accuracy is not None:
        rows.append(("  mean class", _acc(s.mean_class_accuracy), "each class weighs the same"))
    if s.test_views != "center":
        rows.append(("  views", s.test_views, "softmax averaged over the views"))
    if fuse:
        rows.append(("  rgb stream", _acc(fuse.get("rgb_accuracy")), str(fuse.get("rgb_run", ""))))
        rows.append(("  flow stream", _acc(fuse.get("flow_accuracy")), str(fuse.get("flow_run", ""))))
    rows.append(("stream", s.stream, f"flow method {s.flow_method}" if s.flow_method else ""))
    if s.videos:
        counts = "/".join(str(s.videos.get(split, "-")) for split in ("train", "val", "test"))
        skipped = s.videos.get("skipped") or []
        note = f"train/val/test; {len(skipped)} skipped" + (f" (e.g. {skipped[0]})" if skipped else "")
        rows.append(("videos", counts, note))
    return rows


def _training_rows(s: RunSummary) -> list[tuple[str, str, str]]:
    """The last and best validation, the frames trained, deleted and padded, and the throughput."""
    rows = []
    if s.val_accuracy_history:
        best = max(s.val_accuracy_history, key=lambda e: e["accuracy"])
        last = s.val_accuracy_history[-1]
        note = f"last; best {_acc(best['accuracy'])} (round {best['round']})"
        rows.append(("val accuracy", _acc(last["accuracy"]), note))
    else:
        rows.append(("val accuracy", "n/a", "no validation rounds"))
    rows.append(("frames trained", f"{s.frames_total:,}", "real frames, all epochs"))
    rows.append(("frames deleted", f"{s.frames_deleted:,}", ""))
    rows.append(("padding", f"{s.padding_frames:,}", f"{100.0 * s.padding_fraction:.2f} % of block frames"))
    rows.append(("throughput", f"{s.frames_per_second:,.1f}", "useful frames/s"))
    return rows


def _time_rows(sec: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The total time and its buckets, each with its share of the total."""
    total = float(sec["total"])
    rows = [("time total", f"{total:,.1f} s", "")]
    parts = [
        (label, sec[key])
        for key, label in _TIME_PARTS
        if key in sec or key in ("compute", "averaging", "data_wait")
    ]
    other = total - sum(float(v) for _, v in parts)
    # "other" is what no bucket measured (checkpoints inside rounds, process start); it only makes sense
    # when the parts fit inside the total.
    if other >= 0:
        parts.append(("other", other))
    for name, value in parts:
        rows.append((f"  {name}", f"{float(value):,.1f} s", f"{_pct(float(value), total):>7}"))
    return rows


def _technique_rows(s: RunSummary) -> list[tuple[str, str, str]]:
    """What each technique did: the blocks against their lower bound (BLoad), the augmentations reused
    (refurbishing), the batch sizes (AAVG) and the loss."""
    pk = s.packing
    over = pk["blocks"] - pk["lower_bound_blocks"]
    bound = f"{pk['strategy']}; lower bound {pk['lower_bound_blocks']:,} (+{over})"
    rows = [("packing", f"{pk['blocks']:,} blocks", bound)]
    rf = s.refurbish
    done = rf["recomputed"] + rf["reused"]
    reuse = f"recomputed {rf['recomputed']:,}, reused {rf['reused']:,} ({_pct(rf['reused'], done)} reused)"
    rows.append(("refurbish", f"r = {rf['reuse']}", reuse))
    rows += _feed_rows(s)
    if s.batch_size_history:
        sizes = [e["batch_size"] for e in s.batch_size_history]
        rows.append(("batch size", f"{sizes[0]} -> {sizes[-1]}", f"max {max(sizes)}"))
    if s.loss_history:
        rows.append(("loss", f"{s.loss_history[-1]['loss']:.4f}", f"first {s.loss_history[0]['loss']:.4f}"))
    return rows


def _feed_rows(s: RunSummary) -> list[tuple[str, str, str]]:
    """The feed's CPU per kept frame (warm, else cold), and the feed CPUs one learner needs at the
    learners' measured rate: a learner training 1,000 frames a second at 5e-4 CPU-seconds a frame needs 0.5
    CPUs."""
    feed = s.extra.get("feed")
    if not isinstance(feed, dict) or not feed.get("kept_frames"):
        return []
    warm, cold = feed.get("cpu_s_per_kept_frame_warm"), feed.get("cpu_s_per_kept_frame_cold")
    per_frame = warm if warm is not None else cold
    note = f"cold {cold * 1e3:.3f} ms; learners waited {feed['learner_wait_s']:.1f} s" if cold else ""
    rows = [("feed CPU a frame", f"{per_frame * 1e3:.3f} ms", ("warm; " if warm is not None else "") + note)]
    rate = s.frames_per_second / max(s.learners, 1)
    if rate and per_frame:
        needed = f"{rate * per_frame:.2f} CPUs"
        rows.append(
            (
                "feed per learner",
                needed,
                f"at {rate:,.0f} frames/s a learner, {per_frame * 1e3:.3f} ms a frame",
            )
        )
    return rows


def _table(head: str, rows: list[tuple[str, str, str]]) -> str:
    """Three aligned columns (label, right-aligned value, note) between two rules."""
    w_label = max(len(r[0]) for r in rows)
    w_value = max(len(r[1]) for r in rows)
    lines = [f"{label:<{w_label}}  {value:>{w_value}}  {note}".rstrip() for label, value, note in rows]
    rule = "-" * max(len(head), *(len(line) for line in lines))
    return "\n".join([head, rule, *lines, rule])


def load_plotting() -> None:
    """Import what ``plot_curves`` and ``plot_confusion`` use (the driver calls it on a thread while the
    learners train, so the plots at the end do not wait for matplotlib's import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401


def plot_curves(summary: RunSummary, path: str | Path) -> Path:
    """Save curves.png: validation accuracy, training loss and batch size (step plot) against time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    s = summary
    fig = Figure(figsize=(15, 4.4), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_acc, ax_loss, ax_bs = fig.subplots(1, 3)

    def empty(ax, what: str, *, keep_y: bool = False) -> None:
        # A note instead of a blank frame, and no made-up 0..1 scales on the axes.
        ax.text(
            0.5, 0.5, f"no {what} recorded", ha="center", va="center", transform=ax.transAxes, color="0.4"
        )
        ax.set_xticks([])
        if not keep_y:
            ax.set_yticks([])

    val = s.val_accuracy_history
    if val:
        ax_acc.plot([e["time_s"] for e in val], [100 * e["accuracy"] for e in val], "o-", label="validation")
    else:
        empty(ax_acc, "validation rounds", keep_y=True)
    if s.test_accuracy is not None:
        ax_acc.axhline(
            100 * s.test_accuracy, color="C3", ls="--", label=f"test {100 * s.test_accuracy:.1f} %"
        )
    if val or s.test_accuracy is not None:
        ax_acc.legend(loc="lower right")
    ax_acc.set(title="Validation accuracy", xlabel="time (s)", ylabel="accuracy (%)", ylim=(0, 102))

    loss = s.loss_history
    if loss:
        ax_loss.plot([e["time_s"] for e in loss], [e["loss"] for e in loss], ".-", color="C1")
    else:
        empty(ax_loss, "training loss")
    ax_loss.set(title="Training loss (per averaging round)", xlabel="time (s)", ylabel="mean loss")

    bs = s.batch_size_history
    if bs:
        times = [e["time_s"] for e in bs]
        sizes = [e["batch_size"] for e in bs]
        if s.seconds["total"] > times[-1]:
            # The last size holds until the run ends: extend the final step to the total time.
            times, sizes = [*times, s.seconds["total"]], [*sizes, sizes[-1]]
        ax_bs.step(times, sizes, where="post", color="C2")
        if max(sizes) >= 8 * min(sizes):
            # AAVG multiplies by b2, so a log2 axis gives every growth step the same height.
            ax_bs.set_yscale("log", base=2)
            ax_bs.yaxis.set_major_formatter(ScalarFormatter())
        else:
            ax_bs.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        empty(ax_bs, "batch sizes")
    ax_bs.set(title="AAVG batch size", xlabel="time (s)", ylabel="blocks per mini-batch")

    for ax in (ax_acc, ax_loss, ax_bs):
        ax.grid(alpha=0.3)
    name = s.config.get("run", {}).get("run_name") or (s.path.name if s.path else s.dataset)
    fig.suptitle(f"{name}: {s.learners} learners, {s.epochs} epochs, {s.rounds} averaging rounds")
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    logger.info("curves written to %s", path)
    return path


def plot_confusion(summary: RunSummary, cells: Mapping[str, int] | None, path: str | Path) -> Path | None:
    """``confusion.png``: the test confusion matrix, rows = true class, columns = predicted, each row
    normalised to its class's count (a perfect model is the diagonal). ``cells`` maps "true,pred" to a
    count (what the learners report); None or empty: nothing is drawn and None is returned."""
    if not cells:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pairs = [(tuple(int(v) for v in key.split(",")), count) for key, count in cells.items()]
    names = list(summary.extra.get("class_names") or [])
    size = max(len(names), 1 + max(max(t, p) for (t, p), _ in pairs))
    matrix = np.zeros((size, size))
    for (truth, guess), count in pairs:
        matrix[truth, guess] += count
    totals = matrix.sum(1, keepdims=True)
    rates = np.divide(matrix, totals, out=np.zeros_like(matrix), where=totals > 0)
    fig, ax = plt.subplots(figsize=(max(4, size * 0.35 + 2), max(4, size * 0.35 + 1.5)))
    image = ax.imshow(rates, cmap="Blues", vmin=0.0, vmax=1.0)
    labels = names if len(names) == size else [str(i) for i in range(size)]
    if size <= 40:
        ax.set_xticks(range(size), labels, rotation=90, fontsize=7)
        ax.set_yticks(range(size), labels, fontsize=7)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(f"test confusion (top-1 {_acc(summary.test_accuracy)})")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    logger.info("confusion matrix written to %s", path)
    return path
