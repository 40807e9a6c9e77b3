"""Live tracking of a run: TensorBoard event files (default), MLflow when installed, or nothing.

``make_tracker(kind, run_dir)`` returns an object with ``scalars(values, step)``, ``text(tag, value,
step)`` and ``close()``. The averager's run history calls it as rounds, validations and recoveries
happen, so a run is watched while it trains (``tensorboard --logdir STORAGE_PATH``), not only read from
``summary.json`` at the end. Tags (TensorBoard names them the same way in its scalar tab):

* ``train/loss``, ``train/batch_size``, ``train/frames_per_second``, ``train/learners`` per round;
* ``time/round_s`` (first arrival to result), ``time/compute_s``, ``time/data_wait_s`` per round (means
  over the round's learners);
* ``val/top1``, ``val/top5``, ``val/mean_class_accuracy`` per validation round (top-5 and mean class
  accuracy when the validator reports them);
* ``recoveries/count`` and a text entry ``recoveries`` per recovery;
* ``test/top1``, ``test/top5``, ``test/mean_class_accuracy`` once, at the end.

The step of every scalar is the averaging round. Writers are opened lazily (the first event creates the
folder) and flushed at each round, so a restarted averager appends a new event file beside the old one,
as TensorBoard expects.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raytrain_seq.config import TRACKERS

logger = logging.getLogger(__name__)

__all__ = ["TRACKERS", "NullTracker", "TensorBoardTracker", "make_tracker", "tracker_available"]

TENSORBOARD_DIR = "tensorboard"


def tracker_available(kind: str) -> str | None:
    """None when ``kind`` can be used here, else the reason and the fix."""
    import importlib.util

    module = {"tensorboard": "tensorboardX", "mlflow": "mlflow"}.get(kind)
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return f"run.tracker={kind!r} needs the {module} package: pip install {module}, or pass --tracker none"


class NullTracker:
    """Records nothing (``--tracker none``)."""

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        pass

    def text(self, tag: str, value: str, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """TensorBoard event files under ``folder`` (tensorboardX's SummaryWriter, no TensorFlow needed)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._writer = None

    def _open(self):
        if self._writer is None:
            from tensorboardX import SummaryWriter

            self.folder.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(logdir=str(self.folder))
        return self._writer

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        writer = self._open()
        for tag, value in values.items():
            if value is not None:
                writer.add_scalar(tag, float(value), global_step=step)
        writer.flush()

    def text(self, tag: str, value: str, step: int) -> None:
        self._open().add_text(tag, value, global_step=step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class MLflowTracker:
    """An MLflow run named after the run folder (the tracking URI is MLflow's own setting)."""

    def __init__(self, run_dir: Path) -> None:
        import mlflow

        self._mlflow = mlflow
        self._run = mlflow.start_run(run_name=Path(run_dir).name)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        clean = {tag.replace("/", "."): float(v) for tag, v in values.items() if v is not None}
        self._mlflow.log_metrics(clean, step=step)

    def text(self, tag: str, value: str, step: int) -> None:
        self._mlflow.log_text(value, f"{tag}/{step}.txt")

    def close(self) -> None:
        self._mlflow.end_run()


def make_tracker(kind: str, run_dir: str | Path | None) -> Any:
    """The tracker for ``run.tracker`` writing under ``run_dir`` (None: nothing is written)."""
    if kind not in TRACKERS:
        raise ValueError(f"run.tracker must be one of {TRACKERS}, got {kind!r}")
    if run_dir is None or kind == "none":
        return NullTracker()
    problem = tracker_available(kind)
    if problem is not None:
        raise ValueError(problem)
    if kind == "mlflow":
        return MLflowTracker(Path(run_dir))
    return TensorBoardTracker(Path(run_dir) / TENSORBOARD_DIR)
