"""``RunFolder``: what an averager reloads from its run folder when it starts, and a checkpoint's restore.

At construction an averager given a run folder replays its events log (``rounds.events.EventLog``:
membership, drops, recoveries and the clock) and restores the latest checkpoint. It tells a restart by
Ray (its actor id wrote the log before) from a first start (a new run, or a --resume): a restarted
averager keeps the run's clock going, takes back its own rounds since the checkpoint from the log
(``RunHistory.replay_rounds``) and records the restart, since the learners ahead of the checkpoint will
re-seed it; a resumed run records the resume (from the start when its run stopped before the first
checkpoint), naming the rounds the stopped run averaged after the checkpoint (lost with its averager:
they are averaged again, logged as ``redo``). ``restore`` puts a checkpoint's state into the round book,
the batch rule, the validation machine (its due validation comes back due) and the history, keeping the
log's drops when the log was read (it has the drops since the checkpoint too), and returns the state to
hold, its tensors deferred (``checkpoint.DeferredTensors``: a restart needs no torch). Plain Python and
files: the checkpoint loader is injected.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from raytrain_seq import checkpoint
from raytrain_seq.rounds.batch_rule import BatchRule
from raytrain_seq.rounds.book import RoundBook
from raytrain_seq.rounds.events import RunHistory
from raytrain_seq.rounds.state import AveragedState
from raytrain_seq.rounds.validation import Restored, ValidationMachine

__all__ = ["RunFolder"]


class RunFolder:
    """Loads a run folder into an averager's ``book``, ``batch`` rule, ``validation`` machine and
    ``history``; ``load_latest``: the latest checkpoint of a folder or None (``checkpoint.load_latest``,
    its tensors deferred)."""

    def __init__(
        self,
        *,
        book: RoundBook,
        batch: BatchRule,
        validation: ValidationMachine,
        history: RunHistory,
        load_latest: Callable[[Path], checkpoint.Checkpoint | None] | None = None,
    ) -> None:
        self._book, self._batch, self._validation, self._history = book, batch, validation, history
        self._load_latest = load_latest or functools.partial(checkpoint.load_latest, defer_tensors=True)
        self._events_loaded = False

    def load(self, run_dir: Path, *, restarted_by_ray: bool, state: AveragedState) -> AveragedState:
        """Reload the events log and the latest checkpoint of ``run_dir``; returns the state to hold
        (the checkpoint's, or ``state`` when there is none)."""
        past = self._history.log.replay()
        self._events_loaded = bool(past["records"])
        self._book.membership_log, self._book.dropped_log = past["membership"], past["dropped"]
        self._history.adopt_log(past)
        restarted = restarted_by_ray and self._history.actor in past["actors"]
        self._history.mark_start()
        self._book.restarted = restarted
        found = self._load_latest(run_dir)
        if found is not None:
            state = self.restore(found)
        if restarted:
            self._history.clock.start()  # the run is under way: its clock keeps going
            self._history.replay_rounds(past, after=state.round)
            what = f"reloaded {found.folder.name}" if found else "no checkpoint yet"
            self._history.recover(
                "averager_restart", f"Ray restarted the averager; {what}: learners ahead of it re-seed it"
            )
        elif found is not None or self._events_loaded:  # a resume (a new run's folder has no log)
            # Rounds the stopped run averaged after its newest checkpoint died with its averager: redone.
            after = 0 if found is None else found.round
            lost = sorted({r["round"] for r in past["rounds"] if r["round"] > after})
            self._history.expect_redo(lost)
            detail = "run resumed from the start (no checkpoint yet)"
            if found is not None:
                detail = f"run resumed from {found.folder.name} (round {found.round})"
            if lost:
                span = f"round {lost[0]}" if len(lost) == 1 else f"rounds {lost[0]}-{lost[-1]}"
                detail += f"; {span} of the stopped run, lost with its averager, averaged again"
            self._history.recover("resumed", detail)
        return state

    def restore(self, found: checkpoint.Checkpoint) -> AveragedState:
        """Put a loaded checkpoint into the book, the batch rule, the validation machine and the history;
        returns its state to hold."""
        history = found.history
        self._batch.load_state_dict(found.state.adaptive_state)
        # Drops since the checkpoint are in the events log when there is one: keep those.
        drops = None if self._events_loaded else history.get("dropped_log", ())
        self._book.restore(found.state.round, drops)
        self._validation.on(Restored(found.state.round, history.get("validation_due")))
        state = found.state.replace(source="checkpoint")
        self._history.restore_checkpoint_part(history, found.state.elapsed_s)
        return state
