"""A driver killed mid-run (SIGKILL: its averager, feed, Ray Train controller and learners die with it),
then the same command with ``--resume``, as the next ``ray job submit`` would run it (issue 53, item 5).

Contract pinned: the killed driver's actors leave the cluster (every CPU free again); the resumed job
continues from the newest checkpoint and finishes; the run's rounds are 1..N, each once, in the loss
history; every round the killed run averaged after its newest checkpoint (lost with the averager, which
held it only in memory) is averaged again to the same loss, bit for bit; each checkpointed round is kept
as it was; and per epoch the video ids of the rounds that count (the killed run's up to the checkpoint,
the resumed run's after it) are the epoch's plan: every row once per epoch.

A finished round, in the code's terms: a round whose folder ``checkpoint_round_NNNNNN`` rank 0 has put
into the run folder (``checkpoint.put``, before Ray Train's report of that round); rounds after the newest
one (``--checkpoint-every`` > 1, or the round in flight) are averaged again on resume. Both drivers are
subprocesses joined to this module's cluster through ``RAY_ADDRESS``, as ``ray job submit`` runs them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raytrain_seq import checkpoint
from raytrain_seq.config import Config
from raytrain_seq.rounds.events import EVENTS_FILE, EventLog

pytestmark = [pytest.mark.ray, pytest.mark.fault]

ROOT = Path(__file__).resolve().parents[1]
# tests/conftest.py's ray_cluster: a learner per CPU for 2 learners, plus the feed's data tasks.
RAY_CLUSTER = {"num_cpus": 4, "namespace": "raytrain_seq"}
EPOCHS, EVERY = 6, 3  # K=-1: a round per epoch; checkpoints after rounds 3 and 6 (the final one)
FLAGS = [
    "--preset", "smoke", "--epochs", str(EPOCHS), "--checkpoint-every", str(EVERY),
    "--validate-every", "50", "--tracker", "none", "--run-name", "killed",
]  # fmt: skip


def _job(ray, tmp_path: Path, *extra: str, log: str) -> subprocess.Popen:
    """``python jobs/ucf101.py FLAGS`` joined to this module's cluster, its output in ``tmp_path/log``."""
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "jobs" / "ucf101.py"), *FLAGS, "--storage-path", str(tmp_path)]
    out = (tmp_path / log).open("w")
    return subprocess.Popen([*command, *extra], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def _rounds(run_dir: Path) -> list[dict]:
    return [r for r in EventLog(run_dir / EVENTS_FILE).read() if r.get("type") == "round"]


def _wait(condition, what: str, job: subprocess.Popen | None, timeout: float = 150.0, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if job is not None and job.poll() is not None:
            raise AssertionError(f"the job exited ({job.returncode}) before {what}")
        time.sleep(poll)
    raise AssertionError(f"waited {timeout:g} s for {what}")


def _plan_checksums(config: Config) -> dict[int, dict[str, int]]:
    """Per epoch, the checksum of the video ids of the epoch's BLoad plan (bench/chaos.py's)."""
    from raytrain_seq.accounting import checksum
    from raytrain_seq.packing import pack
    from raytrain_seq.rows.assembly import plan_specs
    from raytrain_seq.runtime.feed import feed_geometry
    from raytrain_seq.seeds import plan_seed

    geometry = feed_geometry(config, warn=False)
    train = geometry.catalogs["train"]
    out = {}
    for epoch in range(config.train.epochs):
        seed = plan_seed(config.data.seed, epoch)
        plan = pack(train.lengths, geometry.t_max, strategy=config.data.packing, seed=seed)
        [specs] = plan_specs(plan, 1, train.ids.tolist(), train.labels.tolist(), None)
        out[epoch] = checksum(i for spec in specs for i in spec.ids)
    return out


def _ids_per_epoch(records: list[dict]) -> dict[int, dict[str, int]]:
    from raytrain_seq.accounting import per_epoch

    totals: dict[str, float] = {}
    for record in records:
        for _learner, stats in record["stats"]:
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value
    return per_epoch({"all": totals})


def test_a_killed_driver_leaves_a_run_that_resume_finishes_without_losing_a_finished_round(
    ray_cluster, tmp_path
):
    ray = ray_cluster
    run_dir = tmp_path / "killed"
    began = time.monotonic()
    first = _job(ray, tmp_path, log="first.log")
    # Kill after a round the newest checkpoint does not hold (round 4 or 5: the checkpoint is round 3's).
    _wait(
        lambda: checkpoint.candidates(run_dir) and any(r["round"] > EVERY for r in _rounds(run_dir)),
        "a round after the first checkpoint",
        first,
    )
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    killed_rounds = _rounds(run_dir)
    kept = checkpoint.load_latest(run_dir)
    assert kept is not None and kept.round == EVERY, [p.name for p in checkpoint.candidates(run_dir)]
    lost = [r["round"] for r in killed_rounds if r["round"] > kept.round]
    assert lost and max(lost) < EPOCHS, f"killed too late to test anything: {lost}"
    # Ray ends the dead driver's actors (its averager, feed, controller and, through it, the learners).
    total = ray.cluster_resources()["CPU"]
    _wait(lambda: ray.available_resources().get("CPU", 0) == total, "the killed run's CPUs freed", None, 60)

    second = _job(ray, tmp_path, "--resume", log="second.log")
    assert second.wait(240) == 0, (tmp_path / "second.log").read_text()[-4000:]
    assert "summary written to" in (tmp_path / "second.log").read_text().splitlines()[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"killed after rounds {[r['round'] for r in killed_rounds]}, resumed from round {kept.round}; "
          f"{time.monotonic() - began:.0f} s")  # fmt: skip

    # Rounds 1..N once each; the checkpoint's rounds kept as they were, the rest averaged again.
    history = summary["loss_history"]
    assert [h["round"] for h in history] == list(range(1, EPOCHS + 1)), history
    before = {r["round"]: r["loss"] for r in killed_rounds}
    assert [h["loss"] for h in history[: kept.round]] == [before[r] for r in range(1, kept.round + 1)]
    logged = _rounds(run_dir)
    resumed = [r for r in logged if r["actor"] != killed_rounds[0]["actor"]]
    assert [r["round"] for r in resumed] == list(range(kept.round + 1, EPOCHS + 1))
    # The round log reads 1..N, each repeat marked redo (bench/chaos.py's rounds_contiguous).
    assert [r["round"] for r in logged if not r.get("redo")] == list(range(1, EPOCHS + 1))
    assert [r["round"] for r in logged if r.get("redo")] == lost
    again = {r["round"]: r["loss"] for r in resumed}
    assert [again[r].hex() for r in lost] == [before[r].hex() for r in lost], (
        "a lost round came out different"
    )
    assert summary["rounds"] == EPOCHS - kept.round
    [resume] = [r for r in summary["recoveries"] if r["kind"] == "resumed"]
    assert checkpoint.folder_name(kept.round) in resume["detail"], resume
    assert f"round {lost[0]}" in resume["detail"] or f"rounds {lost[0]}-{lost[-1]}" in resume["detail"]

    # Every row once per epoch: the killed run's rounds up to the checkpoint, then the resumed run's.
    config = Config.from_preset("smoke", epochs=EPOCHS)
    counted = [r for r in killed_rounds if r["round"] <= kept.round] + resumed
    assert _ids_per_epoch(counted) == _plan_checksums(config)
    trained = {int(e): c for e, c in summary["trained_ids"].items()}
    assert trained == {e: c for e, c in _plan_checksums(config).items() if e >= kept.round}
