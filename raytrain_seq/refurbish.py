"""Data refurbishing schedule: balanced eviction and cache-aware batch composition (numpy only).

Algorithm (Lee et al., "Refurbish Your Training Data: Reusing Partially Augmented Samples for Faster
Deep Neural Network Training", USENIX ATC '21, the Revamper system). The augmentation pipeline is split
in two: an expensive *partial* augmentation (decode, temporal stride, resize, per-video random transform,
optical flow) whose output is cached, and a cheap stochastic *final* augmentation (random crop, flip)
that runs on every use. Each cached sample is served in ``r`` epochs (the reuse factor), so only
``N / r`` samples need the expensive step per epoch. Two rules keep the CPU cost of every step equal:

* **Balanced eviction** (inter-epoch balance). One random permutation of the ids is drawn once (from
  ``seed``) and cut into ``r`` nearly equal consecutive slices; epoch ``e >= 1`` evicts (recomputes)
  slice ``(e - 1) % r``, and the same order repeats for the whole run. Every epoch after the first
  therefore recomputes ``floor(N/r)`` or ``ceil(N/r)`` samples, and every sample is recomputed exactly
  once every ``r`` epochs. A naive reference-count eviction instead recomputes everything in epoch
  ``r``, ``2r``, ... and nothing in between.
* **Cache-aware shuffle** (intra-epoch balance). ``compose`` gives each mini-batch the same share of
  fresh (just recomputed) ids, to within one, with fresh and cached ids each in random order. A plain
  shuffle puts a binomially varying number of fresh ids in each batch, so some steps stall the device.

Reuse, precisely. Epoch 0 computes every id. An id in slice ``k`` is then recomputed in epochs
``k + 1, k + 1 + r, k + 1 + 2r, ...``. Each computation is served in exactly ``r`` epochs (the
computing epoch plus ``r - 1`` reuses); only the epoch-0 computation is served in fewer (``k + 1``
epochs), which is the warm-up the paper means by "all N cached samples are reused exactly r times
after the first r epochs". Worked example, N=10, r=3: slices of sizes [4, 3, 3]; an id of slice 1 is
computed in epochs 0, 2, 5, 8, ...; its epoch-2 computation is served in epochs 2, 3, 4 (three epochs)
and recomputed in epoch 5. Its age (epochs since it was last computed) runs 0, 1, 0, 1, 2, 0, 1, 2, ...;
ages never exceed ``r - 1``. ``r = 1`` recomputes everything every epoch (the standard pipeline).

``reuse > num_samples`` is allowed: ``even_split`` then leaves some slices empty, so some epochs
recompute nothing (``floor(N/r) = 0`` still holds) and the per-epoch cost cannot be balanced; a warning
is logged. Every id is still recomputed exactly once every ``r`` epochs.

Checkpointing. The schedule is a pure function of ``(num_samples, reuse, seed, epoch)``: nothing is
stored between epochs, so a resumed run only needs those four values to reproduce the evictions and
batches of any epoch, and any process (driver or worker) can compute them independently.

Data echoing (Choi et al.), the baseline the paper compares against, caches the *fully* augmented
sample and replays it; it is a pipeline choice (cache after the final augmentation), not a schedule,
so it needs nothing from this module. The paper reports that echoing loses accuracy while
refurbishing keeps it.

Trade-off. Recompute work per epoch drops to 1/r of the standard pipeline (r=3: 3179 of the 9537
UCF101 split-1 training videos per epoch); the paper reports 1.03x-2.04x training throughput on
ImageNet/ResNet-50 at comparable accuracy, the gain largest when CPUs are scarce. The price is memory
for one cached copy of every sample. On that UCF101 size with r=3 and batch size 32 (epoch 1: 3179
fresh, 10.7 a batch on average), ``compose`` keeps every full batch at 10 or 11 fresh ids, by
construction; a plain shuffle's count is binomial and its extremes reach about twice the mean
(docs/ARCHITECTURE.md, "Measurements behind the code"). ``bench/refurbish.py`` measures the end-to-end effect (docs/BENCHMARKS.md,
"Revamper").
"""

from __future__ import annotations

import logging
import numbers

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
