"""Live tracking: the run history writes TensorBoard scalars as rounds, validations and recoveries happen.

Contracts pinned: each averaging round adds train/loss, train/batch_size, train/frames_per_second and the
time split at step = round; a validation adds val/top1 (and top-5, mean class accuracy when reported); a
recovery adds recoveries/count and a text entry; the event files are readable as written (flushed per
round, not only at the end); ``--tracker none`` writes nothing; an unknown or missing tracker is an error
naming the fix. Where tensorboardX is not loaded, a thread started with the tracker (or at ``release``,
when made with ``hold``) loads it, the calls return meanwhile, and the records are written in order once
it is loaded; a failed load is raised by the next call.
"""

from __future__ import annotations

import struct
import threading
import time

import pytest
from tensorboardX.proto import event_pb2

from raytrain_seq.outputs.tracking import (
    NullTracker,
    TensorBoardTracker,
    load_tensorboardx,
    make_tracker,
    tracker_available,
)
from raytrain_seq.rounds.events import RunHistory


def read_events(folder) -> tuple[dict[str, list[tuple[int, float]]], list[str]]:
    """Scalars {tag: [(step, value)]} and text tags of every event file in ``folder`` (TFRecord framing:
    uint64 length, uint32 crc, the Event bytes, uint32 crc)."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    texts = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
                else:
                    texts.append(value.tag)
    return scalars, texts


def test_run_history_writes_scalars_as_the_run_goes(tmp_path):
    """Two rounds, a validation and a recovery: the tags, steps and values TensorBoard will show."""
    tracker = make_tracker("tensorboard", tmp_path)
    history = RunHistory(tmp_path / "events.jsonl", tracker=tracker)
    history.start_clock()  # the averager starts the run's clock at the first join
    stats = [(0, {"frames": 3000.0, "sequences": 10.0, "loss": 0.5, "compute_s": 2.0, "data_wait_s": 0.5})]
    stats.append(
        (1, {"frames": 1000.0, "sequences": 30.0, "loss": 1.0, "compute_s": 4.0, "data_wait_s": 0.0})
    )
    history.record_round(1, seconds=0.25, batch_size=4, position=None, stats=stats)
    scalars, _ = read_events(tmp_path / "tensorboard")  # readable before the run ends
    assert scalars["train/loss"] == [(1, pytest.approx(0.875))]  # (0.5 * 10 + 1.0 * 30) / 40
    history.record_validation(1, 0.6, batch_size=8, grew=True, epoch=0, metrics={"top5_accuracy": 0.9})
    history.record_round(2, seconds=0.5, batch_size=8, position=None, stats=stats)
    history.recover("dropped", "learner 1 dropped from round 3")
    tracker.close()
    scalars, texts = read_events(tmp_path / "tensorboard")
    assert [step for step, _ in scalars["train/batch_size"]] == [1, 2]
    assert [v for _, v in scalars["train/batch_size"]] == [4.0, 8.0]
    assert scalars["time/compute_s"][0] == (1, pytest.approx(3.0)) and scalars["time/round_s"][1][1] == 0.5
    assert scalars["train/learners"][0][1] == 2.0 and scalars["train/frames_per_second"][0][1] > 0
    assert scalars["val/top1"] == [(1, pytest.approx(0.6))] and scalars["val/top5"] == [
        (1, pytest.approx(0.9))
    ]
    assert "val/mean_class_accuracy" not in scalars  # not reported: not written as a zero
    assert scalars["recoveries/count"] == [(2, 1.0)] and any("recoveries" in tag for tag in texts)


def test_no_tracker_writes_nothing_and_bad_trackers_say_the_fix(tmp_path):
    assert isinstance(make_tracker("none", tmp_path), NullTracker)
    assert isinstance(make_tracker("tensorboard", None), NullTracker)  # no run folder: an averager in a test
    history = RunHistory(None, tracker=make_tracker("none", tmp_path))
    history.record_round(1, seconds=0.1, batch_size=4, position=None, stats=[])
    assert not (tmp_path / "tensorboard").exists()
    with pytest.raises(ValueError, match=r"run\.tracker must be one of"):
        make_tracker("wandb", tmp_path)
    assert tracker_available("tensorboard") is None
    missing = tracker_available("mlflow")
    assert missing is None or "pip install mlflow" in missing
    assert isinstance(make_tracker("tensorboard", tmp_path), TensorBoardTracker)


def test_a_tracker_whose_library_is_loading_returns_at_once_and_writes_in_order_when_it_has_loaded(tmp_path):
    """The restarted averager's case: tensorboardX (and torch) not loaded yet. The calls return while the
    library loads on the tracker's thread; nothing is written before it has loaded; then every record,
    in order, and a call after it writes at once."""
    release, calls = threading.Event(), []

    def slow_library():
        calls.append(threading.current_thread().name)
        release.wait(timeout=30)
        return load_tensorboardx()

    tracker = TensorBoardTracker(tmp_path, library=slow_library)  # its import starts now, on its thread
    start = time.perf_counter()
    tracker.scalars({"train/loss": 1.0}, 1)
    tracker.text("recoveries", "averager_restart: ...", 1)
    tracker.scalars({"train/loss": 0.5, "skipped": None}, 2)
    assert time.perf_counter() - start < 5  # the library waits for release: the calls did not
    assert read_events(tmp_path) == ({}, [])  # nothing before it loaded
    release.set()
    tracker._loading.join(timeout=30)
    assert calls == ["tracker-import"]  # loaded once, on the tracker's thread
    scalars, texts = read_events(tmp_path)
    assert scalars == {"train/loss": [(1, 1.0), (2, 0.5)]} and len(texts) == 1
    tracker.scalars({"train/loss": 0.25}, 3)  # loaded: written before the call returns
    assert read_events(tmp_path)[0]["train/loss"][-1] == (3, 0.25)
    tracker.close()


def test_a_tracker_whose_library_fails_to_load_says_so_at_the_next_call(tmp_path):
    def broken():
        raise ImportError("No module named 'tensorboardX'")

    tracker = TensorBoardTracker(tmp_path, library=broken)  # its import starts on its thread
    tracker.close()  # waits for it
    with pytest.raises(RuntimeError, match=r"could not load tensorboardX.*pip install tensorboardX"):
        tracker.scalars({"train/loss": 1.0}, 2)
    assert read_events(tmp_path) == ({}, [])


def test_a_held_tracker_starts_loading_only_when_released(tmp_path):
    """``hold``: a restarted averager's records wait, with no import started, until ``release()``."""
    loads = []

    def library():
        loads.append(threading.current_thread().name)
        return load_tensorboardx()

    tracker = TensorBoardTracker(tmp_path, hold=True, library=library)
    tracker.scalars({"train/loss": 1.0}, 1)
    time.sleep(0.2)
    assert loads == [] and not any(t.name == "tracker-import" for t in threading.enumerate())
    tracker.release()
    tracker.close()  # waits for the import and the held record
    assert loads == ["tracker-import"] and read_events(tmp_path)[0] == {"train/loss": [(1, 1.0)]}
