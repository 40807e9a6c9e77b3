"""``GroupRecovery``: where a new learner group's state comes from, and a rejoining learner's re-seed.

A restarted or resized group (the round book's generation moved) starts from the latest averaged state;
``on_new_group``, from the run's second group on, records how it recovers: from scratch (no round averaged yet), from a
checkpoint (a restored state) or live (the state the averager held). A learner that rejoins a restarted
averager sends its last averaged state (``check_seed``: its tensors, or flat with its slices in hand); ``newer`` says whether it is ahead of the averager's (and checks
it then), and ``adopt`` takes it: the round book restarts from its round, the batch rule from its state,
and the history records a re-seed (or a checkpoint recovery, when the learner held the run's latest
checkpoint). The averager fails its open round in between, since its senders must rejoin. A seed of
the round the averager holds, while that state's tensors are not yet read from its checkpoint, lends it
its bytes (``in_hand``). Plain Python.
"""

from __future__ import annotations

import logging

from raytrain_seq.checkpoint import DeferredTensors
from raytrain_seq.members.ids import LearnerId
from raytrain_seq.rounds.batch_rule import BatchRule
from raytrain_seq.rounds.book import RoundBook
from raytrain_seq.rounds.events import RunHistory, describe_position
from raytrain_seq.rounds.state import AveragedState, check_payload

logger = logging.getLogger(__name__)

__all__ = ["GroupRecovery"]


class GroupRecovery:
    """Records group recoveries and adopts re-seeds for an averager's ``book``, ``batch`` rule and
    ``history``."""

    def __init__(self, *, book: RoundBook, batch: BatchRule, history: RunHistory) -> None:
        self._book, self._batch, self._history = book, batch, history

    def on_new_group(self, state: AveragedState) -> None:
        """A restarted or resized group starts from ``state``: record where it comes from."""
        if self._book.generation < 2:
            return  # the run's first group (or the learners rejoining a restarted averager)
        last, size, source = state.round, self._book.world_size, state.source
        where = describe_position(state.position)
        if last == 0:
            self._history.recover(
                "restart_from_scratch", f"the new group of {size} starts over: no round averaged yet"
            )
        else:
            kind = "checkpoint_recovery" if source == "checkpoint" else "live_recovery"
            how = "reloaded from a checkpoint" if source == "checkpoint" else "held by the averager"
            self._history.recover(
                kind, f"the new group of {size} starts from round {last}'s state {how} ({where})"
            )

    @staticmethod
    def check_seed(seed: object) -> None:
        """A learner's seed is its held state (an ``AveragedState``), with its tensors or flat with its
        slices in hand (``fetched``), or None."""
        if seed is not None and not isinstance(seed, AveragedState):
            raise TypeError(
                f"seed must be an AveragedState (the learner's held state), not {type(seed).__name__}"
            )
        if seed is not None and seed.flat is not None and not seed.flat.local:
            raise TypeError("seed lives in the object store: send seed.fetched(get), its slices in hand")

    @staticmethod
    def newer(seed: AveragedState, held: AveragedState) -> bool:
        """Whether a learner's ``seed`` is ahead of the ``held`` state (then it is checked, too)."""
        if seed.round <= held.round:
            return False
        if seed.flat is not None:
            check_payload(seed.flat, None, None, 1.0, seed.position)
        else:
            check_payload(seed.params, seed.optimizer_state, None, 1.0, seed.position)
        return True

    @staticmethod
    def in_hand(learner: LearnerId, seed: AveragedState, held: AveragedState) -> AveragedState | None:
        """``held`` with the bytes of ``seed``, a learner's copy of the same round, when ``held``'s tensors
        are not yet read from its checkpoint (``checkpoint.DeferredTensors``): the same averaged values
        (the checkpoint was written from them), in hand and flat, with no wait for torch and the file.
        None otherwise (the seed is not flat in hand, another round, or the tensors are read)."""
        if seed.round != held.round or seed.flat is None or not seed.flat.local:
            return None
        if not isinstance(held.params, DeferredTensors) or held.params.loaded:
            return None
        check_payload(seed.flat, None, None, 1.0, seed.position)
        logger.info("averager: round %d's state taken from learner %r's copy, not read from the checkpoint",
                    held.round, learner)  # fmt: skip
        return held.replace(params=None, optimizer_state=None, flat=seed.flat)

    def adopt(self, learner: LearnerId, seed: AveragedState, held: int) -> AveragedState:
        """Take ``learner``'s newer ``seed`` (the averager held round ``held``); returns the new state."""
        self._book.abandon()
        from_checkpoint = seed.source == "checkpoint"
        state = seed.replace(source="checkpoint" if from_checkpoint else "seed")
        if seed.adaptive_state:
            self._batch.load_state_dict(seed.adaptive_state)
        self._book.restore(seed.round)
        kind = "checkpoint_recovery" if from_checkpoint else "reseeded"
        where = "the run's latest checkpoint" if from_checkpoint else "the state it held"
        self._history.recover(
            kind, f"learner {learner!r} re-seeded round {seed.round} from {where} (the averager had {held})"
        )
        return state
