"""Checks of user-given values that raise ``ValueError`` naming the thing, the value and the fix.

One place for the rules every config section and reader applies (``python -O`` strips ``assert``, so
user input is never checked with one). Each helper takes the dotted path the user knows the value by
(``train.batch_size``, a flag name with ``-`` -> ``_``) and a fix phrased as an instruction;
``check_number``, the short form the averaging parts apply to their own arguments, names the fix itself
and returns the value it checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = [
    "check_number",
    "choice",
    "int_at_least",
    "is_int",
    "is_number",
    "number",
    "optional_bool",
    "optional_int_at_least",
    "optional_path",
]


def is_int(value: object) -> bool:
    """An int that is not a bool (True as a batch size is always a mistake)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite int or float (not a bool)."""
    # An int is always finite (and math.isfinite would overflow on one past a float's range).
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))


def int_at_least(path: str, value: object, minimum: int, fix: str) -> None:
    """``value`` is an int >= ``minimum``."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{path} must be an int >= {minimum}, got {value!r}: {fix}")


def optional_int_at_least(path: str, value: object, minimum: int, fix: str) -> None:
    """``value`` is None or an int >= ``minimum``."""
    if value is not None:
        int_at_least(path, value, minimum, f"{fix}, or None")


def number(path: str, value: object, rule: str, in_range: Callable[[float], bool], fix: str) -> None:
    """``value`` is a finite number for which ``in_range`` holds (``rule`` says it in words)."""
    if not is_number(value) or not in_range(value):
        raise ValueError(f"{path} must be a finite number {rule}, got {value!r}: {fix}")


def check_number(name: str, value: Any, low: float, kind: Any = int) -> Any:
    """``value`` is a finite ``kind`` (int by default; not a bool) >= ``low``; returns it."""
    if not (isinstance(value, kind) and is_number(value) and value >= low):
        what = "an int" if kind is int else "a number"
        raise ValueError(
            f"{name} must be {what} >= {low:g}, got {value!r}: pass a finite value of at least {low:g}"
        )
    return value


def choice(path: str, value: object, choices: tuple[str, ...], extra: str = "") -> None:
    """``value`` is one of ``choices``."""
    if value not in choices:
        names = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{path} must be one of {names}, got {value!r}: pick one of them{extra}")


def optional_bool(path: str, value: object, none_means: str) -> None:
    """``value`` is True, False or None (``none_means`` says what None does)."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(
            f"{path} must be True, False or None ({none_means}), got {value!r}: pass a bool or leave it None"
        )


def optional_path(path: str, value: object, fix: str) -> None:
    """``value`` is None or a non-empty path string (existence is checked where the file is used)."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{path} must be a non-empty path or None, got {value!r}: {fix}")


def parse_learners(value: object) -> int | tuple[int, int]:
    """A count stays an int; "MIN:MAX", [min, max] or (min, max) become a tuple (an int when min == max).

    e.g. 2 -> 2, "4" -> 4, "2:8" -> (2, 8), [2, 8] (from JSON) -> (2, 8), "3:3" -> 3.
    """
    fix = "give a count (2) or an elastic range MIN:MAX with 1 <= MIN <= MAX (2:8)"
    given = value
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"train.learners: cannot read {value!r}: {fix}")
        value = tuple(int(p) for p in parts) if len(parts) == 2 else int(parts[0])
    if isinstance(value, list | tuple):
        if len(value) != 2 or not all(is_int(v) for v in value) or not 1 <= value[0] <= value[1]:
            raise ValueError(f"train.learners must be a count or (min, max), got {given!r}: {fix}")
        return value[0] if value[0] == value[1] else (value[0], value[1])
    int_at_least("train.learners", value, 1, fix)
    return value
