"""The object store's shared memory, mapped into this process before the averaging rounds touch it.

Every worker maps Ray's store file whole, and the first touch of each 4 KiB page costs that process a
fault; the store gives new objects fresh addresses until it has gone round once, so a run's first rounds
fault in every byte they move (docs/ARCHITECTURE.md, "Measurements behind the code"). ``StoreMemory.expect``
pays for them ahead, in a background thread, with ``madvise(MADV_POPULATE_WRITE)`` in 64 MiB calls
(Linux 5.14+), while the learner trains its next K steps or a shard waits. Rule: populate only when
``rounds`` rounds of the bytes this process moves cover the mapping (they would touch it all soon anyway).
A CUDA learner also registers the populated mapping with CUDA (``cuda_host_register``) so an install of
the merged state is one DMA; each mapping is registered whole, in one call (a copy spanning two
registrations fails), for the process's lifetime; a refused registration leaves copies pageable: slower,
the same bytes. Nothing here imports ray; the mapping is found in ``/proc/self/maps`` (``plasma``), and
where there is none nothing is populated, the reason kept in ``StoreMemory.decision``.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = [
    "CHUNK_BYTES",
    "ROUNDS",
    "MemoryReport",
    "StoreMemory",
    "cuda_host_register",
    "cuda_host_unregister",
    "populate",
    "store_mappings",
]

# Populate when this many rounds of a process's bytes would cover the store's mapping.
ROUNDS = 32
# One madvise call maps this much: the call holds the process's memory-map lock, which the rounds' own
# mappings (Ray maps objects as they come) wait for, so a whole store in one call stalls them.
CHUNK_BYTES = 64 << 20
_MADV_POPULATE_WRITE = 23  # linux/mman.h, Linux 5.14
_CUDA_HOST_REGISTER_PORTABLE = 1  # cuda_runtime_api.h: page-locked for every device's context


def store_mappings(maps: str) -> list[tuple[int, int]]:
    """The (start, end) address ranges of the object store's shared mappings in a ``/proc/PID/maps`` text.

    A line: ``7fb6dcca0000-7fb754000000 rw-s 00000000 00:1b 51356   /dev/shm/plasmag7APfd (deleted)``;
    only shared (``s``) mappings of a file whose name starts with ``plasma`` count.
    """
    found = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[1].endswith("s"):
            continue
        name = Path(fields[5].removesuffix(" (deleted)")).name
        if name.startswith("plasma"):
            start, end = (int(address, 16) for address in fields[0].split("-"))
            found.append((start, end))
    return found


@functools.cache
def _madvise() -> Callable[[int, int, int], int]:
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def populate(start: int, length: int) -> None:
    """Map ``length`` bytes from ``start`` into this process's page tables, writable, without touching
    them (``madvise(MADV_POPULATE_WRITE)``); OSError with the errno when the kernel refuses."""
    if _madvise()(start, length, _MADV_POPULATE_WRITE) != 0:
        code = ctypes.get_errno()
        hint = " (MADV_POPULATE_WRITE needs Linux 5.14 or later)" if code == errno.EINVAL else ""
        raise OSError(code, f"madvise({start:#x}, {length}): {os.strerror(code)}{hint}")


def cuda_host_register(start: int, length: int) -> None:
    """Register ``length`` bytes from ``start`` with CUDA as page-locked memory (``cudaHostRegister``,
    portable); RuntimeError naming CUDA's error code when it refuses. The pages stay locked in RAM until
    the process exits. A refusal is recorded in the calling thread's CUDA error state only, so call it
    from a thread that makes no other CUDA calls (``StoreMemory``'s)."""
    import torch

    code = int(torch.cuda.cudart().cudaHostRegister(start, length, _CUDA_HOST_REGISTER_PORTABLE))
    if code != 0:
        raise RuntimeError(f"cudaHostRegister({start:#x}, {length}) refused: CUDA error {code}")


def cuda_host_unregister(start: int) -> None:
    """Undo ``cuda_host_register`` of the range that begins at ``start``; RuntimeError when CUDA refuses.
    Needed before that memory is unmapped: a registration outlives the mapping, and a new mapping at the
    same addresses is refused registration (CUDA error 712) while the old one stays in force there."""
    import torch

    code = int(torch.cuda.cudart().cudaHostUnregister(start))
    if code != 0:
        raise RuntimeError(f"cudaHostUnregister({start:#x}) refused: CUDA error {code}")


def _read_maps() -> str:
    try:
        return Path("/proc/self/maps").read_text()
    except OSError:  # not Linux: there is nothing to populate, which expect() records
        return ""


@dataclass(frozen=True, kw_only=True)
class MemoryReport:
    """What a ``StoreMemory`` decided and did (``StoreMemory.report``, a shard's ``store_memory()``)."""

    decision: str | None
    """Why the mapping was, or was not, populated; None before the first round's bytes were known."""
    seconds: float | None
    """How long populating took; None when none was started or it is still running."""
    bytes: int
    """Bytes of the mapping populated."""
    registered_bytes: int
    """Bytes of the mapping registered with the device."""


class StoreMemory:
    """Populates this process's mapping of the object store once, in a background thread, when the
    rounds' bytes warrant it (the module's rule), and then registers each mapping through ``register``
    (``cuda_host_register`` for a CUDA learner; None: not registered). ``read_maps``, ``populate`` and
    ``register`` are injectable."""

    def __init__(
        self,
        *,
        rounds: int = ROUNDS,
        read_maps: Callable[[], str] = _read_maps,
        populate: Callable[[int, int], None] = populate,
        register: Callable[[int, int], None] | None = None,
    ) -> None:
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(
                f"rounds must be an int >= 1 (the rounds whose bytes must cover the store before it is "
                f"populated ahead), got {rounds!r}: use e.g. {ROUNDS}"
            )
        self.rounds = rounds
        self._read_maps, self._populate = read_maps, populate
        self.register = register  # what registers a populated mapping with the device; None: nothing
        self._thread: threading.Thread | None = None
        self.decision: str | None = None  # why the mapping was, or was not, populated
        self.seconds: float | None = None  # how long populating took, once done
        self.populated_bytes = 0
        self.registered_bytes = 0
        self.error: OSError | None = None
        self.register_error: Exception | None = None

    def expect(self, nbytes: int) -> bool:
        """This process will move about ``nbytes`` through the store each round: start populating the
        mapping if ``rounds`` such rounds cover it. Decided once: later calls return the first answer
        (whether a populate was started)."""
        if self.decision is not None:
            return self._thread is not None
        mappings = store_mappings(self._read_maps())
        size = sum(end - start for start, end in mappings)
        if not mappings:
            self.decision = "no object store mapping in /proc/self/maps"
        elif nbytes * self.rounds < size:
            self.decision = f"{self.rounds} rounds of {nbytes} bytes touch less than the {size}-byte store"
        else:
            self.decision = f"{self.rounds} rounds of {nbytes} bytes cover the {size}-byte store"
            self._thread = threading.Thread(
                target=self._run, args=(mappings,), name="store-populate", daemon=True
            )
            self._thread.start()
        logger.debug("object store mapping: %s", self.decision)
        return self._thread is not None

    def _run(self, mappings: list[tuple[int, int]]) -> None:
        began = time.perf_counter()
        try:
            for start, end in mappings:
                for at in range(start, end, CHUNK_BYTES):
                    length = min(CHUNK_BYTES, end - at)
                    self._populate(at, length)
                    self.populated_bytes += length
        except OSError as exc:
            # Populating is only ahead-of-time work: the rounds fault the pages in themselves instead.
            self.error = exc
            logger.warning("object store mapping not populated ahead (%s): rounds fault its pages in", exc)
        if self.register is not None:  # registering pins the pages, which maps any populate left out
            try:
                for start, end in mappings:  # one registration a mapping: a copy within it is one DMA
                    self.register(start, end - start)
                    self.registered_bytes += end - start
            except Exception as exc:
                # Only speed depends on it: the copies from the unregistered rest are staged by the driver.
                self.register_error = exc
                logger.warning(
                    "object store mapping not registered with the device (%r): copies stay pageable", exc
                )
        self.seconds = time.perf_counter() - began

    def report(self, timeout: float | None = None) -> MemoryReport:
        """What was decided and done, after waiting up to ``timeout`` for a running populate."""
        seconds = self.wait(timeout)
        return MemoryReport(
            decision=self.decision,
            seconds=seconds,
            bytes=self.populated_bytes,
            registered_bytes=self.registered_bytes,
        )

    def wait(self, timeout: float | None = None) -> float | None:
        """The seconds populating took, once it has finished; None if none was started or it is still
        running after ``timeout``."""
        if self._thread is None:
            return None
        self._thread.join(timeout)
        return None if self._thread.is_alive() else self.seconds
