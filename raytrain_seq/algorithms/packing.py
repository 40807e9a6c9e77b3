"""Block packing of whole variable-length sequences (BLoad), with reset tables and equal sharding.

Source: Iftekhar, Ruschel et al., "BLoad" (Fig. 7). Whole sequences are concatenated into blocks of
exactly ``t_max`` frames; ``Block.starts`` (the reset table) says where each begins. ``pack`` strategies:
- ``"bload"``: the paper's Fig. 7, with the authors' Random* draw (a length uniform among the distinct
  remaining lengths that fit, then a sequence of it); close the block when none fits, pad the rest.
- ``"optimal"`` (default): the fewest blocks of first-fit-decreasing, best-fit-decreasing and an
  exact-fill packer (``binpack``); the seed shuffles equal lengths, block order and order within blocks.
- ``"pad"``: one sequence per block (the naive baseline).
- ``"chunk"``: sequences cut into ``t_max`` pieces, tails deleted (the paper's "sampling" baseline is
  built from it by ``bench/benchlib.py``'s ``sampling_plan``).
Contract: no strategy but ``"chunk"`` deletes a frame or cuts a sequence; ``"optimal"`` never uses more
blocks than FFD and its seed changes the plan, never the block count. ``shard`` deals blocks in equal
counts with zero-weight fillers. Measured by ``bench/packing.py`` (docs/BENCHMARKS.md, "Packing").
"""

from __future__ import annotations

import argparse
import json
import logging
import numbers
import random
import sys
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

import numpy as np

from raytrain_seq.algorithms.binpack import bfd_bins, exact_fill_bins, ffd_bins

logger = logging.getLogger(__name__)

STRATEGIES = ("optimal", "bload", "pad", "chunk")
# The longest sequence a length file may give: far past any video (2**40 frames at 30 fps is a thousand
# years), well inside int64, so the packer's sums never overflow.
MAX_LENGTH = 2**40


@dataclass(frozen=True)
class Block:
    """One sample of ``t_max`` frames: whole sequences laid end to end, then padding.

    ``ids`` index the input length list; ``starts`` is the reset table, e.g. lengths ``(37, 24, 20)``
    give starts ``(0, 37, 61)``; ``offsets`` is the first frame of each piece inside its source sequence
    (non-zero only for ``"chunk"`` pieces). A block with no ids is a zero-weight filler.
    """

    ids: tuple[int, ...]
    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    offsets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.offsets and self.ids:
            object.__setattr__(self, "offsets", (0,) * len(self.ids))
        if not len(self.ids) == len(self.starts) == len(self.lengths) == len(self.offsets):
            raise ValueError(
                f"Block fields differ in size (ids {len(self.ids)}, starts {len(self.starts)}, lengths "
                f"{len(self.lengths)}, offsets {len(self.offsets)}): give one entry per sequence in each"
            )

    @property
    def frames(self) -> int:
        """Frames used by sequences (the rest of the block is padding)."""
        return sum(self.lengths)

    @property
    def is_filler(self) -> bool:
        return not self.ids


@dataclass(frozen=True)
class PackPlan:
    """The blocks of one epoch plus what produced them."""

    blocks: list[Block]
    t_max: int
    strategy: str
    seed: int
    sequences: int
    deleted: int = 0
    cut: int = 0
    candidates: dict[str, int] = field(default_factory=dict)

    def stats(self, world_size: int | None = None) -> dict:
        """Counts for reports; with ``world_size`` also the fillers that ``shard`` adds."""
        blocks = len(self.blocks)
        frames = sum(b.frames for b in self.blocks)
        out = {
            "strategy": self.strategy,
            "seed": self.seed,
            "t_max": self.t_max,
            "sequences": self.sequences,
            "frames": frames,
            "blocks": blocks,
            "padding": blocks * self.t_max - frames,
            "padding_fraction": (blocks * self.t_max - frames) / (blocks * self.t_max),
            "deleted": self.deleted,
            "cut": self.cut,
            "lower_bound_blocks": -(-frames // self.t_max),
        }
        out.update({f"{name}_blocks": count for name, count in self.candidates.items()})
        if world_size is not None:
            world_size = _int_arg(world_size, "world_size", 1, "the number of ranks")
            fillers = (-blocks) % world_size
            out.update(
                world_size=world_size, filler_blocks=fillers, blocks_per_rank=(blocks + fillers) // world_size
            )
        return out


def pack(lengths, t_max: int | None = None, *, strategy: str = "optimal", seed: int = 0) -> PackPlan:
    """Plan the blocks for sequences of the given lengths; ids are positions in ``lengths``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: use one of {', '.join(map(repr, STRATEGIES))}")
    lens = _as_lengths(lengths)
    t_max = (
        int(lens.max()) if t_max is None else _int_arg(t_max, "t_max", 1, "or None for the longest length")
    )
    seed = _int_arg(seed, "seed", 0, "pass e.g. the epoch number", bounded=False)
    if strategy != "chunk":
        _check_fit(lens, t_max)
    rng = np.random.default_rng(seed)
    if strategy == "chunk":
        return _pack_chunk(lens, t_max, rng, seed)
    if strategy == "pad":
        blocks = [Block((i,), (0,), (int(n),)) for i, n in enumerate(lens.tolist())]
        blocks = [blocks[i] for i in rng.permutation(len(blocks))]
        return PackPlan(blocks, t_max, strategy, seed, len(lens))
    if strategy == "bload":
        return PackPlan(_pack_bload(lens, t_max, rng), t_max, strategy, seed, len(lens))
    blocks, candidates = _pack_optimal(lens, t_max, rng)
    return PackPlan(blocks, t_max, strategy, seed, len(lens), candidates=candidates)


def shard(plan: PackPlan, world_size: int) -> list[list[Block]]:
    """Split a plan over ``world_size`` ranks: equal block counts, nothing dropped, frames balanced.

    Adds ``(-blocks) % world_size`` empty filler blocks (at most ``world_size - 1``). Blocks are dealt in
    descending fill, snake-wise (ranks 0,1,2,2,1,0,0,1,...), so every rank gets one block per round and
    the heavy and light ends of each round cancel; each rank keeps the plan's order, fillers last.
    """
    world_size = _int_arg(world_size, "world_size", 1, "the number of ranks")
    blocks = list(plan.blocks) + [Block((), (), ())] * ((-len(plan.blocks)) % world_size)
    by_fill = sorted(range(len(blocks)), key=lambda i: (-blocks[i].frames, i))
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for position, index in enumerate(by_fill):
        turn, slot = divmod(position, world_size)
        ranks[slot if turn % 2 == 0 else world_size - 1 - slot].append(index)
    return [[blocks[i] for i in sorted(indices)] for indices in ranks]


def apply_stride(lengths, stride: int) -> np.ndarray:
    """Lengths after keeping every ``stride``-th frame: ``ceil(length / stride)`` (37 at stride 2 -> 19)."""
    return -(-_as_lengths(lengths) // _int_arg(stride, "stride", 1, "1 keeps every frame"))


def read_lengths(path) -> np.ndarray:
    """Read a length list: one sequence a line, first integer = frames; '#' lines and blank lines skipped."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read length file {str(path)!r} ({exc.strerror}): check the path") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"length file {str(path)!r} is not text ({exc.reason}): pass a text length list"
        ) from exc
    values = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        try:
            value = int(fields[0])
        except ValueError as exc:
            raise ValueError(
                f"{path}:{number}: first field {fields[0]!r} is not an integer frame count: "
                "each line must start with the sequence length (comment lines start with '#')"
            ) from exc
        if value <= 0:
            raise ValueError(f"{path}:{number}: length {value} must be >= 1: drop empty sequences")
        if value > MAX_LENGTH:
            raise ValueError(
                f"{path}:{number}: length {value} is more frames than a sequence can have (at most 2**40): "
                "fix the line (is a column missing?)"
            )
        values.append(value)
    if not values:
        raise ValueError(f"{path} holds no lengths: expected lines like '164 0' (frames, then anything)")
    return np.asarray(values, dtype=np.int64)


def _int_arg(value, name: str, minimum: int, fix: str, *, bounded: bool = True) -> int:
    """``value`` as an int >= ``minimum`` (and, ``bounded``, <= MAX_LENGTH: past it, int64 sums of frames
    and blocks could overflow); ValueError naming ``name`` and the fix."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} (got {value!r}): {fix}")
    if bounded and value > MAX_LENGTH:
        raise ValueError(f"{name} must be an integer from {minimum} to 2**40 (got {value!r}): {fix}")
    return int(value)


def _as_lengths(lengths) -> np.ndarray:
    """Validate user lengths into an int64 array, naming the first bad id."""
    if isinstance(lengths, (str, bytes)):
        raise ValueError(
            "lengths must be a list of integers, not a string: use read_lengths(path) for a file"
        )
    try:
        arr = np.asarray(lengths)
    except ValueError as exc:
        raise ValueError(
            f"lengths must be a flat list of integers ({exc}): pass one length per sequence"
        ) from exc
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a flat list (got shape {arr.shape}): pass one length per sequence")
    if arr.size == 0:
        raise ValueError("lengths is empty: pass at least one sequence length")
    if arr.dtype.kind in "iu":
        out = arr.astype(np.int64)
    elif arr.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"sequence id {i} has length {arr[i].item()!r}, not an integer frame count: round it"
            )
        out = arr.astype(np.int64)
    else:
        # judge the caller's own values: numpy turns [10, "37"] into strings throughout
        items = np.asarray(lengths, dtype=object).tolist()
        for i, value in enumerate(items):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(
                    f"sequence id {i} has length {value!r} ({type(value).__name__}), not an integer frame "
                    "count: convert lengths to int"
                )
        out = np.asarray([int(v) for v in items], dtype=np.int64)
    nonpositive = np.flatnonzero(out <= 0)
    if nonpositive.size:
        i = int(nonpositive[0])
        raise ValueError(f"sequence id {i} has length {out[i]}: lengths must be >= 1, drop empty sequences")
    huge = np.flatnonzero(out > MAX_LENGTH)
    if huge.size:
        i = int(huge[0])
        raise ValueError(f"sequence id {i} has length {out[i]}, over 2**40 frames: is it a frame count?")
    return out


def _too_long_message(seq_id: int, length: int, t_max: int, count: int = 1, stride: int = 1) -> str:
    """Explain a sequence longer than ``t_max`` and the stride that would fit it.

    ``length`` is before ``stride``; the suggested total stride ``s`` is the least with
    ``ceil(length / s) <= t_max``, i.e. ``s = ceil(length / t_max)`` (1776 into 900: s = 2 makes it 888).
    """
    fit = -(-length // t_max)
    others = f" ({count - 1} more are too long too)" if count > 1 else ""
    return (
        f"sequence id {seq_id} has length {-(-length // stride)} > t_max {t_max}{others}: use --stride {fit} "
        f"(apply_stride(lengths, {fit})) which makes it {-(-length // fit)}, raise t_max to "
        f"{-(-length // stride)}, or use strategy 'chunk' (which cuts sequences)"
    )


def _check_fit(lens: np.ndarray, t_max: int, raw: np.ndarray | None = None, stride: int = 1) -> None:
    """Name the longest sequence above t_max; ``raw`` (before ``stride``) makes the hint a total stride."""
    over = np.flatnonzero(lens > t_max)
    if over.size:
        worst = int(over[np.argmax(lens[over])])
        length = int((lens if raw is None else raw)[worst])
        raise ValueError(_too_long_message(worst, length, t_max, int(over.size), stride))


def _assemble(lens: np.ndarray, ids: np.ndarray, bins: np.ndarray, nbins: int, rng) -> list[Block]:
    """Blocks from a bin per id, in a seeded block order and a seeded order inside each block."""
    new_bin = rng.permutation(nbins)[bins]
    shuffled = rng.permutation(len(ids))
    order = shuffled[np.argsort(new_bin[shuffled], kind="stable")]
    ids_o = ids[order]
    lens_o = lens[ids_o]
    sizes = np.bincount(new_bin, minlength=nbins)
    ends = np.cumsum(sizes)
    # reset table: running sum minus the block's base, lengths (37, 24, 20) -> starts (0, 37, 61)
    running = np.cumsum(lens_o) - lens_o
    starts = running - np.repeat(running[ends - sizes], sizes)
    ids_l, lens_l, starts_l = ids_o.tolist(), lens_o.tolist(), starts.tolist()
    blocks, begin = [], 0
    for end in ends.tolist():
        blocks.append(Block(tuple(ids_l[begin:end]), tuple(starts_l[begin:end]), tuple(lens_l[begin:end])))
        begin = end
    return blocks


def _pack_chunk(lens: np.ndarray, t_max: int, rng, seed: int) -> PackPlan:
    """Cut into pieces of exactly t_max; length 400 at t_max 187: offsets 0, 187, tail of 26 deleted."""
    blocks = []
    for i, n in enumerate(lens.tolist()):
        if n <= t_max:
            blocks.append(Block((i,), (0,), (n,)))
        else:
            blocks.extend(Block((i,), (0,), (t_max,), (k * t_max,)) for k in range(n // t_max))
    blocks = [blocks[i] for i in rng.permutation(len(blocks))]
    over = lens > t_max
    deleted = int((lens[over] % t_max).sum())
    return PackPlan(blocks, t_max, "chunk", seed, len(lens), deleted=deleted, cut=int(over.sum()))


def _pack_bload(lens: np.ndarray, t_max: int, rng) -> list[Block]:
    """Fig. 7 with the reference implementation's Random*: a fitting length, then a video of that length.

    Two-stage draw, as ``AG_BLoad.randomize`` in github.com/RRuschel/BLoad (file ``AG_BLoad.py``) does
    it: draw uniformly among the DISTINCT lengths that still have a video and fit the room, then
    uniformly among the remaining videos of that length. Remaining lengths {3: 1 video, 5: 9 videos} and
    room 6: length 3 and length 5 each with probability 1/2, so the lone 3-frame video is drawn with
    probability 1/2, not 1/10. (The reference draws the video index with ``randint(0, n)`` and maps n to
    n - 1, which gives the first video of a length 2/(n+1); here every video of the length has 1/n.)

    A Fenwick tree over "this length still has a video" (1 or 0 per length) gives
    ``fit = #{distinct remaining lengths <= room}``; draw r in [0, fit) and descend to the (r+1)-th such
    length; its bucket is pre-shuffled and popped from its end (uniform within the length). A length
    leaves the tree when its bucket empties.
    """
    perm = rng.permutation(len(lens))
    grouped = perm[np.argsort(lens[perm], kind="stable")].tolist()
    counts = np.bincount(lens, minlength=t_max + 1).tolist()
    buckets, begin = {}, 0
    for length, count in enumerate(counts):
        if count:
            buckets[length] = grouped[begin : begin + count]
            begin += count
    tree = [int(count > 0) for count in counts]  # Fenwick tree in O(t_max): each node passes its total up
    for j in range(1, t_max + 1):
        if j + (j & -j) <= t_max:
            tree[j + (j & -j)] += tree[j]
    top = 1 << (t_max.bit_length() - 1)
    draw = random.Random(int(rng.integers(2**62))).randrange
    blocks, remaining = [], len(lens)
    while remaining:
        room, ids, sizes = t_max, [], []
        while True:
            fit, j = 0, room
            while j:
                fit += tree[j]
                j -= j & -j
            if not fit:
                break
            r, pos, step = draw(fit), 0, top
            while step:
                # descend to the largest pos with prefix(pos) <= r; the chosen length is pos + 1
                if pos + step <= t_max and tree[pos + step] <= r:
                    pos += step
                    r -= tree[pos]
                step >>= 1
            length = pos + 1
            bucket = buckets[length]
            ids.append(bucket.pop())
            sizes.append(length)
            if not bucket:
                j = length
                while j <= t_max:
                    tree[j] -= 1
                    j += j & -j
            room -= length
            remaining -= 1
        blocks.append(Block(tuple(ids), tuple(accumulate(sizes[:-1], initial=0)), tuple(sizes)))
    return blocks


def _pack_optimal(lens: np.ndarray, t_max: int, rng) -> tuple[list[Block], dict[str, int]]:
    """Keep the candidate with the fewest blocks; equal lengths are placed in a seeded order."""
    n = len(lens)
    # ids by descending length, equal lengths in seeded random order: lengths (5, 9, 5) -> ids (1, 0, 2)
    # or (1, 2, 0); every candidate returns the bin of each position of this order
    shuffled = rng.permutation(n)
    ids = shuffled[np.argsort(-lens[shuffled], kind="stable")]
    values, counts = (a[::-1].tolist() for a in np.unique(lens, return_counts=True))
    candidates, results = {}, {}
    for name, packer in (("ffd", ffd_bins), ("bfd", bfd_bins)):
        results[name] = packer(values, counts, t_max, n)
        candidates[name] = results[name][1]
    if min(candidates.values()) > -(-int(lens.sum()) // t_max):
        results["exact_fill"] = exact_fill_bins(values, counts, t_max, n)
        candidates["exact_fill"] = results["exact_fill"][1]
    best = min(candidates, key=lambda name: (candidates[name], name != "exact_fill"))
    logger.debug("optimal packing of %d sequences: candidates %s, kept %s", n, candidates, best)
    bins, nbins = results[best]
    return _assemble(lens, ids, bins, nbins, rng), candidates


def main(argv: list[str] | None = None) -> int:
    """CLI: print the stats of a plan for a length file as JSON; bad input exits 2 with one line."""
    parser = argparse.ArgumentParser(
        prog="python -m raytrain_seq.algorithms.packing",
        description="Plan BLoad blocks for a list of sequence lengths.",
        allow_abbrev=False,
    )
    parser.add_argument("file", help="one sequence a line, first integer = length; '#' lines are comments")
    parser.add_argument("--t-max", type=int, default=None, help="block size in frames (default: longest)")
    parser.add_argument(
        "--stride", type=int, default=1, help="keep every S-th frame: length -> ceil(length/S)"
    )
    parser.add_argument("--strategy", default="optimal", help=f"one of {', '.join(STRATEGIES)}")
    parser.add_argument("--seed", type=int, default=0, help="plan seed (e.g. the epoch)")
    parser.add_argument(
        "--world-size", type=int, default=None, help="also report fillers for this many ranks"
    )
    args = parser.parse_args(argv)
    try:
        raw = read_lengths(args.file)
        lens = apply_stride(raw, args.stride)
        if args.t_max is not None and args.t_max > 0 and args.strategy != "chunk":
            _check_fit(lens, args.t_max, raw, args.stride)
        plan = pack(lens, args.t_max, strategy=args.strategy, seed=args.seed)
        stats = plan.stats(args.world_size)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(stats, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
