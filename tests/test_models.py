"""Temporal classifier over BLoad block rows: exact resets, sequence order, fillers, loss form, structure."""

from __future__ import annotations

import math
import re

import packed_rows
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raytrain_seq.algorithms.microbatch import BATCHNORM_TYPES
from raytrain_seq.models import (
    FRAME_ENCODERS,
    TEMPORAL_MODULES,
    FrameNormalizer,
    GroupNorm,
    block_sequence_index,
    build_frame_encoder,
    build_model,
    build_temporal,
    predict,
    sequence_labels,
    sequence_loss,
)

HW, C, NUM_CLASSES = 8, 3, 5
TEMPORALS = ["gru", "tcn"]


def _seq(seed: int, length: int, channels: int = C) -> torch.Tensor:
    return packed_rows.sequence(seed, length, channels=channels, hw=HW)


def _batch(rows, t_max, max_sequences=4, garbage_seed=None, channels=C):
    return packed_rows.packed_batch(
        rows, t_max, max_sequences=max_sequences, garbage_seed=garbage_seed, channels=channels, hw=HW
    )


_logits = packed_rows.logits


def _model(temporal, **kwargs):
    torch.manual_seed(0)
    return build_model(NUM_CLASSES, width=4, depth=2, hidden=6, temporal=temporal, **kwargs).double()


A, N1, N2, N3 = _seq(1, 7), _seq(2, 5), _seq(3, 3), _seq(4, 9)
# (row, position of A in it): A first, last, in the middle, after a garbage gap, ending exactly at t_max.
CONTEXTS = [
    ([(0, N1, 1), (5, A, 0)], 1),
    ([(0, A, 0), (7, N1, 1)], 0),
    ([(0, N2, 2), (3, N1, 1), (8, A, 0), (15, N3, 3)], 2),
    ([(4, A, 0)], 0),
    ([(0, N3, 3), (9, N1, 1), (14, N2, 2), (23, A, 0)], 3),
]


@pytest.mark.parametrize("temporal", TEMPORALS)
def test_sequence_logits_do_not_depend_on_block_context(temporal):
    """A sequence's logits equal (float64, 1e-9) its logits alone, at any offset, with any neighbours."""
    model = _model(temporal)
    alone = _logits(model, _batch([[(0, A, 0)]], t_max=30))[0]
    for garbage in (None, 7):
        for row, pos in CONTEXTS:
            packed = _logits(model, _batch([row], t_max=30, garbage_seed=garbage))
            assert packed.shape == (len(row), NUM_CLASSES)
            assert (packed[pos] - alone).abs().max().item() < 1e-9
        # All contexts stacked as rows of one batch, a filler row included: row-major (row, slot) order.
        rows = [row for row, _ in CONTEXTS]
        stacked = _logits(model, _batch([*rows[:2], [], *rows[2:]], t_max=30, garbage_seed=garbage))
        offsets = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)  # [0, 2, 4, 8, 9, 13]
        for (_, pos), first in zip(CONTEXTS, offsets.tolist(), strict=False):
            assert (stacked[first + pos] - alone).abs().max().item() < 1e-9
    # Not vacuous: had the model not reset at A's start (N1 and A read as one sequence), A would differ.
    merged = _logits(model, _batch([[(0, torch.cat([N1, A]), 0)]], t_max=30))[0]
    assert (merged - alone).abs().max().item() > 1e-4


@pytest.mark.parametrize("temporal", TEMPORALS)
def test_padding_frames_affect_nothing(temporal):
    """Random garbage in padding frames (before, between and after sequences) leaves every logit unchanged."""
    model = _model(temporal)
    rows = [[(2, A, 0), (12, N1, 1)], [(0, N3, 3)]]
    clean = _logits(model, _batch(rows, t_max=20))
    dirty_batch = _batch(rows, t_max=20, garbage_seed=11)
    assert dirty_batch["frames"][0, :2].any() and dirty_batch["frames"][1, 9:].any()  # really garbage
    assert torch.equal(clean, _logits(model, dirty_batch))


@pytest.mark.parametrize("temporal", TEMPORALS)
def test_changing_one_sequence_never_changes_another(temporal):
    """Editing any frame of sequence k changes k's logits and leaves the block's other sequences untouched."""
    model = _model(temporal)
    batch = _batch([[(0, A, 0), (7, N1, 1), (12, N3, 2)]], t_max=24)
    base = _logits(model, batch)
    g = torch.Generator().manual_seed(5)
    # First and last frame of each sequence: the last frame of k sits right before k+1's start.
    for k, (start, length) in enumerate([(0, 7), (7, 5), (12, 9)]):
        for t in (start, start + length - 1):
            edited = {**batch, "frames": batch["frames"].clone()}
            edited["frames"][0, t] = torch.randint(0, 256, (HW, HW, C), dtype=torch.uint8, generator=g)
            out = _logits(model, edited)
            others = [j for j in range(3) if j != k]
            assert (out[others] - base[others]).abs().max().item() < 1e-12
            assert (out[k] - base[k]).abs().max().item() > 1e-6  # the edit is visible where it belongs


def _reference_logits(model, frames):
    """One sequence alone, by explicit per-step loops over the model's own weights (GRU cell or causal taps)."""
    x = model.normalizer(frames).permute(0, 3, 1, 2)  # [L, C, H, W]
    if model.motion:
        # The sequence alone: frame t minus frame t-1, and zeros at its first frame.
        previous = torch.cat([x[:1], x[:-1]])
        x = torch.cat([x, model.motion_gain * (x - previous)], dim=1)
    feats = model.encoder(x)  # [L, D]
    if model.temporal.__class__.__name__ == "GRUTemporal":
        gru = model.temporal.gru
        assert gru.num_layers == 1
        w_ir, w_iz, w_in = gru.weight_ih_l0.chunk(3)
        w_hr, w_hz, w_hn = gru.weight_hh_l0.chunk(3)
        b_ir, b_iz, b_in = gru.bias_ih_l0.chunk(3)
        b_hr, b_hz, b_hn = gru.bias_hh_l0.chunk(3)
        h = feats.new_zeros(gru.hidden_size)
        outs = []
        for x in feats:
            r = torch.sigmoid(w_ir @ x + b_ir + w_hr @ h + b_hr)
            z = torch.sigmoid(w_iz @ x + b_iz + w_hz @ h + b_hz)
            n = torch.tanh(w_in @ x + b_in + r * (w_hn @ h + b_hn))
            h = (1 - z) * n + z * h
            outs.append(h)
        out = torch.stack(outs)
    else:
        h = model.temporal.proj(feats)  # [L, hidden]
        for conv in model.temporal.convs:
            k, d = conv.kernel_size[0], conv.dilation[0]
            y = conv.bias.expand_as(h).clone()
            for t in range(len(h)):
                for i in range(k):  # tap i reads step t - (k - 1 - i) * d; steps before 0 are zero
                    src = t - (k - 1 - i) * d
                    if src >= 0:
                        y[t] = y[t] + conv.weight[:, :, i] @ h[src]
            h = h + torch.relu(y)
        out = h
    # Segment pooling by hand: step t of L belongs to segment t * S // L; empty segments pool to zeros.
    length, segments = len(out), model.segments
    pooled = []
    for segment in range(segments):
        steps = [t for t in range(length) if t * segments // length == segment]
        pooled.append(out[steps].mean(dim=0) if steps else out.new_zeros(out.shape[1]))
    return model.head(torch.cat(pooled))


@pytest.mark.parametrize("temporal", TEMPORALS)
def test_packed_logits_match_an_independent_per_step_reference(temporal):
    """Every sequence of a packed batch matches a hand-written per-step recurrence/convolution over it alone."""
    model = _model(temporal)
    rows = [[(0, N1, 1), (5, A, 0), (12, N2, 2)], [(0, N3, 3)]]
    logits = _logits(model, _batch(rows, t_max=16, garbage_seed=3))
    seqs = [N1, A, N2, N3]
    for k, seq in enumerate(seqs):
        assert (logits[k] - _reference_logits(model, seq)).abs().max().item() < 1e-9


def test_filler_rows_contribute_nothing():
    """Rows with 0 sequences add no logits; a micro-batch of only fillers gives loss_sum 0 and count 0."""
    model = _model("gru")
    rows = [[(0, A, 0), (7, N1, 1)], [(0, N2, 2)]]
    plain = _logits(model, _batch(rows, t_max=12))
    with_fillers = _logits(model, _batch([[], rows[0], [], rows[1], []], t_max=12, garbage_seed=2))
    assert with_fillers.shape == (3, NUM_CLASSES)
    assert (with_fillers - plain).abs().max().item() < 1e-12

    fillers = _batch([[], []], t_max=12, garbage_seed=4)
    loss_sum, count = sequence_loss(model, fillers)
    assert count == 0 and loss_sum.item() == 0.0
    loss_sum.backward()  # a streamer may call backward on every micro-batch: must not crash
    logits, labels = predict(model, fillers)
    assert logits.shape == (0, NUM_CLASSES) and labels.shape == (0,)


@pytest.mark.parametrize("temporal", TEMPORALS)
def test_loss_sum_over_count_is_the_cross_entropy_mean(temporal):
    """sequence_loss returns the CE sum over real sequences and their count; sum / count == F.cross_entropy."""
    model = _model(temporal)
    rows = [[(0, A, 4), (7, N1, 1), (12, N2, 3)], [], [(0, N3, 0)]]
    batch = _batch(rows, t_max=16)
    loss_sum, count = sequence_loss(model, batch)
    expected_labels = torch.tensor([label for row in rows for _, _, label in row])  # row-major by hand
    assert torch.equal(sequence_labels(batch["labels"], batch["num_sequences"]), expected_labels)
    logits = _logits(model, batch)
    assert count == 4
    assert abs(loss_sum.item() / count - F.cross_entropy(logits, expected_labels).item()) < 1e-12
    # Order matters (guards the check above): the same logits against reversed labels give another loss.
    assert abs(F.cross_entropy(logits, expected_labels.flip(0)).item() - loss_sum.item() / count) > 1e-6
    pred_logits, pred_labels = predict(model, batch)
    assert torch.equal(pred_logits, logits.detach()) and torch.equal(pred_labels, expected_labels)
    assert not pred_logits.requires_grad


@pytest.mark.parametrize("temporal", TEMPORALS)
def test_gradients_reach_every_parameter(temporal):
    """A backward through sequence_loss gives a nonzero gradient to every parameter of the model."""
    model = _model(temporal)
    loss_sum, _ = sequence_loss(model, _batch([[(0, A, 4), (7, N1, 1)], [(0, N3, 2)]], t_max=16))
    loss_sum.backward()
    params = list(model.named_parameters())
    assert len(params) > 5
    for name, p in params:
        assert p.grad is not None and p.grad.abs().sum().item() > 0, name


@pytest.mark.parametrize("temporal", TEMPORALS)
@pytest.mark.parametrize(("width", "depth"), [(16, 4), (4, 2), (12, 3)])
def test_no_batchnorm_anywhere(temporal, width, depth):
    """The model normalises with GroupNorm (one per encoder stage) and contains no BatchNorm module."""
    model = build_model(NUM_CLASSES, width=width, depth=depth, temporal=temporal)
    modules = list(model.modules())
    assert not any(isinstance(m, BATCHNORM_TYPES) for m in modules)
    assert sum(isinstance(m, GroupNorm) for m in modules) == depth  # the autocast-aware one


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))],
)
def test_group_norm_is_nn_group_norm_except_that_it_keeps_bf16_under_cuda_autocast(device):
    """Without autocast, and under the CPU's (which keeps group_norm in bf16 itself), the project's
    GroupNorm gives nn.GroupNorm's bits and state_dict. Under CUDA autocast, after a convolution, it
    returns bf16 where nn.GroupNorm returns float32 (not vacuous: the two differ there), with values
    and gradients within bf16's rounding of the float32 ones."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, bias=False).to(device)
    ours, theirs = GroupNorm(4, 8).to(device), nn.GroupNorm(4, 8).to(device)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5), ours.bias.uniform_(-0.5, 0.5)
    theirs.load_state_dict(ours.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = torch.randn(2, 3, 9, 9, device=device)
    assert torch.equal(ours(conv(x)), theirs(conv(x)))
    with torch.autocast(device, dtype=torch.bfloat16):
        half, native = ours(conv(x)), theirs(conv(x))
    assert half.dtype == torch.bfloat16
    if device == "cpu":
        assert torch.equal(half, native)
        return
    assert native.dtype == torch.float32
    exact = theirs(conv(x))  # float32 throughout
    eps = torch.finfo(torch.bfloat16).eps
    assert (half.float() - exact).norm() <= 8 * eps * exact.norm()
    grads = []
    for norm, autocast in ((ours, True), (theirs, False)):
        norm.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            out = norm(conv(x))
        (out.float() * torch.linspace(-1, 1, out.numel(), device=device).view(out.shape)).sum().backward()
        grads.append(norm.weight.grad.clone())
    assert grads[0].dtype == torch.float32 and grads[1].norm() > 0
    assert (grads[0] - grads[1]).norm() <= 16 * eps * grads[1].norm()


@pytest.mark.parametrize("temporal", TEMPORALS)
def test_default_size_is_small(temporal):
    """The default model (101 classes) has 100k-300k parameters, small enough to train on 2 CPU cores."""
    params = sum(p.numel() for p in build_model(101, temporal=temporal).parameters())
    assert 100_000 <= params <= 300_000


def test_unknown_names_raise_and_list_the_known_ones():
    """An unknown backbone or temporal module raises ValueError naming the valid choices."""
    with pytest.raises(ValueError, match=re.escape("['resnet152', 'resnet18', 'resnet50', 'small']")):
        build_model(NUM_CLASSES, backbone="resnet1000")
    with pytest.raises(ValueError, match="small"):
        build_frame_encoder("nope", 3)
    with pytest.raises(ValueError, match=re.escape("['gru', 'tcn']")):
        build_model(NUM_CLASSES, temporal="lstm")
    with pytest.raises(ValueError, match="gru"):
        build_temporal("transformer", 8, 8)
    assert set(FRAME_ENCODERS) == {"small", "resnet18", "resnet50", "resnet152"}
    assert set(TEMPORAL_MODULES) == {"gru", "tcn"}


@pytest.mark.parametrize("temporal", TEMPORALS)
def test_two_channel_input_works_and_channel_mismatch_raises(temporal):
    """in_channels=2 (optical flow) gives logits per sequence; frames with the wrong channel count raise."""
    model = _model(temporal, in_channels=2)
    flow_a, flow_b = _seq(8, 6, channels=2), _seq(9, 4, channels=2)
    batch = _batch([[(0, flow_a, 0), (6, flow_b, 1)]], t_max=12, channels=2)
    assert _logits(model, batch).shape == (2, NUM_CLASSES)
    with pytest.raises(ValueError, match="in_channels=3"):
        _logits(model, _batch([[(0, A, 0)]], t_max=8))


def test_bad_reset_tables_raise():
    """Sequences that overrun t_max, bad num_sequences, unbatched frames, float tables, -1 labels raise."""
    model = _model("gru")
    batch = _batch([[(0, A, 0), (7, N1, 1)]], t_max=12)
    overrun = {**batch, "starts": torch.tensor([[0, 8, -1, -1]])}  # 8 + 5 > 12
    with pytest.raises(ValueError, match="t_max=12"):
        sequence_loss(model, overrun)
    with pytest.raises(ValueError, match="num_sequences"):
        sequence_loss(model, {**batch, "num_sequences": torch.tensor([5])})
    with pytest.raises(ValueError, match="frames"):
        model(batch["frames"][0], batch["starts"][0], batch["lengths"][0], batch["num_sequences"][0])
    with pytest.raises(TypeError, match="starts"):
        model(batch["frames"], batch["starts"].double(), batch["lengths"], batch["num_sequences"])
    with pytest.raises(ValueError, match="label"):
        sequence_labels(torch.tensor([[3, -1, -1, -1]]), torch.tensor([2]))
    with pytest.raises(ValueError, match="labels"):
        sequence_loss(model, {k: v for k, v in batch.items() if k != "labels"})


def test_index_arithmetic_matches_the_documented_example():
    """The docstring example: lengths [37,24,20] | [50] in t_max=100 -> frames 0..80 and 100..149, K=4."""
    starts = torch.tensor([[0, 37, 61], [0, -1, -1]])
    lengths = torch.tensor([[37, 24, 20], [50, -1, -1]])
    index = block_sequence_index((2, 100, HW, HW, C), starts, lengths, torch.tensor([3, 1]))
    assert index.rows.tolist() == [0, 0, 0, 1] and index.slots.tolist() == [0, 1, 2, 0]
    assert index.frame_index.tolist() == list(range(81)) + list(range(100, 150))
    assert index.step_mask.shape == (4, 50) and index.step_mask.sum(1).tolist() == [37, 24, 20, 50]
    labels = torch.tensor([[4, 9, 1], [7, -1, -1]])
    assert sequence_labels(labels, torch.tensor([3, 1])).tolist() == [4, 9, 1, 7]


def test_frame_normalizer_maps_uint8_and_float_alike():
    """uint8 0/255 map to -0.5/+0.5 by default; float frames in [0, 1] equal uint8 / 255; mean/std apply."""
    norm = FrameNormalizer(2).double()
    x = torch.tensor([[0, 255], [51, 102]], dtype=torch.uint8)
    out = norm(x)
    assert out.dtype == torch.float64
    assert torch.allclose(out, torch.tensor([[-0.5, 0.5], [-0.3, -0.1]], dtype=torch.float64))
    assert torch.equal(norm(x.double() / 255), out)
    whiten = FrameNormalizer(2, mean=[0.2, 0.4], std=[0.5, 2.0]).double()
    assert torch.allclose(whiten(x)[0], torch.tensor([-0.4, 0.3], dtype=torch.float64))
    with pytest.raises(ValueError, match="one value per input channel"):
        FrameNormalizer(3, mean=[0.5, 0.5])


# ---------------------------------------------------------------------------- precision and transfers
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_the_gru_runs_at_float32_under_a_bf16_step(device):
    """The learner's bf16 step (InnerStep, precision "bf16": autocast around the forward) runs the encoder
    in bf16 but the GRU at float32, input, weights and output: CUDA autocast would hand cuDNN's RNN
    float16 (not the run's bf16) and the CPU's bf16, neither of which the loss scaling covers. The
    weights seen inside are the module's own chunk (models.recurrent), not a cast copy."""
    from raytrain_seq.models import compact_recurrent
    from raytrain_seq.training.step import InnerStep, build_optimizer

    torch.manual_seed(0)
    model = build_model(NUM_CLASSES, width=4, depth=2, hidden=6, temporal="gru").to(device)
    compact_recurrent(model)
    seen = {}

    def gru_hook(module, inputs, output):
        seen["gru_in"], seen["gru_out"] = inputs[0].data.dtype, output[0].data.dtype
        seen["weights"] = {w.dtype for layer in module.all_weights for w in layer}

    def encoder_hook(module, inputs, output):
        seen["encoder_out"] = output.dtype

    model.temporal.gru.register_forward_hook(gru_hook)
    model.encoder.register_forward_hook(encoder_hook)
    step = InnerStep(model, build_optimizer("adam", model.parameters(), lr=1e-3), micro_batch_size=2,
                     device=device, precision="bf16")  # fmt: skip
    batch = _batch([[(0, A, 1), (7, N1, 2)], [(0, N3, 0)]], t_max=12)
    stats = step(batch)
    assert seen["encoder_out"] == torch.bfloat16  # the autocast is on: the test is not vacuous
    assert seen["gru_in"] == seen["gru_out"] == torch.float32 and seen["weights"] == {torch.float32}
    assert stats.sequences == 3 and math.isfinite(stats.loss)
    assert model.temporal.gru.weight_ih_l0.grad.dtype == torch.float32


def test_the_gru_keeps_float64_and_its_resets_when_run_alone():
    """Outside autocast the GRU keeps its input's precision (float64 in, float64 out), and sorting the
    sequences for packing is undone: row k of the output is sequence k run alone."""
    torch.manual_seed(0)
    gru = build_temporal("gru", 3, 5).double()
    x = torch.randn(3, 6, 3, dtype=torch.float64)
    lengths = torch.tensor([2, 6, 4])
    out = gru(x, lengths)
    assert out.dtype == torch.float64 and out.shape == (3, 6, 5)
    for k in range(3):
        alone = gru(x[k : k + 1, : lengths[k]], lengths[k : k + 1])
        assert (out[k, : lengths[k]] - alone[0]).abs().max().item() < 1e-12
        assert out[k, lengths[k] :].abs().sum().item() == 0


class _FakeHostTensor:
    """A host tensor's surface as to_device sees it, logging what is asked of it."""

    def __init__(self, log: list, pinned: bool = False) -> None:
        self.device, self.log, self.pinned = torch.device("cpu"), log, pinned

    def is_pinned(self) -> bool:
        return self.pinned

    def pin_memory(self):
        self.log.append("pin_memory")
        return _FakeHostTensor(self.log, pinned=True)

    def to(self, device, non_blocking=False):
        self.log.append(("to", str(device), non_blocking, self.pinned))
        return "on the device"


def test_to_device_copies_host_tensors_to_cuda_from_pinned_memory_without_blocking():
    """A host tensor bound for CUDA is pinned, then copied with non_blocking=True (a pageable copy would
    stall the host until the GPU caught up); a pinned one is not pinned again; one already there is
    returned as it is (no copy at all)."""
    from raytrain_seq.models.transfer import to_device

    log: list = []
    assert to_device(_FakeHostTensor(log), "cuda:0") == "on the device"
    assert log == ["pin_memory", ("to", "cuda:0", True, True)]
    log.clear()
    to_device(_FakeHostTensor(log, pinned=True), torch.device("cuda", 0))
    assert log == [("to", "cuda:0", True, True)]
    t = torch.arange(3)
    assert to_device(t, "cpu") is t


def test_the_forward_pass_moves_host_tensors_only_through_to_device():
    """No module of the forward pass (the classifiers, the temporal modules, the loss) copies a tensor to
    a device with a bare ``.to(device)`` or lets torch do it (pack_padded_sequence with
    enforce_sorted=False moves its permutation with a blocking copy): every move goes through
    models.transfer.to_device. ``.to(dtype)`` stays allowed."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "raytrain_seq" / "models"
    found = []
    for name in ("classifier.py", "sequence.py", "temporal.py", "loss.py"):
        for node in ast.walk(ast.parse((root / name).read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "to" and node.args:
                arg = node.args[0]
                label = arg.attr if isinstance(arg, ast.Attribute) else getattr(arg, "id", "")
                if "device" in label:
                    found.append(f"{name}:{node.lineno} .to({label})")
            for keyword in node.keywords:
                if keyword.arg == "enforce_sorted" and getattr(keyword.value, "value", None) is False:
                    found.append(f"{name}:{node.lineno} enforce_sorted=False")
    assert found == []


def test_the_backbone_names_are_the_registries():
    """models.backbones names every builder without importing torchvision: the registries agree with it."""
    from raytrain_seq.models import backbones
    from raytrain_seq.models.resnet import RESNET_ARCHS
    from raytrain_seq.models.video import VIDEO_BUILDERS

    assert tuple(RESNET_ARCHS) == backbones.RESNET_NAMES
    assert tuple(VIDEO_BUILDERS) == backbones.VIDEO_ARCHS
    assert sorted(FRAME_ENCODERS) == sorted(["small", *backbones.RESNET_NAMES])
    encoder = build_frame_encoder("resnet18", 3)  # the lazy builder builds the ResNet itself
    assert type(encoder).__name__ == "ResNetEncoder" and encoder.out_dim == 512


def test_a_small_model_process_imports_no_torchvision():
    """A learner, the evaluator and the driver of a small-encoder run never import torchvision (its
    import is seconds of a replacement learner's start-up: models.backbones); a ResNet's does."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "import raytrain_seq.runtime.learner, raytrain_seq.runtime.fleet, raytrain_seq.runtime.evaluator\n"
        "import raytrain_seq.runtime.driver, raytrain_seq.runtime.feed, raytrain_seq.models\n"
        "from raytrain_seq.config import Config\n"
        "from raytrain_seq.models.factory import build_model_for\n"
        "build_model_for(Config.from_preset('smoke', backbone=BACKBONE).model, num_classes=4, in_channels=3)\n"
        "print('torchvision' in sys.modules)"
    )

    def imports_torchvision(backbone: str) -> bool:
        code = probe.replace("BACKBONE", repr(backbone))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        return out.stdout.strip() == "True"

    assert not imports_torchvision("small")
    assert imports_torchvision("resnet18")  # not vacuous: the probe sees torchvision when it comes
