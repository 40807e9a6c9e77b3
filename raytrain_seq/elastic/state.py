"""What the averager hands out and keeps: round results, join info, snapshots, checkpoints, the event log.

Plain data and files, no ray and no asyncio: ``RoundResult`` (what every learner of a round receives),
``JoinInfo`` (where a joining learner starts), ``Snapshot`` (what a checkpoint stores, loadable with
``torch.load(weights_only=True)``), ``check_payload`` (a learner's payload, checked), the run folder's
checkpoints (``latest_checkpoint``, ``load_snapshot``: the newest one that loads, so a checkpoint cut
short by a crash falls back to the one before), ``EventLog``, the append-only JSON-lines log of
membership changes, recoveries and rounds that outlives an averager restart, and ``RunFolder``, the
averager's side that writes and replays it. ``membership_entries`` and ``recovery_entries`` turn the
averager's summary into the run summary's lists. Trade-off: the event log costs one small write per
event and per round on the driver's node, and lets a restarted averager (and a resumed run) report the
whole run instead of what happened since its last checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from raytrain_seq.elastic.rounds import Learner, check_number

logger = logging.getLogger(__name__)

STATE_FILE = "state.pt"
EVENTS_FILE = "events.jsonl"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest ``checkpoint_round_NNNNNN`` folder of a run (names sort by round), or None."""
    found = sorted(p for p in Path(run_dir).glob("checkpoint_round_*") if (p / STATE_FILE).exists())
    return found[-1] if found else None


def load_snapshot(run_dir: Path) -> tuple[dict[str, Any], Path] | None:
    """The averager snapshot of the newest checkpoint that loads (``weights_only=True``), and its folder.

    A checkpoint cut short by a crash mid-upload fails to load and the next older one is used.
    """
    for folder in sorted(Path(run_dir).glob("checkpoint_round_*"), reverse=True):
        try:
            state = torch.load(folder / STATE_FILE, weights_only=True)
        except (OSError, RuntimeError, EOFError) as exc:
            logger.warning("averager: %s does not load (%s): trying the one before", folder.name, exc)
            continue
        return state["averager"], folder
    return None


@dataclass(frozen=True)
class RoundResult:
    """What every learner of a round receives (the same object for all)."""

    round: int
    params: dict[str, Tensor]
    optimizer_state: dict | None  # merged Adam state; None when the optimizer keeps no Adam moments
    batch_size: int  # B for the next round
    learners: tuple[Learner, ...]  # averaged, in this order
    dropped: tuple[Learner, ...]
    seconds: float  # first arrival -> result
    weights: tuple[float, ...]
    position: dict | None = None  # EpochPosition.as_dict() after this round's rows
    adaptive_state: dict | None = None  # AdaptiveBatchSize.state_dict(): what a re-seed restores


@dataclass(frozen=True)
class JoinInfo:
    """Where a (re)joining learner starts: the round to send next and the latest averaged state."""

    learner: Learner
    round: int
    params: dict[str, Tensor] | None
    optimizer_state: dict | None
    batch_size: int
    adaptive_state: dict
    world_size: int
    position: dict | None = None  # where the latest round left the epoch (None: nothing averaged yet)
    latest_round: int = 0
    elapsed_s: float = 0.0  # the run's training clock: learners' time stamps continue it
    source: str = "none"  # where the latest state came from: "live", "checkpoint", "seed" or "none"


@dataclass(frozen=True)
class Snapshot:
    """The latest averaged state and the logs a restarted averager needs; round 0 means none yet."""

    round: int
    params: dict[str, Tensor] | None
    optimizer_state: dict | None
    batch_size: int
    adaptive_state: dict
    validation_due: int | None = None
    dropped_log: tuple = ()
    batch_size_history: tuple = ()
    validation_history: tuple = ()
    position: dict | None = None
    loss_history: tuple = ()
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class Arrival:
    """One learner's checked payload for a round."""

    params: Mapping[str, Tensor]
    optimizer_state: Mapping | None
    stats: dict[str, float]
    weight: float
    adam: bool
    signature: tuple
    position: Mapping | None = None


def has_adam_moments(state: Mapping | None) -> bool:
    """True if the optimizer keeps Adam moments; SGD without momentum keeps none (an empty state)."""
    kinds = {isinstance(entry, Mapping) and "exp_avg" in entry for entry in (state or {}).values()}
    if len(kinds) > 1:
        raise ValueError(
            "optimizer_state has exp_avg for some parameters only: send one optimizer's whole state"
        )
    return kinds == {True}


def check_payload(
    params: Any, optimizer_state: Any, stats: Any, weight: Any, position: Any = None
) -> Arrival:
    """Validate one learner's payload."""
    if not isinstance(params, Mapping) or not all(isinstance(t, Tensor) for t in params.values()):
        raise TypeError(
            "params must be a dict of tensors: send {k: v.cpu() for k, v in model.state_dict().items()}"
        )
    if any(t.device.type != "cpu" for t in params.values()):
        raise ValueError("params must be CPU tensors (the averager has no GPU): move them with .cpu() first")
    if optimizer_state is not None and not isinstance(optimizer_state, Mapping):
        raise TypeError("optimizer_state must be optimizer.state_dict()['state'] (a dict) or None")
    if optimizer_state is not None and {"state", "param_groups"} <= set(optimizer_state):
        raise TypeError("optimizer_state is a whole optimizer.state_dict(): send its ['state'] entry")
    stats = dict(stats or {})
    bad = [
        key for key, value in stats.items() if isinstance(value, bool) or not isinstance(value, int | float)
    ]
    if bad:
        raise TypeError(f"stats {bad} are not numbers: send only numeric totals (frames, compute_s, ...)")
    weight = float(check_number("weight", weight, 0, int | float))
    if position is not None and not isinstance(position, Mapping):
        raise TypeError("position must be EpochPosition.as_dict() (a dict) or None")
    signature = tuple((key, tuple(t.shape), t.dtype) for key, t in params.items())
    adam = has_adam_moments(optimizer_state)
    return Arrival(params, optimizer_state, stats, weight, adam, signature, position)


class EventLog:
    """Append-only JSON lines at ``path`` (None: memory only, nothing written); ``read()`` loads them back."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def append(self, record: Mapping[str, Any]) -> None:
        if self.path is not None:
            with self.path.open("a") as out:
                out.write(json.dumps(dict(record), default=str) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

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


class RunFolder:
    """The ParameterAverager's run-folder side (a mixin): the training clock, the event log, and the
    reload after a resume or a restart. It uses the actor's book, batch state and histories."""

    def _elapsed(self) -> float:
        """The run's training clock: seconds since the first join, continued across restarts."""
        if self._clock_start is None:
            return self._clock_offset
        return self._clock_offset + time.monotonic() - self._clock_start

    def _on_member(self, record: dict[str, Any]) -> None:
        """RoundBook's sink: time-stamp, persist, and count drops and returns as recoveries."""
        record["elapsed_s"] = self._elapsed()
        self._log.append({"type": "membership", **record})
        if record["event"] == "drop":
            self._recover(
                "dropped",
                f"learner {record['learner']!r} dropped from round {record['round']}: {record['detail']}",
            )
        elif record["event"] == "rejoin" and record["change"]:
            self._recover("rejoined", f"learner {record['learner']!r} rejoined at round {record['round']}")

    def _recover(self, kind: str, detail: str) -> None:
        record = {"time": time.time(), "elapsed_s": self._elapsed(), "kind": kind, "detail": detail}
        self._recoveries.append(record)
        self._log.append({"type": "recovery", **record})
        logger.warning("averager: %s: %s", kind, detail)

    def _load_run(self, run_dir: Path, actor: str | None) -> None:
        """Reload the events log and the latest checkpoint; tell a restart by Ray (same actor id) from a
        first start (a new run, or a --resume)."""
        self._actor = actor
        past = self._log.replay()
        self._events_loaded = bool(past["records"])
        self._book.membership_log, self._book.dropped_log = past["membership"], past["dropped"]
        self._recoveries, self._clock_offset = past["recoveries"], past["elapsed_s"]
        restarted = actor is not None and actor in past["actors"]
        self._log.append({"type": "start", "actor": actor, "time": time.time()})
        self._book.restarted = restarted
        found = load_snapshot(run_dir)
        if found is not None:
            self._restore(Snapshot(**found[0]))
        if restarted:
            self._clock_start = time.monotonic()  # the run is under way: its clock keeps going
            self._replay_rounds(past, actor)
            what = f"reloaded {found[1].name}" if found else "no checkpoint yet"
            self._recover(
                "averager_restart", f"Ray restarted the averager; {what}: learners ahead of it re-seed it"
            )
        elif found is not None:
            self._recover("resumed", f"run resumed from {found[1].name} (round {found[0]['round']})")

    def _replay_rounds(self, past: dict[str, Any], actor: str) -> None:
        """After a restart: this actor's rounds and validations from the log, so that totals and histories
        cover the rounds since the reloaded checkpoint too (the learners re-seed their state)."""
        after = self._latest[0]
        for record in (r for r in past["rounds"] if r["actor"] == actor):
            for learner, stats in record["stats"]:
                totals = self._totals.setdefault(learner, {"rounds": 0, "averaging_s": 0.0})
                totals["rounds"] += 1
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0) + value
            self._round_seconds.append(record["seconds"])
            if record["round"] > after:
                at = {"round": record["round"], "time_s": record["elapsed_s"]}
                self._loss_history.append({**at, "loss": record["loss"]})
                self._batch_history.append({**at, "batch_size": record["batch_size"]})
        mine = [v for v in past["validations"] if v["actor"] == actor and v["round"] > after]
        self._validation_history += [{k: v for k, v in record.items() if k != "actor"} for record in mine]


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


def membership_entries(averaging: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run summary's membership: ``{time_s, learners, reason}`` for each change of the learner count
    (a group started or restarted, a learner dropped, rejoined or left) in the averager's log."""
    out = []
    for record in averaging.get("membership", []):
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


def recovery_entries(averaging: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run summary's recoveries: ``{time_s, kind, detail}`` from the averager's log."""
    return [
        {"time_s": float(r.get("elapsed_s", 0.0)), "kind": r["kind"], "detail": r["detail"]}
        for r in averaging.get("recoveries", [])
    ]
