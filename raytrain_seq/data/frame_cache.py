"""Decoded frames on node-local disk: each video is decoded once per node, later refurbishes read it.

``FrameCache(folder, budget_bytes).frames(path, params, decode)`` returns what ``decode()`` returns (uint8
``[T, H, W, C]``): from ``folder`` when a file of the same source and decode ``params`` (stride, fps,
size, decoder) is there, else by decoding and writing it. One ``<key>-<stamp>.npy`` a video: the key
hashes the source's absolute path and ``params``, the stamp its size and modification time, so a clip
changed after caching misses (its old file removed) and is never served stale.
Never a failure: an unwritable folder is one warning per process and decoding goes on uncached; a file
that does not load is removed and decoded again; past ``budget_bytes`` a video is decoded and not
written (parallel writers may overshoot by a video each); a budget of 0 turns it off. Files are written
under a temporary name and renamed. ``stats`` counts hits, misses, stale, corrupt and unwritten files
and CPU seconds; ``home_nodes`` gives each video the node whose cache holds it; ``cache_bytes`` sizes a
set (docs/ARCHITECTURE.md, "The frame cache").
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["FrameCache", "FrameCacheStats", "cache_bytes", "default_folder", "home_nodes"]

_SUFFIX = ".npy"
_LOCK = ".lock"  # the folder's writers take turns on it (FrameCache._write)


def cache_bytes(lengths, size: int, aspect: float = 4 / 3) -> int:
    """Bytes of the frame cache for videos of ``lengths`` kept frames at short side ``size`` (RGB, the
    long side ``round(size * aspect)``), one file header a video: 1,000 frames at 128 (171x128) take
    1,000 * 65,664 bytes and 128 more."""
    frames = int(np.sum(lengths))
    return frames * size * round(size * aspect) * 3 + 128 * len(lengths)


def home_nodes(videos: list[int], nodes: dict[str, float]) -> dict[int, str]:
    """Each video's home node, whose frame cache holds it: weighted rendezvous hashing over ``nodes``
    (node id -> weight, e.g. its CPUs), so every node gets a share of the videos in proportion to its
    weight, the same video always goes to the same node, and a node that joins or leaves moves only the
    videos it takes or held (1/(n+1) of them when an n-th + 1 equal node joins), whose frames are then
    decoded once more on their new home.

    Score of (video, node): ``weight / -ln(u)``, ``u`` in (0, 1) from a hash of both; the highest wins.
    One node: every video is its. No nodes: an empty mapping (the caller schedules freely)."""
    ranked = sorted(nodes.items())
    out = {}
    for video in videos:
        best, home = -1.0, ""
        for node, weight in ranked:
            digest = hashlib.blake2b(f"{video}\0{node}".encode(), digest_size=8).digest()
            u = (int.from_bytes(digest, "big") + 1) / (2**64 + 1)  # in (0, 1): never 0, never 1
            score = weight / -math.log(u)
            if score > best:
                best, home = score, node
        if home:
            out[int(video)] = home
    return out


def default_folder() -> str:
    """``<the node's temp folder>/raytrain_seq/frames``: node-local, shared by the runs of the node."""
    return os.path.join(tempfile.gettempdir(), "raytrain_seq", "frames")


@dataclasses.dataclass
class FrameCacheStats:
    """What one process's cache did: videos by outcome, and the CPU seconds spent reading or decoding."""

    hits: int = 0
    """Videos read from the folder."""
    misses: int = 0
    """Videos decoded (no file of theirs, a stale one or a corrupt one), written or not."""
    stale: int = 0
    """Files removed because their source changed (size or modification time) since they were written."""
    corrupt: int = 0
    """Files removed because they did not load."""
    unwritten: int = 0
    """Decoded videos not written: past the budget, or the folder not writable."""
    read_cpu_s: float = 0.0
    """CPU seconds of this process reading cached files."""
    decode_cpu_s: float = 0.0
    """CPU seconds of this process in ``decode()`` on misses."""

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


class FrameCache:
    """One process's view of a node's frame cache folder (several processes share a folder safely)."""

    def __init__(self, folder: str | os.PathLike, budget_bytes: int) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes must be an int >= 0 (0: cache nothing), got {budget_bytes!r}")
        self.folder = Path(folder)
        self.budget_bytes = budget_bytes
        self.stats = FrameCacheStats()
        self._writable = True  # False after a failed write: warned once, decode on

    def frames(self, path: str, params: str, decode: Callable[[], np.ndarray | None]) -> np.ndarray | None:
        """``decode()``'s frames of ``path``, read from the folder when they are there and current.

        ``params`` names every setting ``decode`` depends on besides the file (e.g. ``"stride=8 size=128
        decoder=pyav"``). A ``decode`` error propagates and a ``decode`` that returns None (a failure it
        handled) is returned as is: nothing is written either way. A missing source is left to ``decode``.
        """
        if self.budget_bytes == 0:  # off: neither read nor written
            self.stats.unwritten += 1
            return self._decode(decode)
        try:
            source = os.stat(path)
        except OSError:
            return self._decode(decode)
        key = hashlib.sha1(f"{os.path.abspath(path)}\0{params}".encode()).hexdigest()[:24]
        name = f"{key}-{source.st_size:x}-{source.st_mtime_ns:x}{_SUFFIX}"
        cached = self._read(self.folder / name)
        if cached is not None:
            return cached
        # A miss: files of an older version of the source are stale. Looked for only here, so a hit
        # costs one open, not a listing of the folder.
        self._drop_stale(key, name)
        frames = self._decode(decode)
        if frames is not None:
            self._write(self.folder / name, frames)
        return frames

    def usage(self) -> int:
        """Bytes of cached frames in the folder now (every process's)."""
        try:
            with os.scandir(self.folder) as entries:
                return sum(e.stat().st_size for e in entries if e.name.endswith(_SUFFIX) and e.is_file())
        except OSError:
            return 0

    def _decode(self, decode: Callable[[], np.ndarray | None]) -> np.ndarray | None:
        began = time.process_time()
        frames = decode()
        self.stats.decode_cpu_s += time.process_time() - began
        self.stats.misses += 1
        return frames

    def _drop_stale(self, key: str, name: str) -> None:
        """Remove the files of ``key`` whose stamp is not the source's current one (it changed)."""
        try:
            old = [p for p in self.folder.glob(f"{key}-*{_SUFFIX}") if p.name != name]
        except OSError:
            return
        for path in old:
            if _remove(path):
                self.stats.stale += 1

    def _read(self, path: Path) -> np.ndarray | None:
        began = time.process_time()
        try:
            frames = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, EOFError) as exc:
            logger.warning("frame cache: %s did not load (%s): removed, decoding the video again", path, exc)
            if _remove(path):
                self.stats.corrupt += 1
            return None
        if frames.dtype != np.uint8 or frames.ndim != 4:
            logger.warning(
                "frame cache: %s holds %s %s, not uint8 frames: removed", path, frames.dtype, frames.shape
            )
            if _remove(path):
                self.stats.corrupt += 1
            return None
        self.stats.read_cpu_s += time.process_time() - began
        self.stats.hits += 1
        return frames

    def _write(self, path: Path, frames: np.ndarray) -> None:
        if not self._writable:
            self.stats.unwritten += 1
            return
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # The node's tasks write at once: the budget check and the write hold the folder's lock
            # together, or two writers that each saw room would both write and pass the budget.
            with open(self.folder / _LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if self.usage() + frames.nbytes > self.budget_bytes:
                    self.stats.unwritten += 1
                    return
                with open(temporary, "wb") as out:
                    np.save(out, np.ascontiguousarray(frames), allow_pickle=False)
                os.replace(temporary, path)
        except OSError as exc:
            _remove(temporary)
            self._writable = False
            self.stats.unwritten += 1
            logger.warning(
                "frame cache: cannot write in %s (%s): this process decodes every video from now on; pass "
                "--frame-cache-dir with a writable node-local folder, or --frame-cache-gib 0 to turn it off",
                self.folder, exc.strerror or exc,
            )  # fmt: skip


def _remove(path: Path) -> bool:
    """Remove ``path``; False when it was gone already (another process removed it) or cannot be."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.warning("frame cache: cannot remove %s (%s)", path, exc.strerror or exc)
        return False
    return True
