"""Tests for raytrain_seq.data.flow (dense optical flow, quantised to uint8 the TSN way)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import cv2
import numpy as np
import pytest

from raytrain_seq.algorithms.augment import final_augment, resize_video
from raytrain_seq.data import flow as flow_module
from raytrain_seq.data.flow import (
    FLOW_BOUND,
    compute_flow,
    dequantize,
    flow_method,
    flow_window,
    quantize,
)

ROOT = Path(__file__).resolve().parents[1]
SIZE = 64
MARGIN = 8  # room around the SIZE window for the translations below


def _texture(h: int, w: int, *, seed: int = 0) -> np.ndarray:
    """Smooth random RGB texture, full 0..255 range: something flow can lock onto at every pixel."""
    noise = np.random.default_rng(seed).uniform(0, 255, (h, w, 3)).astype(np.float32)
    smooth = cv2.GaussianBlur(noise, (0, 0), 2.0)
    smooth = (smooth - smooth.min()) / (smooth.max() - smooth.min()) * 255.0
    return np.rint(smooth).astype(np.uint8)


def _window(image: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """The SIZE x SIZE view in which the image content appears moved by (dx, dy): +x right, +y down."""
    top, left = MARGIN - dy, MARGIN - dx
    return image[top : top + SIZE, left : left + SIZE]


def _moving_video() -> np.ndarray:
    """Three frames: the texture moves (+2, 0) px, then (0, -3) px (i.e. 3 px UP the image)."""
    image = _texture(SIZE + 2 * MARGIN, SIZE + 2 * MARGIN)
    return np.stack([_window(image, 0, 0), _window(image, 2, 0), _window(image, 2, -3)])


def _interior_median(flow: np.ndarray) -> tuple[float, float]:
    """Median (x, y) of one dequantised flow frame [H, W, 2] away from the borders."""
    inner = flow[16:-16, 16:-16]
    return float(np.median(inner[..., 0])), float(np.median(inner[..., 1]))


# ---------------------------------------------------------------- accuracy and conventions


def test_translation_gives_the_right_sign_and_magnitude():
    """A (+2, 0) then (0, -3) px translation gives median flow ~(+2, 0) then ~(0, -3): x right, y down."""
    video = _moving_video()
    # The construction really is OpenCV's convention prev[y, x] == next[y + fy, x + fx], on a textured,
    # moving video (so a zero flow could not pass).
    assert np.array_equal(video[0][10:50, 10:50], video[1][10:50, 12:52])  # fx = +2
    assert np.array_equal(video[1][10:50, 10:50], video[2][7:47, 10:50])  # fy = -3
    assert video[0].std() > 30 and not np.array_equal(video[0], video[1])
    flows = dequantize(compute_flow(video, method="farneback"))
    fx0, fy0 = _interior_median(flows[0])
    fx1, fy1 = _interior_median(flows[1])
    assert 1.6 < fx0 < 2.4 and abs(fy0) < 0.4, (fx0, fy0)
    assert abs(fx1) < 0.4 and -3.4 < fy1 < -2.6, (fx1, fy1)


def test_static_video_is_128_everywhere():
    """Identical textured frames give zero flow: every quantised value within one step of 128."""
    frame = _texture(SIZE, SIZE, seed=1)
    assert frame.std() > 30  # textured, so the flow solver has gradients to work with
    q = compute_flow(np.stack([frame] * 4), method="farneback")
    assert q.shape == (4, SIZE, SIZE, 2)
    assert np.abs(q.astype(int) - 128).max() <= 1


def test_last_flow_is_repeated_to_keep_the_rgb_length():
    """Frame t holds flow t -> t+1; the final frame repeats the previous flow, which is non-zero here."""
    q = compute_flow(_moving_video(), method="farneback")
    assert np.array_equal(q[2], q[1])
    assert not np.array_equal(q[1], q[0])  # the two motions differ, so the repeat is observable
    assert abs(_interior_median(dequantize(q[2]))[1] + 3.0) < 0.4


@pytest.mark.parametrize("t", [1, 2, 3, 4, 5])
def test_output_shape_dtype_and_length(t):
    """T frames of H x W (non-square) give uint8 [T, H, W, 2]; T = 1 gives one zero-flow (128) frame."""
    image = _texture(SIZE + 2 * MARGIN, SIZE + 2 * MARGIN, seed=t)
    video = np.stack([_window(image, k, 0)[:40, :56] for k in range(t)])
    q = compute_flow(video)
    assert q.shape == (t, 40, 56, 2) and q.dtype == np.uint8
    if t == 1:
        assert np.all(q == 128)
    else:
        assert np.array_equal(q[-1], q[-2])
        assert abs(_interior_median(dequantize(q[0])[:, 8:-8])[0] - 1.0) < 0.4  # moving 1 px per frame


def test_gray_input_matches_rgb_input_with_equal_channels():
    """A gray [T, H, W, 1] video gives exactly the flow of the same video as RGB with R = G = B."""
    gray = _moving_video()[..., :1]
    assert np.array_equal(
        compute_flow(gray, method="farneback"), compute_flow(np.repeat(gray, 3, axis=3), method="farneback")
    )


def test_flip_of_video_equals_x_negated_mirror_of_flow():
    """flow(flipped video) ~ final_augment(flow, flip, flow=True): the identity final_augment relies on."""
    video = _moving_video()
    q = compute_flow(video, method="farneback")
    flipped_video_flow = compute_flow(np.ascontiguousarray(video[:, :, ::-1]), method="farneback")
    # Full-frame crop, flip always: final_augment mirrors the columns and maps u -> 255 - u.
    augmented = final_augment(q, crop=SIZE, rng=np.random.default_rng(0), flip_prob=1.0, flow=True)
    diff = np.abs(flipped_video_flow.astype(int) - augmented.astype(int))
    assert diff.max() <= 2 and diff.mean() < 0.1, (diff.max(), diff.mean())
    # Without the x negation the two disagree badly: the test can tell the right flip from the naive one.
    naive = np.abs(flipped_video_flow.astype(int) - q[:, :, ::-1].astype(int))
    assert naive[..., 0].mean() > 5
    assert _interior_median(dequantize(flipped_video_flow[0]))[0] < -1.6  # right motion became left


# ---------------------------------------------------------------- quantisation


@pytest.mark.parametrize("bound", [1.0, FLOW_BOUND, 7.5])
def test_quantisation_round_trip_within_one_step(bound):
    """dequantize(quantize(f)) is within half a step (bound / 255) of f for f in [-bound, bound]."""
    f = np.random.default_rng(0).uniform(-bound, bound, 10_000).astype(np.float32)
    back = dequantize(quantize(f, bound), bound)
    step = 2.0 * bound / 255.0
    err = np.abs(back - f)
    assert err.max() <= step / 2 + 1e-5 * bound
    assert err.max() > 0.4 * step  # the quantisation is really lossy: the bound above is being tested


def test_quantisation_endpoints_and_zero():
    """-bound -> 0, +bound -> 255, 0 -> 128 (127.5 rounded half to even), linearly in between."""
    q = quantize(np.array([-FLOW_BOUND, 0.0, FLOW_BOUND, 10.0], dtype=np.float32))
    assert q.tolist() == [0, 128, 255, round(30 * 255 / 40)]
    assert dequantize(np.array([0, 255], dtype=np.uint8)).tolist() == [-FLOW_BOUND, FLOW_BOUND]


def test_clipping_at_plus_minus_bound():
    """Flow beyond +-bound saturates at 0 / 255 and dequantises to exactly -+bound."""
    f = np.array([-1e6, -25.0, -20.0, 20.0, 25.0, 1e6], dtype=np.float32)
    q = quantize(f, 20.0)
    assert q.tolist() == [0, 0, 0, 255, 255, 255]
    assert dequantize(q, 20.0).tolist() == [-20.0, -20.0, -20.0, 20.0, 20.0, 20.0]


def test_compute_flow_clips_a_motion_larger_than_the_bound():
    """A 2 px motion with bound 1 saturates x at 255 in the interior; with bound 20 it does not."""
    video = _moving_video()[:2]
    tight = compute_flow(video, method="farneback", bound=1.0)
    loose = compute_flow(video, method="farneback")
    assert np.median(tight[0, 16:-16, 16:-16, 0]) == 255
    assert 128 < np.median(loose[0, 16:-16, 16:-16, 0]) < 255


# ---------------------------------------------------------------- method selection


def test_method_name_is_reported_and_matches_opencv():
    """flow_method() says "tvl1" exactly when cv2.optflow has TV-L1, else "farneback"; auto uses it."""
    optflow = getattr(cv2, "optflow", None)
    has_tvl1 = optflow is not None and (
        hasattr(optflow, "DualTVL1OpticalFlow_create") or hasattr(optflow, "createOptFlow_DualTVL1")
    )
    assert flow_method() == ("tvl1" if has_tvl1 else "farneback")
    video = _moving_video()
    assert np.array_equal(compute_flow(video), compute_flow(video, method=flow_method()))


def test_tvl1_is_detected_and_used_when_contrib_is_present(monkeypatch):
    """With a cv2.optflow TV-L1 factory present, flow_method() is "tvl1" and compute_flow calls it."""
    calls = []

    class FakeTVL1:
        def calc(self, prev, nxt, flow):
            calls.append((prev.shape, nxt.shape))
            return np.full((*prev.shape, 2), (-5.0, 10.0), dtype=np.float32)

    fake = types.SimpleNamespace(DualTVL1OpticalFlow_create=FakeTVL1)
    monkeypatch.setattr(cv2, "optflow", fake, raising=False)
    flow_method.cache_clear()
    try:
        assert flow_method() == "tvl1"
        q = compute_flow(_moving_video())
    finally:
        monkeypatch.undo()
        flow_method.cache_clear()
    assert calls == [((SIZE, SIZE), (SIZE, SIZE))] * 2  # gray frames, one call per consecutive pair
    assert np.all(q[..., 0] == quantize(np.float32(-5.0))) and np.all(q[..., 1] == quantize(np.float32(10.0)))


def test_flow_method_is_checked_lazily_and_cached():
    """Importing the module loads no OpenCV; flow_method() is computed once and then cached."""
    code = (
        "import sys, json\n"
        "import raytrain_seq.data.flow as f\n"
        "before = 'cv2' in sys.modules\n"
        "f.flow_method(); f.flow_method()\n"
        "print(json.dumps({'cv2_at_import': before, 'misses': f.flow_method.cache_info().misses}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"cv2_at_import": False, "misses": 1}


@pytest.mark.skipif(flow_module.tvl1_factory() is not None, reason="opencv-contrib is installed")
def test_tvl1_without_contrib_names_the_fix():
    """Asking for TV-L1 without opencv-contrib raises a ValueError that names the package to install."""
    with pytest.raises(ValueError, match="opencv-contrib-python-headless"):
        compute_flow(_moving_video(), method="tvl1")


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("frames", "error", "match"),
    [
        ([[[[0, 0, 0]]]], TypeError, "numpy uint8 array"),
        (np.zeros((4, 8, 8), np.uint8), ValueError, r"frames\[\.\.\., None\]"),
        (np.zeros((4, 8, 8, 2), np.uint8), ValueError, r"\[T, H, W, 3\]"),
        (np.zeros((4, 8, 8, 3), np.float32), ValueError, "astype"),
        (np.zeros((0, 8, 8, 3), np.uint8), ValueError, "at least one frame"),
        (np.zeros((2, 0, 8, 3), np.uint8), ValueError, "drop empty videos"),
    ],
)
def test_bad_frames_raise_errors_naming_the_fix(frames, error, match):
    """Wrong container, rank, channels, dtype or an empty axis raise with a message naming the fix."""
    with pytest.raises(error, match=match):
        compute_flow(frames)


@pytest.mark.parametrize(
    ("bound", "error"), [(0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), (True, TypeError)]
)
def test_bad_bound_is_rejected(bound, error):
    """bound must be a finite positive number; compute_flow, quantize and dequantize all check it."""
    video = np.zeros((2, 8, 8, 3), np.uint8)
    with pytest.raises(error, match="bound must be"):
        compute_flow(video, bound=bound)
    with pytest.raises(error, match="bound must be"):
        quantize(np.zeros(3, np.float32), bound)
    with pytest.raises(error, match="bound must be"):
        dequantize(np.zeros(3, np.uint8), bound)


def test_bad_method_and_bad_quantiser_inputs_raise():
    """An unknown method, non-finite flow, or non-uint8 input to dequantize raise ValueErrors."""
    with pytest.raises(ValueError, match="method must be one of"):
        compute_flow(np.zeros((2, 8, 8, 3), np.uint8), method="tv-l1")
    with pytest.raises(ValueError, match="NaN"):
        quantize(np.array([0.0, np.nan], np.float32))
    with pytest.raises(ValueError, match="output of compute_flow"):
        dequantize(np.zeros(3, np.float32))


def test_rgb_frames_are_reduced_to_luma_in_rgb_order():
    """Frames are RGB (not OpenCV's BGR): gray = 0.299 R + 0.587 G + 0.114 B, within rounding."""
    video = np.random.default_rng(3).integers(0, 256, (2, 8, 8, 3)).astype(np.uint8)
    video[..., 0], video[..., 2] = 250, 5  # red-heavy: RGB and BGR weights give very different luma
    reference = video.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    gray = flow_module.to_gray(video).astype(np.float64)
    assert np.abs(gray - reference).max() <= 1.0
    assert np.abs(video.astype(np.float64) @ np.array([0.114, 0.587, 0.299]) - reference).min() > 40


# ------------------------------------------------------------------------------- the flow-once window


@pytest.mark.parametrize("shape", [(3, 20, 27, 2), (3, 27, 20, 2), (2, 20, 20, 2)])
@pytest.mark.parametrize("offset", [0.0, 0.37, 0.5, 1.0, None])
def test_flow_window_cuts_the_pixels_resize_video_would(shape, offset):
    """flow_window(flow, 20, offset) equals resize_video(flow, 20, offset) on flow whose short side is 20
    (there resize_video only slices), so the stored flow's window sits where the frames' window did."""
    flow = np.random.default_rng(7).integers(0, 256, shape).astype(np.uint8)
    window = flow_window(flow, 20, offset)
    assert window.shape == (shape[0], 20, 20, 2) and window.dtype == np.uint8
    assert np.array_equal(window, resize_video(flow, 20, offset))
    long = max(shape[1:3])
    start = round((0.5 if offset is None else offset) * (long - 20))
    expect = flow[:, :, start : start + 20] if shape[2] == long else flow[:, start : start + 20]
    assert np.array_equal(window, expect)
    window[...] = 0  # a copy: the stored flow is shared by every later window and must not change
    assert flow.any()


def test_flow_window_refuses_resampling_and_bad_inputs():
    """A short side other than size would need resampling (and scaled vectors): refused, like bad input."""
    flow = np.zeros((2, 24, 32, 2), np.uint8)
    with pytest.raises(ValueError, match="short side is 20"):
        flow_window(flow, 20, 0.5)
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 2\]"):
        flow_window(np.zeros((2, 20, 26, 3), np.uint8), 20)
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 2\]"):
        flow_window(np.zeros((2, 20, 26, 2), np.float32), 20)
    with pytest.raises(ValueError, match="offset must be in"):
        flow_window(np.zeros((2, 20, 26, 2), np.uint8), 20, 1.5)
    with pytest.raises(ValueError, match="size must be"):
        flow_window(np.zeros((2, 20, 26, 2), np.uint8), 0)
