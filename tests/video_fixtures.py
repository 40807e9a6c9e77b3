"""Miniature UCF101 and HMDB51 in their official layouts, with real videos that PyAV encodes here.

Videos are tiny (32x24, 6 to 20 frames, mpeg4 in AVI like the real sets) and deterministic: every frame
of a class-``c`` clip is filled with ``class_colour(c)`` except a white 6x6 square that moves 2 px per
frame in the class's direction (``class_motion``: right, down, up, then diagonals), so a test can tell
classes apart from decoded pixels (the per-channel median is the class colour) or from optical flow,
and frames apart from the square's position. ``ramp_frames`` makes frame ``i`` a flat grey
``8 + 12 i``, so ``frame_indices`` recovers which source frames a decode kept.

Split schemes (simplified, stated so a test never mistakes them for the real ones):

* UCF101: the real set has 25 groups per class and fold k tests groups ``7k-6 .. 7k`` (groups 22-25 always
  train). Here ``groups`` groups, fold k tests the k-th run of ``test_groups_per_fold`` consecutive groups
  (default ``groups // 3``: with 6 groups, fold 1 tests groups 1-2, fold 2 groups 3-4, fold 3 groups 5-6;
  ``groups=25, test_groups_per_fold=7`` reproduces the real scheme). List files use CRLF like the real ones.
* HMDB51: the real files mark 70 train, 30 test and the rest unused per class. Here video ``j`` of class
  ``c`` in fold k gets flag ``[1, 1, 1, 2, 2, 0][(j + c + 2(k-1)) % 6]`` (3 train, 2 test, 1 unused per 6),
  lines written ``"<video>.avi <flag> "`` with the trailing space of the real files.

``MiniDataset`` records what was written (labels, frame counts, split membership), independently of the
readers, so tests compare the readers against it.
"""

from __future__ import annotations

import colorsys
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np

UCF_CLASSES = (
    "ApplyEyeMakeup", "ApplyLipstick", "Archery", "BabyCrawling", "BalanceBeam",
    "BandMarching", "BaseballPitch", "Basketball", "BasketballDunk", "BenchPress",
)  # fmt: skip
HMDB_CLASSES = (
    "brush_hair", "cartwheel", "catch", "chew", "clap",
    "climb", "climb_stairs", "dive", "draw_sword", "dribble",
)  # fmt: skip
_PALETTE = ((220, 40, 40), (40, 200, 60), (50, 70, 230), (230, 200, 40), (200, 60, 210), (40, 210, 220))
_HMDB_FLAGS = (1, 1, 1, 2, 2, 0)
# Per class (label % 4): right, down, up, down-right. No class moves left, so a horizontally flipped
# clip (training flips at random) never looks like another class's motion.
_MOTIONS = ((2, 0), (0, 2), (0, -2), (2, 2))
HEIGHT, WIDTH = 24, 32


def class_colour(label: int) -> tuple[int, int, int]:
    """A saturated RGB colour per class, far from the others (hue steps beyond the fixed palette)."""
    if label < len(_PALETTE):
        return _PALETTE[label]
    r, g, b = colorsys.hsv_to_rgb((label * 0.381966) % 1.0, 0.8, 0.85)
    return round(r * 255), round(g * 255), round(b * 255)


def class_motion(label: int) -> tuple[int, int]:
    """(dx, dy) pixels per frame of the white square in class ``label``'s clips (y down)."""
    return _MOTIONS[label % len(_MOTIONS)]


def clip_frames(
    label: int,
    frames: int,
    *,
    height: int = HEIGHT,
    width: int = WIDTH,
    colour: tuple[int, int, int] | None = None,
) -> np.ndarray:
    """uint8 ``[frames, height, width, 3]``: the class colour (or ``colour``) with a white square moving
    by ``class_motion``.

    Positions wrap: frame i puts the square's corner at ``x = (dx * i) mod (width - 6)``, ``y = (2 + dy * i)
    mod (height - 6)``; class 0 (right) at 32 px wide: x = 0, 2, 4, ..., 24, then 0 again.
    """
    out = np.empty((frames, height, width, 3), dtype=np.uint8)
    out[:] = class_colour(label) if colour is None else colour
    dx, dy = class_motion(label)
    for i in range(frames):
        x, y = (dx * i) % (width - 6), (2 + dy * i) % (height - 6)
        out[i, y : y + 6, x : x + 6] = 255
    return out


def ramp_frames(frames: int, *, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """Frame ``i`` is flat grey ``8 + 12 i`` (``frames <= 20``), so its index survives lossy coding."""
    if not 1 <= frames <= 20:
        raise ValueError(f"ramp_frames supports 1..20 frames (grey must stay <= 255), got {frames}")
    return np.broadcast_to(
        (8 + 12 * np.arange(frames, dtype=np.uint8))[:, None, None, None], (frames, height, width, 3)
    ).copy()


def frame_indices(decoded: np.ndarray) -> list[int]:
    """Source indices of decoded ``ramp_frames`` (inverse of ``8 + 12 i``, from each frame's mean)."""
    return [round((float(f.mean()) - 8.0) / 12.0) for f in decoded]


def write_video(
    path: str | os.PathLike[str], frames: np.ndarray, fps: int = 25, codec: str = "mpeg4"
) -> Path:
    """Encode uint8 RGB ``[T, H, W, 3]`` (even H and W) to ``path`` with PyAV; parent folders are created."""
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {frames.shape}")
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise ValueError(f"yuv420p needs even height and width, got {frames.shape[1]}x{frames.shape[2]}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = 4_000_000  # far above what 32x24 needs: quantiser at its finest, little loss
        container.start_encoding()  # writes the header even when there are no frames
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path


def plant_corrupt(path: str | os.PathLike[str], *, nbytes: int = 3000, seed: int = 0) -> None:
    """Overwrite ``path`` with an AVI-looking RIFF header followed by random bytes."""
    junk = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    Path(path).write_bytes(b"RIFF" + struct.pack("<I", nbytes + 4) + b"AVI LIST" + junk)


def plant_zero_frame(path: str | os.PathLike[str], fps: int = 25) -> None:
    """Overwrite ``path`` with a valid AVI that has a video stream and no frame."""
    write_video(path, np.zeros((0, HEIGHT, WIDTH, 3), dtype=np.uint8), fps=fps)


def plant_truncated(path: str | os.PathLike[str]) -> None:
    """Cut an AVI right after its ``movi`` tag: the header (frame count, size, rate) still reads, but no
    frame decodes, like a download that stopped early. ``probe`` succeeds and ``decode`` finds zero frames.
    """
    data = Path(path).read_bytes()
    at = data.find(b"movi")
    if at < 0:
        raise ValueError(f"{path} has no 'movi' list; is it an AVI written by write_video?")
    Path(path).write_bytes(data[: at + 4])


def plant_header_frames(path: str | os.PathLike[str], frames: int) -> None:
    """Make an AVI's header lie: set the video stream's ``dwLength`` (its frame count) to ``frames``.

    ``dwLength`` is the 10th little-endian uint32 of the ``strh`` chunk body: after fccType,
    fccHandler, dwFlags, wPriority+wLanguage, dwInitialFrames, dwScale, dwRate, dwStart, i.e. at byte
    ``strh_offset + 8 + 32`` (8 = the chunk's id and size).
    """
    data = bytearray(Path(path).read_bytes())
    at = data.find(b"strh")
    if at < 0 or data[at + 8 : at + 12] != b"vids":
        raise ValueError(f"{path} has no video 'strh' chunk; is it an AVI written by write_video?")
    struct.pack_into("<I", data, at + 8 + 32, frames)
    Path(path).write_bytes(bytes(data))


@dataclass
class MiniDataset:
    """What ``make_mini_*`` wrote: ``videos[rel] = (label, frames)``; per-fold ``train``/``test`` rels."""

    root: Path
    class_names: tuple[str, ...]
    videos: dict[str, tuple[int, int]] = field(default_factory=dict)
    train: dict[int, list[str]] = field(default_factory=dict)
    test: dict[int, list[str]] = field(default_factory=dict)
    video_dir: str = ""
    val: list[str] = field(default_factory=list)  # make_mini_list's val.txt

    def path(self, rel: str) -> str:
        return os.path.join(self.root, self.video_dir, *rel.split("/"))


def _length(label: int, a: int, b: int) -> int:
    """A deterministic length in 6..20 that varies with class, group/video and clip."""
    return 6 + (7 * label + 3 * a + 5 * b) % 15


def make_mini_ucf101(
    root: str | os.PathLike[str],
    classes: int = 3,
    groups: int = 6,
    clips: int = 2,
    *,
    test_groups_per_fold: int | None = None,
    fps: int = 25,
    colours: str = "class",
) -> MiniDataset:
    """UCF-101/<Class>/v_<Class>_gXX_cYY.avi plus ucfTrainTestlist/ (classInd, train/testlist01..03).

    ``colours="class"``: every clip of a class has its colour, so one frame tells the class. ``"clip"``:
    clip ``gXX_cYY`` takes palette colour ``(XX + YY) % 6`` whatever its class, so only the square's
    motion does (a set a model must learn over frames; with 4 classes at most, as there are 4 motions).
    """
    if colours not in ("class", "clip"):
        raise ValueError(f"colours must be 'class' or 'clip', got {colours!r}")
    if colours == "clip" and classes > len(_MOTIONS):
        raise ValueError(f"colours='clip' tells classes by motion alone: at most {len(_MOTIONS)} classes")
    if not 1 <= classes <= len(UCF_CLASSES):
        raise ValueError(f"classes must be in 1..{len(UCF_CLASSES)}, got {classes}")
    per_fold = groups // 3 if test_groups_per_fold is None else test_groups_per_fold
    if per_fold < 1 or 3 * per_fold > groups:
        raise ValueError(f"need 1 <= test_groups_per_fold and 3 * it <= groups, got {per_fold} of {groups}")
    root = Path(root)
    ds = MiniDataset(root, UCF_CLASSES[:classes], video_dir="UCF-101")
    for label, name in enumerate(ds.class_names):
        for g in range(1, groups + 1):
            for c in range(1, clips + 1):
                rel = f"{name}/v_{name}_g{g:02d}_c{c:02d}.avi"
                n = _length(label, g, c)
                colour = None if colours == "class" else _PALETTE[(g + c) % len(_PALETTE)]
                write_video(ds.path(rel), clip_frames(label, n, colour=colour), fps=fps)
                ds.videos[rel] = (label, n)
    lists = root / "ucfTrainTestlist"
    lists.mkdir(parents=True, exist_ok=True)
    crlf = "\r\n"
    (lists / "classInd.txt").write_bytes(
        "".join(f"{k + 1} {name}{crlf}" for k, name in enumerate(ds.class_names)).encode()
    )
    for fold in (1, 2, 3):
        test_groups = range(per_fold * (fold - 1) + 1, per_fold * fold + 1)
        ds.train[fold] = [rel for rel in ds.videos if int(rel.split("_g")[-1][:2]) not in test_groups]
        ds.test[fold] = [rel for rel in ds.videos if int(rel.split("_g")[-1][:2]) in test_groups]
        train_text = "".join(f"{rel} {ds.videos[rel][0] + 1}{crlf}" for rel in ds.train[fold])
        (lists / f"trainlist0{fold}.txt").write_bytes(train_text.encode())
        (lists / f"testlist0{fold}.txt").write_bytes(
            "".join(f"{rel}{crlf}" for rel in ds.test[fold]).encode()
        )
    return ds


def make_mini_hmdb51(
    root: str | os.PathLike[str], classes: int = 3, videos_per_class: int = 6, *, fps: int = 25
) -> MiniDataset:
    """<class>/<video>.avi plus testTrainMulti_7030_splits/<class>_test_split{1,2,3}.txt."""
    if not 1 <= classes <= len(HMDB_CLASSES):
        raise ValueError(f"classes must be in 1..{len(HMDB_CLASSES)}, got {classes}")
    root = Path(root)
    ds = MiniDataset(root, HMDB_CLASSES[:classes])  # already sorted, so label = folder rank
    names: dict[int, list[str]] = {}
    for label, name in enumerate(ds.class_names):
        names[label] = [f"clip{j:02d}_{name}_u_nm_np1_fr_med_{j}.avi" for j in range(videos_per_class)]
        for j, video in enumerate(names[label]):
            n = _length(label, j, 1)
            write_video(ds.path(f"{name}/{video}"), clip_frames(label, n), fps=fps)
            ds.videos[f"{name}/{video}"] = (label, n)
    splits = root / "testTrainMulti_7030_splits"
    splits.mkdir(parents=True, exist_ok=True)
    for fold in (1, 2, 3):
        ds.train[fold], ds.test[fold] = [], []
        for label, name in enumerate(ds.class_names):
            lines = []
            for j, video in enumerate(names[label]):
                flag = _HMDB_FLAGS[(j + label + 2 * (fold - 1)) % len(_HMDB_FLAGS)]
                lines.append(f"{video} {flag} \n")
                if flag:
                    (ds.train if flag == 1 else ds.test)[fold].append(f"{name}/{video}")
            (splits / f"{name}_test_split{fold}.txt").write_text("".join(lines))
    return ds


# ------------------------------------------------------------------------------ annotation-list set
# (extension, PyAV encoder) of each container the list dataset reads: H.264 in .mp4, .mkv and .mov,
# MPEG-4 Part 2 in .avi, VP8 in .webm.
CONTAINERS = {"mp4": "libx264", "avi": "mpeg4", "mkv": "libx264", "webm": "libvpx", "mov": "libx264"}
LIST_CLASSES = ("jump", "run", "wave")


def make_mini_list(
    root: str | os.PathLike[str], *, train: int = 4, val: int = 1, test: int = 2, ext: str = "mp4"
) -> MiniDataset:
    """``videos/<class>/clip<NN>.<ext>`` (H.264 .mp4 by default) and MMAction2-style annotation lists
    ``train.txt``, ``val.txt``, ``test.txt`` (``"videos/<class>/clipNN.<ext> <label>"``, with a comment
    line and a blank line) and ``classes.txt`` under ``root``; ``train``/``val``/``test`` clips per class.
    ``ds.train[1]``, ``ds.test[1]`` and ``ds.val`` hold the relative paths of each list."""
    root = Path(root)
    ds = MiniDataset(root, LIST_CLASSES)
    sides: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for label, name in enumerate(LIST_CLASSES):
        counts = (("train", train), ("val", val), ("test", test))
        numbers = iter(range(train + val + test))
        for side, count in counts:
            for _ in range(count):
                k = next(numbers)
                rel = f"videos/{name}/clip{k:02d}.{ext}"
                n = _length(label, k, 1)
                write_video(root / rel, clip_frames(label, n), codec=CONTAINERS[ext])
                ds.videos[rel] = (label, n)
                sides[side].append(rel)
    for side, rels in sides.items():
        lines = ["# path label", *(f"{rel} {ds.videos[rel][0]}" for rel in rels[:1]), "", *(
            f"{rel} {ds.videos[rel][0]}" for rel in rels[1:]
        )]  # fmt: skip
        (root / f"{side}.txt").write_text("\n".join(lines) + "\n")
    (root / "classes.txt").write_text("\n".join(LIST_CLASSES) + "\n")
    ds.train[1], ds.test[1], ds.val = sides["train"], sides["test"], sides["val"]
    return ds
