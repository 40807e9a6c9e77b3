"""store_memory: finding the object store's mapping, the rule for populating it ahead, and its failures."""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import threading

import pytest

from raytrain_seq.runtime.store_memory import CHUNK_BYTES, StoreMemory, populate, store_mappings

GIB = 1 << 30
# /proc/self/maps of a Ray worker, cut down: the store (shared, deleted), a fallback allocation of the
# store, a private mapping whose name says plasma, a shared non-store file, a library, an anonymous map.
MAPS = """\
55d0c0000000-55d0c0021000 r--p 00000000 08:01 123   /usr/bin/python3.11
7fb6dcca0000-7fb754000000 rw-s 00000000 00:1b 51356                      /dev/shm/plasmag7APfd (deleted)
7fb760000000-7fb764000000 rw-s 00000000 00:1b 51400  /tmp/ray/plasma-fallback-1 (deleted)
7fb770000000-7fb770001000 rw-p 00000000 00:1b 51401  /dev/shm/plasma-private
7fb780000000-7fb780100000 rw-s 00000000 00:1b 51402  /dev/shm/other-shared
7fb790000000-7fb790021000 rw-p 00000000 00:00 0
7fb7a0000000-7fb7a0200000 r-xp 00000000 08:01 456   /usr/lib/libplasma_helper.so
"""


def test_store_mappings_finds_the_shared_plasma_files_only():
    assert store_mappings(MAPS) == [(0x7FB6DCCA0000, 0x7FB754000000), (0x7FB760000000, 0x7FB764000000)]
    assert store_mappings("") == []


def _maps(size: int) -> str:
    return f"7f0000000000-{0x7F0000000000 + size:x} rw-s 00000000 00:1b 1   /dev/shm/plasmaX (deleted)\n"


def test_expect_populates_when_the_rounds_cover_the_store_and_decides_once():
    calls = []
    memory = StoreMemory(rounds=32, read_maps=lambda: _maps(GIB), populate=lambda s, n: calls.append((s, n)))
    assert memory.expect(GIB // 32) is True  # 32 rounds of 32 MiB cover the 1 GiB store
    assert memory.wait(10) is not None
    # In CHUNK_BYTES calls, end to end (each call holds the process's memory-map lock only that long).
    assert calls == [(0x7F0000000000 + at, CHUNK_BYTES) for at in range(0, GIB, CHUNK_BYTES)]
    assert memory.populated_bytes == GIB and len(calls) == GIB // CHUNK_BYTES > 1
    assert "cover" in memory.decision and memory.error is None
    assert memory.expect(GIB) is True and len(calls) == GIB // CHUNK_BYTES  # decided once: not again


def test_expect_leaves_a_store_the_rounds_touch_little_of():
    calls = []
    memory = StoreMemory(rounds=32, read_maps=lambda: _maps(GIB), populate=lambda s, n: calls.append(n))
    assert memory.expect(GIB // 32 - 1) is False  # one byte short of covering it in 32 rounds
    assert memory.wait(10) is None and calls == []
    assert "touch less than" in memory.decision
    # Decided once: a later, larger round does not change it (the first round's size is the run's).
    assert memory.expect(GIB) is False and calls == []


def test_expect_without_a_store_mapping_says_so():
    memory = StoreMemory(read_maps=lambda: "", populate=lambda s, n: pytest.fail("nothing to populate"))
    assert memory.expect(GIB) is False
    assert memory.decision == "no object store mapping in /proc/self/maps"


def test_a_refused_populate_is_logged_and_kept_not_raised(caplog):
    def refuse(start, length):
        raise OSError(errno.EINVAL, "madvise: Invalid argument (MADV_POPULATE_WRITE needs Linux 5.14)")

    memory = StoreMemory(read_maps=lambda: _maps(GIB), populate=refuse)
    with caplog.at_level(logging.WARNING, logger="raytrain_seq.runtime.store_memory"):
        assert memory.expect(GIB) is True
        assert memory.wait(10) is not None
    assert memory.error.errno == errno.EINVAL and memory.populated_bytes == 0
    assert "not populated ahead" in caplog.text and "5.14" in caplog.text


def test_populate_runs_in_the_background():
    release = threading.Event()
    memory = StoreMemory(read_maps=lambda: _maps(GIB), populate=lambda s, n: release.wait(10))
    assert memory.expect(GIB) is True
    assert memory.wait(0.05) is None  # still running: expect() did not wait for it
    release.set()
    assert memory.wait(10) is not None


def test_rounds_must_be_positive():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=r"rounds must be an int >= 1 .* use e\.g\. 32"):
            StoreMemory(rounds=bad)


def test_populate_maps_a_shared_mapping_and_keeps_its_bytes():
    # A shared anonymous mapping stands in for the store's file: the call must map it without writing.
    region = mmap.mmap(-1, 8 * mmap.PAGESIZE)
    region[:5] = b"kept!"
    anchor = ctypes.c_char.from_buffer(region)  # its address; released before the mapping closes
    start = ctypes.addressof(anchor)
    try:
        try:
            populate(start, len(region))
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                pytest.skip(f"this kernel has no MADV_POPULATE_WRITE: {exc}")
            raise
        assert region[:5] == b"kept!" and region[5:] == bytes(len(region) - 5)
        with pytest.raises(OSError, match="madvise"):
            populate(start + 1, mmap.PAGESIZE)  # not page-aligned: the kernel refuses, and it is raised
    finally:
        del anchor
        region.close()
