"""Every fact about a run's input that is knowable before Ray starts, checked then: ``check(config)``.

A wrong input is found in the first seconds, not after connecting or inside a learner. Two layers:
* ``check_paths(config)`` (no torch, no video opened): the data root and split files (read line by line),
  the decoder, ``--num-classes`` against the lists' classes, ``--weights``, ``--init-from``, ``--fuse``
  and ``--resume`` runs (each holding a checkpoint; a run stopped before its first, its event log only,
  starts over), the tracker's package.
* ``check(config)``: the paths, then the data geometry (``data.geometry.data_geometry``: classes and every
  video's strided length against ``--t-max``), ``--warmup-steps`` against the most steps the run can take,
  and a model from ``--weights``, ``--init-from`` or ``--model-factory`` built once on the CPU as each
  learner builds it.
Each problem is a ``RunSetupError`` naming the input and the fix (one line, exit 2). ``check`` returns the
geometry and remembers the last config it passed, so the driver's own call costs nothing. No ray, torch
only to build a model from a file, nothing written; a bad listed video is the catalog's to skip.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from raytrain_seq import checkpoint
from raytrain_seq.config import Config, RunSetupError
from raytrain_seq.outputs.tracking import tracker_available
from raytrain_seq.parts import Parts

if TYPE_CHECKING:  # data.sources loads numpy and the readers: the path checks run before it
    from raytrain_seq.data.geometry import Geometry

logger = logging.getLogger(__name__)

__all__ = ["Checked", "check", "check_paths"]


@dataclass(frozen=True)
class Checked:
    """What ``check`` learned: the data geometry (None for fusion, which reads its runs' own), and each
    part's settings (``parts.Parts``, built once the checks passed)."""

    geometry: Geometry | None = field(default=None, repr=False)
    parts: Parts | None = field(default=None, repr=False)


# The last config ``check`` passed, as JSON, and what it learned (one run per process).
_last: tuple[str, Checked] | None = None


def _run_folder(flag: str, folder: str | os.PathLike[str], fix: str) -> None:
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise RunSetupError(f"{flag} {path}: no such run folder: {fix}")
    if not checkpoint.candidates(path):
        raise RunSetupError(
            f"{flag} {path}: holds no {checkpoint.PREFIX}*/{checkpoint.STATE_FILE}: {fix} (a run writes one "
            "after its first checkpointed averaging round)"
        )


def _data(config: Config) -> None:
    data = config.data
    if data.dataset == "synthetic":
        return
    root = Path(data.data_root).expanduser()
    if not root.is_dir():
        what = (
            "the folder your lists' paths are relative to (README, 'Your own videos')"
            if data.dataset == "list"
            else f"the folder the official {data.dataset.upper()} archives were extracted to (README, 'Real video')"
        )
        raise RunSetupError(f"--data-root {root}: no such folder: pass {what}")
    try:
        class_names = _class_names(config, str(root))  # reads and checks the list files; opens no video
    except ValueError as exc:
        raise RunSetupError(str(exc)) from exc
    if data.num_classes is not None and data.num_classes > len(class_names):
        raise RunSetupError(
            f"--num-classes {data.num_classes} but {data.dataset} under {root} has {len(class_names)} classes: "
            f"pass --num-classes 2..{len(class_names)}, or leave it out to train on every class"
        )


def _class_names(config: Config, root: str) -> tuple[str, ...]:
    """The classes the data set's list files name (ValueError naming a file and line)."""
    data = config.data
    if data.dataset == "list":
        from raytrain_seq.data.video_list import list_entries

        lists = {"train": data.train_list, "val": data.val_list, "test": data.test_list}
        return list_entries(root, lists, data.class_names)[0]
    if data.dataset == "ucf101":
        from raytrain_seq.data.ucf101 import ucf101_entries as entries
    else:
        from raytrain_seq.data.hmdb51 import hmdb51_entries as entries
    return entries(root, data.split)[0]


def check_paths(config: Config) -> None:
    """Raise RunSetupError for the first path ``config`` would read that is missing or unusable (and
    for a tracker or a video decoder whose package is not installed)."""
    problem = tracker_available(config.run.tracker)
    if problem is not None:
        raise RunSetupError(problem)
    if config.data.stream != "fuse":
        _data(config)
    if config.data.dataset != "synthetic":
        from raytrain_seq.data.decoders import resolve

        try:
            resolve(config.data.decoder)
        except ImportError as exc:
            raise RunSetupError(str(exc)) from exc
    weights = config.model.weights
    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file() or not os.access(path, os.R_OK):
            raise RunSetupError(
                f"--weights {path}: no readable file there: pass a local torchvision state_dict (.pth): "
                "ImageNet for a resnet backbone, Kinetics-400 for a video backbone"
            )
    if config.model.init_from is not None:
        _run_folder("--init-from", config.model.init_from, "pass the folder of a finished run")
    if config.data.stream == "fuse" and config.model.fuse is not None:
        for folder in config.model.fuse:
            _run_folder("--fuse", folder, "pass the folders of a finished RGB run and a finished flow run")
    # A run stopped before its first checkpoint (its driver killed) left its event log only: it starts over.
    if config.run.resume and not (config.run_dir() / checkpoint.EVENTS_FILE).is_file():
        _run_folder("--resume", config.run_dir(), "check --storage-path and --run-name, or drop --resume")


def _warmup(config: Config, geometry: Geometry) -> None:
    """Refuse a warm-up the run can never finish: longer than the most optimizer steps it may take.

    The most steps a learner takes per epoch: each block holds at least one video (or a t_max piece of
    one), the fewest learners share the blocks equally, and the batch size never shrinks below its start.
    Example: 1000 videos, 2 learners, batch 4, 10 epochs: at most 10 x ceil(500 / 4) = 1250 steps.
    """
    train = config.train
    if not train.warmup_steps or train.steps is not None:
        return  # a step budget is checked by TrainConfig itself
    lengths = geometry.catalogs["train"].lengths
    t_max = geometry.t_max
    pieces = sum(math.ceil(int(n) / t_max) for n in lengths)
    per_epoch = math.ceil(math.ceil(pieces / train.min_learners) / train.batch_size)
    most = per_epoch * train.epochs
    if train.warmup_steps >= most:
        raise RunSetupError(
            f"train.warmup_steps={train.warmup_steps} is longer than the whole run (at most {most} optimizer "
            f"steps per learner: {train.epochs} epochs of at most {per_epoch}): the learning rate would never "
            f"reach train.lr; lower --warmup-steps, e.g. to {max(1, most // 10)}"
        )


def _model(config: Config, geometry: Geometry) -> None:
    """Build the model on the CPU as each learner does when it starts from a file (weights, init_from) or
    from the user's code (model_factory)."""
    m = config.model
    if m.weights is None and m.init_from is None and m.model_factory is None:
        return
    import torch

    from raytrain_seq.models.factory import build_model_for

    try:
        with torch.no_grad():
            build_model_for(
                config.model, num_classes=len(geometry.class_names), in_channels=geometry.channels
            )
    except ValueError as exc:
        raise RunSetupError(" ".join(str(exc).split())) from exc  # one line, whatever the library wrote


def _frame_cache(config: Config, geometry: Geometry) -> None:
    """Say once what the frame cache needs for this data set against its budget (real RGB video)."""
    data = config.data
    if data.dataset == "synthetic" or data.stream != "rgb":
        return
    import numpy as np

    from raytrain_seq.data.frame_cache import cache_bytes, default_folder

    lengths = [geometry.catalogs[split].lengths for split in ("train", "val", "test")]
    need = cache_bytes(np.concatenate(lengths), data.cache_size)
    budget = data.frame_cache_gib * 2**30
    share = 1.0 if need <= budget else budget / need
    logger.info(
        "frame cache: the splits' decoded frames need about %.1f GiB at short side %d (4:3 frames); the budget "
        "is %.1f GiB a node in %s: %s", need / 2**30, data.cache_size, data.frame_cache_gib,
        data.frame_cache_dir or default_folder(),
        "every video is decoded once" if share >= 1.0 else
        f"about {100 * share:.0f} % of the frames are cached, the rest decoded every time they are augmented "
        "(raise --frame-cache-gib where the disk has room)",
    )  # fmt: skip


def _batch_growth(config: Config) -> None:
    """Say once when AAVG's batch rule is on but may not grow B (an epoch budget under batch_growth "steps",
    ``batchsize.batch_may_grow``): a preset or a --batch-rule would otherwise read as if B grew."""
    from raytrain_seq.algorithms.batchsize import batch_may_grow

    train = config.train
    if not train.adaptive_batch or train.max_batch_size <= train.batch_size:
        return
    if batch_may_grow(train.batch_growth, train.steps):
        return
    logger.info(
        "batch size: B stays at %d blocks for the whole run: the budget is %d epochs and train.batch_growth "
        "is 'steps', so Algorithm 1 (--batch-rule %s) never grows it towards %d; pass --steps N for the "
        "paper's step budget, or --batch-growth always to grow it under epochs (each growth removes steps)",
        train.batch_size, train.epochs, train.batch_rule, train.max_batch_size,
    )  # fmt: skip


def check(config: Config, *, reuse: bool = False) -> Checked:
    """Every check above, in order of cost; RunSetupError (one line: the input and the fix) at the first
    problem. Returns what it learned (the data geometry), which the driver hands to the feed.

    ``reuse``: when the last config checked in this process was this one, return that result without
    checking again (the driver, right after the job's own check: the videos are probed once).
    """
    global _last
    key = json.dumps(config.to_dict(), sort_keys=True, default=str)
    if reuse and _last is not None and _last[0] == key:
        return _last[1]
    check_paths(config)
    geometry = None  # fusion reads its runs' own
    if config.data.stream != "fuse":
        from raytrain_seq.data.geometry import data_geometry

        try:
            geometry = data_geometry(config.data)
        except RunSetupError:
            raise
        except ValueError as exc:  # the synthetic set's own checks; a real set's are RunSetupErrors already
            raise RunSetupError(str(exc)) from exc
        _warmup(config, geometry)
        _model(config, geometry)
        _frame_cache(config, geometry)
        _batch_growth(config)
    checked = Checked(geometry=geometry, parts=Parts.of(config))
    _last = (key, checked)
    return checked
