"""Real-video decoding (PyAV) and the UCF101 / HMDB51 readers, on miniature data sets written in the test."""

from __future__ import annotations

import logging
import math
import os
import pickle
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from video_fixtures import (
    class_colour,
    clip_frames,
    frame_indices,
    make_mini_hmdb51,
    make_mini_ucf101,
    plant_corrupt,
    plant_header_frames,
    plant_zero_frame,
    ramp_frames,
    write_video,
)

from raytrain_seq.data.hmdb51 import hmdb51_catalog
from raytrain_seq.data.lengths import strided
from raytrain_seq.data.ucf101 import ucf101_catalog
from raytrain_seq.data.video import (
    VideoError,
    decode,
    output_length,
    probe,
    resampled_length,
    strided_length,
)

VIDEO_LOGGER = "raytrain_seq.data.video"


@pytest.fixture(scope="module")
def ramp(tmp_path_factory) -> Path:
    """A 13-frame, 25 fps AVI whose frame i is flat grey 8 + 12 i."""
    return write_video(tmp_path_factory.mktemp("ramp") / "ramp.avi", ramp_frames(13))


@pytest.fixture(scope="module")
def ramp20(tmp_path_factory) -> Path:
    return write_video(tmp_path_factory.mktemp("ramp20") / "ramp20.avi", ramp_frames(20))


@pytest.fixture(scope="module")
def ucf(tmp_path_factory):
    return make_mini_ucf101(tmp_path_factory.mktemp("ucf"))


@pytest.fixture(scope="module")
def hmdb(tmp_path_factory):
    return make_mini_hmdb51(tmp_path_factory.mktemp("hmdb"))


def _nearest_class(frames: np.ndarray, classes: int) -> int:
    median = np.median(frames.reshape(-1, 3), axis=0)
    return int(np.argmin([np.abs(median - class_colour(c)).sum() for c in range(classes)]))


# ------------------------------------------------------------------------------------------ decoding


def test_decode_round_trip(ramp, tmp_path):
    """decode returns exactly the frames written, in order, uint8 RGB, up to small codec loss."""
    out = decode(ramp)
    assert out.dtype == np.uint8 and out.shape == (13, 24, 32, 3)
    assert frame_indices(out) == list(range(13))
    assert np.abs(out.astype(int) - ramp_frames(13)).mean() < 3.0
    written = clip_frames(2, 9)
    back = decode(write_video(tmp_path / "clip.avi", written))
    assert back.shape == written.shape
    assert np.abs(back.astype(int) - written).mean() < 6.0
    # Each decoded frame is nearer its own source frame than the next one (the square moves, so the
    # frames really differ and their order is checked, not just their mean colour).
    err = [[np.abs(back[i].astype(int) - written[j]).mean() for j in (i, i + 1)] for i in range(8)]
    assert all(own < 0.5 * other for own, other in err)


@pytest.mark.parametrize("stride", [1, 2, 3, 5, 13, 20])
def test_stride_keeps_every_stride_th_frame(ramp, stride):
    """stride s keeps frames 0, s, 2s, ...: ceil(n / s) of them, as strided_length and lengths.strided say."""
    out = decode(ramp, stride=stride)
    assert frame_indices(out) == list(range(0, 13, stride))
    assert (
        len(out) == strided_length(13, stride) == strided([13], stride)[0] == output_length(13, stride=stride)
    )


@pytest.mark.parametrize("fps", [10, 12.5, 7, 24, 25, 30])
def test_fps_keeps_frame_when_floor_increases(ramp20, fps):
    """fps f on a 25 fps source keeps frame i when floor(i f / 25) increases; resampled_length counts them."""
    expected = [i for i in range(20) if i == 0 or math.floor(i * fps / 25) > math.floor((i - 1) * fps / 25)]
    out = decode(ramp20, fps=fps)
    assert frame_indices(out) == expected
    assert len(out) == resampled_length(20, 25, fps) == output_length(20, fps=fps, src_fps=25.0)
    if fps < 25:  # a real resampling: fewer frames, and not a plain stride (uneven gaps)
        gaps = set(np.diff(expected).tolist())
        assert len(expected) < 20 and (len(gaps) > 1 or fps == 12.5)
    else:
        assert expected == list(range(20))


def test_resampled_length_matches_brute_force():
    """resampled_length equals a brute-force count of the floor rule in exact arithmetic, NTSC rates too."""
    rates = {
        25: Fraction(25),
        30000 / 1001: Fraction(30000, 1001),
        29.97: Fraction("29.97"),
        15: Fraction(15),
    }
    targets = {
        1: Fraction(1),
        5: Fraction(5),
        10: Fraction(10),
        12.5: Fraction("12.5"),
        29.97: Fraction("29.97"),
    }
    checked = 0
    for src, src_exact in rates.items():
        for fps, fps_exact in targets.items():
            r = fps_exact / src_exact
            for n in range(0, 80):
                floors = [math.floor(i * r) for i in range(n)]
                kept = sum(1 for i in range(n) if i == 0 or floors[i] > floors[i - 1])
                assert resampled_length(n, src, fps) == kept, (n, src, fps)
                checked += kept != n
    assert checked > 100  # most cases really drop frames


def test_resize_short_side_and_exact_size(tmp_path):
    """size=k scales the short side to k keeping the aspect; size=(h, w) is exact; content is preserved."""
    landscape = write_video(tmp_path / "land.avi", clip_frames(1, 7))  # 32x24
    portrait = write_video(tmp_path / "port.avi", clip_frames(3, 7, height=32, width=24))
    assert decode(landscape, size=12).shape == (7, 12, 16, 3)
    assert decode(landscape, size=48).shape == (7, 48, 64, 3)
    assert decode(portrait, size=12).shape == (7, 16, 12, 3)
    assert decode(landscape, size=(10, 20)).shape == (7, 10, 20, 3)
    small = decode(landscape, size=12, stride=2)
    assert small.shape == (4, 12, 16, 3)
    assert np.abs(np.median(small.reshape(-1, 3), axis=0) - class_colour(1)).max() < 8


def test_max_frames_counts_kept_frames(ramp):
    """max_frames stops after that many kept frames."""
    assert frame_indices(decode(ramp, stride=2, max_frames=3)) == [0, 2, 4]
    assert len(decode(ramp, max_frames=100)) == 13


def test_probe_matches_decode(ramp, tmp_path):
    """probe reads frames, fps and size from the container; verify=True counts by decoding and agrees."""
    info = probe(ramp)
    assert (info.frames, info.fps, info.width, info.height, info.source) == (13, 25.0, 32, 24, "container")
    assert info.frames == len(decode(ramp))
    checked = probe(ramp, verify=True)
    assert (checked.frames, checked.source) == (13, "decode")
    mkv = write_video(tmp_path / "clip.mkv", ramp_frames(9))  # Matroska stores no frame count
    assert (probe(mkv).frames, probe(mkv).source) == (9, "decode")


@pytest.mark.parametrize("decoder", ["pyav", "opencv"])
def test_decode_with_info_reads_what_probe_reads_from_the_same_open(ramp, tmp_path, decoder):
    """decode_with_info's header is probe's: the container's count where it has one (a lying one too,
    as probe without verify), else the source frames the decode went through, even at a stride; the
    pairs' variant gives the same."""
    from raytrain_seq.data.video import decode_pairs_with_info, decode_with_info

    mkv = write_video(tmp_path / "clip.mkv", ramp_frames(9))  # Matroska stores no frame count
    liar = write_video(tmp_path / "liar.avi", ramp_frames(12))
    plant_header_frames(liar, 20)
    for path in (ramp, mkv, liar):
        frames, info = decode_with_info(path, stride=4, decoder=decoder)
        expected = probe(path, decoder=decoder)
        assert (info.frames, info.fps, info.width, info.height, info.source) == (
            expected.frames,
            expected.fps,
            expected.width,
            expected.height,
            expected.source,
        )
        assert np.array_equal(frames, decode(path, stride=4, decoder=decoder))
        assert decode_pairs_with_info(path, stride=4, decoder=decoder)[3] == info
    assert decode_with_info(mkv, decoder=decoder)[1].frames == 9 and probe(liar, decoder=decoder).frames == 20


def test_probe_verify_catches_a_lying_header(tmp_path, caplog):
    """A header frame count that the decode contradicts is trusted only without verify; verify warns once."""
    path = write_video(tmp_path / "liar.avi", ramp_frames(12))
    plant_header_frames(path, 20)
    assert probe(path).frames == 20  # the lie is visible, so the check below is not vacuous
    with caplog.at_level(logging.WARNING, logger=VIDEO_LOGGER):
        assert probe(path, verify=True).frames == 12
    assert [r.getMessage() for r in caplog.records if str(path) in r.getMessage()] == [
        f"{path}: the container says 20 frames, decoding gives 12; using 12"
    ]
    assert len(decode(path)) == 12


@pytest.mark.parametrize("kind", ["garbage", "riff_garbage", "zero_frames", "missing", "directory"])
def test_bad_files_raise_video_error_naming_the_file(tmp_path, kind):
    """Unreadable, corrupt, zero-frame, missing files: probe and decode raise VideoError naming file, fix."""
    path = tmp_path / f"{kind}.avi"
    if kind == "garbage":
        path.write_bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    elif kind == "riff_garbage":
        plant_corrupt(path)
    elif kind == "zero_frames":
        plant_zero_frame(path)
    elif kind == "directory":
        path.mkdir()
    for call in (probe, decode):
        with pytest.raises(VideoError) as info:
            call(path)
        assert info.value.path == str(path)
        assert str(path) in str(info.value) and "re-encode" in str(info.value)


def test_video_error_pickles():
    """VideoError survives pickling (Ray moves it between processes) with path, reason and message intact."""
    err = VideoError("/data/UCF-101/X/v_X_g01_c01.avi", "zero frames")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is VideoError and isinstance(back, ValueError)
    assert (back.path, back.reason, str(back)) == (err.path, err.reason, str(err))
    assert "v_X_g01_c01.avi: zero frames" in str(back)


def test_bad_arguments_raise(ramp):
    """Bad decode arguments raise ValueError/TypeError that say what to use instead."""
    with pytest.raises(ValueError, match="stride or fps"):
        decode(ramp, stride=2, fps=10)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        decode(ramp, stride=0)
    with pytest.raises(ValueError, match="positive"):
        decode(ramp, fps=-5)
    with pytest.raises(ValueError, match="height, width"):
        decode(ramp, size=(1, 2, 3))
    with pytest.raises(TypeError, match="stride"):
        strided_length(10, 1.5)


# ------------------------------------------------------------------------------------------ catalogs


def _rel(path: str, base: Path) -> str:
    return Path(path).relative_to(base).as_posix()


def _stable_ids(ds) -> dict[str, int]:
    """Documented ids: rank of every listed video by (label, file name), the same in every fold."""
    order = sorted(ds.videos, key=lambda rel: (ds.videos[rel][0], rel.split("/")[1]))
    return {rel: k for k, rel in enumerate(order)}


@pytest.mark.parametrize("fold", [1, 2, 3])
def test_ucf101_catalogs_and_labels(ucf, fold):
    """UCF101 catalogs list exactly the fold's videos, labelled by folder, disjoint ids, container lengths."""
    base = ucf.root / "UCF-101"
    cats = {split: ucf101_catalog(ucf.root, split, fold) for split in ("train", "test")}
    for split, expected in (("train", ucf.train[fold]), ("test", ucf.test[fold])):
        cat = cats[split]
        rels = [_rel(p, base) for p in cat.paths]
        assert sorted(rels) == sorted(expected) and cat.skipped == ()
        assert cat.class_names == ucf.class_names and cat.num_classes == 3 and cat.split == split
        assert cat.labels.tolist() == [ucf.class_names.index(r.split("/")[0]) for r in rels]
        assert cat.labels.tolist() == [ucf.videos[r][0] for r in rels]
        assert cat.lengths.tolist() == cat.frames.tolist() == [ucf.videos[r][1] for r in rels]
        assert cat.ids.tolist() == [_stable_ids(ucf)[r] for r in rels]
        assert np.all(np.diff(cat.ids) > 0) and all(
            cat.path_of(i) == p for i, p in zip(cat.ids, cat.paths, strict=True)
        )
        assert set(cat.labels.tolist()) == {0, 1, 2}
    train_ids, test_ids = set(cats["train"].ids.tolist()), set(cats["test"].ids.tolist())
    assert not train_ids & test_ids and train_ids | test_ids == set(range(len(ucf.videos)))
    assert set(ucf.train[1]) != set(ucf.train[2]) != set(ucf.train[3])  # the folds really differ


def test_ucf101_labels_match_the_pixels(ucf):
    """Every UCF101 test video's decoded colour is its label's class colour (labels name the content)."""
    cat = ucf101_catalog(ucf.root, "test", 1)
    assert [_nearest_class(decode(p, stride=4), 3) for p in cat.paths] == cat.labels.tolist()


def test_ucf101_stride_and_fps_lengths_match_decode(ucf):
    """Catalog lengths under stride or fps equal what decode returns with that setting, without decoding."""
    strided_cat = ucf101_catalog(ucf.root, "test", 2, stride=3)
    assert strided_cat.lengths.tolist() == [len(decode(p, stride=3)) for p in strided_cat.paths]
    assert strided_cat.lengths.tolist() == strided(strided_cat.frames, 3).tolist()
    fps_cat = ucf101_catalog(ucf.root, "test", 2, fps=10)
    assert (fps_cat.fps, strided_cat.stride) == (10.0, 3)
    assert fps_cat.lengths.tolist() == [len(decode(p, fps=10)) for p in fps_cat.paths]
    assert np.all(fps_cat.lengths < fps_cat.frames) and np.any(fps_cat.lengths != strided_cat.lengths)


@pytest.mark.parametrize("fold", [1, 2, 3])
def test_hmdb51_catalogs_and_labels(hmdb, fold):
    """HMDB51 catalogs: flag 1 train, 2 test, 0 in neither; labels = sorted folder rank; disjoint ids."""
    cats = {split: hmdb51_catalog(hmdb.root, split, fold) for split in ("train", "test")}
    for split, expected in (("train", hmdb.train[fold]), ("test", hmdb.test[fold])):
        cat = cats[split]
        rels = [_rel(p, hmdb.root) for p in cat.paths]
        assert sorted(rels) == sorted(expected) and cat.skipped == ()
        assert cat.class_names == tuple(sorted(hmdb.class_names))
        assert cat.labels.tolist() == [cat.class_names.index(r.split("/")[0]) for r in rels]
        assert cat.lengths.tolist() == [hmdb.videos[r][1] for r in rels]
        assert cat.ids.tolist() == [_stable_ids(hmdb)[r] for r in rels]
        assert np.all(np.diff(cat.ids) > 0)
    train_ids, test_ids = set(cats["train"].ids.tolist()), set(cats["test"].ids.tolist())
    unused = len(hmdb.videos) - len(hmdb.train[fold]) - len(hmdb.test[fold])
    assert not train_ids & test_ids and unused > 0
    assert len(train_ids | test_ids) == len(hmdb.videos) - unused and max(train_ids | test_ids) < len(
        hmdb.videos
    )
    assert [_nearest_class(decode(p, stride=4), 3) for p in cats["test"].paths] == cats[
        "test"
    ].labels.tolist()


def _copy(ds, tmp_path: Path) -> Path:
    return Path(shutil.copytree(ds.root, tmp_path / "data"))


def _warnings_naming(caplog, path: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and path in r.getMessage()]


def test_ucf101_bad_videos_skipped_with_one_warning_each(ucf, tmp_path, caplog):
    """Corrupt, zero-frame and missing UCF101 videos are skipped, one warning each, listed in skipped."""
    root = _copy(ucf, tmp_path)
    bad = [os.path.join(root, "UCF-101", *rel.split("/")) for rel in ucf.train[1][1:4]]
    plant_corrupt(bad[0])
    plant_zero_frame(bad[1])
    os.remove(bad[2])
    with caplog.at_level(logging.WARNING):
        cat = ucf101_catalog(root, "train", 1)
    assert [path for path, _ in cat.skipped] == bad
    assert "zero frames" in cat.skipped[1][1] and "not found" in cat.skipped[2][1]
    for path in bad:
        assert len(_warnings_naming(caplog, path)) == 1
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 3
    assert len(cat) == len(ucf.train[1]) - 3 and not set(bad) & set(cat.paths)
    good = ucf101_catalog(ucf.root, "train", 1)
    assert (
        dict(zip(cat.ids.tolist(), cat.labels.tolist(), strict=True)).items()
        <= dict(zip(good.ids.tolist(), good.labels.tolist(), strict=True)).items()
    )  # the survivors keep their ids and labels: nothing shifts


def test_hmdb51_bad_videos_skipped_with_one_warning_each(hmdb, tmp_path, caplog):
    """Corrupt and zero-frame HMDB51 videos are skipped, one warning each, listed in skipped."""
    root = _copy(hmdb, tmp_path)
    bad = [os.path.join(root, *rel.split("/")) for rel in (hmdb.test[2][0], hmdb.test[2][-1])]
    plant_corrupt(bad[0])
    plant_zero_frame(bad[1])
    with caplog.at_level(logging.WARNING):
        cat = hmdb51_catalog(root, "test", 2)
    assert [path for path, _ in cat.skipped] == bad
    assert [len(_warnings_naming(caplog, path)) for path in bad] == [1, 1]
    assert len(cat) == len(hmdb.test[2]) - 2


def _edit_line(path: Path, lineno: int, new: str | None) -> None:
    lines = path.read_bytes().decode().splitlines(keepends=True)
    ending = "\r\n" if lines[0].endswith("\r\n") else "\n"
    if new is None:
        del lines[lineno - 1]
    else:
        lines[lineno - 1] = new + ending
    path.write_bytes("".join(lines).encode())


def _shift_all_labels(path: Path) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(f"{rel} {int(label) - 1}" for rel, label in (line.split() for line in lines)))


UCF_ERRORS = {
    # name: (edit(root, lists), fragment the message must contain)
    "missing data root": (lambda root, lists: shutil.rmtree(root), "data root not found"),
    "missing video folder": (lambda root, lists: shutil.rmtree(root / "UCF-101"), "UCF-101"),
    "missing split file": (lambda root, lists: os.remove(lists / "testlist01.txt"), "testlist01.txt"),
    "missing classInd": (lambda root, lists: os.remove(lists / "classInd.txt"), "classInd.txt"),
    "unknown class": (
        lambda root, lists: _edit_line(lists / "trainlist01.txt", 3, "Nope/v_Nope_g01_c01.avi 1"),
        "trainlist01.txt:3: class 'Nope'",
    ),
    "label out of range": (
        lambda root, lists: _edit_line(
            lists / "trainlist01.txt", 2, "ApplyEyeMakeup/v_ApplyEyeMakeup_g03_c02.avi 4"
        ),
        "trainlist01.txt:2: label 4 is out of range 1..3",
    ),
    "zero-based labels (a shift)": (
        lambda root, lists: _shift_all_labels(lists / "trainlist01.txt"),
        "trainlist01.txt:1: label 0 is out of range",
    ),
    "label disagrees with folder": (
        lambda root, lists: _edit_line(
            lists / "trainlist01.txt", 5, "ApplyEyeMakeup/v_ApplyEyeMakeup_g05_c01.avi 2"
        ),
        "trainlist01.txt:5: label 2 is 'ApplyLipstick' in classInd.txt but the folder is 'ApplyEyeMakeup'",
    ),
    "test label disagrees": (
        lambda root, lists: _edit_line(
            lists / "testlist01.txt", 1, "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi 3"
        ),
        "testlist01.txt:1: label 3",
    ),
    "train label missing": (
        lambda root, lists: _edit_line(
            lists / "trainlist01.txt", 4, "ApplyEyeMakeup/v_ApplyEyeMakeup_g04_c02.avi"
        ),
        "trainlist01.txt:4: expected",
    ),
    "listed twice": (
        lambda root, lists: _edit_line(
            lists / "trainlist01.txt", 2, "ApplyEyeMakeup/v_ApplyEyeMakeup_g03_c01.avi 1"
        ),
        "trainlist01.txt:2: ApplyEyeMakeup/v_ApplyEyeMakeup_g03_c01.avi is already listed on line 1",
    ),
    "train and test": (
        lambda root, lists: _edit_line(
            lists / "testlist01.txt", 1, "ApplyEyeMakeup/v_ApplyEyeMakeup_g03_c01.avi"
        ),
        "testlist01.txt:1: ApplyEyeMakeup/v_ApplyEyeMakeup_g03_c01.avi is also a training video",
    ),
    "classInd gap": (
        lambda root, lists: _edit_line(lists / "classInd.txt", 2, "5 ApplyLipstick"),
        "2 is missing",
    ),
    "classInd malformed": (
        lambda root, lists: _edit_line(lists / "classInd.txt", 3, "Archery"),
        "classInd.txt:3",
    ),
}


@pytest.mark.parametrize("case", list(UCF_ERRORS))
def test_ucf101_bad_lists_stop_with_file_and_line(ucf, tmp_path, case):
    """Missing files, unknown classes, out-of-range or disagreeing labels: ValueError naming file:line."""
    root = _copy(ucf, tmp_path)
    lists = root / "ucfTrainTestlist"
    first = (lists / "trainlist01.txt").read_text().splitlines()[:5]
    # The edits above assume this line order (fold 1 trains on groups 3-6), so they really change things.
    assert [line.split()[0].split("_", 2)[2] for line in first] == [
        "g03_c01.avi", "g03_c02.avi", "g04_c01.avi", "g04_c02.avi", "g05_c01.avi",
    ]  # fmt: skip
    assert ucf101_catalog(root, "train", 1, workers=1).num_classes == 3
    edit, fragment = UCF_ERRORS[case]
    edit(root, lists)
    with pytest.raises(ValueError) as info:
        ucf101_catalog(root, "train", 1)
    message = str(info.value)
    assert fragment in message and not isinstance(info.value, VideoError)
    assert "fix" in message or "--data-root" in message or "once" in message or "one side" in message


HMDB_ERRORS = {
    "missing split file": (
        lambda root, splits: os.remove(splits / "cartwheel_test_split2.txt"),
        "cartwheel_test_split2.txt (class folder 'cartwheel' needs one)",
    ),
    "unknown class": (
        lambda root, splits: (splits / "fly_test_split2.txt").write_text("a.avi 1\n"),
        "fly_test_split2.txt: names class 'fly', which has no folder",
    ),
    "flag out of range": (
        lambda root, splits: _edit_line(
            splits / "catch_test_split2.txt", 4, "clip03_catch_u_nm_np1_fr_med_3.avi 3"
        ),
        "catch_test_split2.txt:4: flag '3' is out of range",
    ),
    "malformed line": (
        lambda root, splits: _edit_line(splits / "brush_hair_test_split2.txt", 2, "just_a_name.avi"),
        "brush_hair_test_split2.txt:2: expected",
    ),
    "listed twice": (
        lambda root, splits: _edit_line(
            splits / "catch_test_split2.txt", 2, "clip00_catch_u_nm_np1_fr_med_0.avi 1"
        ),
        "catch_test_split2.txt:2: clip00_catch_u_nm_np1_fr_med_0.avi is already listed on line 1",
    ),
    "split folder cased differently": (
        lambda root, splits: os.rename(splits, root / "testtrainmulti_7030_splits"),
        "found 'testtrainmulti_7030_splits': rename it",
    ),
    "missing data root": (lambda root, splits: shutil.rmtree(root), "data root not found"),
}


@pytest.mark.parametrize("case", list(HMDB_ERRORS))
def test_hmdb51_bad_splits_stop_with_file_and_line(hmdb, tmp_path, case):
    """HMDB51: a missing split file, an unknown class, a bad flag or line: ValueError naming file:line."""
    root = _copy(hmdb, tmp_path)
    assert hmdb51_catalog(root, "train", 2).num_classes == 3
    edit, fragment = HMDB_ERRORS[case]
    edit(root, root / "testTrainMulti_7030_splits")
    with pytest.raises(ValueError) as info:
        hmdb51_catalog(root, "train", 2)
    assert fragment in str(info.value) and not isinstance(info.value, VideoError)


def test_catalog_arguments_are_checked(ucf, hmdb):
    """split and fold are validated with a message that lists the valid values."""
    for make, root in ((ucf101_catalog, ucf.root), (hmdb51_catalog, hmdb.root)):
        with pytest.raises(ValueError, match="split must be one of"):
            make(root, "val", 1)
        with pytest.raises(ValueError, match="fold must be one of"):
            make(root, "train", 4)
        with pytest.raises(ValueError, match="fold must be one of"):
            make(root, "train", 1.0)


def test_mini_ucf101_with_clip_colours_tells_classes_by_motion_only(tmp_path):
    """colours="clip": a clip's colour follows its group and clip number, never its class, so every class
    shows the same colours (bench/batch_rule.py's miniature set: a model must learn the motion)."""
    ds = make_mini_ucf101(tmp_path / "ucf", 4, 3, 2, colours="clip")
    colours: dict[int, set] = {}
    for rel, (label, _) in ds.videos.items():
        median = np.median(decode(ds.path(rel))[0].reshape(-1, 3), axis=0)
        nearest = min(range(6), key=lambda i: float(np.abs(median - class_colour(i)).sum()))
        colours.setdefault(label, set()).add(nearest)
    assert len(colours) == 4 and all(c == colours[0] for c in colours.values()) and len(colours[0]) >= 3
    with pytest.raises(ValueError, match="at most 4 classes"):
        make_mini_ucf101(tmp_path / "five", 5, colours="clip")
    with pytest.raises(ValueError, match="colours must be"):
        make_mini_ucf101(tmp_path / "bad", colours="label")
