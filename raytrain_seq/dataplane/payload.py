"""A learner's weights and Adam moments as flat contiguous buffers, cut into one slice per averaging shard.

The data plane of a round (docs/ARCHITECTURE.md, "The averaging round"): a learner packs its state_dict
and Adam state into one buffer per merge rule and dtype (``FlatLayout.pack``), cuts each into S slices
(``split``), puts slice i once and sends the refs, the layout and the unaveraged values (``FlatPayload``).
Shard i merges slice i of every learner (``dataplane.merge``); learners read the merged slices back
(``unpack``: zero-copy views, a tensor cut by a slice boundary copied once). Buffer keys ``"RULE/DTYPE"``:
``mean`` (weights, exp_avg, exp_avg_sq), ``pmean``/``pvar`` (BatchNorm (mean, var) pairs at equal offsets,
merged by total variance), ``max`` (AMSGrad). Every rule is elementwise, so a merged slice equals that slice
of ``average_states``/``merge_adam_states`` bit for bit. Integer buffers and Adam's ``step`` travel by
value in ``FlatPayload.extras`` (``dataplane.extras``); steps must agree, integer buffers are learner 0's.
bfloat16 travels widened to float32 and is rounded back once. How a payload reaches the shards and who
merges it: ``dataplane.stores``. Plain numpy and torch: no ray. torch is imported where tensors are read
or made, so the control plane unpickles and checks a payload without it (a slot's dtype is a name).
"""

from __future__ import annotations

import bisect
import itertools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from raytrain_seq.dataplane.extras import OptimizerExtras, by_value, dtype_name, state_value

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["FlatLayout", "FlatPayload", "Slot"]

_MOMENT_RULES = {"exp_avg": "mean", "exp_avg_sq": "mean", "max_exp_avg_sq": "max"}
_NUMPY_FLOATS = ("float16", "float32", "float64")  # torch dtypes that numpy holds as they are


@dataclass(frozen=True)
class Slot:
    """Where one floating tensor lives: ``buffer[offset : offset + numel]``, viewed as ``shape``."""

    owner: str
    """"model" (a state_dict key) or "optimizer" (a (param index, moment name) pair)."""
    key: Any
    buffer: str
    offset: int
    shape: tuple[int, ...]
    dtype: str
    """The tensor's torch dtype by name (``"bfloat16"`` for ``torch.bfloat16``)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class FlatLayout:
    """How a model state and its Adam moments map onto the flat buffers (built by ``FlatLayout.of``)."""

    model_keys: tuple[str, ...]
    """The state_dict's keys, in order."""
    moment_keys: tuple[tuple[Any, tuple[str, ...]], ...] | None
    """Per parameter index, its optimizer-state keys in order; None when no moments travel."""
    slots: tuple[Slot, ...]
    sizes: tuple[tuple[str, int], ...]
    """(buffer key, numel), sorted by key."""

    @classmethod
    def of(
        cls, params: Mapping[str, Tensor], moments: Mapping | None, *, merge_bn_stats: bool = True
    ) -> FlatLayout:
        """The layout of ``params`` (a state_dict) and ``moments`` (``optimizer.state_dict()["state"]``
        of Adam/AdamW, or None); an optimizer state holding other floating tensors is a ValueError.
        ``merge_bn_stats`` False places BatchNorm (mean, var) pairs in the ``mean`` buffers (a plain
        mean, as ``average_states(..., merge_bn_stats=False)``): the shards merge by the buffer's rule."""
        from torch import Tensor

        from raytrain_seq.algorithms.averaging import bn_pairs

        if not isinstance(params, Mapping) or not all(isinstance(t, Tensor) for t in params.values()):
            raise TypeError("params must be a dict of tensors (model.state_dict())")
        sizes: dict[str, int] = {}
        slots: list[Slot] = []

        def place(owner: str, key: Any, tensor: Tensor, rule: str) -> None:
            if tensor.is_complex():
                raise TypeError(f"{owner} {key!r} is complex: split it into real and imaginary parts first")
            dtype = dtype_name(tensor)
            buffer = f"{rule}/{dtype if dtype in _NUMPY_FLOATS else 'float32'}"
            offset = sizes.get(buffer, 0)
            slots.append(Slot(owner, key, buffer, offset, tuple(tensor.shape), dtype))
            sizes[buffer] = offset + tensor.numel()

        pairs = bn_pairs(list(params), params) if merge_bn_stats else {}
        paired = set(pairs) | set(pairs.values())
        for key, tensor in params.items():
            if tensor.is_floating_point() and key not in paired:
                place("model", key, tensor, "mean")
        # A pair's mean and variance take the same offset in pmean and pvar: one pair after the other.
        for var_key, mean_key in pairs.items():
            if params[var_key].shape != params[mean_key].shape:
                raise ValueError(f"{mean_key!r} and {var_key!r} differ in shape: not a (mean, var) pair")
            place("model", mean_key, params[mean_key], "pmean")
            place("model", var_key, params[var_key], "pvar")
        moment_keys = None
        if moments is not None:
            if not isinstance(moments, Mapping):
                raise TypeError("moments must be optimizer.state_dict()['state'] (a dict) or None")
            moment_keys = []
            for index, entry in moments.items():
                if not isinstance(entry, Mapping):
                    raise TypeError(f"param {index}: the optimizer state entry is a {type(entry).__name__}")
                for name, value in entry.items():
                    if name in _MOMENT_RULES and isinstance(value, Tensor):
                        place("optimizer", (index, name), value, _MOMENT_RULES[name])
                    elif name != "step" and isinstance(value, Tensor) and value.is_floating_point():
                        raise ValueError(
                            f"param {index}: unknown floating optimizer state {name!r} (known: step, "
                            "exp_avg, exp_avg_sq, max_exp_avg_sq): average with Adam/AdamW, or merge it yourself"
                        )
                moment_keys.append((index, tuple(entry)))
            moment_keys = tuple(moment_keys)
        layout = cls(tuple(params), moment_keys, tuple(slots), tuple(sorted(sizes.items())))
        # The one object this process has for these fields: a reply's layout then unpickles to the
        # learner's own, and the learner's install compares the two by identity, not slot by slot.
        return _remember(layout.fields(), lambda: layout)

    # ------------------------------------------------------------------------------------- queries
    @property
    def moments(self) -> bool:
        """Whether Adam moments travel (and are merged) with the weights."""
        return bool(self.moment_keys) and any(slot.owner == "optimizer" for slot in self.slots)

    @property
    def signature(self) -> tuple:
        """What two learners of one round must agree on (keys, shapes, dtypes, buffers)."""
        return (self.model_keys, self.moment_keys, self.slots)

    @property
    def nbytes(self) -> int:
        """Bytes of all buffers: what one learner sends (and receives) per round."""
        return sum(n * np.dtype(key.split("/")[1]).itemsize for key, n in self.sizes)

    def fields(self) -> tuple[Any, ...]:
        """The layout as plain values: its keys, its slots as one tuple per field (column), its sizes."""
        columns = tuple(zip(*(_slot_fields(slot) for slot in self.slots), strict=True))
        return (self.model_keys, self.moment_keys, columns, self.sizes)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Every message of a round carries the layout (each learner's payload in, every reply out), and
        # a model has a slot per tensor and moment: pickled as one tuple of plain values per field, not
        # one dataclass per slot, it costs a fraction (docs/ARCHITECTURE.md, "Measurements behind the code").
        return _layout_from_columns, self.fields()

    def bounds(self, shards: int) -> list[dict[str, tuple[int, int]]]:
        """Per shard, per buffer, its [lo, hi) range: S near-equal cuts, each moved to the nearest tensor
        boundary within 1/16 of a slice (pmean and pvar cut alike: their tensors share offsets).

        Why: a tensor cut by a slice boundary is copied when a learner reads the merged state
        (``unpack``), so equal cuts that miss boundaries by a few elements copied most tensors at 8
        shards; a slice at most 1/8 longer keeps a shard's load within 2.25 payloads. E.g. 2 shards of
        a buffer of tensors of 3 990 and 4 010 elements: the equal cut 4 000 is 10 from the boundary 3 990,
        within 8 000 // 2 // 16 = 250, so the cut is 3 990 and neither tensor is cut; of 3 000 and 5 000
        elements, the boundary 3 000 is 1 000 away and the cut stays at 4 000, inside the second tensor.
        """
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be an int >= 1, got {shards!r}")
        edges: dict[str, list[int]] = {key: [] for key, _ in self.sizes}
        for slot in self.slots:
            edges[slot.buffer].append(slot.offset)
        cuts = {}
        for key, n in self.sizes:
            boundaries = np.array([*sorted(set(edges[key])), n])
            slack = n // shards // 16
            points = [0]
            for i in range(1, shards):
                even = n * i // shards
                nearest = int(boundaries[np.argmin(np.abs(boundaries - even))])
                points.append(nearest if abs(nearest - even) <= slack and nearest >= points[-1] else even)
            cuts[key] = [*points, n]
        return [{key: (cuts[key][i], cuts[key][i + 1]) for key, _ in self.sizes} for i in range(shards)]

    # ----------------------------------------------------------------------------- pack, split, unpack
    def pack(
        self, params: Mapping[str, Tensor], moments: Mapping | None, staging: dict[str, Tensor] | None = None
    ) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The CPU buffers of ``params`` and ``moments`` and the extras (what is not averaged).

        ``staging``: buffers of an earlier ``pack`` of this layout, reused (the object store copies on
        put, so a learner can overwrite them next round). On CUDA they are pinned, so that the
        device-to-host copies run asynchronously at full speed; one synchronisation ends them.
        """
        import torch

        tensors = [self.tensor_of(params, moments, slot) for slot in self.slots]
        cuda = any(t.device.type == "cuda" for t in tensors)
        buffers = {}
        for key, n in self.sizes:
            dtype = getattr(torch, key.split("/")[1])
            old = (staging or {}).get(key)
            if old is not None and old.numel() == n and old.dtype == dtype and old.is_pinned() == cuda:
                buffers[key] = old
            else:
                buffers[key] = torch.empty(n, dtype=dtype, pin_memory=cuda)
        for slot, tensor in zip(self.slots, tensors, strict=True):
            target = buffers[slot.buffer][slot.offset : slot.offset + slot.numel]
            target.copy_(tensor.detach().reshape(-1), non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize()
        return buffers, self.extras(params, moments)

    def extras(self, params: Mapping[str, Tensor], moments: Mapping | None) -> dict[str, Any]:
        """What is not averaged (copies): integer buffers, and Adam's step and non-tensor values. Tensors
        travel as numpy arrays where numpy has their dtype (``by_value``), the optimizer's one-value
        tensors (the steps) as columns (``OptimizerExtras``); ``unpack`` makes them tensors again."""
        from torch import Tensor

        optimizer = None
        if self.moment_keys is not None and moments is not None:
            optimizer = OptimizerExtras.of(
                {
                    index: {
                        name: value
                        for name, value in moments[index].items()
                        if name not in _MOMENT_RULES or not isinstance(value, Tensor)
                    }
                    for index, _ in self.moment_keys
                }
            )
        return {
            "model": {k: by_value(t) for k, t in params.items() if not t.is_floating_point()},
            "optimizer": optimizer,
        }

    def slices(
        self, params: Mapping[str, Tensor], moments: Mapping | None, shards: int, staging: dict | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Tensor]]:
        """What a learner puts for ``shards`` shards: (slice per shard, extras, staging to pass next time).

        On the CPU slice i of a buffer is the tuple of views of the tensors (or parts of tensors) that
        fall in it, in buffer order: one ``put`` copies them once into one object, with no staging copy
        before it. With a tensor on CUDA the state is packed through reused pinned buffers first
        (``pack``) and slice i is one flat array. The shards merge either form (``merge_parts``).
        """
        tensors = [self.tensor_of(params, moments, slot) for slot in self.slots]
        if any(t.device.type != "cpu" for t in tensors):
            buffers, extras = self.pack(params, moments, staging=staging)
            return self.split(buffers, shards), extras, buffers
        flats = [_flat_numpy(t) for t in tensors]
        # Slots of a buffer in offset order: e.g. a buffer of tensors of 4, 6 and 2 elements cut for
        # 2 shards at 6 gives shard 0 (t0[0:4], t1[0:2]) and shard 1 (t1[2:6], t2[0:2]).
        by_buffer: dict[str, list[tuple[int, np.ndarray]]] = {key: [] for key, _ in self.sizes}
        for slot, flat in zip(self.slots, flats, strict=True):
            by_buffer[slot.buffer].append((slot.offset, flat))
        for placed in by_buffer.values():
            placed.sort(key=lambda item: item[0])
        out: list[dict[str, Any]] = []
        for part in self.bounds(shards):
            pieces = {}
            for key, (lo, hi) in part.items():
                pieces[key] = tuple(
                    flat[max(lo, start) - start : min(hi, start + len(flat)) - start]
                    for start, flat in by_buffer[key]
                    if start < hi and start + len(flat) > lo
                )
            out.append(pieces)
        return out, self.extras(params, moments), {}

    def tensor_of(self, params: Mapping, moments: Mapping | None, slot: Slot) -> Tensor:
        """The tensor of ``params`` (a state_dict) or ``moments`` (an optimizer's ``["state"]``) at ``slot``."""
        if slot.owner == "model":
            return params[slot.key]
        index, name = slot.key
        return moments[index][name]

    def split(self, buffers: Mapping[str, Tensor], shards: int) -> list[dict[str, np.ndarray]]:
        """Slice i of every buffer, for shard i (numpy views: no copy here; a put copies them once)."""
        arrays = {key: buffers[key].numpy() for key, _ in self.sizes}
        return [{key: arrays[key][lo:hi] for key, (lo, hi) in part.items()} for part in self.bounds(shards)]

    def unpack(
        self, parts: Sequence[Mapping[str, np.ndarray]], extras: Mapping[str, Any]
    ) -> tuple[dict[str, Tensor], dict | None]:
        """The state_dict and optimizer state from the merged slices and the extras.

        A tensor inside one slice is a zero-copy view of it: read-only when the slice is an object-store
        buffer, so load it (``load_state_dict`` copies) and never write into it; a tensor cut by a slice
        boundary is copied once. Tensors keep their own dtype (bfloat16 is rounded back from float32).
        """
        # A learner's own slices may be pieces (``slices`` on the CPU): joined here, a copy.
        parts = [{k: v if isinstance(v, np.ndarray) else _joined(k, v) for k, v in p.items()} for p in parts]
        starts: dict[str, list[int]] = {}
        for key, _ in self.sizes:
            starts[key] = [0, *itertools.accumulate(len(part[key]) for part in parts)]
        with warnings.catch_warnings():
            # An object-store buffer is read-only; the views made of it are only ever read (see above).
            warnings.simplefilter("ignore", UserWarning)
            found = {
                (slot.owner, slot.key): self._read(parts, starts[slot.buffer], slot) for slot in self.slots
            }
        params = {}
        for key in self.model_keys:
            params[key] = (
                found[("model", key)] if ("model", key) in found else state_value(extras["model"][key])
            )
        if self.moment_keys is None:
            return params, None
        kept = extras["optimizer"].entries()
        moments = {}
        for index, names in self.moment_keys:
            entry = {}
            for name in names:
                entry[name] = (
                    found[("optimizer", (index, name))]
                    if ("optimizer", (index, name)) in found
                    else state_value(kept[index][name])
                )
            moments[index] = entry
        return params, moments

    @staticmethod
    def _read(parts: Sequence[Mapping[str, np.ndarray]], starts: list[int], slot: Slot) -> Tensor:
        import torch

        lo, hi = slot.offset, slot.offset + slot.numel
        first = bisect.bisect_right(starts, lo) - 1
        if hi <= starts[first + 1] or lo == hi:
            flat = parts[first][slot.buffer][lo - starts[first] : hi - starts[first]]
        else:
            pieces, i = [], first
            while i < len(parts) and starts[i] < hi:
                a, b = max(lo, starts[i]) - starts[i], min(hi, starts[i + 1]) - starts[i]
                pieces.append(parts[i][slot.buffer][a:b])
                i += 1
            flat = np.concatenate(pieces)
        tensor = torch.from_numpy(flat).view(slot.shape)  # unpack silences the read-only warning
        dtype = getattr(torch, slot.dtype)
        return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _slot_fields(slot: Slot) -> tuple[Any, ...]:
    """A slot's fields in order (``Slot(*_slot_fields(slot)) == slot``)."""
    return (slot.owner, slot.key, slot.buffer, slot.offset, slot.shape, slot.dtype)


def _layout_from_columns(
    model_keys: tuple[str, ...], moment_keys: Any, columns: tuple[tuple[Any, ...], ...], sizes: Any
) -> FlatLayout:
    """``FlatLayout.__reduce__``'s inverse: the layout of these columns, the one built before in this
    process when there is one (``_LAYOUTS``), else its slots from their field columns."""
    fields = (model_keys, moment_keys, columns, sizes)
    return _remember(fields, lambda: _build_layout(*fields))


def _remember(fields: tuple[Any, ...], build: Callable[[], FlatLayout]) -> FlatLayout:
    """The layout this process keeps for ``fields`` (``FlatLayout.fields``), or ``build()``'s, kept."""
    try:
        known = _LAYOUTS.get(fields)
    except TypeError:  # an unhashable key somewhere (a model keyed by something odd): built every time
        return build()
    if known is None:
        known = _LAYOUTS[fields] = build()
        while len(_LAYOUTS) > _LAYOUTS_KEPT:
            # The oldest (a process meets one layout, two while it changes); pop, not del: two threads
            # unpickling at once may both evict it.
            _LAYOUTS.pop(next(iter(_LAYOUTS)), None)
    return known


def _build_layout(
    model_keys: tuple[str, ...], moment_keys: Any, columns: tuple[tuple[Any, ...], ...], sizes: Any
) -> FlatLayout:
    slots = tuple(Slot(*fields) for fields in zip(*columns, strict=True)) if columns else ()
    return FlatLayout(model_keys, moment_keys, slots, sizes)


# The layouts built (``FlatLayout.of``) or unpickled in this process, by their fields. Every message of a
# round carries one (each learner's payload to the control plane, each reply back), almost always the
# same: hashing and comparing its columns costs a fraction of building a Slot per tensor again
# (docs/ARCHITECTURE.md, "Measurements behind the code"), and the learners' layouts then are one object, whose
# signatures the control plane compares by identity, as a learner compares a reply's with its own. A
# FlatLayout is immutable, so sharing it is safe.
_LAYOUTS: dict[tuple[Any, ...], FlatLayout] = {}
_LAYOUTS_KEPT = 4


def _joined(key: str, pieces: Sequence[np.ndarray]) -> np.ndarray:
    """The pieces of buffer ``key``'s slice as one flat array."""
    return np.concatenate([np.empty(0, dtype=np.dtype(key.split("/")[1])), *pieces])


def _flat_numpy(tensor: Tensor) -> np.ndarray:
    """A CPU tensor as a 1-D numpy array: a view where it is contiguous in a numpy dtype, else a copy
    (bfloat16 travels widened to float32, as in ``pack``)."""
    import torch

    flat = tensor.detach().reshape(-1)
    if dtype_name(flat) not in _NUMPY_FLOATS:
        flat = flat.to(torch.float32)
    return flat.numpy()


@dataclass(frozen=True)
class FlatPayload:
    """A state in the data plane: its layout, one part per shard, and the values that are not averaged.

    A learner's arrival holds its S slices; an averaged state holds the S merged slices. A part is an
    object reference (``RayStore.put``) or, in process, the dict of arrays itself.
    """

    layout: FlatLayout
    parts: tuple[Any, ...]
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def local(self) -> bool:
        """Whether the parts are the arrays themselves (read from the store, or in process), not
        references: reading them then needs no store."""
        return all(isinstance(part, Mapping) for part in self.parts)
