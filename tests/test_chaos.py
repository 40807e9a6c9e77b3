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
run by ``make test``. The survivor figures' arithmetic (bench/chaos_figures.py) is tested on fakes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from chaos import JOIN_ROUNDS, make_config, next_epoch_trained, parse_args, size_epochs  # noqa: E402
from chaos_figures import (  # noqa: E402
    Probe,
    RoundSteps,
    cpu_wait_share,
    event_figures,
    first_step_after,
    longest_stall,
    round_steps,
    steps_ratio,
    survivor_restarts,
    total_restarts,
)

ACCURACY_FLOOR = 0.45  # chance is 1/4; the undisturbed run scores about 0.68 (tests/test_faults.py)


@pytest.mark.ray
@pytest.mark.fault
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
    assert out["first_group"] == {"undisturbed": 2, "chaos": 2}, out["first_group"]  # the baseline's size
    assert out["events"] == out["events_requested"] == 4 and sum(out["by_kind"].values()) == 4
    assert all(out["by_kind"][kind] == 1 for kind in kinds.split(",")), out["by_kind"]
    assert out["finished"] and out["rounds_contiguous"], out
    assert out["every_row_once_per_epoch"] and not any(out["rows_short"].values()), out["rows_short"]
    # Not vacuous: the stall dropped a learner, whose rows the group then trained again.
    assert out["stalls_dropped"] == [True] and out["drops"] >= 1
    assert out["missed_rows"] >= 1
    assert {"feed_restart", "dropped"} <= set(out["recoveries"]), out["recoveries"]
    # Issue 53: a lost node costs its learner only; the survivor goes on in the same process.
    [killed] = [event for event in out["schedule"] if event["kind"] == "node_killed"]
    assert killed["survivor_restarts"] == 0, killed
    assert out["accuracy"] >= ACCURACY_FLOOR and out["undisturbed_accuracy"] >= ACCURACY_FLOOR
    # The survivor figures are measured (what they are is the target, not pinned here). An event
    # the run ended before it recovered has null figures (seen: the node add, whose group the lone
    # learner's last rounds outran), so the sum may be null; the stall recovers before the run goes on.
    figures = ("survivor_restarts", "survivor_steps_ratio", "replacement_first_step_s")
    assert all(set(figures) <= set(event) for event in out["schedule"]), out["schedule"]
    counts = [event["survivor_restarts"] for event in out["schedule"]]
    assert out["survivor_restarts"] == (None if None in counts else sum(counts)), out
    [stall] = [event for event in out["schedule"] if event["kind"] == "learner_stalled"]
    assert stall["survivor_restarts"] is not None and stall["replacement_first_step_s"] is not None, stall
    for event in out["schedule"]:
        if event["kind"] in ("node_added", "feed_killed"):
            assert event["replacement_first_step_s"] is None, event


# --------------------------------------------------------------- the survivor figures, from fakes
def _round(
    record_round: int, at: float, learners: list[tuple[int, str, str, float, float]], gap: float = 0.5
) -> dict:
    """An events.jsonl round record as ``RunHistory.record_round`` writes it: per learner (id,
    incarnation, node, steps, first step's wall time), each with ``gap`` as its longest gap."""
    return {
        "type": "round",
        "round": record_round,
        "time": at,
        "stats": [[learner, {"steps": steps, "frames": 8.0}] for learner, _, _, steps, _ in learners],
        "processes": [
            {
                "learner": learner,
                "incarnation": inc,
                "node": node,
                "first_step_wall": first,
                "longest_gap_s": gap,
            }
            for learner, inc, node, _, first in learners
        ],
    }


def _steady(first: int, last: int, learners: list[tuple[int, str, str]], every: float = 1.0) -> list[dict]:
    """Rounds ``first``..``last`` closing at t = round x ``every``, each learner 2 steps, its first step
    half a round before the close."""
    return [
        _round(
            r,
            r * every,
            [(learner, inc, node, 2.0, r * every - every / 2) for learner, inc, node in learners],
        )
        for r in range(first, last + 1)
    ]


def test_round_steps_read_the_log_by_process_and_a_redo_replaces_its_first_record():
    records = [
        *_steady(1, 2, [(0, "a", "n1"), (1, "b", "n2")]),
        _round(3, 3.0, [(0, "a", "n1", 2.0, 2.5)]),
        {**_round(3, 3.5, [(0, "a", "n1", 2.0, 2.6), (1, "b", "n2", 2.0, 2.7)]), "redo": True},
        {"type": "membership", "round": 3, "time": 3.2},
        {"type": "round", "round": 4, "stats": []},  # a record without a wall time (an older log): skipped
    ]
    rounds = round_steps(records)
    assert [r.time for r in rounds] == [1.0, 2.0, 3.5]
    assert rounds[-1].steps == {"a": 2.0, "b": 2.0}
    assert rounds[-1].first_steps == (("n1", 2.6), ("n2", 2.7))


def test_survivor_restarts_count_the_processes_not_lost_that_are_gone_after_the_event():
    before = (("a", "n1"), ("b", "n2"))
    # Today's node kill: Ray Train restarts the group, so the survivor on n1 comes back as "c".
    killed = Probe("node_killed", 10.0, 20.0, before, (("c", "n1"),), lost_nodes=("n2",))
    assert survivor_restarts(killed, []) == 1
    kept = Probe("node_killed", 10.0, 20.0, before, (("a", "n1"),), lost_nodes=("n2",))
    assert survivor_restarts(kept, []) == 0
    # Nobody is lost in an averager kill or a node add: every changed incarnation is a restart.
    assert survivor_restarts(Probe("averager_killed", 10.0, 20.0, before, before), []) == 0
    added = Probe("node_added", 10.0, 20.0, (("a", "n1"),), (("c", "n1"), ("d", "n3")))
    assert survivor_restarts(added, []) == 1
    # Absent from the report at the recovery but sending rounds after it: alive, not restarted.
    late = [RoundSteps(21.0, {"a": 2.0}, {}, {}, ())]
    assert survivor_restarts(Probe("averager_killed", 10.0, 20.0, before, (("b", "n2"),)), late) == 0
    # No vacuous 0: a report without processes (before or after), or a lost node the processes do not
    # name, says None.
    assert survivor_restarts(Probe("averager_killed", 10.0, 20.0, (), before), []) is None
    assert survivor_restarts(Probe("averager_killed", 10.0, 20.0, before, ()), []) is None
    unknown = Probe("node_killed", 10.0, 20.0, (("a", None), ("b", None)), (), lost_nodes=("n2",))
    assert survivor_restarts(unknown, []) is None
    assert total_restarts([{"survivor_restarts": 1}, {"survivor_restarts": 2}]) == 3
    assert total_restarts([{"survivor_restarts": 1}, {"survivor_restarts": None}]) is None


def test_steps_ratio_is_the_survivors_rate_during_the_recovery_over_the_rate_before():
    # One survivor "a", 2 steps a round, a round a second; the fault at t=10.5, recovered at t=14.5.
    steady = round_steps(_steady(1, 20, [(0, "a", "n1")]))
    assert steps_ratio(steady, {"a"}, 1.0, 10.5, 14.5) == pytest.approx(1.0)
    # It stops stepping at the fault (torn down, restarted as "c"): only its own process counts.
    restarted = round_steps(_steady(1, 10, [(0, "a", "n1")]) + _steady(13, 20, [(0, "c", "n1")]))
    assert steps_ratio(restarted, {"a"}, 1.0, 10.5, 14.5) == 0.0
    # Half the rate during the recovery (a round every 2 s).
    slow = round_steps(
        _steady(1, 10, [(0, "a", "n1")]) + [_round(r, r, [(0, "a", "n1", 2.0, r - 1)]) for r in (12, 14)]
    )
    assert steps_ratio(slow, {"a"}, 1.0, 10.5, 14.5) == pytest.approx(0.5)
    # The window before starts at the first round (t=1): rounds 2 and 3, 4 steps in 2.5 s; then 12 in 6 s.
    assert steps_ratio(steady, {"a"}, 1.0, 3.5, 9.5) == pytest.approx((12 / 6) / (4 / 2.5))
    # No vacuous 0: a log whose rounds name no process (or survivors that never stepped) gives None.
    nameless = [RoundSteps(float(r), {}, {}, {}, ()) for r in range(1, 21)]
    assert steps_ratio(nameless, {"a"}, 1.0, 10.5, 14.5) is None
    assert steps_ratio(steady, {"x"}, 1.0, 10.5, 14.5) is None


def test_longest_stall_is_the_survivors_longest_gap_in_the_rounds_of_the_recovery():
    # Survivor "a" waited 6 s for the round that closed at t=17 (its gap shows in the round after, at 18);
    # "b", lost, waited longer, and a gap of "a" before the fault does not count.
    log = [
        *(_round(r, r, [(0, "a", "n1", 2.0, r - 0.5), (1, "b", "n2", 2.0, r - 0.5)]) for r in range(1, 10)),
        _round(10, 10.0, [(0, "a", "n1", 2.0, 9.5)], gap=9.0),
        _round(17, 17.0, [(0, "a", "n1", 2.0, 10.5)]),
        _round(18, 18.0, [(0, "a", "n1", 2.0, 17.5), (1, "b", "n2", 2.0, 17.5)], gap=6.0),
    ]
    log[-1]["processes"][1]["longest_gap_s"] = 20.0  # the lost learner's gap is not a survivor's
    rounds = round_steps(log)
    assert longest_stall(rounds, {"a"}, 10.5, 18.0) == 6.0
    assert longest_stall(rounds, {"a"}, 10.5, 17.5) == 0.5  # the wait's round not yet closed
    assert longest_stall(rounds, {"x"}, 10.5, 18.0) is None  # no vacuous 0
    [figure] = event_figures([Probe("averager_killed", 10.5, 18.0, (("a", "n1"),), (("a", "n1"),))], rounds)
    assert figure["survivor_longest_stall_s"] == 6.0


def test_cpu_wait_share_is_the_survivors_run_queue_wait_a_second_in_the_recovery_and_before_it():
    # Survivors "a" and "b" wait 0.1 s a round for a core before a node kill at t=10.5 takes "z" (which
    # waited 0.9 s a round), 0.4 s a round after it; a round a second.
    log = []
    for r in range(1, 16):
        record = _round(r, r, [(i, inc, f"n{i}", 2.0, r - 0.5) for i, inc in enumerate("abz")])
        for learner, stats in record["stats"]:
            stats["cpu_wait_s"] = 0.9 if learner == 2 else (0.4 if r > 10 else 0.1)
        log.append(record)
    rounds = round_steps(log)
    assert rounds[0].cpu_waits == {"a": 0.1, "b": 0.1, "z": 0.9}
    # Rounds 11-14 in (10.5, 14.5]: 8 waits of 0.4 s over 2 survivors x 4 s; rounds 7-10 before it.
    assert cpu_wait_share(rounds, {"a", "b"}, 10.5, 14.5) == pytest.approx(3.2 / 8)
    assert cpu_wait_share(rounds, {"a", "b"}, 6.5, 10.5) == pytest.approx(0.8 / 8)
    kill = Probe("node_killed", 10.5, 14.5, (("a", "n0"), ("b", "n1"), ("z", "n2")), (), lost_nodes=("n2",))
    [figure] = event_figures([kill], rounds)
    assert (figure["survivor_cpu_wait_share"], figure["survivor_cpu_wait_share_before"]) == (0.4, 0.1)
    # No vacuous 0: rounds without the figure (a kernel that does not report it) give None.
    quiet = round_steps(_steady(1, 15, [(0, "a", "n0")]))
    assert cpu_wait_share(quiet, {"a"}, 10.5, 14.5) is None
    assert cpu_wait_share(rounds, {"a", "b"}, 14.5, 14.5) is None  # an empty window


def test_replacement_first_step_counts_from_the_fault_or_from_the_node_that_came_back():
    two = [(0, "a", "n1"), (1, "b", "n2")]
    log = [
        *_steady(1, 10, two),  # the stall at t=10.2 freezes b on n2
        _round(11, 11.0, [(0, "a", "n1", 2.0, 10.5)]),
        _round(12, 22.0, [(0, "a", "n1", 2.0, 21.0), (1, "b", "n2", 2.0, 21.5)]),  # b realigned: 11.3 s
        *_steady(13, 19, two, every=2.0),  # until t=38
    ]
    rounds = round_steps(log)
    assert first_step_after(rounds, ["n2"], 10.2) == pytest.approx(11.3)
    stall = Probe(
        "learner_stalled", 10.2, 24.0, (("a", "n1"), ("b", "n2")), (("a", "n1"), ("b", "n2")), ("n2",)
    )
    # A node kill at t=40 (n2 lost), and n3 added at t=50, up at t=52, whose learner first steps at 60.5.
    after_kill = [_round(r, r, [(0, "c", "n1", 2.0, r - 0.5)]) for r in range(41, 50)]
    added = [
        _round(r, r, [(0, "e", "n1", 2.0, r - 0.5), (1, "f", "n3", 2.0, r - 0.5)]) for r in range(61, 70)
    ]
    rounds = round_steps(log + after_kill + added)
    kill = Probe("node_killed", 40.0, 48.0, (("a", "n1"), ("b", "n2")), (("c", "n1"),), ("n2",))
    averager = Probe("averager_killed", 44.0, 46.0, (("c", "n1"),), (("c", "n1"),))
    grow = Probe("node_added", 50.0, 64.0, (("c", "n1"),), (("e", "n1"), ("f", "n3")), added=("n3", 52.0))
    figures = event_figures([stall, kill, averager, grow], rounds)
    assert [f["replacement_first_step_s"] for f in figures] == [11.3, 8.5, None, None]
    assert [f["survivor_restarts"] for f in figures] == [0, 1, 0, 1]
    # The stall: "a" stepped 4 times in (10.2, 24] against 18 in (1, 10.2]; the kill: "a" never again.
    stalled_ratio = round((4 / 13.8) / (18 / 9.2), 3)
    assert [f["survivor_steps_ratio"] for f in figures[:2]] == [stalled_ratio, 0.0]
    # A killed node that never came back has no replacement to time.
    assert event_figures([kill], rounds)[0]["replacement_first_step_s"] is None


def test_the_window_before_a_fault_stops_at_the_last_recovery_and_an_unrecovered_event_has_no_figures():
    # "a" steps 2 a second until a node kill at t=10.5 restarts it as "c" (recovered at 20); "c" steps
    # 2 a second from t=15 to a node add at t=22.5, after which it steps 2 a second until the run ends.
    log = _steady(1, 10, [(0, "a", "n1")]) + _steady(15, 30, [(0, "c", "n1")])
    rounds = round_steps(log)
    kill = Probe("node_killed", 10.5, 20.0, (("a", "n1"), ("b", "n2")), (("c", "n1"),), ("n2",))
    grow = Probe("node_added", 22.5, 29.5, (("c", "n1"),), (("c", "n1"),), added=("n3", 23.0))
    # The window before the add is (20, 22.5], not (15.5, 22.5]: the kill's recovery is no baseline.
    figures = event_figures([kill, grow], rounds)
    assert figures[1]["survivor_steps_ratio"] == pytest.approx(round((14 / 7) / (4 / 2.5), 3))
    # The run ended before the add recovered: the report names nobody and no figure is made up.
    ended = Probe("node_added", 22.5, None, (("c", "n1"),), (), added=("n3", 23.0))
    assert event_figures([kill, ended], rounds)[1] == {
        "survivor_restarts": None,
        "survivor_steps_ratio": None,
        "survivor_longest_stall_s": None,
        "survivor_cpu_wait_share": None,
        "survivor_cpu_wait_share_before": None,
        "replacement_first_step_s": None,
    }
    # Nor does the kill before it get a replacement from a node that never stepped.
    assert event_figures([kill, ended], rounds)[0]["replacement_first_step_s"] is None


@pytest.mark.parametrize("videos", [12, 240])
def test_a_node_arrival_is_sized_join_rounds_at_least_however_few_rounds_an_epoch_has(videos, tmp_path):
    """``size_epochs``: a node's arrival adds ``JOIN_ROUNDS`` rounds at least (the newcomer's start-up),
    also when an epoch is one round (12 videos: the real-footage set's case, whose run ended before the
    newcomer joined), and still its ``JOIN_EPOCHS`` epochs at one learner when those are more rounds."""
    args, _ = parse_args(["--videos", str(videos)])
    config = make_config(str(tmp_path), "sizing", args, 1)
    with_arrival, rounds = size_epochs(config, 8, arrivals=1)  # 8 events: more than the 3 epochs at least
    without, same = size_epochs(config, 8)
    assert same == rounds and (rounds == 1) is (videos == 12)  # the case each parameter stands for
    assert (with_arrival - without) * rounds >= JOIN_ROUNDS


def test_a_feed_kill_recovers_once_a_round_of_the_next_epoch_is_averaged(tmp_path):
    """``next_epoch_trained``: a feed killed inside epoch 3 (3, 12) has recovered after a round of epoch 4,
    not at epoch 3's end (4, 0), where the learners have not read the restarted feed's copies yet; one
    killed between epochs (3, 0) after a round of epoch 3. ``size_epochs`` gives each feed kill an epoch."""
    inside, between = next_epoch_trained((3, 12)), next_epoch_trained((3, 0))
    assert [inside(p) for p in (None, (3, 16), (4, 0), (4, 4), (5, 0))] == [False, False, False, True, True]
    assert [between(p) for p in ((3, 0), (3, 4), (4, 0))] == [False, True, True]
    assert next_epoch_trained(None)((0, 4)) and not next_epoch_trained(None)(None)
    args, _ = parse_args(["--videos", "240"])
    config = make_config(str(tmp_path), "sizing", args, 1)
    (plain, rounds), (with_kills, same) = size_epochs(config, 8), size_epochs(config, 8, feed_kills=2)
    assert same == rounds > 1 and plain > 3 and with_kills == plain + 2  # not the 3-epoch floor: exact
