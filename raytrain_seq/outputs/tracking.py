"""Live tracking of a run: TensorBoard event files (default), MLflow when installed, or nothing.

``make_tracker(kind, run_dir)`` returns an object with ``scalars(values, step)``, ``text(tag, value,
step)`` and ``close()``. The averager's run history calls it as rounds, validations and recoveries happen,
so a run is watched while it trains (``tensorboard --logdir STORAGE_PATH``). Tags: ``train/loss``,
``train/batch_size``, ``train/frames_per_second``, ``train/learners``, ``time/round_s``,
``time/compute_s``, ``time/data_wait_s`` per round; ``val/top1``, ``val/top5``,
``val/mean_class_accuracy`` per validation; ``recoveries/count`` and a ``recoveries`` text per recovery;
``test/top1``, ``test/top5``, ``test/mean_class_accuracy`` once at the end. The step is the averaging
round. Writers open lazily and flush every round, so a restarted averager appends a new event file
beside the old one, as TensorBoard expects.
"""

from __future__ import annotations

import logging
import os
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
    """TensorBoard event files under ``folder``, written synchronously (tensorboardX's protobufs and record
    writer, no TensorFlow): an event is on disk when the call returns. tensorboardX's SummaryWriter queues
    events for a background thread, so a reader (or a crash) could miss the latest round."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._writer = None

    def _write(self, summary: Any, step: int) -> None:
        import time

        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto import event_pb2

        if self._writer is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            # A suffix per process: the averager and the driver may open a file in the same second.
            self._writer = EventsWriter(str(self.folder / "events"), filename_suffix=f".{os.getpid()}")
        self._writer.write_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        from tensorboardX.summary import scalar

        for tag, value in values.items():
            if value is not None:
                self._write(scalar(tag, float(value)), step)

    def text(self, tag: str, value: str, step: int) -> None:
        from tensorboardX.summary import text

        self._write(text(tag, value), step)

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
