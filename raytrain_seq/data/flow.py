"""Dense optical flow for the flow stream of a two-stream model, stored as uint8 like the images.

As in the two-stream networks and TSN (Simonyan & Zisserman 2014; Wang et al. 2016): dense flow between
consecutive frames, two channels (x then y), clipped to +-20 px and stored as 8 bits with 128 meaning
zero, ``q = round((f + bound) * 255 / (2 * bound))``: a flow video is an ordinary uint8 ``[T, H, W, 2]``
array the cache, the packer and ``final_augment(..., flow=True)`` handle like RGB.
Method: TV-L1 with opencv-contrib, else Farneback (``flow_method()``). Sign: ``prev[y, x] ~ next[y + fy, x + fx]``.
``pair_flow(first, second)`` takes each kept frame with its source successor (``video.decode_pairs``),
so a strided video still measures consecutive-frame motion. ``T`` frames give ``T - 1`` flows; the last
is repeated to keep RGB's ``T`` (a 1-frame video gets one zero flow).
``flow_window(flow, size, offset)`` slices the square window where ``augment.resize_video`` would place
it (0 start, 0.5 or None centre, 1 end), never resampling (that would have to scale the vectors).
Flow costs several times a partial augmentation (docs/ARCHITECTURE.md, "Measurements behind the code"),
so it belongs in the cached half, computed once per video (``data/sources.py``).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "FARNEBACK_PARAMS", "FLOW_BOUND", "compute_flow", "dequantize", "flow_method", "flow_window", "pair_flow",
    "quantize", "to_gray", "tvl1_factory",
]  # fmt: skip

# The clip used by TSN / dense_flow (at their 340x256 frames; at 112x112 the same motion is ~3x smaller).
FLOW_BOUND = 20.0
# OpenCV's textbook Farneback settings (samples/python/opt_flow.py): a classical 3-level pyramid (each
# level half the size), a 15x15 averaging window for robustness to noise, 3 iterations per level, and a
# 5-pixel polynomial neighbourhood with the sigma OpenCV recommends for it.
FARNEBACK_PARAMS: dict[str, Any] = {
    "pyr_scale": 0.5,
    "levels": 3,
    "winsize": 15,
    "iterations": 3,
    "poly_n": 5,
    "poly_sigma": 1.2,
    "flags": 0,
}
_METHODS = ("tvl1", "farneback")


def _cv2() -> Any:
    """Import OpenCV on first use, so importing this module stays cheap and starts nothing."""
    try:
        import cv2
    except ImportError as exc:
        raise ImportError(
            "optical flow needs OpenCV: pip install opencv-python-headless (or opencv-contrib-python-headless "
            "for TV-L1)"
        ) from exc
    return cv2


def tvl1_factory() -> Any | None:
    """The TV-L1 constructor of opencv-contrib, or None without contrib (the name moved across versions)."""
    optflow = getattr(_cv2(), "optflow", None)
    if optflow is None:
        return None
    for name in ("DualTVL1OpticalFlow_create", "createOptFlow_DualTVL1"):
        factory = getattr(optflow, name, None)
        if factory is not None:
            return factory
    return None


@functools.cache
def flow_method() -> str:
    """``"tvl1"`` when opencv-contrib provides TV-L1, else ``"farneback"``; checked once, on first call."""
    method = "tvl1" if tvl1_factory() is not None else "farneback"
    logger.info("optical flow method: %s", method)
    return method


def _check_bound(bound: object) -> float:
    if isinstance(bound, bool) or not isinstance(bound, (int, float, np.integer, np.floating)):
        raise TypeError(f"bound must be a positive number of pixels, e.g. {FLOW_BOUND}, got {bound!r}")
    if not (math.isfinite(float(bound)) and bound > 0):
        raise ValueError(f"bound must be a finite number of pixels > 0, e.g. {FLOW_BOUND}, got {bound}")
    return float(bound)


def _check_frames(frames: object) -> np.ndarray:
    if not isinstance(frames, np.ndarray):
        raise TypeError(f"frames must be a numpy uint8 array [T, H, W, 3], got {type(frames).__name__}")
    if frames.ndim != 4 or frames.shape[-1] not in (1, 3):
        raise ValueError(
            f"frames must have shape [T, H, W, 3] (RGB) or [T, H, W, 1] (gray), got {frames.shape}; add a "
            "time axis to one image with image[None] and a channel axis to gray frames with frames[..., None]"
        )
    if frames.dtype != np.uint8:
        raise ValueError(
            f"frames must be uint8, got {frames.dtype}; convert with np.clip(x, 0, 255).astype(np.uint8)"
        )
    if min(frames.shape[:3]) < 1:
        raise ValueError(
            f"frames must have at least one frame, row and column, got {frames.shape}; drop empty videos "
            "before computing flow"
        )
    return frames


def quantize(flow: np.ndarray, bound: float = FLOW_BOUND) -> np.ndarray:
    """Float flow (pixels, any shape) -> uint8: clip to ``[-bound, bound]``, map linearly to 0..255.

    ``q = round((f + bound) * 255 / (2 * bound))``; with bound 20 one step is 40/255 = 0.157 px, -20 -> 0,
    +20 -> 255, and 0 -> 127.5 which rounds (half to even) to 128.
    """
    bound = _check_bound(bound)
    values = np.asarray(flow, dtype=np.float32)
    if not np.isfinite(values).all():
        raise ValueError(
            "flow has NaN or infinite values; fix the flow source (quantize clips finite values only)"
        )
    scaled = (np.clip(values, -bound, bound) + bound) * np.float32(255.0 / (2.0 * bound))
    # Already in [0, 255]: the clip above bounds (f + bound) to [0, 2 * bound], so no second clip.
    return np.rint(scaled).astype(np.uint8)


def dequantize(q: np.ndarray, bound: float = FLOW_BOUND) -> np.ndarray:
    """uint8 flow -> float32 pixels, the inverse of ``quantize`` up to half a step (``bound / 255``).

    ``f = q * 2 * bound / 255 - bound``: with bound 20, 0 -> -20, 255 -> +20, 128 -> +0.078.
    """
    bound = _check_bound(bound)
    q = np.asarray(q)
    if q.dtype != np.uint8:
        raise ValueError(f"q must be uint8 quantised flow, got {q.dtype}; pass the output of compute_flow")
    return q.astype(np.float32) * np.float32(2.0 * bound / 255.0) - np.float32(bound)


def to_gray(frames: np.ndarray) -> np.ndarray:
    """uint8 ``[T, H, W, C]`` -> contiguous uint8 ``[T, H, W]`` (RGB to luma with OpenCV's weights)."""
    t, h, w, c = frames.shape
    if c == 1:
        return np.ascontiguousarray(frames[..., 0])
    cv2 = _cv2()
    # One call for the whole video: stacking frames along rows, [T, H, W, 3] -> [T*H, W, 3], is a
    # valid image, and the conversion is per pixel.
    gray = cv2.cvtColor(np.ascontiguousarray(frames).reshape(t * h, w, 3), cv2.COLOR_RGB2GRAY)
    return gray.reshape(t, h, w)


def compute_flow(frames: np.ndarray, *, method: str | None = None, bound: float = FLOW_BOUND) -> np.ndarray:
    """Quantised dense flow of a video: uint8 ``[T, H, W, C]`` (C = 3 RGB or 1 gray) -> uint8 ``[T, H, W, 2]``.

    Channel 0 is x (right positive), channel 1 is y (down positive); 128 means zero, one step is
    ``2 * bound / 255`` pixels. ``method`` is ``"tvl1"``, ``"farneback"`` or None for ``flow_method()``.

    Output frame t holds the flow from frame t to frame t + 1, and the last flow is repeated to keep the
    RGB length. Worked example, T = 4 frames f0..f3: flows ``[f0->f1, f1->f2, f2->f3, f2->f3]``; T = 1:
    ``[zero]``. Repeating (rather than appending a zero flow) keeps the last frame's motion continuous, so
    no fake "everything stops" frame marks the end of every video for the temporal model.
    """
    frames = _check_frames(frames)
    bound = _check_bound(bound)
    t = frames.shape[0]
    gray = to_gray(frames)
    flows = _flows(gray[:-1], gray[1:], _solver(method), t)
    if t > 1:
        flows[t - 1] = flows[t - 2]
    return quantize(flows, bound)


def _solver(method: str | None) -> Any:
    """``solve(prev_gray, next_gray) -> float32 [H, W, 2]`` for ``method`` (None: ``flow_method()``)."""
    if method is None:
        method = flow_method()
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS} or None (auto), got {method!r}")
    if method == "tvl1":
        factory = tvl1_factory()
        if factory is None:
            raise ValueError(
                "method='tvl1' needs opencv-contrib (cv2.optflow): pip install opencv-contrib-python-headless "
                "in place of opencv-python-headless, or pass method='farneback' (or None for auto)"
            )
        tvl1 = factory()
        return lambda prev, nxt: tvl1.calc(prev, nxt, None)
    cv2 = _cv2()
    return lambda prev, nxt: cv2.calcOpticalFlowFarneback(prev, nxt, None, **FARNEBACK_PARAMS)


def _flows(prev: np.ndarray, nxt: np.ndarray, solve: Any, t: int) -> np.ndarray:
    """float32 ``[t, H, W, 2]``: row i is the flow of the pair ``(prev[i], nxt[i])``, the rest zero."""
    flows = np.zeros((t, *prev.shape[1:3], 2), dtype=np.float32)
    for i in range(prev.shape[0]):
        flows[i] = solve(prev[i], nxt[i])
    return flows


def pair_flow(
    first: np.ndarray,
    second: np.ndarray,
    *,
    last: bool = True,
    method: str | None = None,
    bound: float = FLOW_BOUND,
) -> np.ndarray:
    """Quantised flow of each pair ``first[t] -> second[t]``: uint8 ``[T, H, W, 2]`` (as ``compute_flow``).

    The pairs come from ``video.decode_pairs``: a kept frame and the source frame right after it, so a
    strided video still gets the motion between consecutive frames. ``last=False`` says the last pair
    has no real successor (``second[-1]`` is ``first[-1]``): its flow repeats the previous pair's, the
    same rule as ``compute_flow`` (T = 1 without a successor gives one zero flow). With
    ``second[t] = first[t + 1]`` and ``last=False`` this equals ``compute_flow(first)`` exactly.
    """
    first, second = _check_frames(first), _check_frames(second)
    if first.shape != second.shape:
        raise ValueError(
            f"first and second must have one shape (a frame and its successor), got {first.shape} and "
            f"{second.shape}; pass the two arrays of video.decode_pairs"
        )
    bound = _check_bound(bound)
    t = first.shape[0]
    solve = _solver(method)
    pairs = t if last else t - 1
    flows = _flows(to_gray(first)[:pairs], to_gray(second)[:pairs], solve, t)
    if not last and t > 1:
        flows[t - 1] = flows[t - 2]
    return quantize(flows, bound)


def flow_window(flow: np.ndarray, size: int, offset: float | None = None) -> np.ndarray:
    """The ``size x size`` window of uint8 flow ``[T, H, W, 2]`` with ``min(H, W) == size``: a copy.

    The window runs along the long side at ``round(offset * (long - size))`` (``offset`` None: 0.5,
    the centre), the rounding of ``augment.resize_video``, so cutting the window out of the flow picks
    the same pixels as cutting it out of the frames. A 20x26 flow, size 20, offset 0.5: columns 3..22.
    """
    if not isinstance(flow, np.ndarray) or flow.ndim != 4 or flow.shape[-1] != 2 or flow.dtype != np.uint8:
        described = f"{flow.dtype} {flow.shape}" if isinstance(flow, np.ndarray) else type(flow).__name__
        raise ValueError(f"flow must be uint8 [T, H, W, 2] (pair_flow's output), got {described}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size must be an int >= 1, got {size!r}")
    _, h, w, _ = flow.shape
    if min(h, w) != size:
        raise ValueError(
            f"flow_window cuts a {size}x{size} window out of flow whose short side is {size}, got {h}x{w}: "
            f"compute the flow of frames decoded at short side {size}"
        )
    if offset is not None and not 0.0 <= offset <= 1.0:
        raise ValueError(f"offset must be in [0, 1] (0: start, 0.5: centre, 1: end) or None, got {offset}")
    pos = 0.5 if offset is None else offset
    top, left = round(pos * (h - size)), round(pos * (w - size))
    return np.array(flow[:, top : top + size, left : left + size], copy=True)
