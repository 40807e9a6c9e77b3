"""The chaos soak's ``--own-cores`` (bench/core_pins.py): which CPUs each side gets, which learner
processes move and when, and that a process's every thread really moves (Linux affinity)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from core_pins import CorePins, learner_pids, pin_process, split_cpus  # noqa: E402

linux_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")


def test_the_cpus_split_into_a_lower_half_for_the_rest_and_an_upper_half_for_the_learners():
    assert split_cpus([1, 0]) == ({0}, {1})
    assert split_cpus(range(3)) == ({0}, {1, 2})
    assert split_cpus([4, 5, 6, 7]) == ({4, 5}, {6, 7})
    with pytest.raises(ValueError, match="at least 2 CPUs"):
        split_cpus([3])


class Fakes:
    """A box of learner pids, the averager's joined nodes and the pins made."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.nodes: dict[int, str] = {}
        self.joined: set[str] | None = None
        self.asked: list[list[int]] = []
        self.pins: list[int] = []

    def node_of(self, pids: list[int]) -> dict[int, str]:
        self.asked.append(sorted(pids))
        return {pid: self.nodes[pid] for pid in pids if pid in self.nodes}

    def pin(self, pid: int, cpus: set[int]) -> int:
        assert cpus == {1}
        self.pins.append(pid)
        return 3  # threads pinned


def _pins(fakes: Fakes) -> CorePins:
    return CorePins(
        {1}, joined_nodes=lambda: fakes.joined, node_of=fakes.node_of, find=lambda: list(fakes.pids),
        pin=fakes.pin,
    )  # fmt: skip


def test_first_learners_move_on_sight_and_a_later_one_only_once_its_node_joined():
    fakes = Fakes()
    pins = _pins(fakes)
    fakes.pids, fakes.nodes = [10, 11], {10: "a", 11: "b", 12: "c"}
    pins.poll()  # no group yet: the run's first learners move at once, no node asked
    assert fakes.pins == [10, 11] and fakes.asked == []
    fakes.joined = {"a", "b"}
    fakes.pids = [10, 12]  # 11 lost; 12, its replacement, starts up
    fakes.pins.clear()
    pins.poll()
    assert fakes.pins == [10]  # 12 starts on the rest's CPUs
    assert fakes.asked == [[12]]
    fakes.joined = None  # the averager restarts: pinned ones stay pinned, 12 still waits
    fakes.pins.clear()
    pins.poll()
    assert fakes.pins == [10]
    fakes.joined = {"a", "c"}  # 12 joined
    fakes.pins.clear()
    pins.poll()
    assert fakes.pins == [10, 12] and pins.pinned == {10, 11, 12}
    pins.reset()  # the next run: its first learners on sight again
    fakes.pids, fakes.joined = [20], set()
    fakes.pins.clear()
    pins.poll()
    assert fakes.pins == [20]


@linux_affinity
def test_a_process_and_every_thread_of_it_move_and_learner_processes_are_found_by_title(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    _, upper = split_cpus(os.sched_getaffinity(0))
    script = (
        "import threading, time\nfor _ in range(3): threading.Thread(target=time.sleep, args=(60,)).start()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script + "time.sleep(60)"])
    try:
        task = Path(f"/proc/{child.pid}/task")
        deadline = time.monotonic() + 30
        while len(list(task.iterdir())) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pin_process(child.pid, upper) >= 4
        assert {tid.name: os.sched_getaffinity(int(tid.name)) for tid in task.iterdir()} == {
            tid.name: upper for tid in task.iterdir()
        }
    finally:
        child.kill()
        child.wait()
    assert pin_process(child.pid, upper) == 0  # ended: nothing pinned, no error
    fake = tmp_path / "proc"
    for pid, title in (
        (7, b"ray::LearnerProcess.run\0"),
        (8, b"ray::ParameterAverager\0"),
        (9, b"ray::LearnerProcess\0"),
    ):
        (fake / str(pid)).mkdir(parents=True)
        (fake / str(pid) / "cmdline").write_bytes(title)
    (fake / "self").mkdir()
    assert sorted(learner_pids(fake)) == [7, 9]


def test_a_poll_that_fails_is_counted_and_polling_goes_on():
    """A state call that fails (the averager restarting) does not end the pinning: the poller logs it,
    counts it, and the next poll pins."""
    fakes = Fakes()
    calls = []

    def joined() -> set[str] | None:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("the averager did not answer")
        return {"a"}

    fakes.pids, fakes.nodes = [10], {10: "a"}
    pins = CorePins(
        {1}, joined_nodes=joined, node_of=fakes.node_of, find=lambda: list(fakes.pids), pin=fakes.pin,
        interval_s=0.01,
    )  # fmt: skip
    pins.start()
    deadline = time.monotonic() + 10
    while not fakes.pins and time.monotonic() < deadline:
        time.sleep(0.01)
    pins.stop()
    assert pins.errors == ["TimeoutError('the averager did not answer')"] and fakes.pins[0] == 10
