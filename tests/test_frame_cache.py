"""The frame cache (data/frame_cache.py): the same bytes as decoding, never stale, never a failure.

Pure tests with a counting decoder; tests/test_real_video.py runs it under the feed on real clips.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from raytrain_seq.data.frame_cache import FrameCache


class CountingDecoder:
    """Stands for a video decode: the frames of a clip, and how often it was called."""

    def __init__(self, frames: int = 6, seed: int = 0) -> None:
        self.frames = np.random.default_rng(seed).integers(0, 256, (frames, 8, 10, 3), dtype=np.uint8)
        self.calls = 0

    def __call__(self) -> np.ndarray:
        self.calls += 1
        return self.frames.copy()


@pytest.fixture
def clip(tmp_path):
    path = tmp_path / "clip.avi"
    path.write_bytes(b"a video file")
    return str(path)


def test_a_second_read_is_a_hit_with_the_bytes_of_the_decode(tmp_path, clip):
    cache, decode = FrameCache(tmp_path / "cache", 1 << 20), CountingDecoder()
    first = cache.frames(clip, "stride=1 size=8", decode)
    again = cache.frames(clip, "stride=1 size=8", decode)
    assert decode.calls == 1 and np.array_equal(first, decode.frames) and np.array_equal(again, decode.frames)
    assert again.dtype == np.uint8 and again.shape == decode.frames.shape
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    # Another process (a new FrameCache on the folder: a restarted feed's task, a --resume) reads it too.
    other = FrameCache(tmp_path / "cache", 1 << 20)
    assert np.array_equal(other.frames(clip, "stride=1 size=8", decode), decode.frames)
    assert decode.calls == 1 and other.stats.hits == 1
    # Other decode settings are another entry.
    cache.frames(clip, "stride=2 size=8", decode)
    assert decode.calls == 2 and cache.usage() == 2 * decode.frames.nbytes + 2 * 128


def test_a_changed_source_is_decoded_again_and_its_old_frames_removed(tmp_path, clip):
    cache = FrameCache(tmp_path / "cache", 1 << 20)
    cache.frames(clip, "p", CountingDecoder(seed=1))
    with open(clip, "ab") as out:  # the clip changes: new size and modification time
        out.write(b" longer now")
    changed = CountingDecoder(seed=2)
    got = cache.frames(clip, "p", changed)
    assert changed.calls == 1 and np.array_equal(got, changed.frames) and cache.stats.stale == 1
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1
    # Same size, only the modification time moves: still stale.
    stat = os.stat(clip)
    os.utime(clip, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    third = CountingDecoder(seed=3)
    assert np.array_equal(cache.frames(clip, "p", third), third.frames) and third.calls == 1


def test_a_corrupt_file_is_removed_and_the_video_decoded_again(tmp_path, clip, caplog):
    cache, decode = FrameCache(tmp_path / "cache", 1 << 20), CountingDecoder()
    cache.frames(clip, "p", decode)
    (written,) = (tmp_path / "cache").glob("*.npy")
    written.write_bytes(written.read_bytes()[:50])  # truncated
    with caplog.at_level(logging.WARNING):
        got = cache.frames(clip, "p", decode)
    assert decode.calls == 2 and np.array_equal(got, decode.frames) and cache.stats.corrupt == 1
    assert "did not load" in caplog.text
    assert np.array_equal(FrameCache(tmp_path / "cache", 1 << 20).frames(clip, "p", decode), decode.frames)
    assert decode.calls == 2  # rewritten whole by the second decode


def test_past_the_budget_videos_are_decoded_and_not_written(tmp_path):
    decode = CountingDecoder()
    budget = decode.frames.nbytes + 200  # one video's file (its bytes and a 128-byte header), not two
    cache = FrameCache(tmp_path / "cache", budget)
    clips = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.avi"
        path.write_bytes(name.encode())
        clips.append(str(path))
    for _ in range(3):
        for path in clips:
            assert np.array_equal(cache.frames(path, "p", decode), decode.frames)
    assert decode.calls == 4 and cache.stats.hits == 2 and cache.stats.unwritten == 3
    assert cache.usage() <= budget
    off = FrameCache(tmp_path / "off", 0)
    off.frames(clips[0], "p", decode)
    assert not (tmp_path / "off").exists() and off.stats.unwritten == 1


def test_a_folder_that_cannot_be_written_is_one_warning_and_decoding_goes_on(tmp_path, clip, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    cache, decode = FrameCache(blocker / "cache", 1 << 20), CountingDecoder()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert np.array_equal(cache.frames(clip, "p", decode), decode.frames)
    assert decode.calls == 3 and cache.stats.unwritten == 3
    warnings = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1 and "--frame-cache-dir" in warnings[0].getMessage()


def test_a_decode_error_propagates_and_writes_nothing(tmp_path, clip):
    cache = FrameCache(tmp_path / "cache", 1 << 20)

    def broken():
        raise ValueError("not a video")

    with pytest.raises(ValueError, match="not a video"):
        cache.frames(clip, "p", broken)
    assert cache.usage() == 0
    # A decode that handled its own failure (None) is passed on, and nothing is written for it.
    assert cache.frames(clip, "p", lambda: None) is None and cache.usage() == 0
    # A missing source is the decoder's to report: nothing is cached for it.
    missing = CountingDecoder()
    cache.frames(str(tmp_path / "gone.avi"), "p", missing)
    assert cache.usage() == 0 and missing.calls == 1


@pytest.mark.parametrize("budget", [-1, 1.5, True, "1"])
def test_a_bad_budget_is_refused_with_the_fix(tmp_path, budget):
    with pytest.raises(ValueError, match="budget_bytes must be an int >= 0"):
        FrameCache(tmp_path, budget)


def test_home_nodes_share_videos_by_weight_and_move_few_when_a_node_joins():
    """Weighted rendezvous hashing: deterministic, every video placed, shares near the weights, and a
    node that joins takes about its share from the others while every other video stays home."""
    from raytrain_seq.data.frame_cache import home_nodes

    videos = list(range(3000))
    nodes = {"head": 6.0, "gpu-a": 2.0, "gpu-b": 2.0}
    home = home_nodes(videos, nodes)
    assert home == home_nodes(videos, dict(reversed(list(nodes.items()))))  # order of the nodes is no input
    assert set(home) == set(videos) and set(home.values()) == set(nodes)
    shares = {node: sum(h == node for h in home.values()) / len(videos) for node in nodes}
    assert shares["head"] == pytest.approx(0.6, abs=0.04) and shares["gpu-a"] == pytest.approx(0.2, abs=0.04)
    grown = home_nodes(videos, {**nodes, "gpu-c": 2.0})
    moved = [v for v in videos if grown[v] != home[v]]
    assert all(grown[v] == "gpu-c" for v in moved)  # only to the newcomer
    assert len(moved) / len(videos) == pytest.approx(2 / 12, abs=0.04)
    gone = home_nodes(videos, {"head": 6.0, "gpu-a": 2.0})
    assert all(gone[v] == home[v] for v in videos if home[v] != "gpu-b")  # a node's loss moves only its own
    assert home_nodes(videos[:5], {"only": 1.0}) == dict.fromkeys(videos[:5], "only")
    assert home_nodes(videos[:5], {}) == {}


def _fill(folder: str, budget: int, sources: list[str], start, written) -> None:
    """One writer process: wait for the others, then cache a frame array per source; puts its writes."""
    cache = FrameCache(folder, budget)
    start.wait()
    for k, source in enumerate(sources):
        cache.frames(source, "p", lambda k=k: np.full((8, 96, 96, 3), k, np.uint8))
    written.put(cache.stats.misses - cache.stats.unwritten)


def test_writers_of_several_processes_at_once_keep_the_budget(tmp_path):
    """A node's feed tasks write into one folder at the same moment: the budget check and the write are
    one step under the folder's lock, so the folder never passes the budget (without the lock, writers that
    each saw room wrote at once and this failed in most runs), and it still fills up to it."""
    import multiprocessing

    sources = []
    for k in range(24):
        source = tmp_path / f"v{k}.avi"
        source.write_bytes(b"x" * (k + 1))
        sources.append(str(source))
    one = np.full((8, 96, 96, 3), 0, np.uint8).nbytes + 128  # the array and np.save's header
    budget = 6 * one
    context = multiprocessing.get_context("fork")
    start, queue = context.Barrier(4), context.Queue()
    writers = [
        context.Process(target=_fill, args=(str(tmp_path / "cache"), budget, sources[w::4], start, queue))
        for w in range(4)
    ]
    for writer in writers:
        writer.start()
    written = [queue.get(timeout=60) for _ in writers]
    for writer in writers:
        writer.join(timeout=60)
    files = list((tmp_path / "cache").glob("*.npy"))
    assert sum(f.stat().st_size for f in files) <= budget
    assert len(files) == 6 and sum(written) == 6  # filled to the budget, each file written once
