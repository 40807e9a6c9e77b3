"""Data refurbishing schedule: balanced eviction and cache-aware batch composition (numpy only).

Algorithm (Lee et al., "Refurbish Your Training Data", USENIX ATC '21, Revamper): an expensive *partial*
augmentation is cached and served in ``r`` epochs; a cheap *final* one runs on every use. Two rules keep
every step's CPU cost equal:
* **Balanced eviction.** One seeded permutation of the ids is cut into ``r`` near-equal slices; epoch
  ``e >= 1`` recomputes slice ``(e - 1) % r``: ``floor(N/r)`` or ``ceil(N/r)`` ids, each once every ``r``
  epochs. An id of slice ``k`` is computed in epochs 0, ``k + 1``, ``k + 1 + r``, ...; its age never
  exceeds ``r - 1``. ``reuse > num_samples`` leaves some epochs empty (a warning).
* **Cache-aware shuffle** (``compose``): each mini-batch gets the same share of fresh ids to within one.
The schedule is a pure function of ``(num_samples, reuse, seed, epoch)``: nothing is stored, so a resume
or any process reproduces it (data echoing, the paper's baseline, needs nothing here). ``balance_fresh`` serves the feed's cache-aware plan of packed blocks
(docs/ARCHITECTURE.md, "Data refurbishing"); the trade-off's figures: "Measurements behind the code";
``bench/refurbish.py`` measures it (docs/BENCHMARKS.md, "Revamper").
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Sequence

import numpy as np

logger = logging.getLogger(__name__)

# Independent random streams derived from the user's seed: one for the eviction permutation, one per
# epoch for batch composition, so changing one never perturbs the other. The tags are nonzero because
# SeedSequence ignores trailing zeros: default_rng([seed, 0]) IS default_rng(seed), so a tag of 0 would
# make the evictions equal a pipeline's plain default_rng(seed).permutation(N) shuffle.
_EVICTION_STREAM = 0x52454655
_COMPOSE_STREAM = 0x434F4D50


def _check_int(value: object, name: str, minimum: int, fix: str) -> int:
    """Return ``value`` as an int >= ``minimum`` or raise a message naming ``name`` and the fix."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__}); {fix}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}; {fix}")
    return value


def even_split(n_items: int, n_groups: int) -> np.ndarray:
    """Sizes of ``n_groups`` groups holding ``n_items`` in total, differing by at most one.

    The larger groups come first, as with ``np.array_split``: ``even_split(10, 3) -> [4, 3, 3]``,
    ``even_split(7, 3) -> [3, 2, 2]``, ``even_split(2, 5) -> [1, 1, 0, 0, 0]``. Each size is
    ``floor(n_items / n_groups)`` or that plus one. Returns an int64 array of length ``n_groups``.
    """
    n_items = _check_int(n_items, "n_items", 0, "pass the number of items to split (0 or more)")
    n_groups = _check_int(n_groups, "n_groups", 1, "pass at least one group")
    base, extra = divmod(n_items, n_groups)
    sizes = np.full(n_groups, base, dtype=np.int64)
    # 10 items in 3 groups: base 3, extra 1 -> the first group gets the leftover item: [4, 3, 3].
    sizes[:extra] += 1
    return sizes


class RefurbishSchedule:
    """Which ids to recompute each epoch (balanced eviction) and how to batch them (cache-aware shuffle).

    Ids are ``0 .. num_samples - 1`` (positions in the catalog). ``reuse`` is the paper's reuse factor
    ``r``: each partial augmentation is served in ``r`` epochs. ``seed`` (an int >= 0) fixes the
    eviction permutation and, together with the epoch, every batch composition. See the module
    docstring for the exact reuse semantics and a worked example.
    """

    def __init__(self, num_samples: int, reuse: int = 1, seed: int = 0) -> None:
        self._num_samples = _check_int(
            num_samples, "num_samples", 1, "pass the dataset size (at least one sample)"
        )
        self._reuse = _check_int(reuse, "reuse", 1, "use reuse=1 to recompute every epoch, or r > 1 to reuse")
        self._seed = _check_int(seed, "seed", 0, "pass a non-negative int seed")
        if self._reuse > self._num_samples:
            logger.warning(
                "reuse=%d > num_samples=%d: %d of every %d epochs recompute nothing, so the per-epoch "
                "cost cannot be balanced; lower reuse to at most num_samples to avoid it",
                self._reuse,
                self._num_samples,
                self._reuse - self._num_samples,
                self._reuse,
            )
        rng = np.random.default_rng([self._seed, _EVICTION_STREAM])
        self._perm = rng.permutation(self._num_samples).astype(np.int64)
        self._slice_sizes = even_split(self._num_samples, self._reuse)
        # Slice k is perm[starts[k] : starts[k + 1]]. N=10, r=3: sizes [4, 3, 3] -> starts [0, 4, 7, 10].
        self._starts = np.concatenate([[0], np.cumsum(self._slice_sizes)]).astype(np.int64)
        # slot[id] = index of the slice holding id, i.e. id is evicted in epochs slot+1, slot+1+r, ...
        self._slot = np.empty(self._num_samples, dtype=np.int64)
        self._slot[self._perm] = np.repeat(np.arange(self._reuse, dtype=np.int64), self._slice_sizes)

    @property
    def num_samples(self) -> int:
        return self._num_samples

    @property
    def reuse(self) -> int:
        return self._reuse

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def slice_sizes(self) -> np.ndarray:
        """Sizes of the ``r`` eviction slices (``even_split(num_samples, reuse)``); a copy."""
        return self._slice_sizes.copy()

    def __repr__(self) -> str:
        return f"RefurbishSchedule(num_samples={self._num_samples}, reuse={self._reuse}, seed={self._seed})"

    def _epoch(self, epoch: int) -> int:
        return _check_int(epoch, "epoch", 0, "epochs count from 0 (epoch 0 computes every sample)")

    def evicted(self, epoch: int) -> np.ndarray:
        """Sorted int64 ids whose partial augmentation is (re)computed in ``epoch``.

        Epoch 0: every id. Epoch ``e >= 1``: slice ``(e - 1) % r`` of the fixed permutation, i.e.
        ``floor(N/r)`` or ``ceil(N/r)`` ids.
        """
        epoch = self._epoch(epoch)
        if epoch == 0:
            return np.arange(self._num_samples, dtype=np.int64)
        k = (epoch - 1) % self._reuse
        return np.sort(self._perm[self._starts[k] : self._starts[k + 1]])

    def is_fresh(self, epoch: int) -> np.ndarray:
        """Bool mask over ids: True where the id is recomputed in ``epoch`` (its age is 0)."""
        return self.age(epoch) == 0

    def reused(self, epoch: int) -> np.ndarray:
        """Sorted int64 ids served from the cache in ``epoch`` (the complement of ``evicted``)."""
        return np.flatnonzero(~self.is_fresh(epoch)).astype(np.int64)

    def age(self, epoch: int) -> np.ndarray:
        """Int64 array over ids: epochs since each id was last computed (0 = computed this epoch).

        Always in ``0 .. r - 1``. The last computation of an id in slice ``s`` at epoch ``e >= 1`` is
        ``e - ((e - 1 - s) % r)``, or epoch 0 if that falls before epoch 1. Worked example, r=3, s=1:
        e=1 -> (0 - 1) % 3 = 2 -> 1 - 2 = -1 < 1, so last computed at 0, age 1; e=2 -> 0 -> age 0;
        e=4 -> (4 - 1 - 1) % 3 = 2 -> last computed at 2, age 2.
        """
        epoch = self._epoch(epoch)
        if epoch == 0:
            return np.zeros(self._num_samples, dtype=np.int64)
        since = (epoch - 1 - self._slot) % self._reuse
        last = epoch - since
        last[last < 1] = 0
        return epoch - last

    def counts(self, epoch: int) -> tuple[int, int]:
        """``(recomputed, reused)`` sample counts for ``epoch``; they sum to ``num_samples``."""
        epoch = self._epoch(epoch)
        if epoch == 0:
            return self._num_samples, 0
        recomputed = int(self._slice_sizes[(epoch - 1) % self._reuse])
        return recomputed, self._num_samples - recomputed

    def fresh_per_batch(self, epoch: int, batch_size: int) -> np.ndarray:
        """How many fresh ids each batch of ``compose(epoch, batch_size)`` holds (int64 array).

        Full batches split the fresh ids with ``even_split``, so their counts differ by at most one. A
        short last batch of ``L`` ids gets the rounded proportional share ``round(F * L / N)`` first,
        which always lies in the feasible range ``[max(0, L - cached), min(L, F)]`` because the exact
        share ``F*L/N`` does (``F*L/N - (L - cached) = (N - L)(N - F) / N >= 0``). Worked example,
        N=10, batch_size=4, F=4 fresh: batches [4, 4, 2]; the last gets round(4 * 2 / 10) = 1; the
        other 3 go to the two full batches as even_split(3, 2) = [2, 1] -> [2, 1, 1]. With N=21,
        batch_size=7, F=7: three full batches, even_split(7, 3) = [3, 2, 2].
        """
        epoch = self._epoch(epoch)
        batch_size = _check_int(batch_size, "batch_size", 1, "pass a batch size of at least 1")
        n = self._num_samples
        fresh = self.counts(epoch)[0]
        n_full, last = divmod(n, batch_size)
        # round(F * L / N) in integers: floor((2 F L + N) / (2 N)).
        fresh_last = (2 * fresh * last + n) // (2 * n) if last else 0
        parts = []
        if n_full:
            parts.append(even_split(fresh - fresh_last, n_full))
        if last:
            parts.append(np.array([fresh_last], dtype=np.int64))
        return np.concatenate(parts)

    def compose(self, epoch: int, batch_size: int) -> list[np.ndarray]:
        """The batches of ``epoch``: every id exactly once, fresh ids spread evenly (cache-aware shuffle).

        All batches hold ``batch_size`` ids except the last, which is short (``N % batch_size`` ids)
        when ``batch_size`` does not divide ``N``; nothing is dropped. Fresh counts per batch follow
        ``fresh_per_batch``: they differ by at most one between full batches, and the short last batch
        gets its proportional share. Fresh and cached ids are each drawn in random order, and each
        batch is shuffled internally so fresh ids do not cluster at its front (a loader that splits a
        batch across workers would otherwise hand all the expensive ids to one worker). The order is a
        pure function of ``(seed, epoch)``: the same epoch always gives the same batches.
        """
        epoch = self._epoch(epoch)
        batch_size = _check_int(batch_size, "batch_size", 1, "pass a batch size of at least 1")
        n = self._num_samples
        fresh_counts = self.fresh_per_batch(epoch, batch_size)
        n_batches = len(fresh_counts)
        sizes = np.full(n_batches, batch_size, dtype=np.int64)
        sizes[-1] = n - batch_size * (n_batches - 1)
        mask = self.is_fresh(epoch)
        rng = np.random.default_rng([self._seed, _COMPOSE_STREAM, epoch])
        fresh_ids = rng.permutation(np.flatnonzero(mask))
        cached_ids = rng.permutation(np.flatnonzero(~mask))
        # Label every id with its batch: fresh counts [2, 1, 1] -> fresh labels [0, 0, 1, 2]; cached
        # counts sizes - fresh = [2, 3, 1] -> cached labels [0, 0, 1, 1, 1, 2]. Sorting the distinct
        # integer keys label * N + (random rank in 0..N-1) groups each batch and shuffles inside it in one
        # pass (exact in int64 while N * n_batches < 2**63; a float key label + random() can round up
        # into the next batch, and lexsort is slower).
        batch_of = np.arange(n_batches, dtype=np.int64)
        labels = np.concatenate(
            [np.repeat(batch_of, fresh_counts), np.repeat(batch_of, sizes - fresh_counts)]
        )
        ids = np.concatenate([fresh_ids, cached_ids]).astype(np.int64)
        order = np.argsort(labels * n + rng.permutation(n))
        # Split points: sizes [4, 4, 2] -> cumsum [4, 8, 10] -> split at [4, 8].
        return np.split(ids[order], np.cumsum(sizes)[:-1])


def balance_fresh(blocks: Sequence[Sequence[int]], lengths: Sequence[int], fresh: np.ndarray) -> np.ndarray:
    """Cache-aware composition of packed blocks: which id goes where, so every block carries its share of
    fresh frames.

    A packing plan fixes each block's LENGTHS, not which ids of a length fill them: ids of equal length are
    interchangeable without changing the padding. This picks, length by length (longest first), which of a
    length's slots receive its fresh ids: each fresh id goes to the slot whose block lags furthest behind
    its target ``share x block frames`` (``share`` = fresh frames / frames over every id; ties: the earlier
    slot), the cached ids fill the rest; ids and slots keep their order within a length, so the result is
    a pure function of its inputs. An id that sits in more than one block (a "chunk" video cut into pieces)
    keeps its place. Returns ``perm`` over ids: the plan's slot of id ``i`` now holds ``perm[i]`` (a
    permutation with ``lengths[perm[i]] == lengths[i]``; the identity when every id is fresh or none is).

    Worked example: blocks [[0, 1], [2, 3]], lengths [5, 5, 5, 5], fresh [T, T, F, F] (share 1/2, target
    5 fresh frames a block): slot 0 (block 0) gets fresh id 0; block 1 now lags most, so slot 2 gets fresh
    id 1; the cached ids 2, 3 take slots 1, 3. perm = [0, 2, 1, 3]: blocks [[0, 2], [1, 3]], 5 fresh each.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    fresh = np.asarray(fresh, dtype=bool)
    if fresh.shape != lengths.shape:
        raise ValueError(f"fresh has {fresh.shape[0]} entries for {lengths.shape[0]} ids: pass one per id")
    perm = np.arange(len(lengths), dtype=np.int64)
    where: dict[int, list[int]] = {}
    for b, ids in enumerate(blocks):
        for i in ids:
            where.setdefault(int(i), []).append(b)
    total = int(lengths.sum())
    share = float(lengths[fresh].sum()) / total if total else 0.0
    frames = [int(lengths[list(ids)].sum()) if len(ids) else 0 for ids in blocks]
    lag = [share * f for f in frames]  # target fresh frames still missing per block
    movable: dict[int, list[int]] = {}
    for i, at in sorted(where.items()):
        if len(at) == 1:
            movable.setdefault(int(lengths[i]), []).append(i)
        elif fresh[i]:
            for b in at:  # a piece's frames are not known here: its whole length counts once per block
                lag[b] -= lengths[i] / len(at)
    marked: dict[int, set[int]] = {}  # length -> the slots (positions in movable[length]) marked fresh
    for length in sorted(movable, reverse=True):
        slots = movable[length]  # ids in increasing order: their blocks are the slots
        new = [i for i in slots if fresh[i]]
        free = list(range(len(slots)))
        chosen = []
        for _ in new:
            # The free slot whose block lags most (max keeps the first of equals: the earlier slot).
            k = max(free, key=lambda j: lag[where[slots[j]][0]])
            free.remove(k)
            chosen.append(k)
            lag[where[slots[k]][0]] -= length
        marked[length] = set(chosen)
    _exchange(movable, marked, where, lag)
    for length, slots in movable.items():
        chosen = sorted(marked[length])
        free = [k for k in range(len(slots)) if k not in marked[length]]
        for k, i in zip(chosen, [i for i in slots if fresh[i]], strict=True):
            perm[slots[k]] = i
        for k, i in zip(free, [i for i in slots if not fresh[i]], strict=True):
            perm[slots[k]] = i
    return perm


def _exchange(
    movable: dict[int, list[int]], marked: dict[int, set[int]], where: dict[int, list[int]], lag: list[float]
) -> None:
    """After the greedy pass, move a length's fresh mark from the block furthest past its target to the
    free slot of that length whose block lags most, while that narrows the two blocks' gap (lags g_over <
    g_under - length: the sum of squared lags drops by 2 length (g_under - g_over - length) > 0), until
    no length can move one (each move lowers that sum, so it ends)."""
    moved = True
    while moved:
        moved = False
        for length, slots in movable.items():
            fresh_slots, free = marked[length], set(range(len(slots))) - marked[length]
            if not fresh_slots or not free:
                continue
            over = min(fresh_slots, key=lambda k: (lag[where[slots[k]][0]], k))
            under = max(free, key=lambda k: (lag[where[slots[k]][0]], -k))
            g_over, g_under = lag[where[slots[over]][0]], lag[where[slots[under]][0]]
            if g_under - g_over > length + 1e-9:
                lag[where[slots[over]][0]] += length
                lag[where[slots[under]][0]] -= length
                fresh_slots.discard(over)
                fresh_slots.add(under)
                moved = True
