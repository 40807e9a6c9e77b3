"""The one checkpoint module: layout, schedule, save, and "load the newest checkpoint that loads".

Contracts pinned: a saved checkpoint loads back to the same state, history, config and position, and its
``state.pt`` loads with ``torch.load(weights_only=True)``; ``load_latest`` skips a corrupt or half-written
newest checkpoint with a warning naming it and returns the one before; a write that fails raises
``CheckpointError`` naming the folder and leaves the older checkpoints loadable; the schedule checkpoints
every ``every`` rounds but the final one; checkpoints of the first format still load; retention keeps the
newest N, the best by validation accuracy and the rounds whose score may still come, and removes only
whole folders. ``defer_tensors`` loads the same values, all but the tensors without torch (in a process
that has none), the tensors on first use, once, and pickles them as a plain dict; a file whose tensors
lie elsewhere, or that is cut short, loads (or fails) as without it.
"""

from __future__ import annotations

import json
import logging
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from raytrain_seq import checkpoint
from raytrain_seq.rounds.state import AveragedState


def _state(round_: int, value: float = 1.0) -> AveragedState:
    params = {"w": torch.full((3,), value), "n": torch.tensor(round_)}
    moments = {
        0: {"step": torch.tensor(float(round_)), "exp_avg": torch.zeros(3), "exp_avg_sq": torch.ones(3)}
    }
    position = {"epoch": 1, "history": [[2, 3]], "world_size": 1, "rows_done": 4}
    return AveragedState(
        round=round_,
        params=params,
        optimizer_state=moments,
        batch_size=8,
        adaptive_state={"size": 8, "best": 0.5},
        position=position,
        elapsed_s=12.5,
        source="live",
    )


@pytest.mark.parametrize("defer", [False, True])
def test_saved_checkpoint_loads_back_with_weights_only(tmp_path, defer):
    """save -> load gives the same state (source "checkpoint"), history, config and position."""
    state = _state(5)
    history = {"validation_due": 5, "loss_history": [{"round": 5, "loss": 0.25, "time_s": 1.0}]}
    folder = checkpoint.save(
        tmp_path / checkpoint.folder_name(5), state=state, history=history, config={"train": {"k": 2}}
    )
    assert folder.name == "checkpoint_round_000005"
    raw = torch.load(folder / checkpoint.STATE_FILE, weights_only=True)  # plain types only
    assert raw["format"] == 2 and raw["state"]["round"] == 5
    loaded = checkpoint.load(folder, defer_tensors=defer)
    assert isinstance(loaded.state.params, checkpoint.DeferredTensors) == defer
    assert isinstance(loaded.state.optimizer_state, checkpoint.DeferredTensors) == defer
    assert (
        loaded.state.round == 5
        and list(loaded.state.params) == ["w", "n"]
        and all(torch.equal(loaded.state.params[k], v) for k, v in state.params.items())
    )
    assert (loaded.state.adaptive_state, loaded.state.elapsed_s) == (state.adaptive_state, 12.5)
    assert loaded.state.source == "checkpoint" and loaded.state.batch_size == 8
    assert torch.equal(loaded.state.optimizer_state[0]["exp_avg_sq"], torch.ones(3))
    assert loaded.history == history and loaded.config == {"train": {"k": 2}}
    assert loaded.position == {**state.position, "round": 5}
    assert not list(folder.glob(".*partial"))  # nothing left under a temporary name


@pytest.mark.parametrize("defer", [False, True])
def test_load_latest_skips_a_corrupt_newest_checkpoint(tmp_path, caplog, defer):
    """The newest checkpoint, cut short by a crash, is skipped with a warning naming it."""
    for round_ in (2, 4, 6):
        checkpoint.save(tmp_path / checkpoint.folder_name(round_), state=_state(round_, float(round_)))
    newest = tmp_path / checkpoint.folder_name(6) / checkpoint.STATE_FILE
    newest.write_bytes(newest.read_bytes()[:100])  # half-written
    (tmp_path / "checkpoint_round_000007").mkdir()  # a folder without a state file is not a checkpoint
    with caplog.at_level(logging.WARNING, logger="raytrain_seq.checkpoint"):
        found = checkpoint.load_latest(tmp_path, defer_tensors=defer)
    assert found.round == 4 and torch.equal(found.state.params["w"], torch.full((3,), 4.0))
    assert "checkpoint_round_000006" in caplog.text and "skipped" in caplog.text
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint_round_000006"):
        checkpoint.load(tmp_path / checkpoint.folder_name(6))
    assert checkpoint.load_latest(tmp_path / "empty") is None


def test_a_failed_write_names_the_folder_and_keeps_the_older_checkpoints(tmp_path):
    """A checkpoint that cannot be written raises CheckpointError naming it; the previous one still loads."""
    checkpoint.save(tmp_path / checkpoint.folder_name(1), state=_state(1))
    blocker = tmp_path / "checkpoint_round_000002"
    blocker.write_text("a file where the folder should go")  # mkdir fails here even for root
    with pytest.raises(checkpoint.CheckpointError, match=r"checkpoint_round_000002.*storage path"):
        checkpoint.save(blocker, state=_state(2))
    assert checkpoint.load_latest(tmp_path).round == 1


def test_schedule_checkpoints_every_n_rounds_but_the_final_one():
    """is_due: every=5 -> 5, 10, ...; the final round is left to the end of the run; every=0: never."""
    assert [r for r in range(1, 16) if checkpoint.is_due(r, every=5)] == [5, 10, 15]
    assert not checkpoint.is_due(10, every=5, final=True)
    assert not any(checkpoint.is_due(r, every=0) for r in range(1, 10))


@pytest.mark.parametrize("defer", [False, True])
def test_first_format_checkpoints_still_load(tmp_path, defer):
    """{"averager": snapshot} (the first format): the state and the history keys are split apart."""
    folder = tmp_path / checkpoint.folder_name(3)
    folder.mkdir()
    snapshot = {
        "round": 3,
        "params": {"w": torch.ones(2)},
        "optimizer_state": None,
        "batch_size": 4,
        "adaptive_state": {"size": 4},
        "validation_due": None,
        "dropped_log": (),
        "batch_size_history": ({"round": 3, "batch_size": 4},),
        "validation_history": (),
        "position": None,
        "loss_history": (),
        "elapsed_s": 3.0,
    }
    torch.save({"averager": snapshot, "config": {"data": {}}}, folder / checkpoint.STATE_FILE)
    loaded = checkpoint.load(folder, defer_tensors=defer)
    assert (loaded.state.round, loaded.state.batch_size, loaded.state.source) == (3, 4, "checkpoint")
    assert isinstance(loaded.state.params, dict) and torch.equal(loaded.state.params["w"], torch.ones(2))
    assert loaded.history["batch_size_history"] == ({"round": 3, "batch_size": 4},)
    assert loaded.config == {"data": {}} and loaded.position is None


def test_deferred_tensors_are_read_once_on_first_use_and_pickle_as_the_plain_dict(tmp_path):
    folder = checkpoint.save(tmp_path / checkpoint.folder_name(5), state=_state(5, 2.5))
    deferred = checkpoint.load(folder, defer_tensors=True).state
    params = deferred.params
    assert len(params) == 2 and "w" in params  # the keys, known before the tensors
    assert torch.equal(params["w"], torch.full((3,), 2.5)) and params.loaded
    assert params.load() is params.load()  # read once
    assert deferred.optimizer_state.load()[0]["step"] == 5.0  # the same read: both fields of one file
    copy = pickle.loads(pickle.dumps(params))
    assert (
        type(copy) is dict and torch.equal(copy["w"], params["w"]) and torch.equal(copy["n"], torch.tensor(5))
    )


def test_a_deferred_load_reads_all_but_the_tensors_without_torch(tmp_path):
    """In a process where torch does not import, the round, the plain fields and the tensors' keys load."""
    history = {"validation_due": 5, "loss_history": [{"round": 5, "loss": 0.25, "time_s": 1.0}]}
    folder = checkpoint.save(tmp_path / checkpoint.folder_name(5), state=_state(5), history=history)
    code = textwrap.dedent(
        """
        import importlib.abc, json, sys
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] == "torch":
                    raise ImportError("no torch in this process")
        sys.meta_path.insert(0, NoTorch())
        from raytrain_seq import checkpoint
        found = checkpoint.load(sys.argv[1], defer_tensors=True)
        state = found.state
        print(json.dumps([state.round, state.batch_size, state.adaptive_state, state.elapsed_s,
                          list(state.params), list(state.optimizer_state), found.history, found.position]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    round_, batch, adaptive, elapsed, keys, moments, loaded_history, position = json.loads(out.stdout)
    assert (round_, batch, adaptive, elapsed) == (5, 8, {"size": 8, "best": 0.5}, 12.5)
    assert keys == ["w", "n"] and moments == [0] and loaded_history == history and position["round"] == 5


def test_a_file_with_tensors_outside_the_state_loads_whole_when_deferred(tmp_path):
    """The reader without torch takes only files whose tensors are the state's params and moments."""
    folder = checkpoint.save(
        tmp_path / checkpoint.folder_name(2), state=_state(2), history={"odd": torch.ones(2)}
    )
    loaded = checkpoint.load(folder, defer_tensors=True)
    assert isinstance(loaded.state.params, dict) and torch.equal(loaded.history["odd"], torch.ones(2))


def test_averaged_state_refuses_what_it_cannot_be():
    """A round without params, an unknown source or field, a batch size < 1: clear errors."""
    with pytest.raises(ValueError, match="round 2 has no params"):
        AveragedState(round=2, batch_size=4)
    with pytest.raises(ValueError, match="source"):
        AveragedState(batch_size=4, source="disk")
    with pytest.raises(ValueError, match="batch_size"):
        AveragedState(batch_size=0)
    with pytest.raises(ValueError, match=r"unknown averaged-state fields \['colour'\]"):
        AveragedState.from_dict({"batch_size": 4, "colour": "red"})
    assert AveragedState(batch_size=4).empty and not _state(1).empty


def test_check_writable_names_a_folder_that_a_file_blocks_and_leaves_a_good_one_as_it_was(tmp_path):
    """Issue 16: the probe before a checkpoint report. A file where the folder must go is refused with a
    CheckpointError naming the folder and the fix; a writable place is left without a trace."""
    from raytrain_seq.checkpoint import CheckpointError, check_writable, folder_name

    good = tmp_path / folder_name(4)
    check_writable(good)
    assert not good.exists()  # the probe removed the folder it made: Ray Train's copy finds it absent
    blocked = tmp_path / folder_name(8)
    blocked.write_text("a file, not a folder")
    with pytest.raises(CheckpointError, match=r"checkpoint_round_000008.*storage path.*--resume"):
        check_writable(blocked)
    assert blocked.read_text() == "a file, not a folder"


def test_stopped_error_gives_rank_zeros_message_or_names_the_run_folder(tmp_path):
    from raytrain_seq.checkpoint import stopped_error
    from raytrain_seq.outputs.reports import LearnerStop

    assert str(tmp_path) in str(stopped_error(tmp_path)) and "--resume" in str(stopped_error(tmp_path))
    stop = LearnerStop(reason="checkpoint", message="cannot write checkpoint X: free space")
    assert str(stopped_error(tmp_path, stop.message)) == "cannot write checkpoint X: free space"
    with pytest.raises(ValueError, match=r"LearnerStop\.reason"):
        LearnerStop(reason="tired", message="x")


def test_put_places_a_saved_folder_whole_under_its_round_or_names_the_folder_it_cannot_write(tmp_path):
    """The final checkpoint's path (rank 0 writes it without Ray Train): the saved folder appears under
    its round's name and loads, no hidden partial folder is left behind; a file where the folder must go
    raises CheckpointError naming the folder and the fix, and the earlier checkpoint still loads."""
    from raytrain_seq.checkpoint import CheckpointError, folder_name, load, load_latest, put, save

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = save(tmp_path / "made", state=_state(4), position={"epoch": 2})
    placed = put(saved, run_dir, 4)
    assert placed == run_dir / folder_name(4) and load(placed).round == 4
    assert sorted(p.name for p in run_dir.iterdir()) == [folder_name(4)]  # no .partial left
    (run_dir / folder_name(6)).write_text("a file where a checkpoint folder must go")
    with pytest.raises(CheckpointError, match=r"checkpoint_round_000006.*storage path"):
        put(save(tmp_path / "made6", state=_state(6)), run_dir, 6)
    assert load_latest(run_dir).round == 4


# ---- retention: the newest N and the best by validation accuracy ------------------------------------


@pytest.mark.parametrize(
    ("rounds", "keep", "scores", "expected"),
    [
        # the docstring's example: newest 2 (6, 5) and the best (2)
        (range(1, 7), 2, {1: 0.5, 2: 0.7, 3: 0.6, 4: 0.65, 5: 0.62}, {6, 5, 2}),
        # the best is among the newest: only the newest stay
        (range(1, 7), 2, {1: 0.5, 2: 0.6, 3: 0.6, 4: 0.6, 5: 0.9, 6: 0.8}, {6, 5}),
        # rounds past the last scored one may still be scored: they stay
        (range(1, 9), 1, {1: 0.9, 2: 0.5, 3: 0.5}, {1, 4, 5, 6, 7, 8}),
        # equal scores: the earliest of them is the best (it got there first)
        (range(1, 6), 1, {1: 0.4, 2: 0.8, 3: 0.8, 4: 0.8, 5: 0.1}, {5, 2}),
        # nothing scored yet: nothing is known to be worse, everything stays
        (range(1, 5), 1, {}, {1, 2, 3, 4}),
        # scores of rounds that have no folder (not checkpoint rounds) count only where a folder is
        ([5, 10, 15], 1, {4: 0.99, 5: 0.5, 10: 0.7, 15: 0.6, 16: 0.1}, {15, 10}),
    ],
)
def test_kept_is_the_newest_n_the_best_and_the_unscored_newer(rounds, keep, scores, expected):
    assert checkpoint.kept(list(rounds), keep, scores) == expected


def _history(scores: dict[int, float]) -> dict:
    return {"validation_history": [{"round": r, "accuracy": a} for r, a in scores.items()]}


def test_put_with_keep_prunes_a_run_folder_to_the_newest_and_the_best(tmp_path):
    """Ten rounds put one by one with keep=2, validation one round behind (the evaluator's lag): at the
    end the newest two and the best stay, every one of them loads, nothing hidden is left; load_latest
    (resume, --init-from, export, predict) returns the newest."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    accuracy = {1: 0.3, 2: 0.5, 3: 0.8, 4: 0.6, 5: 0.7, 6: 0.65, 7: 0.7, 8: 0.75, 9: 0.7}
    for r in range(1, 11):
        known = {k: v for k, v in accuracy.items() if k < r}  # round r's own score comes later
        saved = checkpoint.save(tmp_path / f"made{r}", state=_state(r), history=_history(known))
        checkpoint.put(saved, run_dir, r, keep=2)
        assert len(checkpoint.candidates(run_dir)) <= 4  # never more than newest 2, best, one pending
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == [checkpoint.folder_name(r) for r in (3, 9, 10)]
    assert all(checkpoint.load(run_dir / n).round == int(n[-6:]) for n in names)
    assert checkpoint.load_latest(run_dir).round == 10
    assert (run_dir / checkpoint.folder_name(10) / checkpoint.VALIDATION_FILE).is_file()


def test_retain_without_scores_keeps_the_newest_and_without_keep_keeps_all(tmp_path):
    """Checkpoints of before the scores file (no validation.json): nothing is known, nothing older than
    the newest N goes unless scored; put without keep never removes anything."""
    run_dir = tmp_path / "run"
    for r in range(1, 5):
        checkpoint.put(checkpoint.save(tmp_path / f"m{r}", state=_state(r)), run_dir, r)
    assert len(checkpoint.candidates(run_dir)) == 4
    (run_dir / checkpoint.folder_name(4) / checkpoint.VALIDATION_FILE).unlink()
    assert checkpoint.retain(run_dir, 2) == []  # no scores: every round stays
    saved = checkpoint.save(
        tmp_path / "m5", state=_state(5), history=_history({1: 0.2, 2: 0.9, 3: 0.1, 4: 0.3})
    )
    checkpoint.put(saved, run_dir, 5, keep=1)
    assert [p.name for p in checkpoint.candidates(run_dir)] == [
        checkpoint.folder_name(5),
        checkpoint.folder_name(2),
    ]


def test_put_of_a_round_already_there_replaces_it_whole(tmp_path):
    """A resumed run redoes the round after the newest that loads: its folder (which did not load) is
    replaced by the new one, not merged into it or refused."""
    run_dir = tmp_path / "run"
    broken = run_dir / checkpoint.folder_name(3)
    broken.mkdir(parents=True)
    (broken / checkpoint.STATE_FILE).write_bytes(b"PK half a zip")
    (broken / "stray.txt").write_text("left by the crashed attempt")
    checkpoint.put(checkpoint.save(tmp_path / "m3", state=_state(3)), run_dir, 3)
    assert checkpoint.load(broken).round == 3 and not (broken / "stray.txt").exists()
    assert sorted(p.name for p in run_dir.iterdir()) == [checkpoint.folder_name(3)]


def test_the_learners_report_puts_the_folder_and_prunes_and_a_failed_put_raises(tmp_path):
    """runtime.fleet's report at a checkpoint round: rank 0 puts the saved folder into the run folder with
    the run's keep (so older ones are pruned); the others hand no folder and put nothing; a folder it
    cannot put raises CheckpointError in that learner (its process returns a LearnerStop)."""
    from raytrain_seq.outputs.reports import RoundMetrics
    from raytrain_seq.runtime.fleet import put_checkpoint

    run_dir = tmp_path / "run"
    scores = {1: 0.9, 2: 0.1, 3: 0.2}
    for r in range(1, 5):
        saved = checkpoint.save(
            tmp_path / f"m{r}", state=_state(r), history=_history({k: v for k, v in scores.items() if k < r})
        )
        put_checkpoint(RoundMetrics(round=r, epoch=0, batch_size=4), saved, run_dir=run_dir, keep=1)
        put_checkpoint(RoundMetrics(round=r, epoch=0, batch_size=4), None, run_dir=run_dir, keep=1)
    assert [p.name for p in checkpoint.candidates(run_dir)] == [
        checkpoint.folder_name(4),
        checkpoint.folder_name(1),  # the best
    ]
    (run_dir / checkpoint.folder_name(5)).write_text("a file where the folder must go")
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint_round_000005"):
        put_checkpoint(RoundMetrics(round=5, epoch=0, batch_size=4), saved, run_dir=run_dir, keep=1)


def test_a_run_whose_checkpoints_ray_train_listed_keeps_them_all(tmp_path):
    """A run begun before the learners put their own checkpoints has Ray Train's list of them in its
    folder; Ray Train refuses to resume it once a listed folder is gone, so nothing is pruned there."""
    run_dir = tmp_path / "run"
    for r in range(1, 4):
        checkpoint.put(checkpoint.save(tmp_path / f"m{r}", state=_state(r)), run_dir, r)
    (run_dir / "checkpoint_manager_snapshot.json").write_text("{}")
    saved = checkpoint.save(tmp_path / "m4", state=_state(4), history=_history({1: 0.9, 2: 0.1, 3: 0.2}))
    checkpoint.put(saved, run_dir, 4, keep=1)
    assert len(checkpoint.candidates(run_dir)) == 4
