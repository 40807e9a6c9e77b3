"""AAVG's outer loop as one object the learner loop calls: K local steps, then one averaging round.

Algorithm (Cong et al., AAVG, Algorithm 1): every learner starts from the same averaged weights, takes K
local optimizer steps, then sends its weights and Adam moments for averaging and continues from the
mean (K = -1: one round at the end of every epoch). ``LocalRounds`` counts the local steps
(``step()`` says when K are done; ``pending`` whether an epoch's last steps still need a round), sends
the round through an ``AveragerClient`` and installs what comes back: the round's averaged state, or,
when the others went on without this learner, their latest state. The round travels as flat buffers
(``elastic.payload``): one contiguous buffer per merge rule and dtype, cut into the client's S slices;
slice i is put in the object store once (on the CPU straight from the tensors, one copy; on CUDA
through reused pinned buffers), and the control plane gets their references. It mirrors the shape of torchft's
``LocalSGD`` (a step counter and a ``sync``); the weights travel through the averager, not a collective.

``Tally`` is the work done since the last round (frames, sequences, steps, compute and data-wait
seconds, the sequence-weighted loss): each round sends it as the learner's stats, and the averager sums
it per learner for the summary. Plain torch and Python: no ray.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from raytrain_seq.checkpoint import is_due
from raytrain_seq.elastic.client import Averaged, AveragerClient, Realigned
from raytrain_seq.elastic.payload import FlatLayout, FlatPayload
from raytrain_seq.elastic.position import EpochPosition
from raytrain_seq.elastic.state import AveragedState
from raytrain_seq.step import load_averaged

__all__ = ["LocalRounds", "Tally", "missed_checkpoint_rounds"]


@dataclass
class Tally:
    """Work done since the last round (sent to the averager, which sums it per learner) and in total."""

    frames: int = 0
    sequences: int = 0
    steps: int = 0
    compute_s: float = 0.0
    data_wait_s: float = 0.0
    loss_sum: float = 0.0
    totals: dict[str, float] = field(default_factory=dict)

    def add_step(self, frames: int, sequences: int, seconds: float, loss: float) -> None:
        self.frames += frames
        self.sequences += sequences
        self.steps += 1
        self.compute_s += seconds
        self.loss_sum += loss * sequences

    def flush(self) -> dict[str, float]:
        """The deltas since the last flush, for a round's stats; resets them."""
        delta = {
            "frames": float(self.frames),
            "sequences": float(self.sequences),
            "steps": float(self.steps),
            "compute_s": self.compute_s,
            "data_wait_s": self.data_wait_s,
        }
        for key, value in delta.items():
            self.totals[key] = self.totals.get(key, 0.0) + value
        mean_loss = self.loss_sum / self.sequences if self.sequences else float("nan")
        self.frames = self.sequences = self.steps = 0
        self.compute_s = self.data_wait_s = self.loss_sum = 0.0
        delta["loss"] = mean_loss
        return delta


class LocalRounds:
    """K local steps between averaging rounds of one learner's model and optimizer."""

    def __init__(
        self,
        client: AveragerClient,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        k: int,
        merge_moments: bool = True,
        merge_bn_stats: bool = True,
        device: torch.device | str = "cpu",
    ) -> None:
        if k == 0 or k < -1:
            raise ValueError(f"k must be -1 (one round per epoch) or >= 1 local steps, got {k}")
        self.client, self.model, self.optimizer = client, model, optimizer
        self.k, self.merge_moments, self.device = k, merge_moments, device
        self.merge_bn_stats = merge_bn_stats  # the layout decides the shards' rule for BatchNorm pairs
        self.local_steps = 0
        self.averaging_s = 0.0  # inside averaging calls, waiting included
        self.last_seconds = 0.0
        self._staging: dict[str, torch.Tensor] = {}  # on CUDA: the pinned packed buffers, reused

    def step(self) -> bool:
        """Count one local optimizer step; True when K steps were taken since the last round."""
        self.local_steps += 1
        return self.k > 0 and self.local_steps == self.k

    @property
    def pending(self) -> bool:
        """Whether the steps since the last round still need one (K = -1: every epoch ends with one)."""
        return self.k < 0 or self.local_steps > 0

    def install(self, state: AveragedState) -> None:
        """Load an averaged state into the model and optimizer. The optimizer gets copies of the moments:
        it updates them in place, and the held originals are what a restarted averager is re-seeded with."""
        if state.empty:
            return
        moments = (
            None if state.optimizer_state is None else _to_device(state.optimizer_state, "cpu", copy=True)
        )
        load_averaged(self.model, self.optimizer, _to_device(state.params, self.device), moments)

    def sync(
        self, *, stats: Mapping[str, float], position: EpochPosition, rows: int | None = None
    ) -> Averaged | Realigned:
        """Send this learner's round (``position``: where training stands once it is averaged; ``rows``:
        its rows this epoch) and install the outcome: the round's mean, or the others' latest state
        after a realignment."""
        began = time.perf_counter()
        params = self.model.state_dict()
        moments = self.optimizer.state_dict()["state"] if self.merge_moments else None
        layout = FlatLayout.of(params, moments, merge_bn_stats=self.merge_bn_stats)
        slices, extras, self._staging = layout.slices(params, moments, self.client.shards, self._staging)
        store = self.client.store
        store.expect(2 * layout.nbytes)  # each round puts the payload and reads the merged one back
        parts = tuple(store.put(part) for part in slices)
        payload = FlatPayload(layout, parts, extras)
        decision = self.client.average(payload, None, stats=stats, position=position.as_dict(), rows=rows)
        self.last_seconds = time.perf_counter() - began
        self.averaging_s += self.last_seconds
        self.install(decision.result.state if isinstance(decision, Averaged) else decision.reply.state)
        self.local_steps = 0
        return decision


def missed_checkpoint_rounds(first: int, latest: int, *, every: int, latest_is_final: bool) -> list[int]:
    """The checkpoint rounds among ``first`` .. ``latest`` (inclusive), which a learner that missed them
    still owes Ray Train a report for (its report is a barrier: the others wait at it).

    E.g. first=5, latest=7, every=2: [6]; the final round is not a checkpoint round (``is_due``).
    """
    rounds = range(first, latest + 1)
    return [r for r in rounds if is_due(r, every=every, final=latest_is_final and r == latest)]


def _to_device(tree: Mapping, device, *, copy: bool = False) -> dict:
    """Tensors of a (nested) dict moved to ``device``; ``copy`` makes new tensors even where they are."""
    return {
        key: _to_device(value, device, copy=copy) if isinstance(value, Mapping)
        else value.to(device, copy=copy) if torch.is_tensor(value) else value
        for key, value in tree.items()
    }  # fmt: skip
