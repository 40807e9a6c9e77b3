"""Tests for raytrain_seq.outputs.summary: summary.json round trip, the result table and curves.png."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from raytrain_seq.config import Config
from raytrain_seq.outputs.summary import SUMMARY_FILE, RunSummary, format_table, plot_confusion, plot_curves

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REQUIRED_KEYS = {
    "dataset",
    "learners",
    "epochs",
    "test_accuracy",
    "val_accuracy_history",
    "batch_size_history",
    "loss_history",
    "rounds",
    "frames_total",
    "frames_deleted",
    "padding_frames",
    "padding_fraction",
    "frames_per_second",
    "seconds",
    "packing",
    "refurbish",
    "config",
}


def _full_summary() -> RunSummary:
    """A 12-round run: accuracy rises with dips (so the batch size doubles), loss falls."""
    val, sizes, loss = [], [], []
    batch, best = 4, 0.0
    for r in range(1, 13):
        t = 7.5 * r
        acc = 1 - math.exp(-r / 3) - (0.05 if r % 4 == 0 else 0.0)
        if acc < best:
            batch *= 2
        best = max(best, acc)
        val.append({"round": r, "epoch": (r - 1) // 2, "accuracy": acc, "time_s": t})
        sizes.append({"round": r, "batch_size": batch, "time_s": t})
        loss.append({"round": r, "loss": 2.3 * math.exp(-r / 4), "time_s": t})
    return RunSummary(
        dataset="synthetic",
        learners=2,
        epochs=6,
        test_accuracy=0.935,
        val_accuracy_history=val,
        batch_size_history=sizes,
        loss_history=loss,
        rounds=12,
        frames_total=123456,
        frames_deleted=0,
        padding_frames=312,
        padding_fraction=312 / (123456 + 312),
        frames_per_second=1371.7,
        seconds={"total": 90.0, "compute": 70.2, "averaging": 6.3, "data_wait": 1.8},
        packing={"strategy": "optimal", "blocks": 310, "lower_bound_blocks": 308},
        refurbish={"reuse": 3, "recomputed": 400, "reused": 800},
        config=Config.from_preset("smoke", run_name="run-a").to_dict(),
        membership=[{"round": 0, "event": "join", "rank": 1}],
        videos={"train": 108, "val": 12, "test": 40},
    )


def _empty_summary() -> RunSummary:
    return RunSummary(dataset="synthetic", learners=2, epochs=0, test_accuracy=None)


def test_json_round_trip_keeps_every_field(tmp_path):
    """write() -> load() gives an equal summary; the file is strict JSON with every required key."""
    summary = _full_summary()
    summary.extra["custom"] = {"note": 1}
    path = summary.write(tmp_path / "run")
    assert path == tmp_path / "run" / SUMMARY_FILE == summary.json_path
    raw = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert set(raw) >= REQUIRED_KEYS
    assert {"membership", "recoveries", "videos", "stream", "custom"} <= set(raw)
    assert "path" not in raw and "extra" not in raw
    assert set(raw["seconds"]) == {"total", "compute", "averaging", "data_wait"}
    assert set(raw["packing"]) == {"strategy", "blocks", "lower_bound_blocks"}
    assert set(raw["refurbish"]) == {"reuse", "recomputed", "reused"}
    assert Config.from_dict(raw["config"]).run.run_name == "run-a"
    for where in (tmp_path / "run", path):
        back = RunSummary.load(where)
        assert back == summary and back.path == tmp_path / "run"
        assert back.extra == {"custom": {"note": 1}}
    assert len(back.val_accuracy_history) == 12  # the round trip carried non-trivial histories


def test_numpy_scalars_and_nan_become_plain_json(tmp_path):
    """numpy numbers/arrays are written as JSON numbers/lists and NaN as null (strict JSON), not a crash."""
    summary = _empty_summary()
    summary.frames_total = np.int64(10)
    summary.frames_per_second = np.float32(2.5)
    summary.test_accuracy = float("nan")
    summary.per_class_accuracy = {"a": np.float32(0.5)}
    raw = json.loads(summary.write(tmp_path).read_text())
    assert raw["frames_total"] == 10 and raw["frames_per_second"] == 2.5 and raw["test_accuracy"] is None
    assert raw["per_class_accuracy"] == {"a": 0.5}


def test_malformed_histories_and_breakdowns_are_rejected():
    """A history entry or breakdown without its required keys raises naming the field and the keys."""
    with pytest.raises(ValueError, match=r"loss_history\[1\].*'loss'"):
        RunSummary(
            dataset="s",
            learners=1,
            epochs=1,
            test_accuracy=None,
            loss_history=[{"round": 1, "loss": 1.0, "time_s": 1.0}, {"round": 2, "time_s": 2.0}],
        )
    with pytest.raises(ValueError, match=r"seconds.*data_wait"):
        RunSummary(dataset="s", learners=1, epochs=1, test_accuracy=None, seconds={"total": 1.0})
    with pytest.raises(ValueError, match="clash"):
        RunSummary(dataset="s", learners=1, epochs=1, test_accuracy=None, extra={"rounds": 3})


def test_load_without_a_summary_names_the_path(tmp_path):
    """load() of a folder without summary.json raises FileNotFoundError naming the path."""
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        RunSummary.load(tmp_path)
    with pytest.raises(ValueError, match="write"):
        _empty_summary().json_path  # noqa: B018


def test_table_shows_the_key_numbers_aligned():
    """format_table shows accuracy, frames, padding %, frames/s, time split s and %, blocks vs bound, reuse."""
    summary = _full_summary()
    table = format_table(summary)
    s = summary.seconds
    other = s["total"] - s["compute"] - s["averaging"] - s["data_wait"]
    expected = [
        "93.5 %",  # test accuracy
        "123,456",  # frames
        f"{100 * summary.padding_fraction:.2f} %",
        "1,371.7",  # frames/s
        "90.0 s",
        "70.2 s",
        f"{100 * 70.2 / 90:.1f} %",
        "6.3 s",
        f"{100 * 6.3 / 90:.1f} %",
        "1.8 s",
        f"{100 * 1.8 / 90:.1f} %",
        f"{other:.1f} s",
        "310 blocks",
        "lower bound 308 (+2)",
        "recomputed 400",
        "reused 800",
        "run-a",
    ]
    missing = [e for e in expected if e not in table]
    assert missing == [], table
    best = max(summary.val_accuracy_history, key=lambda e: e["accuracy"])
    assert f"best {100 * best['accuracy']:.1f} % (round {best['round']})" in table
    assert (
        f"{summary.batch_size_history[0]['batch_size']} -> {summary.batch_size_history[-1]['batch_size']}"
        in table
    )
    assert summary.batch_size_history[-1]["batch_size"] > 4  # the history is non-trivial
    # Values are right-aligned: "93.5 %" and "123,456" end in the same column.
    lines = table.splitlines()
    ends = {
        line.index(v) + len(v) for v in ("93.5 %", "123,456", "310 blocks") for line in lines if v in line
    }
    assert len(ends) == 1


def test_table_of_an_empty_run_says_na():
    """An untested run with no rounds prints n/a instead of crashing or dividing by zero."""
    table = format_table(_empty_summary())
    assert "n/a" in table and "no validation rounds" in table


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _coloured(path: Path) -> float:
    """Fraction of clearly coloured pixels (the curves); text, axes and grid are all gray."""
    from matplotlib.image import imread

    rgb = imread(path)[..., :3]
    return float((rgb.max(axis=-1) - rgb.min(axis=-1) > 0.25).mean())


def test_plot_curves_writes_a_png_for_full_and_empty_histories(tmp_path):
    """curves.png is a real PNG for a full and an empty run; only the full one has coloured curves."""
    full = plot_curves(_full_summary(), tmp_path / "full" / "curves.png")
    empty = plot_curves(_empty_summary(), tmp_path / "empty.png")
    for path in (full, empty):
        assert path.stat().st_size > 10_000
        width, height = _png_size(path)
        assert width >= 1000 and height >= 300
    assert _coloured(full) > 0.002
    assert _coloured(empty) == 0.0


def test_importing_summary_does_not_import_matplotlib():
    """matplotlib is imported only inside plot_curves, so importing the module stays cheap."""
    code = "import sys, raytrain_seq.outputs.summary; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_top5_mean_class_and_the_confusion_plot(tmp_path):
    """The table shows top-5 and mean class accuracy; confusion.png draws the reported cells."""
    summary = RunSummary(
        dataset="synthetic",
        learners=2,
        epochs=1,
        test_accuracy=0.5,
        top5_accuracy=0.9,
        mean_class_accuracy=0.45,
        extra={"class_names": ["walk", "run", "jump"]},
    )
    table = format_table(summary)
    assert "top-5" in table and "90.0 %" in table and "mean class" in table and "45.0 %" in table
    written = plot_confusion(summary, {"0,0": 3, "0,1": 1, "2,2": 2, "1,0": 2}, tmp_path / "confusion.png")
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_confusion(summary, {}, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
    back = RunSummary.from_dict(summary.to_dict())
    assert (back.top5_accuracy, back.mean_class_accuracy, back.test_views) == (0.9, 0.45, "center")
