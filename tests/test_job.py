"""The Ray job end to end on a local cluster: the smoke preset with 2 learners, then resumed from its checkpoint.

Contract pinned: a run trains every training sequence in every epoch with no frame deleted, packs
within a block of the lower bound, splits the work evenly over its learners, writes summary.json,
curves.png and checkpoints that load with ``torch.load(weights_only=True)``; ``--resume`` continues from
the latest checkpoint (its rounds and epochs go on from there) instead of starting over.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_tracking import read_events

from raytrain_seq import checkpoint
from raytrain_seq.config import Config
from raytrain_seq.data.synthetic import SyntheticVideos

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[1]


# tests/conftest.py's ray_cluster: a learner per CPU for 2 learners, plus the feed's data tasks.
RAY_CLUSTER = {"num_cpus": 4, "namespace": "raytrain_seq"}


def _smoke(tmp_path, **overrides) -> Config:
    return Config.from_preset("smoke", storage_path=str(tmp_path), **overrides)


def _readme_python_block() -> str:
    """The Python block of README's "From Python" section, as a user would paste it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## From Python") :]
    return section[section.index("```python\n") + len("```python\n") : section.index("\n```\n")]


def test_smoke_run_end_to_end_then_resume(ray_cluster, tmp_path, capsys):
    """The README's Python API block (smoke preset, 2 learners, 1 epoch), as written there but for the
    folder; then --resume to 2 epochs continues from round 1's checkpoint."""
    from raytrain_seq.runtime.driver import run

    block = _readme_python_block()
    assert "from raytrain_seq import Config, train" in block and "train(config)" in block
    namespace: dict = {}
    exec(
        block.replace("/tmp/raytrain_seq_runs", str(tmp_path)).replace('"from-python"', '"smoke"'), namespace
    )
    config, summary = namespace["config"], namespace["summary"]
    assert config.to_dict() == _smoke(tmp_path, epochs=1, run_name="smoke").to_dict()
    assert str(summary.json_path) in capsys.readouterr().out
    run_dir = config.run_dir()

    # Every training sequence is trained once per epoch: frames match the catalog exactly.
    data = config.data
    catalog = SyntheticVideos(
        num_classes=data.num_classes,
        stride=data.stride,
        size=data.cache_size,
        seed=data.seed,
        max_videos=data.max_videos,
        val_fraction=data.val_fraction,
    ).catalog("train")
    assert catalog.lengths.sum() > 0
    assert summary.frames_total == int(catalog.lengths.sum())
    assert summary.frames_deleted == 0
    assert summary.packing["blocks"] <= summary.packing["lower_bound_blocks"] + 1
    assert 0 <= summary.padding_fraction < 0.05
    assert summary.rounds == 1  # K=-1: one averaging round per epoch
    assert summary.refurbish["recomputed"] == len(catalog)  # epoch 0 computes everything
    assert summary.test_accuracy is not None and 0.0 <= summary.test_accuracy <= 1.0
    assert summary.seconds["compute"] > 0 and summary.seconds["total"] > summary.seconds["compute"]
    seconds = summary.seconds
    buckets = ("startup", "cold_epoch", "compute", "averaging", "data_wait", "validation", "test", "write")
    assert all(seconds[key] >= 0 for key in buckets) and seconds["startup"] > 0 and seconds["test"] > 0
    # One timeline (rank 0's): the buckets add up to the total, within 5 % (what none measured).
    assert abs(sum(seconds[key] for key in buckets) - seconds["total"]) <= 0.05 * seconds["total"], seconds
    learners = summary.extra["averager"]["membership"]
    assert sorted(event["learner"] for event in learners if event["event"] == "join") == [0, 1]

    stored = json.loads((run_dir / "summary.json").read_text())
    for key in ("test_accuracy", "frames_total", "padding_fraction", "seconds", "packing", "refurbish"):
        assert key in stored
    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run_dir / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The standard metrics, and the live tracking written while it ran (TensorBoard by default).
    assert 0.0 <= summary.test_accuracy <= summary.top5_accuracy <= 1.0
    assert summary.mean_class_accuracy is not None and 0.0 <= summary.mean_class_accuracy <= 1.0
    assert stored["top5_accuracy"] == summary.top5_accuracy and "mean_class_accuracy" in stored
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*")), "no TensorBoard event file"
    scalars, _ = read_events(run_dir / "tensorboard")  # the averager's rounds, the driver's test scores
    assert scalars["test/top1"] == [(summary.rounds, pytest.approx(summary.test_accuracy))]
    assert [step for step, _ in scalars["train/batch_size"]] == list(range(1, summary.rounds + 1))
    latest = checkpoint.load_latest(run_dir)
    assert latest is not None and latest.folder.name == "checkpoint_round_000001"
    raw = torch.load(latest.folder / checkpoint.STATE_FILE, weights_only=True)  # plain types only
    assert raw["state"]["round"] == 1 and raw["state"]["params"] and latest.state.round == 1
    assert latest.config == config.to_dict() and latest.position["round"] == 1

    # A second run with the same name refuses to overwrite it...
    with pytest.raises(ValueError, match="already exists"):
        run(_smoke(tmp_path, epochs=1, run_name="smoke"))

    # ...and --resume trains only the missing epoch, starting from the averaged state of round 1.
    resumed = run(_smoke(tmp_path, epochs=2, run_name="smoke", resume=True))
    assert resumed.rounds == 1  # only round 2 was averaged in this run
    assert resumed.frames_total == int(catalog.lengths.sum())  # one more epoch, not two
    assert checkpoint.load_latest(run_dir).folder.name == "checkpoint_round_000002"
    assert not math.isnan(resumed.loss_history[-1]["loss"])
    rounds = [h["round"] for h in resumed.loss_history]
    assert rounds == [1, 2], "the resumed history continues the first run's"


def test_learners_score_validation_shares_where_no_evaluator_runs(ray_cluster, tmp_path):
    """``validator="learners"`` (what GPU learners do, where a CPU evaluator would hold every next round):
    each validation round is scored by the learners, each its share of the split on its own device, and
    summed by the averager; every round's validation is there and none was missed, rank 0 spent its share's
    time validating, and no round waited for a validation (averaging far below the 60 s timeout). A
    resume of the run continues with the learners validating."""
    from raytrain_seq.runtime.driver import run

    config = _smoke(tmp_path, epochs=2, run_name="shares", validator="learners", tracker="none")
    summary = run(config)
    stored = json.loads((config.run_dir() / "summary.json").read_text())
    assert [v["round"] for v in summary.val_accuracy_history] == [1, 2]
    assert all(0.0 <= v["accuracy"] <= 1.0 for v in summary.val_accuracy_history)
    assert summary.seconds["validation"] > 0 and summary.seconds["averaging"] < 30
    assert stored["config"]["train"]["validator"] == "learners"
    resumed = run(_smoke(tmp_path, epochs=3, run_name="shares", validator="learners", tracker="none",
                         resume=True))  # fmt: skip
    assert [v["round"] for v in resumed.val_accuracy_history][-1] == 3
    assert resumed.seconds["averaging"] < 30
