"""Decoder backends (``data.decoders``): each installed one keeps the frames PyAV keeps, with pixels close to
PyAV's, and the package runs where PyAV is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from video_fixtures import (
    clip_frames,
    frame_indices,
    make_mini_ucf101,
    plant_corrupt,
    ramp_frames,
    write_video,
)

from raytrain_seq.config import Config
from raytrain_seq.data import decoders
from raytrain_seq.data.video import VideoError, decode, decode_pairs, output_length, probe

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = [
    pytest.param(name, marks=pytest.mark.skipif(not decoders.available(name), reason=f"{name} not installed"))
    for name in decoders.BACKENDS
]
# Mean absolute difference of uint8 pixels from PyAV's: each backend converts YUV to RGB and scales in its
# own code (rounding, chroma siting), so frames differ by a few levels, never by content.
PIXEL_TOLERANCE = 3.0
N = 13  # ramp length: frame i is grey 8 + 12 i


@pytest.fixture(scope="module")
def ramps(tmp_path_factory) -> dict[str, Path]:
    """The 13-frame ramp as MPEG-4 .avi, H.264 .mp4 (a counted header) and H.264 .mkv (no frame count)."""
    folder = tmp_path_factory.mktemp("ramps")
    codecs = {"avi": "mpeg4", "mp4": "libx264", "mkv": "libx264"}
    return {ext: write_video(folder / f"ramp.{ext}", ramp_frames(N), codec=c) for ext, c in codecs.items()}


@pytest.fixture(scope="module")
def moving(tmp_path_factory) -> Path:
    """A 10-frame clip with detail (a white square moving over a colour) for the pixel comparison."""
    return write_video(tmp_path_factory.mktemp("moving") / "moving.avi", clip_frames(3, 10))


def _floor_rule(n: int, fps: float, src: float) -> list[int]:
    """Kept indices by the resampling rule, by brute force: frame i when floor(i * fps / src) increases."""
    steps = [int(np.floor(i * fps / src + 1e-9)) for i in range(n)]
    return [i for i in range(n) if i == 0 or steps[i] > steps[i - 1]]


@pytest.mark.parametrize("name", INSTALLED)
@pytest.mark.parametrize("ext", ["avi", "mp4", "mkv"])
def test_kept_indices_and_counts_are_the_rules_for_every_backend(name, ext, ramps):
    """Stride and fps keep the same source frames, as many as output_length predicts, with every backend."""
    path = ramps[ext]
    info = probe(path, decoder=name)
    assert (info.frames, info.fps, info.width, info.height) == (N, 25.0, 32, 24)
    assert info.source == ("decode" if ext == "mkv" else "container")  # Matroska stores no count
    for stride in (1, 3, 5, 13, 20):
        got = frame_indices(decode(path, stride=stride, decoder=name))
        assert got == list(range(0, N, stride)), (stride, got)
        assert len(got) == output_length(N, stride=stride)
    for fps in (10.0, 7.5, 25.0, 60.0):
        got = frame_indices(decode(path, fps=fps, decoder=name))
        assert got == _floor_rule(N, min(fps, 25.0), 25.0), (fps, got)
        assert len(got) == output_length(N, fps=fps, src_fps=25.0)
    assert frame_indices(decode(path, stride=2, max_frames=3, decoder=name)) == [0, 2, 4]


@pytest.mark.parametrize("name", INSTALLED)
def test_pairs_are_each_kept_frame_and_its_successor(name, ramps):
    """decode_pairs: 13 frames at stride 5 keep 0, 5, 10, paired with 1, 6, 11; stride 4 ends on frame 12,
    the last, which has no successor (last False, second[-1] is the frame itself)."""
    first, second, last = decode_pairs(ramps["avi"], stride=5, decoder=name)
    assert (frame_indices(first), frame_indices(second), last) == ([0, 5, 10], [1, 6, 11], True)
    first, second, last = decode_pairs(ramps["mp4"], stride=4, size=12, decoder=name)
    assert (frame_indices(first), frame_indices(second), last) == ([0, 4, 8, 12], [1, 5, 9, 12], False)
    assert first.shape == second.shape == (4, 12, 16, 3)


@pytest.mark.parametrize("name", INSTALLED)
def test_short_side_resize_shapes(name, ramps):
    """size=k scales the short side to k (32x24 at 12 -> 16x12, at 48 -> 64x48); (h, w) is exact."""
    assert decode(ramps["avi"], stride=4, size=12, decoder=name).shape == (4, 12, 16, 3)
    assert decode(ramps["mp4"], stride=4, size=48, decoder=name).shape == (4, 48, 64, 3)
    assert decode(ramps["avi"], stride=13, size=(10, 20), decoder=name).shape == (1, 10, 20, 3)
    full = decode(ramps["avi"], stride=13, decoder=name)
    assert full.dtype == np.uint8 and full.shape == (1, 24, 32, 3)


@pytest.mark.parametrize("name", INSTALLED)
@pytest.mark.parametrize("size", [None, 12, 48])
def test_pixels_are_close_to_pyavs(name, size, moving):
    """RGB order and values agree with PyAV's within PIXEL_TOLERANCE (mean absolute difference), scaled
    (area averaging) or not."""
    if not decoders.available("pyav"):
        pytest.skip("PyAV, the reference, is not installed")
    reference = decode(moving, size=size, decoder="pyav").astype(np.int16)
    got = decode(moving, size=size, decoder=name).astype(np.int16)
    assert got.shape == reference.shape
    assert np.abs(got - reference).mean() <= PIXEL_TOLERANCE
    colour = np.median(got.reshape(-1, 3), axis=0)
    assert np.abs(colour - np.median(reference.reshape(-1, 3), axis=0)).max() <= 8  # red stays red


@pytest.mark.parametrize("name", INSTALLED)
def test_bad_files_raise_video_error_naming_the_path(name, tmp_path):
    """Missing, not a video and corrupt: VideoError with the path, from probe and decode alike."""
    text = tmp_path / "notes.avi"
    text.write_text("not a video at all\n" * 50)
    corrupt = tmp_path / "corrupt.avi"
    write_video(corrupt, ramp_frames(5))
    plant_corrupt(corrupt)
    for path, why in ((tmp_path / "missing.avi", "file not found"), (text, None), (corrupt, None)):
        for call in (lambda p: probe(p, decoder=name), lambda p: decode(p, decoder=name)):
            with pytest.raises(VideoError, match=why) as caught:
                call(path)
            assert caught.value.path == str(path) and str(path) in str(caught.value)


def test_auto_is_the_first_installed_backend_of_the_measured_order(monkeypatch):
    """auto -> the first of PREFERENCE that imports; an explicit missing backend names its pip install."""
    assert set(decoders.PREFERENCE) == set(decoders.BACKENDS)
    assert decoders.resolve("auto") == decoders.installed()[0]
    monkeypatch.setattr(decoders, "available", lambda name: name == "pyav")
    assert decoders.resolve("auto") == "pyav"
    with pytest.raises(
        ImportError, match=r"data.decoder='decord'.*pip install decord==0\.6\.0.*--decoder auto"
    ):
        decoders.resolve("decord")
    monkeypatch.setattr(decoders, "available", lambda name: False)
    with pytest.raises(ImportError, match=r"found no video decoder here: install one, e\.g\. pip install"):
        decoders.resolve("auto")


def test_config_refuses_an_unknown_decoder_and_the_preflight_a_missing_one(monkeypatch, tmp_path):
    """data.decoder is one of DECODERS (the message names the field, the value and the choices); a
    backend that is not installed is a RunSetupError from the preflight, before any video is opened."""
    from raytrain_seq.config import RunSetupError
    from raytrain_seq.preflight import check_paths

    with pytest.raises(
        ValueError, match=r"data\.decoder must be one of 'auto', 'pyav', 'opencv', 'decord', got 'ffmpeg'"
    ):
        Config.from_dict({"data": {"decoder": "ffmpeg"}})
    assert Config().data.decoder == "auto"
    ds = make_mini_ucf101(tmp_path, classes=2, groups=3, clips=1)
    config = Config.from_dict({"data": {"dataset": "ucf101", "data_root": str(ds.root), "decoder": "decord"}})
    monkeypatch.setattr(decoders, "available", lambda name: name != "decord")
    with pytest.raises(RunSetupError, match="decord does not import here: pip install decord"):
        check_paths(config)


NO_PYAV = textwrap.dedent(
    """\
    import json, sys
    sys.modules["av"] = None  # import av raises ImportError, as where PyAV is not installed
    from raytrain_seq.data import decoders
    from raytrain_seq.data.sources import get_source, source_kwargs
    from raytrain_seq.config import Config
    from raytrain_seq.data.video import decode

    config = Config.from_dict({"data": {"dataset": "ucf101", "data_root": sys.argv[1], "stride": 2,
                                        "decoder": sys.argv[2], "val_fraction": 0.3}})
    kwargs = source_kwargs(config.data)
    source = get_source(kwargs)
    catalogs = source.catalogs()["catalogs"]
    train = catalogs["train"]
    video = int(train.ids[0])
    frames, report = source.load(video, 0, 0, 16)
    try:
        decoders.resolve("pyav")
        pyav = "resolved"
    except ImportError as exc:
        pyav = str(exc)
    print(json.dumps({
        "decoder": dict(kwargs)["decoder"], "videos": len(train), "shape": list(frames.shape),
        "length": int(train.lengths[0]), "report": report, "pyav": pyav,
        "plain": list(decode(sys.argv[3], stride=3).shape), "av_loaded": sys.modules.get("av") is not None,
    }))
    """
)


@pytest.mark.skipif(not decoders.available("opencv"), reason="opencv not installed")
@pytest.mark.parametrize("decoder", ["opencv", "auto"])
def test_the_package_runs_without_pyav(decoder, tmp_path, ramps):
    """With ``av`` not importable, a catalog is built and a clip decoded and augmented with OpenCV (auto
    resolves to it), and asking for pyav names its pip install."""
    ds = make_mini_ucf101(tmp_path / "ucf", classes=2, groups=3, clips=2)
    out = subprocess.run(
        [sys.executable, "-c", NO_PYAV, str(ds.root), decoder, str(ramps["avi"])],
        capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["decoder"] == "opencv" and result["videos"] >= 2 and not result["av_loaded"]
    assert result["shape"] == [result["length"], 16, 16, 3] and not {"failed", "refit"} & set(
        result["report"]
    )
    assert "pip install av" in result["pyav"] and result["plain"] == [5, 24, 32, 3]


def test_bench_measure_rows(ramps):
    """bench/decoder_rates.measure: one row per (backend, codec, stride) with the documented keys."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import decoder_rates
    finally:
        sys.path.remove(str(ROOT / "bench"))
    rows = decoder_rates.measure([ramps["avi"], ramps["mp4"]], strides=(1, 4), size=16, repeats=1)
    assert len(rows) == len(decoders.installed()) * 2 * 2
    for row in rows:
        assert set(decoder_rates.KEYS) <= set(row)
        assert row["kept_frames"] == output_length(N, stride=row["stride"]) and row["cpu_s"] >= 0
    assert {r["backend"] for r in rows} == set(decoders.installed())
    assert "| backend |" in decoder_rates.table(rows)


# ------------------------------------------------------------------- PyAV's skipping of non-reference frames
def _h264(path: Path, frames: np.ndarray, pts: list[int] | None = None) -> Path:
    """H.264 .mp4 at 25 fps with 3 B-frames between references, always (b-adapt=0), the middle one a
    reference (b-pyramid): frames no other frame references are there to skip. ``pts``: in 1/25 s."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.options = {"x264-params": "bframes=3:b-adapt=0:b-pyramid=normal", "threads": "1"}
        for index, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = (index if pts is None else pts[index]), Fraction(1, 25)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


@pytest.fixture
def decoded_counts(monkeypatch) -> list[tuple[bool, int]]:
    """(skipping, frames the decoder gave) of each PyAV reader closed while the test runs."""
    counts: list[tuple[bool, int]] = []
    close = decoders._PyAVReader.close

    def recording(reader):
        counts.append((reader.index is not None, reader.decoded))
        close(reader)

    monkeypatch.setattr(decoders._PyAVReader, "close", recording)
    return counts


SELECTIONS = [{"stride": 1}, {"stride": 3}, {"stride": 8}, {"fps": 10.0}]


@pytest.mark.skipif(not decoders.available("pyav"), reason="pyav not installed")
def test_skipping_decode_is_the_full_decodes_kept_frames(tmp_path, decoded_counts):
    """On H.264 with B-frames, the kept frames are byte for byte those of a decode of every frame, as many
    as output_length says, while frames nothing references were not decoded at all (fewer than 40)."""
    path = _h264(tmp_path / "b.mp4", clip_frames(1, 40, height=48, width=64))
    for selection in SELECTIONS:
        stride, fps = selection.get("stride", 1), selection.get("fps")
        decoded_counts.clear()
        got, info = decoders.frames_of(
            "pyav", str(path), stride=stride, fps=fps, size=None, max_frames=None, threads=1
        )
        [(skipping, decoded)] = decoded_counts
        full, full_info = decoders._kept("pyav", str(path), stride, fps, None, None, 1, skipping=False)
        assert len(got) == len(full) == output_length(40, stride=stride, fps=fps, src_fps=25.0)
        assert info == full_info and info.frames == 40
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, full, strict=True)), selection
        assert (skipping, decoded < 40) == ((True, True) if selection != {"stride": 1} else (False, False))
    pairs = decoders.pairs_of("pyav", str(path), stride=8, fps=None, size=16, threads=0)  # frame threads
    full = decoders._pairs("pyav", str(path), 8, None, 16, 0, skipping=False)
    assert [np.stack(p).tobytes() for p in pairs[:2]] == [np.stack(p).tobytes() for p in full[:2]]
    assert pairs[2:] == full[2:] and decoded_counts[-2][0] and decoded_counts[-2][1] < 40


@pytest.mark.skipif(not decoders.available("pyav"), reason="pyav not installed")
def test_skipping_falls_back_to_the_full_decode_where_pts_are_not_certain(
    tmp_path, decoded_counts, monkeypatch
):
    """A variable frame rate (a gap in the pts) decodes every frame; so does a pts -> index map that turns
    out wrong (frames come out of its order): the decode starts again in full. Same frames either way."""
    frames = clip_frames(2, 40, height=48, width=64)
    gap = _h264(tmp_path / "gap.mp4", frames, pts=[i + (i >= 20) for i in range(40)])
    full, _ = decoders._kept("pyav", str(gap), 8, None, None, None, 1, skipping=False)
    decoded_counts.clear()
    got, _ = decoders.frames_of("pyav", str(gap), stride=8, fps=None, size=None, max_frames=None, threads=1)
    assert decoded_counts == [(False, 40)] and len(got) == len(full) == output_length(40, stride=8)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, full, strict=True))

    path = _h264(tmp_path / "b.mp4", frames)
    full, _ = decoders._kept("pyav", str(path), 8, None, None, None, 1, skipping=False)
    honest = decoders._presentation_index
    monkeypatch.setattr(  # ranks reversed: the first frame out claims to be the last
        decoders, "_presentation_index", lambda *a: {t: 39 - i for t, i in honest(*a).items()}
    )
    decoded_counts.clear()
    got, _ = decoders.frames_of("pyav", str(path), stride=8, fps=None, size=None, max_frames=None, threads=1)
    assert [skipping for skipping, _ in decoded_counts] == [True, False] and decoded_counts[1][1] == 40
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, full, strict=True))


@pytest.mark.skipif(not decoders.available("pyav"), reason="pyav not installed")
@pytest.mark.parametrize("threads", [1, 0])
def test_pyav_frames_are_the_per_frame_conversions_of_a_full_decode(tmp_path, threads):
    """One scaler for the whole video, on the reader's threads, gives each kept frame the bytes of
    PyAV's own per-frame ``to_ndarray(rgb24, AREA)`` of a plain decode of every frame."""
    import av

    path = _h264(tmp_path / "b.mp4", clip_frames(3, 40, height=48, width=64))
    got, _ = decoders.frames_of(
        "pyav", str(path), stride=3, fps=None, size=20, max_frames=None, threads=threads
    )
    with av.open(str(path)) as container:
        every = list(container.decode(container.streams.video[0]))
    width, height = decoders.target_size(64, 48, 20)
    want = [
        f.to_ndarray(format="rgb24", width=width, height=height, interpolation="AREA") for f in every[::3]
    ]
    assert len(got) == len(want) == 14 and got[0].shape == (20, 27, 3)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want, strict=True))
