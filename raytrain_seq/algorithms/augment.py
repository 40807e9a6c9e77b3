"""Video augmentations split the Revamper way: an expensive partial half, cached, and a cheap final half.

Data refurbishing (Lee et al., USENIX ATC '21): the *partial* augmentation (resize, one random photometric
transform per video, ``extra_ops`` RandAugment-like warps) is computed once, cached and reused ``r``
times; the *final* one (one random crop and one horizontal flip) runs on every use, so reused samples
still differ. Every random parameter is drawn ONCE per video (partial) or ONCE per sequence (final) and
applied to all its frames: per-frame randomness would fake motion. Functions take frames ``uint8 [T, H, W,
C]`` and an explicit ``np.random.Generator``; ``final_augment`` (CPU) and ``final_augment_batch`` (the
learner's device) give the same frames from the same draws; ``test_views`` are the multi-view crops.
Resizing is a separable triangle filter (anti-aliased when shrinking); short side to ``size``, the long
side cropped (at random in ``partial_augment``, centred in ``resize_video``). Per-video costs:
docs/ARCHITECTURE.md, "Measurements behind the code"; the end-to-end claim is ``bench/refurbish.py``'s.
``stride_frames`` keeps every ``stride``-th frame of decoded real videos; the synthetic set is rendered
strided already.
"""

from __future__ import annotations

import logging
import math

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "TEST_VIEWS",
    "center_crop",
    "final_augment",
    "final_augment_batch",
    "final_params",
    "partial_augment",
    "rand_augment",
    "resize_video",
    "stride_frames",
    "test_views",
]

# Per-video photometric ranges (torchvision ColorJitter-like): factors are drawn uniformly in these.
BRIGHTNESS = (0.7, 1.3)
CONTRAST = (0.7, 1.3)
SATURATION = (0.6, 1.4)
HUE = (-0.08, 0.08)  # turns of the colour wheel
# RandAugment-like warp at full magnitude: rotation and shear, drawn once per video.
WARP_DEGREES = 12.0
WARP_SHEAR = 0.12
_LUMA = np.array([0.299, 0.587, 0.114])
_RGB_TO_YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])


def _check_video(frames: object, name: str = "frames") -> np.ndarray:
    if not isinstance(frames, np.ndarray):
        raise TypeError(f"{name} must be a numpy uint8 array [T, H, W, C], got {type(frames).__name__}")
    if frames.ndim != 4:
        raise ValueError(
            f"{name} must have shape [T, H, W, C], got {frames.shape}; add a channel axis to gray "
            "frames with frames[..., None] and a time axis to one image with image[None]"
        )
    if frames.dtype != np.uint8:
        raise ValueError(
            f"{name} must be uint8, got {frames.dtype}; convert with np.clip(x, 0, 255).astype(np.uint8)"
        )
    if min(frames.shape) < 1:
        raise ValueError(f"{name} must have at least one frame, row, column and channel, got {frames.shape}")
    return frames


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy Generator, e.g. np.random.default_rng(seed), got {type(rng).__name__}"
        )
    return rng


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _resize_weights(in_size: int, out_size: int) -> np.ndarray:
    """Row-normalised triangle-filter weights ``[out_size, in_size]``.

    Output pixel i covers input coordinates ``[i * scale, (i + 1) * scale)``, centre ``(i + 0.5) * scale -
    0.5`` in pixel-index units. Example 4 -> 2 (scale 2, support 2): output 0 has centre 0.5 and raw
    weights ``1 - |j - 0.5| / 2 = [0.75, 0.75, 0.25, 0]`` for j = 0..3, normalised to
    ``[0.43, 0.43, 0.14, 0]``. Enlarging (scale < 1) keeps support 1: bilinear, edge pixels clamped.
    """
    scale = in_size / out_size
    support = max(scale, 1.0)
    centres = (np.arange(out_size) + 0.5) * scale - 0.5
    weights = np.maximum(0.0, 1.0 - np.abs(np.arange(in_size)[None, :] - centres[:, None]) / support)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def _window(h: int, w: int, size: int, offset: float | None) -> tuple[int, int, int, int]:
    """``(out_h, out_w, top, left)``: the short side scaled to ``size``, and where the ``size`` window
    starts along the long side (``offset`` in [0, 1], None = 0.5). 240x320 to 128: 128x171, left
    ``round(offset * 43)``."""
    out_h, out_w = (
        (size, max(size, round(w * size / h))) if h <= w else (max(size, round(h * size / w)), size)
    )
    pos = 0.5 if offset is None else offset
    return out_h, out_w, round(pos * (out_h - size)), round(pos * (out_w - size))


def _resize_float(frames: np.ndarray, size: int, offset: float | None) -> np.ndarray:
    """Short side to ``size``, then a ``size`` window of the long side; float32 ``[T, size, size, C]``.

    ``offset`` in [0, 1] places the window along the long side (0: start, 0.5: centre, 1: end); None
    means 0.5. A 240x320 frame to 36 scales to 36x48 and keeps columns ``[k, k + 36)``, k in 0..12.
    """
    t, h, w, c = frames.shape
    out_h, out_w, top, left = _window(h, w, size, offset)
    out = frames.astype(np.float32)
    # An axis already at its output size has identity weights (1 on the diagonal, 0 elsewhere), so it is
    # sliced instead of multiplied: the same values exactly. Real videos decoded at short side ``size``
    # (video.decode) only need the window along the long side.
    if h == out_h:
        out = out[:, top : top + size]
    else:
        rows = _resize_weights(h, out_h)[top : top + size]
        out = np.matmul(rows, out.reshape(t, h, w * c)).reshape(t, size, w, c)
    if w == out_w:
        out = out[:, :, left : left + size]
    else:
        cols = _resize_weights(w, out_w)[left : left + size]
        out = np.matmul(cols, out.reshape(t * size, w, c)).reshape(t, size, size, c)
    return np.ascontiguousarray(out)


def _to_uint8(values: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def resize_video(frames: np.ndarray, size: int, offset: float | None = None) -> np.ndarray:
    """Short side to ``size``, square window along the long side; uint8, any channel count.

    ``offset`` None (evaluation) centres the window; a value in [0, 1] places it (0: start, 1: end),
    which is how the flow stream's partial augmentation draws its random window without colour jitter.
    """
    frames = _check_video(frames)
    size = _check_int("size", size, 1)
    if offset is not None and not 0.0 <= offset <= 1.0:
        raise ValueError(f"offset must be in [0, 1] (0: start, 0.5: centre, 1: end) or None, got {offset}")
    return _to_uint8(_resize_float(frames, size, offset))


def _photometric_matrix(rng: np.random.Generator, channels: int) -> tuple[np.ndarray, float, float]:
    """One random colour transform: ``(matrix [C, C], brightness, contrast)``.

    Saturation blends each pixel with its luma (``s * x + (1 - s) * luma(x)``); hue rotates the chroma
    plane of YIQ. Both are linear and keep gray ``(1, 1, 1)`` fixed, so with brightness and contrast the
    whole transform is ``x -> A x + offset * (1, 1, 1)``: one affine map shared by all frames.
    """
    brightness = float(rng.uniform(*BRIGHTNESS))
    contrast = float(rng.uniform(*CONTRAST))
    saturation = float(rng.uniform(*SATURATION))
    hue = float(rng.uniform(*HUE))
    if channels == 1:
        return np.ones((1, 1)), brightness, contrast
    sat = saturation * np.eye(3) + (1.0 - saturation) * np.outer(np.ones(3), _LUMA)
    angle = 2.0 * math.pi * hue
    rot = np.array(
        [[1.0, 0.0, 0.0], [0.0, math.cos(angle), -math.sin(angle)], [0.0, math.sin(angle), math.cos(angle)]]
    )
    hue_matrix = np.linalg.inv(_RGB_TO_YIQ) @ rot @ _RGB_TO_YIQ
    return hue_matrix @ sat, brightness, contrast


def _random_warp(frames: np.ndarray, rng: np.random.Generator, magnitude: float) -> np.ndarray:
    """Rotate and shear all frames by ONE random affine map (bilinear, edges clamped): float32 in and out."""
    _, h, w, _ = frames.shape
    angle = math.radians(WARP_DEGREES) * magnitude * float(rng.uniform(-1.0, 1.0))
    shear = WARP_SHEAR * magnitude * float(rng.uniform(-1.0, 1.0))
    cos, sin = math.cos(angle), math.sin(angle)
    yy, xx = np.meshgrid(np.arange(h) - (h - 1) / 2.0, np.arange(w) - (w - 1) / 2.0, indexing="ij")
    # Inverse mapping: each output pixel samples the input at (rotation @ shear) @ its centred position.
    src_x = np.clip(cos * (xx + shear * yy) - sin * yy + (w - 1) / 2.0, 0.0, w - 1.0)
    src_y = np.clip(sin * (xx + shear * yy) + cos * yy + (h - 1) / 2.0, 0.0, h - 1.0)
    x0, y0 = np.floor(src_x).astype(np.intp), np.floor(src_y).astype(np.intp)
    x1, y1 = np.minimum(x0 + 1, w - 1), np.minimum(y0 + 1, h - 1)
    fx = (src_x - x0).astype(np.float32).reshape(h * w, 1)
    fy = (src_y - y0).astype(np.float32).reshape(h * w, 1)
    t, c = frames.shape[0], frames.shape[3]
    # Pixel-major layout [H*W, T*C]: one gather of whole rows per tap, blends along a contiguous axis.
    flat = frames.transpose(1, 2, 0, 3).reshape(h * w, t * c)

    def tap(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        # Flat pixel index row * w + col: in a 36-wide frame, pixel (2, 5) is 77.
        return np.take(flat, (rows * w + cols).ravel(), axis=0)

    top = tap(y0, x0) * (1.0 - fx) + tap(y0, x1) * fx
    bottom = tap(y1, x0) * (1.0 - fx) + tap(y1, x1) * fx
    out = top * (1.0 - fy) + bottom * fy
    return np.ascontiguousarray(out.reshape(h, w, t, c).transpose(2, 0, 1, 3))


def partial_augment(
    frames: np.ndarray, *, size: int, rng: np.random.Generator, extra_ops: int = 0
) -> np.ndarray:
    """The expensive, cached half: uint8 ``[T, H, W, C]`` -> uint8 ``[T, size, size, C]``, C in {1, 3}.

    Short side to ``size`` (e.g. 36 for a 32 crop), a random window along the long side, ``extra_ops``
    RandAugment-like random warps (rotation + shear; each at magnitude ``1/sqrt(extra_ops)`` so the total
    distortion stays about the same while the cost grows linearly: a knob for benchmarks), and ONE random
    brightness / contrast / saturation / hue transform. Every random parameter is drawn once and applied
    to every frame, so the motion in the video is intact. Contrast pivots on the mean luma of the whole
    video (not of each frame) for the same reason; that pivot is a whole-video statistic, so each output
    frame carries a faint second-order trace of the video (on the synthetic set a nearest-centroid on
    single augmented frames stayed within noise of chance: docs/ARCHITECTURE.md, "Measurements behind the code",
    figures moved out of comments).
    """
    frames = _check_video(frames)
    size = _check_int("size", size, 1)
    extra_ops = _check_int("extra_ops", extra_ops, 0)
    rng = _check_rng(rng)
    channels = frames.shape[-1]
    if channels not in (1, 3):
        raise ValueError(
            f"partial_augment needs RGB (C=3) or gray (C=1) frames, got C={channels}; optical-flow stacks "
            "must not get colour jitter: use resize_video for them"
        )
    offset = float(rng.uniform(0.0, 1.0))
    _, h, w, _ = frames.shape
    out_h, out_w, top, left = _window(h, w, size, offset)
    if extra_ops == 0 and (h, w) == (out_h, out_w):
        # Frames already at the cache size's short side (a decode at ``size``, the synthetic render): the
        # window is a slice, and the colour transform is one affine map on uint8, so no float copy.
        window = frames[:, top : top + size, left : left + size]
        return _colour_uint8(window, *_photometric_matrix(rng, channels))
    out = _resize_float(frames, size, offset)
    for _ in range(extra_ops):
        out = _random_warp(out, rng, 1.0 / math.sqrt(extra_ops))
    matrix, brightness, contrast = _photometric_matrix(rng, channels)
    pixels = out.reshape(-1, channels)
    mean_luma = float(out.mean()) if channels == 1 else float((pixels @ _LUMA.astype(np.float32)).mean())
    # x -> contrast * (brightness * M x - brightness * mean) + brightness * mean; M maps gray to gray, so
    # the pivot term is the same gray offset for every pixel: brightness * mean * (1 - contrast).
    gain = (brightness * contrast * matrix).astype(np.float32)
    offset = np.float32(brightness * mean_luma * (1.0 - contrast))
    return _to_uint8((pixels @ gain.T + offset).reshape(out.shape))


def rand_augment(frames: np.ndarray, *, ops: int, magnitude: int, rng: np.random.Generator) -> np.ndarray:
    """torchvision's RandAugment (``transforms.v2.RandAugment(ops, magnitude)``, Cubuk et al. 2020) with ONE
    draw for the whole video: the same operations at the same strength on every frame, so the motion is
    the video's. uint8 ``[T, H, W, 3]`` in and out; the draw comes from ``rng`` (torch's global generator
    is forked and seeded from it, then restored), so a (seed, video, epoch) repeats it. Revamper's
    partial augmentation: the costly half that refurbishing reuses.
    """
    import torch
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    frames = _check_video(frames)
    ops = _check_int("ops", ops, 0)
    if ops == 0:
        return frames
    transform = v2.RandAugment(num_ops=ops, magnitude=_check_int("magnitude", magnitude, 0))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(rng.integers(2**63)))
        video = tv_tensors.Video(torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2))
        out = transform(video)
    return np.ascontiguousarray(out.permute(0, 2, 3, 1).numpy())


def _colour_uint8(window: np.ndarray, matrix: np.ndarray, brightness: float, contrast: float) -> np.ndarray:
    """``partial_augment``'s colour transform on uint8 frames, rounded once: OpenCV's ``transform`` (RGB)
    or a lookup table (gray), the same affine map as the float path. The pivot is the window's mean luma,
    from per-channel means (a 3-vector dot product instead of a pass of float pixels)."""
    import cv2

    channels = window.shape[-1]
    flat = window.reshape(-1, window.shape[2], channels)  # [T * H, W, C]: a view of the strided slice
    means = np.array([float(np.mean(flat[..., k], dtype=np.float64)) for k in range(channels)])
    mean_luma = float(means[0]) if channels == 1 else float(means @ _LUMA)
    gain = brightness * contrast * matrix
    offset = brightness * mean_luma * (1.0 - contrast)
    if channels == 1:
        table = _to_uint8(np.arange(256, dtype=np.float64) * gain[0, 0] + offset)
        return table[window]
    affine = np.concatenate([gain, np.full((3, 1), offset)], axis=1).astype(np.float32)
    return cv2.transform(np.ascontiguousarray(flat), affine).reshape(window.shape)


def final_augment(
    frames: np.ndarray,
    *,
    crop: int,
    rng: np.random.Generator,
    flip_prob: float = 0.5,
    flow: bool | None = None,
) -> np.ndarray:
    """The cheap, per-use half: ONE random ``crop x crop`` window and ONE random horizontal flip for ALL
    frames of the sequence (never per frame: that would add motion). Returns a new uint8 array.

    ``flow=True`` marks a TSN-style optical-flow stack (C=2, x then y, 127.5 meaning zero): flipping it
    must also negate the x component, ``u -> 255 - u`` (content moving right moves left in the mirror).
    ``flow=None`` (default) decides by the channels: C=2 is flow (the only 2-channel input of the
    pipeline, so block assembly needs no flag), anything else is an image; ``flow=False`` forces an image.
    """
    frames = _check_video(frames)
    crop = _check_int("crop", crop, 1)
    rng = _check_rng(rng)
    _, h, w, c = frames.shape
    if crop > h or crop > w:
        raise ValueError(
            f"crop={crop} exceeds the frame size {h}x{w}; partial_augment to a size >= crop first"
        )
    if not 0.0 <= flip_prob <= 1.0:
        raise ValueError(f"flip_prob must be in [0, 1], got {flip_prob}")
    if flow and c != 2:
        raise ValueError(f"flow=True expects C=2 (x, y flow), got C={c}; pass flow=False for images")
    if flow is None:
        flow = c == 2
    top, left, flip = final_params(rng, h, w, crop, flip_prob)
    out = frames[:, top : top + crop, left : left + crop]
    if flip:
        out = out[:, :, ::-1]
    out = np.array(out, copy=True)
    if flip and flow:
        out[..., 0] = 255 - out[..., 0]
    return out


def final_params(
    rng: np.random.Generator, height: int, width: int, crop: int, flip_prob: float = 0.5
) -> tuple[int, int, bool]:
    """The final augmentation's random draws for one sequence: ``(top, left, flip)``, in this order.

    ``final_augment`` (numpy, per sequence) and ``final_augment_batch`` (torch, on the learner's device)
    apply the same draws, so moving the crop and flip onto the device leaves the frames unchanged.
    """
    top = int(rng.integers(0, height - crop + 1))
    left = int(rng.integers(0, width - crop + 1))
    return top, left, bool(rng.random() < flip_prob)


def final_augment_batch(
    frames,
    *,
    starts,
    lengths,
    tops,
    lefts,
    flips,
    crop: int,
    flow: bool,
):
    """``final_augment`` for a whole mini-batch of block rows, in torch on ``frames``' device.

    ``frames`` uint8 ``[B, T, H, W, C]`` (the cached partial augmentation, not yet cropped); ``starts``,
    ``lengths``, ``tops``, ``lefts``, ``flips`` int ``[B, S]`` per sequence (lengths -1 past the real
    sequences), read on the host (host tensors or arrays; device tensors cost a synchronisation). Every
    frame of sequence (b, s) is cut at ``(tops[b, s], lefts[b, s])`` and mirrored when ``flips[b, s]``;
    padding frames stay zero, as they are in the rows. ``flow``: a flipped frame's x channel becomes
    ``255 - u``, as in ``final_augment``. Returns uint8 ``[B, T, crop, crop, C]``.

    A sequence is a contiguous run of its row's frames and all of them share one cut, so each sequence is
    one strided slice copied at memory speed: a loop over the mini-batch's sequences (tens), never over
    frames or pixels. On a CPU it beat one gather with a per-pixel index and an ``unfold`` window gather
    (timed by hand: docs/ARCHITECTURE.md, "Measurements behind the code"); on a GPU it is tens of copy kernels.
    """
    b, t, h, w, c = frames.shape
    if crop > h or crop > w:
        raise ValueError(
            f"crop={crop} exceeds the frame size {h}x{w}; partial_augment to a size >= crop first"
        )
    out = frames.new_zeros((b, t, crop, crop, c))
    table = [values.tolist() for values in (starts, lengths, tops, lefts, flips)]
    for row in range(b):
        for start, length, top, left, flip in zip(*(column[row] for column in table), strict=True):
            if length <= 0:
                continue  # past the row's real sequences
            # e.g. start 37, length 24, top 2, left 0, crop 32: frames 37..60, pixel rows 2..33, columns 0..31
            piece = frames[row, start : start + length, top : top + crop, left : left + crop]
            if flip:
                piece = piece.flip(2)  # the width axis of [frames, height, width, channels]; a copy
                if flow:
                    piece[..., 0] = 255 - piece[..., 0]  # mirrored motion: u -> -u (the cache is untouched)
            out[row, start : start + length] = piece
    return out


def center_crop(frames: np.ndarray, crop: int) -> np.ndarray:
    """Deterministic final step for evaluation: the centred ``crop x crop`` window, no flip."""
    frames = _check_video(frames)
    crop = _check_int("crop", crop, 1)
    _, h, w, _ = frames.shape
    if crop > h or crop > w:
        raise ValueError(f"crop={crop} exceeds the frame size {h}x{w}; resize_video to a size >= crop first")
    top, left = (h - crop) // 2, (w - crop) // 2
    return np.array(frames[:, top : top + crop, left : left + crop], copy=True)


def stride_frames(frames: np.ndarray, stride: int) -> np.ndarray:
    """Every ``stride``-th frame (0, s, 2s, ...): ``ceil(T / stride)`` frames, matching
    ``raytrain_seq.data.lengths.strided``. A view, not a copy. Not for the synthetic set (already strided).
    """
    if not isinstance(frames, np.ndarray) or frames.ndim < 1:
        raise TypeError(f"frames must be a numpy array with a leading time axis, got {type(frames).__name__}")
    stride = _check_int("stride", stride, 1)
    return frames[::stride]


TEST_VIEWS = ("center", "center_flip", "three_crop", "three_crop_flip", "ten_crop")


def test_views(name: str, size: int, crop: int) -> list[tuple[int, int, bool]]:
    """The (top, left, flip) of each test view of a ``size`` x ``size`` cached frame, as MMAction2 tests:

    "center": the centre crop; "center_flip": it and its mirror; "three_crop": three crops across the
    frame at its vertical centre (left, centre, right: MMAction2's ThreeCrop of a frame whose short side
    is the crop); "three_crop_flip": those and their mirrors; "ten_crop": the four corners and the centre,
    and their mirrors (TenCrop). E.g. size 36, crop 32, "three_crop": [(2, 0), (2, 2), (2, 4)], no flip.
    """
    if name not in TEST_VIEWS:
        raise ValueError(f"test views must be one of {TEST_VIEWS}, got {name!r}")
    if crop > size:
        raise ValueError(
            f"crop {crop} exceeds the frame size {size}: the views are cut from the cached frame"
        )
    end, mid = size - crop, (size - crop) // 2
    if name.startswith("center"):
        spots = [(mid, mid)]
    elif name.startswith("three_crop"):
        spots = [(mid, 0), (mid, mid), (mid, end)]
    else:
        spots = [(0, 0), (0, end), (end, 0), (end, end), (mid, mid)]
    flips = (False, True) if name in ("center_flip", "three_crop_flip", "ten_crop") else (False,)
    return [(top, left, flip) for flip in flips for top, left in spots]
