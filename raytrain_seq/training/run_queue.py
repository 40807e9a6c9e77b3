"""How long the calling thread has waited for a CPU: its run-queue time, from Linux's schedstat.

A learner's training thread that is runnable but not running is starved by whatever shares its node's
cores (decoding tasks, a restarting actor, too many loader processes): on a GPU node the device then
waits on the host. ``run_queue_wait_s()`` reads ``/proc/thread-self/schedstat`` (the kernel's
``sched_info``: time on a CPU, time waiting on a run queue, time slices, in nanoseconds) and returns the
second field in seconds, cumulative since the thread began; None where the file is absent (not Linux, or
a kernel built without it). Blocked time (on a lock, a socket, a round) is not run-queue time. ``Tally``
sends its difference over a round as ``cpu_wait_s`` (``rounds.sync``). No torch, no ray.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SCHEDSTAT", "run_queue_wait_s"]

SCHEDSTAT = Path("/proc/thread-self/schedstat")


def run_queue_wait_s(path: Path = SCHEDSTAT) -> float | None:
    """The calling thread's cumulative run-queue wait in seconds; None when ``path`` cannot be read."""
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if len(fields) < 2:
        raise ValueError(f"{path}: expected 'cpu_ns wait_ns slices', got {' '.join(fields)!r}")
    return int(fields[1]) / 1e9
