"""An AAVG learner: the Ray Train V2 worker loop around the Ray-free inner step.

Algorithm (Cong et al., AAVG, Algorithm 1): every learner starts from the same averaged weights, runs
K local steps on mini-batches of B block rows (``raytrain_seq.step.InnerStep``: micro-batch streaming,
its own Adam), then sends its weights and Adam moments to the ``ParameterAverager`` and continues from
the mean (K = -1: one round per epoch). Every m rounds rank 0 validates the averaged model and reports
the accuracy; the averager's answer of the next round carries the batch size for everyone. Rows come
from this learner's shard of the epoch's BLoad plan (``raytrain_seq.dist.pipeline``): every learner gets
the same number of rows, and all learners see the same B, so they take the same number of steps and
meet at the same rounds without a barrier of their own.

Checkpoints are taken right after a round, when every learner holds the averaged state: rank 0 saves the
averager's snapshot (weights, merged moments, adaptive batch-size state) and the position (epoch, rows
consumed); every rank calls ``ray.train.report`` at the same rounds because Ray Train makes it a barrier.
Resuming restores the averager from that snapshot (the driver does it) and skips the consumed rows.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from raytrain_seq.config import Config
from raytrain_seq.models.factory import build_model_for
from raytrain_seq.step import InnerStep, build_optimizer, collate_rows, evaluate, load_averaged

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "state.pt"
POSITION_FILE = "position.json"


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


class Learner:
    """One AAVG learner inside a Ray Train worker (``train_loop_per_worker`` builds and runs it)."""

    def __init__(self, config: Config, names: dict[str, str], rank: int, world_size: int, device) -> None:
        import ray

        from raytrain_seq.dist.averager import get_averager
        from raytrain_seq.dist.metrics import LearnerMetrics
        from raytrain_seq.dist.pipeline import get_feed

        self.ray = ray
        self.config, self.rank, self.world_size, self.device = config, rank, world_size, device
        self.averager = get_averager(names["averager"], namespace=names["namespace"])
        self.feed = get_feed(names["feed"], namespace=names["namespace"])
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
        self.history: dict[str, list[dict[str, Any]]] = {"loss": [], "val": [], "batch_size": []}
        self._eval_rows: dict[str, list[dict[str, torch.Tensor]]] = {}

    # ---------------------------------------------------------------------------------------- start
    def start(self) -> tuple[int, int]:
        """Join the averager and take its latest state; returns where to start (epoch, rows done)."""
        epoch, rows_done = 0, 0
        checkpoint = self.ray.train.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as folder:
                position = json.loads((Path(folder) / POSITION_FILE).read_text())
            epoch, rows_done = int(position["epoch"]), int(position["rows_done"])
            self.history = position.get("history", self.history) if self.rank == 0 else self.history
            logger.info("learner %d resumes at epoch %d after %d rows", self.rank, epoch, rows_done)
        info = self.ray.get(self.averager.join.remote(self.rank, self.world_size))
        self.round, self.batch_size = info.round, info.batch_size
        if info.params is not None:
            load_averaged(self.model, self.optimizer, info.params, info.optimizer_state)
        return epoch, rows_done

    # ------------------------------------------------------------------------------------- training
    def run(self) -> None:
        from raytrain_seq.dist.pipeline import BlockRowStream, shard_dataset

        epoch, skip = self.start()
        train = self.config.train
        while epoch < train.epochs:
            shard = self.ray.get(self.feed.epoch_shard.remote(epoch, self.rank, self.world_size))
            stream = BlockRowStream(shard_dataset(shard, self.feed))
            rows_done = 0
            if skip:
                stream.take(skip)  # rows consumed before the checkpoint we resumed from
                rows_done, skip = skip, 0
            steps_since_round = 0
            while True:
                waited = stream.wait_seconds
                rows = stream.take(self.batch_size)
                self.tally.data_wait_s += stream.wait_seconds - waited
                if rows is None:
                    break
                stats = self.step(collate_rows(rows))
                rows_done += len(rows["num_sequences"])
                self.tally.add_step(stats.frames, stats.sequences, stats.seconds, stats.loss)
                self.metrics.set("loss", stats.loss)
                self.metrics.set("frames_per_second", stats.frames / max(stats.seconds, 1e-9))
                self.metrics.add("frames", stats.frames)
                steps_since_round += 1
                if train.k > 0 and steps_since_round == train.k:
                    self._round(epoch, rows_done, shard_rows=len(shard.blocks))
                    steps_since_round = 0
            self.metrics.add("data_wait_seconds", stream.wait_seconds)
            epoch += 1
            if train.k < 0 or steps_since_round:
                # K=-1 averages once per epoch; with K>0 the epoch's last few steps still get a round, so
                # every epoch ends on an averaged model (the same for every learner: equal rows and B).
                self._round(epoch, 0, shard_rows=0)
        self._finish()

    def _round(self, epoch: int, rows_done: int, *, shard_rows: int) -> None:
        """One averaging round; (epoch, rows_done) is where training resumes if this is checkpointed."""
        delta = self.tally.flush()
        params = {key: value.detach().cpu() for key, value in self.model.state_dict().items()}
        state = _to_cpu(self.optimizer.state_dict()["state"])
        began = time.perf_counter()
        result = self.ray.get(
            self.averager.average.remote(self.rank, self.round, self.world_size, params, state, stats=delta)
        )
        seconds = time.perf_counter() - began
        self.averaging_s += seconds
        self.metrics.add("averaging_seconds", seconds)
        load_averaged(
            self.model, self.optimizer, _to_device(result.params, self.device), result.optimizer_state
        )
        self.round, self.batch_size = result.round + 1, result.batch_size
        self.metrics.set("batch_size", self.batch_size)
        now = time.perf_counter() - self.started
        if self.rank == 0:
            self.history["loss"].append({"round": result.round, "loss": delta["loss"], "time_s": now})
            self.history["batch_size"].append(
                {"round": result.round, "batch_size": self.batch_size, "time_s": now}
            )
            logger.info(
                "[%5.0fs] round %d, %s: loss %.4f, B=%d, averaging %.2fs%s",
                now, result.round, _progress(epoch, rows_done, shard_rows, self.config.train.epochs),
                delta["loss"], self.batch_size, seconds,
                f", dropped {list(result.dropped)}" if result.dropped else "",
            )  # fmt: skip
        m = self.config.train.validate_every
        if self.rank == 0 and m and result.round % m == 0:
            accuracy = self.evaluate("val").accuracy
            self.metrics.set("val_accuracy", accuracy)
            size = self.ray.get(
                self.averager.report_validation.remote(result.round, accuracy, learner=self.rank)
            )
            self.history["val"].append(
                {
                    "round": result.round,
                    "epoch": epoch,
                    "accuracy": accuracy,
                    "time_s": now,
                    "batch_size": size,
                }
            )
            logger.info(
                "round %d: validation accuracy %.4f -> B=%d from the next round", result.round, accuracy, size
            )
        every = self.config.train.checkpoint_every
        last = epoch >= self.config.train.epochs and rows_done == 0  # _finish checkpoints the end
        if every and result.round % every == 0 and not last:
            self._report(epoch, rows_done, checkpoint=True)

    # ----------------------------------------------------------------------------------- evaluation
    def evaluate(self, split: str):
        """Accuracy of the current (averaged) model on the whole val or test split, rows cached in memory."""
        from raytrain_seq.dist.pipeline import BlockRowStream, shard_dataset

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
    def _report(self, epoch: int, rows_done: int, *, checkpoint: bool, extra: dict | None = None) -> None:
        """``ray.train.report`` on every rank (a barrier); rank 0 attaches the checkpoint."""
        metrics = {"round": self.round - 1, "epoch": epoch, "batch_size": self.batch_size, **(extra or {})}
        if not checkpoint or self.rank != 0:
            self.ray.train.report(metrics)
            return
        from ray.train import Checkpoint

        snapshot = self.ray.get(self.averager.snapshot_state.remote())
        with tempfile.TemporaryDirectory() as folder:
            torch.save(
                {"averager": snapshot, "config": self.config.to_dict()}, os.path.join(folder, CHECKPOINT_FILE)
            )
            position = {
                "epoch": epoch,
                "rows_done": rows_done,
                "round": self.round - 1,
                "history": self.history,
            }
            Path(folder, POSITION_FILE).write_text(json.dumps(position))
            self.ray.train.report(
                metrics,
                checkpoint=Checkpoint.from_directory(folder),
                checkpoint_dir_name=f"checkpoint_round_{self.round - 1:06d}",
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
                history=self.history,
            )
            logger.info("test accuracy %.4f over %d sequences", test.accuracy, test.sequences)
        self._report(self.config.train.epochs, 0, checkpoint=True, extra=extra)


def _progress(epoch: int, rows_done: int, shard_rows: int, epochs: int) -> str:
    """Where a round falls: "epoch 3/10 done", or "epoch 4/10, 32/109 rows" inside an epoch.

    ``epoch`` counts finished epochs at an epoch's closing round (rows_done 0) and the running epoch
    (0-based) inside one, so the running one is shown 1-based.
    """
    if rows_done == 0:
        return f"epoch {epoch}/{epochs} done"
    return f"epoch {epoch + 1}/{epochs}, {rows_done}/{shard_rows} rows"


def _to_cpu(state: dict) -> dict:
    return {
        key: {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in entry.items()}
        for key, entry in state.items()
    }


def _to_device(params: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    return {key: value.to(device) for key, value in params.items()}


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
