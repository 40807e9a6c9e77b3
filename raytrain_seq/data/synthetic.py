"""Built-in synthetic action videos whose class is spread over the whole sequence.

Each video shows one soft textured blob on a noisy torus background. The class is the ORDERED PAIR of
motions ``(first, second)``, performed in frames ``[0, T // 2)`` and ``[T // 2, T)``: one frame is at
chance (every frame has the same law for every class), a half narrows the class down, the whole
sequence in order determines it: BLoad's case for whole sequences (tests/test_synthetic.py pins it).
``MOTIONS`` are twelve (drifts, growth, oscillations, flicker, hue, shake, still), none horizontally
directed, so a flipped video keeps its class; ``class_motions`` lists the ordered pairs by a round-robin
schedule (``num_classes`` 2..132). A frame carries no class because every per-frame quantity is a phase
drawn uniformly at frame 0 and motions only rotate or redraw phases.
Determinism: ``render(i)`` depends only on ``(seed, i)`` and the constructor; the catalog holds ids,
labels and lengths (the real UCF101 split-1 counts, ALREADY strided: do not stride again), and frames are
rendered where they are decoded. Rendering cost: docs/ARCHITECTURE.md, "Measurements behind the code".
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass

import numpy as np

from raytrain_seq.data.lengths import strided, ucf101_lengths

logger = logging.getLogger(__name__)

__all__ = [
    "MOTIONS", "Nuisance", "SyntheticCatalog", "SyntheticVideos", "class_motions", "draw_nuisance", "mirror",
    "render", "render_motion_pair", "trajectory",
]  # fmt: skip

MOTIONS: tuple[str, ...] = (
    "up", "down", "grow", "shrink", "sway", "bob", "pulse", "flicker", "squash", "hue", "shake", "still",
)  # fmt: skip
SPLITS = ("train", "val", "test")

# Round-robin slots: the circle method pairs slot 11 with slot r and (r+i, r-i) mod 11, so round 0
# pairs slots (11, 0), (1, 10), (2, 9), (3, 8), (4, 7), (5, 6), i.e. up|down, grow|shrink, sway|bob, ...
_SLOTS = (
    "up", "grow", "sway", "pulse", "squash", "shake", "still", "hue", "flicker", "bob", "shrink", "down",
)  # fmt: skip

# Geometry and rates at size 32 (pixel quantities are scaled by size / 32).
_R_MIN, _R_MAX = 3.0, 8.0
_DRIFT = 1.2
_GROW = 0.09
_OSC_AMP, _OSC_OMEGA = 3.5, 2 * math.pi / 8
_PULSE_OMEGA = 2 * math.pi / 10
_SQUASH_AMP, _SQUASH_OMEGA = 0.45, 2 * math.pi / 8
_HUE_RATE = 0.06
_SHAKE_SIGMA = 1.2
_SPEED_RANGE = (0.75, 1.3)
_SPLIT_SALT, _RENDER_SALT = 0x5B1, 0xF4A


@functools.lru_cache(maxsize=1)
def _ordered_pairs() -> tuple[tuple[str, str], ...]:
    k = len(_SLOTS)
    n = k - 1
    out: list[tuple[str, str]] = []
    for r in range(n):
        matching = [(_SLOTS[n], _SLOTS[r])]
        matching += [(_SLOTS[(r + i) % n], _SLOTS[(r - i) % n]) for i in range(1, k // 2)]
        # Within a pair, the motion listed first in MOTIONS comes first; pairs ordered by that motion.
        ordered = [tuple(sorted(p, key=MOTIONS.index)) for p in matching]
        for a, b in sorted(ordered, key=lambda p: MOTIONS.index(p[0])):
            out += [(a, b), (b, a)]
    return tuple(out)


def class_motions(num_classes: int) -> list[tuple[str, str]]:
    """``(first_half_motion, second_half_motion)`` of each class ``0..num_classes-1``."""
    pairs = _ordered_pairs()
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
        raise TypeError(f"num_classes must be an int in 2..{len(pairs)}, got {num_classes!r}")
    if not 2 <= num_classes <= len(pairs):
        raise ValueError(f"num_classes must be in 2..{len(pairs)} (ordered motion pairs), got {num_classes}")
    return list(pairs[:num_classes])


@dataclass(frozen=True, eq=False)
class SyntheticCatalog:
    """One split: ``ids`` (ascending), ``labels`` and ``lengths`` (already strided), all int64."""

    ids: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray
    num_classes: int
    split: str

    def __post_init__(self) -> None:
        if not (self.ids.shape == self.labels.shape == self.lengths.shape and self.ids.ndim == 1):
            raise ValueError(
                f"ids, labels and lengths must be 1-D of one length, got {self.ids.shape}, "
                f"{self.labels.shape}, {self.lengths.shape}"
            )

    def __len__(self) -> int:
        return int(self.ids.shape[0])


@dataclass(frozen=True)
class Nuisance:
    """Everything drawn per video; its law is the same for every class (see the module docstring)."""

    x0: float
    y0: float
    z0: float  # log radius
    theta_x: float
    theta_y: float
    theta_aspect: float
    theta_bright: float
    hue0: float
    saturation: float
    speed: float
    tex_angle: float
    tex_freq: float
    tex_phase: float
    bg_level: float
    bg_tint: np.ndarray  # [3]
    bg_angle: float
    bg_wavelength: float
    bg_phase: float
    bg_amp: float
    noise_sigma: float
    shake: np.ndarray  # [T, 2] (x, y) offsets in px, used only in shake frames
    flicker: np.ndarray  # [T] brightness phases, used only in flicker frames
    noise: np.ndarray  # [T, H, W, 1] float32 standard normal


def draw_nuisance(rng: np.random.Generator, length: int, size: int) -> Nuisance:
    """Draw one video's nuisances from ``rng``: the same law for every class (see the module docstring)."""
    # The draw order and shapes depend only on (length, size), never on the class.
    scale = size / 32.0
    two_pi = 2 * math.pi
    return Nuisance(
        x0=float(rng.uniform(0, size)),
        y0=float(rng.uniform(0, size)),
        z0=float(rng.uniform(math.log(_R_MIN * scale), math.log(_R_MAX * scale))),
        theta_x=float(rng.uniform(0, two_pi)),
        theta_y=float(rng.uniform(0, two_pi)),
        theta_aspect=float(rng.uniform(0, two_pi)),
        theta_bright=float(rng.uniform(0, two_pi)),
        hue0=float(rng.uniform(0, 1)),
        saturation=float(rng.uniform(0.45, 0.9)),
        speed=float(rng.uniform(*_SPEED_RANGE)),
        tex_angle=float(rng.uniform(0, two_pi)),
        tex_freq=float(rng.uniform(0.6, 1.4)),
        tex_phase=float(rng.uniform(0, two_pi)),
        bg_level=float(rng.uniform(0.03, 0.12)),
        bg_tint=rng.uniform(0.85, 1.15, size=3),
        bg_angle=float(rng.uniform(0, two_pi)),
        bg_wavelength=float(rng.uniform(8, 20) * scale),
        bg_phase=float(rng.uniform(0, two_pi)),
        bg_amp=float(rng.uniform(0, 0.04)),
        noise_sigma=float(rng.uniform(0.01, 0.03)),
        shake=rng.normal(0.0, _SHAKE_SIGMA * scale, size=(length, 2)),
        flicker=rng.uniform(0, two_pi, size=length),
        noise=rng.standard_normal((length, size, size, 1), dtype=np.float32),
    )


def mirror(n: Nuisance, size: int) -> Nuisance:
    """The nuisances of the horizontally flipped video; each mirrored draw has the same law.

    Pixel centres sit at x = 0..size-1, so the flip maps x to size-1-x: the start position maps to
    ``size-1-x0`` (uniform stays uniform on the torus), the sway phase to ``theta+pi`` (since
    ``sin(theta+pi) = -sin(theta)``), shake offsets to their negatives (symmetric law), texture and
    background orientations ``a`` to ``pi-a`` (uniform stays uniform), and the noise field is flipped.
    """
    two_pi = 2 * math.pi
    shake = n.shake.copy()
    shake[:, 0] = -shake[:, 0]
    return dataclasses.replace(
        n,
        x0=(size - 1 - n.x0) % size,
        theta_x=(n.theta_x + math.pi) % two_pi,
        tex_angle=(math.pi - n.tex_angle) % two_pi,
        bg_angle=(math.pi - n.bg_angle) % two_pi,
        shake=shake,
        noise=np.ascontiguousarray(n.noise[:, :, ::-1]),
    )


def trajectory(n: Nuisance, motions: tuple[str, str], length: int, size: int) -> dict[str, np.ndarray]:
    """Per-frame state (x, y, log radius, log aspect, brightness, hue), each of shape [T]."""
    scale = size / 32.0
    t = np.arange(length)
    half = length // 2
    motion_of_frame = np.where(t < half, MOTIONS.index(motions[0]), MOTIONS.index(motions[1]))

    def frames_in(name: str) -> np.ndarray:
        return motion_of_frame == MOTIONS.index(name)

    def steps_in(name: str) -> np.ndarray:
        # Number of frame-to-frame steps taken in motion `name` up to frame t; the step t-1 -> t belongs
        # to frame t's motion. T=5, motions (up, grow): frames of up = [1, 1, 0, 0, 0] -> steps [0, 1, 1, 1, 1].
        active = frames_in(name).astype(np.float64)
        active[0] = 0.0
        return np.cumsum(active)

    sp = n.speed
    shaking = frames_in("shake")
    x = n.x0 + _OSC_AMP * scale * np.sin(n.theta_x + _OSC_OMEGA * sp * steps_in("sway"))
    x = (x + shaking * n.shake[:, 0]) % size
    y = n.y0 + _DRIFT * scale * sp * (steps_in("down") - steps_in("up"))
    y = y + _OSC_AMP * scale * np.sin(n.theta_y + _OSC_OMEGA * sp * steps_in("bob"))
    y = (y + shaking * n.shake[:, 1]) % size
    z_lo = math.log(_R_MIN * scale)
    z_span = math.log(_R_MAX / _R_MIN)
    z = z_lo + (n.z0 - z_lo + _GROW * sp * (steps_in("grow") - steps_in("shrink"))) % z_span
    aspect = _SQUASH_AMP * np.sin(n.theta_aspect + _SQUASH_OMEGA * sp * steps_in("squash"))
    phase_b = np.where(
        frames_in("flicker"), n.flicker, n.theta_bright + _PULSE_OMEGA * sp * steps_in("pulse")
    )
    bright = 0.775 + 0.225 * np.cos(phase_b)
    hue = (n.hue0 + _HUE_RATE * sp * steps_in("hue")) % 1.0
    return {"x": x, "y": y, "log_radius": z, "log_aspect": aspect, "brightness": bright, "hue": hue}


def _hsv_colours(hue: np.ndarray, saturation: float) -> np.ndarray:
    """RGB in [0, 1] of hues ``[T]`` at value 1: shape [T, 3]."""
    k = (np.array([5.0, 3.0, 1.0])[None, :] + 6.0 * hue[:, None]) % 6.0
    return 1.0 - saturation * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)


def render(n: Nuisance, traj: dict[str, np.ndarray], size: int) -> np.ndarray:
    """uint8 ``[T, size, size, 3]`` frames of the nuisances ``n`` along the per-frame state ``traj``."""
    f32 = np.float32
    coords = np.arange(size, dtype=f32)

    def per_frame(values: np.ndarray) -> np.ndarray:
        return values.astype(f32)[:, None, None]  # [T, 1, 1]

    # Signed torus offset from the blob centre in [-size/2, size/2): size 32, centre x=30.5, pixel 1
    # -> (1 - 30.5 + 16) % 32 - 16 = 2.5 (the pixel is 2.5 px right of the centre, across the edge).
    dx = (coords[None, None, :] - per_frame(traj["x"]) + size / 2) % size - size / 2  # [T, 1, W]
    dy = (coords[None, :, None] - per_frame(traj["y"]) + size / 2) % size - size / 2  # [T, H, 1]
    radius = per_frame(np.exp(traj["log_radius"]))
    stretch = per_frame(np.exp(traj["log_aspect"]))
    u, v = dx / (radius * stretch), dy * stretch / radius  # blob coordinates: the unit disc is the blob
    mask = radius + f32(0.5) - radius * np.sqrt(u * u + v * v)  # soft edge about one pixel wide
    np.clip(mask, 0.0, 1.0, out=mask)
    # Texture in blob coordinates (it moves, grows and squashes with the blob): a grating
    # cos(a(u) + b(v) + phase) expanded as cos(a)cos(b') - sin(a)sin(b') so that cos/sin run on
    # [T, 1, W] and [T, H, 1] only, never on the full [T, H, W] grid.
    k = f32(2 * math.pi * n.tex_freq)
    a = k * math.cos(n.tex_angle) * u
    b = k * math.sin(n.tex_angle) * v + f32(n.tex_phase)
    weight = np.cos(a) * np.cos(b) - np.sin(a) * np.sin(b)
    weight *= f32(0.2)
    weight += f32(0.8)
    weight *= mask  # blob opacity times texture
    colour = _hsv_colours(traj["hue"], n.saturation) * traj["brightness"][:, None]  # [T, 3]
    centred = coords - f32((size - 1) / 2.0)
    bg_arg = centred[None, :] * math.cos(n.bg_angle) + centred[:, None] * math.sin(n.bg_angle)
    pattern = n.bg_amp * np.cos(2 * math.pi * bg_arg / n.bg_wavelength + n.bg_phase)
    background = (n.bg_level * n.bg_tint[None, None, :] + pattern[..., None]).astype(f32)  # [H, W, 3]
    # 255 and the +0.5 of rounding are folded into the small factors, not applied to the big array.
    out = weight[..., None] * (colour.astype(f32) * f32(255.0))[:, None, None, :]
    out += (f32(1.0) - mask)[..., None] * (background * f32(255.0))
    out += n.noise * f32(255.0 * n.noise_sigma) + f32(0.5)
    np.clip(out, 0.0, 255.0, out=out)
    return out.astype(np.uint8)


def render_motion_pair(
    motions: tuple[str, str], length: int, *, size: int = 32, rng: np.random.Generator
) -> np.ndarray:
    """Render ``length`` frames, ``motions[0]`` in the first half and ``motions[1]`` in the second.

    Returns uint8 ``[length, size, size, 3]``. The nuisances come from ``rng`` (same law for all motions).
    """
    if len(motions) != 2 or any(m not in MOTIONS for m in motions):
        raise ValueError(f"motions must be two names from {MOTIONS}, got {motions!r}")
    _check_int("length", length, 1)
    _check_int("size", size, 8)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy Generator, e.g. np.random.default_rng(0), got {type(rng).__name__}"
        )
    nuisance = draw_nuisance(rng, int(length), int(size))
    return render(nuisance, trajectory(nuisance, tuple(motions), int(length), int(size)), int(size))


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


class SyntheticVideos:
    """The synthetic set: ``catalog(split)`` for ids/labels/lengths, ``render(id)`` for frames.

    Ids are global: ``0..9536`` index the UCF101 train list (``train`` plus the ``val`` fraction carved
    from it by a seeded permutation), ``9537..13319`` the test list. Labels are dealt round-robin over a
    seeded permutation of each split, so they are balanced (within one) and independent of length.
    ``max_videos`` keeps the first ``max_videos`` of that permutation per split (still balanced).
    """

    def __init__(
        self,
        num_classes: int = 10,
        stride: int = 8,
        size: int = 32,
        seed: int = 0,
        max_videos: int | None = None,
        *,
        val_fraction: float = 0.1,
    ) -> None:
        self.motions = class_motions(num_classes)
        _check_int("stride", stride, 1)
        _check_int("size", size, 8)
        _check_int("seed", seed, 0)
        if max_videos is not None:
            _check_int("max_videos", max_videos, 1)
        if not 0.0 <= float(val_fraction) < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        self.num_classes = int(num_classes)
        self.stride = int(stride)
        self.size = int(size)
        self.seed = int(seed)
        self.max_videos = None if max_videos is None else int(max_videos)
        self.val_fraction = float(val_fraction)

    @functools.cached_property
    def _tables(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        train_lengths, _ = ucf101_lengths("train")
        test_lengths, _ = ucf101_lengths("test")
        n_train, n_test = len(train_lengths), len(test_lengths)
        lengths = strided(np.concatenate([train_lengths, test_lengths]), self.stride)
        rng = np.random.default_rng([self.seed, _SPLIT_SALT])
        perm = rng.permutation(n_train)
        n_val = round(self.val_fraction * n_train)
        orders = {"val": perm[:n_val], "train": perm[n_val:], "test": n_train + rng.permutation(n_test)}
        labels = np.empty(n_train + n_test, dtype=np.int64)
        for order in orders.values():
            # Round-robin over the permuted order: ranks 0, 1, ..., 12 with 10 classes get labels
            # 0, 1, ..., 9, 0, 1, 2, so any prefix is balanced within one video per class.
            labels[order] = np.arange(len(order)) % self.num_classes
        return lengths, labels, orders

    def catalog(self, split: str = "train") -> SyntheticCatalog:
        """Ids, labels and (strided) lengths of ``split`` in ``("train", "val", "test")``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        lengths, labels, orders = self._tables
        order = orders[split]
        if len(order) == 0:
            raise ValueError(f"split {split!r} is empty; construct SyntheticVideos with val_fraction > 0")
        if self.max_videos is not None:
            order = order[: self.max_videos]
        ids = np.sort(order).astype(np.int64)
        return SyntheticCatalog(ids, labels[ids], lengths[ids], self.num_classes, split)

    def label_of(self, video_id: int) -> int:
        return int(self._tables[1][self._check_id(video_id)])

    def length_of(self, video_id: int) -> int:
        return int(self._tables[0][self._check_id(video_id)])

    def _check_id(self, video_id: int) -> int:
        total = len(self._tables[0])
        if isinstance(video_id, bool) or not isinstance(video_id, (int, np.integer)):
            raise TypeError(f"video_id must be an int in [0, {total}), got {video_id!r}")
        if not 0 <= video_id < total:
            raise ValueError(
                f"video_id must be in [0, {total}) (take ids from catalog(split)), got {video_id}"
            )
        return int(video_id)

    def render(self, video_id: int) -> np.ndarray:
        """Frames of one video, uint8 ``[T, size, size, 3]`` with T = its catalog length."""
        vid = self._check_id(video_id)
        lengths, labels, _ = self._tables
        rng = np.random.default_rng([self.seed, _RENDER_SALT, vid])
        return render_motion_pair(self.motions[labels[vid]], int(lengths[vid]), size=self.size, rng=rng)
