"""Paths checked before Ray, and the data-root check: bad input found in a second, named with its fix.

Contracts pinned: every path a job reads (data root and split files, --weights, --init-from, --fuse,
--resume) that is missing or unusable is a RunSetupError naming it; the job exits 2 with one line in
well under 2 s without importing ray or torch; ``python -m raytrain_seq.data.check`` counts the listed,
missing and unreadable videos of a split, their frame statistics and the packing's padding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from video_fixtures import make_mini_ucf101, plant_corrupt

from raytrain_seq.config import Config, RunSetupError
from raytrain_seq.data import check as data_check
from raytrain_seq.preflight import check_paths

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """Mini UCF101 (3 classes x 6 groups x 2 clips) with one corrupt and one missing training video."""
    ds = make_mini_ucf101(tmp_path_factory.mktemp("ucf"))
    ds.corrupt, ds.missing = ds.path(ds.train[1][0]), ds.path(ds.train[1][3])
    plant_corrupt(ds.corrupt)
    os.remove(ds.missing)
    return ds


def _run_folder(path: Path, *, checkpoint: bool) -> str:
    (path / ("checkpoint_round_000001" if checkpoint else "not_a_checkpoint")).mkdir(parents=True)
    if checkpoint:
        (path / "checkpoint_round_000001" / "state.pt").write_bytes(b"")  # only its presence is checked
    return str(path)


def test_every_bad_path_is_named_with_its_fix(tmp_path, mini):
    """One table of bad paths: each raises RunSetupError naming the path; good ones pass."""
    good_run = _run_folder(tmp_path / "good", checkpoint=True)
    empty_run = _run_folder(tmp_path / "empty", checkpoint=False)
    broken = tmp_path / "broken"
    (broken / "UCF-101").mkdir(parents=True)
    (broken / "ucfTrainTestlist").mkdir()
    (broken / "ucfTrainTestlist" / "classInd.txt").write_text("1 Archery\n")
    cases = [
        ({"dataset": "ucf101", "data_root": str(tmp_path / "nowhere")}, "nowhere: no such folder"),
        ({"dataset": "ucf101", "data_root": str(broken)}, "trainlist01.txt"),
        ({"backbone": "resnet18", "weights": str(tmp_path / "w.pth")}, "w.pth: no readable file"),
        ({"init_from": str(tmp_path / "gone")}, "--init-from .*gone: no such run folder"),
        ({"init_from": empty_run}, "--init-from .*empty: holds no checkpoint_round_"),
        ({"stream": "fuse", "fuse": (good_run, empty_run)}, "--fuse .*empty: holds no checkpoint_round_"),
        ({"resume": True, "run_name": "absent", "storage_path": str(tmp_path)}, "--resume .*absent"),
        ({"resume": True, "run_name": "empty", "storage_path": str(tmp_path)}, "--resume .*empty: holds no"),
    ]
    for overrides, message in cases:
        config = Config.from_preset(None, **{"run_name": "x", **overrides})
        with pytest.raises(RunSetupError, match=message):
            check_paths(config)
    fine = {"dataset": "ucf101", "data_root": str(mini.root), "init_from": good_run, "run_name": "x"}
    check_paths(Config.from_preset(None, **fine))  # no error: the lists read, the run has a checkpoint
    # A run whose driver died before its first checkpoint left its event log: --resume starts it over.
    (tmp_path / "stopped").mkdir()
    (tmp_path / "stopped" / "events.jsonl").write_text('{"type": "start"}\n')
    check_paths(Config.from_preset(None, resume=True, run_name="stopped", storage_path=str(tmp_path)))


@pytest.mark.parametrize(
    "flags",
    [
        ["--dataset", "ucf101", "--data-root", "/nonexistent/ucf"],
        ["--preset", "smoke", "--backbone", "resnet50", "--weights", "/nonexistent/w.pth"],
        ["--preset", "smoke", "--resume", "--run-name", "never-ran", "--storage-path", "/nonexistent"],
    ],
)
def test_a_bad_path_exits_2_fast_without_ray_or_torch(flags):
    """The job, as a user starts it: exit 2, one `error:` line naming the path, no ray and no torch loaded
    (what keeps it to a fraction of a second: the time itself is not asserted, a loaded box varies)."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['ucf101.py', *{flags!r}]\n"
        "try:\n"
        "    runpy.run_path('jobs/ucf101.py', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    print(json.dumps({'code': exit.code, 'ray': 'ray' in sys.modules, 'torch': 'torch' in sys.modules}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"code": 2, "ray": False, "torch": False}, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "/nonexistent" in errors[0], out.stderr
    assert "Traceback" not in out.stderr


def test_data_check_counts_problems_frames_and_padding(mini, capsys):
    """data.check on the mini set: listed = readable + missing + unreadable; stats and padding reported."""
    report = data_check.check("ucf101", str(mini.root), 1, stride=2, workers=2)
    train, test = report["train"], report["test"]
    assert train["listed"] == len(mini.train[1]) and test["listed"] == len(mini.test[1])
    assert train["missing"] == [mini.missing] and [p for p, _ in train["unreadable"]] == [mini.corrupt]
    assert train["readable"] == train["listed"] - 2 and test["readable"] == test["listed"]
    readable = [n for rel, (_, n) in mini.videos.items() if rel in mini.train[1] and mini.path(rel) not in
                (mini.missing, mini.corrupt)]  # fmt: skip
    assert train["frames"]["max"] == max(readable) and train["frames"]["min"] == min(readable)
    assert train["strided_frames"]["max"] == -(-max(readable) // 2)
    packing = report["packing"]
    assert 0 <= packing["padding_fraction"] < packing["pad_padding_fraction"] < 1
    assert packing["blocks"] >= packing["lower_bound_blocks"]
    assert data_check.main(["--dataset", "ucf101", "--data-root", str(mini.root), "--split", "1"]) == 1
    out = capsys.readouterr().out
    assert "unreadable: " + mini.corrupt in out and "missing: " + mini.missing in out and "padding" in out
    assert data_check.main(["--dataset", "ucf101", "--data-root", "/nonexistent"]) == 2


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({}, True),  # epochs, batch_growth "steps": B is held, though max_batch_size leaves it room
        ({"batch_rule": "paper"}, True),
        ({"steps": 40}, False),  # the paper's step budget: Algorithm 1 may grow B
        ({"batch_growth": "always"}, False),
        ({"adaptive_batch": False}, False),  # the rule is off: nothing to say
        ({"max_batch_size": 4}, False),  # no room to grow
    ],
)
def test_a_run_whose_batch_rule_cannot_grow_b_says_so_once_at_start(overrides, says, caplog):
    """The presets set max_batch_size above batch_size under epochs; with batch_growth "steps" B never grows
    there, and the check says so once, naming both ways to let it grow."""
    import logging

    from raytrain_seq import preflight

    config = Config.from_preset("smoke", max_videos=24, batch_size=4, **overrides)
    with caplog.at_level(logging.INFO, logger="raytrain_seq.preflight"):
        preflight.check(config)
        preflight.check(config, reuse=True)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch size:")]
    assert len(lines) == (1 if says else 0), lines
    if says:
        assert (
            "B stays at 4 blocks" in lines[0]
            and "--steps N" in lines[0]
            and "--batch-growth always" in lines[0]
        )
