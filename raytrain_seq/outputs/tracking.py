"""Live tracking of a run: TensorBoard event files (default), MLflow when installed, or nothing.

``make_tracker(kind, run_dir)`` returns an object with ``scalars(values, step)``, ``text(tag, value,
step)``, ``close()`` and ``release()`` (see ``hold``). The averager's run history calls it as rounds,
validations and recoveries happen, so a run is watched while it trains (``tensorboard --logdir
STORAGE_PATH``). Tags: ``train/loss``, ``train/batch_size``, ``train/frames_per_second``,
``train/learners``, ``time/round_s``, ``time/compute_s``, ``time/data_wait_s`` per round; ``val/top1``,
``val/top5``, ``val/mean_class_accuracy`` per validation; ``recoveries/count`` and a ``recoveries`` text
per recovery; ``test/top1``, ``test/top5``, ``test/mean_class_accuracy`` once at the end. The step is the
averaging round. Writers open lazily and flush every round, so a restarted averager appends a new event file
beside the old one, as TensorBoard expects; where tensorboardX (and torch) is not loaded yet, a thread
loads it (``TensorBoardTracker``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from raytrain_seq.config import TRACKERS

logger = logging.getLogger(__name__)

__all__ = [
    "TRACKERS",
    "NullTracker",
    "TensorBoardTracker",
    "load_tensorboardx",
    "make_tracker",
    "tracker_available",
]

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

    def release(self) -> None:
        pass


class TensorBoardTracker:
    """TensorBoard event files under ``folder``, written synchronously (tensorboardX's protobufs and record
    writer, no TensorFlow): an event is on disk when the call returns. tensorboardX's SummaryWriter queues
    events for a background thread, so a reader (or a crash) could miss the latest round.

    One exception, at a process's start: importing tensorboardX imports torch (seconds), which neither a
    restarted averager before it serves its learners nor the driver at the run's end should wait for. So
    where tensorboardX is not loaded yet, a thread of the tracker's own imports it from the moment the
    tracker is made; the records made meanwhile are written, in order, once it is loaded, and ``close``
    waits for them. A failed import is logged there and raised by the next call. ``hold``: the import
    waits for ``release()`` (a restarted averager's learners rejoin first). ``library``: what loads the
    writer's parts (tests pass one).
    """

    def __init__(self, folder: Path, *, hold: bool = False, library: Callable[[], Any] | None = None) -> None:
        self.folder = Path(folder)
        self._library = library or load_tensorboardx
        self._lock = threading.Lock()  # the loading thread and the callers write the pending records
        self._writer = None
        self._tb: Any = None  # the loaded library (``load_tensorboardx``)
        if library is None and "tensorboardX" in sys.modules:
            self._tb = load_tensorboardx()  # loaded already: nothing to wait for
        self._pending: list[tuple[str, str, Any, int]] = []  # (kind, tag, value, step) before it loaded
        self._loading: threading.Thread | None = None
        self._failed: BaseException | None = None
        self._held = hold
        if not hold:
            self._start()

    def release(self) -> None:
        """The library may load now (``hold``)."""
        with self._lock:
            self._held = False
            self._start()

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for tag, value in values.items():
            if value is not None:
                self._record("scalar", tag, float(value), step)

    def text(self, tag: str, value: str, step: int) -> None:
        self._record("text", tag, value, step)

    def close(self) -> None:
        """Write what waited for the library, then close the file (a later call opens a new one)."""
        if self._loading is not None:
            self._loading.join()
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def _record(self, kind: str, tag: str, value: Any, step: int) -> None:
        with self._lock:
            if self._failed is not None:
                raise RuntimeError(
                    f"the TensorBoard tracker could not load tensorboardX ({self._failed!r}): install it "
                    "(pip install tensorboardX), or pass --tracker none"
                ) from self._failed
            self._pending.append((kind, tag, value, step))
            if self._tb is not None:
                self._write_pending()

    def _start(self) -> None:
        """Start the library's import (the lock held, or no thread yet), once."""
        if self._loading is None and self._tb is None:
            self._loading = threading.Thread(target=self._load, name="tracker-import", daemon=True)
            self._loading.start()

    def _load(self) -> None:
        try:
            tb = self._library()
        except Exception as exc:
            with self._lock:
                logger.error("TensorBoard tracker: tensorboardX did not load (%r); %d records not written",
                             exc, len(self._pending))  # fmt: skip
                self._failed = exc
                self._pending.clear()
            return
        with self._lock:
            self._tb = tb
            self._write_pending()

    def _write_pending(self) -> None:
        """Write the pending records (the lock held), opening the file first if need be."""
        import time

        tb = self._tb
        if self._writer is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            # A suffix per process: the averager and the driver may open a file in the same second.
            self._writer = tb.EventsWriter(str(self.folder / "events"), filename_suffix=f".{os.getpid()}")
        for kind, tag, value, step in self._pending:
            summary = tb.scalar(tag, value) if kind == "scalar" else tb.text(tag, value)
            self._writer.write_event(tb.Event(wall_time=time.time(), step=step, summary=summary))
        self._pending.clear()
        self._writer.flush()


def load_tensorboardx() -> SimpleNamespace:
    """The parts of tensorboardX the tracker writes with (importing it imports torch)."""
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.summary import scalar, text

    return SimpleNamespace(EventsWriter=EventsWriter, Event=Event, scalar=scalar, text=text)


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

    def release(self) -> None:
        pass


def make_tracker(kind: str, run_dir: str | Path | None, *, hold: bool = False) -> Any:
    """The tracker for ``run.tracker`` writing under ``run_dir`` (None: nothing is written); ``hold``:
    TensorBoard's library loads at ``release()`` (``TensorBoardTracker``), not at the first record."""
    if kind not in TRACKERS:
        raise ValueError(f"run.tracker must be one of {TRACKERS}, got {kind!r}")
    if run_dir is None or kind == "none":
        return NullTracker()
    problem = tracker_available(kind)
    if problem is not None:
        raise ValueError(problem)
    if kind == "mlflow":
        return MLflowTracker(Path(run_dir))
    return TensorBoardTracker(Path(run_dir) / TENSORBOARD_DIR, hold=hold)
