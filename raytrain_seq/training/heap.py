"""Keep freed heap memory in the process, so that a training step reuses its pages instead of faulting
on them again.

A step frees and reallocates the same large tensors every time, and glibc gives memory back to the kernel
as soon as it can: a thread other than the main one allocates in a secondary arena whose 64 MiB heaps are
unmapped once empty, the main arena trims its top, and large allocations get mappings of their own, so
every step faults its activations in again. ``keep_freed_memory`` sets three process-wide ``mallopt``
options: ``M_TOP_PAD`` (``top_pad``: the slack kept at an arena's top, which also keeps an empty heap
mapped), ``M_TRIM_THRESHOLD`` (``trim_threshold``) and ``M_MMAP_THRESHOLD`` (``mmap_threshold``, fixed
at glibc's maximum, which stops it adapting). The cost: a process holds up to its peak heap plus
``top_pad`` per arena. Off glibc nothing changes and the call says so. Plain Python: no ray, no torch;
the measured effect: docs/ARCHITECTURE.md, "Measurements behind the code".
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
