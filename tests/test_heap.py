"""Tests for raytrain_seq.training.heap: the mallopt options it sets, its errors, and the page faults it saves."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from raytrain_seq.training import heap


class FakeMallopt:
    def __init__(self, refuse: tuple[int, ...] = ()) -> None:
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse

    def __call__(self, option: int, value: int) -> int:
        self.calls.append((option, value))
        return 0 if option in self.refuse else 1


def test_sets_top_pad_trim_and_mmap_thresholds():
    mallopt = FakeMallopt()
    assert heap.keep_freed_memory(mallopt=mallopt)
    # glibc's M_TOP_PAD, M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, with the module's defaults.
    assert mallopt.calls == [(-2, heap.TOP_PAD), (-1, heap.TRIM_THRESHOLD), (-3, heap.MMAP_THRESHOLD)]
    assert heap.MMAP_THRESHOLD == 32 << 20  # glibc's maximum on 64-bit: a larger one is refused


def test_a_refused_option_is_named_and_the_others_still_set(caplog):
    caplog.set_level(logging.WARNING, logger="raytrain_seq.training.heap")
    mallopt = FakeMallopt(refuse=(-3,))
    assert not heap.keep_freed_memory(mallopt=mallopt)
    assert len(mallopt.calls) == 3
    assert any("M_MMAP_THRESHOLD" in m and "M_TOP_PAD" not in m for m in caplog.messages)


@pytest.mark.parametrize(
    "name, value", [("top_pad", -1), ("trim_threshold", 1 << 31), ("mmap_threshold", 1.5)]
)
def test_values_a_c_int_cannot_hold_are_refused_before_any_call(name, value):
    mallopt = FakeMallopt()
    with pytest.raises(ValueError, match=name):
        heap.keep_freed_memory(mallopt=mallopt, **{name: value})
    assert mallopt.calls == []


PROBE = textwrap.dedent(
    """
    import resource, sys, threading
    import numpy as np
    from raytrain_seq.training.heap import keep_freed_memory
    if sys.argv[1] == "keep" and not keep_freed_memory():
        sys.exit(3)
    out = {}
    def work():  # a training thread: its arena's first heap is full, then each step frees and reallocates
        held = [np.ones(25_000, dtype=np.float32) for _ in range(600)]
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            step = np.ones(15 << 18, dtype=np.float32)  # 15 MiB, every page written
            del step
        out["faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    print(out["faults"])
    """
)


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    if done.returncode == 3:
        pytest.skip("this C library has no mallopt (not glibc)")
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_thread_that_reallocates_what_it_freed_faults_its_pages_in_once():
    """In a fresh process each: the default allocator maps a freed 15 MiB buffer back again and faults on
    it (3,840 pages) more than once over 20 steps; with the options set it faults less than once."""
    default, kept = _faults("default"), _faults("keep")
    pages = (15 << 20) // 4096
    assert default > 2 * pages  # not vacuous: the default really does map it again
    assert kept < pages < default
