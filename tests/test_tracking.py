"""Live tracking: the run history writes TensorBoard scalars as rounds, validations and recoveries happen.

Contracts pinned: each averaging round adds train/loss, train/batch_size, train/frames_per_second and the
time split at step = round; a validation adds val/top1 (and top-5, mean class accuracy when reported); a
recovery adds recoveries/count and a text entry; the event files are readable as written (flushed per
round, not only at the end); ``--tracker none`` writes nothing; an unknown or missing tracker is an error
naming the fix. The event files are written by the project (``outputs.event_file``): byte for byte
what tensorboardX writes for the same events, and without importing torch or tensorboardX.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from unittest import mock

import pytest
from tensorboardX.proto import event_pb2

from raytrain_seq.outputs.event_file import EventFile, crc32c, masked_crc32c
from raytrain_seq.outputs.tracking import NullTracker, TensorBoardTracker, make_tracker, tracker_available
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
    history.clock.start()  # the averager starts the run's clock at the first join
    stats = [(0, {"frames": 3000.0, "sequences": 10.0, "loss": 0.5, "compute_s": 2.0, "data_wait_s": 0.5})]
    stats.append(
        (1, {"frames": 1000.0, "sequences": 30.0, "loss": 1.0, "compute_s": 4.0, "data_wait_s": 0.0})
    )
    history.record_round(1, seconds=0.25, batch_size=4, position=None, stats=stats)
    scalars, _ = read_events(tmp_path / "tensorboard")  # readable before the run ends
    assert scalars["train/loss"] == [(1, pytest.approx(0.875))]  # (0.5 * 10 + 1.0 * 30) / 40
    assert "time/cpu_wait_s" not in scalars  # no learner reported a run-queue wait: not written as a zero
    stats[0][1]["cpu_wait_s"], stats[1][1]["cpu_wait_s"] = 0.25, 0.75
    history.record_validation(1, 0.6, batch_size=8, grew=True, epoch=0, metrics={"top5_accuracy": 0.9})
    history.record_round(2, seconds=0.5, batch_size=8, position=None, stats=stats)
    history.recover("dropped", "learner 1 dropped from round 3")
    tracker.close()
    scalars, texts = read_events(tmp_path / "tensorboard")
    assert [step for step, _ in scalars["train/batch_size"]] == [1, 2]
    assert [v for _, v in scalars["train/batch_size"]] == [4.0, 8.0]
    assert scalars["time/compute_s"][0] == (1, pytest.approx(3.0)) and scalars["time/round_s"][1][1] == 0.5
    assert scalars["time/cpu_wait_s"] == [(2, pytest.approx(0.5))]  # the learners' mean
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


def test_the_event_file_equals_tensorboardxs_byte_for_byte(tmp_path):
    """The same events written by ``EventFile`` and by tensorboardX's writer (the clock shared): equal
    files, name and bytes, over the edges of the encoding: a zero value (written: a oneof), a negative
    one, a tag TensorBoard renames, a finite value beyond float32 (an infinity), NaN, a step past 32
    bits and a negative one, a text with non-ASCII characters."""
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.summary import scalar, text

    now = [1795981490.777784]
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    with mock.patch("time.time", lambda: now[0]):
        reference = EventsWriter(str(theirs / "events"), filename_suffix=".7")
    written = EventFile(mine, suffix=".7", clock=lambda: now[0])
    cases = [
        ("train/loss", 0.5, 1), ("train/loss", 0.0, 2), ("bad tag!/x", -3.25, 3), ("/lead", 1e39, 4),
        ("n", float("nan"), 5), ("big", 1.5, 2**40), ("z", 7, -1),
    ]  # fmt: skip
    for tag, value, step in cases:
        now[0] += 0.125
        written.scalar(tag, value, step)
        reference.write_event(Event(wall_time=now[0], step=step, summary=scalar(tag, value)))
    now[0] += 0.125
    written.text("recoveries", "averager_restart: résumé ✓", 6)
    reference.write_event(
        Event(wall_time=now[0], step=6, summary=text("recoveries", "averager_restart: résumé ✓"))
    )
    written.flush()
    reference.flush()
    [ours], [theirs_file] = list(mine.iterdir()), list(theirs.iterdir())
    assert ours.name == theirs_file.name
    assert ours.read_bytes() == theirs_file.read_bytes() and len(ours.read_bytes()) > 400
    scalars, texts = read_events(mine)
    assert scalars["train/loss"] == [(1, 0.5), (2, 0.0)] and scalars["bad_tag_/x"] == [(3, -3.25)]
    assert scalars["lead"] == [(4, float("inf"))] and texts == ["recoveries/text_summary"]


def test_crc32c_is_castagnolis():
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert crc32c(b"") == 0 and masked_crc32c(b"") == 0xA282EAD8


def test_a_tracker_writes_without_importing_torch_or_tensorboardx(tmp_path):
    """A restarted averager's tracker writes at once: nothing it imports loads torch (a fresh interpreter)."""
    script = textwrap.dedent(
        f"""
        import sys
        from raytrain_seq.outputs.tracking import make_tracker
        tracker = make_tracker("tensorboard", {str(tmp_path)!r})
        tracker.scalars({{"train/loss": 1.0}}, 1)
        tracker.text("recoveries", "averager_restart", 1)
        tracker.close()
        print(sorted(name for name in ("torch", "tensorboardX") if name in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr[-2000:]
    scalars, texts = read_events(tmp_path / "tensorboard")
    assert scalars == {"train/loss": [(1, 1.0)]} and texts == ["recoveries/text_summary"]
