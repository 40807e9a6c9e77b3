"""Where an epoch stands when the learner group changes size, and the blocks each learner has left.

``resplit`` deals the blocks that did not reach an averaged round over a new group: equal counts, each
once, zero-weight fillers. Plans are deterministic, so only the chain of layouts travels in the rounds
(``EpochPosition``); ``layout_specs`` replays it and every process arrives at the same shards, each
ordered by ``spread_fresh`` again.
Dropped learners: ``settle`` (called on every round) records the rows of every rank of the layout absent
from the round as ``missed`` ranges (rank, first row, end row); at a layout's end ``close_layout``
starts a make-up layout of the same group dealing only the missed blocks, or the next epoch; a group
change hands the missed blocks on with the unreached ones. So every block of the plan reaches exactly
one averaged round (``tests/test_elastic.py``, ``tests/test_elastic_drops.py``). A lost learner's
blocks come last in each survivor's new shard (``gone``). Nothing here imports ray.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from raytrain_seq.rows.assembly import BlockSpec, spread_fresh

__all__ = [
    "EpochPosition",
    "epochs_trained",
    "layout_specs",
    "parse_history",
    "resplit",
    "settle",
    "settle_dict",
]

Missed = tuple[tuple[int, int, int], ...]
"""Rows of one layout's shards no averaged round received: (rank, first row, end row) ranges."""


def _merge(ranges: Iterable[Sequence[int]]) -> Missed:
    """Sorted (rank, first, end) ranges with the overlapping or touching ones of a rank joined."""
    out: list[list[int]] = []
    for rank, first, end in sorted((int(r), int(a), int(b)) for r, a, b in ranges):
        if end <= first:
            continue
        if out and out[-1][0] == rank and first <= out[-1][2]:
            out[-1][2] = max(out[-1][2], end)
        else:
            out.append([rank, first, end])
    return tuple(tuple(r) for r in out)


def _entry(world_size: int, rows: int, missed: Missed = (), gone: tuple[int, ...] = ()) -> tuple:
    """A history entry: (world_size, rows each learner took), plus the missed ranges when there are any
    or a rank was lost, plus the lost ranks when there are any."""
    head = (int(world_size), int(rows))
    return (*head, missed, gone) if gone else (*head, missed) if missed else head


def _ranks(ranks: Iterable) -> tuple[int, ...]:
    """Ranks as sorted distinct ints: the form a history entry keeps its lost ranks in."""
    return tuple(sorted({int(r) for r in ranks}))


def _entry_parts(entry: tuple) -> tuple[int, int, Missed, tuple[int, ...]]:
    """(world_size, rows, missed, gone) of a parsed history entry, the optional parts as ()."""
    world, rows, *rest = entry
    return world, rows, rest[0] if rest else (), rest[1] if len(rest) > 1 else ()


def parse_history(history: Iterable) -> tuple:
    """A layout history (``EpochPosition.history``, or its JSON lists) as hashable tuples; ValueError names a
    malformed entry. Entries are (world_size, rows), (world_size, rows, ((rank, first, end), ...)) or
    (world_size, rows, missed, (lost rank, ...))."""
    out = []
    for entry in history:
        try:
            world, rows, *rest = entry
            missed = _merge(rest[0]) if rest else ()
            gone = _ranks(rest[1]) if len(rest) > 1 else ()
            parsed = _entry(int(world), int(rows), missed, gone)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"layout history entry {entry!r} is not (world_size, rows[, missed[, gone]]): pass "
                "EpochPosition.history"
            ) from exc
        if parsed[0] < 1 or parsed[1] < 0 or len(rest) > 2:
            raise ValueError(f"layout history entry {entry!r} has a world size < 1 or negative rows")
        if any(r < 0 or r >= parsed[0] or a < 0 or b > parsed[1] for r, a, b in missed):
            raise ValueError(
                f"layout history entry {entry!r}: a missed range lies outside its ranks or its rows"
            )
        if any(not 0 <= r < parsed[0] for r in gone):
            raise ValueError(f"layout history entry {entry!r}: a lost rank lies outside its ranks")
        out.append(parsed)
    return tuple(out)


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

    ``missed``: ranges (rank, first row, end row) of the current layout whose rows no averaged round
    holds (their learner was dropped from the rounds); a history entry keeps its layout's as a third
    element, and the ranks lost at its end (``for_group``'s ``gone``) as a fourth. Learner 1 of 2
    dropped from the rounds that took rows 4-6: ``missed=((1, 4, 6),)``.
    """

    epoch: int
    history: tuple[tuple, ...] = ()
    world_size: int | None = None
    rows_done: int = 0
    steps: int = 0
    missed: Missed = ()

    def for_group(self, world_size: int, gone: Iterable[int] = ()) -> EpochPosition:
        """The position a group of ``world_size`` learners continues from (its layout becomes current).
        ``gone``: ranks of the current layout whose learners were lost; ``resplit`` deals their blocks
        last in every new shard (no layout yet: nothing to deal, nothing recorded)."""
        if world_size == self.world_size:
            return self  # same group size: keep the shards, and with them their cache-aware order
        gone = _ranks(gone) if self.world_size is not None else ()
        if any(not 0 <= r < self.world_size for r in gone):
            raise ValueError(f"lost ranks {gone} outside 0..{self.world_size - 1}: pass ranks of this layout")
        if self.world_size is None or (self.rows_done == 0 and not self.missed):
            history = self.history
            if gone and history and history[-1][0] == self.world_size:
                # An untouched make-up layout (close_layout keeps the group's size): the new group's
                # deal is its entry's, of the same ranks.
                world, rows, missed, before = _entry_parts(history[-1])
                history = (*history[:-1], _entry(world, rows, missed, _ranks((*before, *gone))))
            return dataclasses.replace(self, history=history, world_size=world_size, rows_done=0)
        done = (*self.history, _entry(self.world_size, self.rows_done, self.missed, gone))
        return dataclasses.replace(self, history=done, world_size=world_size, rows_done=0, missed=())

    @property
    def layout(self) -> tuple:
        """What fixes the shards being trained: (epoch, history, world_size)."""
        return (self.epoch, self.history, self.world_size)

    def same_place(self, other: EpochPosition) -> bool:
        """Whether ``other`` continues the same rows (the missed ranges and the step count aside)."""
        return self.layout == other.layout and self.rows_done == other.rows_done

    def close_layout(self) -> EpochPosition:
        """At the end of the current layout: a make-up layout of the same group that deals the missed
        rows (its history gains this layout), or the next epoch's start when nothing was missed."""
        if not self.missed:
            return EpochPosition(self.epoch + 1, steps=self.steps)
        done = (*self.history, _entry(self.world_size, self.rows_done, self.missed))
        return EpochPosition(self.epoch, done, self.world_size, 0, self.steps)

    def after(self, rows_done: int) -> EpochPosition:
        """The same layout with ``rows_done`` rows taken by each learner (a layout must be chosen)."""
        if self.world_size is None and rows_done:
            raise ValueError(f"{self} has no layout yet: call for_group(world_size) before taking rows")
        return dataclasses.replace(self, rows_done=rows_done)

    def with_steps(self, steps: int) -> EpochPosition:
        """The same place, ``steps`` optimizer steps into the run."""
        return dataclasses.replace(self, steps=int(steps))

    def ends_training(self, *, epochs: int, steps: int | None = None) -> bool:
        """Whether training ends here: ``steps`` optimizer steps taken (N in AAVG Algorithm 1, wherever in
        an epoch that falls), else ``epochs`` epochs done (a make-up layout still to deal is not done)."""
        if steps is not None:
            return self.steps >= steps
        return self.epoch >= epochs and self.rows_done == 0

    def as_dict(self) -> dict:
        """Plain ints and lists (JSON, ``torch.load(weights_only=True)``); ``from_dict`` reads it back."""
        history = [
            [w, r, *([[list(m) for m in missed]] if missed or gone else []), *([list(gone)] if gone else [])]
            for w, r, missed, gone in map(_entry_parts, self.history)
        ]
        return {**dataclasses.asdict(self), "history": history, "missed": [list(m) for m in self.missed]}

    @classmethod
    def from_dict(cls, d: Mapping) -> EpochPosition:
        """Inverse of ``as_dict``; ValueError names a malformed field."""
        try:
            history = parse_history(d.get("history", ()))
            world = d.get("world_size")
            position = cls(
                int(d["epoch"]), history, None if world is None else int(world), int(d.get("rows_done", 0)),
                int(d.get("steps", 0)),  # positions written before train.steps counted from 0
                _merge(d.get("missed", ())),  # positions written before drops were made up: none
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
        outside = any(
            position.world_size is None or r >= position.world_size or b > position.rows_done
            for r, _, b in position.missed
        )
        if bad or outside:
            raise ValueError(
                f"epoch position {dict(d)!r} has a negative count, a world size < 1 or a missed range "
                "outside its layout"
            )
        return position

    @classmethod
    def of_state(cls, position: Mapping | None) -> EpochPosition:
        """An averaged state's position (``AveragedState.position``; None: the run's start)."""
        return cls(0) if position is None else cls.from_dict(position)

    def averaged(self, position: Mapping | None, rows: int) -> EpochPosition:
        """Where training goes on after a round sent at this position: the averaged state's ``position``
        (the averager settles it: ``settle``; None: this one), and a layout still at its end (a caller
        that did not settle it; ``rows``: a learner's in it) closed here."""
        after = self if position is None else EpochPosition.from_dict(position)
        if after.layout == self.layout and rows and after.rows_done >= rows:
            after = after.close_layout()
        return after


def settle(
    sent: EpochPosition,
    previous: EpochPosition | None,
    present: Iterable[int],
    shard_rows: int | None = None,
    short: Mapping[int, int] | None = None,
) -> EpochPosition:
    """The position an averaged round leaves: ``sent`` (where its learners stand) with the rows of every
    rank of the layout absent from the round recorded as missed, closed at the layout's end.

    ``previous``: the averaged position before this round (None: the first); when it is in the same
    layout, the round covered rows ``previous.rows_done`` .. ``sent.rows_done`` of every rank, else rows
    from 0 (the round opened the layout). ``present``: the ranks whose updates the round averaged.
    ``shard_rows``: the rows each learner has in the layout; ``sent.rows_done`` reaching it closes the
    layout (``close_layout``). Example: 2 learners, previous rows 4, sent rows 6 with only rank 0
    present, 8 rows a shard -> missed ((1, 4, 6),), still 6 rows done; the round at row 8 with both
    present then starts the make-up layout ``(epoch, ((2, 8, ((1, 4, 6),)),), 2, 0)``.
    ``short``: present ranks that stopped short of ``sent`` (rank -> its rows done): their rows from
    there to ``sent.rows_done`` are missed too (rank 1 present at row 4 of a round sent at row 6:
    (1, 4, 6)).
    """
    if sent.world_size is None:
        return sent  # a start position: no rows taken under any layout
    same = previous is not None and previous.layout == sent.layout
    start = previous.rows_done if same else 0
    ranges = [*sent.missed, *(previous.missed if same else ())]
    here = set(present)
    ranges += [(rank, start, sent.rows_done) for rank in range(sent.world_size) if rank not in here]
    ranges += [
        (rank, max(rows, start), sent.rows_done) for rank, rows in (short or {}).items() if rank in here
    ]
    settled = dataclasses.replace(sent, missed=_merge(ranges))
    if shard_rows is not None and shard_rows > 0 and settled.rows_done >= shard_rows:
        return settled.close_layout()
    return settled


def settle_dict(
    sent: Mapping,
    previous: Mapping | None,
    present: Iterable,
    shard_rows: int | None = None,
    short: Mapping[int, int] | None = None,
) -> dict:
    """``settle`` on ``as_dict()`` positions; ``sent`` itself when nothing changes (or the learner ids are
    not ranks, so the absent ones cannot be named)."""
    learners = list(present)
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in learners):
        return dict(sent)
    before = None if previous is None else EpochPosition.from_dict(previous)
    mine = EpochPosition.from_dict(sent)
    settled = settle(mine, before, learners, shard_rows, short)
    return dict(sent) if settled == mine else settled.as_dict()


def resplit(
    specs: Sequence[Sequence[BlockSpec]],
    rows_done: int,
    world_size: int,
    missed: Missed = (),
    first: int = 0,
    gone: Iterable[int] = (),
) -> list[list[BlockSpec]]:
    """Deal the blocks no averaged round holds yet over ``world_size`` learners: equal counts, nothing
    dropped.

    Every shard of ``specs`` has the same length and its learner took its first ``rows_done`` rows, of
    which the ``missed`` ranges (rank, first, end) never reached an averaged round. The missed blocks and
    the unreached ones (fillers left out: they carry no frame) are dealt as ``packing.shard`` deals a
    plan: by descending frames, snake-wise, plus ``(-left) % world_size`` zero-weight fillers, so each
    block lands exactly once; each new shard is then ordered by ``spread_fresh``. Worked example: shards
    [[a, b, c], [d, e, F]] (F a filler), 1 row done, 3 learners: b, c and e are left, one each; with
    missed ((1, 0, 1),) d is dealt again too. The snake starts at rank ``first`` (``layout_specs`` turns
    it at every make-up layout): a lone missed block would otherwise go to rank 0 every time, and a rank 0
    absent from round after round would have the others step on fillers, make-up after make-up.
    The blocks of the ``gone`` ranks (lost learners) come last in each new shard, each part ordered by
    ``spread_fresh``: a lost node held copies of the arrays its learner read ahead, and until Ray declares
    the node dead a read of such an array may ask that node and wait out Ray's pull timeout
    (docs/ARCHITECTURE.md, "Measurements behind the code"). The example over 1 learner with gone (1,):
    b and c (in ``spread_fresh``'s order), then e.
    """
    lengths = {len(rank) for rank in specs}
    if len(lengths) > 1:
        raise ValueError(f"shards of unequal lengths {sorted(lengths)}: resplit takes one layout's shards")
    if not 0 <= rows_done <= min(lengths, default=0) or world_size < 1:
        raise ValueError(
            f"rows_done {rows_done} outside 0..{min(lengths, default=0)} or world_size {world_size} < 1: "
            "pass the rows each learner of this layout took and the new group size"
        )
    if any(not (0 <= r < len(specs) and 0 <= a < b <= rows_done) for r, a, b in missed):
        raise ValueError(
            f"missed ranges {missed} outside ranks 0..{len(specs) - 1} or rows 0..{rows_done}: pass the "
            "layout's EpochPosition.missed"
        )
    redo = [(b, r) for r, a, z in _merge(missed) for b in specs[r][a:z] if b.ids]
    left = redo + [
        (b, r) for pos in range(rows_done, max(lengths, default=0)) for r, rank in enumerate(specs)
        if (b := rank[pos]).ids
    ]  # fmt: skip
    filler = BlockSpec((), (), (), (), (), -1)
    blocks = [b for b, _ in left] + [filler] * ((-len(left)) % world_size)
    lost = set(gone)  # the lost ranks, whose blocks come last
    late = {i for i, (_, r) in enumerate(left) if r in lost}
    by_fill = sorted(range(len(blocks)), key=lambda i: (-sum(blocks[i].lengths), i))
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for position, index in enumerate(by_fill):
        turn, slot = divmod(position, world_size)
        ranks[((slot if turn % 2 == 0 else world_size - 1 - slot) + first) % world_size].append(index)
    out = []
    for indices in ranks:
        shard: list[BlockSpec] = []
        for lost_part in (False, True):  # the surviving ranks' blocks, then the lost ranks'
            mine = [blocks[i] for i in sorted(indices) if (i in late) == lost_part]
            shard += [mine[i] for i in spread_fresh([b.fresh_frames for b in mine])]
        out.append(shard)
    return out


def layout_specs(
    split: Callable[[int], list[list[BlockSpec]]], history: Sequence[tuple[int, int]], world_size: int
) -> list[list[BlockSpec]]:
    """Every learner's blocks in the current layout of an epoch: ``split(w)`` (the epoch's plan sharded
    over w learners) for its first layout, then one ``resplit`` per change of layout (a new group size,
    or a make-up layout). With history ((4, 8),) and world_size 3: the plan over 4 learners, each one's
    first 8 rows done, the rest over 3. The n-th layout closed with missed rows deals from rank n."""
    layouts = [*map(_entry_parts, parse_history(history)), (int(world_size), 0, (), ())]
    specs = split(layouts[0][0])
    make_ups = 0
    for (_, rows, missed, gone), (world, *_) in itertools.pairwise(layouts):
        make_ups += bool(missed)
        specs = resplit(specs, rows, world, missed, first=make_ups, gone=gone)
    return specs


def epochs_trained(position: EpochPosition, shard_rows: int) -> float:
    """Epochs done at ``position``: whole epochs plus the share of the current epoch's rows taken, over
    every layout it ran under (``shard_rows``: each learner's rows in the current layout, from its
    ``rows_done`` = 0). Epoch 2, 8 rows each by 4 learners, then 2 of 10 each by 3: 2 + 38/62."""
    if position.rows_done == 0 and not position.history:
        return float(position.epoch)
    done = sum(w * r for w, r, *_ in position.history)
    world = position.world_size or 1
    total = done + world * max(shard_rows, position.rows_done)
    return position.epoch + (done + world * position.rows_done) / max(total, 1)
