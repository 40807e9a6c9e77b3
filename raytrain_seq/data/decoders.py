"""Decoder backends of real video, as MMAction2 offers them: PyAV, OpenCV and decord, behind one interface.

``data.decoder`` (``--decoder``) names one; ``"auto"`` takes the first of ``PREFERENCE`` that imports
here, an order measured in kept frames per CPU-second (docs/ARCHITECTURE.md, "Measurements behind the
code"; ``bench/decoder_rates.py``). Libraries are imported where used: without PyAV, ``--decoder opencv``.
Every backend keeps the same frames by ``data.video``'s rules (``selector``, ``target_size``): frame ``i``
counts decoded frames in presentation order, kept by ``stride`` or ``fps``, scaled to short side ``size``
by area averaging, uint8 RGB ``[T, H, W, 3]``; pixels differ slightly (tests/test_decoders.py bounds it).
``pyav``: one libswscale scaler a video converts kept frames only; H.264/HEVC frames neither kept nor
referenced are not decoded (``skip_frame``, ``_PyAVReader.plan``), kept ones byte for byte. ``opencv``:
``grab()`` every frame, ``retrieve()`` the kept ones, ``cv2.resize(INTER_AREA)`` (one thread in a task).
``decord``: converts every frame it decodes; resized by OpenCV. ``header``: the container's frame count
where it stores one, else 0 (``video.probe`` counts by decoding). A backend that is not installed is an
ImportError naming its ``pip install`` (``resolve``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "BACKENDS", "DECODERS", "PREFERENCE", "VideoError", "VideoInfo", "available", "exact_rate", "frames_of",
    "header", "installed", "pairs_of", "resolve", "selector", "target_size", "uses_opencv", "version",
]  # fmt: skip

BACKENDS: tuple[str, ...] = ("pyav", "opencv", "decord")
# Fastest first, as measured (docs/ARCHITECTURE.md, "Measurements behind the code").
PREFERENCE: tuple[str, ...] = ("pyav", "opencv", "decord")
DECODERS: tuple[str, ...] = ("auto", *BACKENDS)
_MODULES = {"pyav": "av", "opencv": "cv2", "decord": "decord"}
_INSTALL = {
    "pyav": "pip install av",
    "opencv": "pip install opencv-python-headless",
    "decord": "pip install decord==0.6.0 (or pip install 'raytrain_seq[decord]')",
}
# Enough for any NTSC-style rate (30000/1001) while absorbing float noise in a rate given as a float.
_MAX_RATE_DENOMINATOR = 1_000_000
_FIX = (
    "re-download or re-encode it (e.g. ffmpeg -i BAD.avi -c:v mpeg4 -q:v 2 FIXED.avi), or delete it "
    "from the split lists; the catalogs skip such files with a warning"
)


class VideoError(ValueError):
    """A video that cannot be used: missing, unreadable, corrupt or without frames.

    ``path`` and ``reason`` are attributes; the message names the file and the fix. Pickles by
    ``(path, reason)``, so it survives a trip through Ray.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = str(reason)
        super().__init__(self.path, self.reason)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}; {_FIX}"

    def __reduce__(self) -> tuple[type[VideoError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))


@dataclass(frozen=True)
class VideoInfo:
    """Header facts of one video. ``source`` is ``"container"`` or ``"decode"`` (frames were counted)."""

    frames: int
    fps: float  # average frame rate; 0.0 when the container gives none
    width: int
    height: int
    source: str = "container"


# ------------------------------------------------------------------------------------- shared rules
def exact_rate(value: float) -> Fraction:
    """A frame rate as an exact fraction: 29.97002997 -> 30000/1001 (denominators up to 10^6)."""
    return Fraction(float(value)).limit_denominator(_MAX_RATE_DENOMINATOR)


def selector(stride: int, fps: float | None, src_fps: float, path: str) -> Callable[[int], bool]:
    """``keep(i)`` for decoded frame ``i`` (``data.video``'s rule); matches ``video.output_length``."""
    if fps is None:
        return lambda i: i % stride == 0
    if src_fps <= 0:
        raise VideoError(path, "the container gives no frame rate, so it cannot be resampled to --fps")
    ratio = exact_rate(fps) / exact_rate(src_fps)
    if ratio >= 1:
        return lambda i: True
    num, den = ratio.numerator, ratio.denominator
    # floor(i * r) exactly: r = 2/5 gives (i * 2) // 5 = 0,0,0,1,1,2,... for i = 0,1,2,3,4,5,...
    return lambda i: i == 0 or (i * num) // den > ((i - 1) * num) // den


def target_size(width: int, height: int, size: int | tuple[int, int] | None) -> tuple[int, int]:
    """(width, height) to decode to. Short side 128 of 320x240: round(320 * 128 / 240) = 171 -> (171, 128)."""
    if size is None:
        return width, height
    if isinstance(size, tuple):
        return size[1], size[0]
    if width <= height:
        return size, max(1, round(height * size / width))
    return max(1, round(width * size / height)), size


# ----------------------------------------------------------------------------------- which backend
@functools.cache
def available(name: str) -> bool:
    """Whether backend ``name``'s library imports in this process."""
    if name not in BACKENDS:
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {name!r}")
    try:
        importlib.import_module(_MODULES[name])
    except (ImportError, OSError):  # OSError: a wheel whose shared libraries do not load here
        return False
    return True


def installed() -> tuple[str, ...]:
    """The backends that import here, fastest first (``PREFERENCE``)."""
    return tuple(name for name in PREFERENCE if available(name))


def resolve(name: str) -> str:
    """The backend ``name`` stands for here: ``"auto"`` -> the fastest installed one; an explicit name is
    checked. ImportError naming the ``pip install`` when it (or, for auto, every backend) is missing."""
    if name == "auto":
        found = installed()
        if not found:
            raise ImportError(
                "data.decoder='auto' found no video decoder here: install one, e.g. "
                f"{_INSTALL['opencv']} (or {_INSTALL['pyav']})"
            )
        return found[0]
    if not available(name):
        others = ", ".join(installed()) or "none"
        raise ImportError(
            f"data.decoder={name!r} but {_MODULES[name]} does not import here: {_INSTALL[name]}, or pass "
            f"--decoder auto (installed here: {others})"
        )
    return name


def version(name: str) -> str:
    """The version of backend ``name``'s library (``resolve`` first: it must be installed)."""
    return str(getattr(importlib.import_module(_MODULES[resolve(name)]), "__version__", "unknown"))


def uses_opencv(name: str) -> bool:
    """Whether backend ``name`` runs OpenCV code (its thread pool should be one thread in a task)."""
    return resolve(name) in ("opencv", "decord")


# ----------------------------------------------------------------------------------------- readers
def _counted_container(path: str) -> bool:
    """AVI (RIFF....AVI) and ISO media (....ftyp: MP4, MOV) headers store a frame count."""
    with open(path, "rb") as handle:
        head = handle.read(12)
    return (head[:4] == b"RIFF" and head[8:11] == b"AVI") or head[4:8] == b"ftyp"


def _resize(image: np.ndarray, width: int, height: int) -> np.ndarray:
    import cv2

    if (image.shape[1], image.shape[0]) == (width, height):
        return image
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)


class _Unsure(Exception):
    """The skipping decode met something its frame indices did not foresee: decode it again in full."""


# Codecs whose FFmpeg decoder drops a non-reference frame under skip_frame=NONREF (the slice header says
# whether others reference it), and whose containers give each frame's pts: B-frames of H.264 and HEVC.
_SKIPPABLE = ("h264", "hevc")


def _presentation_index(stream: Any, packets: list[Any]) -> dict[int, int] | None:
    """pts -> presentation index of each packet's frame, or None where that is not certain.

    Certain: a codec of ``_SKIPPABLE``, every packet with a pts, none flagged discard (an edit list's
    hidden frames) or corrupt, the header's count (if any) equal to the packets', and the pts equally
    spaced (a constant frame rate: no gaps, no duplicates). Then a frame's index in presentation order is
    its pts's rank, what counting a full decode's frames gives. ``_PyAVReader._next`` checks what it can
    see of this while decoding; it cannot see a damaged frame that a full decode would drop in silence
    among those skipped (the indices after it would then differ from the full decode's)."""
    if stream.codec_context.name not in _SKIPPABLE or not packets:
        return None
    if any(p.pts is None or p.is_discard or p.is_corrupt for p in packets):
        return None
    if stream.frames and stream.frames != len(packets):
        return None
    ordered = sorted(p.pts for p in packets)
    steps = {b - a for a, b in itertools.pairwise(ordered)}
    if len(steps) > 1 or 0 in steps:
        return None
    return {pts: index for index, pts in enumerate(ordered)}


class _PyAVReader:
    """PyAV: kept frames converted and scaled by libswscale in one pass, with one scaler for the whole
    video on the reader's threads (a scaler per frame, or libswscale's own thread pool, costs more CPU
    than the conversion: docs/ARCHITECTURE.md, "Measurements behind the code"). After ``plan(needed)``,
    frames that are not needed and that no frame references are not decoded at all (``skip_frame``)."""

    def __init__(self, path: str, size: Any, threads: int) -> None:
        import av
        from av.video.reformatter import VideoReformatter

        self.container = av.open(path)
        if not self.container.streams.video:
            self.container.close()
            raise VideoError(path, "the file has no video stream (not a video, or its header is corrupt)")
        stream = self.container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = threads
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        self.fps = float(rate) if rate else 0.0
        self.stream, self.size, self.threads = stream, size, threads
        self.frames = self._decode(p for p in self.container.demux(stream) if p.size)
        self.scaler = VideoReformatter()
        self.convert: dict[str, Any] = {}
        self.index: dict[int, int] | None = None  # pts -> presentation index, while skipping
        self.at, self.last = 0, -1  # while skipping: the index read() or skip() stands for; the last out
        self.total, self.decoded = 0, 0  # while skipping: the stream's frames; frames the decoder gave

    def plan(self, needed: Callable[[int], bool]) -> None:
        """Decode from here on only the frames ``needed(i)`` asks for and those they reference, when the
        indices are certain (``_presentation_index``); otherwise every frame, as before."""
        packets = [p for p in self.container.demux(self.stream) if p.size]
        index = _presentation_index(self.stream, packets)
        if index is not None and all(needed(i) for i in range(len(packets))):
            index = None  # nothing to skip
        self.index, self.total = index, len(packets)
        self.frames = self._decode(packets, needed)

    def _decode(self, packets: Iterable[Any], needed: Callable[[int], bool] | None = None) -> Iterator[Any]:
        context = self.stream.codec_context
        for packet in itertools.chain(packets, [None]):  # None: flush the frames the decoder holds back
            if packet is not None and needed is not None and self.index is not None:
                # NONREF: the decoder drops this frame only if no other frame references it.
                context.skip_frame = "DEFAULT" if needed(self.index[packet.pts]) else "NONREF"
            for frame in context.decode(packet):
                self.decoded += 1
                yield frame

    def header(self) -> tuple[int, int, int]:
        context = self.stream.codec_context
        return max(int(self.stream.frames or 0), 0), int(context.width), int(context.height)

    def skip(self) -> bool:
        if self.index is None:
            return next(self.frames, None) is not None
        if self.at >= self.total:
            return False
        self.at += 1
        return True

    def _next(self) -> Any:
        """The frame of index ``self.at``; while skipping, checks that frames come out in pts order and
        that none needed is missing (else _Unsure: the indices were wrong)."""
        if self.index is None:
            return next(self.frames, None)
        if self.at >= self.total:
            return None
        for frame in self.frames:
            got = self.index.get(frame.pts, -1) if frame.pts is not None else -1
            if not self.last < got <= self.at:  # out of order, unknown pts, or frame self.at not decoded
                raise _Unsure
            self.last = got
            if got == self.at:
                self.at += 1
                return frame
        raise _Unsure

    def read(self) -> np.ndarray | None:
        frame = self._next()
        if frame is None:
            return None
        if not self.convert:
            width, height = target_size(frame.width, frame.height, self.size)
            self.convert = {"format": "rgb24", "width": width, "height": height, "threads": self.threads}
            if (width, height) != (frame.width, frame.height):
                self.convert["interpolation"] = "AREA"
        return self.scaler.reformat(frame, **self.convert).to_ndarray()

    def close(self) -> None:
        self.container.close()


class _OpenCVReader:
    """OpenCV: ``grab()`` decodes without converting, ``retrieve()`` converts a kept frame to BGR."""

    def __init__(self, path: str, size: Any, threads: int) -> None:
        import cv2

        self.cv2 = cv2
        params = [cv2.CAP_PROP_N_THREADS, threads] if threads else []
        self.capture = cv2.VideoCapture(path, cv2.CAP_FFMPEG, params)
        if not self.capture.isOpened():
            raise VideoError(path, "cannot read it (OpenCV cannot open it: not a video, or a corrupt header)")
        self.fps = max(float(self.capture.get(cv2.CAP_PROP_FPS) or 0.0), 0.0)
        self.path, self.size, self.shape = path, size, None

    def header(self) -> tuple[int, int, int]:
        get, cv2 = self.capture.get, self.cv2
        frames = max(int(get(cv2.CAP_PROP_FRAME_COUNT) or 0), 0) if _counted_container(self.path) else 0
        return frames, int(get(cv2.CAP_PROP_FRAME_WIDTH)), int(get(cv2.CAP_PROP_FRAME_HEIGHT))

    def skip(self) -> bool:
        return bool(self.capture.grab())

    def read(self) -> np.ndarray | None:
        if not self.capture.grab():
            return None
        ok, image = self.capture.retrieve()
        if not ok or image is None:
            return None
        self.shape = self.shape or target_size(image.shape[1], image.shape[0], self.size)
        return self.cv2.cvtColor(_resize(image, *self.shape), self.cv2.COLOR_BGR2RGB)

    def close(self) -> None:
        self.capture.release()


class _DecordReader:
    """decord: ``next()`` decodes and converts every frame to RGB; kept ones are scaled by OpenCV."""

    def __init__(self, path: str, size: Any, threads: int) -> None:
        import decord

        self.reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=threads)
        self.fps = max(float(self.reader.get_avg_fps() or 0.0), 0.0)
        self.path, self.size, self.shape = path, size, None

    def header(self) -> tuple[int, int, int]:
        height, width = self.reader[0].shape[:2] if len(self.reader) else (0, 0)
        self.reader.seek(0)
        return (len(self.reader) if _counted_container(self.path) else 0), int(width), int(height)

    def skip(self) -> bool:
        return self.read_raw() is not None

    def read_raw(self) -> np.ndarray | None:
        try:
            return self.reader.next().asnumpy()
        except StopIteration:
            return None

    def read(self) -> np.ndarray | None:
        image = self.read_raw()
        if image is None:
            return None
        self.shape = self.shape or target_size(image.shape[1], image.shape[0], self.size)
        return _resize(image, *self.shape)

    def close(self) -> None:
        del self.reader


_READERS = {"pyav": _PyAVReader, "opencv": _OpenCVReader, "decord": _DecordReader}


def _library_errors(name: str) -> tuple[type[BaseException], ...]:
    """The exceptions backend ``name`` raises for a file it cannot read (mapped to VideoError)."""
    if name == "pyav":
        import av

        return (av.FFmpegError, OSError)
    if name == "decord":
        import decord

        return (decord.DECORDError, OSError, RuntimeError)
    import cv2

    return (cv2.error, OSError)


@contextlib.contextmanager
def _reading(name: str, path: str, size: Any, threads: int) -> Iterator[Any]:
    """A reader of ``path`` with backend ``name``; its library's errors become VideoError naming the file."""
    name = resolve(name)
    errors = _library_errors(name)
    if not os.path.exists(path):
        raise VideoError(path, "file not found")
    try:
        reader = _READERS[name](path, size, threads)
    except errors as exc:
        raise _open_error(path, exc) from exc
    try:
        yield reader
    except errors as exc:
        raise _open_error(path, exc) from exc
    finally:
        reader.close()


def _open_error(path: str, exc: BaseException) -> VideoError:
    if isinstance(exc, FileNotFoundError):
        return VideoError(path, "file not found")
    first = " ".join(str(exc).split())[:300]  # decord's messages carry a C++ trace over several lines
    return VideoError(path, f"cannot read it ({type(exc).__name__}: {first})")


# ------------------------------------------------------------------------------------ the decoders
def header(name: str, path: str, *, count: bool = False, threads: int = 0) -> tuple[VideoInfo, int]:
    """``(info, header_frames)`` of ``path`` with backend ``name``: ``info.frames`` is the header's count,
    or, when ``count`` or the header has none (0), the frames counted by decoding (no conversion)."""
    with _reading(name, path, None, threads) as reader:
        frames, width, height = reader.header()
        info = VideoInfo(frames=frames, fps=reader.fps, width=width, height=height)
        if not (count or frames == 0):
            return info, frames
        counted = 0
        while reader.skip():
            counted += 1
    return VideoInfo(frames=counted, fps=info.fps, width=width, height=height, source="decode"), frames


def frames_of(
    name: str,
    path: str,
    *,
    stride: int,
    fps: float | None,
    size: int | tuple[int, int] | None,
    max_frames: int | None,
    threads: int,
) -> tuple[list[np.ndarray], VideoInfo]:
    """The kept frames of ``path`` and its header from the same open (validated arguments;
    ``video.decode`` is the public entry). The header's frame count is the container's, or when it has
    none (0) the source frames this pass went through (exact unless ``max_frames`` stopped it)."""
    try:
        return _kept(name, path, stride, fps, size, max_frames, threads, skipping=True)
    except _Unsure:  # the skipping decode's indices were wrong: decode every frame instead
        logger.debug("%s: frame indices from pts not certain; decoding every frame", path)
        return _kept(name, path, stride, fps, size, max_frames, threads, skipping=False)


def _plan(reader: Any, needed: Callable[[int], bool]) -> None:
    if isinstance(reader, _PyAVReader):
        reader.plan(needed)


def _kept(
    name: str, path: str, stride: int, fps: float | None, size: Any, max_frames: int | None, threads: int,
    skipping: bool,
) -> tuple[list[np.ndarray], VideoInfo]:  # fmt: skip
    out: list[np.ndarray] = []
    with _reading(name, path, size, threads) as reader:
        keep = selector(stride, fps, reader.fps, path)
        if skipping:
            _plan(reader, keep)
        index = 0
        while True:
            if keep(index):
                image = reader.read()
                if image is None:
                    break
                out.append(image)
                if max_frames is not None and len(out) >= max_frames:
                    break
            elif not reader.skip():
                break
            index += 1
        return out, _info(reader, index)


def _info(reader: Any, passed: int) -> VideoInfo:
    """``reader``'s header; a count of 0 there becomes the ``passed`` source frames, counted by decoding."""
    frames, width, height = reader.header()
    if frames:
        return VideoInfo(frames=frames, fps=reader.fps, width=width, height=height)
    return VideoInfo(frames=passed, fps=reader.fps, width=width, height=height, source="decode")


def pairs_of(
    name: str, path: str, *, stride: int, fps: float | None, size: int | tuple[int, int] | None, threads: int
) -> tuple[list[np.ndarray], list[np.ndarray], bool, VideoInfo]:
    """``(first, second, waiting, info)`` of ``video.decode_pairs``: each kept frame and its source
    successor; ``waiting`` when the last kept frame had none; the header as ``frames_of`` gives it. Every
    frame is decoded at most once, converted at most once."""
    try:
        return _pairs(name, path, stride, fps, size, threads, skipping=True)
    except _Unsure:
        logger.debug("%s: frame indices from pts not certain; decoding every frame", path)
        return _pairs(name, path, stride, fps, size, threads, skipping=False)


def _pairs(
    name: str, path: str, stride: int, fps: float | None, size: Any, threads: int, skipping: bool
) -> tuple[list[np.ndarray], list[np.ndarray], bool, VideoInfo]:
    first: list[np.ndarray] = []
    second: list[np.ndarray] = []
    waiting = False  # the last kept frame still needs its successor
    with _reading(name, path, size, threads) as reader:
        keep = selector(stride, fps, reader.fps, path)
        if skipping:
            _plan(reader, lambda i: keep(i) or (i > 0 and keep(i - 1)))
        index = 0
        while True:
            kept = keep(index)
            if kept or waiting:
                image = reader.read()
                if image is None:
                    break
                if waiting:
                    second.append(image)
                if kept:
                    first.append(image)
                waiting = kept
            elif not reader.skip():
                break
            index += 1
        return first, second, waiting, _info(reader, index)
