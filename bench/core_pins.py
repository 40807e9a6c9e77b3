"""The chaos soak's ``--own-cores``: training learners on CPUs of their own, as on a real cluster.

On the soak's one-box cluster every process shares the box's cores, so a restarting averager, shard or
feed takes CPU from the learners it is meant to leave alone, which a cluster's separate nodes would not
(docs/LOG.md, 2026-11-30, after 06:09 UTC). ``confine`` puts the soak's process, and so every process of
its cluster (affinity is inherited), on the lower half of the CPUs; ``CorePins`` moves each learner
process, every thread of it, onto the upper half: the run's first learners on sight, a later one once
the averager lists its node as joined. A replacement's start-up so takes no CPU from the learners
training, but shares the control plane's half, which slows it: its ``replacement_first_step_s`` is not
a cluster's. Re-applied each poll, so threads started later follow. Linux only.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

LEARNER_TITLE = "ray::LearnerProcess"  # the learner actor's process title (runtime/fleet.py's class)


def split_cpus(cpus: Iterable[int]) -> tuple[set[int], set[int]]:
    """(the rest's CPUs, the learners' CPUs): the lower and upper half. Of {0, 1}: ({0}, {1}); of
    {0, 1, 2}: ({0}, {1, 2})."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        raise ValueError(f"--own-cores needs at least 2 CPUs to split, this process may use {ordered}")
    half = len(ordered) // 2
    return set(ordered[:half]), set(ordered[half:])


def learner_pids(proc: Path = Path("/proc")) -> list[int]:
    """The pids of the box's processes titled as a learner actor (Ray sets the title to
    ``ray::LearnerProcess`` or ``ray::LearnerProcess.run``)."""
    pids = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes()
            except OSError:  # the process ended between the listing and the read
                continue
            if title.startswith(LEARNER_TITLE.encode()):
                pids.append(int(entry.name))
    return pids


def pin_process(pid: int, cpus: set[int], proc: Path = Path("/proc")) -> int:
    """Every thread of ``pid`` onto ``cpus``; the threads pinned (0: the process ended)."""
    pinned = 0
    try:
        tids = [int(t.name) for t in (proc / str(pid) / "task").iterdir()]
    except OSError:
        return 0
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
            pinned += 1
        except OSError:  # the thread ended since the listing
            continue
    return pinned


def confine() -> set[int]:
    """This process, and so every process it starts from now on, onto the lower half of its CPUs;
    returns the upper half, the learners' (``CorePins``)."""
    rest, learners = split_cpus(os.sched_getaffinity(0))
    os.sched_setaffinity(0, rest)
    logger.warning("own cores: learners on CPUs %s, the rest on %s", sorted(learners), sorted(rest))
    return learners


class CorePins:
    """Polls every ``interval_s`` and moves learner processes onto ``learners`` (CPUs): every one seen
    before the run's group formed, then those whose node the averager lists as joined. ``joined_nodes``
    returns those nodes (None or empty while none is known); ``node_of`` maps learner pids to their nodes
    (asked again for a pid not mapped); ``reset`` before each run. ``find`` and ``pin``: the learner
    pids and the pinning (``learner_pids``, ``pin_process``; fakes in the tests)."""

    def __init__(
        self,
        learners: set[int],
        *,
        joined_nodes: Callable[[], set[str] | None],
        node_of: Callable[[list[int]], dict[int, str]],
        interval_s: float = 0.25,
        find: Callable[[], list[int]] = learner_pids,
        pin: Callable[[int, set[int]], int] = pin_process,
    ) -> None:
        self.learners, self.joined_nodes, self.node_of = learners, joined_nodes, node_of
        self.interval_s, self.find, self.pin = interval_s, find, pin
        self._nodes: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pinned: set[int] = set()  # learner pids moved so far
        self.errors: list[str] = []  # polls that failed (the soak's JSON counts them)
        self._formed = False  # a learner of this run has joined: later ones wait for their join

    def reset(self) -> None:
        """A new run starts: its first learners are pinned on sight again."""
        self._formed = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="core-pins", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception as exc:  # a state call that failed once: polled again, and counted
                self.errors.append(repr(exc))
                logger.warning("own cores: a poll failed (%r); polling on", exc)

    def poll(self) -> None:
        """One pass: find the learner processes, and pin those due (the class docstring)."""
        pids = self.find()
        joined = self.joined_nodes() or set()
        self._formed = self._formed or bool(joined)
        waiting = [pid for pid in pids if pid not in self.pinned]
        if self._formed and any(pid not in self._nodes for pid in waiting):
            self._nodes.update(self.node_of(waiting))
        for pid in pids:
            due = pid in self.pinned or not self._formed or self._nodes.get(pid) in joined
            if due and self.pin(pid, self.learners):
                self.pinned.add(pid)
