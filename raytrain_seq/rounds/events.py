"""The run's history as the averager keeps it: training clock, totals, histories, recoveries, event log.

``EventLog`` is the append-only JSON-lines file ``run_dir/events.jsonl``: membership changes, recoveries,
rounds and validations, written as they happen, so that a restarted averager (and a resumed run) reports
the whole run, not only what happened since its last checkpoint. ``RunHistory`` owns it together with
everything the summary needs: the run's training clock (``RunClock``, continued across restarts),
per-learner totals (frames, compute, data wait, averaging time), the loss, batch-size and validation
histories, the round times, failed rounds and recoveries. The averager holds one ``RunHistory``
(composition) and feeds it; ``RoundBook``'s membership records reach it through ``on_member``.

``membership_entries`` and ``recovery_entries`` turn the averager's logs (its report's) into the run summary's
lists. Plain Python and files: no ray, no asyncio.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from raytrain_seq.checkpoint import EVENTS_FILE
from raytrain_seq.members.ids import LearnerId
from raytrain_seq.rounds.state import CheckpointHistory

logger = logging.getLogger(__name__)

# A learner's round stats that are not totals: the mean loss, the wall time of its first step and the
# longest gap between two of its steps (``rounds.sync.Tally``).
UNSUMMED = ("loss", "first_step_wall", "longest_gap_s")

__all__ = [
    "EVENTS_FILE",
    "EventLog",
    "RunClock",
    "RunHistory",
    "describe_position",
    "describe_progress",
    "membership_entries",
    "recovery_entries",
]


class EventLog:
    """Append-only JSON lines at ``path`` (None: memory only, nothing written); ``read()`` loads them back.

    A writer killed mid-line (its driver or node gone) leaves a line cut short: ``read`` skips a line that
    does not parse, with a warning naming it, and the next writer's first ``append`` starts a new line
    after it, so a resumed run never glues its first record onto the torn one."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._line_started = False  # whether this writer has checked that the file ends a line

    def append(self, record: Mapping[str, Any]) -> None:
        if self.path is None:
            return
        text = json.dumps(dict(record), default=str) + "\n"
        if not self._line_started:
            if self.path.exists() and self.path.stat().st_size:
                with self.path.open("rb") as log:
                    log.seek(-1, 2)
                    text = ("" if log.read(1) == b"\n" else "\n") + text
            self._line_started = True
        with self.path.open("a") as out:
            out.write(text)

    def read(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return []
        records = []
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                logger.warning("%s:%d skipped: a record cut short by a crash (%s)", self.path, number, exc)
        return records

    def replay(self) -> dict[str, Any]:
        """The log sorted back into {membership, dropped, recoveries, rounds, validations} lists, the actor
        ids that wrote it (a restarted actor finds its own id) and the training clock's last reading."""
        records = self.read()
        kinds = {"membership": [], "recovery": [], "round": [], "validation": []}
        for record in records:
            kinds.get(record.pop("type", None), []).append(record)
        out: dict[str, Any] = {"records": records, "membership": kinds["membership"]}
        out.update(recoveries=kinds["recovery"], rounds=kinds["round"], validations=kinds["validation"])
        drops = [r for r in kinds["membership"] if r["event"] == "drop"]
        out["dropped"] = [
            {**{k: r[k] for k in ("round", "learner", "time")}, "reason": r["detail"]} for r in drops
        ]
        out["actors"] = {r["actor"] for r in records if r.get("actor")}
        out["elapsed_s"] = max([float(r.get("elapsed_s", 0.0)) for r in records], default=0.0)
        return out


class RunClock:
    """The run's training clock: seconds since the first join, continued across restarts and resumes."""

    def __init__(self) -> None:
        self._offset, self._start = 0.0, None

    def start(self) -> None:
        """Start it (at the first join); a running clock is left alone."""
        if self._start is None:
            self._start = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since ``start``, on top of the reading continued from (0 before either)."""
        if self._start is None:
            return self._offset
        return self._offset + time.monotonic() - self._start

    def continue_from(self, elapsed_s: float) -> None:
        """Continue from a restored reading (never moves the clock back)."""
        self._offset = max(self._offset, float(elapsed_s))


class RunHistory:
    """Everything the averager records about a run, and the event log that outlives its restarts.

    ``actor`` is the averager's Ray actor id (the same across Ray's restarts of it), stamped on every
    round and validation so that a restarted actor finds its own records in the log.
    """

    def __init__(
        self, log_path: Path | None = None, *, actor: str | None = None, tracker: Any = None
    ) -> None:
        self.log = EventLog(log_path)
        self.actor = actor
        # Live tracking (raytrain_seq.outputs.tracking): anything with scalars(values, step) and text(tag, value, step).
        self.tracker = tracker
        self._last_round_at = 0.0
        self.totals: dict[LearnerId, dict[str, float]] = {}
        self.batch_history: list[dict[str, Any]] = []
        self.validation_history: list[dict[str, Any]] = []
        self.loss_history: list[dict[str, Any]] = []
        self.round_seconds: list[float] = []
        # round -> (each learner's summed stats, seconds) of the record that counts for it: a round the
        # averager logged and then died before any learner took its result is averaged again after the
        # restart (the learners resend it), and only that second record may count.
        self._recorded: dict[int, tuple[list, float]] = {}
        # Rounds an earlier run logged past the checkpoint this resumed run starts from (``expect_redo``).
        self._lost: set[int] = set()
        self.failed_rounds: list[dict[str, Any]] = []
        self.recoveries: list[dict[str, Any]] = []
        self.clock = RunClock()

    # ------------------------------------------------------------------------------------- records
    def on_member(self, record: dict[str, Any]) -> None:
        """RoundBook's sink: time-stamp, persist, and count drops and returns as recoveries."""
        record["elapsed_s"] = self.clock.elapsed()
        self.log.append({"type": "membership", **record})
        if record["event"] == "drop":
            self.recover(
                "dropped",
                f"learner {record['learner']!r} dropped from round {record['round']}: {record['detail']}",
            )
        elif record["event"] == "rejoin" and record["change"]:
            self.recover("rejoined", f"learner {record['learner']!r} rejoined at round {record['round']}")

    def recover(self, kind: str, detail: str) -> None:
        record = {"time": time.time(), "elapsed_s": self.clock.elapsed(), "kind": kind, "detail": detail}
        self.recoveries.append(record)
        self.log.append({"type": "recovery", **record})
        logger.warning("averager: %s: %s", kind, detail)
        if self.tracker is not None:
            step = self.loss_history[-1]["round"] if self.loss_history else 0
            self.tracker.scalars({"recoveries/count": len(self.recoveries)}, step)
            self.tracker.text("recoveries", f"{kind}: {detail}", step)

    def _learner(self, learner: LearnerId) -> dict[str, float]:
        return self.totals.setdefault(learner, {"rounds": 0, "averaging_s": 0.0})

    def add_averaging_time(self, learner: LearnerId, seconds: float, waiting: float = 0.0) -> None:
        """Time a learner spent inside an averaging call (waiting included); ``waiting``: the part of it
        between its arrival and the round's last arrival (or its deadline), i.e. waiting for the others."""
        totals = self._learner(learner)
        totals["averaging_s"] += seconds
        totals["waiting_s"] = totals.get("waiting_s", 0.0) + waiting

    def record_round(
        self,
        round: int,
        *,
        seconds: float,
        batch_size: int,
        position: Mapping | None,
        stats: Iterable[tuple[LearnerId, Mapping[str, float]]],
        processes: Mapping[LearnerId, Mapping[str, Any]] | None = None,
    ) -> None:
        """A finished round: add each learner's stats to its totals, log the sequence-weighted mean loss.

        A round recorded before (its record logged by this actor before a restart, its result held by no
        learner, so the learners sent it again) replaces the earlier record: totals and histories count
        each round once, and the log marks the new record ``redo``; so does a round of ``expect_redo``.
        The record also holds its wall ``time`` and, per learner, its process (``processes``: incarnation
        and node) with the wall time of its first step since its last round (``first_step_wall``) and the
        longest gap between two of its steps (``longest_gap_s``, the wait for the last round included)."""
        redo = round in self._recorded or round in self._lost
        if round in self._recorded:
            self._forget_round(round)
            self.recover("round_redone", f"round {round} averaged again after a restart: no learner held it")
        self._lost.discard(round)
        losses, added, procs = [], [], []
        for learner, learner_stats in stats:
            totals = self._learner(learner)
            totals["rounds"] += 1
            summed = {key: value for key, value in learner_stats.items() if key not in UNSUMMED}
            for key, value in summed.items():
                totals[key] = totals.get(key, 0) + value
            added.append([learner, summed])
            proc = {"learner": learner, **(processes or {}).get(learner, {})}
            times = {key: learner_stats.get(key) for key in ("first_step_wall", "longest_gap_s")}
            procs.append({**proc, **times})
            loss, n = learner_stats.get("loss", math.nan), learner_stats.get("sequences", 0)
            if math.isfinite(loss) and n > 0:
                losses.append((loss, n))
        now = self.clock.elapsed()
        mean = sum(v * n for v, n in losses) / sum(n for _, n in losses) if losses else math.nan
        self.loss_history.append({"round": round, "loss": mean, "time_s": now})
        self.batch_history.append({"round": round, "batch_size": batch_size, "time_s": now})
        self.round_seconds.append(seconds)
        self._recorded[round] = (added, seconds)
        record = {"type": "round", "actor": self.actor, "round": round, "seconds": seconds}
        record.update(loss=mean, batch_size=batch_size, elapsed_s=now, stats=added, position=position)
        record.update(time=time.time(), processes=procs)
        if redo:
            record["redo"] = True
        self.log.append(record)
        if self.tracker is not None:
            self.tracker.scalars(
                _round_scalars(added, mean, batch_size, seconds, now - self._last_round_at), round
            )
        self._last_round_at = now

    def record_validation(
        self,
        round: int,
        accuracy: float,
        *,
        batch_size: int,
        grew: bool,
        epoch: Any,
        metrics: Mapping[str, float] | None = None,
    ) -> None:
        """A reported validation; ``metrics`` may add ``top5_accuracy`` and ``mean_class_accuracy``."""
        record = {"round": round, "accuracy": float(accuracy), "batch_size": batch_size, "grew": grew}
        record.update(
            epoch=epoch, missed=False, time=time.time(), time_s=self.clock.elapsed(), **dict(metrics or {})
        )
        self.validation_history.append(record)
        self.log.append({"type": "validation", "actor": self.actor, **record})
        if self.tracker is not None:
            extra = dict(metrics or {})
            values = {"val/top1": float(accuracy), "val/top5": extra.get("top5_accuracy")}
            values["val/mean_class_accuracy"] = extra.get("mean_class_accuracy")
            self.tracker.scalars(values, round)

    def record_missed_validation(self, round: int, batch_size: int, *, reason: str) -> None:
        """A validation nobody scored (``rounds.validation``): B stays; ``reason`` says why."""
        record = {"round": round, "accuracy": None, "batch_size": batch_size, "missed": True}
        self.validation_history.append({**record, "reason": reason, "time": time.time()})

    def record_failed_round(self, round: int, error: BaseException) -> None:
        self.failed_rounds.append({"round": round, "error": repr(error), "time": time.time()})

    def mark_start(self) -> None:
        """Log that an averager process started (a restarted one finds its actor id here later)."""
        self.log.append({"type": "start", "actor": self.actor, "time": time.time()})

    # ------------------------------------------------------------------------- checkpoint, restart
    def checkpoint_part(self, *, due: int | None, dropped: Sequence[dict[str, Any]]) -> CheckpointHistory:
        """The histories a checkpoint keeps (plain lists), for ``restore_checkpoint_part``, with the
        validation ``due`` and the round book's ``dropped`` log."""
        return CheckpointHistory(
            batch_size_history=list(self.batch_history),
            validation_history=list(self.validation_history),
            loss_history=list(self.loss_history),
            validation_due=due,
            dropped_log=list(dropped),
        )

    def restore_checkpoint_part(self, part: Mapping[str, Any], elapsed_s: float) -> None:
        self.batch_history = list(part.get("batch_size_history", ()))
        self.validation_history = list(part.get("validation_history", ()))
        self.loss_history = list(part.get("loss_history", ()))
        self.clock.continue_from(elapsed_s)

    def adopt_log(self, past: Mapping[str, Any]) -> None:
        """Take the recoveries and the clock of a replayed log (a resume or a restart)."""
        self.recoveries = list(past["recoveries"])
        self.clock.continue_from(past["elapsed_s"])

    def expect_redo(self, rounds: Iterable[int]) -> None:
        """Rounds a stopped run logged after the checkpoint a resume starts from: their averaged state was
        lost with that run's averager, so this run averages them again and logs each one as a ``redo``."""
        self._lost.update(rounds)

    def replay_rounds(self, past: Mapping[str, Any], *, after: int) -> None:
        """After a restart: this actor's rounds and validations from the log, so that totals and histories
        cover the rounds since the reloaded checkpoint (round ``after``) too."""
        for record in (r for r in past["rounds"] if r["actor"] == self.actor):
            if record["round"] in self._recorded:  # a redo in the log: the later record counts
                # (histories up to the checkpoint's round come from the checkpoint, already deduplicated)
                self._forget_round(record["round"], histories=record["round"] > after)
            self._recorded[record["round"]] = (record["stats"], record["seconds"])
            for learner, stats in record["stats"]:
                totals = self._learner(learner)
                totals["rounds"] += 1
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0) + value
            self.round_seconds.append(record["seconds"])
            if record["round"] > after:
                at = {"round": record["round"], "time_s": record["elapsed_s"]}
                self.loss_history.append({**at, "loss": record["loss"]})
                self.batch_history.append({**at, "batch_size": record["batch_size"]})
        mine = [v for v in past["validations"] if v["actor"] == self.actor and v["round"] > after]
        self.validation_history += [{k: v for k, v in record.items() if k != "actor"} for record in mine]

    def learners_of(self, round: int) -> set[LearnerId]:
        """The learners averaged in ``round`` as this actor recorded it (a restarted one: from the log);
        empty when it holds no record of it."""
        added = self._recorded.get(round, ((), 0.0))[0]
        return {learner for learner, _ in added}

    def _forget_round(self, round: int, *, histories: bool = True) -> None:
        """Take a recorded round back out of the totals and histories (it is about to be recorded again)."""
        added, seconds = self._recorded.pop(round)
        for learner, summed in added:
            totals = self._learner(learner)
            totals["rounds"] -= 1
            for key, value in summed.items():
                totals[key] = totals.get(key, 0) - value
        self.round_seconds.remove(seconds)
        if histories:
            self.loss_history = [h for h in self.loss_history if h["round"] != round]
            self.batch_history = [h for h in self.batch_history if h["round"] != round]

    def summary(self) -> dict[str, Any]:
        """Per-learner totals and the histories, as plain data."""
        learners = {learner: dict(totals) for learner, totals in self.totals.items()}
        return {
            "rounds_completed": len(self.round_seconds),
            "learners": learners,
            "total_averaging_s": sum(t["averaging_s"] for t in learners.values()),
            "round_seconds": list(self.round_seconds),
            "recoveries": list(self.recoveries),
            "failed_rounds": list(self.failed_rounds),
            "batch_size_history": list(self.batch_history),
            "validation_history": list(self.validation_history),
            "loss_history": list(self.loss_history),
            "elapsed_s": self.clock.elapsed(),
        }


def _round_scalars(
    stats: list, loss: float, batch_size: int, seconds: float, since_last: float
) -> dict[str, float | None]:
    """A round's tracking scalars from its learners' stats (``[[learner, {frames, compute_s, ...}], ...]``).

    Frames per second: the round's frames over the time since the previous round closed, e.g. 2 learners
    of 3,000 frames each in a round 4 s after the last one: 6,000 / 4 = 1,500 frames per second.
    """
    n = max(len(stats), 1)
    frames = sum(s.get("frames", 0.0) for _, s in stats)
    out: dict[str, float | None] = {"train/loss": loss if math.isfinite(loss) else None}
    out.update({"train/batch_size": batch_size, "train/learners": len(stats), "time/round_s": seconds})
    out["train/frames_per_second"] = frames / since_last if since_last > 0 else None
    for key in ("compute_s", "data_wait_s"):
        out[f"time/{key}"] = sum(s.get(key, 0.0) for _, s in stats) / n
    # The training threads' wait for a CPU: only where the learners' kernels report it (``Tally``).
    waits = [s["cpu_wait_s"] for _, s in stats if "cpu_wait_s" in s]
    out["time/cpu_wait_s"] = sum(waits) / len(waits) if waits else None
    return out


def describe_position(position: Mapping | None) -> str:
    """ "epoch 2, 12 rows taken by each of 3 learners" for a position dict (None: the start).

    Epochs are shown 1-based, as in the learners' log (position epoch 1 is "epoch 2").
    """
    if not position:
        return "the start"
    if not position.get("rows_done"):
        return f"start of epoch {position['epoch'] + 1}"
    rows, world = position["rows_done"], position["world_size"]
    return f"epoch {position['epoch'] + 1}, {rows} rows taken by each of {world} learners"


def describe_progress(position: Any, shard_rows: int, epochs: int) -> str:
    """Where a round falls: "epoch 3/10 done" at an epoch's end, or "epoch 4/10, 32/109 rows" inside.
    A round at a layout's last row (K = -1: every round) still carries that row's position, 109 of 109:
    the epoch is done there too."""
    if position.rows_done == 0:
        return f"epoch {position.epoch}/{epochs} done"
    if position.rows_done >= shard_rows and not position.history:
        return f"epoch {position.epoch + 1}/{epochs} done"
    return f"epoch {position.epoch + 1}/{epochs}, {position.rows_done}/{shard_rows} rows"


def membership_entries(membership: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The run summary's membership: ``{time_s, learners, reason}`` for each change of the learner count
    (a group started or restarted, a learner dropped, rejoined or left) in the averager's membership log
    (``reports.AveragingReport.membership``)."""
    out = []
    for record in membership:
        if record.get("change"):
            reason = record["detail"] or f"learner {record['learner']!r} {record['event']}"
            if record["event"] == "drop":
                reason = f"learner {record['learner']!r} dropped from round {record['round']}: {reason}"
            elif record["event"] == "rejoin":
                reason = f"learner {record['learner']!r} rejoined at round {record['round']}"
            out.append(
                {
                    "time_s": float(record.get("elapsed_s", 0.0)),
                    "learners": record["learners"],
                    "reason": reason,
                }
            )
    return out


def recovery_entries(recoveries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The run summary's recoveries: ``{time_s, kind, detail}`` from the averager's
    (``reports.AveragingReport.recoveries``)."""
    return [
        {"time_s": float(r.get("elapsed_s", 0.0)), "kind": r["kind"], "detail": r["detail"]}
        for r in recoveries
    ]
