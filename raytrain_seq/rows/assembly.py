"""Block rows for one learner: block specs + cached partial augmentations -> fixed-shape rows.

``assemble_rows`` joins BLoad's plan and Revamper's cache: for every sequence of a block it takes the
cached array, cuts ``[offset, offset + length)`` (non-zero offsets only for "chunk" pieces), draws its
final augmentation from its own seeded generator and writes it at its start into a zero uint8 row;
training rows stay uncropped and carry the crop draws for the learner's device. Reset tables are padded
with -1 to the run-wide ``max_sequences``, so every row of the run collates.
Cache-aware composition at block level: a block's lengths and starts are fixed by the packer, so
``cache_aware_plan`` exchanges equal-length sequences between blocks so each carries its share of fresh
frames, and ``spread_fresh`` orders a learner's blocks so the running sum of fresh frames tracks
``total * k / n``: any window of consecutive blocks, whatever the adaptive B, carries about its share
(O(n log n) per shard; the orders tried are in docs/LOG.md). ``plan_specs`` turns a plan into block
specs; ``raytrain_seq.rounds.position`` re-splits an epoch's unreached blocks when the group changes.
Nothing here imports ray.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from raytrain_seq.algorithms.augment import center_crop, final_augment, final_params
from raytrain_seq.algorithms.packing import PackPlan, shard
from raytrain_seq.algorithms.refurbish import balance_fresh
from raytrain_seq.seeds import final_rng

logger = logging.getLogger(__name__)

__all__ = [
    "ROW_KEYS",
    "BlockRowStream",
    "BlockSpec",
    "EpochShard",
    "RowFormat",
    "assemble_rows",
    "cache_aware_plan",
    "consumption_order",
    "max_sequences_bound",
    "plan_specs",
    "shard_items",
    "spread_fresh",
]

ROW_KEYS = ("frames", "starts", "lengths", "labels", "num_sequences", "weight", "block", "ids")


def max_sequences_bound(lengths: Sequence[int] | np.ndarray, t_max: int) -> int:
    """The most sequences any block of ``t_max`` frames can hold: the longest prefix of the sorted
    lengths whose sum fits. No plan of any strategy or seed can exceed it (a block's sequences fit in
    ``t_max`` and no k lengths sum to less than the k smallest), and a valid plan reaches it (the k
    smallest in one block), so it is the tightest S that holds for every plan of the run. Worked example: lengths [5, 3, 9, 4], t_max 12:
    sorted 3, 4, 5, 9 with running sums 3, 7, 12, 21 -> 3 sequences. A chunk piece has length
    ``min(length, t_max)`` and so never beats the same bound.
    """
    lens = np.sort(np.minimum(np.asarray(lengths, dtype=np.int64), t_max))
    if lens.size == 0 or lens[0] < 1:
        raise ValueError(
            "max_sequences_bound needs at least one length >= 1: pass the run's sequence lengths"
        )
    return max(1, int(np.searchsorted(np.cumsum(lens), t_max, side="right")))


def spread_fresh(fresh: Sequence[int]) -> list[int]:
    """Order blocks so the fresh frames spread evenly over any window of consecutive blocks.

    Greedy line tracking: at position k (1-based) take the remaining block whose fresh count brings the
    running sum closest to ``total * k / n`` (ties: the smaller count; equal counts keep their input
    order, which is the plan's seeded random order). Returns a permutation of ``range(len(fresh))``.
    Worked example, fresh [9, 8, 7, 0, 0, 0] (total 24, line 4, 8, 12, ...): k=1 wants 4 -> 7 (index
    2, sum 7); k=2 wants 1 -> 0 (index 3, sum 7); k=3 wants 5 -> 8 (index 1, sum 15); k=4 wants 1 -> 0
    (index 4); k=5 wants 5 -> 9 (index 0, sum 24); k=6 -> 0 (index 5). Order [2, 3, 1, 4, 0, 5]: pairs
    carry 7, 8, 9 fresh frames where the input order carried 17, 7, 0.
    """
    values = [int(v) for v in fresh]
    if any(v < 0 for v in values):
        raise ValueError(f"fresh frame counts must be >= 0, got {values}: count frames, not differences")
    n, total = len(values), sum(values)
    queues: dict[int, deque[int]] = {}
    for index, value in enumerate(values):
        queues.setdefault(value, deque()).append(index)
    distinct = sorted(queues)
    order, running = [], 0
    for k in range(1, n + 1):
        # Compare in integers scaled by n: the wanted count is (total * k - running * n) / n.
        wanted = total * k - running * n
        i = bisect.bisect_left(distinct, wanted / n)
        candidates = distinct[max(0, i - 1) : i + 1]
        value = min(candidates, key=lambda v: (abs(v * n - wanted), v))
        order.append(queues[value].popleft())
        running += value
        if not queues[value]:
            distinct.remove(value)
    return order


@dataclass(frozen=True)
class BlockSpec:
    """One block of a shard: global video ids and the reset table; no ids = a zero-weight filler."""

    ids: tuple[int, ...]
    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    offsets: tuple[int, ...]
    labels: tuple[int, ...]
    plan_index: int
    """Position in the epoch's plan (-1 for a filler): seeds the final augmentation."""
    fresh_frames: int = 0
    """Frames of sequences whose partial augmentation is recomputed this epoch."""

    @property
    def weight(self) -> float:
        return 1.0 if self.ids else 0.0


@dataclass(frozen=True)
class RowFormat:
    """What a block-assembly task needs besides the specs (plain values: it travels in fn_kwargs)."""

    split: str
    epoch: int | None
    seed: int
    t_max: int
    max_sequences: int
    crop: int
    channels: int
    center: bool
    """Evaluation: the centre crop and no flip instead of the seeded random crop and flip."""
    final_on_learner: bool = False
    """Leave the crop and flip to the learner: rows carry the uncropped ``size`` frames and each
    sequence's seeded ``tops``, ``lefts``, ``flips`` (``augment.final_augment_batch`` applies them)."""
    size: int = 0
    """The cached frames' height and width (``data.cache_size``); rows use it when ``final_on_learner``."""


@dataclass(frozen=True)
class EpochShard:
    """One learner's blocks for one epoch (or one evaluation split), in the order it consumes them."""

    split: str
    epoch: int | None
    rank: int
    world_size: int
    blocks: tuple[BlockSpec, ...]
    t_max: int
    max_sequences: int
    crop: int
    channels: int
    seed: int
    center: bool
    recomputed: int
    """Videos whose partial augmentation is computed for this epoch (the whole split for evaluation)."""
    reused: int
    """Videos served from the cache of an earlier epoch."""
    size: int = 0
    """The cached frames' height and width (``data.cache_size``); 0: unknown (rows are cropped here)."""

    @property
    def row_format(self) -> RowFormat:
        return RowFormat(
            self.split, self.epoch, self.seed, self.t_max, self.max_sequences, self.crop, self.channels,
            self.center, size=self.size,
        )  # fmt: skip

    @property
    def frames(self) -> int:
        """Useful (non-padding) frames in the shard."""
        return sum(sum(b.lengths) for b in self.blocks)

    @property
    def video_ids(self) -> list[int]:
        return sorted({i for b in self.blocks for i in b.ids})


def plan_specs(
    plan: PackPlan,
    world_size: int,
    ids: Sequence[int],
    labels: Sequence[int],
    fresh: np.ndarray | None = None,
) -> list[list[BlockSpec]]:
    """``shard(plan, world_size)`` as block specs per rank: plan positions become the catalog's video
    ids and labels (position 3 -> ``ids[3]``); with a ``fresh`` mask over positions each rank's blocks
    are ordered by ``spread_fresh``, without one they keep the plan's order (evaluation)."""
    # Blocks are unique by value (every id once, chunk pieces differ in offset); fillers are not in it.
    index_of = {block: i for i, block in enumerate(plan.blocks)}
    out = []
    for blocks in shard(plan, world_size):
        specs = [
            BlockSpec(
                ids=tuple(int(ids[i]) for i in block.ids),
                starts=block.starts,
                lengths=block.lengths,
                offsets=block.offsets,
                labels=tuple(int(labels[i]) for i in block.ids),
                plan_index=index_of[block] if block.ids else -1,
                fresh_frames=0
                if fresh is None
                else int(sum(n for i, n in zip(block.ids, block.lengths, strict=True) if fresh[i])),
            )
            for block in blocks
        ]
        if fresh is not None:
            specs = [specs[i] for i in spread_fresh([s.fresh_frames for s in specs])]
        out.append(specs)
    return out


def cache_aware_plan(plan: PackPlan, lengths: Sequence[int], fresh: np.ndarray) -> PackPlan:
    """``plan`` with equal-length sequences exchanged between blocks so that every block carries its share
    of the epoch's fresh frames (``refurbish.balance_fresh``: Revamper's cache-aware composition for
    packed blocks). Lengths, starts, offsets and so the padding are the plan's; every id still appears
    exactly as often. ``lengths`` and ``fresh`` are over the plan's positions (the catalog's order)."""
    perm = balance_fresh([block.ids for block in plan.blocks], lengths, fresh)
    blocks = [dataclasses.replace(block, ids=tuple(int(perm[i]) for i in block.ids)) for block in plan.blocks]
    return dataclasses.replace(plan, blocks=blocks)


def consumption_order(specs: Sequence[Sequence[BlockSpec]]) -> list[int]:
    """Video ids in the order the learners first need them: block 0 of every rank, then block 1, ...
    Rank blocks [[(4, 1)], [(2,)]] then [[(3,)], [(0,)]] give [4, 1, 2, 3, 0]."""
    seen: dict[int, None] = {}
    for position in range(max((len(s) for s in specs), default=0)):
        for rank_specs in specs:
            if position < len(rank_specs):
                seen.update(dict.fromkeys(rank_specs[position].ids))
    return list(seen)


def shard_items(shard: EpochShard) -> list[dict[str, np.ndarray]]:
    """One fixed-shape dict per block for ``ray.data.from_items``; tables padded with -1 to S.

    A block with ids (7, 2), starts (0, 37), lengths (37, 24) at S = 4 gives ids [7, 2, -1, -1],
    starts [0, 37, -1, -1], lengths [37, 24, -1, -1].
    """
    s = shard.max_sequences

    def padded(values: tuple[int, ...]) -> np.ndarray:
        out = np.full(s, -1, dtype=np.int64)
        out[: len(values)] = values
        return out

    items = []
    for index, block in enumerate(shard.blocks):
        if len(block.ids) > s:
            raise ValueError(
                f"block {index} holds {len(block.ids)} sequences > max_sequences {s}: derive max_sequences "
                "with max_sequences_bound over every length of the run"
            )
        items.append(
            {
                "block": np.int64(index),
                "ids": padded(block.ids),
                "starts": padded(block.starts),
                "lengths": padded(block.lengths),
                "offsets": padded(block.offsets),
                "labels": padded(block.labels),
                "num_sequences": np.int64(len(block.ids)),
                "plan_index": np.int64(block.plan_index),
                "weight": np.float32(block.weight),
            }
        )
    return items


def assemble_rows(
    batch: Mapping[str, np.ndarray], arrays: Mapping[int, np.ndarray], fmt: RowFormat
) -> dict[str, np.ndarray]:
    """Block rows from a batch of ``shard_items`` and the cached arrays of their ids.

    ``arrays[id]`` is uint8 ``[T, H, W, C]`` (the partial augmentation, T = the strided length). Each
    sequence's piece ``[offset, offset + length)`` is final-augmented and written at ``start``; e.g.
    starts [0, 37] and lengths [37, 24] fill frames 0-36 and 37-60, frames 61.. stay zero.
    """
    n = len(batch["block"])
    deferred = fmt.final_on_learner and not fmt.center
    if deferred and fmt.size < fmt.crop:
        raise ValueError(
            f"RowFormat.size {fmt.size} < crop {fmt.crop}: a row left for the learner to crop needs the "
            "cached frame size (data.cache_size) in RowFormat.size"
        )
    side = fmt.size if deferred else fmt.crop
    frames = np.zeros((n, fmt.t_max, side, side, fmt.channels), dtype=np.uint8)
    # The learner's crop draws, one per sequence: (top, left, flip), 0 for the padded slots. Evaluation's
    # uncropped rows (epoch None: multi-view testing) draw nothing; the learner cuts its test views.
    params = (
        np.zeros((3, n, fmt.max_sequences), dtype=np.int64) if deferred and fmt.epoch is not None else None
    )
    for row in range(n):
        plan_index = int(batch["plan_index"][row])
        for slot in range(int(batch["num_sequences"][row])):
            video = int(batch["ids"][row, slot])
            start, length = int(batch["starts"][row, slot]), int(batch["lengths"][row, slot])
            offset = int(batch["offsets"][row, slot])
            cached = arrays[video]
            if cached.shape[0] < offset + length or start + length > fmt.t_max:
                raise ValueError(
                    f"video {video}: piece [{offset}, {offset + length}) at start {start} does not fit its "
                    f"cached {cached.shape[0]} frames or t_max {fmt.t_max}: the plan and the cache disagree"
                )
            piece = cached[offset : offset + length]
            if fmt.center:
                piece = center_crop(piece, fmt.crop)
            elif deferred:
                if cached.shape[1:3] != (side, side):
                    raise ValueError(
                        f"video {video}: cached frames are {cached.shape[1]}x{cached.shape[2]}, the rows "
                        f"{side}x{side}: RowFormat.size must be the run's data.cache_size"
                    )
                if params is not None:
                    rng = final_rng(fmt.seed, fmt.epoch, plan_index, slot)
                    params[:, row, slot] = final_params(rng, side, side, fmt.crop)
            else:
                piece = final_augment(
                    piece, crop=fmt.crop, rng=final_rng(fmt.seed, fmt.epoch, plan_index, slot)
                )
            frames[row, start : start + length] = piece
    extra = {}
    if params is not None:
        extra = {"tops": params[0], "lefts": params[1], "flips": params[2]}
    return {
        "frames": frames,
        "starts": np.asarray(batch["starts"], dtype=np.int64),
        "lengths": np.asarray(batch["lengths"], dtype=np.int64),
        "labels": np.asarray(batch["labels"], dtype=np.int64),
        "num_sequences": np.asarray(batch["num_sequences"], dtype=np.int64),
        "weight": np.asarray(batch["weight"], dtype=np.float32),
        "block": np.asarray(batch["block"], dtype=np.int64),
        # The video of each slot (-1: padding): the learner's per-epoch accounting (accounting.py).
        "ids": np.asarray(batch["ids"], dtype=np.int64),
        **extra,
    }


class RowBuffer:
    """Block rows arriving in batches of any size, handed out ``take(n)`` rows at a time.

    A source yields batches of whatever size they have; the buffer keeps them and re-slices, so the
    adaptive batch size can grow mid-epoch (batches of 3, 3, 3 taken 4 at a time: 4, 4, then 1).
    Subclasses fill it in ``_pull`` (one batch through ``_append``, or ``done = True`` at the end).
    ``wait_seconds`` is the time ``_pull`` spent blocked (the learner waiting for data); ``rows`` and
    ``frames`` (useful frames, padding excluded) what was taken.
    """

    def __init__(self) -> None:
        self._pending: deque[dict[str, np.ndarray]] = deque()
        self._buffered = 0
        self.done = False
        self.wait_seconds = 0.0
        self.rows = 0
        self.frames = 0

    def _pull(self) -> None:
        raise NotImplementedError

    def _append(self, batch: Mapping[str, np.ndarray]) -> None:
        size = len(batch["block"])
        if size:
            self._pending.append({key: np.asarray(value) for key, value in batch.items()})
            self._buffered += size

    def take(self, n: int) -> dict[str, np.ndarray] | None:
        """The next ``n`` rows (fewer at the end), or None when every row was taken."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"take(n) needs an int n >= 1, got {n!r}: pass the mini-batch size in blocks")
        while self._buffered < n and not self.done:
            self._pull()
        if not self._buffered:
            return None
        parts, need = [], n
        while need and self._pending:
            head = self._pending[0]
            size = len(head["block"])
            if size <= need:
                parts.append(self._pending.popleft())
                need -= size
            else:
                # Split the head batch: take its first `need` rows, keep the rest at the front.
                parts.append({key: value[:need] for key, value in head.items()})
                self._pending[0] = {key: value[need:] for key, value in head.items()}
                need = 0
        out = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
        taken = len(out["block"])
        self._buffered -= taken
        self.rows += taken
        self.frames += int(np.clip(out["lengths"], 0, None).sum())
        return out


class BlockRowStream(RowBuffer):
    """The rows of a dataset with Ray Data's ``iter_batches`` (a shard's rows), ``take(n)`` at a time."""

    def __init__(self, dataset, *, prefetch_batches: int = 2) -> None:
        if (
            isinstance(prefetch_batches, bool)
            or not isinstance(prefetch_batches, int)
            or prefetch_batches < 0
        ):
            raise ValueError(f"prefetch_batches must be an int >= 0, got {prefetch_batches!r}: use e.g. 2")
        super().__init__()
        self._dataset = dataset
        self._prefetch = prefetch_batches
        self._iterator: Iterator[Mapping[str, np.ndarray]] | None = None

    def _pull(self) -> None:
        if self._iterator is None:
            self._iterator = iter(
                self._dataset.iter_batches(
                    batch_size=None, batch_format="numpy", prefetch_batches=self._prefetch
                )
            )
        began = time.perf_counter()
        try:
            batch = next(self._iterator)
        except StopIteration:
            self.done = True
            return
        finally:
            self.wait_seconds += time.perf_counter() - began
        self._append(batch)
