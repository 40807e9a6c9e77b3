"""The annotation-list dataset (``--dataset list``, MMAction2's VideoDataset format) and the models on it.

Contracts pinned: the lists' errors (malformed line, label out of range, duplicate, a video in two lists)
stop the job at start naming the file, the line and the fix; a missing, corrupt or empty video is skipped
with one warning and listed; every container of the format (.mp4, .avi, .mkv, .webm, .mov) is probed and
decoded to its frame count; ``data.check`` and the flow stream work on a list; and, on a private local
Ray cluster, a list of H.264 .mp4 clips made here with PyAV (one of them corrupt) trains through the job
end to end, the corrupt file listed in the summary, the model exported and predicted from model.pt.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from video_fixtures import CONTAINERS, make_mini_list, plant_corrupt, plant_zero_frame, write_video

from raytrain_seq.config import Config, RunSetupError
from raytrain_seq.data import check as data_check
from raytrain_seq.data.geometry import load_catalogs
from raytrain_seq.data.sources import get_source, source_kwargs
from raytrain_seq.data.video import decode, probe
from raytrain_seq.data.video_list import list_entries
from raytrain_seq.preflight import check_paths

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """3 classes x (4 train, 1 val, 2 test) H.264 .mp4 clips; one training clip corrupt, one empty."""
    ds = make_mini_list(tmp_path_factory.mktemp("list"))
    ds.bad = {"corrupt": str(ds.root / ds.train[1][1]), "empty": str(ds.root / ds.train[1][6])}
    plant_corrupt(ds.bad["corrupt"])
    plant_zero_frame(ds.bad["empty"])
    return ds


def _config(ds, **overrides) -> Config:
    files = {f"{side}_list": str(ds.root / f"{side}.txt") for side in ("train", "val", "test")}
    base = dict(dataset="list", data_root=str(ds.root), class_names=str(ds.root / "classes.txt"), **files)
    base.update(stride=2, cache_size=20, crop=16, run_name="x")
    return Config.from_preset(None, **{**base, **overrides})


def _lists(ds, **override):
    return {"train": str(ds.root / "train.txt"), "test": str(ds.root / "test.txt"), **override}


@pytest.mark.parametrize("ext", sorted(CONTAINERS))
def test_every_container_probes_and_decodes_to_its_frames(tmp_path, ext):
    """.mp4/.mkv/.mov (H.264), .avi (MPEG-4), .webm (VP8): the header (or a count) and the decode agree."""
    from video_fixtures import clip_frames

    path = write_video(tmp_path / f"clip.{ext}", clip_frames(1, 11), codec=CONTAINERS[ext])
    assert probe(path).frames == 11
    frames = decode(path, stride=2, size=20)
    assert frames.shape == (6, 20, 27, 3)  # 32x24 at short side 20: 26.7 rounds to 27
    # The class colour survives the codec: the frame's median is close to it.
    assert np.abs(np.median(frames[0].reshape(-1, 3), axis=0) - clip_frames(1, 1)[0, 0, 0]).max() < 24


def test_catalogs_read_the_lists_and_skip_the_bad_videos_with_one_warning(mini, caplog):
    """train/val/test from the lists (val from --val-list), ids disjoint, classes named; bad ones listed."""
    with caplog.at_level(logging.WARNING):
        loaded = load_catalogs(_config(mini).data)
    catalogs = loaded["catalogs"]
    assert loaded["class_names"] == ["jump", "run", "wave"]
    assert sorted(loaded["skipped"]) == sorted(mini.bad.values())
    warned = [r.getMessage() for r in caplog.records if "skipping video" in r.getMessage()]
    assert len(warned) == 2 and all(any(b in w for w in warned) for b in mini.bad.values())
    assert len(catalogs["train"]) == len(mini.train[1]) - 2
    assert len(catalogs["val"]) == len(mini.val) and len(catalogs["test"]) == len(mini.test[1])
    ids = [set(catalogs[s].ids.tolist()) for s in ("train", "val", "test")]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    for split in ("train", "test"):
        for path, label, length in zip(
            catalogs[split].paths, catalogs[split].labels, catalogs[split].lengths, strict=True
        ):
            rel = str(Path(path).relative_to(mini.root))
            assert (label, length) == (mini.videos[rel][0], -(-mini.videos[rel][1] // 2))
    # Without --val-list the validation videos are held out of the training list.
    held = load_catalogs(_config(mini, val_list=None).data)["catalogs"]
    assert len(held["val"]) >= 3 and len(held["train"]) + len(held["val"]) == len(mini.train[1]) - 2


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_bad_lines_stop_at_start_naming_file_line_and_fix(mini, tmp_path):
    """Malformed, non-integer, out-of-range, duplicate, in two lists: ValueError with file:line."""
    rel = mini.train[1][0]
    cases = [
        (["# header", rel], r"bad\.txt:2: expected 'relative/path\.ext label'"),
        ([f"{rel} one"], r"bad\.txt:1: label 'one' is not an integer"),
        ([f"{rel} -1"], r"bad\.txt:1: label -1 is out of range"),
        ([f"{rel} 3"], r"bad\.txt:1: label 3 is out of range 0\.\.2 \(the class-names file has 3"),
        ([f"{rel} 0", "", f"{rel} 0"], rf"bad\.txt:3: {rel} is already listed on line 1"),
    ]
    for lines, message in cases:
        bad = _write(tmp_path / "bad.txt", lines)
        with pytest.raises(ValueError, match=message):
            list_entries(mini.root, _lists(mini, train=bad), str(mini.root / "classes.txt"))
    twice = _write(tmp_path / "twice.txt", [f"{mini.test[1][0]} 0"])
    with pytest.raises(ValueError, match=r"twice\.txt:1: .* is also listed in .*test\.txt:2"):
        list_entries(mini.root, _lists(mini, val=twice))
    with pytest.raises(ValueError, match=r"absent\.txt"):
        list_entries(mini.root, _lists(mini, train=str(tmp_path / "absent.txt")))
    # The job's preflight turns each into one RunSetupError before Ray (data.split plays no part).
    bad = _write(tmp_path / "bad.txt", [f"{rel} 7"])
    with pytest.raises(RunSetupError, match=r"bad\.txt:1: label 7 is out of range"):
        check_paths(_config(mini, train_list=bad))


def test_lists_resolve_under_the_data_root_and_classes_default_to_labels(mini):
    """A bare file name is looked up under --data-root; without --class-names the labels name classes."""
    names, entries = list_entries(mini.root, {"train": "train.txt", "test": "test.txt"})
    assert names == ("0", "1", "2") and set(entries) == {"train", "test"}
    assert entries["train"][0][2].startswith(str(mini.root))


def test_data_check_probes_every_list(mini, capsys):
    """python -m raytrain_seq.data.check --dataset list: counts per list, the bad files named, exit 1."""
    argv = ["--dataset", "list", "--data-root", str(mini.root), "--stride", "2"]
    argv += ["--train-list", "train.txt", "--val-list", "val.txt", "--test-list", "test.txt"]
    code = data_check.main([*argv, "--class-names", "classes.txt"])
    out = capsys.readouterr().out
    assert code == 1
    assert f"train: {len(mini.train[1])} listed, {len(mini.train[1]) - 2} readable" in out
    assert "val: 3 listed, 3 readable" in out and "test: 6 listed, 6 readable" in out
    assert mini.bad["corrupt"] in out and mini.bad["empty"] in out
    assert data_check.main([*argv[:4], "--test-list", "test.txt"]) == 2  # no train list: unusable


def test_the_flow_stream_reads_a_list(mini):
    """--stream flow on a list: 2-channel flow of the catalog length for a training and a test video."""
    config = _config(mini, stream="flow")
    catalogs = load_catalogs(config.data)["catalogs"]
    source = get_source(source_kwargs(config.data))
    for split in ("train", "test"):
        video, length = int(catalogs[split].ids[0]), int(catalogs[split].lengths[0])
        window, report = source.load(video, 0 if split == "train" else None, 0, 20)
        assert window.shape == (length, 20, 20, 2) and window.dtype == np.uint8 and not report


# ------------------------------------------------------------------------- the job, end to end on Ray
RAY_CLUSTER = {"num_cpus": 4, "namespace": "raytrain_seq"}


@pytest.fixture(scope="module")
def run_dir(ray_cluster, mini, tmp_path_factory, ucf101_job):
    """The README's "Your own videos" training command on the list: mc3_18 (the smallest torchvision
    video backbone) at 16 px for one epoch, through jobs/ucf101.py on the module's local cluster."""
    storage = tmp_path_factory.mktemp("runs")
    argv = ["--preset", "mini-video", "--dataset", "list", "--data-root", str(mini.root), "--epochs", "1"]
    argv += ["--train-list", "train.txt", "--val-list", "val.txt", "--test-list", "test.txt"]
    argv += ["--class-names", "classes.txt", "--storage-path", str(storage), "--run-name", "mc3_18"]
    assert ucf101_job.main([*argv, "--backbone", "mc3_18"]) == 0
    return storage / "mc3_18"


@pytest.mark.ray
def test_a_list_of_mp4_clips_trains_end_to_end_and_lists_the_corrupt_one(run_dir, mini):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(summary["videos"]["skipped"]) == sorted(mini.bad.values())
    assert summary["videos"]["train"] == len(mini.train[1]) - 2
    assert summary["videos"]["test"] == len(mini.test[1]) and summary["videos"]["val"] == len(mini.val)
    assert summary["frames_total"] > 0
    assert set(summary["per_class_accuracy"]) <= set(mini.class_names)
    assert 0.0 <= summary["test_accuracy"] <= 1.0


@pytest.mark.ray
def test_export_then_predict_from_model_pt_on_every_container(run_dir, mini, tmp_path, capsys):
    """predict takes the exported model.pt as well as the run folder: the same probabilities; it reads
    every container; --test-views works on the video backbone."""
    from video_fixtures import clip_frames

    from raytrain_seq.inference.export import export
    from raytrain_seq.inference.predict import Predictor
    from raytrain_seq.inference.predict import main as predict_main

    out, _ = export(run_dir, tmp_path / "model.pt")
    clips = [
        write_video(tmp_path / f"c.{ext}", clip_frames(2, 9), codec=codec)
        for ext, codec in CONTAINERS.items()
    ]
    from_run, from_file = Predictor(run_dir), Predictor(out)
    assert from_file.config is None and from_file.class_names == list(mini.class_names)
    for clip in clips[:2]:  # the same model either way (predict_main below reads every container)
        assert from_run.top(clip) == from_file.top(clip)
    views = Predictor(out, test_views="ten_crop")
    ranked = views.top(clips[0])
    assert len(ranked) == 3 and sum(p for _, p in ranked) == pytest.approx(1.0, abs=1e-5)
    assert ranked != from_file.top(clips[0])  # ten views average to other probabilities than the centre
    assert predict_main([str(out), *map(str, clips), "--test-views", "three_crop", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert all(str(clip) in printed for clip in clips)
    assert predict_main([str(tmp_path / "nothing.pt"), str(clips[0])]) == 2
