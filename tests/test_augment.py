"""Tests for raytrain_seq.algorithms.augment (the Revamper split: partial, cached; final, per use)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raytrain_seq.algorithms.augment import (
    center_crop,
    final_augment,
    partial_augment,
    resize_video,
    stride_frames,
)
from raytrain_seq.data.lengths import strided


def _video(t: int, h: int, w: int, c: int = 3, *, seed: int = 0, lo: int = 0, hi: int = 256) -> np.ndarray:
    return np.random.default_rng(seed).integers(lo, hi, size=(t, h, w, c)).astype(np.uint8)


# ---------------------------------------------------------------- resize


@pytest.mark.parametrize(("h", "w", "size"), [(240, 320, 36), (32, 32, 36), (31, 17, 9), (36, 36, 36)])
def test_resize_keeps_a_constant_image_constant(h, w, size):
    """Resizing (down, up, odd, identity) maps a constant image to the same constant, exactly."""
    frames = np.full((2, h, w, 3), 173, dtype=np.uint8)
    out = resize_video(frames, size)
    assert out.shape == (2, size, size, 3) and out.dtype == np.uint8
    assert np.all(out == 173)


def test_resize_maps_a_linear_ramp_to_the_ramp_at_output_centres():
    """Away from the borders, a linear image is resampled exactly at the output pixel centres."""
    yy, xx = np.mgrid[0:64, 0:64]
    ramp = np.repeat((xx + yy + 20)[None, :, :, None], 3, axis=3).astype(np.uint8)
    down = resize_video(ramp, 32)[0, :, :, 0].astype(int)
    # Output pixel j of 64 -> 32 is centred on input coordinate (j + 0.5) * 2 - 0.5 = 2j + 0.5.
    i, j = np.mgrid[1:31, 1:31]
    assert np.array_equal(down[1:31, 1:31], (2 * i + 0.5) + (2 * j + 0.5) + 20)
    small = np.repeat((4 * xx[:16, :16] + 4 * yy[:16, :16] + 10)[None, :, :, None], 3, axis=3).astype(
        np.uint8
    )
    up = resize_video(small, 32)[0, :, :, 0].astype(int)
    # 16 -> 32: output j is centred on (j + 0.5) / 2 - 0.5 = j / 2 - 0.25, so 4x -> 2j - 1 (and 4y -> 2i - 1).
    assert np.array_equal(up[1:31, 1:31], (2 * j - 1) + (2 * i - 1) + 10)
    assert up[0, 0] == small[0, 0, 0, 0]  # edges clamp instead of fading to black


@pytest.mark.parametrize(("h", "w", "size"), [(240, 320, 36), (32, 32, 36), (48, 40, 36), (13, 13, 29)])
def test_resize_matches_torch_antialiased_bilinear(h, w, size):
    """resize_video equals torch interpolate(bilinear, antialias=True) then a centre crop, within rounding."""
    frames = _video(3, h, w, seed=h + w)
    out_h, out_w = (
        (size, max(size, round(w * size / h))) if h <= w else (max(size, round(h * size / w)), size)
    )
    ref = F.interpolate(
        torch.from_numpy(frames).permute(0, 3, 1, 2).double(),
        size=(out_h, out_w),
        mode="bilinear",
        antialias=True,
        align_corners=False,
    )
    ref = ref.permute(0, 2, 3, 1).numpy()
    top, left = round(0.5 * (out_h - size)), round(0.5 * (out_w - size))
    ref = np.clip(np.rint(ref[:, top : top + size, left : left + size]), 0, 255)
    assert np.abs(resize_video(frames, size).astype(int) - ref).max() <= 1


# ---------------------------------------------------------------- partial augmentation


def test_partial_augment_shapes_dtype_and_determinism():
    """partial_augment returns uint8 [T, size, size, C] for RGB and gray; the same rng seed repeats it."""
    frames = _video(5, 30, 40)
    out = partial_augment(frames, size=36, rng=np.random.default_rng(1))
    assert out.shape == (5, 36, 36, 3) and out.dtype == np.uint8
    assert np.array_equal(out, partial_augment(frames, size=36, rng=np.random.default_rng(1)))
    assert not np.array_equal(out, partial_augment(frames, size=36, rng=np.random.default_rng(2)))
    gray = partial_augment(frames[..., :1], size=20, rng=np.random.default_rng(1), extra_ops=2)
    assert gray.shape == (5, 20, 20, 1) and gray.dtype == np.uint8


def test_partial_augment_applies_one_colour_transform_to_all_frames():
    """The photometric transform is one affine colour map for the whole video (least-squares fit over all
    frames leaves only rounding), whereas a per-frame draw would not fit."""
    frames = _video(6, 36, 36, seed=5, lo=70, hi=180)  # mid-range values: almost nothing clips
    out = partial_augment(frames, size=36, rng=np.random.default_rng(3))
    design = np.concatenate([frames.reshape(-1, 3).astype(float), np.ones((frames[..., 0].size, 1))], axis=1)

    def joint_fit_residual(result: np.ndarray) -> float:
        target = result.reshape(-1, 3).astype(float)
        keep = ((target > 0) & (target < 255)).all(axis=1)  # clipped pixels are not affine
        assert keep.mean() > 0.99
        coef, *_ = np.linalg.lstsq(design[keep], target[keep], rcond=None)
        return float(np.abs(design[keep] @ coef - target[keep]).max())

    assert joint_fit_residual(out) <= 1.0
    assert np.abs(out.astype(int) - frames).mean() > 2  # the transform is not the identity
    per_frame = np.stack(
        [
            partial_augment(f[None], size=36, rng=np.random.default_rng(10 + k))[0]
            for k, f in enumerate(frames)
        ]
    )
    assert joint_fit_residual(per_frame) > 5  # the check above can fail


def test_partial_augment_keeps_temporal_evidence():
    """Resize, warps and colour are the same for all frames: a static video stays static and a uniform
    brightening over time stays spatially uniform (frame t minus frame 0 is constant over pixels)."""
    base = _video(1, 48, 64, seed=9, lo=60, hi=150)
    static = np.repeat(base, 4, axis=0)
    out = partial_augment(static, size=36, rng=np.random.default_rng(4), extra_ops=3)
    assert all(np.array_equal(out[0], out[k]) for k in range(4))
    ramp = np.concatenate([base + np.uint8(12 * k) for k in range(4)])
    out = partial_augment(ramp, size=36, rng=np.random.default_rng(4), extra_ops=3).astype(int)
    for k in range(1, 4):
        delta = out[k] - out[0]
        assert delta.max() - delta.min() <= 2 and abs(delta.mean()) > 5
    # extra_ops really warps: the result differs from the same draw without extra ops.
    no_ops = partial_augment(ramp, size=36, rng=np.random.default_rng(4)).astype(int)
    assert np.abs(no_ops - out).mean() > 1


@pytest.mark.parametrize(
    ("frames", "kwargs", "error", "fragment"),
    [
        (np.zeros((4, 8, 8, 3), np.float32), {}, ValueError, "astype"),
        (np.zeros((8, 8, 3), np.uint8), {}, ValueError, "image[None]"),
        ([[1]], {}, TypeError, "numpy uint8 array"),
        (np.zeros((4, 8, 8, 2), np.uint8), {}, ValueError, "optical-flow"),
        (np.zeros((4, 8, 8, 3), np.uint8), {"rng": None}, TypeError, "default_rng"),
        (np.zeros((4, 8, 8, 3), np.uint8), {"size": 0}, ValueError, "size must be >= 1"),
        (np.zeros((4, 8, 8, 3), np.uint8), {"extra_ops": -1}, ValueError, "extra_ops must be >= 0"),
    ],
)
def test_partial_augment_validates_input(frames, kwargs, error, fragment):
    """Bad frames or arguments raise with a message naming the fix."""
    args = {"size": 6, "rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(error, match=re.escape(fragment)):
        partial_augment(frames, **args)


# ---------------------------------------------------------------- final augmentation


def _find_window(out_frame: np.ndarray, frame: np.ndarray, crop: int) -> list[tuple[int, int, bool]]:
    h, w = frame.shape[:2]
    hits = []
    for top in range(h - crop + 1):
        for left in range(w - crop + 1):
            window = frame[top : top + crop, left : left + crop]
            for flip in (False, True):
                if np.array_equal(window[:, ::-1] if flip else window, out_frame):
                    hits.append((top, left, flip))
    return hits


def test_final_augment_uses_one_crop_and_flip_for_all_frames():
    """Every frame of a sequence gets the same crop window and the same flip; over seeds both vary."""
    frames = _video(5, 36, 36, seed=11)
    seen = set()
    for seed in range(40):
        out = final_augment(frames, crop=32, rng=np.random.default_rng(seed))
        assert out.shape == (5, 32, 32, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
        hits = _find_window(out[0], frames[0], 32)
        assert len(hits) == 1
        top, left, flip = hits[0]
        for k in range(5):
            window = frames[k, top : top + 32, left : left + 32]
            assert np.array_equal(out[k], window[:, ::-1] if flip else window)
        seen.add(hits[0])
    assert {flip for _, _, flip in seen} == {False, True} and len({(top, left) for top, left, _ in seen}) > 10
    assert final_augment(frames, crop=36, rng=np.random.default_rng(0), flip_prob=0.0).base is None
    assert np.array_equal(final_augment(frames, crop=36, rng=np.random.default_rng(0), flip_prob=0.0), frames)


def test_final_augment_flips_flow_by_negating_x():
    """A flipped flow stack (C=2, 127.5 = zero) has its x component negated: u -> 255 - u."""
    flow = _video(3, 10, 10, c=2, seed=2)
    out = final_augment(flow, crop=10, rng=np.random.default_rng(0), flip_prob=1.0, flow=True)
    assert np.array_equal(out[..., 0], 255 - flow[:, :, ::-1, 0])
    assert np.array_equal(out[..., 1], flow[:, :, ::-1, 1])
    with pytest.raises(ValueError, match="flow=False for images"):
        final_augment(_video(3, 10, 10), crop=8, rng=np.random.default_rng(0), flow=True)


def test_final_augment_validates_input():
    """crop larger than the frame, a bad flip_prob or a missing Generator raise naming the fix."""
    frames = _video(2, 36, 36)
    with pytest.raises(ValueError, match="partial_augment to a size >= crop"):
        final_augment(frames, crop=37, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="flip_prob must be in"):
        final_augment(frames, crop=32, rng=np.random.default_rng(0), flip_prob=1.5)
    with pytest.raises(TypeError, match="default_rng"):
        final_augment(frames, crop=32, rng=np.random.RandomState(0))
    with pytest.raises(ValueError, match="must be uint8"):
        final_augment(frames.astype(np.int16), crop=32, rng=np.random.default_rng(0))


# ---------------------------------------------------------------- evaluation path and stride


def test_center_crop_and_resize_video_are_deterministic():
    """The evaluation path is deterministic: resize_video then center_crop takes the centred window."""
    frames = _video(2, 40, 40, seed=4)
    assert np.array_equal(center_crop(frames, 32), frames[:, 4:36, 4:36])
    wide = _video(2, 30, 60, seed=5)
    assert np.array_equal(resize_video(wide, 30), wide[:, :, 15:45])  # same height: only the centre crop
    with pytest.raises(ValueError, match="resize_video to a size >= crop"):
        center_crop(frames, 41)


def test_stride_frames_matches_strided_lengths():
    """stride_frames keeps frames 0, s, 2s, ...: exactly strided(T, s) of them."""
    for t in range(1, 30):
        frames = np.arange(t)[:, None, None, None].astype(np.uint8)
        for s in (1, 2, 3, 8):
            out = stride_frames(frames, s)
            assert len(out) == strided([t], s)[0]
            assert out[:, 0, 0, 0].tolist() == list(range(0, t, s))
    with pytest.raises(ValueError, match="stride must be >= 1"):
        stride_frames(np.zeros((4, 2, 2, 3), np.uint8), 0)


def _float_partial_reference(frames: np.ndarray, size: int, seed: int) -> np.ndarray:
    """The colour transform of partial_augment computed in float64 from the same draws, rounded once."""
    from raytrain_seq.algorithms.augment import _LUMA, _photometric_matrix, _window

    rng = np.random.default_rng(seed)
    offset = float(rng.uniform(0.0, 1.0))
    _, h, w, c = frames.shape
    _, _, top, left = _window(h, w, size, offset)
    window = frames[:, top : top + size, left : left + size].astype(np.float64)
    matrix, brightness, contrast = _photometric_matrix(rng, c)
    pixels = window.reshape(-1, c)
    mean = float(pixels.mean()) if c == 1 else float((pixels @ _LUMA).mean())
    out = pixels @ (brightness * contrast * matrix).T + brightness * mean * (1.0 - contrast)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8).reshape(window.shape)


@pytest.mark.parametrize("channels", [3, 1])
def test_partial_augment_at_the_cache_size_is_the_float_transform_within_one_level(channels):
    """Frames whose short side is already the cache size (a decode at that size, the synthetic render)
    take the uint8 path (a window slice and one affine colour map): it equals the float64 arithmetic of
    the same draws to within one grey level (OpenCV rounds its float32 sums), and most pixels exactly."""
    rng = np.random.default_rng(7)
    frames = rng.integers(0, 256, (5, 20, 27, channels), dtype=np.uint8)
    for seed in range(4):
        got = partial_augment(frames, size=20, rng=np.random.default_rng(seed)).astype(int)
        expect = _float_partial_reference(frames, 20, seed).astype(int)
        assert got.shape == (5, 20, 20, channels)
        assert np.abs(got - expect).max() <= 1 and (got == expect).mean() > 0.9


def test_rand_augment_is_one_seeded_draw_for_the_whole_video():
    """torchvision's RandAugment through rand_augment: uint8 [T, H, W, 3] kept; the same rng seed repeats
    it; a static video stays static (one draw for all frames); the draws change the frames; no ops is a
    no-op. torch's global generator is left as it was."""
    import torch

    from raytrain_seq.algorithms.augment import rand_augment

    rng = np.random.default_rng(5)
    frame = rng.integers(0, 256, (24, 30, 3), dtype=np.uint8)
    static = np.repeat(frame[None], 6, axis=0)
    state = torch.random.get_rng_state()
    outs = [rand_augment(static, ops=2, magnitude=9, rng=np.random.default_rng(s)) for s in (1, 1, 2, 3, 4)]
    assert torch.equal(state, torch.random.get_rng_state())
    assert outs[0].shape == static.shape and outs[0].dtype == np.uint8
    assert np.array_equal(outs[0], outs[1])
    assert sum(not np.array_equal(outs[0], o) for o in outs[2:]) >= 2
    for out in outs:
        assert all(np.array_equal(out[0], f) for f in out[1:])
    assert rand_augment(static, ops=0, magnitude=9, rng=np.random.default_rng(1)) is static
