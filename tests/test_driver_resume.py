"""A driver killed mid-run (SIGKILL: its averager, feed, Ray Train controller and learners die with it),
then the same command with ``--resume``, as the next ``ray job submit`` would run it (issue 53, item 5).

Contract pinned, over two kills of one run: the killed driver's actors leave the cluster; a run killed
before its first checkpoint resumes from the start; a run killed later resumes from its newest
checkpoint, and the last resume finishes; every round a killed run averaged after its newest checkpoint
(held only in memory by the averager that died) is averaged again to the same loss, bit for bit, and
logged ``redo``, so the round log reads 1..N with each repeat marked; the loss history holds rounds
1..N once each; and per epoch the video ids of the rounds that count (each round's last record) are
the epoch's plan: every row once per epoch.

A finished round, in the code's terms: a round whose folder ``checkpoint_round_NNNNNN`` rank 0 has put
into the run folder (``checkpoint.put``, before Ray Train's report of that round); rounds after the newest
one (``--checkpoint-every`` > 1, or the round in flight) are averaged again on resume. The drivers are
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from chaos import plan_checksums

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


def _ids_per_epoch(records: list[dict]) -> dict[int, dict[str, int]]:
    from raytrain_seq.outputs.accounting import per_epoch

    totals: dict[str, float] = {}
    for record in records:
        for _learner, stats in record["stats"]:
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value
    return per_epoch({"all": totals})


def _kill(ray, job: subprocess.Popen) -> None:
    """SIGKILL the driver, then wait until Ray has ended its actors (its averager, feed, Ray Train
    controller and, through it, the learners): no averager or feed named, every CPU free again."""
    job.send_signal(signal.SIGKILL)
    job.wait(10)
    total = ray.cluster_resources()["CPU"]

    def ended() -> bool:
        named = ray.util.list_named_actors(all_namespaces=True)
        ours = [a for a in named if a["name"].startswith(("averager-", "feed-"))]
        return not ours and ray.available_resources().get("CPU", 0) == total

    _wait(ended, "the killed run's actors to end", None, 60)


def test_a_killed_driver_leaves_a_run_that_resume_finishes_without_losing_a_finished_round(
    ray_cluster, tmp_path
):
    ray = ray_cluster
    run_dir = tmp_path / "killed"
    began = time.monotonic()
    # 1. Killed before its first checkpoint (round 3's): --resume starts the run over.
    first = _job(ray, tmp_path, log="first.log")
    _wait(lambda: _rounds(run_dir), "a first round", first)
    _kill(ray, first)
    lost = [r["round"] for r in _rounds(run_dir)]
    assert not checkpoint.candidates(run_dir), f"killed too late: rounds {lost} done"
    # 2. That resume, killed after a round its newest checkpoint (round 3's) does not hold.
    second = _job(ray, tmp_path, "--resume", log="second.log")
    _wait(
        lambda: checkpoint.candidates(run_dir) and any(r["round"] > EVERY for r in _rounds(run_dir)),
        "a round after the first checkpoint",
        second,
    )
    _kill(ray, second)
    kept = checkpoint.load_latest(run_dir)
    assert kept is not None and kept.round == EVERY, [p.name for p in checkpoint.candidates(run_dir)]
    killed = [r for r in _rounds(run_dir) if r["actor"] != _rounds(run_dir)[0]["actor"]]
    lost += [r["round"] for r in killed if r["round"] > kept.round]
    assert lost[-1] > kept.round and max(lost) < EPOCHS, f"killed too late to test anything: {lost}"
    # 3. The next resume continues from round 3's checkpoint and finishes.
    third = _job(ray, tmp_path, "--resume", log="third.log")
    assert third.wait(240) == 0, (tmp_path / "third.log").read_text()[-4000:]
    # The driver's own line; a worker's log line forwarded by Ray may still come after it.
    assert "summary written to" in (tmp_path / "third.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"rounds lost with the killed drivers {lost}; {time.monotonic() - began:.0f} s")

    # The round log reads 1..N, each repeat marked redo (bench/chaos.py's rounds_contiguous), and a
    # round averaged again has the loss it had, bit for bit: nothing is redone differently.
    logged = _rounds(run_dir)
    assert [r["round"] for r in logged if not r.get("redo")] == list(range(1, EPOCHS + 1))
    assert [r["round"] for r in logged if r.get("redo")] == lost
    losses: dict[int, set[str]] = {}
    for record in logged:
        losses.setdefault(record["round"], set()).add(record["loss"].hex())
    assert all(len(hexes) == 1 for hexes in losses.values()), f"a lost round came out different: {losses}"
    # The summary: rounds 1..N once each, the checkpoint's history kept, both resumes recorded.
    history = summary["loss_history"]
    assert [h["round"] for h in history] == list(range(1, EPOCHS + 1)), history
    assert [{h["loss"].hex()} for h in history] == [losses[r] for r in range(1, EPOCHS + 1)]
    assert summary["rounds"] == EPOCHS - kept.round  # averaged by the last run
    resumes = [r["detail"] for r in summary["recoveries"] if r["kind"] == "resumed"]
    assert len(resumes) == 2 and resumes[0].startswith("run resumed from the start"), resumes
    assert f"{checkpoint.folder_name(kept.round)} (round {kept.round}); round" in resumes[1], resumes

    # Every row once per epoch: per round, the record that counts (the last one), against the plan.
    config = Config.from_preset("smoke", epochs=EPOCHS)
    counted = list({r["round"]: r for r in logged}.values())
    assert _ids_per_epoch(counted) == plan_checksums(config)
    trained = {int(e): c for e, c in summary["trained_ids"].items()}
    assert trained == {e: c for e, c in plan_checksums(config).items() if e >= kept.round}
