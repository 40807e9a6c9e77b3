"""The DDP peer of the AAVG benchmark: the same job on Ray Train with DistributedDataParallel.

One Ray Train worker loop (``TorchTrainer(ddp_loop, ...)``) that reuses everything of the AAVG job except
the synchronisation: the data come the AAVG learner's way (``runtime.learner_feed.LearnerFeed``: the
job's feed actor, a persistent row stream per rank, the same refurbished, packed block rows, cropped and
flipped in the loop by ``staging.stage_rows``), the model from
``models.factory.build_model_for``, the step from ``step.InnerStep`` (micro-batch streaming) and the
allocator options (``heap.keep_freed_memory`` when ``train.keep_freed_memory``); the
model is wrapped in ``DistributedDataParallel``, so every backward all-reduces the gradients (gloo on
CPU) where AAVG averages weights every K steps. Rank 0 scores the validation split after every epoch
(the curve that time-to-accuracy reads) and the test split at the end, and reports both with a
checkpoint (Ray Train V2 returns the metrics of the latest checkpoint).

Nothing here runs at import; ``bench/averaging.py`` ships this module to the workers by value.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


def ddp_loop(loop_config: dict) -> None:
    """Ray Train worker: the job's data and InnerStep, synchronised by DDP all-reduce every step."""
    import ray
    import ray.train
    import torch
    from ray.train import Checkpoint
    from torch.nn.parallel import DistributedDataParallel

    from raytrain_seq.config import Config
    from raytrain_seq.models.factory import build_model_for
    from raytrain_seq.runtime.feed import get_feed
    from raytrain_seq.runtime.learner_feed import LearnerFeed
    from raytrain_seq.training.evaluation import eval_micro_batch_size, evaluate
    from raytrain_seq.training.heap import keep_freed_memory
    from raytrain_seq.training.staging import collate_stream, stage_rows
    from raytrain_seq.training.step import InnerStep, build_optimizer

    config = Config.from_dict(loop_config["config"])
    if config.train.keep_freed_memory:
        keep_freed_memory()  # as the AAVG learner does: the allocator is no part of the comparison
    torch.set_num_threads(1)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    ray.data.DataContext.get_current().enable_progress_bars = False
    handle = get_feed(loop_config["feed"], namespace=loop_config["namespace"])
    feed = LearnerFeed(handle, epochs=config.train.epochs)
    spec = feed.model_spec()
    torch.manual_seed(config.data.seed)
    model = build_model_for(config.model, num_classes=spec.num_classes, in_channels=spec.in_channels)
    # Some ranks may get only filler rows in a last step: their forward then skips the CNN.
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    train = config.train
    optimizer = build_optimizer(
        train.optimizer, ddp.parameters(), lr=train.lr, weight_decay=train.weight_decay
    )
    step = InnerStep(ddp, optimizer, micro_batch_size=train.batch_size)
    started = time.perf_counter()
    history, eval_rows = [], {}

    def score(split: str) -> float:
        if split not in eval_rows:
            eval_rows[split] = collate_stream(feed.eval_rows(split))
        # The project's scoring micro-batch, as AAVG's evaluator uses: the peer is no slower for it.
        micro = eval_micro_batch_size(train.micro_batch_size)
        return evaluate(model, eval_rows[split], micro_batch_size=micro).accuracy

    flow = spec.in_channels == 2
    for epoch in range(train.epochs):
        stream, _ = feed.epoch_rows(epoch, rank, world)
        while stream is not None and (rows := stream.take(train.batch_size)) is not None:
            rows.pop("ids", None)  # the AAVG learner's accounting only
            stats = step(stage_rows(rows, "cpu", crop=config.data.crop, flow=flow))
            if stats.sequences == 0:
                # InnerStep skips the update when this rank's rows are all fillers, but under DDP the
                # gradient is the all-reduced one (not zero), and every rank must step to stay in sync.
                optimizer.step()
        if rank == 0:
            # The time the epoch's model exists, as AAVG's curve takes its round's time (its scoring
            # still blocks this loop, and counts in the time of the epochs after it).
            trained_s = time.perf_counter() - started
            history.append({"epoch": epoch + 1, "accuracy": score("val"), "time_s": trained_s})
    metrics = {"learner_seconds": time.perf_counter() - started}
    feed.close()
    if rank != 0:
        ray.train.report(metrics)
        return
    metrics.update(test_accuracy=score("test"), history=history)
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "done").write_text("ok")
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
