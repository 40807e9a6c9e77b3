"""Every path a job will read, checked before Ray is touched: ``check_paths(config)``.

A path that is wrong is found in the first second, not after connecting to a cluster (where a job
attaches to whatever Ray runs on the machine) or inside a learner (where Ray Train may retry it): the
data root and its split files (read and checked line by line, no video opened), ``--weights``,
``--init-from``, the two ``--fuse`` runs and the ``--resume`` run (each must hold a checkpoint folder).
Each problem is a ``RunSetupError`` naming the path and the fix, which the jobs print as one line and
exit 2 with.

Contract: no ray and no torch are imported here (a bad path exits within a couple of seconds of Python
starting); nothing is written. A video listed but missing is not an error here: the catalog skips and
lists it, as the job does.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from raytrain_seq import checkpoint
from raytrain_seq.config import Config, RunSetupError
from raytrain_seq.tracking import tracker_available

logger = logging.getLogger(__name__)

__all__ = ["check_paths"]


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
        raise RunSetupError(
            f"--data-root {root}: no such folder: pass the folder the official {data.dataset.upper()} archives "
            "were extracted to (README, 'Real video')"
        )
    if data.dataset == "ucf101":
        from raytrain_seq.data.ucf101 import ucf101_entries as entries
    else:
        from raytrain_seq.data.hmdb51 import hmdb51_entries as entries
    try:
        entries(str(root), data.split)  # reads and checks the split files; opens no video
    except ValueError as exc:
        raise RunSetupError(str(exc)) from exc


def check_paths(config: Config) -> None:
    """Raise RunSetupError for the first path ``config`` would read that is missing or unusable (and
    for a tracker whose package is not installed)."""
    problem = tracker_available(config.run.tracker)
    if problem is not None:
        raise RunSetupError(problem)
    if config.data.stream != "fuse":
        _data(config)
    weights = config.model.weights
    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file() or not os.access(path, os.R_OK):
            raise RunSetupError(
                f"--weights {path}: no readable file there: pass a local torchvision ImageNet state_dict "
                "(.pth) for the resnet backbone"
            )
    if config.model.init_from is not None:
        _run_folder("--init-from", config.model.init_from, "pass the folder of a finished run")
    if config.data.stream == "fuse" and config.model.fuse is not None:
        for folder in config.model.fuse:
            _run_folder("--fuse", folder, "pass the folders of a finished RGB run and a finished flow run")
    if config.run.resume:
        _run_folder("--resume", config.run_dir(), "check --storage-path and --run-name, or drop --resume")
