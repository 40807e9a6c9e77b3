"""Where an epoch stands when the learner group changes size, and the blocks each learner has left.

Ray Train restarts an elastic group with another count mid-epoch (a node lost, or the cluster grew).
``resplit`` deals the blocks nobody reached over the new group: equal counts, each block once, nothing
dropped, zero-weight fillers to even the counts. The plan of an epoch is deterministic, so only the chain
of layouts travels with the averager's rounds (``EpochPosition``): ``layout_specs`` replays it (the plan
over the first group, one ``resplit`` per change) and every process arrives at the same shards.
``tests/test_elastic.py`` pins it: an epoch run by 4, then 2, then 3 learners trains each block of the
plan exactly once. Each new shard is
ordered by ``spread_fresh`` again, so the cache-aware composition holds after a resize. Nothing here
imports ray.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from raytrain_seq.elastic.assembly import BlockSpec, spread_fresh

__all__ = ["EpochPosition", "layout_specs", "resplit"]


@dataclass(frozen=True)
class EpochPosition:
    """How far an epoch got, enough to rebuild every learner's remaining rows after the group changes.

    ``history`` holds the layouts the epoch already ran under, as (world_size, rows each learner took)
    pairs; ``world_size`` and ``rows_done`` are the current layout (world_size None: no group picked one
    yet, as at the start of an epoch). Epoch 3, begun by 4 learners that took 8 rows each, then continued
    by 3 learners that took 2 rows each: ``EpochPosition(3, ((4, 8),), 3, 2)``.

    ``steps`` is the run's count of optimizer steps each learner took up to here (every learner takes
    the same): it travels with every round and checkpoint, so a restarted group and a resumed run go on
    counting towards ``train.steps`` (N in AAVG Algorithm 1) from the averaged state's count.
    """

    epoch: int
    history: tuple[tuple[int, int], ...] = ()
    world_size: int | None = None
    rows_done: int = 0
    steps: int = 0

    def for_group(self, world_size: int) -> EpochPosition:
        """The position a group of ``world_size`` learners continues from (its layout becomes current)."""
        if world_size == self.world_size:
            return self  # same group size: keep the shards, and with them their cache-aware order
        if self.world_size is None or self.rows_done == 0:
            return dataclasses.replace(self, world_size=world_size, rows_done=0)
        done = (*self.history, (self.world_size, self.rows_done))
        return dataclasses.replace(self, history=done, world_size=world_size, rows_done=0)

    def after(self, rows_done: int) -> EpochPosition:
        """The same layout with ``rows_done`` rows taken by each learner (a layout must be chosen)."""
        if self.world_size is None and rows_done:
            raise ValueError(f"{self} has no layout yet: call for_group(world_size) before taking rows")
        return dataclasses.replace(self, rows_done=rows_done)

    def with_steps(self, steps: int) -> EpochPosition:
        """The same place, ``steps`` optimizer steps into the run."""
        return dataclasses.replace(self, steps=int(steps))

    def as_dict(self) -> dict:
        """Plain ints and lists (JSON, ``torch.load(weights_only=True)``); ``from_dict`` reads it back."""
        return {**dataclasses.asdict(self), "history": [list(pair) for pair in self.history]}

    @classmethod
    def from_dict(cls, d: Mapping) -> EpochPosition:
        """Inverse of ``as_dict``; ValueError names a malformed field."""
        try:
            history = tuple((int(w), int(r)) for w, r in d.get("history", ()))
            world = d.get("world_size")
            position = cls(
                int(d["epoch"]), history, None if world is None else int(world), int(d.get("rows_done", 0)),
                int(d.get("steps", 0)),  # positions written before train.steps counted from 0
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"malformed epoch position {dict(d)!r} ({exc}): pass EpochPosition.as_dict()"
            ) from exc
        bad = (
            position.epoch < 0
            or position.rows_done < 0
            or position.steps < 0
            or (world is not None and position.world_size < 1)
        )
        if bad or any(w < 1 or r < 0 for w, r in history):
            raise ValueError(f"epoch position {dict(d)!r} has a negative count or a world size < 1")
        return position


def resplit(specs: Sequence[Sequence[BlockSpec]], rows_done: int, world_size: int) -> list[list[BlockSpec]]:
    """Deal the blocks no learner reached yet over ``world_size`` learners: equal counts, nothing dropped.

    Every shard of ``specs`` has the same length and its learner took its first ``rows_done`` rows.
    The rest (fillers left out: they carry no frame) are dealt as ``packing.shard`` deals a plan: by
    descending frames, snake-wise, plus ``(-left) % world_size`` zero-weight fillers, so each remaining
    block lands exactly once; each new shard is then ordered by ``spread_fresh``. Worked example: shards
    [[a, b, c], [d, e, F]] (F a filler), 1 row done, 3 learners: b, c and e are left, one each.
    """
    lengths = {len(rank) for rank in specs}
    if len(lengths) > 1:
        raise ValueError(f"shards of unequal lengths {sorted(lengths)}: resplit takes one layout's shards")
    if not 0 <= rows_done <= min(lengths, default=0) or world_size < 1:
        raise ValueError(
            f"rows_done {rows_done} outside 0..{min(lengths, default=0)} or world_size {world_size} < 1: "
            "pass the rows each learner of this layout took and the new group size"
        )
    left = [b for pos in range(rows_done, max(lengths, default=0)) for rank in specs if (b := rank[pos]).ids]
    filler = BlockSpec((), (), (), (), (), -1)
    blocks = left + [filler] * ((-len(left)) % world_size)
    by_fill = sorted(range(len(blocks)), key=lambda i: (-sum(blocks[i].lengths), i))
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for position, index in enumerate(by_fill):
        turn, slot = divmod(position, world_size)
        ranks[slot if turn % 2 == 0 else world_size - 1 - slot].append(index)
    out = []
    for indices in ranks:
        mine = [blocks[i] for i in sorted(indices)]
        out.append([mine[i] for i in spread_fresh([b.fresh_frames for b in mine])])
    return out


def layout_specs(
    split: Callable[[int], list[list[BlockSpec]]], history: Sequence[tuple[int, int]], world_size: int
) -> list[list[BlockSpec]]:
    """Every learner's blocks in the current layout of an epoch: ``split(w)`` (the epoch's plan sharded
    over w learners) for its first layout, then one ``resplit`` per change of group size. With history
    ((4, 8),) and world_size 3: the plan over 4 learners, each one's first 8 rows done, the rest over 3."""
    layouts = [*((int(w), int(r)) for w, r in history), (int(world_size), 0)]
    specs = split(layouts[0][0])
    for (_, rows), (world, _) in itertools.pairwise(layouts):
        specs = resplit(specs, rows, world)
    return specs
