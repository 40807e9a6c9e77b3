"""Tests for raytrain_seq.algorithms.refurbish: balanced eviction and cache-aware batch composition (Revamper)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from raytrain_seq.algorithms.refurbish import RefurbishSchedule, balance_fresh, even_split

# (N, r): r=1, r=N, r>N, N not divisible by r, N divisible by r, a single sample.
CASES = [(10, 3), (12, 1), (7, 7), (5, 9), (100, 7), (12, 4), (1, 1), (1, 4), (37, 2)]


def _simulate_last_computed(schedule: RefurbishSchedule, epochs: int) -> np.ndarray:
    """Reference: last[e, id] = epoch in which id was last computed, replayed from evicted() alone."""
    n = schedule.num_samples
    last = np.zeros((epochs, n), dtype=np.int64)
    current = np.zeros(n, dtype=np.int64)
    for e in range(epochs):
        current[schedule.evicted(e)] = e
        last[e] = current
    return last


def _check_composition(schedule: RefurbishSchedule, epoch: int, batch_size: int) -> list[np.ndarray]:
    """Assert every compose() invariant for one (epoch, batch_size) and return the batches."""
    n = schedule.num_samples
    batches = schedule.compose(epoch, batch_size)
    fresh_mask = np.zeros(n, dtype=bool)
    fresh_mask[schedule.evicted(epoch)] = True
    n_fresh = int(fresh_mask.sum())

    # Every id exactly once.
    flat = np.concatenate(batches)
    assert flat.dtype == np.int64
    assert np.array_equal(np.sort(flat), np.arange(n))

    # Sizes: batch_size everywhere except a short last batch holding N % batch_size.
    sizes = np.array([len(b) for b in batches])
    assert len(batches) == -(-n // batch_size)
    assert np.all(sizes[:-1] == batch_size)
    assert sizes[-1] == (n % batch_size or batch_size)

    fresh = np.array([int(fresh_mask[b].sum()) for b in batches])
    assert np.array_equal(fresh, schedule.fresh_per_batch(epoch, batch_size))
    full = fresh[sizes == batch_size]
    if len(full):
        assert full.max() - full.min() <= 1, f"full batches hold {full.min()}..{full.max()} fresh ids"
    # Each batch's fresh count tracks its proportional share F * size / N: the short last batch to within
    # rounding, the full ones to within 1.5 (one for even_split, half for the last batch's rounding).
    share = n_fresh * sizes / n
    assert np.all(np.abs(fresh - share) < 1.5)
    if sizes[-1] < batch_size:
        assert abs(fresh[-1] - share[-1]) <= 0.5
    return batches


def test_even_split_matches_array_split_and_worked_examples():
    """even_split gives sizes differing by at most one, larger first, exactly as np.array_split does."""
    assert even_split(10, 3).tolist() == [4, 3, 3]
    assert even_split(7, 3).tolist() == [3, 2, 2]
    assert even_split(2, 5).tolist() == [1, 1, 0, 0, 0]
    assert even_split(0, 2).tolist() == [0, 0]
    for n in range(0, 40):
        for g in range(1, 12):
            sizes = even_split(n, g)
            reference = [len(part) for part in np.array_split(np.arange(n), g)]
            assert sizes.tolist() == reference
            assert sizes.sum() == n and sizes.max() - sizes.min() <= 1


def test_epoch_zero_computes_everything():
    """Epoch 0 recomputes every id, reuses none, and every age is 0."""
    for n, r in CASES:
        s = RefurbishSchedule(n, reuse=r, seed=3)
        assert np.array_equal(s.evicted(0), np.arange(n))
        assert s.reused(0).size == 0
        assert s.counts(0) == (n, 0)
        assert np.all(s.age(0) == 0) and np.all(s.is_fresh(0))


def test_every_id_evicted_exactly_once_per_r_epochs():
    """Over any r consecutive epochs >= 1 each id is evicted once, each epoch floor/ceil(N/r) ids."""
    for n, r in CASES:
        s = RefurbishSchedule(n, reuse=r, seed=11)
        expected_sizes = sorted(len(p) for p in np.array_split(np.arange(n), r))
        for first in (1, 2, r, r + 1, 3 * r + 2):
            window = [s.evicted(e) for e in range(first, first + r)]
            assert np.array_equal(np.sort(np.concatenate(window)), np.arange(n))
            sizes = [len(w) for w in window]
            assert all(n // r <= k <= -(-n // r) for k in sizes)
            assert sorted(sizes) == expected_sizes
        # Epoch e evicts slice (e - 1) % r of the even split, the larger slices first: N=10, r=3 -> 4, 3, 3.
        assert [len(s.evicted(e)) for e in range(1, r + 1)] == s.slice_sizes.tolist()
        assert s.slice_sizes.tolist() == even_split(n, r).tolist()


def test_slices_repeat_with_period_r():
    """The eviction sequence repeats with period r: one fixed permutation, reused for the whole run."""
    for n, r in CASES:
        s = RefurbishSchedule(n, reuse=r, seed=5)
        for e in range(1, r + 1):
            for k in (1, 2, 7):
                assert np.array_equal(s.evicted(e), s.evicted(e + k * r))
        # A fresh object with the same arguments reproduces it (pure function of n, r, seed, epoch).
        t = RefurbishSchedule(n, reuse=r, seed=5)
        assert all(np.array_equal(s.evicted(e), t.evicted(e)) for e in range(2 * r + 2))


def test_eviction_permutation_is_random_and_seeded():
    """The slices come from a seeded random permutation: not contiguous ranges, different per seed."""
    n, r = 100, 4
    a, b = RefurbishSchedule(n, reuse=r, seed=0), RefurbishSchedule(n, reuse=r, seed=1)
    first = a.evicted(1)
    assert len(first) == 25
    assert not np.array_equal(first, np.arange(first[0], first[0] + 25))
    assert not np.array_equal(first, b.evicted(1))
    # Not aliased with a plain shuffle of the same seed (SeedSequence ignores trailing zero words).
    plain = np.sort(np.random.default_rng(0).permutation(n)[:25])
    assert not np.array_equal(first, plain)


def test_age_is_fresh_reused_counts_match_simulation():
    """age/is_fresh/reused/counts agree with a replay of evicted(); ages stay in 0..r-1 and cycle."""
    for n, r in CASES:
        s = RefurbishSchedule(n, reuse=r, seed=2)
        epochs = 4 * r + 3
        last = _simulate_last_computed(s, epochs)
        for e in range(epochs):
            age = s.age(e)
            assert np.array_equal(age, e - last[e])
            assert age.min() >= 0 and age.max() <= r - 1
            assert np.array_equal(s.is_fresh(e), age == 0)
            assert np.array_equal(s.reused(e), np.flatnonzero(age > 0))
            assert s.counts(e) == (len(s.evicted(e)), len(s.reused(e)))
            if e >= r:
                # After warm-up every id's age runs 0, 1, ..., r-1 and repeats.
                assert np.array_equal(s.age(e + r), age)
        if r <= n:
            # The maximum age r-1 is actually reached, so the bound above is tight.
            assert max(s.age(e).max() for e in range(r, 2 * r)) == r - 1
        ages = np.stack([s.age(e) for e in range(r, 2 * r)])
        assert np.array_equal(np.sort(ages, axis=0), np.repeat(np.arange(r)[:, None], n, axis=1))


def test_each_computation_is_served_in_exactly_r_epochs():
    """Between two recomputations an id is served in exactly r epochs; the epoch-0 one in at most r."""
    for n, r in CASES:
        s = RefurbishSchedule(n, reuse=r, seed=8)
        epochs = 5 * r + 2
        fresh = np.stack([s.is_fresh(e) for e in range(epochs)])
        assert fresh[0].all()
        for i in range(n):
            computed = np.flatnonzero(fresh[:, i])
            served = np.diff(computed)  # epochs served by each computation before the next one
            assert served[0] <= r
            assert np.all(served[1:] == r), f"id {i} computed in epochs {computed.tolist()}"
            assert len(computed) >= 5


def test_reuse_above_num_samples_leaves_epochs_empty(caplog):
    """reuse > num_samples is allowed: some epochs recompute nothing, a warning says so, rules hold."""
    with caplog.at_level(logging.WARNING, logger="raytrain_seq.algorithms.refurbish"):
        s = RefurbishSchedule(3, reuse=5, seed=0)
    assert any("reuse=5 > num_samples=3" in rec.getMessage() for rec in caplog.records)
    assert [s.counts(e)[0] for e in range(1, 6)] == [1, 1, 1, 0, 0]
    assert s.evicted(4).size == 0 and s.evicted(4).dtype == np.int64
    assert np.all(s.age(5) > 0)
    batches = _check_composition(s, 4, 2)
    assert len(batches) == 2


def test_compose_spreads_fresh_ids_evenly():
    """compose: every id once, full batches differ by at most one fresh id, the short batch its share."""
    s = RefurbishSchedule(100, reuse=3, seed=4)
    batches = _check_composition(s, 1, 16)
    fresh_mask = s.is_fresh(1)
    fresh = [int(fresh_mask[b].sum()) for b in batches]
    # Non-trivial: several batches, a short last one, and both fresh and cached ids in each batch.
    assert len(batches) == 7 and len(batches[-1]) == 4
    assert all(0 < f < len(b) for f, b in zip(fresh, batches, strict=True))
    # 34 fresh: last batch round(34 * 4 / 100) = 1, the other 33 over 6 full batches -> [6, 6, 6, 5, 5, 5].
    assert fresh == [6, 6, 6, 5, 5, 5, 1]
    for e in range(0, 8):
        for bs in (1, 3, 16, 33, 100, 150):
            _check_composition(s, e, bs)


def test_fresh_per_batch_worked_examples():
    """The documented worked examples: N=10,bs=4,F=4 -> [2,1,1]; N=21,bs=7,F=7 -> [3,2,2]."""
    assert RefurbishSchedule(10, reuse=3).fresh_per_batch(1, 4).tolist() == [2, 1, 1]
    assert RefurbishSchedule(21, reuse=3).fresh_per_batch(1, 7).tolist() == [3, 2, 2]
    assert RefurbishSchedule(10, reuse=1).fresh_per_batch(5, 4).tolist() == [4, 4, 2]


def test_compose_shuffles_inside_batches():
    """Fresh ids are not parked at the front of every batch, and fresh/cached ids are in random order."""
    s = RefurbishSchedule(400, reuse=4, seed=0)
    batches = _check_composition(s, 2, 20)
    fresh_mask = s.is_fresh(2)
    at_front = [bool(np.all(fresh_mask[b][: int(fresh_mask[b].sum())])) for b in batches]
    assert not all(at_front)
    flat = np.concatenate(batches)
    assert not np.array_equal(flat[fresh_mask[flat]], np.sort(flat[fresh_mask[flat]]))
    assert not np.array_equal(flat[~fresh_mask[flat]], np.sort(flat[~fresh_mask[flat]]))


def test_compose_deterministic_per_seed_and_epoch():
    """compose depends only on (seed, epoch): equal when repeated, different across epochs and seeds."""
    for r in (1, 3):
        a = RefurbishSchedule(60, reuse=r, seed=7)
        again = RefurbishSchedule(60, reuse=r, seed=7)
        other = RefurbishSchedule(60, reuse=r, seed=8)
        for e in range(0, 7):
            x = a.compose(e, 8)
            assert all(np.array_equal(p, q) for p, q in zip(x, again.compose(e, 8), strict=True))
            assert not all(np.array_equal(p, q) for p, q in zip(x, other.compose(e, 8), strict=True))
        # Same eviction slice (epochs 1 and 1 + r), still a different batch order.
        first, later = a.compose(1, 8), a.compose(1 + r, 8)
        assert np.array_equal(a.evicted(1), a.evicted(1 + r))
        assert not all(np.array_equal(p, q) for p, q in zip(first, later, strict=True))


def test_naive_shuffle_violates_even_spread():
    """A plain random shuffle does break the even fresh spread (so the even-spread check is not vacuous)."""
    n, r, bs = 300, 3, 30
    s = RefurbishSchedule(n, reuse=r, seed=0)
    fresh_mask = s.is_fresh(1)
    naive = np.random.default_rng(0).permutation(n).reshape(-1, bs)
    naive_fresh = fresh_mask[naive].sum(axis=1)
    assert naive_fresh.max() - naive_fresh.min() > 1
    aware = np.array([fresh_mask[b].sum() for b in _check_composition(s, 1, bs)])
    assert aware.max() - aware.min() <= 1 and naive_fresh.sum() == aware.sum() == 100


def test_random_combinations_property():
    """For many random (N, r, batch_size, epoch, seed), eviction and composition keep every invariant."""
    rng = np.random.default_rng(2024)
    nontrivial = 0
    for _ in range(250):
        n = int(rng.integers(1, 150))
        # Mostly small reuse factors and batches (the realistic, non-trivial regime), sometimes extremes.
        r = int(rng.integers(1, 9) if rng.random() < 0.7 else rng.integers(1, n + 6))
        bs = int(rng.integers(1, n // 3 + 2) if rng.random() < 0.7 else rng.integers(1, n + 4))
        seed = int(rng.integers(0, 1000))
        epoch = int(rng.integers(0, 3 * r + 2))
        s = RefurbishSchedule(n, reuse=r, seed=seed)
        window = np.concatenate([s.evicted(e) for e in range(epoch + 1, epoch + 1 + r)])
        assert np.array_equal(np.sort(window), np.arange(n))
        recomputed, reused = s.counts(epoch)
        assert recomputed + reused == n
        if epoch >= 1:
            assert n // r <= recomputed <= -(-n // r)
        batches = _check_composition(s, epoch, bs)
        nontrivial += len(batches) > 2 and reused > 0 and recomputed > len(batches)
    assert nontrivial > 80


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda: RefurbishSchedule(0, reuse=1), ValueError, "num_samples"),
        (lambda: RefurbishSchedule(-3, reuse=1), ValueError, "num_samples"),
        (lambda: RefurbishSchedule(10.0, reuse=1), TypeError, "num_samples"),
        (lambda: RefurbishSchedule(10, reuse=0), ValueError, "reuse"),
        (lambda: RefurbishSchedule(10, reuse=2.5), TypeError, "reuse"),
        (lambda: RefurbishSchedule(10, reuse=True), TypeError, "reuse"),
        (lambda: RefurbishSchedule(10, reuse=2, seed=-1), ValueError, "seed"),
        (lambda: RefurbishSchedule(10, reuse=2).evicted(-1), ValueError, "epoch"),
        (lambda: RefurbishSchedule(10, reuse=2).age(1.0), TypeError, "epoch"),
        (lambda: RefurbishSchedule(10, reuse=2).compose(-1, 4), ValueError, "epoch"),
        (lambda: RefurbishSchedule(10, reuse=2).compose(1, 0), ValueError, "batch_size"),
        (lambda: RefurbishSchedule(10, reuse=2).compose(1, "4"), TypeError, "batch_size"),
        (lambda: even_split(5, 0), ValueError, "n_groups"),
        (lambda: even_split(-1, 2), ValueError, "n_items"),
    ],
)
def test_validation_errors_name_argument_and_fix(call, error, name):
    """Bad input raises ValueError/TypeError naming the argument and saying how to fix it."""
    with pytest.raises(error, match=name) as info:
        call()
    message = str(info.value)
    assert ";" in message and len(message.split(";", 1)[1].strip()) > 10


def test_numpy_integers_are_accepted():
    """numpy integer arguments work like Python ints (ids from catalogs are often numpy scalars)."""
    s = RefurbishSchedule(np.int64(20), reuse=np.int32(3), seed=np.uint8(1))
    assert s.num_samples == 20 and s.reuse == 3 and s.seed == 1
    _check_composition(s, int(np.int64(2)), 6)
    assert np.array_equal(s.evicted(np.int64(2)), s.evicted(2))


def test_balance_fresh_worked_example_and_identities():
    """The docstring's example; every id fresh (epoch 0, r = 1) or none leaves the plan as it is."""
    fresh = np.array([True, True, False, False])
    assert balance_fresh([[0, 1], [2, 3]], [5, 5, 5, 5], fresh).tolist() == [0, 2, 1, 3]
    for mask in (np.ones(4, bool), np.zeros(4, bool)):
        assert balance_fresh([[0, 1], [2, 3]], [5, 5, 5, 5], mask).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="one per id"):
        balance_fresh([[0, 1]], [5, 5], np.array([True]))


def test_balance_fresh_keeps_lengths_and_evens_the_fresh_frames_of_blocks():
    """On real packed blocks (UCF101-like lengths, the schedule's fresh ids): a permutation within equal
    lengths (so the padding is the plan's), a chunk id in two blocks keeps its place, and the spread of the
    blocks' fresh frames drops below the plan's own (not vacuous: the plan's spread is large)."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 60, size=400)
    blocks, block, used = [], [], 0
    for i in rng.permutation(400):  # first fit in a random order: blocks of up to 100 frames
        if used + lengths[i] > 100:
            blocks.append(block)
            block, used = [], 0
        block.append(int(i))
        used += lengths[i]
    blocks.append([*block, 0])  # id 0 now sits in two blocks, as a chunk video's pieces do
    fresh = RefurbishSchedule(400, reuse=3, seed=1).is_fresh(1)
    perm = balance_fresh(blocks, lengths, fresh)
    assert sorted(perm.tolist()) == list(range(400)) and (lengths[perm] == lengths).all() and perm[0] == 0

    def spread(assign):
        per_block = [sum(lengths[assign[i]] for i in b if fresh[assign[i]]) for b in blocks[:-1]]
        return np.std(per_block)

    before, after = spread(np.arange(400)), spread(perm)
    assert before > 10 and after < 0.8 * before, (before, after)
