"""The driver's progress line: epochs done from the averaged position, moved by a polling thread.

Contracts pinned: the fraction of the running epoch comes from rows taken over rows per learner and
never completes an epoch early; the bar follows the position and never moves back on a failed read,
which is logged once and does not stop anything.
"""

from __future__ import annotations

import io
import logging

import pytest

from raytrain_seq.runtime.progress import RunProgress, epochs_done


def test_epochs_done_from_a_position():
    assert epochs_done(None, None) == 0.0
    assert epochs_done({"epoch": 3, "rows_done": 40, "world_size": 2}, 160) == pytest.approx(3.25)
    assert epochs_done({"epoch": 3, "rows_done": 0, "world_size": 2}, 160) == 3.0
    assert epochs_done({"epoch": 3, "rows_done": 160, "world_size": 2}, 160) < 4.0  # not done early
    assert epochs_done({"epoch": 2, "rows_done": 7, "world_size": 2}, None) == 2.0  # sizes not known yet


def test_the_bar_follows_the_position_and_survives_a_failed_read(caplog):
    positions = [None, {"epoch": 1, "rows_done": 50, "world_size": 2}, "boom", {"epoch": 4, "world_size": 2}]

    def position():
        value = positions.pop(0)
        if value == "boom":
            raise ConnectionError("the averager is restarting")
        return value

    rows_asked = []

    def rows(epoch, world):
        rows_asked.append((epoch, world))
        return 100

    out = io.StringIO()
    progress = RunProgress(10, position=position, rows=rows, interval_s=3600, stream=out)
    with caplog.at_level(logging.WARNING, logger="raytrain_seq.runtime.progress"):
        assert progress.poll() == 0.0
        assert progress.poll() == pytest.approx(1.5)
        assert progress.poll() == pytest.approx(1.5)  # the failed read keeps the last value
        assert progress.poll() == 4.0
    progress.close()
    assert rows_asked == [(1, 2), (4, 2)]
    assert caplog.text.count("cannot read the run's position") == 1
    assert "epochs" in out.getvalue() and "ETA" in out.getvalue()


def test_a_steps_run_counts_the_positions_steps_out_of_n():
    """train.steps: the bar is the averaged position's run-wide step count out of N, capped at N."""
    positions = [None, {"epoch": 3, "rows_done": 2, "world_size": 2, "steps": 40}, {"epoch": 9, "steps": 70}]
    out = io.StringIO()
    progress = RunProgress(
        10, position=lambda: positions.pop(0), rows=lambda e, w: 100, interval_s=3600, stream=out, steps=64
    )
    assert [progress.poll() for _ in range(3)] == [0.0, 40.0, 64.0]
    progress.close()
    assert "/64 steps" in out.getvalue()
