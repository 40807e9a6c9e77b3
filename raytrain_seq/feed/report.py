"""The feed's counters and its restart log, Ray-free: what ``BlockFeed.stats()`` reports.

``EpochCounts``: a served epoch's copies recomputed and reused, its kept frames and its plan's packing
stats. ``FeedTally`` keeps them with the tasks' reports (plain dicts, ``data.task_costs``) and builds the
``reports.FeedReport`` that ``stats()`` returns: its fields and the keys of its per-epoch entries are read
by the driver, the benches and the tests, so they stay as they are. ``RestartLog``: one JSON line per restart of the feed actor in the run
folder, read back whole (the counters cover one process; the log covers the run).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raytrain_seq.data.task_costs import task_tallies
from raytrain_seq.outputs.reports import FeedReport

__all__ = ["RESTARTS_FILE", "EpochCounts", "FeedFacts", "FeedTally", "RestartLog", "flow_counts"]

RESTARTS_FILE = "feed_restarts.jsonl"  # in the run folder: one line per restart of the feed actor
PACKING_KEYS = ("blocks", "lower_bound_blocks", "padding", "deleted", "cut", "filler_blocks")
TOTAL_KEYS = ("recomputed", "reused", "partial_videos", "partial_seconds", "kept_frames", "partial_cpu_s")
FLOW_KEYS = ("flow_videos", "flow_seconds", "flow_seconds_saved")


@dataclass(frozen=True)
class EpochCounts:
    """A served epoch: copies recomputed and reused, frames served (every training frame, fresh or
    reused) and the packing stats of its plan (``PACKING_KEYS`` of ``PackPlan.stats``)."""

    recomputed: int
    reused: int
    kept_frames: int
    packing: dict[str, Any]

    @classmethod
    def of(cls, recomputed: int, videos: int, kept_frames: int, stats: dict[str, Any]) -> EpochCounts:
        packing = {key: stats[key] for key in PACKING_KEYS}
        return cls(recomputed, videos - recomputed, kept_frames, packing)

    def as_dict(self) -> dict[str, Any]:
        return {
            "recomputed": self.recomputed,
            "reused": self.reused,
            "kept_frames": self.kept_frames,
            "packing": dict(self.packing),
        }


def flow_counts(windowed: list[int], flowed: list[int], flow_cpu: dict[int, float]) -> dict[str, Any]:
    """One epoch's flow-once counts: flows computed and their CPU seconds, and the CPU seconds of the
    flows a recompute-every-refurbish feed would have computed again (the windows cut from a flow
    computed for an earlier epoch, each at the CPU its one computation took)."""
    fresh = set(flowed)
    return {
        "flow_videos": len(flowed),
        "flow_seconds": sum(flow_cpu.get(v, 0.0) for v in flowed),
        "flow_seconds_saved": sum(flow_cpu.get(v, 0.0) for v in windowed if v not in fresh),
    }


@dataclass(frozen=True)
class FeedFacts:
    """What a feed report says of the run's data, fixed at the start."""

    videos: dict[str, int]  # split -> videos
    skipped: tuple[str, ...]  # unreadable at catalog time
    flow_method: str | None
    flow_once: bool
    t_max: int
    max_sequences: int
    reuse: int


class FeedTally:
    """The counters of one feed process: each served epoch's ``EpochCounts`` and its tasks' reports."""

    def __init__(self, facts: FeedFacts) -> None:
        self.facts = facts
        self.epochs: dict[int, EpochCounts] = {}
        self._infos: list[dict[str, Any]] = []

    def add(self, infos: Sequence[dict[str, Any]]) -> None:
        """Finished tasks' reports (``data.task_bodies``' reports)."""
        self._infos.extend(infos)

    def report(
        self, *, ids: bool, tasks_pending: int, actor_cpu_s: float, restarts: list[dict[str, Any]]
    ) -> FeedReport:
        """Per epoch: the counts, the partial augmentations' videos, seconds and costs (``ids``: also the
        video ids and task spans); evaluation's; the totals; the videos skipped or failed."""
        ran, seconds, flowed, flow_cpu, costs = task_tallies(self._infos)
        per_epoch = {}
        for epoch in sorted(set(self.epochs) | {e for e in (*ran, *flowed) if e is not None}):
            entry = self.epochs[epoch].as_dict() if epoch in self.epochs else {}
            entry.update(partial_videos=len(ran.get(epoch, [])), partial_seconds=seconds.get(epoch, 0.0))
            entry.update(costs.get(epoch, {}))
            if self.facts.flow_once:
                entry.update(flow_counts(ran.get(epoch, []), flowed.get(epoch, []), flow_cpu))
            spans = entry.pop("spans", [])
            if ids:
                entry["partial_ids"] = sorted(ran.get(epoch, []))
                entry["task_spans"] = sorted(spans)
            per_epoch[epoch] = entry
        keys = TOTAL_KEYS + (FLOW_KEYS if self.facts.flow_once else ())
        totals = {key: sum(entry.get(key, 0) for entry in per_epoch.values()) for key in keys}
        methods = sorted({info["flow_method"] for info in self._infos if info.get("flow_method")})
        facts = self.facts
        return FeedReport(
            videos=self._videos(),
            flow_method="+".join(methods) if methods else facts.flow_method,
            flow_once=facts.flow_once,
            epochs=per_epoch,
            eval={
                "videos": len(ran.get(None, [])),
                "seconds": seconds.get(None, 0.0),
                **{key: value for key, value in costs.get(None, {}).items() if key != "spans"},
            },
            totals=dict(totals, tasks_pending=tasks_pending, actor_cpu_s=actor_cpu_s),
            t_max=facts.t_max,
            max_sequences=facts.max_sequences,
            reuse=facts.reuse,
            # Per-epoch counts and totals cover this process only: a restart loses the dead one's.
            restarts=restarts,
        )

    def _videos(self) -> dict[str, Any]:
        """Videos per split; unreadable at catalog time, then any that failed to decode in a task (zero
        clips); videos whose length a task fitted to the catalog's."""
        failed = {path: reason for info in self._infos for path, reason in info.get("failed", [])}
        skipped = list(self.facts.skipped)
        return {
            **self.facts.videos,
            "skipped": [*skipped, *sorted(set(failed) - set(skipped))],
            "decode_failed": [{"path": p, "reason": r} for p, r in sorted(failed.items())],
            "length_fixed": len({r[0] for info in self._infos for r in info.get("refit", [])}),
        }


class RestartLog:
    """``RESTARTS_FILE`` in the run folder: each restarted feed process appends one record."""

    DETAIL = "the feed actor was restarted; it recomputes each requested epoch's cache from the source"

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / RESTARTS_FILE

    def record(self, when: float) -> dict[str, Any]:
        """Append a ``feed_restart`` record at wall time ``when``; returns it."""
        record = {"time": when, "kind": "feed_restart", "detail": self.DETAIL}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        return record

    def read(self) -> list[dict[str, Any]]:
        """Every restart of this run's feed actor so far."""
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
