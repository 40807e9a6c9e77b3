"""``HubLoad``: the bytes each averaging actor moved per round, for the averager's summary ("hub_load").

The control actor counts the array bytes of the payloads it merged itself (the tensor path: each learner's
params and moments in, the merged result out to every learner) and, on the flat path, only the merged
slices it reads into its own process afterwards (``add_received``) and the slices it merged itself while a
shard's process started (``"here"``); each shard reports its own ``{shard, received, sent, seconds}``.
E.g. two learners sending 4 KiB of tensors each: the control actor received 8 KiB and sent 2 x 4 KiB. The
last 64 rounds are kept. Plain Python over torch tensors; torch is not imported (a process without it
holds no tensors).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["HubLoad", "tensor_bytes"]

_KEPT = 64  # rounds kept: the summary shows the recent rounds' load, not the whole run's


def tensor_bytes(tree: Any) -> int:
    """Bytes of the tensors of a (nested) dict."""
    torch = sys.modules.get("torch")  # not loaded: the tree holds no tensor
    if torch is not None and isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, Mapping):
        return sum(tensor_bytes(value) for value in tree.values())
    return 0


class HubLoad:
    """Per round, ``{"round", "actors": {"control": {received, sent}, "shard<i>": {...}}}``."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, Any]] = []

    def record(
        self, round_: int, shard_loads: Sequence[Mapping[str, Any]], in_process: tuple | None = None
    ) -> None:
        """A closed round's load. ``in_process``: (arrivals, params, moments) when this actor merged
        tensors itself; None on the flat path, where it moved object references only (0 bytes)."""
        received = sent = 0
        if in_process is not None:
            arrivals, params, moments = in_process
            received = sum(tensor_bytes(a.params) + tensor_bytes(a.optimizer_state) for a in arrivals)
            sent = (tensor_bytes(params) + tensor_bytes(moments)) * len(arrivals)
        actors = {"control": {"received": received, "sent": sent}}
        for load in shard_loads:
            if load.get("here"):  # a slice this actor merged itself while its shard's process started
                actors["control"]["received"] += load["received"]
                actors["control"]["sent"] += load["sent"]
                continue
            actors[f"shard{load['shard']}"] = {k: load[k] for k in ("received", "sent", "seconds")}
        self.rounds = [*self.rounds[-(_KEPT - 1) :], {"round": round_, "actors": actors}]

    def add_received(self, round_: int, nbytes: int) -> None:
        """Bytes the control actor read of round ``round_``'s merged slices (its own copy)."""
        for record in reversed(self.rounds):
            if record["round"] == round_:
                record["actors"]["control"]["received"] += nbytes
                break

    def as_list(self) -> list[dict[str, Any]]:
        return list(self.rounds)
