"""bench/flow_once.py: flow once vs recompute every refurbish, a tiny run checked for its invariants."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from raytrain_seq.algorithms.refurbish import RefurbishSchedule

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("flow_once_bench", ROOT / "bench" / "flow_once.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_computes_flow_only_in_epoch_0_and_prints_the_cpu_saved(capsys):
    """Epoch 0 refurbishes every video (flow once computes every flow then), later epochs exactly the
    schedule's evicted count with no flow computed; the JSON last line's per-epoch means and the saving
    follow from its rows; flow once costs far less than recomputing from epoch 1 on."""
    assert _bench().main(["--tiny", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert any(line.startswith("epochs >= 1, per epoch: recompute") for line in lines[:-1])
    rows, n = result["per_epoch"], result["videos"]
    schedule = RefurbishSchedule(n, reuse=result["reuse"], seed=0)
    assert [r["videos"] for r in rows] == [n] + [len(schedule.evicted(e)) for e in range(1, result["epochs"])]
    assert n >= 4 and rows[0]["flow_s"] > 0 and all(r["flow_s"] == 0 for r in rows[1:])
    assert all(r["videos"] > 0 and r["flow_once_s"] < r["recompute_s"] for r in rows[1:])
    steady = rows[1:]
    assert result["recompute_cpu_s_per_epoch"] == np.mean([r["recompute_s"] for r in steady])
    saved = result["recompute_cpu_s_per_epoch"] - result["flow_once_cpu_s_per_epoch"]
    assert result["saved_cpu_s_per_epoch"] == saved > 0 and result["ratio"] > 1
