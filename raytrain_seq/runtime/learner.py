"""An AAVG learner: the Ray Train V2 worker loop around the Ray-free inner step.

Algorithm (Cong et al., AAVG, Algorithm 1): every learner starts from the same averaged weights, runs
K local steps on mini-batches of B block rows (``raytrain_seq.step.InnerStep``: micro-batch streaming,
its own Adam), then sends its weights and Adam moments to the ``ParameterAverager`` and continues from
the mean (K = -1: one round per epoch). Every m rounds rank 0 validates the averaged model and reports
the accuracy; the averager's answer of the next round carries the batch size for everyone. Rows come
from this learner's shard of the epoch's BLoad plan (``raytrain_seq.runtime.feed``): every learner gets
the same number of rows, and all learners see the same B, so they take the same number of steps and
meet at the same rounds without a barrier of their own.

Elastic and fault tolerant. Each round also sends the learner's ``EpochPosition`` (epoch, rows taken,
layouts of the epoch so far). When Ray Train starts or restarts the group (a failure, or an elastic
resize), each new learner joins with a fresh incarnation id and starts from the averager's latest
averaged state and position, the rest of the epoch re-split over the new group; only when the averager
holds nothing (it lost its state and found no checkpoint) does the learner seed it from Ray Train's
latest checkpoint. A learner dropped from a round (it stalled past the timeout) gets a
``StaleRoundError``, rejoins, takes the latest state, moves to the others' position, and makes the
``ray.train.report`` calls it missed (Ray Train's report is a barrier, so the others wait for them).
Calls to an averager that is restarting are retried with bounded exponential backoff (``Backoff``);
after an averager restart the learners re-seed it with their last averaged state and resend their
round, so no finished round is lost. Checkpoints are taken right after a round: rank 0 saves the
averager's snapshot and the position; every rank calls ``ray.train.report`` at the same rounds.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from raytrain_seq.config import Config
from raytrain_seq.elastic.position import EpochPosition
from raytrain_seq.elastic.rounds import AveragerError, AveragerUnavailableError, Backoff
from raytrain_seq.models.factory import build_model_for
from raytrain_seq.step import InnerStep, build_optimizer, collate_rows, evaluate, load_averaged

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "state.pt"
POSITION_FILE = "position.json"
MAX_REJOINS = 3  # refused sends of one round (each followed by a rejoin) before the learner gives up


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
        """The deltas since the last flush, for ``averager.average(stats=...)``; resets them."""
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


class Realign(Exception):
    """This learner was left behind (dropped from a round): continue from ``position``, the others'."""

    def __init__(self, position: EpochPosition) -> None:
        super().__init__(f"continue from {position}")
        self.position = position


class Learner:
    """One AAVG learner inside a Ray Train worker (``train_loop_per_worker`` builds and runs it)."""

    def __init__(
        self,
        config: Config,
        names: dict[str, str],
        rank: int,
        world_size: int,
        device,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        import ray

        from raytrain_seq.runtime.averager import get_averager
        from raytrain_seq.runtime.feed import get_feed
        from raytrain_seq.runtime.metrics import LearnerMetrics

        self.ray = ray
        self.config, self.rank, self.world_size, self.device = config, rank, world_size, device
        self.averager = get_averager(names["averager"], namespace=names["namespace"])
        self.feed = get_feed(names["feed"], namespace=names["namespace"])
        self.incarnation = uuid.uuid4().hex  # this process: a restarted group's learners get new ones
        self.backoff = backoff or Backoff()
        # Algorithm 1 line 1: one initial w~ for every learner, so every learner seeds the same way.
        torch.manual_seed(config.data.seed)
        spec = ray.get(self.feed.model_spec.remote())
        self.model = build_model_for(
            config, num_classes=spec["num_classes"], in_channels=spec["in_channels"]
        ).to(device)
        train = config.train
        self.optimizer = build_optimizer(
            train.optimizer, self.model.parameters(), lr=train.lr, weight_decay=train.weight_decay
        )
        self.step = InnerStep(
            self.model, self.optimizer, micro_batch_size=train.micro_batch_size, device=device
        )
        self.metrics = LearnerMetrics(rank)
        self.tally = Tally()
        self.round = 1
        self.batch_size = train.batch_size
        self.started = time.perf_counter()
        self.averaging_s = 0.0
        # A round's send waits for the others (<= timeout) and for a validation (<= timeout) at most.
        self.round_timeout_s = 3 * train.averager_timeout_s + 120.0
        self._last: dict[str, Any] | None = (
            None  # the latest averaged state held: a restarted averager's seed
        )
        self._eval_rows: dict[str, list[dict[str, torch.Tensor]]] = {}

    # -------------------------------------------------------------------------------- the averager
    def _call(self, name: str, method, *args, timeout: float | None = None, **kwargs):
        """``ray.get(method.remote(...))``, retried with bounded exponential backoff while the averager
        cannot be reached (dead and restarting, unavailable, or silent past ``timeout``). A silent
        ``average`` is not resent: its payload may already be in the round, so it fails at once."""
        from ray.exceptions import GetTimeoutError, RayActorError

        delays, began = self.backoff.delays(), time.monotonic()
        for attempt in range(len(delays) + 1):
            try:
                return self.ray.get(method.remote(*args, **kwargs), timeout=timeout)
            except (RayActorError, GetTimeoutError) as exc:  # ActorUnavailableError is a RayActorError
                silent_round = name == "average" and isinstance(exc, GetTimeoutError)
                if attempt == len(delays) or silent_round:
                    seconds = time.monotonic() - began
                    raise AveragerUnavailableError(name, attempt + 1, seconds, type(exc).__name__) from exc
                logger.warning(
                    "learner %d: %s() failed (%s); retry %d/%d in %.1f s",
                    self.rank, name, type(exc).__name__, attempt + 1, len(delays), delays[attempt],
                )  # fmt: skip
                time.sleep(delays[attempt])
        raise AssertionError("unreachable: the loop returns or raises")

    def _join(self, seed: dict[str, Any] | None = None):
        return self._call(
            "join", self.averager.join, self.rank, self.world_size, incarnation=self.incarnation, seed=seed
        )

    def _hold(self, round_: int, params, optimizer_state, adaptive_state, position) -> None:
        """Remember the latest averaged state (what this learner re-seeds a restarted averager with)."""
        self._last = None if not round_ else {
            "round": round_, "params": params, "optimizer_state": optimizer_state,
            "adaptive_state": adaptive_state, "position": position,
        }  # fmt: skip

    def _load(self, params, optimizer_state) -> None:
        """Install averaged weights and moments. The optimizer gets copies of the moments: it updates
        its state in place, and the held originals are what a restarted averager is re-seeded with."""
        moments = None if optimizer_state is None else _to_device(optimizer_state, "cpu", copy=True)
        load_averaged(self.model, self.optimizer, _to_device(params, self.device), moments)

    def _take_join(self, info, *, load: bool = True) -> None:
        """Adopt a JoinInfo: the round to send next, B and (with ``load``) the latest averaged state."""
        self.round, self.batch_size = info.round, info.batch_size
        if load and info.params is not None:
            self._load(info.params, info.optimizer_state)
        self._hold(info.latest_round, info.params, info.optimizer_state, info.adaptive_state, info.position)

    def _checkpoint_seed(self) -> dict[str, Any] | None:
        """Ray Train's latest checkpoint of this run as a seed for an averager that holds nothing."""
        checkpoint = self.ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as folder:
            snapshot = torch.load(Path(folder) / CHECKPOINT_FILE, weights_only=True)["averager"]
        if not snapshot.get("round"):
            return None
        keys = ("round", "params", "optimizer_state", "adaptive_state", "position")
        return {**{k: snapshot.get(k) for k in keys}, "source": "checkpoint"}

    # ---------------------------------------------------------------------------------------- start
    def start(self) -> EpochPosition:
        """Join the averager and take its latest state; returns where this group starts."""
        info = self._join()
        if info.latest_round == 0:
            seed = self._checkpoint_seed()
            if seed is not None:
                logger.warning(
                    "learner %d: the averager holds no state; seeding it from checkpoint round %d",
                    self.rank, seed["round"],
                )  # fmt: skip
                info = self._join(seed=seed)
        self._take_join(info)
        self.started = time.perf_counter() - info.elapsed_s  # the run's clock, not this process's
        position = EpochPosition(0) if info.position is None else EpochPosition.from_dict(info.position)
        position = position.for_group(self.world_size)
        if info.latest_round:
            logger.info(
                "learner %d of %d starts from round %d (%s state): epoch %d, layouts %s",
                self.rank, self.world_size, info.latest_round, info.source, position.epoch + 1,
                [*position.history, (position.world_size, position.rows_done)],
            )  # fmt: skip
        return position

    # ------------------------------------------------------------------------------------- training
    def run(self) -> None:
        position = self.start()
        while position.epoch < self.config.train.epochs:
            try:
                position = self._epoch(position)
            except Realign as realign:
                position = realign.position
        self._finish()

    def _epoch(self, position: EpochPosition) -> EpochPosition:
        """Train the rest of ``position``'s epoch in its layout; returns the next epoch's start."""
        from raytrain_seq.runtime.feed import BlockRowStream, shard_dataset

        train = self.config.train
        position = position.for_group(self.world_size)  # an epoch's start: this group's layout
        full = self.ray.get(
            self.feed.epoch_shard.remote(position.epoch, self.rank, self.world_size, history=position.history)
        )
        # The first rows_done rows were trained (and averaged) before: only the rest is assembled.
        shard = dataclasses.replace(full, blocks=full.blocks[position.rows_done :])
        stream = BlockRowStream(shard_dataset(shard, self.feed)) if shard.blocks else None
        rows_done, steps, end = position.rows_done, 0, EpochPosition(position.epoch + 1)
        while stream is not None:
            waited = stream.wait_seconds
            rows = stream.take(self.batch_size)
            self.tally.data_wait_s += stream.wait_seconds - waited
            if rows is None:
                break
            stats = self.step(collate_rows(rows))  # steps even on fillers: Adam steps stay in lockstep
            rows_done += len(rows["num_sequences"])
            self.tally.add_step(stats.frames, stats.sequences, stats.seconds, stats.loss)
            self.metrics.set("loss", stats.loss)
            self.metrics.set("frames_per_second", stats.frames / max(stats.seconds, 1e-9))
            self.metrics.add("frames", stats.frames)
            steps += 1
            if train.k > 0 and steps == train.k:
                at = end if rows_done == len(full.blocks) else position.after(rows_done)
                self._round(at, shard_rows=len(full.blocks))
                steps = 0
        if stream is not None:
            self.metrics.add("data_wait_seconds", stream.wait_seconds)
        if train.k < 0 or steps:
            # K=-1 averages once per epoch; with K>0 the epoch's last few steps still get a round, so
            # every epoch ends on an averaged model (the same for every learner: equal rows and B).
            self._round(end, shard_rows=0)
        return end

    def _round(self, position: EpochPosition, *, shard_rows: int) -> None:
        """One averaging round; ``position`` is where training stands once this round is averaged."""
        delta = self.tally.flush()
        params = {key: value.detach().cpu() for key, value in self.model.state_dict().items()}
        merge = self.config.train.merge_moments  # False: each learner keeps its own Adam moments
        state = _to_cpu(self.optimizer.state_dict()["state"]) if merge else None
        began = time.perf_counter()
        result = self._average(params, state, delta, position)
        seconds = time.perf_counter() - began
        self.averaging_s += seconds
        self.metrics.add("averaging_seconds", seconds)
        self._load(result.params, result.optimizer_state)
        self.round, self.batch_size = result.round + 1, result.batch_size
        self._hold(
            result.round, result.params, result.optimizer_state, result.adaptive_state, result.position
        )
        self.metrics.set("batch_size", self.batch_size)
        if self.rank == 0:
            logger.info(
                "[%5.0fs] round %d, %s: loss %.4f, B=%d, averaging %.2fs%s",
                time.perf_counter() - self.started, result.round,
                _progress(position, shard_rows, self.config.train.epochs), delta["loss"], self.batch_size,
                seconds, f", dropped {list(result.dropped)}" if result.dropped else "",
            )  # fmt: skip
        m = self.config.train.validate_every
        if self.rank == 0 and m and result.round % m == 0:
            self._validate(result.round, position)
        if self._checkpoint_due(result.round, position):
            self._report(position, checkpoint=True)

    def _average(self, params, state, delta, position: EpochPosition):
        """Send this round; on a refusal rejoin, then resend it or realign (raises ``Realign``)."""
        sent = self.round
        for _ in range(MAX_REJOINS):
            try:
                return self._call(
                    "average", self.averager.average, self.rank, sent, self.world_size, params, state,
                    stats=delta, position=position.as_dict(), incarnation=self.incarnation,
                    timeout=self.round_timeout_s,
                )  # fmt: skip
            except AveragerUnavailableError:
                raise
            except AveragerError as exc:  # StaleRoundError, MembershipError, AveragingTimeoutError
                logger.warning("learner %d: round %d refused (%s): rejoining", self.rank, sent, exc)
                info = self._join(seed=self._last)
                if info.round == sent:
                    # The averager came back (or took us back) before this round: resend the same payload.
                    self._take_join(info, load=False)
                    continue
                self._take_join(info)
                self._catch_up_reports(sent, info)
                latest = EpochPosition(0) if info.position is None else EpochPosition.from_dict(info.position)
                logger.warning(
                    "learner %d: the others averaged rounds %d-%d without it; continuing from round %d",
                    self.rank, sent, info.latest_round, info.latest_round,
                )  # fmt: skip
                raise Realign(latest.for_group(self.world_size)) from exc
        raise RuntimeError(
            f"learner {self.rank}: round {sent} was refused {MAX_REJOINS} times in a row after rejoining: "
            "the averager and this learner disagree on the group; see the averager's log"
        )

    def _checkpoint_due(self, round_: int, position: EpochPosition | None) -> bool:
        """Whether ``round_`` reports a checkpoint: every checkpoint_every rounds, except the run's last
        one (``_finish`` checkpoints the end). ``position`` None: a round known not to be the last."""
        every, epochs = self.config.train.checkpoint_every, self.config.train.epochs
        last = position is not None and position.epoch >= epochs and position.rows_done == 0
        return bool(every) and round_ % every == 0 and not last

    def _catch_up_reports(self, first: int, info) -> None:
        """The ``ray.train.report`` calls of the checkpoint rounds the others averaged without this learner
        (rounds ``first``..latest): the others wait for them at Ray Train's report barrier."""
        latest = None if info.position is None else EpochPosition.from_dict(info.position)
        for round_ in range(first, info.latest_round + 1):
            if self._checkpoint_due(round_, latest if round_ == info.latest_round else None):
                epoch = latest.epoch if latest else 0
                self.ray.train.report({"round": round_, "epoch": epoch, "batch_size": self.batch_size})

    # ----------------------------------------------------------------------------------- evaluation
    def _validate(self, round_: int, position: EpochPosition) -> None:
        """Rank 0: validate the averaged model of ``round_`` and report it (it may grow B)."""
        accuracy = self.evaluate("val").accuracy
        self.metrics.set("val_accuracy", accuracy)
        try:
            size = self._call(
                "report_validation", self.averager.report_validation, round_, accuracy,
                learner=self.rank, epoch=position.epoch,
            )  # fmt: skip
        except AveragerUnavailableError:
            raise
        except AveragerError as exc:  # the averager restarted or moved on: this one no longer decides B
            logger.warning("round %d: validation accuracy %.4f not taken (%s)", round_, accuracy, exc)
            return
        logger.info("round %d: validation accuracy %.4f -> B=%d from the next round", round_, accuracy, size)

    def evaluate(self, split: str):
        """Accuracy of the current (averaged) model on the whole val or test split, rows cached in memory."""
        from raytrain_seq.runtime.feed import BlockRowStream, shard_dataset

        if split not in self._eval_rows:
            shard = self.ray.get(self.feed.eval_shard.remote(split))
            stream = BlockRowStream(shard_dataset(shard, self.feed))
            rows = []
            while (part := stream.take(16)) is not None:
                rows.append(collate_rows(part))
            self._eval_rows[split] = rows
        # No backward pass: a forward-only micro-batch can be several times the training one.
        micro = self.config.train.micro_batch_size
        return evaluate(
            self.model, self._eval_rows[split], micro_batch_size=4 * micro if isinstance(micro, int) else 16
        )

    # ------------------------------------------------------------------------------- reports, finish
    def _report(self, position: EpochPosition, *, checkpoint: bool, extra: dict | None = None) -> None:
        """``ray.train.report`` on every rank (a barrier); rank 0 attaches the checkpoint."""
        done = self.round - 1
        metrics = {"round": done, "epoch": position.epoch, "batch_size": self.batch_size, **(extra or {})}
        if not checkpoint or self.rank != 0:
            self.ray.train.report(metrics)
            return
        from ray.train import Checkpoint

        snapshot = self._call("snapshot_state", self.averager.snapshot_state)
        if snapshot["round"] < done and self._last is not None:
            # The averager restarted behind this learner: re-seed it, or the checkpoint holds older state.
            self._join(seed=self._last)
            snapshot = self._call("snapshot_state", self.averager.snapshot_state)
        with tempfile.TemporaryDirectory() as folder:
            state = {"averager": snapshot, "config": self.config.to_dict()}
            torch.save(state, os.path.join(folder, CHECKPOINT_FILE))
            Path(folder, POSITION_FILE).write_text(json.dumps({**position.as_dict(), "round": done}))
            self.ray.train.report(
                metrics,
                checkpoint=Checkpoint.from_directory(folder),
                checkpoint_dir_name=f"checkpoint_round_{done:06d}",
            )

    def _finish(self) -> None:
        """Rank 0 scores the test split; every rank sends its last report, rank 0's with the final checkpoint.

        Ray Train's ``Result.metrics`` are those of the latest checkpoint, so the final metrics must travel
        with one (which also keeps the final averaged model).
        """
        totals = dict(self.tally.totals)
        extra: dict[str, Any] = {
            "learner_seconds": time.perf_counter() - self.started,
            "averaging_s": self.averaging_s,
            "compute_s": totals.get("compute_s", 0.0),
            "data_wait_s": totals.get("data_wait_s", 0.0),
        }
        if self.rank == 0:
            test = self.evaluate("test")
            extra.update(
                test_accuracy=test.accuracy,
                test_sequences=test.sequences,
                per_class={str(k): list(v) for k, v in test.per_class.items()},
            )
            logger.info("test accuracy %.4f over %d sequences", test.accuracy, test.sequences)
        self._report(EpochPosition(self.config.train.epochs), checkpoint=True, extra=extra)


def _progress(position: EpochPosition, shard_rows: int, epochs: int) -> str:
    """Where a round falls: "epoch 3/10 done" at an epoch's end, or "epoch 4/10, 32/109 rows" inside."""
    if position.rows_done == 0:
        return f"epoch {position.epoch}/{epochs} done"
    return f"epoch {position.epoch + 1}/{epochs}, {position.rows_done}/{shard_rows} rows"


def _to_cpu(state: dict) -> dict:
    return {
        key: {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in entry.items()}
        for key, entry in state.items()
    }


def _to_device(tree: dict, device, *, copy: bool = False) -> dict:
    """Tensors of a (nested) dict moved to ``device``; ``copy`` makes new tensors even where they are."""
    return {
        key: _to_device(value, device, copy=copy) if isinstance(value, dict)
        else value.to(device, copy=copy) if torch.is_tensor(value) else value
        for key, value in tree.items()
    }  # fmt: skip


def train_loop_per_worker(loop_config: dict) -> None:
    """Ray Train V2 entry: ``loop_config`` = {"config": Config.to_dict(), "names": {...}, "torch_threads"}."""
    import ray.data
    import ray.train
    import ray.train.torch

    config = Config.from_dict(loop_config["config"])
    torch.set_num_threads(int(loop_config.get("torch_threads", 1)))
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    device = ray.train.torch.get_device()
    # One small dataset per epoch: Ray Data's progress bars and per-execution notices would flood the log.
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    Learner(config, loop_config["names"], rank, world_size, device).run()
