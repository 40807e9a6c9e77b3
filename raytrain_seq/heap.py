"""Keep freed heap memory in the process, so that a training step reuses its pages instead of faulting
on them again.

glibc's malloc gives memory back to the kernel as soon as it can, and a training step frees and
reallocates the same few large tensors (activations, gradients, the staged mini-batch) every step. Ray
Train runs the training function in a thread of its own, whose allocations live in a secondary arena:
glibc maps that arena 64 MiB heaps and unmaps a heap as soon as it is empty, so every step maps fresh
memory and takes one page fault per 4 KiB of every activation. The main arena trims its top likewise
past a threshold, and allocations above a threshold that adapts to the frees are mapped one by one.

``keep_freed_memory`` sets three process-wide options with ``mallopt`` (they apply to the arenas that
exist already and to later ones):

* ``M_TOP_PAD`` (``top_pad``): the slack kept at the top of an arena, and the free room below which
  glibc keeps an empty secondary heap instead of unmapping it;
* ``M_TRIM_THRESHOLD`` (``trim_threshold``): the free top an arena keeps before trimming it;
* ``M_MMAP_THRESHOLD`` (``mmap_threshold``): allocations above it get a mapping of their own, unmapped
  on free; fixed at glibc's maximum (32 MiB on 64-bit), which also stops it from adapting.

The cost: a process holds on to up to its peak heap plus ``top_pad`` per arena rather than returning it.
Off glibc (no ``mallopt`` in the C library) nothing changes and the call says so. Plain Python: no
ray, no torch; the measured effect is in docs/ARCHITECTURE.md ("Measurements behind the code").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

__all__ = ["MMAP_THRESHOLD", "TOP_PAD", "TRIM_THRESHOLD", "keep_freed_memory"]

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
MIB = 1 << 20
TOP_PAD = 64 * MIB
TRIM_THRESHOLD = 1024 * MIB
# glibc refuses a larger value: HEAP_MAX_SIZE / 2 on 64-bit.
MMAP_THRESHOLD = 32 * MIB


def keep_freed_memory(
    *,
    top_pad: int = TOP_PAD,
    trim_threshold: int = TRIM_THRESHOLD,
    mmap_threshold: int = MMAP_THRESHOLD,
    mallopt=None,
) -> bool:
    """Set the three options (see the module doc); True when the C library took all three.

    ``mallopt``: the C function to call (default: the process's C library's, found by name), injectable
    so that tests do not change the test process's allocator."""
    for name, value in (
        ("top_pad", top_pad),
        ("trim_threshold", trim_threshold),
        ("mmap_threshold", mmap_threshold),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
            raise ValueError(
                f"{name} must be an int in [0, 2**31) bytes (mallopt takes a C int), got {value!r}"
            )
    if mallopt is None:
        mallopt = _libc_mallopt()
        if mallopt is None:
            logger.info("heap: this C library has no mallopt; freed memory goes back as it decides")
            return False
    refused = [
        name
        for name, option, value in (
            ("M_TOP_PAD", _M_TOP_PAD, top_pad),
            ("M_TRIM_THRESHOLD", _M_TRIM_THRESHOLD, trim_threshold),
            ("M_MMAP_THRESHOLD", _M_MMAP_THRESHOLD, mmap_threshold),
        )
        if mallopt(option, value) != 1
    ]
    if refused:
        logger.warning("heap: mallopt refused %s; those keep the C library's defaults", ", ".join(refused))
    return not refused


def _libc_mallopt():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    function = getattr(ctypes.CDLL(name), "mallopt", None)
    if function is not None:
        function.argtypes, function.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return function
