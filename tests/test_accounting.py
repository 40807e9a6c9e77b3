"""accounting.py: the per-epoch checksum of trained video ids, from round stats back to epochs (issue 16)."""

from __future__ import annotations

import pytest

from raytrain_seq.outputs.accounting import checksum, per_epoch, round_stats


def test_round_stats_fold_back_into_the_plans_checksum_per_epoch():
    """Two learners' rounds over two epochs, padding slots (-1) included, sum to each epoch's checksum."""
    plan = {0: [5, 1, 9, 3], 1: [3, 9, 1, 5]}
    totals: dict[str, dict[str, float]] = {"a": {"frames": 10.0}, "b": {}}
    rounds = [("a", 0, [5, -1, 1]), ("b", 0, [9, 3, -1]), ("a", 1, [3]), ("b", 1, [9, 1]), ("a", 1, [5])]
    for learner, epoch, ids in rounds:  # what the averager does with a round's stats: sum them
        for key, value in round_stats(epoch, ids).items():
            totals[learner][key] = totals[learner].get(key, 0.0) + value
    assert per_epoch(totals) == {e: checksum(ids) for e, ids in plan.items()}
    assert checksum([5, 1, 9, 3]) == {"count": 4, "sum": 18, "sumsq": 116}


@pytest.mark.parametrize(
    "trained",
    [[5, 1, 9], [5, 1, 9, 3, 3], [5, 1, 9, 7], [5, 5, 9, 1]],
    ids=["missing", "repeated", "foreign", "repeated-and-missing"],
)
def test_a_missing_repeated_or_foreign_id_changes_the_checksum(trained):
    assert checksum(trained) != checksum([5, 1, 9, 3])


def test_per_epoch_ignores_other_stats_and_is_empty_without_ids():
    assert per_epoch({"a": {"frames": 3.0, "steps": 2.0}}) == {}
    assert round_stats(2, [-1, -1]) == {"ids_e2_count": 0.0, "ids_e2_sum": 0.0, "ids_e2_sumsq": 0.0}


def test_a_round_redone_after_an_averager_restart_counts_once(tmp_path):
    """Found by the chaos soak: the averager logged round 3, died before any learner took its result,
    reloaded checkpoint 2, and the learners sent round 3 again. Totals (frames, the trained-ids checksum),
    the round count and the loss history count round 3 once, live and after a later restart's replay of
    a log holding both records; the log marks the second record ``redo``."""
    from raytrain_seq.rounds.events import EVENTS_FILE, RunHistory

    log = tmp_path / EVENTS_FILE

    def record(history, round_):
        stats = [(0, {"frames": 10.0, "sequences": 1.0, "loss": 1.0, **round_stats(0, [round_])})]
        history.record_round(round_, seconds=0.1 * round_, batch_size=2, position=None, stats=stats)

    def restart(after):
        history = RunHistory(log, actor="A")
        kept = [{"round": r, "loss": 1.0, "time_s": 0.0} for r in range(1, after + 1)]
        history.restore_checkpoint_part({"loss_history": kept}, 0.0)
        history.replay_rounds(history.log.replay(), after=after)
        return history

    first = RunHistory(log, actor="A")
    for round_ in (1, 2, 3):
        record(first, round_)
    second = restart(after=2)
    record(second, 3)  # the redo
    for history in (second, restart(after=3)):
        summary = history.summary()
        assert [h["round"] for h in summary["loss_history"]] == [1, 2, 3]
        assert summary["rounds_completed"] == 3 and summary["learners"][0]["frames"] == 30.0
        assert per_epoch(summary["learners"]) == {0: checksum([1, 2, 3])}
    assert "round_redone" in {r["kind"] for r in second.recoveries}
    rounds = [r for r in second.log.read() if r.get("type") == "round"]
    assert [(r["round"], r.get("redo", False)) for r in rounds] == [
        (1, False),
        (2, False),
        (3, False),
        (3, True),
    ]
