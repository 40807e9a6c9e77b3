"""store_memory: finding the object store's mapping, the rule for populating it ahead, and its failures."""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
import warnings

import numpy as np
import pytest
import torch

from raytrain_seq.runtime.store_memory import (
    CHUNK_BYTES,
    StoreMemory,
    cuda_host_register,
    populate,
    store_mappings,
)

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


def test_a_cuda_learner_registers_each_populated_mapping_once_after_populating_it():
    calls = []
    two = _maps(GIB) + "7f8000000000-7f8000400000 rw-s 00000000 00:1b 2   /dev/shm/plasmaY (deleted)\n"
    memory = StoreMemory(
        rounds=1,
        read_maps=lambda: two,
        populate=lambda s, n: calls.append(("populate", s)),
        register=lambda s, n: calls.append(("register", s, n)),
    )
    assert memory.expect(2 * GIB) is True and memory.wait(10) is not None
    registered = [call for call in calls if call[0] == "register"]
    # One registration a mapping, whole (a copy inside one is then one DMA), after every populate call.
    assert registered == [("register", 0x7F0000000000, GIB), ("register", 0x7F8000000000, 0x400000)]
    assert calls.index(registered[0]) == len(calls) - 2 and memory.registered_bytes == GIB + 0x400000
    assert memory.report().registered_bytes == GIB + 0x400000 and memory.register_error is None


def test_a_refused_registration_is_logged_and_kept_and_a_store_left_alone_is_not_registered(caplog):
    def refuse(start, length):
        raise RuntimeError(f"cudaHostRegister({start:#x}, {length}) refused: CUDA error 712")

    memory = StoreMemory(read_maps=lambda: _maps(GIB), populate=lambda s, n: None, register=refuse)
    with caplog.at_level(logging.WARNING, logger="raytrain_seq.runtime.store_memory"):
        assert memory.expect(GIB) is True and memory.wait(10) is not None
    assert memory.registered_bytes == 0 and "error 712" in str(memory.register_error)
    assert "not registered with the device" in caplog.text and memory.populated_bytes == GIB
    left = StoreMemory(read_maps=lambda: _maps(GIB), register=lambda s, n: pytest.fail("not populated"))
    assert left.expect(1) is False and left.wait(1) is None  # the rounds touch little of it: neither


def _read_own_maps() -> list[str]:
    with open("/proc/self/maps") as maps:
        return maps.read().splitlines()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_store_mapping_is_registered_and_copies_from_it_keep_their_bits(tmp_path):
    """A shared mapping named as Ray's store is, found in /proc/self/maps, populated and registered with
    CUDA; a read-only view of it (as ray.get gives) copies to the device unchanged, and registering a page
    of it again is refused as already registered (CUDA error 712), which shows it was registered."""
    size = 64 << 20
    path = f"/dev/shm/plasma-test-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        region = mmap.mmap(fd, size, mmap.MAP_SHARED)
    finally:
        os.close(fd)
        os.unlink(path)
    anchor = ctypes.c_char.from_buffer(region)
    start = ctypes.addressof(anchor)
    values = view = None
    try:
        # This mapping only (a process of a Ray cluster maps the real store too).
        ours = lambda: "\n".join(line for line in _read_own_maps() if path in line)  # noqa: E731
        memory = StoreMemory(rounds=1, read_maps=ours, register=cuda_host_register)
        assert memory.expect(size) is True and memory.wait(60) is not None
        assert memory.register_error is None and memory.registered_bytes >= size
        values = np.frombuffer(region, dtype=np.float32)
        values[:] = np.arange(values.size, dtype=np.float32) * 0.5
        view = np.frombuffer(region, dtype=np.float32, count=1000, offset=12 * 4096 + 64)
        view.flags.writeable = False
        on_device = torch.empty(1000, device="cuda")
        on_device.copy_(torch.from_numpy(view.copy()).to("cuda"))  # the reference, through pageable memory
        direct = torch.empty(1000, device="cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a read-only array: only read here
            direct.copy_(torch.from_numpy(view))
        assert torch.equal(direct, on_device)
        again: list[int] = []  # in a thread of its own: a refusal stays in that thread's CUDA error state
        thread = threading.Thread(
            target=lambda: again.append(int(torch.cuda.cudart().cudaHostRegister(start + 4096, 4096, 0)))
        )
        thread.start()
        thread.join()
        assert again == [712]  # cudaErrorHostMemoryAlreadyRegistered
    finally:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaHostUnregister(start)
        values = view = None  # they hold the mapping's buffer, which must be released before it closes
        del anchor
        region.close()
