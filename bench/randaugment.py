"""RandAugment on the CPU, for calibrating the cost of the refurbishing benchmark's partial augmentation.

RandAugment (Cubuk et al., 2020) applies ``layers`` operations drawn uniformly from 14 (identity,
autocontrast, equalize, rotate, solarize, colour, posterize, contrast, brightness, sharpness, shear x/y,
translate x/y), each at magnitude ``magnitude``/30 of its range (torchvision's ranges), with PIL as the
reference implementation did. Revamper (Lee et al., USENIX ATC '21) makes two RandAugment layers the
expensive partial augmentation; ``calibrate`` measures what they cost on this CPU so that
``bench/refurbish.py`` can make its partial augmentation exactly as costly, and ``burn_cpu`` spends the
difference as thread CPU time (a loaded machine cannot shorten it, unlike a wall-clock wait).
"""

from __future__ import annotations

import statistics
import time

import numpy as np


def _randaugment_ops():
    from PIL import Image, ImageEnhance, ImageOps

    def affine(img, coeffs):
        return img.transform(img.size, Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR)

    # (name, fn(img, level in [0, 1], sign)) with torchvision's ranges for RandAugment.
    return [
        ("identity", lambda img, lv, s: img),
        ("autocontrast", lambda img, lv, s: ImageOps.autocontrast(img)),
        ("equalize", lambda img, lv, s: ImageOps.equalize(img)),
        ("rotate", lambda img, lv, s: img.rotate(s * 30.0 * lv, resample=Image.Resampling.BILINEAR)),
        ("solarize", lambda img, lv, s: ImageOps.solarize(img, int(255 * (1 - lv)))),
        ("color", lambda img, lv, s: ImageEnhance.Color(img).enhance(1 + s * 0.9 * lv)),
        ("posterize", lambda img, lv, s: ImageOps.posterize(img, 8 - int(4 * lv))),
        ("contrast", lambda img, lv, s: ImageEnhance.Contrast(img).enhance(1 + s * 0.9 * lv)),
        ("brightness", lambda img, lv, s: ImageEnhance.Brightness(img).enhance(1 + s * 0.9 * lv)),
        ("sharpness", lambda img, lv, s: ImageEnhance.Sharpness(img).enhance(1 + s * 0.9 * lv)),
        ("shear_x", lambda img, lv, s: affine(img, (1, s * 0.3 * lv, 0, 0, 1, 0))),
        ("shear_y", lambda img, lv, s: affine(img, (1, 0, 0, s * 0.3 * lv, 1, 0))),
        ("translate_x", lambda img, lv, s: affine(img, (1, 0, s * 0.45 * lv * img.size[0], 0, 1, 0))),
        ("translate_y", lambda img, lv, s: affine(img, (1, 0, 0, 0, 1, s * 0.45 * lv * img.size[1]))),
    ]


def randaugment(
    image: np.ndarray, rng: np.random.Generator, *, layers: int = 2, magnitude: int = 9
) -> np.ndarray:
    """RandAugment (Cubuk et al.) on one uint8 HxWx3 image with PIL: ``layers`` random ops at ``magnitude``/30."""
    from PIL import Image

    ops = _randaugment_ops()
    img = Image.fromarray(image)
    for index in rng.integers(0, len(ops), size=layers):
        sign = 1.0 if rng.random() < 0.5 else -1.0
        img = ops[int(index)][1](img, magnitude / 30.0, sign)
    return np.asarray(img)


def calibrate(size: int = 112, images: int = 96, seed: int = 0) -> float:
    """Median thread-CPU seconds of one 2-layer RandAugment on a ``size`` x ``size`` RGB image."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    base = np.stack([xx, yy, (xx + yy) // 2], axis=-1).astype(np.float32) * (255.0 / (2 * size))
    times = []
    for _ in range(images):
        image = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        began = time.thread_time()
        randaugment(image, rng)
        times.append(time.thread_time() - began)
    return float(statistics.median(times))


def burn_cpu(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time (not wall time: a loaded machine cannot shorten it)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
