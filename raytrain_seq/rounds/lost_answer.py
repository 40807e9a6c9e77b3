"""A round sent to an averager that died on it: it may have closed with this learner's payload.

``LostAnswer`` keeps such a round (``Unanswered``: its number, work and rows, a host copy of the state
sent) from its deferral (``Deferred.answer_lost``) until a later outcome settles it. Every try sends its
work and rows ahead of its own (``merged``), as one round. ``Averaged``: the round was sent again and
closed, it is forgotten. ``Realigned`` to that very round with this learner in it (``JoinReply.took_part``,
from the restarted averager's record of the round): it closed with it, so the live state becomes its mean
plus the steps since (``rebase``: each parameter += now - sent), their work and rows the next round's, as
after an answer. A realignment to any other round drops them, as for any learner the others went on
without. A round held back at a layout's end (``HeldRound``) that is itself sent to a dying averager
takes the lost round's place (``into_held``). No ray.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from raytrain_seq.rounds.client import Averaged, Deferred, Realigned
from raytrain_seq.rounds.sync import Held, HeldRound, LocalRounds, Stats, TrainedIds

__all__ = ["LostAnswer", "Unanswered", "merged_ids", "merged_stats"]


@dataclass(frozen=True)
class Unanswered:
    """A round whose answer died with the averager: its number, work, rows and the state sent."""

    round: int
    delta: Stats
    ids: TrainedIds
    sent: Held


def merged_stats(earlier: Stats, later: Stats) -> Stats:
    """Two flushes' work as one round's (``Tally.flush``): totals summed, the loss weighted by sequences,
    the first step's wall time the earlier one's, the longest gap the longer."""
    out = {
        key: earlier[key] + later[key] for key in ("frames", "sequences", "steps", "compute_s", "data_wait_s")
    }
    waits = [d["cpu_wait_s"] for d in (earlier, later) if "cpu_wait_s" in d]
    if waits:
        out["cpu_wait_s"] = sum(waits)
    losses = [(d["loss"], d["sequences"]) for d in (earlier, later) if d["sequences"]]
    out["loss"] = sum(v * n for v, n in losses) / out["sequences"] if losses else float("nan")
    walls = [d["first_step_wall"] for d in (earlier, later) if "first_step_wall" in d]
    if walls:
        out["first_step_wall"] = walls[0]
        out["longest_gap_s"] = max(d.get("longest_gap_s", 0.0) for d in (earlier, later))
    return out


def merged_ids(earlier: TrainedIds, later: TrainedIds) -> TrainedIds:
    """Two rounds' video ids per epoch, the earlier's first."""
    return {epoch: [*earlier.get(epoch, ()), *later.get(epoch, ())] for epoch in sorted({*earlier, *later})}


class LostAnswer:
    """The round of one learner (``rounds``: its ``LocalRounds``) whose answer was lost, if any."""

    def __init__(self, rounds: LocalRounds) -> None:
        self.rounds = rounds
        self.pending: Unanswered | None = None

    def merged(self, delta: Stats, ids: TrainedIds) -> tuple[Stats, TrainedIds]:
        """A round's work and rows with the lost round's ahead of them: what the next try sends."""
        if self.pending is None:
            return delta, ids
        return merged_stats(self.pending.delta, delta), merged_ids(self.pending.ids, ids)

    def now(self, defer: bool) -> Held | None:
        """A host copy of the live state before a round that may settle the lost one (the base of the
        steps kept, ``rebase``); None when there is none, or the round is deferred at once (``defer`` and
        the averager known down: ``AveragerClient.defers``)."""
        if self.pending is None or (defer and self.rounds.client.defers() is not None):
            return None
        return self.rounds.hold()

    def sent(self, decision: Any, delta: Stats, ids: TrainedIds) -> None:
        """After a try that sent ``delta`` and ``ids`` (``merged``): a deferral whose answer was lost keeps
        the round (its state is still the live one), an averaged round forgets it."""
        if isinstance(decision, Deferred) and decision.answer_lost:
            self.pending = Unanswered(decision.round, delta, ids, self.rounds.hold())
        elif isinstance(decision, Averaged):
            self.pending = None

    def closed_with(self, decision: Any) -> Unanswered | None:
        """The lost round when ``decision`` is a realignment that finds it averaged with this learner in
        it, else None. A realignment settles it either way (to any other round: the steps since are
        dropped); other decisions leave it (``sent``)."""
        if not isinstance(decision, Realigned):
            return None
        lost, self.pending = self.pending, None
        if lost is None:
            return None
        reply = decision.reply
        return lost if reply.took_part and reply.state.round == lost.round else None

    def rebase(self, now: Held, lost: Unanswered) -> None:
        """The live state (the lost round's mean, installed) plus the steps since it was sent (``now``)."""
        self.rounds.keep_steps(now, lost.sent)

    def into_held(self, held: HeldRound, decision: Deferred) -> HeldRound:
        """The round held back; one sent to an averager that died on it takes the work and rows that went
        with it, and the lost round's place: its own answer is the one lost now."""
        if not decision.answer_lost:
            return held
        lost, self.pending = self.pending, None
        return replace(held, delta=lost.delta, ids=lost.ids)
