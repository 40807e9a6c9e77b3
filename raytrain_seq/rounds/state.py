"""The latest averaged state, one type for every place that hands it around, and a learner's checked payload.

``AveragedState`` is what a round gives every learner, what a (re)joining learner starts from, what a
checkpoint stores and what re-seeds a restarted averager. Frozen, built by keyword; ``to_dict`` and
``from_dict`` give plain values for ``torch.load(weights_only=True)``; round 0 (``params`` None) means
nothing averaged yet. In the object store, ``flat`` holds the layout and the refs of its merged slices
(``params`` and ``optimizer_state`` None): ``fetched(get)`` reads the slices into local arrays, still
flat (what a learner holds, installs and re-seeds with); ``materialise(get)`` gives plain tensors
(checkpoints). The control plane never reads the bytes.
``RoundResult`` (the state plus who took part) and ``JoinReply`` (the state plus the round a joining
learner sends next) add only what is not state. ``check_payload`` validates one learner's round (CPU
tensors, the optimizer's ``["state"]``, numeric stats) into an ``Arrival``, whose ``signature`` lets the
averager refuse a learner whose model or optimizer differs without failing the round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raytrain_seq.checks import check_number
from raytrain_seq.dataplane.payload import FlatPayload
from raytrain_seq.members.ids import LearnerId

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "SOURCES",
    "Arrival",
    "AveragedState",
    "CheckpointHistory",
    "JoinReply",
    "RoundResult",
    "check_payload",
]

# Where a state came from: an averaging round of the live group, a checkpoint, a learner's re-seed, or
# nothing yet. The averager records a group restart as a live or a checkpoint recovery by it.
SOURCES = ("live", "checkpoint", "seed", "none")


@dataclass(frozen=True, kw_only=True)
class AveragedState:
    """The latest averaged model, Adam moments, batch size and epoch position after round ``round``."""

    round: int = 0
    """The averaged round this state closes; 0 = nothing averaged yet (``params`` is then None)."""
    params: dict[str, Tensor] | None = None
    """The averaged ``model.state_dict()`` (CPU tensors)."""
    optimizer_state: dict | None = None
    """The merged Adam moments (``optimizer.state_dict()["state"]``); None when none are merged."""
    batch_size: int
    """B for the round after this one (AAVG's adaptive batch size)."""
    adaptive_state: dict = field(default_factory=dict)
    """``AdaptiveBatchSize.state_dict()``: what a restore needs to keep deciding B the same way."""
    position: dict | None = None
    """``EpochPosition.as_dict()`` once this round's rows are trained; None = the start of the run."""
    elapsed_s: float = 0.0
    """The run's training clock when this state was made (a restarted group continues it)."""
    source: str = "none"
    """Where the state came from: one of ``SOURCES``."""
    flat: FlatPayload | None = None
    """The weights and moments as merged slices in the object store (then params is None); see the doc."""

    def __post_init__(self) -> None:
        check_number("round", self.round, 0)
        check_number("batch_size", self.batch_size, 1)
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        if self.round and self.params is None and self.flat is None:
            raise ValueError(f"round {self.round} has no params: an averaged round always carries its model")
        if self.flat is not None and not isinstance(self.flat, FlatPayload):
            raise TypeError(f"flat must be a FlatPayload, not {type(self.flat).__name__}")

    @property
    def empty(self) -> bool:
        """Nothing averaged yet (a fresh averager that found no checkpoint)."""
        return self.round == 0

    def fetched(self, get: Callable[[Sequence[Any]], list[Any]]) -> AveragedState:
        """This state with its merged slices read through ``get`` (``FlatPayload.local``: the arrays, zero
        copies of the store's objects), still flat: what a learner holds, installs (``FlatStorage``
        writes a slice with one copy) and materialises only when it needs the tensors."""
        if self.flat is None or self.flat.local:
            return self
        return self.replace(flat=dataclasses.replace(self.flat, parts=tuple(get(list(self.flat.parts)))))

    def materialise(self, get: Callable[[Sequence[Any]], list[Any]]) -> AveragedState:
        """This state with plain tensors: the merged slices read through ``get`` unless they are local
        already (zero-copy where a tensor lies in one slice; see ``FlatLayout.unpack``); a state already
        in tensors is returned as is."""
        if self.flat is None:
            return self
        parts = self.flat.parts if self.flat.local else get(list(self.flat.parts))
        params, moments = self.flat.layout.unpack(parts, self.flat.extras)
        return self.replace(params=params, optimizer_state=moments, flat=None)

    def to_dict(self) -> dict[str, Any]:
        """Plain fields (tensors, numbers, strings, dicts): ``torch.save`` it, load with weights_only=True."""
        if self.flat is not None:
            raise ValueError("this state lives in the object store: materialise(get) it before saving")
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del out["flat"]  # always None here; the checkpoint format stays as it was
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> AveragedState:
        """Rebuild from ``to_dict()``; an unknown key is a ValueError naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown averaged-state fields {unknown}: expected some of {sorted(known)}")
        return cls(**values)

    def replace(self, **changes: Any) -> AveragedState:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class RoundResult:
    """What every learner of a round receives (the same object for all)."""

    state: AveragedState
    """The averaged state after this round; ``state.round`` is the round."""
    learners: tuple[LearnerId, ...]
    """The learners averaged, in this order."""
    dropped: tuple[LearnerId, ...] = ()
    """The learners dropped from this round (they did not send it in time)."""
    seconds: float = 0.0
    """From the round's first arrival to its result."""
    weights: tuple[float, ...] = ()
    """Each averaged learner's weight in the mean."""
    channels: Any = None
    """A channel generation for this round's learners to link (``dataplane.generations.ChannelPlan``), or None."""
    validate: bool = False
    """The learners score this state's validation: each its share, reported before its next round."""
    group: tuple[LearnerId, ...] | None = None
    """Live groups: the group from the next round on (rank = index, world size = length); None: unchanged."""


@dataclass(frozen=True, kw_only=True)
class JoinReply:
    """Where a (re)joining learner starts: the latest averaged state and the round it sends next."""

    state: AveragedState
    next_round: int
    """The round this learner sends next (the open round, or the one after a closing one)."""
    world_size: int
    """The averager's group size: the learner must send it with every round."""
    shards: int = 1
    """S, the averaging shards: the learner cuts its flat buffers into S slices (``FlatLayout.split``)."""
    validate: bool = False
    """The state's validation is due and the learners score it: this learner scores its share first."""
    group: tuple[LearnerId, ...] | None = None
    """Live groups: the group this learner is in (its rank is its index); None: the first group forms."""
    ended: bool = False
    """Training ended before this newcomer could be taken in: it has nothing to do (``state`` is empty)."""
    took_part: bool = False
    """This learner is one of ``state``'s round's learners (a round it sent closed, its answer lost)."""

    @classmethod
    def after_end(cls, last: AveragedState, world_size: int) -> JoinReply:
        """The reply to a newcomer whose join came after ``last``, the last round's state."""
        empty = AveragedState(batch_size=last.batch_size)
        return cls(state=empty, next_round=last.round + 1, world_size=world_size, ended=True)


@dataclass(frozen=True, kw_only=True)
class CheckpointHistory:
    """What a checkpoint keeps besides the state, so that a restored averager goes on where it was
    (``ParameterAverager.checkpoint_contents``; ``checkpoint.save`` takes ``as_dict()``)."""

    batch_size_history: list[dict[str, Any]]
    """``{round, batch_size, time_s}`` from each round on."""
    validation_history: list[dict[str, Any]]
    """``{round, epoch, accuracy, time_s, ...}`` per validation."""
    loss_history: list[dict[str, Any]]
    """``{round, loss, time_s}`` per round."""
    validation_due: int | None
    """The round whose validation is open, or None."""
    dropped_log: list[dict[str, Any]]
    """The round book's drops."""

    def as_dict(self) -> dict[str, Any]:
        """Plain lists and numbers in the checkpoint's order (``torch.load(weights_only=True)``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


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
    """Validate one learner's payload: tensors (params, optimizer_state), or a ``FlatPayload`` as params
    with optimizer_state None (its moments travel in its buffers)."""
    if isinstance(params, FlatPayload):
        if optimizer_state is not None:
            raise TypeError("a FlatPayload carries its moments: send optimizer_state=None with it")
        return _checked(
            params,
            None,
            stats,
            weight,
            position,
            ("flat", params.layout.signature, len(params.parts)),
            params.layout.moments,
        )
    from torch import Tensor  # tensors came with the call, so torch is loaded; a flat round needs none

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
    signature = tuple((key, tuple(t.shape), t.dtype) for key, t in params.items())
    return _checked(
        params, optimizer_state, stats, weight, position, signature, has_adam_moments(optimizer_state)
    )


def _checked(
    params: Any, optimizer_state: Any, stats: Any, weight: Any, position: Any, signature: tuple, adam: bool
) -> Arrival:
    stats = dict(stats or {})
    bad = [
        key for key, value in stats.items() if isinstance(value, bool) or not isinstance(value, int | float)
    ]
    if bad:
        raise TypeError(f"stats {bad} are not numbers: send only numeric totals (frames, compute_s, ...)")
    weight = float(check_number("weight", weight, 0, int | float))
    if position is not None and not isinstance(position, Mapping):
        raise TypeError("position must be EpochPosition.as_dict() (a dict) or None")
    return Arrival(params, optimizer_state, stats, weight, adam, signature, position)
