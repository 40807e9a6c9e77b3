"""A learner's weights and Adam moments kept in the data plane's flat buffers: one contiguous copy a slice.

``FlatStorage`` allocates the buffers of a ``FlatLayout`` on the learner's device and moves the live
tensors into them (``bind``: every parameter, floating buffer and Adam moment becomes a view,
``tensor.data = view``), so training updates the buffers in place. A round then puts slice i of each
buffer as it is (``slices``: one copy into the store, not one per tensor piece: "Measurements behind the
code" in docs/ARCHITECTURE.md) and writes the merged state back in place (``load_slices``: one copy per
slice and buffer; ``load``: one per tensor), where ``Optimizer.load_state_dict`` would unbind them.
Contract: ``bind`` is idempotent and costs a pointer comparison per tensor when all is in place; ``holds``
says at that cost whether the live state is still the storage's; ``bind`` copies back whatever was
replaced and counts it. Values never change. ``mirrored`` tensors (a recurrent module's weights, which
cuDNN reads from their own chunk) keep a copy in their slot, refreshed before every put and written back
after every load. ``unsupported`` names what the buffers cannot hold (bfloat16, non-contiguous, shared
memory, several devices). ``torch.save`` of a bound tensor writes its whole buffer. No ray.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raytrain_seq.dataplane.payload import FlatLayout

__all__ = ["FlatStorage"]


class FlatStorage:
    """The buffers of ``layout`` on ``device``, and the views of them that the learner's tensors become."""

    def __init__(
        self,
        layout: FlatLayout,
        device: torch.device | str = "cpu",
        *,
        mirrored: frozenset[str] = frozenset(),
    ) -> None:
        self.layout = layout
        self.mirrored = frozenset(mirrored)
        """Model keys whose tensors keep their own storage; their slots hold a copy (see the module doc)."""
        self.device = torch.device(device)
        self.buffers = {
            key: torch.empty(n, dtype=getattr(torch, key.split("/")[1]), device=self.device)
            for key, n in layout.sizes
        }
        self._views = [
            self.buffers[slot.buffer][slot.offset : slot.offset + slot.numel].view(slot.shape)
            for slot in layout.slots
        ]
        self._slotted = {(slot.owner, slot.key) for slot in layout.slots}
        self._unslotted_keys = [key for key in layout.model_keys if ("model", key) not in self._slotted]
        self._bounds: dict[int, list[dict[str, tuple[int, int]]]] = {}
        self._staging: dict[str, Tensor] = {}  # CUDA: pinned host copies of the buffers, reused
        # (buffer view, live tensor) of the mirrored slots, from the latest bind.
        self._mirrors: list[tuple[Tensor, Tensor]] = []
        self.moved = 0
        """Tensors ``bind`` has copied into their views over this storage's life (the first bind: all)."""

    @staticmethod
    def unsupported(layout: FlatLayout, params: Mapping[str, Tensor], moments: Mapping | None) -> str | None:
        """Why the tensors of ``params`` and ``moments`` (live: ``model.state_dict(keep_vars=True)`` and
        ``optimizer.state_dict()["state"]``) cannot all become views of ``layout``'s buffers; None if they can."""
        spans = []
        devices = set()
        for slot in layout.slots:
            tensor = layout.tensor_of(params, moments, slot)
            buffer_dtype = getattr(torch, slot.buffer.split("/")[1])
            if tensor.dtype != buffer_dtype:
                return (
                    f"{slot.owner} {slot.key!r} is {tensor.dtype}, which travels in a {buffer_dtype} buffer"
                )
            if not tensor.is_contiguous():
                return f"{slot.owner} {slot.key!r} is not contiguous"
            devices.add(tensor.device)
            if tensor.numel():
                start = tensor.data_ptr()
                spans.append((start, start + tensor.numel() * tensor.element_size(), slot))
        if len(devices) > 1:
            return f"the state's tensors lie on several devices ({sorted(map(str, devices))})"
        spans.sort(key=lambda span: span[0])
        for (_, end, first), (start, _, second) in itertools.pairwise(spans):
            # Sorted by start, any overlap shows between neighbours. E.g. tied weights: one tensor
            # cannot be two views.
            if start < end:
                return f"{first.owner} {first.key!r} and {second.owner} {second.key!r} share memory"
        return None

    def bind(self, params: Mapping[str, Tensor], moments: Mapping | None) -> int:
        """Make every live tensor of the layout a view of its buffer (copying its values there first),
        except the mirrored ones, whose values are copied and whose storage stays theirs; returns how many
        were not already views. The tensors must be ``unsupported``-free."""
        moved = 0
        mirrors = []
        with torch.no_grad():
            for slot, view in zip(self.layout.slots, self._views, strict=True):
                tensor = self.layout.tensor_of(params, moments, slot)
                if self._is_mirrored(slot):
                    mirrors.append((view, tensor))  # stays where it is; copied at every put and load
                    continue
                if tensor.data_ptr() == view.data_ptr() and tensor.device == view.device:
                    continue
                view.copy_(tensor.detach())
                tensor.data = view
                moved += 1
        self._mirrors = mirrors
        self.moved += moved
        return moved

    def slices(self, shards: int) -> list[dict[str, np.ndarray]]:
        """Slice i of every buffer, for shard i (``FlatLayout.bounds``): numpy views of the buffers on the
        CPU (a put copies them once), of pinned host copies made now on CUDA (one asynchronous
        device-to-host copy per buffer, one synchronisation)."""
        with torch.no_grad():
            for view, live in self._mirrors:
                view.copy_(live.detach())
        host = self.buffers
        if self.device.type != "cpu":
            host = {}
            for key, buffer in self.buffers.items():
                staging = self._staging.get(key)
                if staging is None:
                    staging = self._staging[key] = torch.empty(
                        buffer.shape, dtype=buffer.dtype, pin_memory=True
                    )
                staging.copy_(buffer, non_blocking=True)
                host[key] = staging
            torch.cuda.synchronize(self.device)
        arrays = {key: tensor.numpy() for key, tensor in host.items()}
        return [
            {key: arrays[key][lo:hi] for key, (lo, hi) in part.items()} for part in self._bounds_of(shards)
        ]

    def matches(self, params: Mapping[str, Tensor], moments: Mapping | None, *, merge_bn_stats: bool) -> bool:
        """Whether a state (an averaged one) has this storage's layout: the same keys, shapes and dtypes."""
        return (
            FlatLayout.of(params, moments, merge_bn_stats=merge_bn_stats).signature == self.layout.signature
        )

    def load(
        self,
        params: Mapping[str, Tensor],
        moments: Mapping | None,
        *,
        into_params: Mapping[str, Tensor],
        into_moments: Mapping | None,
    ) -> None:
        """Write the state ``params``/``moments`` (``matches`` this layout) into the bound live tensors
        ``into_params``/``into_moments`` in place: the floating tensors through their views, the rest
        (integer buffers, Adam's step) as ``load_state_dict`` would, so the optimizer keeps its tensors."""
        with torch.no_grad():
            for slot, view in zip(self.layout.slots, self._views, strict=True):
                view.copy_(self.layout.tensor_of(params, moments, slot).reshape(view.shape))
            self._load_unaveraged(params, moments, into_params, into_moments)
            self._write_mirrors()

    def load_slices(
        self,
        parts: Sequence[Mapping[str, np.ndarray]],
        extras: Mapping[str, Any],
        *,
        into_params: Mapping[str, Tensor],
        into_moments: Mapping | None,
    ) -> None:
        """``load`` from the merged slices themselves (``parts``: slice i of every buffer, this layout's,
        as the shards return them) and the round's ``extras``: one copy per slice and buffer instead of
        one per tensor, and no tensors built for the state first. Same result as ``load`` of the
        ``unpack``ed state, bit for bit."""
        bounds = self._bounds_of(len(parts))
        with torch.no_grad(), warnings.catch_warnings():
            # A store buffer is read-only; it is only read here (torch warns on any non-writable array).
            warnings.simplefilter("ignore", UserWarning)
            for part, cuts in zip(parts, bounds, strict=True):
                for key, (lo, hi) in cuts.items():
                    if not isinstance(part[key], np.ndarray):
                        raise TypeError(
                            f"slice of {key} is a {type(part[key]).__name__}: load_slices takes merged slices "
                            "(one array a buffer); load a learner's own pieces through unpack and load"
                        )
                    if len(part[key]) != hi - lo:
                        raise ValueError(
                            f"slice of {key} holds {len(part[key])} values where this layout cut for "
                            f"{len(parts)} shards has {hi - lo}: the parts are not this layout's"
                        )
                    self.buffers[key][lo:hi].copy_(torch.from_numpy(part[key]))
            self._load_extras(extras, into_params, into_moments)
            self._write_mirrors()

    def _write_mirrors(self) -> None:
        """The mirrored slots' new values into their live tensors, in place (their storage stays theirs)."""
        for view, live in self._mirrors:
            live.copy_(view)

    def _is_mirrored(self, slot: Any) -> bool:
        return slot.owner == "model" and slot.key in self.mirrored

    def _load_unaveraged(
        self,
        params: Mapping[str, Tensor],
        moments: Mapping | None,
        into_params: Mapping[str, Tensor],
        into_moments: Mapping | None,
    ) -> None:
        """The values in no buffer (integer buffers, Adam's step), as ``load_state_dict`` would write them,
        so the optimizer keeps its tensors. ``params``/``moments`` need hold only those values."""
        for key, tensor in into_params.items():
            if ("model", key) not in self._slotted:
                tensor.copy_(params[key])
        if moments is None or into_moments is None:
            return
        for index, entry in into_moments.items():
            for name in list(entry):
                if ("optimizer", (index, name)) not in self._slotted:
                    _write(entry, name, moments[index][name])

    def _load_extras(
        self, extras: Mapping[str, Any], into_params: Mapping[str, Tensor], into_moments: Mapping | None
    ) -> None:
        """``_load_unaveraged`` from a round's ``extras`` (``FlatLayout.extras``) themselves: one copy a
        value, no tensor built for it first (a model of many tensors paid that per tensor in every round,
        docs/ARCHITECTURE.md, "Measurements behind the code")."""
        model = extras["model"]
        for key, tensor in into_params.items():
            if ("model", key) not in self._slotted:
                value = model[key]
                tensor.copy_(torch.from_numpy(value) if isinstance(value, np.ndarray) else value)
        optimizer = extras["optimizer"]
        if optimizer is None or into_moments is None:
            return
        for index, name, value in optimizer.items():
            _write(into_moments[index], name, value)

    def holds(self, params: Mapping[str, Tensor], moments: Mapping | None) -> bool:
        """Whether the live ``params`` and ``moments`` are still this storage's: the layout's keys, and every
        tensor of a slot its own view. Then ``FlatLayout.of`` of them would give ``self.layout`` and ``bind``
        would move nothing, so a round takes the layout from here at a pointer comparison a tensor instead
        of building a slot per tensor again and comparing the two (docs/ARCHITECTURE.md, "Measurements behind the code")."""
        layout = self.layout
        if tuple(params) != layout.model_keys:
            return False
        if (moments is None) != (layout.moment_keys is None):
            return False
        if moments is not None and tuple((i, tuple(e)) for i, e in moments.items()) != layout.moment_keys:
            return False
        if any(params[key].is_floating_point() for key in self._unslotted_keys):
            return False  # a buffer that became floating would take a slot
        for slot, view in zip(layout.slots, self._views, strict=True):
            if self._is_mirrored(slot):
                continue  # never bound: its live tensor is copied at every put and load
            tensor = layout.tensor_of(params, moments, slot)
            if (
                tensor.data_ptr() != view.data_ptr()
                or tensor.shape != view.shape
                or tensor.device != view.device
            ):
                return False
        return True

    def _bounds_of(self, shards: int) -> list[dict[str, tuple[int, int]]]:
        """``layout.bounds(shards)``, computed once per S."""
        if shards not in self._bounds:
            self._bounds[shards] = self.layout.bounds(shards)
        return self._bounds[shards]

    def nbytes(self) -> int:
        """Bytes of the buffers (what one learner puts per round)."""
        return sum(buffer.numel() * buffer.element_size() for buffer in self.buffers.values())

    def __repr__(self) -> str:
        return f"FlatStorage({len(self.layout.slots)} tensors, {self.nbytes()} bytes on {self.device})"


def _write(entry: dict[str, Any], name: str, new: Any) -> None:
    """Set an optimizer entry's value that is not averaged as ``load_state_dict`` would, keeping its tensor."""
    value = entry.get(name)
    if isinstance(value, Tensor) and isinstance(new, Tensor) and value.shape == new.shape:
        value.copy_(new)
    else:  # a plain number (an optimizer that keeps its step as a float), or a new kind
        entry[name] = new.clone() if isinstance(new, Tensor) else new
