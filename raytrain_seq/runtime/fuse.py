"""Two-stream fusion: evaluate a finished RGB run and a finished flow run on the test split, average softmax.

Late fusion as in the two-stream networks and TSN, as the AAVG work reports it: each stream's softmax for
a test video, averaged with equal weights; the argmax is the fused prediction.
``run_fuse(config)`` (``jobs/fuse.py RGB_RUN FLOW_RUN``, or ``--stream fuse --fuse RGB_RUN FLOW_RUN``)
reads each run's averaged model and config from its newest checkpoint that loads, checks that both test
the same videos (dataset, split, classes, subset), scores each through the learners' own pipeline (a
``BlockFeed`` from that run's config, rows from ``LearnerFeed``, the model in the driver, the views of
``--test-views``) and fuses per video id, so the runs may stride or pack differently. ``--data-root``
overrides where the videos are; every other data setting comes from the runs. The summary's
``test_accuracy`` is the fused accuracy, ``extra["fuse"]`` the two streams'.
Trade-off: scoring runs in the driver (one process, no Ray Train): simple and exact, but slow on a CPU
driver for a large split; run it on a GPU node.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raytrain_seq import checkpoint
from raytrain_seq.config import Config, RunSetupError
from raytrain_seq.outputs.summary import SUMMARY_FILE, RunSummary
from raytrain_seq.parts import Parts
from raytrain_seq.runtime.connect import check_storage, connect

logger = logging.getLogger(__name__)

__all__ = ["fuse_probabilities", "run_fuse"]

# Data fields that decide which videos a run tests on; seed matters only through the max_videos subset.
_SAME_TEST_SET = ("dataset", "split", "num_classes", "max_videos")


def _load_checkpoint(run_dir: Path) -> checkpoint.Checkpoint:
    """The run's newest checkpoint that loads; RunSetupError naming the folder when there is none."""
    if not run_dir.is_dir():
        raise RunSetupError(f"--fuse: run folder {run_dir} does not exist: pass the folder of a finished run")
    found = checkpoint.load_latest(run_dir)
    if found is None or found.state.empty:
        raise RunSetupError(
            f"--fuse: {run_dir} holds no {checkpoint.PREFIX}*/{checkpoint.STATE_FILE} that loads: pass the "
            "folder of a run that finished at least one averaging round"
        )
    return found


def _run_config(run_dir: Path, found: checkpoint.Checkpoint) -> Config:
    """The run's Config: from its checkpoint, else from its summary.json."""
    raw = found.config
    if raw is None and (run_dir / SUMMARY_FILE).is_file():
        raw = json.loads((run_dir / SUMMARY_FILE).read_text()).get("config")
    if not raw:
        raise RunSetupError(
            f"{run_dir}: neither its checkpoint nor its {SUMMARY_FILE} holds the run's config: pass a run "
            "folder written by jobs/ucf101.py"
        )
    return Config.from_dict(raw)


def _load_runs(config: Config) -> dict[str, tuple[Path, Config, Any]]:
    runs = {}
    for stream, folder in zip(("rgb", "flow"), config.model.fuse, strict=True):
        run_dir = Path(folder).expanduser()
        found = _load_checkpoint(run_dir)
        run_config = _run_config(run_dir, found)
        if run_config.data.stream != stream:
            raise RunSetupError(
                f"--fuse {config.model.fuse[0]} {config.model.fuse[1]}: {run_dir} is a "
                f"{run_config.data.stream!r} run where the {stream} run belongs: pass --fuse RGB_RUN FLOW_RUN"
            )
        if config.data.dataset != "synthetic" and config.data.dataset != run_config.data.dataset:
            raise RunSetupError(
                f"--dataset {config.data.dataset} but {run_dir} trained on {run_config.data.dataset}: drop "
                f"--dataset (the runs decide it) or fuse runs of {config.data.dataset}"
            )
        if config.data.data_root is not None:
            run_config.data.data_root = config.data.data_root
        run_config.model.init_from = None  # the params hold the trained values already
        run_config.validate()
        runs[stream] = (run_dir, run_config, found)
    rgb, flow = runs["rgb"][1].data, runs["flow"][1].data
    fields = [*_SAME_TEST_SET, *(("seed",) if rgb.max_videos is not None else ())]
    for name in fields:
        if getattr(rgb, name) != getattr(flow, name):
            raise RunSetupError(
                f"--fuse: the runs test different videos: data.{name} is {getattr(rgb, name)!r} in the RGB "
                f"run and {getattr(flow, name)!r} in the flow run; fuse two runs of the same dataset, split "
                "and classes"
            )
    return runs


def _device(config: Config) -> torch.device:
    if config.train.use_gpu is not False and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def _evaluate(
    stream: str, run_dir: Path, run_config: Config, found: checkpoint.Checkpoint, fuse_config: Config
) -> dict[str, Any]:
    """Softmax per test video id of one run's final model, through that run's own feed."""
    import ray

    from raytrain_seq.algorithms.augment import test_views
    from raytrain_seq.models import predict
    from raytrain_seq.models.factory import model_from_state
    from raytrain_seq.runtime.feed import BlockFeed, feed_geometry
    from raytrain_seq.runtime.learner_feed import LearnerFeed
    from raytrain_seq.training.evaluation import eval_micro_batch_size, view_probabilities
    from raytrain_seq.training.staging import collate_rows

    began = time.perf_counter()
    # A bad layout or t_max fails here, in the driver, with its own message.
    geometry = feed_geometry(run_config.data)
    feed = (
        ray.remote(BlockFeed)
        .options(num_cpus=0, num_gpus=0, max_concurrency=32)
        .remote(Parts.of(run_config).feed, geometry=geometry)
    )
    try:
        spec = ray.get(feed.model_spec.remote())
        device = _device(fuse_config)
        model = model_from_state(
            run_config.model,
            found.state.params,
            num_classes=spec.num_classes,
            in_channels=spec.in_channels,
        ).to(device)
        model.eval()
        shard = ray.get(feed.eval_shard.remote("test"))
        data = fuse_config.data
        views = test_views(data.test_views, run_config.data.cache_size, run_config.data.crop)
        multi = data.test_views != "center"
        rows = LearnerFeed(feed).rows_of(shard, uncropped=multi)
        micro = eval_micro_batch_size(fuse_config.train.micro_batch_size)
        sums: dict[int, np.ndarray] = {}
        counts: dict[int, int] = {}
        labels: dict[int, int] = {}
        while (part := rows.take(micro)) is not None:
            batch = {k: v.to(device) for k, v in collate_rows(part).items()}
            if multi:  # the softmax averaged over the views, each cut from the uncropped frames
                flow = spec.in_channels == 2
                probs, targets = view_probabilities(model, batch, views, crop=run_config.data.crop, flow=flow)
            else:
                logits, targets = predict(model, batch)
                probs = torch.softmax(logits.float(), dim=1)
            probs = probs.cpu().numpy()
            # predict's order is row-major (row, slot): row r's sequences are its block's ids in order.
            ids = [
                video
                for block, n in zip(part["block"].tolist(), part["num_sequences"].tolist(), strict=True)
                for video in shard.blocks[block].ids[:n]
            ]
            for video, p, label in zip(ids, probs, targets.tolist(), strict=True):
                # A video cut into chunk pieces (packing="chunk") averages its pieces' probabilities.
                sums[video] = sums.get(video, 0.0) + p
                counts[video] = counts.get(video, 0) + 1
                labels[video] = label
        stats = ray.get(feed.stats.remote(wait=True))
    finally:
        ray.kill(feed)
    seconds = time.perf_counter() - began
    logger.info("fuse: %s run %s scored %d test videos in %.1f s", stream, run_dir, len(sums), seconds)
    return {
        "probs": {v: sums[v] / counts[v] for v in sums},
        "labels": labels,
        "class_names": list(spec.class_names),
        "stats": stats,
        "seconds": seconds,
    }


def fuse_probabilities(
    rgb: dict[int, np.ndarray], flow: dict[int, np.ndarray], labels: dict[int, int], num_classes: int
) -> dict[str, Any]:
    """Accuracies of each stream and of the mean of their softmax, over the videos both scored.

    Returns ``{"rgb", "flow", "fused"}`` accuracies, ``"videos"``, and ``"per_class"``: stream ->
    ``[correct, total]`` per label. Example: p_rgb = (0.6, 0.4), p_flow = (0.1, 0.9), label 1: rgb
    wrong, flow right, fused (0.35, 0.65) right.
    """
    if set(rgb) != set(flow):
        only = sorted(set(rgb) ^ set(flow))
        raise RunSetupError(
            f"--fuse: the runs scored different test videos (e.g. id {only[0]}, {len(only)} differ): fuse "
            "runs of the same dataset, split, classes and max_videos"
        )
    ids = sorted(rgb)
    if not ids:
        raise RunSetupError("--fuse: no test video was scored: check the runs' test split")
    truth = np.asarray([labels[v] for v in ids])
    probs = {"rgb": np.stack([rgb[v] for v in ids]), "flow": np.stack([flow[v] for v in ids])}
    probs["fused"] = (probs["rgb"] + probs["flow"]) / 2.0
    out: dict[str, Any] = {"videos": len(ids), "per_class": {}}
    for name, p in probs.items():
        hits = p.argmax(1) == truth
        out[name] = float(hits.mean())
        out["per_class"][name] = {
            c: [int(hits[truth == c].sum()), int((truth == c).sum())]
            for c in range(num_classes)
            if (truth == c).any()
        }
    return out


def run_fuse(config: Config) -> RunSummary:
    """Evaluate ``config.model.fuse`` = (RGB run, flow run) on the test split; write, return the summary."""
    if config.data.stream != "fuse" or config.model.fuse is None:
        raise ValueError("run_fuse needs data.stream='fuse' and model.fuse=(RGB_RUN, FLOW_RUN): pass both")
    began = time.perf_counter()
    config = config.named()  # its dated folder when no --run-name was given
    runs = _load_runs(config)
    settings = Parts.of(config).connect
    run_dir = check_storage(settings)
    connect(settings)
    results = {
        stream: _evaluate(stream, folder, run_config, found, config)
        for stream, (folder, run_config, found) in runs.items()
    }
    rgb, flow = results["rgb"], results["flow"]
    if rgb["class_names"] != flow["class_names"]:
        raise RunSetupError(
            f"--fuse: the runs have different classes ({rgb['class_names'][:3]}... vs "
            f"{flow['class_names'][:3]}...): fuse runs of the same dataset and --num-classes"
        )
    names = rgb["class_names"]
    fused = fuse_probabilities(rgb["probs"], flow["probs"], rgb["labels"], len(names))
    per_class = {
        stream: {names[c]: correct / total for c, (correct, total) in table.items()}
        for stream, table in fused["per_class"].items()
    }
    videos = dict(rgb["stats"].videos)
    videos["skipped"] = sorted(set(videos["skipped"]) | set(flow["stats"].videos["skipped"]))
    rgb_config = runs["rgb"][1]
    evaluation = rgb["seconds"] + flow["seconds"]
    summary = RunSummary(
        test_views=config.data.test_views,
        dataset=rgb_config.data.dataset,
        learners=0,
        epochs=0,
        test_accuracy=fused["fused"],
        seconds={"total": 0.0, "compute": evaluation, "averaging": 0.0, "data_wait": 0.0},
        config=config.to_dict(),
        videos=videos,
        stream="fuse",
        flow_method=flow["stats"].flow_method,
        per_class_accuracy=per_class["fused"],
        extra={
            "fuse": {
                "rgb_run": str(runs["rgb"][0]),
                "flow_run": str(runs["flow"][0]),
                "rgb_checkpoint": runs["rgb"][2].folder.name,
                "flow_checkpoint": runs["flow"][2].folder.name,
                "rgb_accuracy": fused["rgb"],
                "flow_accuracy": fused["flow"],
                "fused_accuracy": fused["fused"],
                "test_videos": fused["videos"],
                "per_class_rgb": per_class["rgb"],
                "per_class_flow": per_class["flow"],
                "seconds": {"rgb": rgb["seconds"], "flow": flow["seconds"]},
            }
        },
    )
    summary.seconds["total"] = time.perf_counter() - began
    summary.write(run_dir)
    logger.info(
        "fuse: rgb %.4f, flow %.4f, fused %.4f over %d test videos",
        fused["rgb"], fused["flow"], fused["fused"], fused["videos"],
    )  # fmt: skip
    return summary
