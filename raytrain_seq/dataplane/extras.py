"""What a round does not average: integer buffers and Adam's step, as they travel beside the flat buffers.

A payload's ``extras`` (``FlatLayout.extras``) hold the model's integer buffers (BatchNorm's
num_batches_tracked) and the optimizer's values that are not moments (Adam's per-parameter ``step``).
Contract: a tensor travels as a numpy copy where numpy has its dtype (``by_value``), the optimizer's
one-value tensors as one column per name and dtype (``OptimizerExtras``), and comes back as a writable
tensor copy (``state_value``); a round's extras are learner 0's once every learner's steps agree
(``merge_extras``: Adam's bias correction depends on the step). Why numpy and columns: each message of
a round carries them, and a torch tensor pickles at a fixed cost per tensor (docs/ARCHITECTURE.md,
"Measurements behind the code"). Plain numpy and torch: no ray. torch is imported where tensors are read
or made: the control plane unpickles and merges extras without it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["OptimizerExtras", "by_value", "dtype_name", "merge_extras", "state_value"]

# Dtypes that go to numpy and come back as themselves (torch.tensor(array)): the extras travel as numpy.
_NUMPY_EXACT = ("float16", "float32", "float64", "bool", "uint8", "int8", "int16", "int32", "int64")


def dtype_name(tensor: Tensor) -> str:
    """``"float32"`` for a tensor of ``torch.float32``: a dtype by name, which needs no torch to compare."""
    return str(tensor.dtype).removeprefix("torch.")


def _numpy_exact(tensor: Tensor) -> bool:
    """Whether numpy holds ``tensor``'s dtype as it is (``_NUMPY_EXACT``)."""
    return dtype_name(tensor) in _NUMPY_EXACT


def by_value(tensor: Tensor) -> np.ndarray | Tensor:
    """A tensor that is not averaged, as it travels through the control plane: a numpy copy where numpy
    has its dtype, else a tensor copy. Why: every message of a round carries one Adam step per parameter
    tensor (and the integer buffers), and Ray pickles a torch tensor through ``torch.save``, a fixed cost
    per tensor that the control plane pays for every learner's message in and every reply out, where a
    numpy array pickles as its bytes (docs/ARCHITECTURE.md, "Measurements behind the code")."""
    tensor = tensor.detach().cpu()
    if _numpy_exact(tensor):
        return np.array(tensor.numpy(), copy=True)
    return tensor.clone()


def state_value(value: Any) -> Any:
    """An extras value as the state holds it: a tensor (a copy, writable) for a numpy array, else as is."""
    if not isinstance(value, np.ndarray):
        return value
    import torch

    return torch.tensor(value)


@dataclass(frozen=True)
class OptimizerExtras:
    """An optimizer state's values that are not averaged, per parameter index (Adam's ``step``, any other
    entry that is not a moment), as they travel in every message of a round.

    A one-value tensor per parameter (the step) pickled on its own costs a pickle per parameter in every
    learner's message and every reply, most of a large model's message cost (docs/ARCHITECTURE.md, "Measurements behind the code").
    So such values travel as one numpy column per name and dtype, and anything else as a copy. E.g.
    Adam over 3 parameters at step 10: ``columns = {"step/float32": ("step", (0, 1, 2), array([10., 10.,
    10.], dtype=float32))}``, ``other = {}``.
    """

    columns: dict[str, tuple[str, tuple[Any, ...], np.ndarray]]
    """"NAME/DTYPE" -> (name, the parameter indices, their values in that order)."""
    other: dict[Any, dict[str, Any]]
    """Per parameter index, the values that are not one-value tensors of a numpy dtype (copies)."""

    @classmethod
    def of(cls, entries: Mapping[Any, Mapping[str, Any]]) -> OptimizerExtras:
        """From per-index ``{name: value}`` (the optimizer's own values: columns and copies are made)."""
        import torch
        from torch import Tensor

        gathered: dict[tuple[str, torch.dtype], tuple[list[Any], list[Any]]] = {}
        other: dict[Any, dict[str, Any]] = {}
        for index, entry in entries.items():
            for name, value in entry.items():
                if isinstance(value, Tensor) and value.dim() == 0 and _numpy_exact(value):
                    indices, values = gathered.setdefault((name, value.dtype), ([], []))
                    indices.append(index)
                    values.append(value.item())  # exact: a Python float or int holds any of these dtypes
                else:
                    copied = by_value(value) if isinstance(value, Tensor) else copy.deepcopy(value)
                    other.setdefault(index, {})[name] = copied
        columns = {}
        for (name, dtype), (indices, values) in gathered.items():
            column = torch.tensor(values, dtype=dtype).numpy()
            columns[f"{name}/{column.dtype}"] = (name, tuple(indices), column)
        return cls(columns, other)

    def entries(self) -> dict[Any, dict[str, Any]]:
        """Per index, its values by name: a column's value as a 0-d numpy array (a view of the column:
        ``unpack`` makes a tensor copy of it), the others as they travelled."""
        out: dict[Any, dict[str, Any]] = {index: dict(entry) for index, entry in self.other.items()}
        for name, indices, values in self.columns.values():
            for index, value in zip(indices, values.reshape(-1, 1), strict=True):
                out.setdefault(index, {})[name] = value.reshape(())
        return out

    def items(self) -> Iterator[tuple[Any, str, Any]]:
        """(index, name, value) of every value: a column's as a 0-d tensor view of the column (one
        ``copy_`` writes it into the optimizer's own tensor, no tensor built per value first), the others
        as ``unpack`` gives them."""
        import torch

        for name, indices, values in self.columns.values():
            column = torch.from_numpy(values)
            for index, value in zip(indices, column, strict=True):
                yield index, name, value
        for index, entry in self.other.items():
            for name, value in entry.items():
                yield index, name, state_value(value)

    def steps(self) -> dict[Any, float]:
        """Per index, its ``step`` as a number (what every learner of a round must agree on)."""
        out = {}
        for name, indices, values in self.columns.values():
            if name == "step":
                out.update(zip(indices, values.tolist(), strict=True))
        for index, entry in self.other.items():
            if "step" in entry:
                value = entry["step"]
                # A tensor or an array (both have item()): no torch needed to tell them from a number.
                out[index] = float(value.item()) if hasattr(value, "item") else value
        return out


def merge_extras(extras: Sequence[Mapping[str, Any]], *, furthest_step: bool = False) -> dict[str, Any]:
    """The round's extras: learner 0's, after checking that every learner's Adam steps agree (the bias
    correction 1 - beta^step depends on it; AAVG learners take the same number of local steps). With
    ``furthest_step`` (some learners deferred their rounds past the others'): the learner's with the most
    steps, whose count the others take up, as they take its position."""
    first = extras[0]
    if first.get("optimizer") is None:
        return first
    if furthest_step:
        return max(extras, key=lambda e: sum(e["optimizer"].steps().values()))
    steps = first["optimizer"].steps()
    for j, other in enumerate(extras[1:], start=1):
        theirs = other["optimizer"].steps() if other.get("optimizer") is not None else {}
        for index, mine in steps.items():
            if theirs.get(index) != mine:
                raise ValueError(
                    f"param {index}: step differs across learners (learner 0 {mine}, learner {j} "
                    f"{theirs.get(index)}): merge states of one averaging round"
                )
    return first
