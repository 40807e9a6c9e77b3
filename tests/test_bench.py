"""The benchmark scripts' pure helpers, and tiny runs of the single-process ones (no Ray, seconds)."""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import ablation  # noqa: E402
import averager_cost  # noqa: E402
import averaging  # noqa: E402
import batch_rule  # noqa: E402
import benchlib  # noqa: E402
import bload_table  # noqa: E402
import bn_merge  # noqa: E402
import dataloader_loop  # noqa: E402
import flat_device  # noqa: E402
import gpu_report  # noqa: E402
import learner_device  # noqa: E402
import microbatch  # noqa: E402
import packing as packing_bench  # noqa: E402
import randaugment  # noqa: E402
import refurbish as rb  # noqa: E402
import refurbish_loader as rl  # noqa: E402
import report  # noqa: E402
import startup  # noqa: E402

from raytrain_seq.algorithms.packing import pack, shard  # noqa: E402
from raytrain_seq.config import Config  # noqa: E402
from raytrain_seq.models.factory import build_model_for  # noqa: E402
from raytrain_seq.training.staging import stage_rows  # noqa: E402


@pytest.fixture(scope="module")
def small_data() -> benchlib.LocalData:
    return benchlib.LocalData(Config.from_preset("demo", max_videos=12))


# ------------------------------------------------------------------------------------------- benchlib
def test_every_image_and_file_the_benchmarks_page_links_exists(tmp_path):
    """docs/BENCHMARKS.md's images and relative links resolve; a result without a figure links none."""
    docs = Path(benchlib.__file__).resolve().parents[1] / "docs"
    links = re.findall(r"\]\(([^)#\s]+)\)", (docs / "BENCHMARKS.md").read_text())
    relative = [link for link in links if "://" not in link]
    assert relative and all((docs / link).exists() for link in relative), [
        link for link in relative if not (docs / link).exists()
    ]
    result = benchlib.Result(name="x", title="X", command="c", size="s", header=["a"], rows=[["1"]])
    benchlib.write_results(result, tmp_path)
    assert "png" not in (tmp_path / "x.md").read_text() and not (tmp_path / "x.png").exists()


def test_markdown_table_aligns_and_rejects_ragged_rows():
    """markdown_table: first column left, the rest right; a row of the wrong width raises ValueError."""
    text = benchlib.markdown_table(["a", "b", "c"], [["x", "1", "2"]])
    assert text.splitlines()[1] == "|:---|---:|---:|"
    with pytest.raises(ValueError, match="3 cells"):
        benchlib.markdown_table(["a", "b", "c"], [["x", "1"]])


def test_compare_accuracy_uses_two_standard_errors():
    """compare_accuracy: points, the se of a difference of two runs, and a verdict at 2 se."""
    diff, se, word = benchlib.compare_accuracy(0.75, 0.72, 1000)
    assert diff == pytest.approx(3.0)
    assert se == pytest.approx(100 * math.sqrt((0.75 * 0.25 + 0.72 * 0.28) / 1000))
    assert word == "is within noise of"  # 3.0 < 2 * 1.96
    assert benchlib.compare_accuracy(0.9, 0.7, 1000)[2] == "beats"
    assert benchlib.compare_accuracy(0.7, 0.9, 1000)[2] == "trails"


def test_local_rows_hold_every_sequence_of_the_plan_once(small_data):
    """LocalData.rows: the plan's blocks as collated rows, every train video once, frames where it says."""
    plan = small_data.epoch_plan("optimal", 0)
    assert any(len(b.ids) > 1 for b in plan.blocks), "the case must pack several sequences per block"
    arrays = {int(v): small_data.partial(int(v), 0) for v in small_data.catalogs["train"].ids}
    batches = list(small_data.rows("train", plan, arrays, epoch=0, batch_rows=[2] * 8, center=True))
    assert sum(len(b["num_sequences"]) for b in batches) == len(plan.blocks)
    lengths = torch.cat([b["lengths"] for b in batches])
    assert int(lengths.clamp(min=0).sum()) == int(small_data.catalogs["train"].lengths.sum())
    frames = torch.cat([b["frames"] for b in batches])
    row, slot = next((r, s) for r, b in enumerate(plan.blocks) for s in range(len(b.ids)) if b.starts[s] > 0)
    start, length = plan.blocks[row].starts[slot], plan.blocks[row].lengths[slot]
    video = int(small_data.catalogs["train"].ids[plan.blocks[row].ids[slot]])
    crop = small_data.config.data.crop
    offset = (arrays[video].shape[1] - crop) // 2
    expected = arrays[video][:, offset : offset + crop, offset : offset + crop]
    assert torch.equal(frames[row, start : start + length], torch.from_numpy(expected))
    with pytest.raises(ValueError, match="do not cover"):
        list(small_data.rows("train", plan, arrays, epoch=0, batch_rows=[1], center=True))


# ---------------------------------------------------------------------------------------- bload table
def test_steps_and_rows_give_every_strategy_the_same_steps():
    """steps_and_rows: the reference's ceil(blocks/batch) steps for all, sizes within one, all rows used."""
    steps, rows = bload_table.steps_and_rows({"optimal": 50, "pad": 200, "chunk": 7}, "optimal", 4)
    assert steps == 13
    assert rows["optimal"] == [4] * 11 + [3] * 2 and rows["pad"] == [16] * 5 + [15] * 8
    assert rows["chunk"] == [1] * 7  # fewer blocks than steps: one row a step
    for name, n in {"optimal": 50, "pad": 200}.items():
        assert sum(rows[name]) == n and len(rows[name]) == steps and max(rows[name]) - min(rows[name]) <= 1


def test_micro_rows_keep_the_frame_budget():
    """micro_rows: the same frames per micro-batch at a shorter t_max (4 x 222 -> 38 rows of 23)."""
    assert bload_table.micro_rows(4, 222, 23) == 38
    assert bload_table.micro_rows(4, 222, 222) == 4
    assert bload_table.micro_rows(1, 10, 100) == 1


def test_sampling_plan_is_chunk_without_padding():
    """The paper's sampling: pieces of exactly t_max; tails and shorter sequences deleted, nothing padded.

    Lengths [50, 30, 10] at t_max 22: pieces (0, 0), (0, 22), (1, 0); deleted 6 + 8 + 10 = 24 frames.
    chunk keeps id 2 whole (12 padding frames) and deletes only the 14 tail frames.
    """
    plan = benchlib.sampling_plan([50, 30, 10], 22, seed=3)
    assert sorted((b.ids[0], b.offsets[0], b.lengths[0]) for b in plan.blocks) == [
        (0, 0, 22),
        (0, 22, 22),
        (1, 0, 22),
    ]
    stats = plan.stats()
    assert (stats["padding"], stats["deleted"], stats["frames"], stats["strategy"]) == (0, 24, 66, "sampling")
    chunk = pack([50, 30, 10], 22, strategy="chunk", seed=3).stats()
    assert (chunk["padding"], chunk["deleted"]) == (12, 14)
    assert stats["frames"] + stats["deleted"] == 90 == chunk["frames"] + chunk["deleted"]


def test_bload_table_tiny_run_writes_a_consistent_table(tmp_path):
    """A tiny run: 0 frames deleted but by the cutting baselines, sampling pads none, pad pads most, same
    steps for all, top-5 >= top-1, verdicts compare bload with the paper's sampling baseline, files written."""
    res = bload_table.main(["--videos", "10", "--epochs", "1", "--batch", "2", "--results", str(tmp_path)])
    r = res["results"]
    assert list(r) == list(bload_table.STRATEGIES)
    assert {n: r[n]["stats"]["deleted"] for n in ("pad", "bload", "optimal")} == dict.fromkeys(
        ("pad", "bload", "optimal"), 0
    )
    assert r["chunk"]["stats"]["deleted"] > 0, "chunk must cut something for the table to mean anything"
    assert r["sampling"]["stats"]["deleted"] > r["chunk"]["stats"]["deleted"]
    assert r["sampling"]["stats"]["padding"] == 0 < r["chunk"]["stats"]["padding"]
    assert all(e["test_accuracy"] <= e["test_top_k"] <= 1.0 for e in r.values())
    assert r["sampling"]["piece_sequences"] < r["chunk"]["piece_sequences"], (
        "sampling drops short test videos"
    )
    assert r["pad"]["stats"]["padding"] > max(
        r["bload"]["stats"]["padding"], r["optimal"]["stats"]["padding"]
    )
    assert len({e["steps_per_epoch"] for e in r.values()}) == 1
    assert all(0.0 <= e["test_accuracy"] <= 1.0 for e in r.values())
    data = json.loads((tmp_path / "bload_table.json").read_text())
    assert data["headline"]["padding_cut_optimal"] == pytest.approx(
        r["pad"]["stats"]["padding"] / r["optimal"]["stats"]["padding"]
    )
    assert (tmp_path / "bload_table.png").stat().st_size > 0
    text = (tmp_path / "bload_table.md").read_text()
    assert f"{r['pad']['stats']['padding']:,}" in text
    assert "Accuracy against the paper's sampling baseline" in text and "test top-5" in text
    assert "accuracy_points_bload_minus_sampling" in data["headline"]
    assert r["mix"]["stats"]["deleted"] > 0 and r["mix"]["stats"]["padding"] > 0  # the paper's mix pad
    assert r["mix"]["stats"]["blocks"] == res["videos"]  # one sample per video
    assert all(e["epoch_s_every_frame"] > 0 for e in r.values())
    assert "epoch_speedup_bload_vs_pad_every_frame" in data["headline"]


def test_bload_table_runs_give_each_figure_its_runs_n_and_se(tmp_path):
    """--runs 2: each headline figure is the mean over the runs' seeds with its se, n and per-run values;
    accuracy gaps are paired by seed and called within noise below 3 seeds; the load of each run is kept."""
    res = bload_table.main(
        ["--videos", "10", "--epochs", "1", "--batch", "2", "--runs", "2", "--seed", "5",
         "--strategies", "pad", "sampling", "bload", "optimal", "--results", str(tmp_path)]
    )  # fmt: skip
    head = json.loads((tmp_path / "bload_table.json").read_text())["headline"]
    assert head["runs"] == 2 and head["seeds"] == [5, 6] and [r["seed"] for r in res["runs"]] == [5, 6]
    for key in ("padding_cut_optimal", "epoch_speedup_bload_vs_pad_every_frame", "test_accuracy_bload"):
        values = head[f"{key}_runs"]
        assert head[f"{key}_n"] == 2 and len(values) == 2
        assert head[key] == pytest.approx(np.mean(values))
        assert head[f"{key}_se"] == pytest.approx(np.std(values, ddof=1) / np.sqrt(2))
    cuts = [
        one["results"]["pad"]["stats"]["padding"] / one["results"]["optimal"]["stats"]["padding"]
        for one in res["runs"]
    ]
    assert head["padding_cut_optimal_runs"] == pytest.approx(cuts)
    assert head["accuracy_bload_minus_sampling_text"].endswith("(n = 2, within noise)")
    assert all(len(one["load"]) == 2 for one in res["runs"]) and len(head["load"]) == 2
    text = (tmp_path / "bload_table.md").read_text()
    assert (
        "2 run(s) at seeds [5, 6]" in text
        and "mean +- se over n = 2 runs" in text
        and "on 8 A100 GPUs" in text
    )


def test_packing_headline_gives_each_seed_and_the_mean_se_n():
    """bench/packing.py's JSON headline: per stride, naive padding over bload's for each of the 5 seeds and
    over optimal's (the same every seed), with mean, se and n."""
    head = packing_bench.headline("test")
    assert head["seeds"] == [0, 1, 2, 3, 4]
    for stride in packing_bench.STRIDES:
        key = f"test_stride{stride}_padding_cut_bload"
        assert head[f"{key}_n"] == 5 and head[key] == pytest.approx(np.mean(head[f"{key}_runs"]))
        assert head[f"{key}_se"] == pytest.approx(np.std(head[f"{key}_runs"], ddof=1) / np.sqrt(5))
        optimal = head[f"test_stride{stride}_padding_cut_optimal_runs"]
        assert len(set(optimal)) == 1 and head[f"test_stride{stride}_padding_cut_optimal_se"] == 0.0
        assert optimal[0] > head[key]  # the job's packer pads less than the random fill


def test_report_headline_cell_writes_the_se_and_n_beside_a_figure():
    assert (
        report.headline_cell({"x": 3.4321, "x_n": 3, "x_se": 0.051}, "x", "{:.2f}x")
        == "3.43x +- 0.05x (n = 3)"
    )
    assert report.headline_cell({"x": 5.02, "x_n": 1, "x_se": None}, "x", "{:.2f}x") == "5.02x (one run)"
    assert report.headline_cell(
        {"x": "+1.0 +- 2.0 (n = 3, within noise)", "x_n": 3, "x_se": 2.0}, "x", "{}"
    ) == ("+1.0 +- 2.0 (n = 3, within noise)")
    assert report.headline_cell({"x": 5.0}, "x", "{:.1f}x") == "5.0x" and report.headline_cell(
        {}, "x", "{}"
    ) == ("not measured")


def test_mix_pad_is_one_sample_of_the_mean_length_per_video():
    """mix_pad_plan: the docstring's example; Table I's counts (deleted + padding = videos x 22) hold."""
    plan = benchlib.mix_pad_plan([50, 30, 10], 22, seed=0)
    stats = plan.stats()
    assert sorted(b.lengths[0] for b in plan.blocks) == [10, 22, 22] and stats["padding"] == 12
    assert (stats["deleted"], stats["cut"], stats["blocks"]) == (36, 2, 3)
    assert 166_785 - 40_289 + 37_712 == 7_464 * 22  # the paper's mix pad column, as the docstring says


def test_encode_every_frame_gives_the_same_logits_and_encodes_the_padding():
    """EncodeEveryFrame: the job's model's logits (same weights) while its encoder sees rows x t_max frames."""
    torch.manual_seed(0)
    config = Config.from_preset("smoke")
    plain = build_model_for(config.model, num_classes=4, in_channels=3).double()
    dense = bload_table.EncodeEveryFrame(copy.deepcopy(plain))
    frames = torch.randint(0, 255, (2, 12, 16, 16, 3), dtype=torch.uint8)
    starts = torch.tensor([[0, 5], [0, -1]])
    lengths = torch.tensor([[5, 4], [7, -1]])
    counts = torch.tensor([2, 1])
    seen = []
    dense.model.encoder.inner.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    assert torch.allclose(dense(frames, starts, lengths, counts), plain(frames, starts, lengths, counts))
    assert seen == [2 * 12]  # 16 real frames and 8 padding frames, in one call


# ------------------------------------------------------------------------------------------ refurbish
def _refurbish_size() -> dict:
    return {"videos": 60, "epochs": 4, "seeds": [0], "reuse": [1, 3], "cost": 0.0}


def test_the_spread_table_steps_are_the_job_feeds_and_cover_each_epoch():
    """served_steps are BlockFeed's shards cut into full steps of B blocks (every video at most once an
    epoch, most of them once); the unbalanced orders hold the same videos; compose's steps hold exactly the
    asked videos with their fresh share within one."""
    config = rb.job_config(_refurbish_size(), 3, 0, 0.0, "/tmp")
    feed, geometry = rl.job_feed(config)
    ids = geometry.catalogs["train"].ids.tolist()
    served = rl.served_steps(feed, 4, 2, 4)
    spread_only = rl.unbalanced_steps(config, geometry, 4, 2, 4, spread=True)
    for epoch in (1, 2, 3):
        mine = [v for e, blocks in served if e == epoch for b in blocks for v in b.ids]
        assert len(mine) == len(set(mine)) > 0.6 * len(ids)
        other = [v for e, blocks in spread_only if e == epoch for b in blocks for v in b.ids]
        assert len(other) == len(set(other)) > 0.6 * len(ids)
    composed = rl.composed_steps(config, geometry, 4, 8)
    schedule = rl.RefurbishSchedule(len(ids), reuse=3, seed=0)
    fresh = [sum(schedule.is_fresh(e)[ids.index(v)] for b in blocks for v in b.ids) for e, blocks in composed]
    assert all(sum(len(b.ids) for b in blocks) == 8 for _, blocks in composed)
    assert max(fresh) - min(fresh) <= 1


def test_step_costs_add_the_fresh_partials_and_the_rows():
    """A step costs its fresh videos' partial CPU plus each of its blocks' row CPU; spread() is std/mean."""
    block = rl.BlockSpec(
        ids=(1, 2), starts=(0, 3), lengths=(3, 4), offsets=(0, 0), labels=(0, 0), plan_index=0
    )
    steps = [(1, (block,)), (2, (block, block))]
    costs = rl.step_costs(
        steps, {1: 0.5, 2: 0.25}, lambda b: 0.125, lambda epoch: {1} if epoch == 1 else {1, 2}
    )
    assert costs["cpu"].tolist() == [0.625, 1.75] and costs["fresh"].tolist() == [1, 4]
    assert rl.spread(np.array([1.0, 3.0]))["cv"] == pytest.approx(0.5)


def test_refurbish_headline_pairs_by_seed_and_carries_standard_errors():
    """by_reuse: per r the means over seeds, the speedup and accuracy gap to r = 1 paired by seed with
    their se; headline() is the JSON last line the issue fixes; the verdicts judge the target."""
    runs = [
        {"reuse": r, "seed": s, "samples_s": 100.0 * (1 + 0.5 * (r == 3)) + s, "cpu_ms_per_sample": 20.0 / (1 + (r == 3)),
         "accuracy": 0.6 + 0.01 * s - 0.005 * (r == 3), "recomputed": 10, "load": [1.0, 2.0], "test_videos": 50}
        for r in (1, 3) for s in (0, 1, 2)
    ]  # fmt: skip
    spreads = {r: {k: {"cv": 0.1 * r} for k in ("served", "spread_only", "plan", "compose")} for r in (1, 3)}
    stats = rb.by_reuse(runs, spreads)
    assert stats[3]["speedup"] == pytest.approx(np.mean([151 / 101, 152 / 102, 150 / 100]))
    assert stats[3]["acc_points"] == pytest.approx(-0.5) and stats[3]["acc_points_se"] == pytest.approx(
        0.0, abs=1e-9
    )
    head = rb.headline(stats)
    assert head["feed"] == "job" and set(head["by_r"]) == {"1", "3"}
    assert {"samples_s", "cpu_ms_per_sample", "step_cpu_cv", "acc_mean", "acc_se"} <= set(head["by_r"]["3"])
    lines, head = rb.verdicts({"stats": stats, "spread": spreads, "runs": runs, "cores": 2})
    for key, se in (
        ("speedup", "speedup_se"),
        ("cpu_saving", "cpu_saving_se"),
        ("accuracy", "acc_points_se"),
    ):
        assert head[f"r3_{key}_text_n"] == 3 and head[f"r3_{key}_text_se"] == stats[3][se]
    text = " ".join(lines)
    assert "the paper's 1.03-2.04x, measured on GPUs (this run: CPU cores)" in text
    assert "target >= 1.5x: NOT met" in text  # 1.49x: the verdict follows the number
    assert "target (within one standard error of r = 1's): met" in text


def test_randaugment_changes_images_and_calibration_is_positive():
    """randaugment keeps shape and dtype and alters the image; calibrate returns a positive cost."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    outs = [randaugment.randaugment(image, np.random.default_rng(s)) for s in range(6)]
    assert all(o.shape == image.shape and o.dtype == np.uint8 for o in outs)
    assert any(not np.array_equal(o, image) for o in outs)
    assert randaugment.calibrate(size=32, images=2) > 0


# ----------------------------------------------------------------------------------------- microbatch
def test_overhead_vs_fit_is_per_sample():
    """overhead_vs_fit: streamed s/sample over plain-at-fit s/sample minus one; None when missing."""
    assert microbatch.overhead_vs_fit(1.04, 1024, 0.016, 16) == pytest.approx(1.04 / 1024 / 0.001 - 1)
    assert microbatch.overhead_vs_fit(None, 1024, 0.016, 16) is None


def test_microbatch_tiny_run_gradients_agree(tmp_path):
    """A tiny CPU run streams 16 and 32 rows: gradients equal (fp32 1e-5, fp64 1e-9); the GPU part is declared missing."""
    res = microbatch.main(["--tiny", "--repeats", "1", "--device", "cpu", "--results", str(tmp_path)])
    assert [r["size"] for r in res["rows"]] == [16, 32]
    diffs = [r["grad_diff"] for r in res["rows"]]
    assert all(d is not None and d <= 1e-5 for d in diffs) and diffs[1] > 0, "32 rows in 2 micro-batches"
    assert res["float64"]["size"] == 32 and res["float64"]["diff"] <= 1e-9
    text = (tmp_path / "microbatch.md").read_text()
    assert "no GPU" in text
    # the accuracy column: plain only within the simulated cap (16 rows), streamed at every size
    acc = res["accuracy"]
    assert [(a["size"], a["micro"], a["plain"] is None) for a in acc] == [(16, 8, False), (32, 16, True)]
    assert all(0.0 <= a["streamed"] <= 1.0 for a in acc) and "Failed (cap)" in text


def test_microbatch_verdict_names_a_device_that_one_micro_batch_does_not_fill():
    """The H200 run's numbers (docs/LOG.md, 2026-11-26): plain steps of 16 and 32 small images take about
    the same time, so the overhead is launches and the verdict says so; at about 2x it does not."""

    def res(plain_16: float, plain_32: float) -> dict:
        rows = [
            {"size": 16, "vs_fit": 0.0, "plain_s": plain_16, "stream_s": 0.002, "grad_diff": None, "grad_worst": None},
            {"size": 32, "vs_fit": 0.38, "plain_s": plain_32, "stream_s": 0.003, "grad_diff": None, "grad_worst": None},
        ]  # fmt: skip
        return {"rows": rows, "micro": 16, "cuda": True, "memory_fraction": None}

    out, head = microbatch.verdicts(res(0.0012, 0.0013))
    assert "does not fill this device" in out[0] and "1.08x" in out[0] and head["plain_2x_over_1x"] < 1.5
    assert "that fit, on this GPU" in out[0] and "+0.3 to +5.1 % on GPUs" in out[0]
    assert (head["overhead_vs_fit_median_n"], head["overhead_vs_fit_median_se"]) == (1, None)  # one run
    out, head = microbatch.verdicts(res(0.0073, 0.0134))
    assert "does not fill" not in " ".join(out) and head["plain_2x_over_1x"] == pytest.approx(1.84, abs=0.01)


def test_microbatch_accuracy_run_starts_from_the_same_weights_and_samples():
    """Streaming changes nothing but float summation: plain and streamed training end at one accuracy.

    48 rows for 4 steps, plain vs micro-batches of 16: the same weights, the same sample stream, and the
    gradient of each step equal up to float32 rounding, so the test accuracies agree to a sample or so.
    """
    args = argparse.Namespace(seed=0, width=8, lr=3e-3, train_steps=4)
    templates = microbatch.task_templates(0)
    test = microbatch.task_batch(400, torch.Generator().manual_seed(5), templates)
    device = torch.device("cpu")
    plain = microbatch.train_and_score(args, 48, None, templates, test, device)
    streamed = microbatch.train_and_score(args, 48, 16, templates, test, device)
    again = microbatch.train_and_score(args, 48, None, templates, test, device)
    assert plain == again
    assert abs(plain - streamed) <= 2 / 400
    trained = microbatch.train_and_score(
        argparse.Namespace(seed=0, width=16, lr=3e-3, train_steps=30),
        64, 16, templates, test, device,
    )  # fmt: skip
    assert trained > 0.2, "the task must be learnable for the column to mean anything (chance 0.1)"


# ------------------------------------------------------------------------------------------ averaging
def test_validate_every_validates_once_per_epoch():
    """validate_every: ceil(steps / (K x checks per epoch)), 1 for K = -1 (one round per epoch)."""
    assert [averaging.validate_every(k, 32) for k in (1, 4, 16, 64, -1)] == [32, 8, 2, 1, 1]
    assert [averaging.validate_every(k, 63, 4) for k in (1, 4, 16, -1)] == [16, 4, 1, 1]


def test_time_to_reach_first_crossing():
    """time_to_reach: the first time the curve reaches the target; None if never."""
    history = [
        {"accuracy": 0.2, "time_s": 1.0},
        {"accuracy": 0.5, "time_s": 2.0},
        {"accuracy": 0.4, "time_s": 3.0},
    ]
    assert averaging.time_to_reach(history, 0.4) == 2.0
    assert averaging.time_to_reach(history, 0.6) is None


def test_cost_model_matches_the_formula():
    """cost_model: ResNet-152, 16 learners, 100 Gbit/s, 5 GB/s -> 722.4 MB, 1.85 s wire, 2.31 s mean."""
    c = averaging.cost_model(16, 60.2e6, 100, 5.0, steps=19)
    assert c["payload_mb"] == pytest.approx(722.4)
    assert c["wire_s"] == pytest.approx(2 * 16 * 722.4e6 / 12.5e9)
    assert c["mean_s"] == pytest.approx(16 * 722.4e6 / 5e9)
    assert c["ring_epoch_s"] == pytest.approx(19 * 2 * 15 / 16 * 240.8e6 / 12.5e9)


def test_steps_per_epoch_is_a_learners_share(small_data):
    """steps_per_epoch: one learner's equal share of the optimal plan, divided by the batch."""
    lengths = small_data.catalogs["train"].lengths
    blocks = len(shard(pack(lengths, small_data.t_max), 2)[0])
    assert averaging.steps_per_epoch(lengths, small_data.t_max, 2, 1) == blocks
    assert averaging.steps_per_epoch(lengths, small_data.t_max, 2, 2) == math.ceil(blocks / 2)


# --------------------------------------------------------------------------------------------- report
def test_report_assembles_sections_and_headlines(tmp_path):
    """report.build: headline from the JSON, a .md section, a .txt code block, missing ones named."""
    result = benchlib.Result(
        name="bload_table", title="T", command="cmd", size="tiny", header=["a"], rows=[["1"]],
        verdicts=["v"], headline={"padding_cut_optimal": 1234.0},
    )  # fmt: skip

    class Figure:  # what write_results needs of a matplotlib figure
        def savefig(self, path, **kwargs):
            Path(path).write_bytes(b"png")

    benchlib.write_results(result, tmp_path, figure=Figure())
    (tmp_path / "pipeline.txt").write_text("rates here")
    text = report.build(tmp_path, "../results")
    assert "| bload_table | padding, naive / optimal (the job's default packer) | 1,234x |" in text
    assert "```\nrates here\n```" in text
    assert "Not run: no `bench/results/refurbish.md`" in text
    assert "](../results/bload_table.png)" in text and "\n## T\n" in text


def test_report_adds_the_gpu_results_one_level_down_only_when_there_are_some(tmp_path):
    """The last scripts/gpu_checks.sh run's files (results/gpu/) form one section of their own, machine
    from their JSON, each table one heading level under it, its image linked in the gpu folder."""
    assert "On a GPU" not in report.build(tmp_path, "../results")
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    (gpu / "microbatch_micro16.md").write_text(
        "## MBS Table 4\n\nrows\n\n![microbatch](microbatch_micro16.png)\n"
    )
    (gpu / "microbatch_micro16.json").write_text(json.dumps({"machine": {"gpu": "NVIDIA H200", "date": "d"}}))
    (gpu / "learner_device_demo.txt").write_text("frames/s")
    text = report.build(tmp_path, "../results")
    assert "## On a GPU" in text and "Measured on NVIDIA H200" in text
    assert "\n### MBS Table 4\n" in text and "](../results/gpu/microbatch_micro16.png)" in text
    assert "### `learner_device_demo.txt`\n\n```\nframes/s\n```" in text


# ------------------------------------------------------------------------------------- learner_device
def test_learner_device_feeds_every_way_the_same_frames_and_prints_its_headline(capsys):
    """The host-crop baseline's rows hold exactly the frames the learner's own crop makes (only where the
    crop runs differs), the rows carry real sequences, and a tiny run ends with the JSON headline. The
    memory-cap check refuses a device without CUDA memory to cap."""
    batches, t_max = learner_device.make_rows(Config.from_preset("demo"), 2, seed=0)
    assert t_max == 222 and batches[0]["frames"].shape == (4, 222, 36, 36, 3)
    for rows in batches:
        assert (rows["lengths"] > 0).sum() == rows["num_sequences"].sum() > 4
        host = learner_device.host_cropped(rows, 32)
        assert "tops" not in host and host["frames"].shape == (4, 222, 32, 32, 3)
        assert torch.equal(
            torch.from_numpy(host["frames"]), stage_rows(rows, "cpu", crop=32, flow=False)["frames"]
        )
    threads = torch.get_num_threads()
    try:
        # --device cpu: the figures checked below are a CPU run's (the default is CUDA where there is one)
        argv = ["--preset", "demo", "--device", "cpu", "--steps", "2", "--rounds", "1", "--json"]
        assert learner_device.main(argv) == 0
    finally:
        torch.set_num_threads(threads)  # main sets a CPU learner's one thread
    with pytest.raises(SystemExit):
        learner_device.main(["--device", "cpu", "--memory-cap-gib", "4"])
    headline = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        headline["device"] == "CPU"
        and headline["learner_frames_s"] > 0
        and headline["host_crop_frames_s"] > 0
    )
    for way in ("host_crop", "whole_batch"):
        assert headline[f"learner_vs_{way}"] == pytest.approx(
            headline["learner_frames_s"] / headline[f"{way}_frames_s"], rel=1e-2
        )


# ------------------------------------------------------------------------------------ dataloader_loop
def test_dataloader_loop_pads_each_batch_to_its_longest_and_trains_every_video_once_an_epoch(capsys):
    """The baseline's collate pads a batch to its longest video (rows of one sequence each), and a tiny
    CPU run steps over every training video once per epoch: its useful frames are the catalog's."""
    batch = dataloader_loop.pad_collate(
        [(np.ones((3, 4, 4, 3), np.uint8), 2), (np.full((5, 4, 4, 3), 7, np.uint8), 0)]
    )
    assert batch["frames"].shape == (2, 5, 4, 4, 3) and int(batch["frames"][0, 3:].sum()) == 0
    assert batch["lengths"].tolist() == [[3], [5]] and batch["labels"].tolist() == [[2], [0]]
    assert batch["num_sequences"].tolist() == [1, 1] and batch["starts"].tolist() == [[0], [0]]
    threads = torch.get_num_threads()
    try:
        argv = ["--preset", "demo", "--device", "cpu", "--max-videos", "24", "--epochs", "2", "--videos", "8",
                "--workers", "0", "--json"]  # fmt: skip
        assert dataloader_loop.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    headline = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    config = Config.from_preset("demo", max_videos=24)
    catalog = dataloader_loop.Clips(config, 0).catalog
    assert [e["frames"] for e in headline["epochs"]] == [int(catalog.lengths.sum())] * 2
    assert headline["frames_s"] > 0 and all(e["padded"] > 0 for e in headline["epochs"])


# ----------------------------------------------------------------------------------------- gpu_report
def test_gpu_report_checks_each_target_from_the_runs_files_and_says_what_did_not_run(tmp_path, capsys):
    """The report reads the JSON last lines and the summaries gpu_checks.sh leaves (written as the job
    writes them: RunSummary.to_dict, whose extra keys sit at the top level), computes each target's
    figure from them, and marks a target whose inputs are missing as not run."""
    from raytrain_seq.outputs.summary import RunSummary

    (tmp_path / "learner_device.txt").write_text('banner\n{"learner_frames_s": 7500.0, "device": "H100"}\n')
    (tmp_path / "dataloader.txt").write_text('{"frames_s": 3000.0}\n')
    job = RunSummary(dataset="synthetic", learners=2, epochs=6, test_accuracy=0.5, frames_per_second=6300.0,
                     seconds={"total": 60.0, "compute": 30.0, "averaging": 1.0, "data_wait": 1.0, "validation": 2.0},
                     val_accuracy_history=[{"round": r, "epoch": r, "accuracy": 0.5, "time_s": 1.0} for r in range(3)],
                     extra={"learner_seconds": 42.0, "timeline": {"connected": 0.5}})  # fmt: skip
    (tmp_path / "job_ucf101.json").write_text(json.dumps(job.to_dict()))
    assert gpu_report.main(["--out", str(tmp_path), "--md", str(tmp_path / "job.md"), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {r["target"]: r for r in figures["targets"]}
    assert rows["job / bare learner"]["value"] == 0.84 and rows["job / bare learner"]["met"] is True
    assert rows["job / DataLoader loop"]["value"] == 2.1 and rows["job / DataLoader loop"]["met"] is True
    assert rows["validation added to training"]["value"] == 0.05  # 2 s on top of 40 s of training
    assert rows["demo start-up (s)"]["met"] is None and rows["B=576 under a memory cap"]["met"] is None
    assert (
        figures["device"] == "H100"
        and "| demo test accuracy |  | >= 0.90 | not run |" in (tmp_path / "job.md").read_text()
    )
    demo = RunSummary(dataset="synthetic", learners=2, epochs=3, test_accuracy=0.95, rounds=12,
                      seconds={"total": 30.0, "compute": 9.0, "averaging": 1.0, "data_wait": 1.0, "startup": 9.5},
                      extra={"timeline": {"connected": 1.25, "first_step": 9.5, "other": 3.0}})  # fmt: skip
    (tmp_path / "job_demo.json").write_text(json.dumps(demo.to_dict()))
    assert gpu_report.main(["--out", str(tmp_path), "--json"]) == 0
    rows = {r["target"]: r for r in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["targets"]}
    assert rows["demo start-up (s)"]["value"] == 9.5 and rows["demo start-up (s)"]["met"] is True
    assert (
        "connected 1.2" in rows["demo start-up (s)"]["detail"]
        and "other" not in rows["demo start-up (s)"]["detail"]
    )
    assert rows["demo test accuracy"]["met"] is True


def test_learner_device_caps_the_memory_of_an_indexed_cuda_device(monkeypatch):
    """--device cuda (no index) reaches the memory-cap run as cuda:<current>: torch's
    set_per_process_memory_fraction raises ValueError on a device without an index. CUDA is faked, so
    the test runs on a CPU: it checks what the cap run is handed."""
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a stand-in GPU")

    def fake_cap(config, device, cap_gib):
        seen.append(device)
        way = {"trained": True}
        return {"batch_size": 1, "t_max": 2, "whole_input_gib": 1.0, "cap_gib": 0.8, "streamed": way,
                "whole batch": way}  # fmt: skip

    monkeypatch.setattr(learner_device, "memory_cap", fake_cap)
    threads = torch.get_num_threads()
    try:
        assert learner_device.main(["--preset", "demo", "--device", "cuda", "--memory-cap-gib"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert seen == [torch.device("cuda", 0)]


def test_dataloader_workers_run_one_thread_each_and_the_loop_checks_shared_memory_first(monkeypatch, capsys):
    """Each DataLoader worker is set to one thread (torch's, and OMP/MKL/OpenBLAS's for pools started
    after), so 8 workers do not oversubscribe the cores; before starting, the loop refuses a /dev/shm
    with less free than its workers' batches need, naming the fix. No workers, no shared memory."""
    import os
    import shutil

    threads, saved = torch.get_num_threads(), {k: os.environ.get(k) for k in dataloader_loop.THREAD_VARIABLES}
    try:
        torch.set_num_threads(2)
        dataloader_loop.one_thread_worker(0)
        assert torch.get_num_threads() == 1
        assert all(os.environ[k] == "1" for k in dataloader_loop.THREAD_VARIABLES)
    finally:
        torch.set_num_threads(threads)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    config = Config.from_preset("ucf101-rgb", dataset="synthetic", data_root=None, num_classes=10)
    lengths = np.array([10] * 90 + [50] * 10)  # 64 draws almost surely hold a 50: batches pad to it
    need = dataloader_loop.shm_need(config, lengths, videos=64, workers=8)
    assert need == 8 * dataloader_loop.PREFETCH * 64 * 50 * 112 * 112 * 3
    assert dataloader_loop.shm_need(config, lengths, videos=64, workers=0) == 0

    Usage = type(shutil.disk_usage("/"))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(2**30, 2**30 - 2**20, 2**20))
    with pytest.raises(SystemExit):
        dataloader_loop.main(["--preset", "demo", "--device", "cpu", "--max-videos", "24", "--workers", "2"])
    err = capsys.readouterr().err
    assert "/dev/shm has 0.0 GiB free" in err and "lower --workers" in err and "--shm-size" in err


GPU_CHECKS = Path(__file__).resolve().parents[1] / "scripts" / "gpu_checks.sh"


def _stand_ins(tmp_path: Path, python3: str, timeout: bool = True) -> dict[str, str]:
    """A bin folder of stand-ins for python3 (``python3`` its body), nvidia-smi and, when ``timeout``,
    timeout (which drops its options and limit and runs the command), and the environment that puts it
    first on PATH."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    bodies = {"python3": python3, "nvidia-smi": 'echo "GPU 0: a stand-in"'}
    if timeout:
        bodies["timeout"] = 'while [ "${1#-}" != "$1" ]; do shift; done; shift; "$@"'
    for name, body in bodies.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out")}


def _fake_ray(tmp_path: Path) -> Path:
    """A .gpu-ray stand-in: install.sh defines ray_stop, which logs each call."""
    folder = tmp_path / "ray"
    folder.mkdir()
    (folder / "install.sh").write_text(f"ray_stop() {{ echo stop >> {tmp_path / 'ray_stops.txt'}; }}\n")
    return folder


def test_gpu_checks_script_runs_every_step_in_order_with_stand_in_commands(tmp_path):
    """scripts/gpu_checks.sh as bash reads it, every optional step on and a Ray stand-in: with stand-ins
    for python3, nvidia-smi and timeout on PATH (python3 logs its arguments), it reaches its end, runs
    nothing but those commands (a header line that lost its '#' would run as a command), calls the
    benches in the order its header gives, stops Ray after each Ray step and at the end, and leaves
    exactly the archive and job.md under $OUT, the archive holding every step's output."""
    import subprocess
    import tarfile

    log = tmp_path / "calls.txt"
    env = _stand_ins(tmp_path, f'echo "python3 $*" >> {log}; echo "{{}}"')
    footage = tmp_path / "footage" / "avi"
    footage.mkdir(parents=True)
    (footage / "train.txt").write_text("Bikes/v_Bikes_g01_c01.avi 0\n")
    env.update(
        STARTUP="1", BACKBONES="1", MBS="1", GPU_RAY=str(_fake_ray(tmp_path)), FOOTAGE=str(footage.parent)
    )
    done = subprocess.run(["bash", str(GPU_CHECKS)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "command not found" not in done.stderr, done.stderr
    assert "gpu checks done" in done.stdout
    calls = log.read_text().splitlines()
    scripts = [c.split()[1] for c in calls if c.split()[1].startswith(("bench/", "jobs/"))]
    assert scripts == [
        "bench/learner_device.py",
        "bench/learner_device.py",
        "bench/dataloader_loop.py",
        "jobs/ucf101.py",
        "jobs/ucf101.py",
        "jobs/ucf101.py",
        "bench/startup.py",
        "bench/learner_device.py",
        "bench/learner_device.py",
        "bench/microbatch.py",
        "bench/microbatch.py",
        "bench/gpu_report.py",
    ], calls
    assert "--backbone r2plus1d_18" in " ".join(calls)
    real = next(c for c in calls if "--run-name real" in c)
    assert f"--data-root {footage}" in real and "--decoder opencv" in real and "--dataset list" in real
    assert (tmp_path / "ray_stops.txt").read_text().split() == ["stop"] * 5  # 3 jobs, startup, the end
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_checks.tgz", "job.md"]
    with tarfile.open(out / "gpu_checks.tgz") as archive:
        names = {Path(n).name for n in archive.getnames()}
    assert {"pytest.txt", "learner_device.txt", "memory_cap.txt", "dataloader.txt", "jobs.txt", "steps.txt",
            "job.md", "startup.txt", "backbones.txt", "mbs_micro16.txt", "mbs_micro512.txt"} <= names  # fmt: skip


def test_gpu_checks_step_budgets_fit_420_s_with_the_real_video_job():
    """The default steps' budgets (STEPS in the script, the end's included) add up to at most 420 s, the
    run's wall budget, the real-video job's about 75 s of it; the header says how .gpu-ray and the
    footage reach the GPU machine (carried by name: git ignores them)."""
    import re

    text = GPU_CHECKS.read_text()
    block = text[text.index("STEPS=(") : text.index(")", text.index("STEPS=("))]
    values = {"REAL_VIDEO_S": int(re.search(r"^REAL_VIDEO_S=(\d+)", text, re.M).group(1)),
              "FINISH_S": int(re.search(r"^FINISH_S=(\d+)", text, re.M).group(1))}  # fmt: skip
    budgets = {}
    for name, value in re.findall(r'"(\w+) \$?(\w+)"', block):
        budgets[name] = int(values.get(value, value))
    assert {"setup", "pytest", "learner", "memory_cap", "dataloader", "job_demo", "job_ucf101", "real_video",
            "finish"} == set(budgets)  # fmt: skip
    assert sum(budgets.values()) <= 420 and 60 <= budgets["real_video"] <= 90
    assert int(re.search(r"^BUDGET=\$\{BUDGET:-(\d+)\}", text, re.M).group(1)) == 420
    header = text[: text.index("set -u")]
    assert "carry" in header and ".gpu-ray" in header and "travels with the tree" not in header
    assert ".footage" in header


def test_gpu_checks_ends_every_step_at_the_deadline_and_still_stops_ray_and_packs(tmp_path):
    """With the real timeout, a python3 that hangs (sleep 60) and a budget of 30 s (10 s for the steps,
    the end's 20 s kept), the script ends within the budget: the first step is cut at the time left,
    the rest are skipped, and the end still runs (Ray stopped, the archive and job.md written)."""
    import subprocess
    import time

    env = _stand_ins(tmp_path, 'case "$*" in *gpu_report*) echo "{}";; *) sleep 60;; esac', timeout=False)
    env.update(BUDGET="30", GPU_RAY=str(_fake_ray(tmp_path)))
    began = time.monotonic()
    done = subprocess.run(["bash", str(GPU_CHECKS)], env=env, capture_output=True, text=True, timeout=90)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert took < 30, done.stdout
    assert "setup: exit 124" in done.stdout and "pytest: skipped" in done.stdout, done.stdout
    assert "gpu checks done" in done.stdout
    assert (tmp_path / "ray_stops.txt").exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu_checks.tgz", "job.md"]


# ---------------------------------------------------------------------------------------- flat_device
def test_flat_device_moves_the_bound_state_both_ways_and_prints_its_figures(capsys):
    """Its learner's state is bound to the flat buffers; "flat out" slices them, "flat in" writes the
    merged host slices into the live tensors (checked against the slices' values), and a tiny run ends
    with one JSON line whose ratios are its own GB/s over each other."""
    learner = flat_device.Learner(3000, 5, torch.device("cpu"), shards=2)
    assert learner.storage.holds(learner.weights, learner.moments)
    assert sum(a.size for part in learner.storage.slices(2) for a in part.values()) == 3 * 3000
    for part in learner.merged:
        for array in part.values():
            array += 1.0  # a merged state that differs from the live one
    learner.way("flat in")
    flat = torch.cat([torch.from_numpy(part["mean/float32"]) for part in learner.merged])
    assert torch.equal(learner.storage.buffers["mean/float32"], flat)
    assert torch.equal(learner.weights["w0"], flat[: learner.weights["w0"].numel()])
    with pytest.raises(ValueError, match="unknown way"):
        learner.way("sideways")

    argv = ["--device", "cpu", "--megabytes", "0.5", "--tensors", "3,7", "--rounds", "1", "--json"]
    assert flat_device.main(argv) == 0  # a CPU run, also on a machine with CUDA (the default there)
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(figures["gb_s"]) == {"3", "7"} and figures["device"] == "cpu"
    for count, ways in figures["gb_s"].items():
        assert set(ways) == set(flat_device.WAYS) and min(ways.values()) > 0
        ratios = figures["ratios"][count]
        assert ratios["flat_vs_per_tensor_in"] == pytest.approx(
            ways["flat in"] / ways["per tensor in"], rel=0.05
        )
        assert ratios["flat_vs_one_copy_in"] == pytest.approx(ways["flat in"] / ways["one copy in"], rel=0.05)


def _fake_averaging_result(tmp_share: float = 0.02) -> dict:
    run = {"rounds": 10, "test": 0.6, "best_val": 0.6, "learner_s": 50.0, "averaging_s": 1.0, "final_b": 1,
           "max_b": 2, "adaptive": True, "merge": True, "history": [{"accuracy": 0.6, "time_s": 40.0}]}  # fmt: skip
    ks = [
        {**run, "name": "aavg-k1", "k": 1, "m": 32, "share": 0.2, "test": 0.65},
        {**run, "name": "aavg-k-1", "k": -1, "m": 1, "share": tmp_share},
    ]
    cost = [{"nic": 100, **averaging.cost_model(16, 60.2e6, 100, 0.6, steps=19)}]
    return {"size": {"batch": 1, "videos": 500, "epochs": 5, "seed": 0}, "steps": 32, "ks": ks,
            "aavg": ks[1], "test_videos": 500, "target": 0.6, "t_aavg": 40.0, "t_ddp": 80.0,
            "ddp": {**run, "name": "ddp", "test": 0.7, "history": [{"accuracy": 0.6, "time_s": 80.0}]},
            "bandwidth": {"mb": 200.0, "seconds": {"numpy": 0.1, "library": 0.3, "actor": 1.0},
                          "mbps": {"numpy": 2000.0, "library": 666.0, "actor": 200.0}},
            "cost": cost, "cost_steps": 19, "cost_learners": 16, "job_payload_mb": 0.6}  # fmt: skip


def test_averaging_verdicts_follow_the_numbers():
    """averaging.verdicts: the DDP ratio and the dominant cost term come from the data; beside the
    averaging share the headline carries the same run's test accuracies (AAVG at K = epoch and K = 1,
    DDP) and its n, one run."""
    res = _fake_averaging_result()
    lines, head = averaging.verdicts(res)
    assert head["ddp_over_aavg_time"] == pytest.approx(2.0) and head["share_k_epoch"] == pytest.approx(0.02)
    assert (head["test_aavg_k_epoch"], head["test_aavg_k1"], head["test_ddp"]) == (0.6, 0.65, 0.7)
    assert head["runs"] == 1 and head["seed"] == 0
    text = " ".join(lines)
    assert "(2.00x; above 1 means AAVG is faster); test accuracy AAVG (K = epoch) 60.0 %, DDP 70.0 %" in text
    assert "K (one run, seed 0: no spread over seeds)" in text
    assert "Ablation" not in text  # the ablation is its own result (bench/ablation.py)


def test_a_slower_aavg_verdict_says_whether_epochs_or_speed_stand_in_the_way():
    """When DDP gets there first, the verdict names the epoch each run first reached the target at, its
    time an epoch, how many epochs more AAVG needed and how much longer its epochs took."""
    res = _fake_averaging_result()
    res["t_aavg"], res["t_ddp"] = 50.0, 40.0
    res["aavg"] = {**res["aavg"], "history": [{"accuracy": 0.5, "time_s": 40.0, "epoch": 4},
                                              {"accuracy": 0.6, "time_s": 50.0, "epoch": 5}]}  # fmt: skip
    res["ddp"] = {**res["ddp"], "history": [{"accuracy": 0.6, "time_s": 40.0, "epoch": 4}]}
    assert averaging.epoch_to_reach(res["aavg"]["history"], 0.6) == 5
    assert averaging.epoch_to_reach(res["aavg"]["history"], 0.7) is None
    text = " ".join(averaging.verdicts(res)[0])
    assert "(0.80x; above 1" in text
    assert "after epoch 5 (10.00 s of learner time an epoch), DDP after epoch 4 (10.00 s an epoch)" in text
    assert "AAVG needed 1 epoch(s) more" in text and "its epochs were as long as DDP's" in text
    res["aavg"]["history"][1]["epoch"] = 4  # both there after epoch 4: AAVG's epochs are slower
    text = " ".join(averaging.verdicts(res)[0])
    assert "AAVG needed 0 epoch(s) more" in text and "its epochs were 25 % longer than DDP's" in text


def test_batch_growth_and_the_cost_terms_come_from_the_data():
    """best_before_growth finds the first growth and the best validation before it; the cost verdict names
    the dominant term; a DDP target near chance gives no speed ratio."""
    vals = [{"round": 1, "accuracy": 0.10}, {"round": 2, "accuracy": 0.09}, {"round": 4, "accuracy": 0.5}]
    sizes = [{"round": r, "batch_size": b} for r, b in ((1, 1), (2, 1), (3, 2), (4, 4))]
    assert averaging.best_before_growth(vals, sizes) == (3, 0.10)
    assert averaging.best_before_growth(vals, sizes[:2]) is None
    res = _fake_averaging_result()
    text = " ".join(averaging.verdicts(res)[0])
    assert "so arithmetic dominates" in text  # 11.6 GB at 0.6 GB/s >> 23 GB at 12.5 GB/s
    low = {**res, "target": 0.12}
    assert (
        "near chance" in " ".join(averaging.verdicts(low)[0])
        and "ddp_over_aavg_time" not in averaging.verdicts(low)[1]
    )
    tables = averaging.tables(res, type("A", (), {"cost_learners": 16})())
    assert [len(rows) for _, _, rows in tables] == [2, 2, 3, 1]


def _ablation_result(vals: dict[str, list[float]], steps: dict[str, list[int]] | None = None) -> dict:
    """A result with the same runs under every (start, rule); AAVG4 numbers per seed (test on 12 videos)."""

    def runs(name: str, values: list[float]) -> list[dict]:
        return [
            {"seed": seed, "val": v, "test": v - 0.01, "steps": (steps or {}).get(name, [40] * 3)[seed],
             "epochs": 1.5, "max_b": 1 if name == "AAVG1" else 4}
            for seed, v in enumerate(values)
        ]  # fmt: skip

    variants = {n: ablation.variant_stats(runs(n, v)) for n, v in vals.items()}
    grid = {start: {rule: dict(variants) for rule in ablation.RULES} for start in ablation.STARTS}
    tests = {"rgb": [1.0] * 3, "flow": [0.33, 0.75, 0.67], "flow_scratch": [0.75, 0.67, 0.58],
             "flow_low_lr": [0.5] * 3, "flow_scratch_low_lr": [0.5] * 3}  # fmt: skip
    by_seed = {
        seed: {k: {"test": v[seed], "first_val": v[seed] / 2} for k, v in tests.items()} | {"fused": 0.9}
        for seed in range(3)
    }
    stats = {
        k: dict(zip(("test_mean", "test_se", "test_n"), ablation.paired(v), strict=True))
        | {"first_val_mean": 0.3, "first_val_se": 0.01, "first_val_n": 3}
        for k, v in tests.items()
    }  # fmt: skip
    diffs = {
        f"{a}-{b}": ablation.paired([100 * (x - y) for x, y in zip(tests[a], tests[b], strict=True)])
        for a, b in (
            ("flow", "flow_scratch"),
            ("flow_low_lr", "flow_scratch_low_lr"),
            ("flow", "flow_low_lr"),
        )
    }
    video = {"by_seed": by_seed, "stats": stats, "diffs": diffs, "fused": {"mean": 0.9, "se": 0.0, "n": 3},
             "test_videos": 12, "seeds": [0, 1, 2]}  # fmt: skip
    return {"grid": grid, "steps": 40, "seeds": [0, 1, 2], "video": video, "bn_pairs": 0,
            "aavg4": {"flow_test": 0.58, "flow_minus_scratch": ablation._points(diffs["flow-flow_scratch"])},
            "two_stream": {"fused": 0.9}, "warm": {"epochs": 6, "val": 0.3, "test": 0.32}}  # fmt: skip


def test_ablation_statistics_and_the_verdict_on_the_targets():
    """Gaps are paired by seed with the se of the paired differences and n; a gap is a gain only beyond one
    se over n >= 3 seeds (benchlib.seed_word), else within noise and not set beside the paper's; the JSON
    headline keeps the issue's keys and adds the rule; AAVG4's verdict follows its numbers; the BatchNorm
    merge is said not to be exercised."""
    mean, se = ablation.mean_se([0.5, 0.7, 0.6])
    assert mean == pytest.approx(0.6) and se == pytest.approx(0.1 / math.sqrt(3))
    assert ablation.mean_se([0.5]) == (0.5, None) and ablation.mean_se([]) == (None, None)
    res = _ablation_result(
        {"AAVG1": [0.5, 0.6, 0.7], "AAVG2": [0.62, 0.62, 0.62], "AAVG3": [0.72, 0.73, 0.74]}
    )
    d, se, n = ablation.gap(res["grid"]["warm"]["paper"]["AAVG2"], res["grid"]["warm"]["paper"]["AAVG1"])
    assert d == pytest.approx(2.0) and se == pytest.approx(10 / math.sqrt(3)) and n == 3
    text = " ".join(ablation.verdicts(res))
    assert "every run took 40 optimizer steps" in text
    assert "AAVG2 - AAVG1 +2.0 +- 5.8 validation points, within noise (n = 3): no gain is measured" in text
    assert (
        "AAVG3 - AAVG2 +11.0 +- 0.6 validation points, a gain beyond one se (n = 3); the paper +1.9" in text
    )
    assert (
        "has 0 BatchNorm (mean, var) pairs, so Algorithm 2's m^b/v^b merge (merge_bn_stats) is not exercised"
        in text
    )
    assert "the reversal of the earlier single run is within noise over 3 seeds on 12 test videos" in text
    assert "cannot tell transfer from scratch" in text
    low = _ablation_result({n: [0.5] * 3 for n in ablation.VARIANTS})
    low["video"]["diffs"]["flow_low_lr-flow_scratch_low_lr"] = (
        45.8,
        20.8,
        3,
    )  # the transfer ahead at lr / 10
    low_text = " ".join(ablation.aavg4_verdicts(low["video"]))
    assert "erases the RGB start's lead" in low_text and "cannot tell" not in low_text
    low["video"]["diffs"]["flow_low_lr-flow_scratch_low_lr"] = (45.8, 20.8, 2)  # the same over 2 seeds: noise
    assert "cannot tell" in " ".join(ablation.aavg4_verdicts(low["video"]))
    head = ablation.headline(res)
    assert head["rule"] == "paper" and head["variants"]["AAVG1"]["steps"] == 40 and head["seeds"] == [0, 1, 2]
    assert {"val_mean", "val_se", "steps"} <= set(head["variants"]["AAVG3"]) and head["equal_steps"]
    assert set(head["by_rule"]) == {"paper", "noise-aware"} and "aavg4" in head and "two_stream" in head
    assert json.loads(json.dumps(head)) == head
    uneven = _ablation_result({n: [0.5] * 3 for n in ablation.VARIANTS}, steps={"AAVG2": [40, 40, 39]})
    assert uneven["grid"]["warm"]["paper"]["AAVG2"]["steps"] == [39, 40]
    assert "did NOT all take the same steps" in " ".join(ablation.verdicts(uneven))
    assert not ablation.headline(uneven)["equal_steps"]
    tables = ablation.tables(res)
    assert [len(rows) for _, _, rows in tables] == [10, 4, 6]
    assert tables[0][2][0][8] == "60.0 % +- 5.8 (n = 3)"  # warm AAVG1 val: n beside every mean +- se
    assert tables[1][2][0][2:4] == [
        "+2.0 +- 5.8 (n = 3, within noise)",
        "+11.0 +- 0.6 (n = 3, a gain beyond one se)",
    ]
    report = ablation.report_headline(res)
    assert (
        report["paper_aavg2_minus_1"] == "+2.0 +- 5.8 (n = 3, within noise)"
        and "noise_aware_aavg3_minus_2" in report
    )


def test_ablation_calls_no_two_seed_difference_a_gain_or_a_loss():
    """Over 2 seeds a paired difference is within noise however far beyond its se (n >= 3 is needed), and
    says n; over 3 a loss beyond one se is called a loss and measures no gain."""
    two = _ablation_result({"AAVG1": [0.5, 0.6], "AAVG2": [0.6, 0.7], "AAVG3": [0.8, 0.95]})
    text = " ".join(ablation.gap_verdicts(two))
    assert "AAVG3 - AAVG2 +22.5 +- 2.5 validation points, within noise (n = 2): no gain is measured" in text
    assert "above noise" not in text and "beyond one se" not in text
    report = ablation.report_headline(two)
    assert report["paper_aavg3_minus_2"] == "+22.5 +- 2.5 (n = 2, within noise)"
    assert (report["paper_aavg3_minus_2_n"], report["paper_aavg3_minus_2_se"]) == (2, pytest.approx(2.5))
    loss = {"diff": -6.6, "se": 5.9, "n": 3}
    assert (
        ablation.step_call(loss, 1.9) == "a loss beyond one se (n = 3): no gain is measured; the paper +1.9"
    )
    assert benchlib.seed_word(9.3, 4.9, 3) == "a gain beyond one se" and benchlib.seed_word(9.3, 4.9, 2) == (
        "within noise"
    )
    assert benchlib.seed_gap_text(None, None, 0) == "n/a"


def test_bandwidth_json_line_has_the_issue_keys_and_the_verdict_names_the_split():
    """--only bandwidth --json: actor_mb_s, numpy_mb_s, actor_vs_numpy (the round of 2 vs numpy),
    round_s and hub_load per learner count, shards; the verdict reports the 8/2 ratio and the split."""
    band = {
        "mb": 200.0, "seconds": {"numpy": 0.1, "library": 0.05, "actor": 0.2},
        "mbps": {"numpy": 2000.0, "library": 4000.0, "actor": 1000.0, "numpy_best": 2500.0},
        "round_s": {"1": 0.1, "2": 0.2, "4": 0.4, "8": 0.7}, "hub_load": {"1": 2.0, "2": 2.0, "4": 2.0, "8": 2.0},
        "hub_load_star": {"2": 4.0, "8": 16.0}, "shards": "one per learner", "payload_mb": 100.0,
        "split_s": {"2": {"pack_s": 0.01, "put_s": 0.04, "average_s": 0.15, "shard_merge_s": 0.05}},
        "reference_faults": {"numpy": 3.0, "library": 0.0},
    }  # fmt: skip
    head = averaging.bandwidth_headline(band)
    assert head["numpy_faults_per_pass"] == 3.0  # whether the reference measured the kernel's page zeroing
    assert head["actor_vs_numpy"] == pytest.approx(0.5) and head["round_s"]["8"] == 0.7
    assert head["actor_vs_numpy_best"] == pytest.approx(0.4)  # against numpy's fastest pass: stricter
    assert {"actor_mb_s", "numpy_mb_s", "round_s", "hub_load", "shards"} <= set(head)
    json.dumps(head)
    clause = averaging.rounds_clause(band)
    assert (
        "3.50x a round of 2" in clause
        and "2.00 payloads" in clause
        and "(one shard for all: 16.00)" in clause
    )
    assert "40 ms putting" in clause and "50 ms" in clause
    assert "the other 100 ms are the round's actor calls" in clause  # 150 ms sending to holding, less 50
    assert "Without Ray" not in clause and head["floor_s_2"] is None  # not measured
    floored = {**band, "floor_s": {"put": 0.02, "merge": 0.03, "return": 0.01, "total": 0.06}}
    assert averaging.bandwidth_headline(floored)["floor_vs_numpy"] == pytest.approx(0.6)
    assert (
        "do the round's copies and merge in 60 ms (the puts' copy 20, the shards' merge 30, their return 10), "
        "0.60x the numpy mean's 100 ms: the round's other 140 ms are Ray's part"
        in averaging.rounds_clause(floored)
    )
    assert "instead, the same learners" not in clause and head["other"]["vs_numpy"] is None  # not measured
    other = {**band, "transport": "channels", "other_round_s": 0.125}
    assert averaging.bandwidth_headline(other)["other"] == {
        "transport": "object store", "round_s_2": 0.125, "vs_numpy": pytest.approx(0.8)
    }  # fmt: skip
    assert "through the object store instead, the same learners take 125 ms a round, 0.80x numpy's" in (
        averaging.rounds_clause(other)
    )
    # Through channels a learner writes its slices (no put) and the shard writes the merged slice back.
    assert "40 ms writing its slices into its channels" in averaging.rounds_clause(other)
    assert "putting" not in averaging.rounds_clause(other) and "putting" in clause
    # Against the numpy passes timed beside the other transport's rounds, where there are some.
    beside = {**other, "other_numpy_s": 0.15}
    assert averaging.bandwidth_headline(beside)["other"]["vs_numpy"] == pytest.approx(1.2)
    assert "125 ms a round, 1.20x numpy's bandwidth" in averaging.rounds_clause(beside)
    assert "tensors per learner" not in clause and head["round_s_2_by_tensors"] is None  # not measured
    assert "timed by the driver" not in clause and head["round_s_driver"]["2"] is None  # not measured
    driven = {**band, "split_s": {"2": {**band["split_s"]["2"], "driver_round_s": 0.207}}}
    driver = averaging.bandwidth_headline(driven)["round_s_driver"]
    assert driver == {"1": None, "2": 0.207, "4": None, "8": None}
    assert "timed by the driver, which dispatches each round" in averaging.rounds_clause(driven)
    assert "a round of 2 takes 207 ms" in averaging.rounds_clause(driven)
    many = averaging.rounds_clause({**band, "round_s_2_by_tensors": {"8": 0.2, "500": 0.3}})
    assert (
        "in 500 tensors per learner instead of 8: a round of 2 takes 0.300 s instead of 0.200 s (1.50x)"
        in many
    )


def test_bandwidth_references_are_summarised_like_the_rounds():
    """The one-process passes: median (the rounds' statistic) and fastest, the warm-up pass left out."""
    seconds = {"numpy": [9.0, 3.0, 1.0, 2.0], "library": [5.0, 0.5, 0.7, 0.6]}
    out = averager_cost.summarise(seconds, skip=1)
    assert out == {"numpy": 2.0, "numpy_best": 1.0, "library": 0.6, "library_best": 0.5}
    assert averager_cost.summarise(seconds)["numpy"] == 2.5  # the warm-up kept: it moves the median
    with pytest.raises(ValueError, match="no numpy pass timed after the first 4"):
        averager_cost.summarise(seconds, skip=4)
    # The passes themselves, at a tiny size: one numpy and one library pass per call, faults counted.
    baselines = averager_cost.Baselines(params=3_000)
    for _ in range(3):
        baselines.time_once()
    timed = baselines.summary(skip=1)
    assert set(timed) == {"numpy", "numpy_best", "library", "library_best"}
    assert all(0 < timed[f"{k}_best"] <= timed[k] for k in ("numpy", "library"))
    faults = baselines.faults_per_pass(skip=1)
    assert set(faults) == {"numpy", "library"} and all(f >= 0 for f in faults.values())
    assert baselines.numpy_once() > 0 and len(baselines.seconds["numpy"]) == 3  # timed, not kept


def test_startup_roles_name_our_actors_ray_trains_and_the_driver():
    name = lambda title, pid=7: startup.role(title, driver=1, pid=pid)  # noqa: E731
    assert name("ray::LearnerProcess.run") == "learners"  # the job's (runtime/fleet.py)
    assert name("ray::RayTrainWorker.run_train_fn") == "learners (Ray Train workers)"  # the bare baseline
    assert name("ray::TrainController.run") == "Ray Train: controller"
    assert name("ray::_AutoscalingCoordinatorActor") == name("ray::DatasetManager") == "Ray Train: helpers"
    assert name("ray::BlockFeed.epoch_shard") == "ours: feed"
    assert name("ray::IDLE") == name("ray::augment_videos") == "ours: data tasks (and idle task workers)"
    assert name("ray::JobSupervisor") == "Ray: other workers"
    assert name("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet") == (
        "Ray: raylet, GCS, dashboard, agents"
    )
    assert name("python", pid=1) == "driver" and name("bash") == "other processes"


def test_startup_cpu_by_role_counts_only_the_window_and_new_processes_from_zero():
    samples = [
        (0.0, {1: (1.0, "ray::BlockFeed"), 2: (5.0, "ray::IDLE")}),
        (1.0, {1: (1.5, "ray::BlockFeed"), 2: (5.0, "ray::IDLE")}),
        (2.0, {1: (2.5, "ray::BlockFeed"), 2: (5.0, "ray::IDLE"), 3: (0.75, "ray::RayTrainWorker")}),
        (3.0, {1: (9.0, "ray::BlockFeed"), 2: (9.0, "ray::IDLE"), 3: (9.0, "ray::RayTrainWorker")}),
    ]
    name = lambda title, pid: startup.role(title, driver=0, pid=pid)  # noqa: E731
    # [1.2, 2.9]: the samples at 1.0 and 2.0; the idle worker spent nothing, the learner was born inside.
    got = startup.cpu_by_role(samples, 1.2, 2.9, name)
    assert got == {"ours: feed": [1.0, 1], "learners (Ray Train workers)": [0.75, 1]}
    assert startup.cpu_by_role(samples, -1.0, 0.5, name) == {
        "ours: feed": [1.0, 1],
        "ours: data tasks (and idle task workers)": [5.0, 1],
    }  # before the first sample everything counts from zero
    assert startup.sample_at(samples, -1.0) == {}


def test_startup_births_lists_the_window_s_new_processes_in_order_by_their_later_ray_name():
    """A process first seen inside [begin, end] is listed at its first sample's time from begin, under the
    last name other than ray::IDLE that Ray gave it (even after end: a shard still starting), with its CPU
    up to end; one born before begin, or not a Ray process, is not listed."""
    samples = [
        (0.0, {1: (1.0, "ray::BlockFeed")}),
        (1.0, {1: (1.5, "ray::BlockFeed"), 2: (0.2, "/venv/bin/python")}),
        (2.0, {1: (2.5, "ray::BlockFeed"), 2: (0.5, "ray::IDLE"), 3: (0.1, "ray::IDLE"), 4: (0.3, "sleep")}),
        (3.0, {2: (0.9, "ray::RayTrainWorker.run"), 3: (0.4, "ray::IDLE")}),
        (4.0, {2: (1.2, "ray::IDLE"), 3: (0.6, "ray::AveragingShard")}),
    ]
    got = startup.births(samples, 0.5, 3.0)
    assert got == [(0.5, "ray::RayTrainWorker", 0.9), (1.5, "ray::AveragingShard", 0.4)]


# ------------------------------------------------------------------------------------------ batch_rule
def _rule_run(seed: int, test: float, steps: int, sizes: list[int]) -> dict:
    history = [{"round": r, "batch_size": b} for r, b in enumerate(sizes, start=1)]
    return {"seed": seed, "test": test, "steps": steps, "max_b": max(sizes),
            "first_growth": batch_rule.first_growth(history), "b_path": "-"}  # fmt: skip


def test_batch_rule_statistics_pair_seeds_and_call_gains_only_beyond_the_se():
    """paired_gap: mean, se and n of the per-seed differences; call: a gain or loss only when |diff| > se
    over n >= 3 pairs, else within noise; first_growth."""
    diff, se, n = batch_rule.paired_gap([0.5, 0.7, 0.6], [0.6, 0.7, 0.7])
    assert diff == pytest.approx(-20 / 3) and se == pytest.approx(10 / 3) and n == 3
    assert batch_rule.paired_gap([0.5, None], [0.4, 0.3]) == (pytest.approx(10.0), None, 1)
    assert batch_rule.paired_gap([None], [0.3]) == (None, None, 0)
    assert batch_rule.call(9.3, 4.9, 3) == "a gain beyond one se (n = 3)"
    assert batch_rule.call(-6.6, 5.9, 3) == "a loss beyond one se (n = 3)"
    assert batch_rule.call(2.0, 2.7, 3) == "within noise (n = 3)"
    assert batch_rule.call(9.3, 4.9, 2) == "within noise (n = 2)"  # too few seeds to call it
    assert batch_rule.call(0.0, 0.0, 3) == "within noise (n = 3)"
    # One seed of three differs: |mean| equals its se exactly, which is not beyond it.
    diff, se, n = batch_rule.paired_gap([0.6, 0.7, 0.6], [0.6, 0.7, 0.6 + 2 / 30])
    assert diff == pytest.approx(-20 / 9) and se == pytest.approx(20 / 9)
    assert batch_rule.call(diff, se, n) == "within noise (n = 3)"
    assert (
        batch_rule.call(5.0, None, 1) == "within noise (n = 1)"
        and batch_rule.call(None, None, 0) == "not measured"
    )
    assert batch_rule.first_growth([{"round": 2, "batch_size": 8}, {"round": 1, "batch_size": 4}]) == 2
    assert batch_rule.first_growth([{"round": 1, "batch_size": 4}]) is None
    # The command written to the results leaves out the local cache folder.
    assert batch_rule._without_runs_dir(["--tiny", "--runs-dir", "/x", "--json"]) == ["--tiny", "--json"]
    assert batch_rule._without_runs_dir(["--runs-dir=/x"]) == []


def test_batch_rule_default_is_the_fixed_run_under_epochs_and_grows_only_under_steps(tmp_path):
    """Why the bench runs no `default` arm at equal epochs: every set's config with the job's defaults
    (batch_growth "steps") and an epoch budget may not grow B (batchsize.batch_may_grow), so it holds B at
    its start as the fixed run does; the same config with --steps N may. Also for a bare Config()."""
    from raytrain_seq.algorithms.batchsize import batch_may_grow
    from raytrain_seq.config import Config

    assert "default" not in batch_rule.RULES and set(batch_rule.RULES) == {"fixed", "always"}
    train = Config().train
    assert train.batch_growth == "steps" and train.steps is None
    assert batch_may_grow(train.batch_growth, train.steps) is False
    assert batch_may_grow(train.batch_growth, 360) is True
    for name, spec in batch_rule.SIZES["default"]["sets"].items():
        make = batch_rule._configs(spec, str(tmp_path), str(tmp_path / "data"))
        default, stepped = make(f"{name}-default-s0", 0), make(f"{name}-steps-s0", 0, steps=360)
        assert default.train.batch_growth == "steps" and default.train.steps is None, name
        assert batch_may_grow(default.train.batch_growth, default.train.steps) is False, name
        assert batch_may_grow(stepped.train.batch_growth, stepped.train.steps) is True, name
        always = make(f"{name}-always-s0", 0, **batch_rule.RULES["always"])
        assert batch_may_grow(always.train.batch_growth, always.train.steps) is True, name


def test_batch_rule_val_fraction_holds_out_the_asked_validation_videos():
    """The synthetic set keeps round(fraction x 9537) for validation: exactly 10 and 1,000 here."""
    from raytrain_seq.data.synthetic import SyntheticVideos

    for n in (10, 1000):
        videos = SyntheticVideos(max_videos=5000, val_fraction=batch_rule.val_fraction(n))
        assert len(videos.catalog("val").ids) == n


def _steps_run(seed: int, test: float, fixed_test: float, sizes: list[int]) -> dict:
    return {
        **_rule_run(seed, test, 100, sizes),
        "epochs": 12.5,
        "fixed_test": fixed_test,
        "fixed_epochs": 5.0,
    }


def test_batch_rule_verdicts_and_headline_follow_the_numbers():
    """At equal epochs only fixed and always are compared, and the default is named as the fixed run;
    under --steps N the default is paired with fixed seed by seed, and both gaps are called a gain or a
    loss only beyond their se (n >= 3), else within noise."""
    fixed = [_rule_run(s, t, 100, [4, 4]) for s, t in enumerate([0.6, 0.7, 0.8])]
    worse = [_rule_run(s, t, 40, [4, 16]) for s, t in enumerate([0.5, 0.5, 0.7])]  # -10, -20, -10
    level = [_steps_run(s, t, f, [4, 8]) for s, (t, f) in enumerate([(0.7, 0.6), (0.6, 0.7), (0.8, 0.8)])]
    res = {"seeds": [0, 1, 2], "steps_set": "small", "steps_max_b": 16, "steps_runs": level,
           "sets": {"small": {"val_videos": 10, "epochs": 5,
                              "stats": batch_rule.set_stats({"fixed": fixed, "always": worse})}}}  # fmt: skip
    head = batch_rule.headline(res)
    small = head["sets"]["small"]
    assert small["always_minus_fixed"] == pytest.approx(-40 / 3) and small["n"] == 3
    assert small["always_minus_fixed_se"] == pytest.approx(10 / 3) and small["call"].startswith("a loss")
    assert head["steps_default_minus_fixed"] == pytest.approx(0.0, abs=1e-9) and head["steps_n"] == 3
    assert head["steps_default_minus_fixed_se"] == pytest.approx(10 / math.sqrt(3))
    assert head["steps_call"] == "within noise (n = 3)" and head["steps_budget_grew"] == 3
    assert head["steps_default_minus_fixed_text"] == "+0.0 +- 5.8 (n = 3, within noise)"
    assert head["always_minus_fixed_text"] == "small -13.3 +- 3.3 (n = 3)"
    text = batch_rule.verdicts(res)
    assert "(always) - fixed -13.3 +- 3.3 points, a loss beyond one se (n = 3)" in text[0]
    assert "IS the fixed run" in text[1] and "batch_may_grow" in text[1] and "not measured" in text[1]
    assert "default - fixed +0.0 +- 5.8 points, within noise (n = 3)" in text[2]
    assert "equal steps, not equal data" in text[2] and "the runs read 12.5, 12.5, 12.5 epochs" in text[2]
    header, rows = batch_rule.table(res)
    assert [r[3] for r in rows] == ["fixed", "always"] and all(len(r) == len(header) for r in rows)
    assert rows[1][-1].startswith("a loss")
    _, steps_header, steps_rows = batch_rule.steps_table(res)
    assert steps_rows[0][-2:] == ["60.0 %", "+10.0"] and len(steps_rows[0]) == len(steps_header)
    # The --steps default beyond its se over three seeds is a gain; over two seeds it is not called.
    res["steps_runs"] = [
        _steps_run(s, t, f, [4, 8]) for s, (t, f) in enumerate([(0.8, 0.6), (0.7, 0.6), (0.9, 0.8)])
    ]
    assert batch_rule.headline(res)["steps_call"] == "a gain beyond one se (n = 3)"
    assert "a gain beyond one se (n = 3)" in batch_rule.verdicts(res)[2]
    res["steps_runs"] = res["steps_runs"][:2]
    assert batch_rule.headline(res)["steps_call"] == "within noise (n = 2)"
    # An always arm within its se is within noise, not a loss.
    near = [_rule_run(s, t, 40, [4, 16]) for s, t in enumerate([0.7, 0.6, 0.8])]  # +10, -10, 0
    res["sets"]["small"]["stats"] = batch_rule.set_stats({"fixed": fixed, "always": near})
    assert batch_rule.headline(res)["sets"]["small"]["call"] == "within noise (n = 3)"


# ------------------------------------------------------------------------------------------ video_feed
def _drained(task_spans: dict[int, list], windows: list[tuple[float, float, float, float]]) -> dict:
    """A drain_feed result by hand: per computing epoch its tasks [start, end, cpu] and stages; windows
    (start, end, CPU of every process, CPU of this one), 100 frames served each."""
    epochs = {
        e: {"partial_cpu_s": sum(s[2] for s in spans), "task_spans": spans,
            "stages": {"decode": 0.5 * sum(s[2] for s in spans), "partial_augment": 0.25 * sum(s[2] for s in spans)}}
        for e, spans in task_spans.items()
    }  # fmt: skip
    return {
        "windows": [
            {"served": 100, "wall": [a, b], "tree_cpu_s": tree, "own_cpu_s": own}
            for a, b, tree, own in windows
        ],
        "epochs": epochs,
        "startup": {"tree_cpu_s": 0.5, "own_cpu_s": 0.1},
    }


def test_video_feed_puts_task_cpu_in_its_epoch_and_the_rest_in_its_window():
    """Epoch 1's task ran inside epoch 0's window (the row streams run ahead): its CPU counts as warm,
    the rest of window 0 as cold; every CPU-second of the windows lands in exactly one row."""
    import video_feed

    run = _drained(
        {0: [[0.0, 1.0, 2.0]], 1: [[1.0, 2.0, 1.0]], 2: [[2.5, 3.0, 0.5]]},
        [(0.0, 2.0, 4.0, 0.4), (2.0, 3.0, 1.0, 0.2), (3.0, 4.0, 0.2, 0.1)],
    )
    cold, warm = video_feed.feed_rows(run, "avi", 8, 1)
    assert (cold["epoch"], warm["epoch"]) == ("cold", "warm")
    assert cold["cpu_s"] == pytest.approx(2.0 + (4.0 - 3.0))  # epoch 0's task, window 0 less both tasks
    assert warm["cpu_s"] == pytest.approx(1.0 + 0.5 + (1.0 - 0.5) + 0.2)
    assert cold["cpu_s"] + warm["cpu_s"] == pytest.approx(4.0 + 1.0 + 0.2)
    assert cold["kept_frames"] == 100 and warm["kept_frames"] == 200
    assert cold["frames_per_cpu_s"] == pytest.approx(100 / 3.0, abs=0.1)
    assert cold["stages"]["decode"] == pytest.approx(1e3 * 1.0 / 100)  # ms a kept frame
    assert cold["stages"]["row_streams"] == pytest.approx(1e3 * 0.4 / 100)
    assert sum(cold["stages"].values()) == pytest.approx(1e3 * cold["cpu_s"] / 100, rel=1e-3)
    assert video_feed.overlap([0.0, 4.0], [3.0, 9.0]) == pytest.approx(0.25)


def test_video_feed_verdicts_name_every_row_that_misses_a_target():
    import video_feed

    rows = [
        {"codec": "avi", "stride": 8, "r": 1, "epoch": "warm", "frames_per_cpu_s": 1900.0},
        {"codec": "mp4", "stride": 1, "r": 3, "epoch": "warm", "frames_per_cpu_s": 9000.0},
        {"codec": "mp4", "stride": 8, "r": 1, "epoch": "cold", "frames_per_cpu_s": 450.0},
    ]
    results = {"rows": rows, "dataloader": [
        {"codec": "avi", "stride": 8, "frames_per_cpu_s": 400.0}, {"codec": "mp4", "stride": 1, "frames_per_cpu_s": 500.0},
        {"codec": "mp4", "stride": 8, "frames_per_cpu_s": 330.0}]}  # fmt: skip
    video_feed.ratios(results)
    assert [r["x_dataloader"] for r in rows] == [4.75, 18.0, 1.36]
    lines = video_feed.verdicts(results)
    assert lines[0].endswith("met in 0 of 1 rows; not in avi stride 8 r 1: 1,900")
    assert "met in 1 of 2 rows; not in avi stride 8 r 1: 4.75x" in lines[1]
    assert "met in 0 of 1 rows; not in mp4 stride 8 r 1: 1.36x" in lines[2]


@pytest.mark.ray
def test_video_feed_runs_the_job_feed_on_real_footage_and_prints_its_json(tmp_path):
    """The bench end to end at its smallest (a subprocess: it starts its own Ray): the JSON last line has
    the issue's keys, a cold and a warm row, the plain DataLoader beside it, and the results files."""
    import subprocess

    command = [sys.executable, str(BENCH / "video_feed.py"), "--clips-per-class", "3", "--codecs", "avi",
               "--strides", "8", "--reuse", "1", "--epochs", "2", "--results", str(tmp_path), "--json"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["feed"] == "real" and {r["epoch"] for r in last["rows"]} == {"cold", "warm"}
    for row in last["rows"]:
        assert {"codec", "stride", "r", "epoch", "frames_per_cpu_s", "stages"} <= set(row)
        assert row["frames_per_cpu_s"] > 0 and set(row["stages"]) == set(video_feed_stages())
    assert [(d["codec"], d["stride"]) for d in last["dataloader"]] == [("avi", 8)]
    assert {d["backend"] for d in last["decoders"]} >= {"opencv", "pyav"}
    assert (tmp_path / "video_feed.md").is_file() and json.loads((tmp_path / "video_feed.json").read_text())


def video_feed_stages() -> tuple[str, ...]:
    import video_feed

    return video_feed.STAGES


# -------------------------------------------------------------------------------------------- bn_merge
def _bn_result(merge: list[float], plain: list[float], excess: float = 1e-3, weights: float = 0.0) -> dict:
    def runs(tests: list[float]) -> list[dict]:
        return [{"seed": s, "test": t, "val": t - 0.05, "val_curve": [0.3, t - 0.05], "loss": 0.5, "steps": 40,
                 "epochs": 4.0, "rounds": 4, "wall_s": 60.0, "load": 9.0} for s, t in enumerate(tests)]  # fmt: skip

    check = {"weights_max_abs_diff": weights, "mean_max_abs_diff": 0.0, "channels": 112,
             "var_excess_mean": excess, "var_excess_max": 3 * excess, "var_above": 1.0 if excess else 0.0}  # fmt: skip
    seeds = list(range(len(merge)))
    return {"size": {"videos": 300, "epochs": 4, "seeds": seeds}, "seeds": seeds, "runs": {"merge": runs(merge),
            "plain": runs(plain)}, "checks": [dict(check) for _ in merge], "chance": 0.1, "wall_s": 600.0}  # fmt: skip


def test_bn_merge_compares_final_models_tensor_by_tensor():
    """Weights, running means and the merged variances' excess over the plain ones, from two states."""
    plain = {"w": torch.ones(3), "bn.running_mean": torch.tensor([1.0, 2.0]),
             "bn.running_var": torch.tensor([1.0, 2.0]), "bn.num_batches_tracked": torch.tensor(5)}  # fmt: skip
    merge = {**plain, "bn.running_var": torch.tensor([1.1, 2.0])}
    out = bn_merge.bn_compare(merge, plain)
    assert out["weights_max_abs_diff"] == 0.0 and out["mean_max_abs_diff"] == 0.0 and out["channels"] == 2
    assert out["var_excess_max"] == pytest.approx(0.1) and out["var_excess_mean"] == pytest.approx(0.05)
    assert out["var_above"] == 0.5
    apart = bn_merge.bn_compare({**merge, "w": torch.tensor([1.0, 1.5, 1.0])}, plain)
    assert apart["weights_max_abs_diff"] == pytest.approx(0.5)


def test_bn_merge_pairs_by_seed_and_calls_only_beyond_the_se_over_three_seeds():
    assert bn_merge.paired([0.5, 0.7, 0.6], [0.6, 0.7, 0.7]) == (
        pytest.approx(-20 / 3),
        pytest.approx(10 / 3),
        3,
    )
    assert bn_merge.paired([0.5, None], [0.4, 0.3]) == (pytest.approx(10.0), None, 1)
    gain = bn_merge.headline(_bn_result([0.80, 0.85, 0.90], [0.70, 0.76, 0.79]))
    assert gain["n"] == 3 and gain["test_call"] == "a gain beyond one se" and gain["arms_differ"]
    assert set(bn_merge.HEADLINE_KEYS) <= set(gain)
    two = bn_merge.headline(_bn_result([0.8, 0.9], [0.5, 0.6]))
    assert two["test_call"] == "within noise"  # +30 points over 2 seeds: too few to call
    noise = " ".join(bn_merge.verdicts(_bn_result([0.6, 0.7, 0.5], [0.7, 0.6, 0.5])))
    assert "no difference to test accuracy that these seeds can resolve" in noise
    assert "vacuous" not in noise and "the same weights" in noise
    vacuous = " ".join(bn_merge.verdicts(_bn_result([0.6] * 3, [0.6] * 3, excess=0.0)))
    assert "vacuous" in vacuous
    header, rows = bn_merge.table(_bn_result([0.6, 0.7, 0.5], [0.7, 0.6, 0.5]))
    assert all(len(r) == len(header) for r in rows) and rows[-1][2:5] == ["-10.0", "+10.0", "+0.0"]


def test_bn_merge_main_writes_its_results_and_ends_with_the_json_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        bn_merge, "run", lambda size, seeds=None: _bn_result([0.6, 0.7, 0.5], [0.7, 0.6, 0.5])
    )
    head = bn_merge.main(["--results", str(tmp_path), "--json"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(bn_merge.HEADLINE_KEYS) <= set(last) and last["n"] == head["n"] == 3
    saved = json.loads((tmp_path / "bn_merge.json").read_text())
    assert saved["headline"]["test_call"] == "within noise" and (tmp_path / "bn_merge.md").exists()
    with pytest.raises(SystemExit) as info:
        bn_merge.main(["--help"])
    assert info.value.code == 0
