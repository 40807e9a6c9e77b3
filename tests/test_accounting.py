"""accounting.py: the per-epoch checksum of trained video ids, from round stats back to epochs (issue 16)."""

from __future__ import annotations

import pytest

from raytrain_seq.accounting import checksum, per_epoch, round_stats


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
