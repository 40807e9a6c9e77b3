"""Block packing (BLoad): invariants on random and real UCF101 lengths, against plain references."""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
import subprocess
import sys
import time
from importlib import resources

import numpy as np
import pytest

from raytrain_seq.algorithms.packing import STRATEGIES, Block, apply_stride, main, pack, read_lengths, shard

SPLITS = ("train", "test")
STATS_KEYS = {
    "sequences",
    "frames",
    "blocks",
    "padding",
    "deleted",
    "lower_bound_blocks",
    "strategy",
    "t_max",
}


def real_lengths(split: str) -> np.ndarray:
    with resources.as_file(
        resources.files("raytrain_seq.data") / f"ucf101_split1_{split}_lengths.txt"
    ) as path:
        return read_lengths(path)


def real_path(split: str) -> str:
    return str(resources.files("raytrain_seq.data") / f"ucf101_split1_{split}_lengths.txt")


def reference_ffd(lengths, t_max: int) -> int:
    """Plain first-fit-decreasing, one item at a time: the lowest-index bin with room, else a new bin."""
    room = np.empty(len(lengths), dtype=np.int64)
    bins = 0
    for length in sorted(lengths, reverse=True):
        fits = np.flatnonzero(room[:bins] >= length)
        if fits.size:
            room[fits[0]] -= length
        else:
            room[bins] = t_max - length
            bins += 1
    return bins


def reference_bfd(lengths, t_max: int) -> int:
    """Plain best-fit-decreasing: the bin with the least room that still fits, else a new bin."""
    rooms: list[int] = []
    bins = 0
    for length in sorted(lengths, reverse=True):
        i = bisect.bisect_left(rooms, length)
        if i < len(rooms):
            bisect.insort(rooms, rooms.pop(i) - length)
        else:
            bisect.insort(rooms, t_max - length)
            bins += 1
    return bins


def check_whole_plan(plan, lens) -> dict:
    """Invariants of every strategy that keeps sequences whole; returns stats()."""
    lens = [int(x) for x in lens]
    placed = sorted(i for b in plan.blocks for i in b.ids)
    assert placed == list(range(len(lens))), "every id exactly once"
    for b in plan.blocks:
        assert b.ids, "no empty block in a plan"
        assert list(b.lengths) == [lens[i] for i in b.ids]
        assert list(b.starts) == list(np.cumsum((0, *b.lengths))[:-1]), "starts are the running sums"
        assert b.frames == sum(b.lengths) <= plan.t_max, "no sequence crosses a block"
        assert b.offsets == (0,) * len(b.ids)
    stats = plan.stats()
    assert stats.keys() >= STATS_KEYS
    assert stats["frames"] == sum(lens) and stats["deleted"] == 0 and stats["cut"] == 0
    assert stats["blocks"] == len(plan.blocks)
    assert stats["padding"] == stats["blocks"] * plan.t_max - stats["frames"]
    assert stats["padding_fraction"] == pytest.approx(stats["padding"] / (stats["blocks"] * plan.t_max))
    assert stats["lower_bound_blocks"] == -(-sum(lens) // plan.t_max) <= stats["blocks"]
    return stats


def check_chunk_plan(plan, lens) -> dict:
    """Chunk: every frame of each sequence is kept in exactly one piece or counted as deleted."""
    t_max, pieces = plan.t_max, {}
    for b in plan.blocks:
        assert len(b.ids) == 1 and b.starts == (0,)
        pieces.setdefault(b.ids[0], []).append((b.offsets[0], b.lengths[0]))
    assert sorted(pieces) == list(range(len(lens)))
    deleted = 0
    for i, length in enumerate(int(x) for x in lens):
        parts = sorted(pieces[i])
        assert [o for o, _ in parts] == [k * t_max for k in range(len(parts))], "consecutive pieces from 0"
        if length <= t_max:
            assert parts == [(0, length)], "a short sequence stays whole"
        else:
            assert all(n == t_max for _, n in parts), "pieces are exactly t_max"
        kept = sum(n for _, n in parts)
        assert 0 <= length - kept < t_max
        deleted += length - kept
    stats = plan.stats()
    assert stats["deleted"] == deleted and stats["frames"] + deleted == int(np.sum(lens))
    assert stats["cut"] == int(np.sum(np.asarray(lens) > t_max))
    assert stats["padding"] == stats["blocks"] * t_max - stats["frames"]
    return stats


def fig7_violations(plan, lens) -> int:
    """Blocks that closed while a sequence placed later would still have fit in their room."""
    later_min = [np.inf] * (len(plan.blocks) + 1)
    for k in range(len(plan.blocks) - 1, -1, -1):
        later_min[k] = min(later_min[k + 1], *(lens[i] for i in plan.blocks[k].ids))
    return sum(later_min[k + 1] <= plan.t_max - b.frames for k, b in enumerate(plan.blocks))


def random_lists():
    rng = np.random.default_rng(7)
    yield [5], None
    yield [3, 3, 3], 3
    for t_max in (1, 2, 10, 97, 1000):
        yield rng.integers(1, t_max + 1, size=int(rng.integers(1, 400))), t_max
    yield rng.integers(1, 60, size=300).tolist(), None


@pytest.mark.parametrize("strategy", ["optimal", "bload", "pad"])
def test_whole_sequence_invariants_on_random_lists(strategy):
    """Every id once, starts = running sums, no block over t_max, frames conserved, padding consistent."""
    for lens, t_max in random_lists():
        plan = pack(lens, t_max, strategy=strategy, seed=3)
        assert plan.strategy == strategy and plan.seed == 3
        assert plan.t_max == (max(lens) if t_max is None else t_max)
        check_whole_plan(plan, lens)


@pytest.mark.parametrize("split", SPLITS)
def test_every_strategy_on_the_real_lists(split):
    """All four strategies keep their invariants on UCF101; only chunk deletes frames, pad wastes most."""
    lens = real_lengths(split)
    found = {s: check_whole_plan(pack(lens, strategy=s), lens) for s in ("optimal", "bload", "pad")}
    chunk = check_chunk_plan(pack(lens, round(lens.mean()), strategy="chunk"), lens)
    assert chunk["deleted"] > 0 and chunk["cut"] > 0
    assert found["optimal"]["padding"] < found["bload"]["padding"] < found["pad"]["padding"]
    assert found["pad"]["blocks"] == len(lens)


def test_worked_example_reset_table():
    """Lengths 37, 24, 20 in a block of 94: starts 0, 37, 61 and padding 13, whatever the seed."""
    orders = set()
    for seed in range(40):
        plan = pack([37, 24, 20], 94, seed=seed)
        (block,) = plan.blocks
        assert plan.stats()["padding"] == 13 and block.frames == 81
        orders.add(block.lengths)
        if block.lengths == (37, 24, 20):
            assert block.starts == (0, 37, 61) and block.ids == (0, 1, 2)
    assert (37, 24, 20) in orders and len(orders) > 1, "the seed also shuffles the order inside a block"


def test_block_is_frozen_with_default_offsets():
    """Block is a frozen dataclass; offsets default to zeros; frames counts used frames; sizes must agree."""
    block = Block((4, 9), (0, 37), (37, 24))
    assert block.offsets == (0, 0) and block.frames == 61 and not block.is_filler
    with pytest.raises(dataclasses.FrozenInstanceError):
        block.ids = (1,)
    with pytest.raises(ValueError, match="one entry per sequence"):
        Block((1, 2), (0,), (5, 6))


@pytest.mark.parametrize("split", SPLITS)
def test_optimal_never_worse_than_reference_ffd(split):
    """On the real lists at strides 1..8, optimal uses no more blocks than a plain FFD (and usually fewer)."""
    raw = real_lengths(split)
    gains = 0
    for stride in range(1, 9):
        lens = apply_stride(raw, stride)
        t_max = int(lens.max())
        stats = pack(lens, seed=stride).stats()
        ffd = reference_ffd(lens.tolist(), t_max)
        assert stats["t_max"] == t_max and stats["blocks"] <= ffd
        assert stats["ffd_blocks"] == ffd and stats["bfd_blocks"] == reference_bfd(lens.tolist(), t_max)
        assert stats["blocks"] - stats["lower_bound_blocks"] <= 2
        gains += ffd - stats["blocks"]
    assert gains > 0, "the reference FFD leaves room to improve, and optimal takes it"


def test_internal_ffd_and_bfd_match_the_references_on_random_lists():
    """The grouped FFD/BFD inside optimal count exactly what item-by-item FFD/BFD count."""
    rng = np.random.default_rng(11)
    for t_max in (10, 100, 1000):
        lens = rng.integers(1, t_max + 1, size=500)
        stats = pack(lens, t_max).stats()
        assert stats["ffd_blocks"] == reference_ffd(lens.tolist(), t_max)
        assert stats["bfd_blocks"] == reference_bfd(lens.tolist(), t_max)
        assert stats["blocks"] <= min(stats["ffd_blocks"], stats["bfd_blocks"])


def test_seeds_give_different_plans_with_the_same_count():
    """Optimal: another seed moves equal-length sequences and reorders blocks; the same seed repeats."""
    lens = real_lengths("train")
    assert len(np.unique(lens)) < len(lens) - 1000, "the list really has equal-length ties"
    a, b, again = pack(lens, seed=0), pack(lens, seed=1), pack(lens, seed=0)
    assert a.blocks == again.blocks
    assert len(a.blocks) == len(b.blocks)
    assert {frozenset(x.ids) for x in a.blocks} != {frozenset(x.ids) for x in b.blocks}
    assert [x.lengths for x in a.blocks] != [x.lengths for x in b.blocks], "block order differs too"


def test_bload_closes_blocks_as_in_fig7():
    """Bload: when a block closes, every sequence placed in a later block is longer than its room."""
    for lens, t_max in [*random_lists(), (real_lengths("test"), None)]:
        plan = pack(lens, t_max, strategy="bload", seed=5)
        assert fig7_violations(plan, [int(x) for x in lens]) == 0
    lens = real_lengths("train").tolist()
    assert fig7_violations(pack(lens, strategy="pad"), lens) > 0, "the check can fail"


def test_bload_draws_a_fitting_length_then_a_sequence_of_that_length():
    """Bload's Random* (the authors' reference implementation): uniform over distinct fitting lengths first.

    Lengths [1, 2, 2, 2] at t_max 2: the first draw picks length 1 or length 2 with 1/2 each, so id 0
    (the only length-1 sequence) opens the first block half the time and each length-2 id 1/6 of the
    time; uniform over sequences would give 1/4 each, which the bounds below rule out (5 standard
    errors of 2000 trials are 0.056).
    """
    trials = 2000
    firsts = np.bincount(
        [pack([1, 2, 2, 2], 2, strategy="bload", seed=s).blocks[0].ids[0] for s in range(trials)], minlength=4
    )
    expected = np.array([1 / 2, 1 / 6, 1 / 6, 1 / 6])
    assert np.all(np.abs(firsts / trials - expected) < 0.04), firsts


def test_bload_draws_only_lengths_that_fit_the_room():
    """After a 3-frame sequence in a block of 5, only length 2 fits: the room rules, not the counts.

    Lengths [3, 2, 4, 4, 4, 4] at t_max 5. A block that opens with id 0 (length 3) must close with id 1
    (the one length that fits the 2 frames left); the 4s each fill a block of their own.
    """
    for seed in range(200):
        plan = pack([3, 2, 4, 4, 4, 4], 5, strategy="bload", seed=seed)
        for block in plan.blocks:
            if block.ids[0] == 0:
                assert block.ids == (0, 1), (seed, block)
            assert sum(block.lengths) <= 5
            if 4 in block.lengths:
                assert block.lengths == (4,), (seed, block)
        assert sorted(i for b in plan.blocks for i in b.ids) == list(range(6))


def test_bload_is_worse_than_optimal_but_far_better_than_pad():
    """On the real train list bload lands several blocks over the lower bound, optimal at most 2."""
    lens = real_lengths("train")
    over = [pack(lens, strategy="bload", seed=s).stats() for s in range(3)]
    best = pack(lens).stats()
    assert all(s["blocks"] - s["lower_bound_blocks"] >= 5 for s in over)
    assert best["blocks"] < min(s["blocks"] for s in over) < len(lens)


def test_pad_and_chunk_baselines():
    """Pad: one sequence per block. Chunk: 400 at t_max 187 gives pieces at 0 and 187; the 26-frame tail is deleted."""
    plan = pack([400, 187, 50], 187, strategy="chunk")
    pieces = sorted((b.ids[0], b.offsets[0], b.lengths[0]) for b in plan.blocks)
    assert pieces == [(0, 0, 187), (0, 187, 187), (1, 0, 187), (2, 0, 50)]
    stats = check_chunk_plan(plan, [400, 187, 50])
    assert (stats["deleted"], stats["cut"], stats["padding"], stats["blocks"]) == (26, 1, 137, 4)
    pad = pack([400, 187, 50], strategy="pad")
    assert sorted(b.ids for b in pad.blocks) == [(0,), (1,), (2,)] and pad.stats()["padding"] == 213 + 350


@pytest.mark.parametrize("world_size", [1, 2, 3, 7, 8, 16])
def test_shard_equal_counts_nothing_dropped(world_size):
    """Shard: equal block counts, at most W-1 empty fillers, every block kept, frames balanced."""
    lens = real_lengths("test")
    for plan in (pack(lens, strategy="bload"), pack(lens[:5], strategy="pad")):
        ranks = shard(plan, world_size)
        n = len(plan.blocks)
        assert len(ranks) == world_size and len({len(r) for r in ranks}) == 1
        everything = [b for r in ranks for b in r]
        fillers = [b for b in everything if b.is_filler]
        assert len(fillers) == (-n) % world_size <= world_size - 1
        assert all(b.frames == 0 and b.ids == () for b in fillers)
        assert sorted(b.ids for b in everything if not b.is_filler) == sorted(b.ids for b in plan.blocks)
        frames = [sum(b.frames for b in r) for r in ranks]
        assert max(frames) - min(frames) <= max(b.frames for b in plan.blocks)
        stats = plan.stats(world_size=world_size)
        assert (stats["filler_blocks"], stats["blocks_per_rank"]) == (len(fillers), len(ranks[0]))
        assert shard(plan, world_size) == ranks, "deterministic"


BAD_INPUTS = [
    (([10, 1776, 5], 900), {}, r"id 1 .*1776 > t_max 900.*--stride 2.*888"),
    (([10, 0, 5], None), {}, r"id 1 has length 0"),
    (([10, -3], None), {}, r"id 1 has length -3"),
    (([], None), {}, r"empty"),
    (([10, 20], 0), {}, r"t_max must be an integer >= 1"),
    (([10, 20], -5), {}, r"t_max must be an integer >= 1"),
    (([10, 20], 2.5), {}, r"t_max must be an integer"),
    (
        ([10, 20], None),
        {"strategy": "random"},
        r"unknown strategy 'random'.*'optimal', 'bload', 'pad', 'chunk'",
    ),
    (([10, 37.5], None), {}, r"id 1 has length 37.5"),
    (([10, "37"], None), {}, r"id 1 has length '37'"),
    (("10 20", None), {}, r"not a string"),
    (([[1, 2], [3, 4]], None), {}, r"flat list"),
    (([10, 20], None), {"seed": -1}, r"seed must be an integer >= 0"),
]


@pytest.mark.parametrize(("args", "kwargs", "message"), BAD_INPUTS)
def test_bad_input_raises_a_value_error_naming_it(args, kwargs, message):
    """Bad lengths, t_max, strategy or seed raise ValueError naming the culprit and the fix."""
    with pytest.raises(ValueError, match=message):
        pack(*args, **kwargs)


def test_other_bad_input(tmp_path):
    """Shard, stride and file errors name the bad value, the file and the line."""
    plan = pack([3, 4])
    with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
        shard(plan, 0)
    with pytest.raises(ValueError, match="world_size"):
        plan.stats(world_size=-1)
    with pytest.raises(ValueError, match="stride must be an integer >= 1"):
        apply_stride([3, 4], 0)
    assert apply_stride([37, 36, 1], 2).tolist() == [19, 18, 1]
    with pytest.raises(ValueError, match=r"cannot read length file .*nope\.txt"):
        read_lengths(tmp_path / "nope.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("# comment\n12 0\n\nabc 1\n")
    with pytest.raises(ValueError, match=r"bad.txt:4: first field 'abc'"):
        read_lengths(bad)
    bad.write_text("12\n0 3\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: length 0"):
        read_lengths(bad)
    bad.write_text("# only comments\n")
    with pytest.raises(ValueError, match="holds no lengths"):
        read_lengths(bad)
    assert read_lengths(real_path("test")).size == 3783


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "raytrain_seq.algorithms.packing", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_prints_stats_and_fails_cleanly():
    """The CLI prints stats() as JSON; bad input prints one error line, no traceback, exit code 2."""
    out = run_cli(real_path("train"), "--stride", "2", "--strategy", "bload", "--seed", "4")
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert stats.keys() >= STATS_KEYS and stats["t_max"] == 888 and stats["strategy"] == "bload"
    assert stats["sequences"] == 9537 and stats["frames"] == int(apply_stride(real_lengths("train"), 2).sum())
    out = run_cli(real_path("train"), "--t-max", "900")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    assert re.search(r"id \d+ has length 1776 > t_max 900.*--stride 2 .*888", out.stderr), out.stderr


CLI_ERRORS = [
    (("--stride", "2", "--t-max", "400"), r"length 888 > t_max 400.*--stride 5 .*356"),
    (("--strategy", "best"), "unknown strategy 'best'"),
    (("--stride", "0"), "stride must be an integer >= 1"),
    (("--t-max", "0"), "t_max must be an integer >= 1"),
    (("--world-size", "0"), "world_size must be an integer >= 1"),
]


@pytest.mark.parametrize(("args", "message"), CLI_ERRORS)
def test_cli_errors_in_process(capsys, args, message):
    """Each CLI error is one 'error:' line on stderr with exit code 2 (the stride hint counts --stride)."""
    assert main([real_path("train"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and re.search(message, err), err


def test_cli_bad_files(tmp_path, capsys):
    """A missing file or a bad line is named by the CLI (path, line) with exit code 2."""
    assert main([str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_text("12 0\nx 1\n")
    assert main([str(bad)]) == 2
    assert "bad.txt:2" in capsys.readouterr().err
    good = tmp_path / "good.txt"
    good.write_text("5\n# a comment\n7 1\n")
    assert main([str(good), "--world-size", "4"]) == 0
    stats = json.loads(capsys.readouterr().out)
    # t_max = longest = 7, so 5 and 7 need two blocks; four ranks need two fillers
    assert [stats[k] for k in ("frames", "blocks", "filler_blocks", "blocks_per_rank")] == [12, 2, 2, 1]


@pytest.mark.parametrize("strategy", ["optimal", "bload"])
def test_ten_thousand_sequences_well_under_a_second(strategy):
    """10,000 sequences plan in well under a second (generous bound: < 1 s on a noisy machine)."""
    lens = np.random.default_rng(0).choice(real_lengths("train"), size=10_000)
    start = time.perf_counter()
    plan = pack(lens, strategy=strategy)
    assert time.perf_counter() - start < 1.0
    assert len(plan.blocks) < 2000


def test_strategies_listed():
    """The four public strategies are exactly the contract's."""
    assert set(STRATEGIES) == {"optimal", "bload", "pad", "chunk"}
