"""Video sources of the refurbishing pipeline: the synthetic set and real videos (UCF101, HMDB51, lists).

Algorithm: the expensive, cached half of Revamper's split augmentation (Lee et al., "Refurbish Your Training
Data", USENIX ATC '21). ``augment_videos`` is the Ray task body that the feed
(``raytrain_seq.runtime.feed.BlockFeed``) submits for a batch of video ids: it decodes each video (the
backend of ``data.decoder``, resolved once by ``source_kwargs``: ``data.decoders``; one decoder thread
and one OpenCV thread, since the task holds one CPU), resizes it to ``data.cache_size`` and applies the random partial
augmentation seeded by ``seeds.partial_rng(seed, video, computing epoch)``, so a recompute after a resume
or on another worker gives the same bytes. ``epoch=None`` is the deterministic evaluation resize.

* RGB: ``decode`` at short side ``cache_size`` then ``augment.partial_augment`` (random window along the
  long side + one colour transform for the whole video).
* Flow (two-stream, Simonyan & Zisserman 2014; TSN, Wang et al. 2016), computed ONCE per video:
  ``RealVideos.flow`` decodes each kept frame and its source successor (``video.decode_pairs``) at short
  side ``cache_size`` and turns each pair into 2 uint8 channels (``flow.pair_flow``) over the WHOLE frame,
  so a strided video still carries the motion between consecutive frames, same T as RGB. That array
  does not depend on the seed or the epoch. The flow stream's partial augmentation is then only the
  random window (no colour jitter: flow has no colour): ``flow.flow_window(flow, size, flow_offset(seed,
  video, epoch))``, the offset being the first draw of ``partial_rng`` as in ``partial_augment``; epoch
  None cuts the centre. ``load`` computes both in one call; the feed runs them as two task bodies,
  ``flow_videos`` once per video (the result is kept in the object store for the run) and
  ``window_videos`` per refurbish, so a recompute costs a slice, not a decode and an optical flow.
  Contract of a flow refurbish: ``window(whole-frame flow, offset)``. Before issue 13 the window was cut
  from the frames first and the flow computed on the window; the two differ where the solver's
  neighbourhood reaches past the window (its borders, and the coarse pyramid levels), so the bytes are
  not the old ones: the new ones see real pixels beyond the window's edge instead of its border.

Catalogs (``data.geometry.load_catalogs``): the first ``data.num_classes`` classes (all when None) of the official
split ``data.split`` (or of the annotation lists of ``--dataset list``, ``data.video_list``); a
validation split read from ``--val-list``, else held out from the training list, class by class and
WHOLE UCF101 groups at a time (the clips of one group are cut from one long video, so a clip-level
split would score near-duplicates; ``holdout``); then at most ``data.max_videos`` per split, class-balanced
(``balanced_subset``). Lengths are strided (or fps-resampled) frame counts from the container headers.
A reader error (missing split file, unknown class, label out of range: each names file and line) is a
``RunSetupError``, so the job stops before training with one line.

Bad videos. Unreadable at catalog time: skipped with one warning naming the file and listed in
``skipped``. Readable then but failing to decode inside a task (corrupt packets after a good header):
the run goes on, the task returns an all-zero clip of the catalog length (the plan was made from that
length), logs a warning naming the file and reports it, so ``feed.stats().videos["skipped"]`` and the
summary list it; a black clip is a constant input that carries no class evidence. A decoded length
that differs from the catalog's (a header that lies) is trimmed, or padded by repeating the last frame,
to the catalog length, with a rate-limited warning. A file that was readable at catalog time and can no
longer even be opened has no known length, so its task fails with a VideoError naming the file.

Trade-off: a flow video costs several times its RGB twin (``data/flow.py``). RGB stays in the refurbished
half, paid once per ``reuse`` epochs; flow is paid once per run, at the price of object-store memory for
each training video's whole-frame flow (the long side / short side of the frames, 4:3 for UCF101, times a
windowed copy) beside the windowed cache; Ray spills it to disk when the store is full. The catalog is
probed (one header read per video, ``video.probe``) by the driver, which hands it to the feed actor; the
task workers never probe the catalog: they read the list files and re-probe only the video they decode.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import time
from typing import Any

import numpy as np

from raytrain_seq.augment import partial_augment, rand_augment, resize_video
from raytrain_seq.config import Config, RunSetupError
from raytrain_seq.data.flow import flow_window
from raytrain_seq.data.frame_cache import FrameCache, default_folder
from raytrain_seq.seeds import partial_rng

logger = logging.getLogger(__name__)

__all__ = [
    "CHANNELS", "SPLITS", "RealVideos", "SyntheticSource", "augment_videos", "balanced_subset", "busy",
    "fit_length", "flow_offset", "flow_videos", "get_source", "holdout", "render_size",
    "source_kwargs", "window_videos",
]  # fmt: skip

SPLITS = ("train", "val", "test")
CHANNELS = {"rgb": 3, "flow": 2}
_VAL_SALT = 0x56414C44  # "VALD": the validation hold-out of class c
_SUBSET_SALT = 0x53554253  # "SUBS": the max_videos subset of class c
_GROUP = re.compile(r"_g(\d+)_c\d+\.[^.]+$")  # UCF101: v_<Class>_g08_c01.avi -> group "08"
_REAL_FIELDS = (
    "dataset", "data_root", "split", "stream", "num_classes", "max_videos", "stride", "fps", "seed",
    "val_fraction", "train_list", "test_list", "val_list", "class_names", "decoder", "frame_cache_gib",
    "frame_cache_dir",
)  # fmt: skip
_LIST_FILES = ("train_list", "test_list", "val_list", "class_names")
_LOGGED_FIRST = 5  # per worker process: the first few length fixes are logged, then every 100th


def render_size(config: Config) -> int:
    """Side at which the synthetic set is rendered: the cache size (>= 8, the renderer's minimum), so the
    partial augmentation's resize is the identity and only the random transform costs CPU."""
    return max(8, config.data.cache_size)


def source_kwargs(config: Config) -> tuple[tuple[str, Any], ...]:
    """The hashable arguments of ``get_source`` for ``config`` (what a task needs to find its videos)."""
    data = config.data
    if data.stream == "fuse":
        raise ValueError(
            "data.stream='fuse' evaluates two finished runs and has no video source of its own: build the "
            "feed from each run's config (runtime.fuse.run_fuse does)"
        )
    if data.dataset == "synthetic":
        fields = ("num_classes", "stride", "seed", "max_videos", "val_fraction")
        return (
            *((name, getattr(data, name)) for name in fields),
            ("size", render_size(config)),
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


def busy(seconds: float) -> None:
    """Burn ``seconds`` of this thread's CPU time (``data.augment_cost``: makes augmentation the
    bottleneck on purpose). CPU time, not wall time: on a loaded machine a wall-clock spin would get
    only its share of a core, and the cost it stands for would shrink with the load."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def augment_videos(
    source: tuple,
    video_ids: list[int],
    epochs: list[int | None],
    seed: int,
    size: int,
    cost: float,
    frame_cost: float = 0.0,
) -> tuple:
    """Task body: decode + partial augmentation of each video; epoch None = evaluation resize.

    ``cost`` busy CPU seconds per video (``data.augment_cost``), and ``frame_cost`` per frame of a
    training video (``data.augment_cost_per_frame``: a per-frame transform such as RandAugment; the
    evaluation resize has none). Returns one uint8 array per video, then ``{"ids", "epochs", "seconds",
    "failed", "refit", "flow_method"}`` (one extra return): ``failed`` lists ``[path, reason]`` of videos
    served as zero clips, ``refit`` ``[path, decoded, catalog]`` of lengths fixed to the catalog's.
    """
    videos = get_source(source)
    began, cpu = time.perf_counter(), time.process_time()
    out, failed, refit = [], [], []
    stages: dict[str, float] = {}
    cache = {"hits": 0, "misses": 0}
    for video, epoch in zip(video_ids, epochs, strict=True):
        frames, report = videos.load(video, epoch, seed, size)
        out.append(frames)
        failed += report.get("failed", [])
        refit += report.get("refit", [])
        for key, value in report.get("stages", {}).items():
            stages[key] = stages.get(key, 0.0) + value
        for key, value in report.get("frame_cache", {}).items():
            cache[key] += value
        busy(cost + (frame_cost * len(frames) if epoch is not None else 0.0))
    info = {
        "ids": list(video_ids),
        "epochs": list(epochs),
        "seconds": time.perf_counter() - began,
        # CPU of the whole process (decoder threads included) while it ran the body: a task worker runs
        # one task at a time, so this is the task's cost in CPU-seconds, which holds on a busy machine.
        "cpu_s": time.process_time() - cpu,
        "wall": [time.time() - (time.perf_counter() - began), time.time()],  # when it ran (epoch seconds)
        "frames": [len(frames) for frames in out],
        "stages": stages,
        "frame_cache": cache,
        "failed": failed,
        "refit": refit,
        "flow_method": videos.flow_method,
    }
    return (*out, info)


def flow_videos(source: tuple, video_ids: list[int], epochs: list[int | None], size: int) -> tuple:
    """Task body of the flow stream's once-per-video half: ``RealVideos.flow`` of each video.

    Returns one uint8 ``[T, H, W, 2]`` whole-frame flow per video (short side ``size``), then ``{"kind":
    "flow", "ids", "epochs", "seconds", "cpu_s", "frames", "flow_seconds", "failed", "refit", "flow_method"}``:
    ``flow_seconds`` is each video's CPU seconds of decoding and flow (this thread's CPU time, so a busy
    machine does not inflate it): what a recompute of that video would pay again. ``epochs`` are the
    computing epochs that first needed each flow (None: evaluation), echoed for the feed's statistics;
    the flow does not depend on them.
    """
    videos = get_source(source)
    began, process = time.perf_counter(), time.process_time()
    out, each, failed, refit = [], [], [], []
    for video in video_ids:
        cpu = time.thread_time()
        flow, report = videos.flow(video, size)
        each.append(time.thread_time() - cpu)
        out.append(flow)
        failed += report.get("failed", [])
        refit += report.get("refit", [])
    info = {
        "kind": "flow",
        "ids": list(video_ids),
        "epochs": list(epochs),
        "seconds": time.perf_counter() - began,
        "cpu_s": time.process_time() - process,  # as augment_videos': the feed's cost in CPU-seconds
        "frames": [len(flow) for flow in out],
        "flow_seconds": each,
        "failed": failed,
        "refit": refit,
        "flow_method": videos.flow_method,
    }
    return (*out, info)


def window_videos(
    video_ids: list[int], epochs: list[int | None], seed: int, size: int, cost: float, *flows: np.ndarray
) -> tuple:
    """Task body of the flow stream's refurbish: each stored flow's window for ``(seed, video, epoch)``.

    ``flows`` are ``flow_videos``'s arrays (Ray resolves the refs passed in their place). Returns one
    uint8 ``[T, size, size, 2]`` per video, then ``{"kind": "window", "ids", "epochs", "seconds", "cpu_s", "frames",
    "failed", "refit", "flow_method"}`` (no decode happens here, so nothing fails or is refitted).
    """
    if len(flows) != len(video_ids):
        raise ValueError(f"window_videos needs one flow per video, got {len(flows)} for {len(video_ids)} ids")
    began, process = time.perf_counter(), time.process_time()
    out = []
    for video, epoch, flow in zip(video_ids, epochs, flows, strict=True):
        out.append(flow_window(flow, size, flow_offset(seed, video, epoch)))
        busy(cost)
    info = {
        "kind": "window",
        "ids": list(video_ids),
        "epochs": list(epochs),
        "seconds": time.perf_counter() - began,
        "cpu_s": time.process_time() - process,
        "frames": [len(window) for window in out],
        "failed": [],
        "refit": [],
        "flow_method": None,
    }
    return (*out, info)


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
def holdout(labels: np.ndarray, groups: list[str], fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of the validation videos: whole groups, about ``fraction`` of each class.

    Per class c, its groups in a seeded random order are taken until they hold at least
    ``max(1, round(fraction * n_c))`` videos, never every group (the class keeps a training video; a
    class with one group gives none). Example: a class of 8 videos in groups g1..g4 (2 each), fraction
    0.1: target max(1, round(0.8)) = 1, so the first group of the order (2 videos) is held out.
    """
    labels = np.asarray(labels)
    keys = np.asarray(groups, dtype=object)
    mask = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        names = sorted(set(keys[members].tolist()))
        if len(names) < 2:
            continue
        order = np.random.default_rng([seed, _VAL_SALT, int(label)]).permutation(len(names))
        target, taken = max(1, round(fraction * len(members))), 0
        for j in order[:-1]:
            if taken >= target:
                break
            chosen = members[keys[members] == names[j]]
            mask[chosen] = True
            taken += len(chosen)
    return mask


def balanced_subset(labels: np.ndarray, limit: int | None, seed: int) -> np.ndarray:
    """Sorted positions of at most ``limit`` videos, dealt round-robin over the classes.

    Each class's videos are put in a seeded random order; round r takes the r-th video of every class
    that still has one (classes ascending). Labels [0, 0, 0, 1, 2, 2] with limit 4: round 0 takes one
    video of classes 0, 1, 2, round 1 the second of class 0: classes 0, 0, 1, 2.
    """
    labels = np.asarray(labels)
    if limit is None or limit >= len(labels):
        return np.arange(len(labels))
    queues = [
        members[np.random.default_rng([seed, _SUBSET_SALT, int(label)]).permutation(len(members))]
        for label in np.unique(labels)
        for members in [np.flatnonzero(labels == label)]
    ]
    picks = [int(q[r]) for r in range(max(len(q) for q in queues)) for q in queues if r < len(q)]
    return np.sort(np.asarray(picks[:limit], dtype=np.int64))


def _subset(catalog, positions: np.ndarray, split: str):
    return dataclasses.replace(
        catalog,
        ids=catalog.ids[positions],
        labels=catalog.labels[positions],
        lengths=catalog.lengths[positions],
        frames=None if catalog.frames is None else catalog.frames[positions],
        paths=tuple(catalog.paths[int(k)] for k in positions),
        split=split,
    )


def _group(path: str) -> str:
    """UCF101's group of a clip (``v_X_g08_c01.avi`` -> ``"08"``); any other file is its own group."""
    name = os.path.basename(path)
    match = _GROUP.search(name)
    return match.group(1) if match else name


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
            split: _subset(c, balanced_subset(c.labels, self.max_videos, self.seed), split)
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
        val_mask = holdout(train.labels, [_group(p) for p in train.paths], self.val_fraction, self.seed)
        if not val_mask.any():
            raise ValueError(
                f"{self.dataset}: no validation video could be held out of {len(train)} training videos "
                "(every class has a single group or video): raise data.val_fraction or use more videos"
                + (", or pass --val-list FILE" if self.dataset == "list" else "")
            )
        return {
            "train": _subset(train, np.flatnonzero(~val_mask), "train"),
            "val": _subset(train, np.flatnonzero(val_mask), "val"),
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
