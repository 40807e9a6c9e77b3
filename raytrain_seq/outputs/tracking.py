"""Live tracking of a run: TensorBoard event files (default), MLflow when installed, or nothing.

``make_tracker(kind, run_dir)`` returns an object with ``scalars(values, step)``, ``text(tag, value,
step)`` and ``close()``. The averager's run history calls it as rounds, validations and recoveries
happen, so a run is watched while it trains (``tensorboard --logdir STORAGE_PATH``). Tags:
``train/loss``, ``train/batch_size``, ``train/frames_per_second``, ``train/learners``, ``time/round_s``,
``time/compute_s``, ``time/data_wait_s``, ``time/cpu_wait_s`` (a training thread's time runnable without
a CPU) per round; ``val/top1``, ``val/top5``, ``val/mean_class_accuracy`` per validation;
``recoveries/count`` and a ``recoveries`` text per recovery; ``test/top1``, ``test/top5``,
``test/mean_class_accuracy`` once at the end. The step is the averaging round. Writers open lazily and
flush every round, so a restarted averager appends a new event file beside the old one, as TensorBoard
expects; they import no torch (``outputs.event_file``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raytrain_seq.config import TRACKERS
from raytrain_seq.outputs.event_file import EventFile

__all__ = [
    "TRACKERS",
    "NullTracker",
    "TensorBoardTracker",
    "make_tracker",
    "tracker_available",
]

TENSORBOARD_DIR = "tensorboard"


def tracker_available(kind: str) -> str | None:
    """None when ``kind`` can be used here, else the reason and the fix."""
    import importlib.util

    # Only MLflow needs a package: TensorBoard's files are written here (outputs.event_file).
    if kind != "mlflow" or importlib.util.find_spec("mlflow") is not None:
        return None
    return "run.tracker='mlflow' needs the mlflow package: pip install mlflow, or pass --tracker none"


class NullTracker:
    """Records nothing (``--tracker none``)."""

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        pass

    def text(self, tag: str, value: str, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """TensorBoard event files under ``folder`` (``outputs.event_file``: no torch, no TensorFlow), written
    synchronously: an event is on disk when the call returns. The file opens at the first record, one per
    process (the averager and the driver may open one in the same second; a restarted averager adds its
    own beside the old one, as TensorBoard expects)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._file: EventFile | None = None

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        written = False
        for tag, value in values.items():
            if value is not None:
                self._open().scalar(tag, float(value), step)
                written = True
        if written:
            self._file.flush()

    def text(self, tag: str, value: str, step: int) -> None:
        self._open().text(tag, value, step)
        self._file.flush()

    def close(self) -> None:
        """Close the file (a later call opens a new one)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self) -> EventFile:
        if self._file is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._file = EventFile(self.folder, suffix=f".{os.getpid()}")
        return self._file


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
