"""Bin-filling heuristics over a histogram of sequence lengths, for ``packing.pack(strategy="optimal")``.

Each filler takes the distinct lengths in descending order (``values``), how many sequences have each
(``counts``), the block size ``t_max`` and the number of sequences ``n``, and returns the bin of each
sequence in descending-length order plus the number of bins. Working on (length, count) groups instead of
single items keeps planning fast: UCF101's 9,537 train videos have 507 distinct lengths
(``bench/packing.py`` times a 1,000,000-sequence plan). Which filler wins depends on the length
distribution, so ``packing._pack_optimal`` runs them and keeps the fewest bins (``bench/packing.py``
compares them with ``ceil(frames / t_max)`` on the UCF101 split-1 lists).
"""

from __future__ import annotations

import bisect

import numpy as np


def ffd_bins(values: list[int], counts: list[int], t_max: int, n: int) -> tuple[np.ndarray, int]:
    """First-fit-decreasing, one group of equal lengths at a time.

    Identical items keep going to the same first-fit bin until it cannot take another, so a group of k
    items of length L fills the open bins with room >= L in index order, floor(room / L) each, and then
    opens new bins of floor(t_max / L) items (rooms (20, 70, 65) and four 30s: bin 1 takes two, bin 2
    one, and the fourth opens bin 3). Returns the bin of each item in descending-length order.
    """
    room = np.empty(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    nbins = pos = 0
    for length, k in zip(values, counts, strict=True):
        if nbins:
            candidates = np.flatnonzero(room[:nbins] >= length)
            if candidates.size:
                take = room[candidates] // length
                total = np.cumsum(take)
                if total[-1] >= k:
                    last = int(np.searchsorted(total, k))
                    candidates, take = candidates[: last + 1], take[: last + 1]
                    take[-1] -= total[last] - k
                room[candidates] -= take * length
                used = int(take.sum())
                out[pos : pos + used] = np.repeat(candidates, take)
                pos, k = pos + used, k - used
        if k:
            per_bin = t_max // length
            new = -(-k // per_bin)
            room[nbins : nbins + new] = t_max - per_bin * length
            room[nbins + new - 1] = t_max - (k - per_bin * (new - 1)) * length
            out[pos : pos + k] = np.arange(nbins, nbins + new).repeat(per_bin)[:k]
            pos, nbins = pos + k, nbins + new
    return out, nbins


def bfd_bins(values: list[int], counts: list[int], t_max: int, n: int) -> tuple[np.ndarray, int]:
    """Best-fit-decreasing with bins bucketed by remaining room, one group of equal lengths at a time.

    The best fit for L is the bucket with the least room >= L (bisect over non-empty rooms). A bin with
    room c then takes q = c // L items in a row (after each, c - L is still the least room >= L), e.g.
    room 100, L 30: three items, room 10 left. Bins with equal room are interchangeable.
    """
    buckets: dict[int, list[int]] = {}
    rooms: list[int] = []
    out = np.empty(n, dtype=np.int64)
    nbins = pos = 0

    def put(room: int, bins: list[int]) -> None:
        if not buckets.get(room):
            buckets[room] = []
            bisect.insort(rooms, room)
        buckets[room].extend(bins)

    for length, k in zip(values, counts, strict=True):
        while k:
            i = bisect.bisect_left(rooms, length)
            if i == len(rooms):
                # nothing fits: open just enough new bins of t_max // length items each
                room, per_bin = t_max, t_max // length
                bucket = list(range(nbins, nbins - (-k // per_bin)))
                nbins += len(bucket)
            else:
                room, bucket = rooms[i], buckets[rooms[i]]
                per_bin = room // length
            need = -(-k // per_bin)
            taken = bucket[-need:] if need < len(bucket) else bucket[:]
            del bucket[len(bucket) - len(taken) :]
            if i < len(rooms) and not bucket:
                del rooms[i]
            placed = min(k, per_bin * len(taken))
            out[pos : pos + placed] = np.repeat(taken, per_bin)[:placed]
            tail = placed - per_bin * (len(taken) - 1)
            if len(taken) > 1:
                put(room - per_bin * length, taken[:-1])
            put(room - tail * length, taken[-1:])
            pos, k = pos + placed, k - placed
    return out, nbins


def exact_fill_bins(values: list[int], counts: list[int], t_max: int, n: int) -> tuple[np.ndarray, int]:
    """Fill one block at a time: largest items first, then close the block exactly.

    With room g: an item of length g closes it; else, if g <= 2 * longest, look for a pair a + b = g
    (largest b first, vectorised over the count table: room 300 with lengths {120, 180} left -> 180 +
    120); else take the longest item that fits. Returns the bin of each item in descending-length order.
    """
    cnt = [0] * (t_max + 1)
    for length, k in zip(values, counts, strict=True):
        cnt[length] = k
    has = np.zeros(t_max + 1, dtype=bool)
    has[values] = True
    reverse = has[::-1]  # reverse[t_max - a] is has[a]: lets the pair search slice without wrapping
    avail = sorted(values)
    placed: list[int] = []  # lengths in placement order; bins are filled one after another
    sizes: list[int] = []  # items per bin

    def take(length: int, m: int) -> None:
        cnt[length] -= m
        placed.extend([length] * m)
        if not cnt[length]:
            has[length] = False
            del avail[bisect.bisect_left(avail, length)]

    while avail:
        room, before = t_max, len(placed)
        while avail and room >= avail[0]:
            if cnt[room]:
                take(room, 1)
                break
            longest = avail[-1]
            if room > 2 * longest:
                # no pair can close it yet: take copies of the longest until room <= 2 * longest
                copies = min(cnt[longest], -(-(room - 2 * longest) // longest))
                take(longest, copies)
                room -= copies * longest
                continue
            low, high = (room + 1) // 2, min(room - 1, longest)
            if high >= low:
                # b in [low, high], a = room - b: mask[j] says both b = low + j and a are available
                mask = has[low : high + 1] & reverse[t_max - room + low : t_max - room + high + 1]
                if 2 * low == room and cnt[low] < 2:
                    mask[0] = False
                hits = mask.nonzero()[0]
                if hits.size:
                    big = low + int(hits[-1])
                    take(big, 1)
                    take(room - big, 1)
                    break
            length = avail[bisect.bisect_right(avail, room) - 1]
            take(length, 1)
            room -= length
        sizes.append(len(placed) - before)
    bins = np.repeat(np.arange(len(sizes)), sizes)
    return bins[np.argsort(-np.asarray(placed), kind="stable")], len(sizes)
