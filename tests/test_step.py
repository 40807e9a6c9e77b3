"""The learner's inner step without Ray: micro-batched update == one full-batch update, evaluation counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raytrain_seq.algorithms.averaging import merge_adam_states
from raytrain_seq.models import build_model, predict, sequence_loss
from raytrain_seq.training.eval_rows import EvalRows
from raytrain_seq.training.evaluation import EvalResult, eval_micro_batch_size, evaluate
from raytrain_seq.training.staging import collate_rows, collate_stream
from raytrain_seq.training.step import InnerStep, LearningRate, build_optimizer, load_averaged, useful_frames

T_MAX, SIZE, SLOTS, CLASSES = 24, 8, 3, 4


def _row(rng: np.random.Generator, lengths: list[int]) -> dict[str, np.ndarray]:
    """A block row with sequences of ``lengths`` laid end to end (lengths [5, 7] -> starts [0, 5])."""
    frames = np.zeros((T_MAX, SIZE, SIZE, 3), dtype=np.uint8)
    used = sum(lengths)
    frames[:used] = rng.integers(0, 256, size=(used, SIZE, SIZE, 3), dtype=np.uint8)
    pad = SLOTS - len(lengths)
    starts = np.cumsum([0, *lengths])[:-1]
    return {
        "frames": frames,
        "starts": np.array([*starts, *[-1] * pad], dtype=np.int64),
        "lengths": np.array([*lengths, *[-1] * pad], dtype=np.int64),
        "labels": np.array([*rng.integers(0, CLASSES, len(lengths)), *[-1] * pad], dtype=np.int64),
        "num_sequences": np.array(len(lengths), dtype=np.int64),
    }


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    layouts = [[5, 7], [], [3, 3, 9], [12], [4, 4], [], [10, 6, 2]]
    return collate_rows([_row(rng, lengths) for lengths in layouts])


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(CLASSES, width=8, depth=2, hidden=16).double()


def test_collate_rows_stacks_and_counts_useful_frames():
    """Rows stack on a first dim; useful frames exclude padding and filler rows."""
    batch = _batch()
    assert batch["frames"].shape == (7, T_MAX, SIZE, SIZE, 3)
    assert batch["frames"].dtype == torch.uint8
    assert batch["num_sequences"].tolist() == [2, 0, 3, 1, 2, 0, 3]
    assert useful_frames(batch) == 5 + 7 + 3 + 3 + 9 + 12 + 4 + 4 + 10 + 6 + 2
    with pytest.raises(ValueError, match="no rows"):
        collate_rows([])


@pytest.mark.parametrize("micro_batch_size", [1, 3, 7, 100])
def test_inner_step_equals_one_full_batch_adam_step(micro_batch_size):
    """After one step, parameters equal those of one Adam step on the full-batch mean loss (float64)."""
    batch = _batch()
    streamed, reference = _model(), _model()
    step = InnerStep(
        streamed, build_optimizer("adam", streamed.parameters(), lr=1e-2), micro_batch_size=micro_batch_size
    )
    stats = step(batch)

    ref_opt = build_optimizer("adam", reference.parameters(), lr=1e-2)
    logits = reference(batch["frames"], batch["starts"], batch["lengths"], batch["num_sequences"])
    labels = torch.cat(
        [row[: int(n)] for row, n in zip(batch["labels"], batch["num_sequences"], strict=True)]
    )
    loss = torch.nn.functional.cross_entropy(logits, labels)
    ref_opt.zero_grad()
    loss.backward()
    ref_opt.step()

    assert stats.sequences == 11
    assert stats.loss == pytest.approx(float(loss.detach()), rel=1e-12)
    moved = 0.0
    for (name, a), b, start in zip(
        streamed.named_parameters(), reference.parameters(), _model().parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=name)
        moved = max(moved, float((a - start).detach().abs().max()))
    assert moved > 1e-4, "the step must actually move the parameters for the comparison to mean anything"


def _filler_batch() -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(1)
    return collate_rows([_row(rng, []), _row(rng, [])])


def _snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list, dict]:
    weights = [param.detach().clone() for param in model.parameters()]
    state = {
        index: {key: value.clone() for key, value in entry.items()}
        for index, entry in optimizer.state_dict()["state"].items()
    }
    return weights, state


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("adam", {}),
        ("adam", {"weight_decay": 0.1}),
        ("adamw", {"weight_decay": 0.1}),
        ("adam", {"amsgrad": True}),
    ],
)
def test_filler_only_step_counts_a_step_and_changes_no_weight_nor_moment(name, options):
    """After a real step, a filler-only mini-batch adds 1 to Adam's step and leaves everything else as it was.

    The case is not trivial: the same optimizer's own step on that zero gradient moves the weights (by
    about lr, since m / (sqrt(v) + eps) is not zero after a real step).
    """
    model = _model()
    options = dict(options)
    amsgrad = options.pop("amsgrad", False)
    optimizer = build_optimizer(name, model.parameters(), lr=1e-2, **options)
    if amsgrad:
        optimizer.param_groups[0]["amsgrad"] = True
    step = InnerStep(model, optimizer, micro_batch_size=3)
    step(_batch(3))
    weights, state = _snapshot(model, optimizer)

    stats = step(_filler_batch())

    assert (stats.sequences, stats.frames, stats.loss) == (0, 0, 0.0)
    for param, before in zip(model.parameters(), weights, strict=True):
        assert torch.equal(param.detach(), before)
    after = optimizer.state_dict()["state"]
    assert after.keys() == state.keys() and after
    for index, entry in after.items():
        assert entry.keys() == state[index].keys()
        assert float(entry["step"]) == float(state[index]["step"]) + 1 == 2.0
        for key in entry.keys() - {"step"}:
            assert torch.equal(entry[key], state[index][key]), (index, key)
    if amsgrad:
        assert all("max_exp_avg_sq" in entry for entry in after.values())

    optimizer.step()  # what InnerStep used to do on a filler-only batch
    moved = max(float((p.detach() - w).abs().max()) for p, w in zip(model.parameters(), weights, strict=True))
    assert moved > 1e-3, moved


@pytest.mark.parametrize(
    ("name", "options"), [("adam", {"weight_decay": 0.1}), ("adamw", {"weight_decay": 0.1})]
)
def test_filler_only_first_step_creates_the_state_a_real_step_creates(name, options):
    """A learner whose first mini-batch is all filler: same state keys as its peer, zero moments, step 1, no move."""
    filler_model, real_model = _model(), _model()
    filler_opt = build_optimizer(name, filler_model.parameters(), lr=1e-2, **options)
    real_opt = build_optimizer(name, real_model.parameters(), lr=1e-2, **options)
    InnerStep(filler_model, filler_opt, micro_batch_size=2)(_filler_batch())
    InnerStep(real_model, real_opt, micro_batch_size=2)(_batch(3))

    for param, start in zip(filler_model.parameters(), _model().parameters(), strict=True):
        assert torch.equal(param.detach(), start.detach())
    assert filler_opt.param_groups[0]["weight_decay"] == 0.1  # switched off for the one call only
    filler_state = filler_opt.state_dict()["state"]
    real_state = real_opt.state_dict()["state"]
    assert filler_state.keys() == real_state.keys() and filler_state
    for index, entry in filler_state.items():
        assert entry.keys() == real_state[index].keys()
        assert float(entry["step"]) == 1.0
        assert all(not entry[key].any() for key in entry.keys() - {"step"})
    merged = merge_adam_states([filler_state, real_state])
    assert all(float(entry["step"]) == 1.0 for entry in merged.values())


def test_learner_with_a_filler_only_step_still_merges_with_its_peer():
    """Two learners, one of which draws an all-filler mini-batch on its second step, then merge.

    The merge succeeds (equal steps), and the filler learner's moments are those of its first step.
    """
    real = [_batch(3), _batch(3)]
    states = []
    for batches in ([real[0], real[1]], [real[0], _filler_batch()]):
        model = _model()
        optimizer = build_optimizer("adam", model.parameters(), lr=1e-2)
        step = InnerStep(model, optimizer, micro_batch_size=2)
        step(batches[0])
        after_first = _snapshot(model, optimizer)[1]
        step(batches[1])
        states.append(optimizer.state_dict()["state"])
    steps = {float(entry["step"]) for state in states for entry in state.values()}
    assert steps == {2.0}, steps
    first = next(iter(states[1]))
    assert not torch.equal(
        states[0][first]["exp_avg"], states[1][first]["exp_avg"]
    )  # the case is not trivial
    assert torch.equal(states[1][first]["exp_avg"], after_first[first]["exp_avg"])
    merged = merge_adam_states(states)
    assert float(merged[first]["step"]) == 2.0


def test_filler_only_step_with_sgd_moves_nothing():
    """SGD keeps no step counter: a filler-only mini-batch leaves weights and momentum as they were."""
    model = _model()
    optimizer = build_optimizer("sgd", model.parameters(), lr=1e-1, weight_decay=0.1)
    step = InnerStep(model, optimizer, micro_batch_size=4)
    step(_batch(3))
    weights, state = _snapshot(model, optimizer)
    step(_filler_batch())
    for param, before in zip(model.parameters(), weights, strict=True):
        assert torch.equal(param.detach(), before)
    after = optimizer.state_dict()["state"]
    assert after.keys() == state.keys() and after
    for index, entry in after.items():
        assert torch.equal(entry["momentum_buffer"], state[index]["momentum_buffer"])


def test_evaluate_counts_every_real_sequence_once():
    """Accuracy, loss and per-class tallies cover each real sequence exactly once, in any chunking."""
    batch = _batch(3)
    model = _model()
    results = [evaluate(model, [batch], micro_batch_size=size) for size in (1, 2, 7)]
    logits = model(batch["frames"], batch["starts"], batch["lengths"], batch["num_sequences"]).detach()
    labels = torch.cat(
        [row[: int(n)] for row, n in zip(batch["labels"], batch["num_sequences"], strict=True)]
    )
    expected = float((logits.argmax(1) == labels).double().mean())
    for result in results:
        assert result.sequences == 11
        assert result.accuracy == pytest.approx(expected)
        assert sum(total for _, total in result.per_class.values()) == 11
        assert sum(correct for correct, _ in result.per_class.values()) == round(expected * 11)
    assert evaluate(model, []).sequences == 0


def test_collate_stream_keeps_every_row_in_batches_without_the_crop_draws():
    """40 rows taken 16 at a time: batches of 16, 16 and 8, in order, the crop draws dropped."""

    class Stream:
        def __init__(self) -> None:
            self.left = np.arange(40)

        def take(self, n: int):
            if not len(self.left):
                return None
            part, self.left = self.left[:n], self.left[n:]
            return {"block": part, "tops": part, "lefts": part, "flips": part % 2}

    batches = collate_stream(Stream())
    assert [len(b["block"]) for b in batches] == [16, 16, 8]
    assert torch.equal(torch.cat([b["block"] for b in batches]), torch.arange(40))
    assert all(set(b) == {"block"} for b in batches)


class _SplitFeed:
    """A feed whose ``eval_rows(split, rank, world)`` streams that share's row numbers (``rank::world``
    of 40) and records each call; ``fail`` makes the next call's stream raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, bool]] = []
        self.fail = False

    def eval_rows(self, split: str, rank: int, world: int, *, uncropped: bool):
        self.calls.append((split, rank, world, uncropped))
        left, fail = np.arange(40)[rank::world], self.fail

        class Stream:
            def take(self, n: int):
                nonlocal left
                if fail:
                    raise OSError("the feed is gone")
                if not len(left):
                    return None
                part, left = left[:n], left[n:]
                return {"block": part}

        return Stream()


def test_eval_rows_hold_a_share_take_the_thread_s_rows_and_collect_a_new_share_anew():
    """A share is collected once (ahead on a thread, or now) and held; another share (a group change) is
    collected anew, a thread started for an old share is not used for it; the test split alone is
    uncropped; a thread's error reaches ``rows``."""
    feed, marks = _SplitFeed(), {}
    held = EvalRows(feed, uncropped=lambda split: split == "test", marks=marks)
    held.ahead("test", (1, 2))
    assert held.pending("test")
    first = held.rows("test", (1, 2))
    assert not held.pending("test") and held.rows("test", (1, 2)) is first
    assert torch.equal(torch.cat([b["block"] for b in first]), torch.arange(1, 40, 2))
    assert feed.calls == [("test", 1, 2, True)] and "test_rows" in marks
    held.ahead("val", (0, 2))
    regrouped = held.rows("val", (0, 3))  # the group changed after the thread started
    assert torch.equal(torch.cat([b["block"] for b in regrouped]), torch.arange(0, 40, 3))
    assert ("val", 0, 3, False) in feed.calls
    held.free("test")
    feed.fail = True
    held.ahead("test", (1, 2))
    with pytest.raises(OSError, match="the feed is gone"):
        held.rows("test", (1, 2))


def test_scoring_uses_the_training_micro_batch():
    """Scoring runs at the training micro-batch (a fixed 4 rows under "auto"), not a multiple of it: the
    frame encoder's activations of larger micro-batches fall out of a CPU's caches (docs/LOG.md)."""
    assert [eval_micro_batch_size(size) for size in (1, 3, 16, "auto")] == [1, 3, 16, 4]


def test_evaluate_top5_mean_class_confusion_and_combine_of_shards():
    """Top-5 against an independent topk, mean class accuracy as the mean of per-class rates, the
    confusion matrix's cells sum to the sequences, and combining two shards' results equals scoring all."""
    torch.manual_seed(3)
    model = build_model(8, width=8, depth=2, hidden=16).double()
    batch = _batch(4)
    real = batch["labels"] >= 0
    batch["labels"][real] = torch.randint(0, 8, (int(real.sum()),))  # 8 classes: top-5 is not everything
    whole = evaluate(model, [batch], micro_batch_size=3)
    logits = model(batch["frames"], batch["starts"], batch["lengths"], batch["num_sequences"]).detach()
    labels = torch.cat(
        [row[: int(n)] for row, n in zip(batch["labels"], batch["num_sequences"], strict=True)]
    )
    top5 = int((logits.topk(5, dim=1).indices == labels[:, None]).any(1).sum())
    assert whole.top5_correct == top5 and whole.top5_accuracy == pytest.approx(top5 / 11)
    assert whole.top5_correct >= round(whole.accuracy * 11)  # a top-1 hit is a top-5 hit
    rates = [c / t for c, t in whole.per_class.values()]
    assert whole.mean_class_accuracy == pytest.approx(sum(rates) / len(rates))
    assert sum(whole.confusion.values()) == 11
    assert sum(n for (truth, guess), n in whole.confusion.items() if truth == guess) == round(
        whole.accuracy * 11
    )
    halves = [{k: v[:3] for k, v in batch.items()}, {k: v[3:] for k, v in batch.items()}]
    combined = EvalResult.combine(evaluate(model, [half]) for half in halves)
    assert combined.sequences == whole.sequences and combined.per_class == whole.per_class
    assert combined.confusion == whole.confusion and combined.top5_correct == whole.top5_correct
    assert combined.accuracy == pytest.approx(whole.accuracy) and combined.loss == pytest.approx(whole.loss)


def test_load_averaged_installs_weights_and_moments_but_keeps_hyperparameters():
    """Averaged params and merged Adam state replace the learner's; its learning rate stays."""
    batch = _batch()
    donor, learner = _model(), _model()
    donor_opt = build_optimizer("adam", donor.parameters(), lr=1e-2)
    InnerStep(donor, donor_opt, micro_batch_size=4)(batch)
    learner_opt = build_optimizer("adam", learner.parameters(), lr=3e-4)
    load_averaged(learner, learner_opt, donor.state_dict(), donor_opt.state_dict()["state"])
    for key, value in learner.state_dict().items():
        assert torch.equal(value, donor.state_dict()[key])
    assert learner_opt.param_groups[0]["lr"] == 3e-4
    merged = learner_opt.state_dict()["state"]
    assert merged and all(float(entry["step"]) == 1 for entry in merged.values())
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer("lamb", learner.parameters(), lr=1.0)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_stay_exact_across_micro_batches(precision):
    """Autocast steps: the gradient (fp16: unscaled by the GradScaler) is the same for micro-batches of 1,
    3 and 7 rows, close to the fp32 gradient, and the step count advances once per step."""
    grads = {}
    for micro in (1, 3, 7):
        torch.manual_seed(0)
        model = build_model(CLASSES, width=8, depth=2, hidden=16)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        step = InnerStep(model, optimizer, micro_batch_size=micro, precision=precision)
        # Capture the gradient the optimizer sees (after the scaler's unscale_).
        seen = {}
        original = optimizer.step

        def capture(*args, _seen=seen, _model=model, _original=original, **kwargs):
            _seen.update({n: p.grad.clone() for n, p in _model.named_parameters()})
            return _original(*args, **kwargs)

        optimizer.step = capture
        stats = step(_batch(5))
        assert math.isfinite(stats.loss) and stats.sequences == 11
        grads[micro] = seen
        assert all(int(s["step"]) == 1 for s in optimizer.state.values())
    torch.manual_seed(0)
    reference = build_model(CLASSES, width=8, depth=2, hidden=16)
    InnerStep(reference, torch.optim.SGD(reference.parameters(), lr=0.0), micro_batch_size=7)(_batch(5))
    # Regrouping the rows changes the order of low-precision roundings, so the gradients agree to a few
    # units of the dtype's rounding, measured on the whole tensor: elementwise, a gradient that is a
    # near-cancelling sum differs by more, and by how much depends on the CPU's bf16 kernels (docs/LOG.md,
    # 2026-11-24, last). A micro-batch left out is off by far more (the same LOG entry).
    eps = torch.finfo(torch.bfloat16 if precision == "bf16" else torch.float16).eps
    for name, param in reference.named_parameters():
        for micro in (1, 3):
            full = grads[7][name]
            assert full.norm() > 0, name  # a zero gradient would make the comparison vacuous
            assert (grads[micro][name] - full).norm() <= 4 * eps * full.norm(), (name, micro)
        # Low precision forward: close to fp32, not equal (bf16 keeps 8 bits of mantissa).
        assert torch.allclose(grads[7][name], param.grad, rtol=0.1, atol=2e-2), name


def test_an_overflowing_fp16_step_is_skipped_but_counted():
    """The scaler skips a step whose gradient is inf; the step count still advances (learners in lockstep)."""
    torch.manual_seed(0)
    model = build_model(CLASSES, width=8, depth=2, hidden=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    overflow = False

    def loss_fn(m, mb):
        loss_sum, count = sequence_loss(m, mb)
        return (loss_sum * float("inf") if overflow else loss_sum), count

    step = InnerStep(model, optimizer, micro_batch_size=4, precision="fp16", loss_fn=loss_fn)
    step(_batch(1))
    assert step.skipped == 0
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    overflow = True  # the second step's gradient is inf
    step(_batch(2))
    assert step.skipped == 1
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # nothing moved
    assert all(int(s["step"]) == 2 for s in optimizer.state.values())


def test_learning_rate_warmup_and_cosine():
    """Linear warm-up over the first steps, then constant or a cosine over the run's progress."""
    constant = LearningRate(1e-3)
    assert constant.at(1, 0.0) == constant.at(500, 0.9) == 1e-3
    cosine = LearningRate(1e-3, "cosine", warmup_steps=100)
    assert cosine.at(25, 0.0) == pytest.approx(2.5e-4)
    assert cosine.at(200, 0.5) == pytest.approx(5e-4) and cosine.at(300, 1.0) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="lr schedule"):
        LearningRate(1e-3, "step")
    torch.manual_seed(0)
    model = build_model(CLASSES, width=8, depth=2, hidden=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    step = InnerStep(model, optimizer, micro_batch_size=4, lr=LearningRate(1e-2, "cosine", warmup_steps=2))
    step(_batch(1), progress=0.0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(5e-3)  # step 1 of a 2-step warm-up
    step(_batch(2), progress=0.5)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(5e-3)  # warm-up done, half-way cosine


def test_multi_view_scores_average_the_views_softmax():
    """The centre view of uncropped rows scores exactly as the centre-cropped rows; several views average
    their softmax (checked against scoring each view's crop on its own)."""
    from raytrain_seq.algorithms.augment import center_crop, test_views
    from raytrain_seq.training.evaluation import view_probabilities

    size, crop = 10, 8
    rng = np.random.default_rng(0)
    rows = [_row(rng, lengths) for lengths in ([5, 7], [3, 3, 4], [12])]
    for row in rows:  # uncropped rows: frames of the cached size
        row["frames"] = rng.integers(0, 256, size=(T_MAX, size, size, 3), dtype=np.uint8)
    uncropped = collate_rows(rows)
    cropped = dict(uncropped)
    cropped["frames"] = torch.from_numpy(np.stack([center_crop(r["frames"], crop) for r in rows]))
    model = _model()
    assert test_views("center", size, crop) == [(1, 1, False)]
    center = evaluate(model, [uncropped], views=test_views("center", size, crop), crop=crop)
    plain = evaluate(model, [cropped])
    assert center.per_class == plain.per_class and center.loss == pytest.approx(plain.loss)
    views = test_views("three_crop_flip", size, crop)
    assert len(views) == 6 and {v[2] for v in views} == {False, True} and {v[1] for v in views} == {0, 1, 2}
    probs, labels = view_probabilities(model, uncropped, views, crop=crop)
    by_hand = []
    for top, left, flip in views:
        batch = dict(uncropped)
        frames = uncropped["frames"][:, :, top : top + crop, left : left + crop]
        batch["frames"] = frames.flip(3) if flip else frames
        logits, _ = predict(model, batch)
        by_hand.append(torch.softmax(logits.float(), 1))
    torch.testing.assert_close(probs, torch.stack(by_hand).mean(0))
    assert labels.numel() == 6
    with pytest.raises(ValueError, match="test views"):
        test_views("five_crop", size, crop)
    assert len(test_views("ten_crop", size, crop)) == 10


# ----------------------------------------------------------------------- micro-batches streamed from host
CACHE = 11  # uncropped training rows at the cache size; the crop (SIZE) is cut per micro-batch


def _uncropped(seed: int = 0) -> dict[str, np.ndarray]:
    """Training rows as the learner's row stream makes them: frames at the cache size, uncropped, and
    each sequence's seeded crop draws (0 past the row's real sequences)."""
    rng = np.random.default_rng(seed)
    layouts = [[5, 7], [], [3, 3, 9], [12], [4, 4], [], [10, 6, 2]]
    rows = []
    for lengths in layouts:
        row = _row(rng, lengths)
        frames = np.zeros((T_MAX, CACHE, CACHE, 3), dtype=np.uint8)
        frames[: sum(lengths)] = rng.integers(1, 256, (sum(lengths), CACHE, CACHE, 3), dtype=np.uint8)
        k, pad = len(lengths), SLOTS - len(lengths)
        draws = {
            key: np.array([*rng.integers(0, high, k), *[0] * pad], dtype=np.int64)
            for key, high in (("tops", CACHE - SIZE + 1), ("lefts", CACHE - SIZE + 1), ("flips", 2))
        }
        rows.append({**row, "frames": frames, **draws})
    return {key: np.stack([row[key] for row in rows]) for key in rows[0]}


@pytest.mark.parametrize("micro_batch_size", [1, 2, 3])
def test_streamed_micro_batches_cropped_on_the_device_equal_the_whole_staged_batch(micro_batch_size):
    """The learner's layout: the mini-batch stays in host memory and each micro-batch is copied to the
    device and cropped there (``MicroBatchStage``). One step equals, in float64, the step on the whole
    mini-batch staged and cropped at once (``stage_rows``, one micro-batch): the same frames reach the
    model and the gradient is exactly the full-batch one."""
    from raytrain_seq.training.staging import MicroBatchStage, host_rows, stage_rows

    rows = _uncropped()
    streamed, whole = _model(), _model()
    stage = MicroBatchStage("cpu", crop=SIZE, flow=False)
    step = InnerStep(
        streamed, build_optimizer("adam", streamed.parameters(), lr=1e-2),
        micro_batch_size=micro_batch_size, stage=stage,
    )  # fmt: skip
    got = step(host_rows(rows, pin=False))
    reference = InnerStep(whole, build_optimizer("adam", whole.parameters(), lr=1e-2), micro_batch_size=100)
    want = reference(stage_rows(rows, "cpu", crop=SIZE, flow=False))
    assert got.loss == pytest.approx(want.loss, rel=1e-12) and got.sequences == want.sequences == 11
    moved = 0.0
    for (name, a), b, start in zip(
        streamed.named_parameters(), whole.parameters(), _model().parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=name)
        moved = max(moved, float((a - start).detach().abs().max()))
    assert moved > 1e-4  # not vacuous: the step moved the weights


def test_no_more_than_two_micro_batches_of_input_are_on_the_device_at_once():
    """A counting stage stands in for the device: every micro-batch it hands out is counted while it is
    alive. Over a mini-batch of 7 micro-batches at most two exist at once (the one computing and the
    next, staged ahead) and two do at some point (the prefetch really runs ahead)."""
    import gc
    import weakref

    from raytrain_seq.training.staging import MicroBatchStage, host_rows

    live, peak, staged = [0], [0], []
    stage = MicroBatchStage("cpu", crop=SIZE, flow=False)

    def counting(part):
        out = stage(part)
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        staged.append(int(part["frames"].shape[0]))

        def gone() -> None:
            live[0] -= 1

        weakref.finalize(out["frames"], gone)
        return out

    model = _model()
    step = InnerStep(
        model, build_optimizer("adam", model.parameters(), lr=1e-2), micro_batch_size=1, stage=counting
    )
    step(host_rows(_uncropped(), pin=False))
    gc.collect()
    assert staged == [1] * 7 and peak[0] == 2 and live[0] == 0


def test_an_out_of_memory_while_staging_halves_the_micro_batch_and_stays_exact():
    """``micro_batch_size="auto"`` probes with the streamed layout: an out-of-memory raised while a
    micro-batch is staged (copied or cropped on the device) is handled like one in the step: the size is
    halved, the mini-batch restarted, and the update is still exactly the full-batch one."""
    from raytrain_seq.training.staging import MicroBatchStage, host_rows, stage_rows

    rows = _uncropped(seed=4)
    stage, sizes = MicroBatchStage("cpu", crop=SIZE, flow=False), []

    def tight(part):
        sizes.append(int(part["frames"].shape[0]))
        if sizes[-1] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected while staging)")
        return stage(part)

    streamed, whole = _model(), _model()
    step = InnerStep(
        streamed, build_optimizer("adam", streamed.parameters(), lr=1e-2), micro_batch_size="auto",
        stage=tight,
    )  # fmt: skip
    step(host_rows(rows, pin=False))
    assert sizes == [7, 4, 2, 2, 2, 1]  # 7 -> 4 -> 2 fits: rows 0-1, 2-3, 4-5, 6
    reference = InnerStep(whole, build_optimizer("adam", whole.parameters(), lr=1e-2), micro_batch_size=100)
    reference(stage_rows(rows, "cpu", crop=SIZE, flow=False))
    for (name, a), b in zip(streamed.named_parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=name)


# ------------------------------------------------------------------------------------- side streams
def test_a_learner_stages_every_mini_batch_on_one_side_stream():
    """SideStreams makes a CUDA device's side stream once and hands the same one out after (a stand-in
    factory counts the streams made, so no GPU is needed); InnerStep keeps one SideStreams for all its
    mini-batches and asks it once per mini-batch. A new stream per mini-batch would leave each earlier
    stream's staging blocks reserved (the allocator reuses a block only on its own stream)."""
    from raytrain_seq.algorithms.microbatch import SideStreams
    from raytrain_seq.training.staging import MicroBatchStage, host_rows

    made = []
    streams = SideStreams(factory=lambda device: made.append(device) or f"stream {len(made)}")
    cuda0 = torch.device("cuda", 0)
    assert [streams.get(cuda0) for _ in range(5)] == ["stream 1"] * 5 and made == [cuda0]
    assert streams.get(torch.device("cuda", 1)) == "stream 2" and streams.get(torch.device("cpu")) is None

    asked = []

    class Recording(SideStreams):
        def get(self, device):
            asked.append(device)
            return super().get(device)

    model = _model()
    recording = Recording(factory=lambda device: pytest.fail("a CPU learner made a CUDA stream"))
    step = InnerStep(model, build_optimizer("adam", model.parameters(), lr=1e-2), micro_batch_size=2,
                     stage=MicroBatchStage("cpu", crop=SIZE, flow=False), streams=recording)  # fmt: skip
    for seed in range(3):
        step(host_rows(_uncropped(seed=seed), pin=False))
    assert step.streams is recording and len(asked) == 3


# --------------------------------------------------------------------------------- CUDA comparisons
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@CUDA
@pytest.mark.parametrize("micro_batch_size", [1, 3])
def test_cuda_side_stream_staging_gives_the_whole_batch_gradient(micro_batch_size):
    """On CUDA, the learner's layout (pinned host rows, each micro-batch copied and cropped on the side
    stream) leaves the gradient of the whole mini-batch staged and cropped at once on the CPU, in
    float32 with TF32 off: relative difference of the flattened gradients <= 1e-4 (summation order and
    cuDNN's kernels, not a dropped or doubled micro-batch, which would differ by far more), and the
    same over two mini-batches in a row on the one side stream."""
    from raytrain_seq.training.staging import MicroBatchStage, host_rows, stage_rows

    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    cpu = build_model(CLASSES, width=8, depth=2, hidden=16)
    gpu = build_model(CLASSES, width=8, depth=2, hidden=16).cuda()
    gpu.load_state_dict(cpu.state_dict())
    stage = MicroBatchStage("cuda", crop=SIZE, flow=False)
    step = InnerStep(gpu, torch.optim.SGD(gpu.parameters(), lr=0.0), micro_batch_size=micro_batch_size,
                     device="cuda", stage=stage)  # fmt: skip
    whole = InnerStep(cpu, torch.optim.SGD(cpu.parameters(), lr=0.0), micro_batch_size=100)
    for seed in (0, 1):
        rows = _uncropped(seed=seed)
        got = step(host_rows(rows, pin=True))
        want = whole(stage_rows(rows, "cpu", crop=SIZE, flow=False))
        a = torch.cat([p.grad.flatten().cpu() for p in gpu.parameters()])
        b = torch.cat([p.grad.flatten() for p in cpu.parameters()])
        assert (a - b).norm() <= 1e-4 * b.norm() and b.norm() > 0
        assert got.sequences == want.sequences and got.loss == pytest.approx(want.loss, rel=1e-4)


@CUDA
def test_cuda_evaluate_in_bf16_is_fp32_within_bf16s_rounding():
    """evaluate on CUDA: in fp32 (TF32 off) it gives the CPU's loss to 1e-4 relative and the same count;
    in bf16 its mean loss is within 2 % of fp32's (bf16 keeps 8 bits of mantissa, about 0.4 % per
    rounding, over a few layers), every sequence scored once, and the accuracy within one sequence in
    ten of fp32's (a near tie may flip its argmax)."""
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    model = build_model(CLASSES, width=8, depth=2, hidden=16)
    batches = [_batch(seed) for seed in range(3)]
    on_cpu = evaluate(model, batches, micro_batch_size=3, device="cpu")
    model.cuda()
    fp32 = evaluate(model, batches, micro_batch_size=3, device="cuda")
    bf16 = evaluate(model, batches, micro_batch_size=3, device="cuda", precision="bf16")
    assert fp32.sequences == bf16.sequences == on_cpu.sequences > 0
    assert fp32.loss == pytest.approx(on_cpu.loss, rel=1e-4)
    assert bf16.loss == pytest.approx(fp32.loss, rel=2e-2)
    assert abs(bf16.accuracy - fp32.accuracy) <= 0.1


def _learner_under_cap(rank: int, cap_bytes: int, steps: int, results) -> None:
    """One of two learners sharing the GPU (--gpus-per-learner 0.5): capped at ``cap_bytes``, it trains
    ``steps`` streamed mini-batches and reports its reserved memory after the second and the last."""
    from raytrain_seq.training.staging import MicroBatchStage, RowPrefetcher

    torch.cuda.set_per_process_memory_fraction(
        cap_bytes / torch.cuda.get_device_properties(0).total_memory, 0
    )
    torch.manual_seed(rank)
    model = build_model(CLASSES, width=16, depth=3, hidden=32).cuda()
    step = InnerStep(model, build_optimizer("adam", model.parameters(), lr=1e-3), micro_batch_size=2,
                     device="cuda", precision="bf16", stage=MicroBatchStage("cuda", crop=SIZE, flow=False))  # fmt: skip
    prefetcher = RowPrefetcher("cuda")
    reserved = []
    for i in range(steps):
        step(prefetcher.wait(prefetcher.submit(_uncropped(seed=rank * 100 + i))))
        reserved.append(torch.cuda.memory_reserved(0))
    prefetcher.close()
    results[rank] = (reserved[1], reserved[-1], len(step.streams))


@CUDA
def test_cuda_two_learners_at_half_a_gpu_train_under_a_fixed_cap_without_growing():
    """Two processes on one GPU, each capped at 1 GiB (a fixed cap, whatever the GPU), train 24
    streamed bf16 mini-batches each without running out of memory; each staged every mini-batch on one
    side stream, and its reserved memory after the last mini-batch is no more than 1.25x that after the
    second (a stream per mini-batch would keep each old stream's staging blocks reserved)."""
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    mp.spawn(_learner_under_cap, args=(2**30, 24, results), nprocs=2, join=True)
    assert sorted(results) == [0, 1]
    for second, last, streams in results.values():
        assert streams == 1 and last <= 1.25 * second
