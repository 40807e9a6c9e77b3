"""Real-video decoding (PyAV, OpenCV or decord: ``data.decoders``), and the catalog type shared by the readers.

``probe(path)`` reads frame count, rate and size from the container header (no decoding; a header without
a count, or ``verify=True``, counts by decoding). ``decode(path)`` returns uint8 RGB ``[T, H, W, 3]``: the
"decode, stride, resize" head of the cached partial augmentation, run on worker CPUs.
Temporal selection, frame indices counting decoded frames in presentation order: ``stride=s`` keeps
``0, s, 2s, ...`` (``strided_length`` = ``ceil(n / s)``); ``fps=f`` on a source at ``F`` keeps frame ``i``
when ``floor(i * f / F)`` increases (``resampled_length``; never duplicates a frame; the ratio is an exact
``Fraction``), so the length a catalog predicts from the header is the count ``decode`` returns.
Resize: ``size=k`` scales the short side to ``k`` (area averaging, no aliasing); ``size=(h, w)`` is exact.
Every backend keeps the same frames; ``decode_pairs`` adds each kept frame's successor (flow's pairs).
``threads``: decoder threads (0: one per core; use 1 in a one-CPU task). The reasons for the RGB path and
the rates: docs/ARCHITECTURE.md, "Measurements behind the code". Bad files raise ``VideoError(path,
reason)`` (picklable); catalogs skip them with one warning each and list them in ``VideoCatalog.skipped``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from raytrain_seq.data.decoders import (
    VideoError,
    VideoInfo,
    exact_rate,
    frames_of,
    header,
    pairs_of,
    resolve,
)

logger = logging.getLogger(__name__)

__all__ = [
    "VideoCatalog",
    "VideoError",
    "VideoInfo",
    "build_catalog",
    "decode",
    "decode_pairs",
    "decode_pairs_with_info",
    "decode_with_info",
    "list_folder",
    "output_length",
    "probe",
    "read_lines",
    "resampled_length",
    "strided_length",
    "unreadable",
]


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _rate(name: str, value: object) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, np.integer, np.floating)):
        raise TypeError(f"{name} must be a positive number of frames per second, got {value!r}")
    if not (math.isfinite(float(value)) and float(value) > 0):
        raise ValueError(f"{name} must be a positive, finite number of frames per second, got {value}")
    return exact_rate(float(value))


def strided_length(frames: int, stride: int) -> int:
    """Frames kept by ``stride``: ``ceil(frames / stride)``. 37 frames, stride 8: 0, 8, 16, 24, 32 -> 5."""
    frames = _check_int("frames", frames, 0)
    stride = _check_int("stride", stride, 1)
    return (frames + stride - 1) // stride


def resampled_length(frames: int, src_fps: float, fps: float) -> int:
    """Frames kept when resampling ``src_fps`` to ``fps`` (module docstring rule).

    ``floor((frames - 1) * fps / src_fps) + 1`` for ``fps < src_fps`` (``floor(i * r)`` climbs by at most
    one per frame, so it takes that many distinct values), else ``frames``. 10 frames, 25 -> 10 fps: 4.
    """
    frames = _check_int("frames", frames, 0)
    ratio = _rate("fps", fps) / _rate("src_fps", src_fps)
    if frames == 0 or ratio >= 1:
        return frames
    return (frames - 1) * ratio.numerator // ratio.denominator + 1


def output_length(frames: int, *, stride: int = 1, fps: float | None = None, src_fps: float = 0.0) -> int:
    """Frames ``decode(path, stride=stride, fps=fps)`` returns for ``frames`` frames at ``src_fps``."""
    _check_selection(stride, fps)
    if fps is None:
        return strided_length(frames, stride)
    return resampled_length(frames, src_fps, fps)


def _check_selection(stride: int, fps: float | None) -> None:
    _check_int("stride", stride, 1)
    if fps is not None:
        _rate("fps", fps)
        if stride != 1:
            raise ValueError(f"give stride or fps, not both (got stride={stride}, fps={fps}); set stride=1")


def probe(
    path: str | os.PathLike[str], *, verify: bool = False, threads: int = 0, decoder: str = "auto"
) -> VideoInfo:
    """Frame count, frame rate and size of the first video stream, read with ``decoder``.

    Frames come from the container header; when it has none (0) or ``verify=True``, they are counted by
    decoding (a header that disagrees with the decode is logged as a warning and the decode wins).
    Raises VideoError for a missing, unreadable or corrupt file, or one with zero frames.
    """
    path = os.fspath(path)
    threads = _check_int("threads", threads, 0)
    info, frames_in_header = header(decoder, path, count=verify, threads=threads)
    frames = info.frames
    if frames_in_header and frames != frames_in_header:
        logger.warning(
            "%s: the container says %d frames, decoding gives %d; using %d",
            path, frames_in_header, frames, frames,
        )  # fmt: skip
    if frames == 0:
        raise VideoError(path, "zero frames (the container holds a video stream with nothing decodable)")
    if info.width <= 0 or info.height <= 0:
        raise VideoError(path, f"the container gives no frame size ({info.width}x{info.height})")
    return info


def _check_size(size: object) -> int | tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(f"size must be an int (short side) or (height, width), got {size!r}")
        return (_check_int("size height", size[0], 1), _check_int("size width", size[1], 1))
    return _check_int("size (short side)", size, 1)


def decode(
    path: str | os.PathLike[str],
    *,
    stride: int = 1,
    fps: float | None = None,
    size: int | tuple[int, int] | None = None,
    max_frames: int | None = None,
    threads: int = 0,
    decoder: str = "auto",
) -> np.ndarray:
    """Decode the first video stream to uint8 RGB ``[T, H, W, 3]`` with ``decoder``.

    ``stride`` or ``fps`` selects frames (module docstring), ``size`` resizes (short side, or exact
    ``(height, width)``), ``max_frames`` stops after that many KEPT frames. Every frame gets the first
    frame's output size, so a stream that changes size mid-way still stacks. Raises VideoError for a
    missing, unreadable or corrupt file, or one that yields no frame.
    """
    frames, _ = decode_with_info(
        path, stride=stride, fps=fps, size=size, max_frames=max_frames, threads=threads, decoder=decoder
    )
    return frames


def decode_with_info(
    path: str | os.PathLike[str],
    *,
    stride: int = 1,
    fps: float | None = None,
    size: int | tuple[int, int] | None = None,
    max_frames: int | None = None,
    threads: int = 0,
    decoder: str = "auto",
) -> tuple[np.ndarray, VideoInfo]:
    """``decode``'s frames and what ``probe`` would say of the file, from one open of it (a probe first
    would open and parse the container a second time). ``info.frames`` is the header's count, or when the
    header has none the source frames counted by this decode (as ``probe`` counts them)."""
    _check_selection(stride, fps)
    size = _check_size(size)
    if max_frames is not None:
        max_frames = _check_int("max_frames", max_frames, 1)
    threads = _check_int("threads", threads, 0)
    path = os.fspath(path)
    out, info = frames_of(
        decoder, path, stride=stride, fps=fps, size=size, max_frames=max_frames, threads=threads
    )
    if not out:
        raise VideoError(path, "zero frames decoded")
    return np.stack(out), info


def decode_pairs(
    path: str | os.PathLike[str],
    *,
    stride: int = 1,
    fps: float | None = None,
    size: int | tuple[int, int] | None = None,
    threads: int = 0,
    decoder: str = "auto",
) -> tuple[np.ndarray, np.ndarray, bool]:
    """The frames ``decode`` keeps, each with the decoded frame right after it: ``(first, second, last)``.

    The optical-flow stream measures motion between CONSECUTIVE source frames (as the two-stream
    literature does) even when ``stride``/``fps`` keep only some frames: 13 frames at stride 5 keep
    0, 5, 10 and pair them with 1, 6, 11. ``first`` and ``second`` are uint8 ``[T, H, W, 3]``; when the
    last kept frame is the video's last frame it has no successor, ``second[-1]`` is that frame itself
    and ``last`` is False (the flow of that pair would be a fake zero: ``flow.pair_flow`` repeats the
    previous one instead). With stride 1 ``second[t]`` is ``first[t + 1]``, so the pairs are exactly
    the ones ``flow.compute_flow`` uses. Every frame is decoded once and converted at most once.
    """
    first, second, last, _ = decode_pairs_with_info(
        path, stride=stride, fps=fps, size=size, threads=threads, decoder=decoder
    )
    return first, second, last


def decode_pairs_with_info(
    path: str | os.PathLike[str],
    *,
    stride: int = 1,
    fps: float | None = None,
    size: int | tuple[int, int] | None = None,
    threads: int = 0,
    decoder: str = "auto",
) -> tuple[np.ndarray, np.ndarray, bool, VideoInfo]:
    """``decode_pairs``'s ``(first, second, last)`` and the header from the same open
    (``decode_with_info``)."""
    _check_selection(stride, fps)
    size = _check_size(size)
    threads = _check_int("threads", threads, 0)
    path = os.fspath(path)
    first, second, waiting, info = pairs_of(decoder, path, stride=stride, fps=fps, size=size, threads=threads)
    if not first:
        raise VideoError(path, "zero frames decoded")
    if waiting:
        second.append(first[-1])
    return np.stack(first), np.stack(second), not waiting, info


# ---------------------------------------------------------------------------------------------- catalogs


@dataclass(frozen=True, eq=False)
class VideoCatalog:
    """One split of a real data set; the same core fields as ``SyntheticCatalog``.

    ``ids`` ascending int64 (stable per data set and fold: the rank of the video in the fold's sorted
    list of all listed videos, so train and test ids never collide), ``labels`` int64 in
    ``[0, num_classes)``, ``lengths`` int64 AFTER ``stride``/``fps`` (what ``decode`` returns with the
    catalog's ``stride`` and ``fps``), ``frames`` the raw frame counts; ``paths[k]`` is the file of
    ``ids[k]``; ``class_names[label]``; ``skipped`` holds ``(path, reason)`` of each listed video that was
    left out (missing, corrupt, zero frames), in list order.
    """

    ids: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray
    num_classes: int
    split: str
    paths: tuple[str, ...]
    class_names: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    frames: np.ndarray | None = None
    stride: int = 1
    fps: float | None = None
    dataset: str = ""
    fold: int = 1

    def __post_init__(self) -> None:
        n = self.ids.shape[0] if self.ids.ndim == 1 else -1
        shapes_ok = self.ids.shape == self.labels.shape == self.lengths.shape and n >= 0
        if not shapes_ok or len(self.paths) != n or (self.frames is not None and self.frames.shape != (n,)):
            raise ValueError(
                f"ids, labels, lengths, frames and paths must be 1-D of one length, got {self.ids.shape}, "
                f"{self.labels.shape}, {self.lengths.shape}, "
                f"{None if self.frames is None else self.frames.shape}, {len(self.paths)}"
            )
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"class_names has {len(self.class_names)} names for {self.num_classes} classes")

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def path_of(self, video_id: int) -> str:
        """The file of ``video_id`` (one of ``ids``)."""
        k = int(np.searchsorted(self.ids, video_id))
        if k == len(self.ids) or self.ids[k] != video_id:
            raise ValueError(f"video id {video_id} is not in this {self.split} catalog; take ids from .ids")
        return self.paths[k]


def unreadable(path: str | os.PathLike[str], exc: OSError) -> ValueError:
    """The one-line error of a list file or folder the job may not read (no permission, an I/O error)."""
    return ValueError(
        f"{os.fspath(path)}: cannot read it ({exc.strerror or exc}): make the data root readable by the "
        "user the job runs as (e.g. chmod -R a+rX DATA_ROOT), or pass another --data-root"
    )


def list_folder(path: str | os.PathLike[str]) -> list[os.DirEntry]:
    """The entries of a data folder; ValueError naming it when it cannot be listed."""
    try:
        with os.scandir(path) as entries:
            return list(entries)
    except OSError as exc:
        raise unreadable(path, exc) from exc


def read_lines(path: str, what: str, fix: str) -> list[tuple[int, str]]:
    """Non-blank lines of a list file as ``(line_number, stripped_text)``; ValueError naming the file if it
    is missing, unreadable or not text."""
    if not os.path.isfile(path):
        raise ValueError(f"{what} not found: {path}; {fix}")
    try:
        with open(path, encoding="utf-8-sig") as handle:  # -sig: tolerate a byte-order mark
            text = handle.read()
    except OSError as exc:
        raise unreadable(path, exc) from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a text {what} ({exc.reason}): {fix}") from exc
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _probe_or_error(path: str, verify: bool, decoder: str) -> VideoInfo | VideoError:
    try:
        return probe(path, verify=verify, decoder=decoder)
    except VideoError as exc:  # the caller logs it once and records it in `skipped`
        return exc


def build_catalog(
    entries: Sequence[tuple[int, int, str]],
    *,
    class_names: Sequence[str],
    split: str,
    dataset: str,
    fold: int,
    stride: int = 1,
    fps: float | None = None,
    verify: bool = False,
    workers: int = 4,
    warn: bool = True,
    decoder: str = "auto",
) -> VideoCatalog:
    """Probe ``(video_id, label, path)`` entries (ids ascending) into a catalog, skipping bad videos.

    Each bad video (VideoError from ``probe``, or no frame rate when ``fps`` is set) gets exactly one
    warning naming the file and an entry in ``skipped``. ValueError if no video is left. ``warn=False``
    logs the skips at DEBUG, for a process that rebuilds a catalog another one already warned about.
    ``decoder`` reads the headers (``"auto"``: the fastest installed backend; use the backend that will
    decode the videos, so the lengths are the counts it returns).
    """
    _check_selection(stride, fps)
    workers = _check_int("workers", workers, 1)
    decoder = resolve(decoder)  # a missing backend fails here, once, not per video
    paths = [path for _, _, path in entries]
    # Threads overlap the header reads (the decoders release the GIL); results come back in list order.
    with ThreadPoolExecutor(max_workers=workers) as pool:
        infos = list(pool.map(lambda p: _probe_or_error(p, verify, decoder), paths))
    kept: list[tuple[int, int, str, int, int]] = []
    skipped: list[tuple[str, str]] = []
    for (video_id, label, path), info in zip(entries, infos, strict=True):
        if isinstance(info, VideoInfo) and fps is not None and info.fps <= 0:
            info = VideoError(path, "the container gives no frame rate, so it cannot be resampled to --fps")
        if isinstance(info, VideoError):
            logger.log(logging.WARNING if warn else logging.DEBUG, "skipping video %s: %s", path, info.reason)
            skipped.append((path, info.reason))
            continue
        length = output_length(info.frames, stride=stride, fps=fps, src_fps=info.fps)
        kept.append((video_id, label, path, info.frames, length))
    if not kept:
        raise ValueError(
            f"{dataset} fold {fold} {split}: none of the {len(entries)} listed videos could be read "
            f"(e.g. {skipped[0][0] if skipped else 'none listed'}); check --data-root"
        )
    logger.info("%s fold %d %s: %d videos, %d skipped", dataset, fold, split, len(kept), len(skipped))

    def column(k: int) -> np.ndarray:
        return np.asarray([row[k] for row in kept], dtype=np.int64)

    return VideoCatalog(
        ids=column(0),
        labels=column(1),
        lengths=column(4),
        num_classes=len(class_names),
        split=split,
        paths=tuple(row[2] for row in kept),
        class_names=tuple(class_names),
        skipped=tuple(skipped),
        frames=column(3),
        stride=stride,
        fps=None if fps is None else float(fps),
        dataset=dataset,
        fold=fold,
    )
