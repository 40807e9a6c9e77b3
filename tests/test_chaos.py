"""The chaos soak (bench/chaos.py, issue 16) at its smallest: one run takes 4 faults of 4 kinds on a
several-raylet local cluster, and its own accounting proves nothing was lost.

Contract pinned: after a learner's node is killed, a node is added, the averager is killed and the feed
is killed, all in one run, the run finishes; per epoch the video ids in the averaged rounds have the
count, sum and sum of squares of the epoch's plan (every training video trained exactly once per epoch
across the re-splits and restarts) in every epoch where no learner was dropped from a round; the
averager's round log holds rounds 1..N, each once; and the accuracy holds. The stall kind is left out here: a learner dropped from rounds loses the rows of the
rounds it missed by the averaging protocol's rule (bench/chaos.py's docstring), so "every row once" is
not its contract. Heavy (two runs, about 2-3 minutes on 2 cores): marked ``fault``, run by ``make test``.
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


def test_chaos_soak_with_four_faults_loses_no_round_and_no_row_outside_drops(tmp_path):
    pytest.importorskip("ray")
    kinds = "node_killed,node_added,averager_killed,feed_killed"
    command = [sys.executable, str(ROOT / "bench" / "chaos.py"), "--events", "4", "--kinds", kinds]
    command += ["--storage", str(tmp_path), "--json"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(out, indent=1))
    assert out["events"] == 4 and sum(out["by_kind"].values()) == 4
    assert all(out["by_kind"][kind] == 1 for kind in kinds.split(",")), out["by_kind"]
    assert out["finished"] and out["rounds_contiguous"], out
    # Every epoch in which no learner was dropped from a round has exactly the plan's ids; an epoch with a
    # drop (a killed node's learner the survivors' round timed out on before Ray Train replaced it: a
    # race a loaded box loses) may fall short by the dropped learner's rows, never over.
    assert out["every_row_once_outside_drops"], (out["rows_short"], out["epochs_with_drops"])
    assert out["every_row_once_per_epoch"] == (
        not out["epochs_with_drops"] or not any(out["rows_short"].values())
    )
    assert {"feed_restart", "averager_restart", "live_recovery"} <= set(out["recoveries"]), out["recoveries"]
    assert out["accuracy"] >= ACCURACY_FLOOR and out["undisturbed_accuracy"] >= ACCURACY_FLOOR
