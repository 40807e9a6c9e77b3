"""The chaos soak's survivor figures (bench/chaos.py), from what the soak saw and the run's round log.

The soak reads the averager's report (``AveragingReport.processes``) just before each injection and once
recovered (a ``Probe``); the learner on a killed node or the stalled one is lost, the others survive.
``events.jsonl`` gives per round its ``time`` and per learner its stats and process (a ``redo`` wins).
Per event: ``survivor_restarts``: survivors' incarnations in neither the recovered report nor a later round;
``survivor_steps_ratio``: the survivors' processes' steps per second in the rounds closed during the
recovery over those in a window of equal length just before the injection, which starts no earlier than
the run's first round or the last event's recovery (0.0: no step, None: no step before); in those rounds
``survivor_longest_stall_s``, the survivors' longest gap between two steps; ``survivor_cpu_wait_share``
(``..._before``: in the window before) their training threads' run-queue wait (``cpu_wait_s``) a second;
``replacement_first_step_s``: from the injection (a stall) or the next added node's being up (a killed
node) to the first step a round holds from a learner on the lost learner's or the added node (None:
nobody lost or no node came back). All are None for an event the run ended before it recovered. No ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Process = tuple[str, "str | None"]  # (incarnation, node)

NOTES = {
    "survivor_restarts": "learner processes not lost in an event yet gone after it (a new incarnation "
    "in their place); null: the averager's report named no process before or after the event",
    "survivor_steps_ratio": "survivors' steps per second, rounds closed during the recovery over a window "
    "of equal length before the fault, cut short where it would reach back into the run's start or the "
    "previous event's recovery; null: the survivors took no step in that window",
    "survivor_longest_stall_s": "the longest time from one step's end to the next of a survivor's process, "
    "in the rounds closed during the recovery (a round's wait counts in the round after it); null: no step",
    "survivor_cpu_wait_share": "seconds a survivor's training thread was runnable but found no free core, "
    "per survivor-second, in the rounds closed during the recovery (the learners' cpu_wait_s; a round's "
    "wait counts where the round closes, as its steps do, so a short window may read above 1); null: no "
    "round reports it (a kernel without /proc/thread-self/schedstat)",
    "survivor_cpu_wait_share_before": "the same in the window survivor_steps_ratio compares with",
    "replacement_first_step_s": "fault (a stall) or the next added node up (a killed node) to the first "
    "step of a learner on the lost learner's or the added node; null: the event lost no learner "
    "(node_added, averager_killed, feed_killed, shard_killed) or no node came back",
    "null figures": "every figure of an event is null when the run ended before the event recovered",
}


@dataclass(frozen=True)
class Probe:
    """What the soak saw around one event; times are wall times (``time.time()``)."""

    kind: str
    injected_at: float
    recovered_at: float | None  # None: the run ended before the event recovered
    before: tuple[Process, ...]  # the report's processes just before the injection
    after: tuple[Process, ...]  # and once recovered
    lost_nodes: tuple[str, ...] = ()  # the nodes whose learner the event took (killed, stalled)
    added: tuple[str, float] | None = None  # node_added: (the node, when it was up)


@dataclass(frozen=True)
class RoundSteps:
    """One averaged round of the log: when it closed, each process's steps in it, first steps' times."""

    time: float
    steps: Mapping[str, float]  # incarnation -> steps
    gaps: Mapping[str, float]  # incarnation -> its longest gap between two steps (``Tally.longest_gap_s``)
    cpu_waits: Mapping[str, float]  # incarnation -> its training thread's run-queue wait (``cpu_wait_s``)
    first_steps: tuple[tuple[str | None, float], ...]  # (node, first_step_wall)


def round_steps(records: Iterable[Mapping[str, Any]]) -> list[RoundSteps]:
    """The averaged rounds of an ``events.jsonl`` (its records, in order), by close time; a later record
    of a round (``redo``) replaces the earlier one, whose steps the learners sent again."""
    latest: dict[int, Mapping[str, Any]] = {}
    for record in records:
        if record.get("type") == "round" and "time" in record:
            latest[record["round"]] = record
    out = []
    for record in sorted(latest.values(), key=lambda r: r["time"]):
        procs = {p["learner"]: p for p in record.get("processes", ())}
        steps: dict[str, float] = {}
        gaps: dict[str, float] = {}
        waits: dict[str, float] = {}
        for learner, stats in record["stats"]:
            incarnation = procs.get(learner, {}).get("incarnation")
            if incarnation is not None:
                steps[incarnation] = steps.get(incarnation, 0.0) + float(stats.get("steps", 0.0))
                if "cpu_wait_s" in stats:
                    waits[incarnation] = waits.get(incarnation, 0.0) + float(stats["cpu_wait_s"])
                gap = procs[learner].get("longest_gap_s")
                if gap is not None:
                    gaps[incarnation] = max(gaps.get(incarnation, 0.0), float(gap))
        firsts = tuple(
            (p.get("node"), float(p["first_step_wall"]))
            for p in procs.values()
            if p.get("first_step_wall") is not None
        )
        out.append(RoundSteps(float(record["time"]), steps, gaps, waits, firsts))
    return out


def survivors(probe: Probe) -> set[str] | None:
    """The incarnations before the event whose node the event did not take; None when the report named
    none, or a node is unknown where one was taken (the lost one cannot be told apart)."""
    if not probe.before or (probe.lost_nodes and any(node is None for _, node in probe.before)):
        return None
    return {incarnation for incarnation, node in probe.before if node not in probe.lost_nodes}


def survivor_restarts(probe: Probe, rounds: Sequence[RoundSteps]) -> int | None:
    """Survivors whose incarnation is in neither the recovered report nor a round closed after it."""
    alive = survivors(probe)
    if alive is None or probe.recovered_at is None or not probe.after:
        return None
    later = {incarnation for r in rounds if r.time > probe.recovered_at for incarnation in r.steps}
    return len(alive - {incarnation for incarnation, _ in probe.after} - later)


def steps_ratio(
    rounds: Sequence[RoundSteps], processes: set[str], start: float, fault: float, recovered: float
) -> float | None:
    """``processes``' steps per second in the rounds closed in (fault, recovered] over those in the window
    of equal length before ``fault`` (from ``start`` at the earliest); None without steps before."""
    low = window_before(start, fault, recovered)
    if low is None:
        return None

    def rate(after: float, until: float) -> float:
        steps = sum(
            n for r in rounds if after < r.time <= until for i, n in r.steps.items() if i in processes
        )
        return steps / (until - after)

    before = rate(low, fault)
    return rate(fault, recovered) / before if before > 0 else None


def window_before(start: float, fault: float, recovered: float) -> float | None:
    """Where the window before ``fault`` that a recovery is compared with begins: as long as the recovery
    (``recovered - fault``), cut at ``start``; None when nothing is left of it."""
    low = max(fault - (recovered - fault), start)
    return None if recovered <= fault or low >= fault else low


def cpu_wait_share(
    rounds: Sequence[RoundSteps], processes: set[str], after: float, until: float
) -> float | None:
    """``processes``' run-queue wait in the rounds closed in (after, until], per process and second; e.g.
    two survivors that waited 0.4 s and 0.2 s in a 1.5-s window: 0.6 / (2 x 1.5) = 0.2. None when no
    round there reports a wait of theirs (a kernel without the figure)."""
    waits = [w for r in rounds if after < r.time <= until for i, w in r.cpu_waits.items() if i in processes]
    return sum(waits) / (len(processes) * (until - after)) if waits and until > after else None


def longest_stall(
    rounds: Sequence[RoundSteps], processes: set[str], fault: float, recovered: float
) -> float | None:
    """``processes``' longest gap between two steps in the rounds closed in (fault, recovered]; None when
    no round there holds one."""
    gaps = [g for r in rounds if fault < r.time <= recovered for i, g in r.gaps.items() if i in processes]
    return max(gaps) if gaps else None


def first_step_after(rounds: Sequence[RoundSteps], nodes: Iterable[str], since: float) -> float | None:
    """Seconds from ``since`` to the first step after it that a round holds from a learner on ``nodes``."""
    wanted = set(nodes)
    times = [t for r in rounds for node, t in r.first_steps if node in wanted and t > since]
    return min(times) - since if times else None


def replacement_first_step(probes: Sequence[Probe], index: int, rounds: Sequence[RoundSteps]) -> float | None:
    """Event ``index``'s lost learner's replacement: a stalled learner's node from the injection; a
    killed node's learner on the node the next ``node_added`` brought, from when it was up."""
    probe = probes[index]
    if probe.recovered_at is None or not any(node in probe.lost_nodes for _, node in probe.before):
        return None  # the event lost no learner
    if probe.kind != "node_killed":
        return first_step_after(rounds, probe.lost_nodes, probe.injected_at)
    added = next((p.added for p in probes[index + 1 :] if p.added is not None), None)
    return None if added is None else first_step_after(rounds, [added[0]], added[1])


def event_figures(probes: Sequence[Probe], rounds: Sequence[RoundSteps]) -> list[dict[str, Any]]:
    """Per probe: ``survivor_restarts``, ``survivor_steps_ratio``, ``survivor_longest_stall_s``,
    ``survivor_cpu_wait_share`` (and ``..._before``) and ``replacement_first_step_s``."""
    start = rounds[0].time if rounds else float("inf")
    out = []
    for index, probe in enumerate(probes):
        alive, ratio, stall, wait, wait_before = survivors(probe), None, None, None, None
        if alive is not None and probe.recovered_at is not None:
            fault, recovered = probe.injected_at, probe.recovered_at
            ratio = steps_ratio(rounds, alive, start, fault, recovered)
            stall = longest_stall(rounds, alive, fault, recovered)
            wait = cpu_wait_share(rounds, alive, fault, recovered)
            low = window_before(start, fault, recovered)
            wait_before = None if low is None else cpu_wait_share(rounds, alive, low, fault)
        start = max(start, probe.recovered_at or start)  # the next event's window starts after this one
        first = replacement_first_step(probes, index, rounds)
        out.append(
            {
                "survivor_restarts": survivor_restarts(probe, rounds),
                "survivor_steps_ratio": None if ratio is None else round(ratio, 3),
                "survivor_longest_stall_s": None if stall is None else round(stall, 1),
                "survivor_cpu_wait_share": None if wait is None else round(wait, 3),
                "survivor_cpu_wait_share_before": None if wait_before is None else round(wait_before, 3),
                "replacement_first_step_s": None if first is None else round(first, 1),
            }
        )
    return out


def total_restarts(figures: Sequence[Mapping[str, Any]]) -> int | None:
    """The events' survivor restarts summed; None when an event's count is unknown."""
    counts = [f["survivor_restarts"] for f in figures]
    return None if None in counts else sum(counts)
