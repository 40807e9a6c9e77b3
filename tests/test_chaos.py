"""The chaos soak (bench/chaos.py, issue 16) at its smallest: one run takes 4 faults of 4 kinds on a
several-raylet local cluster, and its own accounting proves nothing was lost.

Contract pinned: after a learner is stalled past the averager's timeout (dropped from a round, then
realigned), a learner's node is killed, a node is added and the feed is killed, all in one run, the run
finishes; per epoch the video ids in the averaged rounds have the count, sum and sum of squares of the
epoch's plan (every training video trained exactly once per epoch across the drops, re-splits and
restarts: the dropped learner's rows are made up by the group); the averager's round log holds rounds
1..N, each once; all 4 events were injected, the stall got its learner dropped; and the accuracy stays
well above chance. Not pinned here: the soak's "within 5 points of the undisturbed run", which is the
``--events 8`` target's (7-8 epochs, where both runs converge). This run is sized to 4 epochs, where
the models are still undertrained and a phase with 1 learner takes twice the optimizer steps per epoch
of 2, so the two scores can differ by more than the faults make them (0.87 against 0.68 at 3 epochs;
0.89 against 0.87 at 4: docs/LOG.md). Heavy (two runs, about 3 minutes on 2 cores): marked ``fault``,
run by ``make test``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.fault]

ROOT = Path(__file__).resolve().parents[1]
ACCURACY_FLOOR = 0.45  # chance is 1/4; the undisturbed run scores about 0.68 (tests/test_faults.py)


def test_chaos_soak_with_four_faults_including_a_drop_trains_every_row_once(tmp_path):
    pytest.importorskip("ray")
    kinds = "node_killed,node_added,learner_stalled,feed_killed"
    command = [sys.executable, str(ROOT / "bench" / "chaos.py"), "--events", "4", "--kinds", kinds]
    command += ["--storage", str(tmp_path), "--json"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    # Without its JSON line the soak raised: say why (its stderr), not only that the line is missing.
    assert last.startswith("{"), (done.returncode, done.stdout[-3000:], done.stderr[-5000:])
    out = json.loads(last)
    print(json.dumps(out, indent=1))
    accuracy_only = "accuracy more than 5 points from the undisturbed run"
    others = [problem for problem in out["problems"] if problem != accuracy_only]
    assert not others, (others, done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == (0 if out["ok"] else 1) and out["ok"] == (not out["problems"])
    assert out["events"] == out["events_requested"] == 4 and sum(out["by_kind"].values()) == 4
    assert all(out["by_kind"][kind] == 1 for kind in kinds.split(",")), out["by_kind"]
    assert out["finished"] and out["rounds_contiguous"], out
    assert out["every_row_once_per_epoch"] and not any(out["rows_short"].values()), out["rows_short"]
    # Not vacuous: the stall dropped a learner, whose rows the group then trained again.
    assert out["stalls_dropped"] == [True] and out["drops"] >= 1
    assert out["missed_rows"] >= 1
    assert {"feed_restart", "live_recovery", "dropped"} <= set(out["recoveries"]), out["recoveries"]
    assert out["accuracy"] >= ACCURACY_FLOOR and out["undisturbed_accuracy"] >= ACCURACY_FLOOR
