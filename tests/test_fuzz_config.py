"""A fuzz pass over the configuration: seeded random configs of valid keys with wrong types and ranges.

Each config goes to ``Config.from_dict`` and, written as flags, to the job's command line (``cli.main``
with the checks before Ray: the flags, the config, ``preflight.check``). The contract: every one is
accepted or refused with ``ValueError`` (``cli.main``: exit 2, one ``error:`` line), never another
exception and never a traceback, each in under a second. A runner that raises ``Accepted`` stands in for
the runtime, so an accepted config starts nothing.

The values are drawn per field from the field's default, values of the right type in and out of range
(0, negatives, huge ints, nan, inf, empty text) and values of the wrong type (text, floats, bools, lists,
dicts, None); 1 to 4 fields change per config, and one config in ten changes every field. Half the draws for a number field are
numbers of its own type at every magnitude (1 to 2**64, 1e-9 to 1e300), so that many configs pass the
type checks and reach the range checks and those after the config; in one config of three every
number field drawn is one of those and every other field keeps its default.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import math
import random
import sys
import time
import types

import pytest

from raytrain_seq import cli
from raytrain_seq.config import Config, DataConfig, ModelConfig, RunConfig, TrainConfig

SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "run": RunConfig}
FIELDS = [(section, f) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
CONFIGS = 300
SEED = 42


class Accepted(Exception):
    """Raised by the stand-in runner: the config passed every check before the runtime."""


def _value(rng: random.Random, f: dataclasses.Field, typed: bool):
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if (typed or rng.random() < 0.5) and type(default) in (int, float):
        # The right type at every magnitude: these pass the type checks and test the ranges (and what
        # the checks after the config, the data and the model, make of an extreme but valid value).
        if isinstance(default, int):
            return rng.choice([1, 2, 3, 4, 8, 16, 100, 1000, 10**6, 10**12, 2**62, 2**64])
        return rng.choice([1e-9, 0.01, 0.1, 0.5, 0.9, 0.99, 2.0, 60.0, 1e6, 1e300])
    pool = [
        default,
        0,
        1,
        -1,
        2,
        3,
        7,
        64,
        10**9,
        10**30,
        -(10**30),
        0.0,
        0.5,
        -0.5,
        1.5,
        1e-3,
        1e12,
        math.nan,
        math.inf,
        -math.inf,
        True,
        False,
        None,
        "",
        " ",
        "x",
        "auto",
        "none",
        "2:8",
        "8:2",
        "1e-3",
        "../up",
        "a/b",
        [],
        [1, 2],
        ["a", "b"],
        {},
        {"k": 1},
        ("a", "b"),
    ]
    if isinstance(default, str) and default:
        pool += [default.upper(), default + "x"]
    if typed:
        return default
    return rng.choice(pool)


def _configs() -> list[dict]:
    rng = random.Random(SEED)
    out = []
    for n in range(CONFIGS):
        chosen = FIELDS if n % 10 == 9 else rng.sample(FIELDS, rng.randint(1, 4))
        d: dict[str, dict] = {}
        for section, f in chosen:
            d.setdefault(section, {})[f.name] = _value(rng, f, typed=n % 3 == 0)
        # Keep the storage out of the home folder and off each other's run folders.
        d.setdefault("run", {}).setdefault("run_name", f"fuzz-{n}")
        out.append(d)
    return out


def _argv(d: dict, storage: str) -> list[str]:
    """The flags that give ``d``: a bool value picks a switch, a pair gives two values, anything else
    is written as text (as a user would type it)."""
    argv = ["--storage-path", storage]
    for values in d.values():
        for name, value in values.items():
            flag = f"--{name.replace('_', '-')}"
            if isinstance(value, bool):
                argv.append(flag if value else f"--no-{name.replace('_', '-')}")
            elif isinstance(value, tuple | list) and value:
                argv += [flag, *(str(v) for v in value)]
            else:
                argv += [flag, "none" if value is None else str(value)]
    return argv


@pytest.fixture
def stand_in_runtime(monkeypatch):
    """The runtime's entry replaced: an accepted config raises Accepted instead of starting Ray."""
    for name, attr in (("raytrain_seq.runtime.driver", "run"), ("raytrain_seq.runtime.fuse", "run_fuse")):
        module = types.ModuleType(name)

        def accepted(config):
            raise Accepted

        setattr(module, attr, accepted)
        monkeypatch.setitem(sys.modules, name, module)


CASES = _configs()


@contextlib.contextmanager
def _heap_set_aside():
    """The earlier tests' objects moved out of the collector's reach (``gc.freeze``) while configs are
    timed: a collection that lands in one config's second then scans only what the configs made, not
    the heap the rest of the suite left (this process runs every test)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def test_the_fuzz_has_a_few_hundred_configs_touching_every_field():
    """The pass is not vacuous: hundreds of configs, every field changed in some, several kinds of values."""
    assert len(CASES) >= 300
    touched = {(s, n) for d in CASES for s, values in d.items() for n in values}
    assert touched == {(s, f.name) for s, f in FIELDS}


def test_config_from_dict_accepts_or_raises_value_error_only():
    """Config.from_dict on every fuzzed config: a Config or a ValueError, never another exception."""
    accepted = refused = 0
    with _heap_set_aside():
        for d in CASES:
            began = time.perf_counter()
            try:
                Config.from_dict(d)
                accepted += 1
            except ValueError as err:
                refused += 1
                assert str(err).strip() and "\n" not in str(err).strip(), (d, err)
            assert time.perf_counter() - began < 1.0, d
    assert accepted >= 10 and refused >= 100, (accepted, refused)  # both outcomes really happen


def test_the_command_line_exits_0_or_2_with_one_line(stand_in_runtime, capsys, tmp_path):
    """The same configs as flags: accepted (the runtime would start) or exit 2 with an `error:` line; no
    traceback, no other exception, each under a second."""
    outcomes = {"accepted": 0, "refused": 0}
    slowest = 0.0
    # The preflight's batch rule loads torch once per process (about a second): load it before the clock
    # runs, so each config is timed on its own work, whichever case comes first or runs alone.
    importlib.import_module("raytrain_seq.algorithms.averaging")
    with _heap_set_aside():
        for d in CASES:
            argv = _argv(d, str(tmp_path / "runs"))
            began = time.perf_counter()
            try:
                code = cli.main(argv, lambda config: sys.modules["raytrain_seq.runtime.driver"].run(config))
            except Accepted:
                code = 0
            except SystemExit as exit:  # argparse: a value it cannot read, or an unknown argument
                code = exit.code
            slowest = max(slowest, time.perf_counter() - began)
            err = capsys.readouterr().err
            assert code in (0, 2), (argv, err)
            assert "Traceback" not in err, (argv, err)
            if code == 2:
                assert any(line.startswith("error:") or ": error:" in line for line in err.splitlines()), argv
                outcomes["refused"] += 1
            else:
                outcomes["accepted"] += 1
            assert time.perf_counter() - began < 1.0, (argv, time.perf_counter() - began)
    assert outcomes["accepted"] >= 10 and outcomes["refused"] >= 100, outcomes
