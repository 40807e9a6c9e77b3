"""Video sources of the refurbishing pipeline: the synthetic set and real videos (UCF101, HMDB51, lists).

A source gives the feed its catalogs (``catalogs``) and a task worker one video's partial augmentation
(``load``: decode with ``data.decoder``, resolved once by ``source_kwargs``; resize to the cache size;
``partial_augment`` seeded by ``seeds.partial_rng(seed, video, computing epoch)``, so a recompute
anywhere gives the same bytes; epoch None is the deterministic evaluation resize). ``get_source`` keeps
one per process and configuration; the task bodies that call it are ``data.task_bodies``. Flow is
computed once per video over the whole frame (``RealVideos.flow``: each kept frame and its successor)
and a window of it cut per refurbish at ``flow_offset``. Contract: ``window(whole-frame flow, offset)``.
Bad videos: unreadable at catalog time, skipped and listed; failing inside a task, an all-zero clip of
the catalog length, a warning, and ``stats()["videos"]["skipped"]``; a decoded length that differs from
the catalog's is trimmed or padded to it (``fit_length``). Which videos train, validate and test:
``data.splits``. Catalogs: ``data.geometry.load_catalogs``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from typing import Any

import numpy as np

from raytrain_seq.algorithms.augment import partial_augment, rand_augment, resize_video
from raytrain_seq.config import DataConfig, RunSetupError
from raytrain_seq.data.flow import flow_window
from raytrain_seq.data.frame_cache import FrameCache, default_folder
from raytrain_seq.data.splits import SPLITS, balanced_subset, catalog_subset, clip_group, holdout
from raytrain_seq.seeds import partial_rng

logger = logging.getLogger(__name__)

__all__ = [
    "CHANNELS", "RealVideos", "SyntheticSource", "fit_length", "flow_offset", "get_source",
    "render_size", "source_kwargs",
]  # fmt: skip

CHANNELS = {"rgb": 3, "flow": 2}
_REAL_FIELDS = (
    "dataset", "data_root", "split", "stream", "num_classes", "max_videos", "stride", "fps", "seed",
    "val_fraction", "train_list", "test_list", "val_list", "class_names", "decoder", "frame_cache_gib",
    "frame_cache_dir",
)  # fmt: skip
_LIST_FILES = ("train_list", "test_list", "val_list", "class_names")
_LOGGED_FIRST = 5  # per worker process: the first few length fixes are logged, then every 100th


def render_size(data: DataConfig) -> int:
    """Side at which the synthetic set is rendered: the cache size (>= 8, the renderer's minimum), so the
    partial augmentation's resize is the identity and only the random transform costs CPU."""
    return max(8, data.cache_size)


def source_kwargs(data: DataConfig) -> tuple[tuple[str, Any], ...]:
    """The hashable arguments of ``get_source`` for a config's ``data`` section (what a task needs to find
    its videos)."""
    if data.stream == "fuse":
        raise ValueError(
            "data.stream='fuse' evaluates two finished runs and has no video source of its own: build the "
            "feed from each run's config (runtime.fuse.run_fuse does)"
        )
    if data.dataset == "synthetic":
        fields = ("num_classes", "stride", "seed", "max_videos", "val_fraction")
        return (
            *((name, getattr(data, name)) for name in fields),
            ("size", render_size(data)),
            ("randaugment", (data.randaugment_ops, data.randaugment_magnitude)),
        )
    # "~" is expanded here, in the driver, so every worker opens the same absolute path.
    values = {name: getattr(data, name) for name in _REAL_FIELDS}
    values["data_root"] = os.path.abspath(os.path.expanduser(values["data_root"]))
    values["randaugment"] = (data.randaugment_ops, data.randaugment_magnitude)
    values["decoder"] = _decoder(data.decoder)
    if data.dataset == "list":
        from raytrain_seq.data.video_list import resolve_list

        for name in _LIST_FILES:
            if values[name] is not None:
                values[name] = resolve_list(values[name], values["data_root"])
    return tuple(values.items())


def _decoder(name: str) -> str:
    """``data.decoder`` resolved here ("auto": the fastest installed), so the catalog's probes and every
    task's decodes use one backend; a backend that is not installed stops the run with the fix."""
    from raytrain_seq.data.decoders import resolve

    try:
        return resolve(name)
    except ImportError as exc:
        raise RunSetupError(str(exc)) from exc


@functools.lru_cache(maxsize=4)
def get_source(kwargs: tuple[tuple[str, Any], ...]) -> SyntheticSource | RealVideos:
    """One video source per process and configuration (a task worker decodes many videos)."""
    options = dict(kwargs)
    if "dataset" in options:
        return RealVideos(**options)
    return SyntheticSource(**options)


def flow_offset(seed: int, video: int, epoch: int | None) -> float | None:
    """Where the flow stream's window of ``video`` sits in ``epoch`` (None: evaluation, the centre).

    The first draw of ``partial_rng(seed, video, epoch)``, the same draw ``partial_augment`` places the
    RGB window with, so both streams of one (seed, video, epoch) cut the same window.
    """
    return None if epoch is None else float(partial_rng(seed, video, epoch).uniform(0.0, 1.0))


def fit_length(frames: np.ndarray, length: int) -> np.ndarray:
    """``frames`` cut or padded (last frame repeated) to ``length`` frames along axis 0.

    The packing plan was made from catalog lengths, so the cached array must have exactly that many
    frames. 5 frames f0..f4 to 7: f0..f4, f4, f4; to 3: f0, f1, f2. A repeated last frame (not a black
    one) keeps the sequence's end still rather than adding a cut the model would read as an event.
    """
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ValueError(f"length must be an int >= 1 (a catalog length), got {length!r}")
    if frames.shape[0] < 1:
        raise ValueError("fit_length needs at least one frame to repeat; got an empty array")
    if frames.shape[0] >= length:
        return frames[:length]
    pad = np.repeat(frames[-1:], length - frames.shape[0], axis=0)
    return np.concatenate([frames, pad])


# --------------------------------------------------------------------------------------------- synthetic
class SyntheticSource:
    """The built-in synthetic set (``data.synthetic``) behind the same ``catalogs``/``load`` interface."""

    flow_method = None

    def __init__(self, *, randaugment: tuple[int, int] = (0, 9), **kwargs: Any) -> None:
        from raytrain_seq.data.synthetic import SyntheticVideos

        self.videos = SyntheticVideos(**kwargs)
        self.num_classes = int(kwargs["num_classes"])
        self.randaugment = randaugment

    def catalogs(self, *, warn: bool = True) -> dict[str, Any]:
        return {
            "catalogs": {split: self.videos.catalog(split) for split in SPLITS},
            "class_names": [str(c) for c in range(self.num_classes)],
            "skipped": [],
        }

    def load(self, video: int, epoch: int | None, seed: int, size: int) -> tuple[np.ndarray, dict]:
        frames = self.videos.render(video)
        if epoch is None:
            return resize_video(frames, size), {}
        return partial(frames, size, partial_rng(seed, video, epoch), self.randaugment), {}


def partial(
    frames: np.ndarray, size: int, rng: np.random.Generator, randaugment: tuple[int, int]
) -> np.ndarray:
    """A training video's partial augmentation: ``partial_augment`` (window, colour), then ``randaugment``
    = (operations, magnitude) of ``rand_augment`` when operations > 0, both from the one ``rng``."""
    out = partial_augment(frames, size=size, rng=rng)
    ops, magnitude = randaugment
    return rand_augment(out, ops=ops, magnitude=magnitude, rng=rng) if ops else out


# ------------------------------------------------------------------------------------------ real videos
class RealVideos:
    """UCF101, HMDB51 or annotation lists under ``data_root``: catalogs for the feed, ``load`` for the
    task workers."""

    def __init__(
        self,
        *,
        dataset: str,
        data_root: str,
        split: int,
        stream: str,
        num_classes: int | None,
        max_videos: int | None,
        stride: int,
        fps: float | None,
        seed: int,
        val_fraction: float,
        train_list: str | None = None,
        test_list: str | None = None,
        val_list: str | None = None,
        class_names: str | None = None,
        decoder: str = "auto",
        randaugment: tuple[int, int] = (0, 9),
        frame_cache_gib: float = 0,
        frame_cache_dir: str | None = None,
    ) -> None:
        if dataset not in ("ucf101", "hmdb51", "list"):
            raise ValueError(f"dataset must be 'ucf101', 'hmdb51' or 'list' for real videos, got {dataset!r}")
        if stream not in CHANNELS:
            raise ValueError(f"stream must be one of {sorted(CHANNELS)} for a video source, got {stream!r}")
        self.dataset, self.data_root, self.fold, self.stream = dataset, data_root, split, stream
        self.num_classes, self.max_videos = num_classes, max_videos
        self.stride, self.fps, self.seed, self.val_fraction = stride, fps, seed, val_fraction
        self.lists = {"train": train_list, "val": val_list, "test": test_list}
        self.class_names_file = class_names
        self.decoder = _decoder(decoder)
        self.randaugment = randaugment  # (operations, magnitude) of the partial augmentation
        self.channels = CHANNELS[stream]
        self._refits = 0  # length fixes in this process, for the rate limit of their warnings
        # The RGB stream's decoded frames, kept on this node's disk (data/frame_cache.py); the flow stream
        # keeps each video's flow for the run instead (runtime/feed_tasks.py, flow once).
        self.frame_cache = FrameCache(
            frame_cache_dir if frame_cache_dir is not None else default_folder(),
            int(frame_cache_gib * 2**30) if stream == "rgb" else 0,
        )

    @property
    def flow_method(self) -> str | None:
        """The optical flow algorithm this process uses ("tvl1" or "farneback"); None for RGB."""
        if self.stream != "flow":
            return None
        from raytrain_seq.data.flow import flow_method

        return flow_method()

    @functools.cached_property
    def _lists(self) -> tuple[tuple[str, ...], dict[str, list[tuple[int, int, str]]]]:
        """Class names and the fold's entries from the list files (no video is opened)."""
        if self.dataset == "list":
            from raytrain_seq.data.video_list import list_entries

            return list_entries(self.data_root, self.lists, self.class_names_file)
        if self.dataset == "ucf101":
            from raytrain_seq.data.ucf101 import ucf101_entries as entries
        else:
            from raytrain_seq.data.hmdb51 import hmdb51_entries as entries
        return entries(self.data_root, self.fold)

    @functools.cached_property
    def paths(self) -> dict[int, str]:
        """Video id -> file, for both sides of the fold."""
        return {video: path for side in self._lists[1].values() for video, _, path in side}

    def catalogs(self, *, warn: bool = True) -> dict[str, Any]:
        """Probe the chosen classes' videos: train/val/test catalogs, class names and skipped paths."""
        from raytrain_seq.data.video import build_catalog

        names, lists = self._lists
        k = len(names) if self.num_classes is None else self.num_classes
        if k > len(names):
            raise ValueError(
                f"data.num_classes={k} but {self.dataset} under {self.data_root} has {len(names)} classes: "
                f"pass --num-classes <= {len(names)} (or leave it out for all of them)"
            )
        options = {
            "dataset": self.dataset, "fold": self.fold, "stride": self.stride, "fps": self.fps,
            "decoder": self.decoder,
        }  # fmt: skip
        built = {
            side: build_catalog(
                [e for e in lists[side] if e[1] < k],
                class_names=names[:k],
                split=side,
                workers=8,
                warn=warn,
                **options,
            )
            for side in lists  # "train", "test", and "val" for a --val-list
        }
        parts = self._with_validation(built)
        train = built["train"]
        catalogs = {
            split: catalog_subset(c, balanced_subset(c.labels, self.max_videos, self.seed), split)
            for split, c in parts.items()
        }
        missing = sorted(set(range(k)) - set(catalogs["train"].labels.tolist()))
        if missing:
            raise ValueError(
                f"{self.dataset}: classes {[names[c] for c in missing[:5]]} have no training video left "
                f"(max_videos={self.max_videos}, {len(train)} readable training videos): raise "
                f"--max-videos to >= {k} or lower --num-classes"
            )
        skipped = [path for side in built.values() for path, _ in side.skipped]
        return {"catalogs": catalogs, "class_names": list(names[:k]), "skipped": skipped}

    def _with_validation(self, built: dict[str, Any]) -> dict[str, Any]:
        """train/val/test: the val list's catalog when there is one, else whole groups held out of train."""
        if "val" in built:
            return {split: built[split] for split in SPLITS}
        train = built["train"]
        val_mask = holdout(train.labels, [clip_group(p) for p in train.paths], self.val_fraction, self.seed)
        if not val_mask.any():
            raise ValueError(
                f"{self.dataset}: no validation video could be held out of {len(train)} training videos "
                "(every class has a single group or video): raise data.val_fraction or use more videos"
                + (", or pass --val-list FILE" if self.dataset == "list" else "")
            )
        return {
            "train": catalog_subset(train, np.flatnonzero(~val_mask), "train"),
            "val": catalog_subset(train, np.flatnonzero(val_mask), "val"),
            "test": built["test"],
        }

    def load(self, video: int, epoch: int | None, seed: int, size: int) -> tuple[np.ndarray, dict]:
        """uint8 ``[catalog length, size, size, C]`` of ``video`` and a report (``failed``/``refit``).

        Flow: ``flow_window(self.flow(video, size), size, flow_offset(seed, video, epoch))``, the bytes the
        feed's two tasks give; RGB: decode, then ``partial_augment`` (epoch None: the centred resize).
        """
        if self.stream == "flow":
            flow, report = self.flow(video, size)
            return flow_window(flow, size, flow_offset(seed, video, epoch)), report
        cache = dataclasses.replace(self.frame_cache.stats)
        began = time.process_time()
        rgb, report = self._rgb(video, size)
        if isinstance(rgb, int):  # the decode failed: a zero clip of the catalog length
            return np.zeros((rgb, size, size, self.channels), np.uint8), report
        decoded = time.process_time()
        if epoch is None:
            out = resize_video(rgb, size)
        else:
            out = partial(rgb, size, partial_rng(seed, video, epoch), self.randaugment)
        now, stats = time.process_time(), self.frame_cache.stats
        read = stats.read_cpu_s - cache.read_cpu_s
        report["stages"] = {
            "cache_read": read,
            "decode": decoded - began - read,  # the probe, and the decode of a miss
            "partial_augment": now - decoded,
        }
        report["frame_cache"] = {"hits": stats.hits - cache.hits, "misses": stats.misses - cache.misses}
        return out, report

    def _rgb(self, video: int, size: int) -> tuple[np.ndarray | int, dict]:
        """``video``'s frames at short side ``size`` and catalog length, through the frame cache (a hit
        opens no video: the cached frames are fitted already), and the report (failed, refit). When the
        decode fails: the catalog length instead of frames (nothing is cached)."""
        if video not in self.paths:
            raise ValueError(f"video id {video} is not in {self.dataset} fold {self.fold}: use catalog ids")
        report: dict[str, Any] = {}
        length = 0

        def fitted() -> np.ndarray | None:
            nonlocal length
            frames, _, length, found = self._decoded(video, size)
            report.update(found)
            return None if frames is None else fit_length(frames[0], length)

        params = f"rgb fitted stride={self.stride} fps={self.fps} size={size} decoder={self.decoder}"
        frames = self.frame_cache.frames(self.paths[video], params, fitted)
        return (length if frames is None else frames), report

    def flow(self, video: int, size: int) -> tuple[np.ndarray, dict]:
        """uint8 ``[catalog length, H, W, 2]``: the flow of ``video``'s whole frames at short side ``size``.

        A pure function of the file, the stride (or fps) and ``size``: no seed, no epoch, so the feed
        computes it once per run. A video that fails to decode gives ``size x size`` zeros.
        """
        if self.stream != "flow":
            raise ValueError(f"RealVideos.flow is the flow stream's; this source's stream is {self.stream!r}")
        from raytrain_seq.data.flow import pair_flow

        frames, last, length, report = self._decoded(video, size)
        if frames is None:
            return np.zeros((length, size, size, 2), np.uint8), report
        _one_opencv_thread()
        first, second = frames
        return fit_length(pair_flow(first, second, last=last), length), report

    def _decoded(self, video: int, size: int) -> tuple[tuple[np.ndarray, ...] | None, bool, int, dict]:
        """``(frames or None when the decode failed, last, catalog length, report)`` of ``video``.

        One open of the file when it decodes: the catalog length comes from the header that decode read.
        Only a failed decode probes the file, for the length of the black frames it is served as."""
        from raytrain_seq.data.video import VideoError

        if video not in self.paths:
            raise ValueError(f"video id {video} is not in {self.dataset} fold {self.fold}: use catalog ids")
        path = self.paths[video]
        try:
            frames, last, info = self._decode(path, size)
        except VideoError as exc:
            length = self._length(self._probe_again(path))
            logger.warning(
                "video %s failed to decode (%s): served as %d black frames; it is listed as skipped",
                path, exc.reason, length,
            )  # fmt: skip
            return None, True, length, {"failed": [[path, exc.reason]]}
        length = self._length(info)
        report: dict[str, list] = {}
        decoded = frames[0].shape[0]
        if decoded != length:
            self._log_refit(path, decoded, length)
            report["refit"] = [[path, decoded, length]]
        return frames, last, length, report

    def _length(self, info: Any) -> int:
        """The catalog length of a video whose header is ``info`` (``video.output_length``)."""
        from raytrain_seq.data.video import output_length

        return output_length(info.frames, stride=self.stride, fps=self.fps, src_fps=info.fps)

    def _probe_again(self, path: str) -> Any:
        """``path``'s header after its decode failed; a file that no longer opens at all is an error."""
        from raytrain_seq.data.video import VideoError, probe

        try:
            return probe(path, decoder=self.decoder)
        except VideoError as exc:
            raise VideoError(
                path, f"it was readable when the catalog was built but not now ({exc.reason})"
            ) from exc

    def _decode(self, path: str, size: int) -> tuple[tuple[np.ndarray, ...], bool, Any]:
        """Frames at short side ``size`` (RGB: ``(frames,)``; flow: ``(first, second)``), ``last``, and the
        header read by the same open."""
        from raytrain_seq.data.decoders import uses_opencv
        from raytrain_seq.data.video import decode_pairs_with_info, decode_with_info

        if uses_opencv(self.decoder):
            _one_opencv_thread()
        options = {
            "stride": self.stride,
            "fps": self.fps,
            "size": size,
            "threads": 1,
            "decoder": self.decoder,
        }
        if self.stream == "flow":
            first, second, last, info = decode_pairs_with_info(path, **options)
            return (first, second), last, info
        frames, info = decode_with_info(path, **options)
        return (frames,), True, info

    def _log_refit(self, path: str, decoded: int, length: int) -> None:
        self._refits += 1
        count = self._refits
        if count <= _LOGGED_FIRST or count % 100 == 0:
            logger.warning(
                "video %s decodes to %d frames but its header gave %d: %s to %d (fix #%d in this worker; the "
                "first %d and every 100th are logged)",
                path, decoded, length, "cut" if decoded > length else "padded by repeating the last frame",
                length, count, _LOGGED_FIRST,
            )  # fmt: skip


@functools.cache
def _one_opencv_thread() -> None:
    """A task holds one CPU: OpenCV's own pool (one thread per core by default) would oversubscribe it."""
    import cv2

    cv2.setNumThreads(1)
