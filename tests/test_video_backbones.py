"""Per-sequence encoders under a SequenceClassifier: torchvision's video ResNets and the --model-factory hook.

Contracts pinned: a sequence's logits are the same alone and packed in a block with others, at any
offset, with any padding (float64, 1e-9, as tests/test_models.py for the temporal classifier); no
BatchNorm is left to couple clips; a torchvision state_dict saved here loads through ``--weights``
(config -> build_model_for) to the same parameters, its ``fc`` replaced by the run's head, and a
mismatched file is a ValueError naming the file and the architecture; the exact micro-batch gradient
holds; multi-view testing runs on every backbone; the factory hook's contract and errors.
"""

from __future__ import annotations

import functools

import packed_rows
import pytest
import torch
from torch import nn
from torchvision.models import video as tv_video

from raytrain_seq.algorithms.microbatch import BATCHNORM_TYPES, accumulate
from raytrain_seq.config import VIDEO_BACKBONES, Config
from raytrain_seq.models import (
    KINETICS_MEAN,
    VIDEO_ARCHS,
    FrozenBatchNorm,
    SequenceClassifier,
    VideoBackbone,
    build_from_factory,
    sequence_loss,
)
from raytrain_seq.models.factory import build_model_for, model_from_state
from raytrain_seq.training.evaluation import evaluate

HW, NUM_CLASSES = 8, 4


def _seq(seed: int, length: int, channels: int = 3) -> torch.Tensor:
    return packed_rows.sequence(seed, length, channels=channels, hw=HW)


def _batch(rows, t_max, max_sequences=3, garbage_seed=None, channels=3):
    return packed_rows.packed_batch(
        rows, t_max, max_sequences=max_sequences, garbage_seed=garbage_seed, channels=channels, hw=HW
    )


_logits = packed_rows.logits


def _randomise_frozen(model):
    """Random statistics in every frozen BatchNorm, so the norm layers are not the identity."""
    g = torch.Generator().manual_seed(3)
    for module in model.modules():
        if isinstance(module, FrozenBatchNorm):
            n = module.num_features
            module.weight.copy_(torch.rand(n, generator=g) + 0.5)
            module.bias.copy_(torch.randn(n, generator=g) * 0.1)
            module.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            module.running_var.copy_(torch.rand(n, generator=g) + 0.5)
    return model


@functools.cache
def _built(arch: str, norm: str) -> SequenceClassifier:
    torch.manual_seed(0)
    encoder = _randomise_frozen(VideoBackbone(arch, 3, norm=norm))
    return SequenceClassifier(NUM_CLASSES, 3, encoder, name=arch).double()


def test_config_names_every_video_backbone():
    assert VIDEO_BACKBONES == VIDEO_ARCHS


A, N1, N2, N3 = _seq(1, 5), _seq(2, 3), _seq(3, 2), _seq(4, 5)
CONTEXTS = [  # (row, position of A): first, last, between two others, after a gap, ending at t_max
    ([(0, A, 0), (5, N1, 1)], 0),
    ([(0, N1, 1), (3, A, 0)], 1),
    ([(0, N2, 2), (2, A, 0), (7, N3, 3)], 1),
    ([(4, A, 0)], 0),
    ([(0, N3, 3), (7, A, 0)], 1),
]


# Every backbone with frozen statistics; GroupNorm on R(2+1)D, whose middle widths (45, 144, 230, ...)
# take the group counts that are not 32.
@pytest.mark.parametrize(("arch", "norm"), [*((a, "frozen") for a in VIDEO_ARCHS), ("r2plus1d_18", "group")])
def test_sequence_logits_are_the_same_alone_and_packed(arch, norm):
    """float64: a sequence's logits alone == packed with others (any offset, padding, neighbours), 1e-9."""
    model = _built(arch, norm)
    assert not any(isinstance(m, BATCHNORM_TYPES) for m in model.modules())
    with torch.no_grad():
        alone = _logits(model, _batch([[(0, A, 0)]], t_max=12))[0]
        rows = [row for row, _ in CONTEXTS]
        stacked = _logits(model, _batch([*rows[:2], [], *rows[2:]], t_max=12, garbage_seed=7))
        offsets = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
        for (_, pos), first in zip(CONTEXTS, offsets.tolist(), strict=False):
            assert (stacked[first + pos] - alone).abs().max().item() < 1e-9
        # Not vacuous: read as one sequence with its neighbour (no reset at A's start), A's logits differ.
        merged = _logits(model, _batch([[(0, torch.cat([N1, A]), 0)]], t_max=12))[0]
    assert (merged - alone).abs().max().item() > 1e-6


def test_equal_lengths_batch_into_one_call_with_the_same_features():
    """forward_packed runs equal lengths together; features equal one call per sequence (float64)."""
    encoder = _built("r3d_18", "frozen").encoder
    x = torch.randn(11, 3, HW, HW, dtype=torch.float64)
    lengths = torch.tensor([4, 3, 4])
    calls = []
    hook = encoder.net.stem.register_forward_hook(lambda _m, inputs, _o: calls.append(inputs[0].shape[0]))
    try:
        with torch.no_grad():
            packed = encoder.forward_packed(x, lengths)
            calls_packed = list(calls)
            one_by_one = torch.stack([encoder(clip) for clip in x.split([4, 3, 4])])
    finally:
        hook.remove()
    assert sorted(calls_packed) == [1, 2]  # the two 4-frame clips went through as one batch
    assert packed.shape == (3, 512)
    assert (packed - one_by_one).abs().max().item() < 1e-12


def test_micro_batch_gradient_equals_the_full_batch_gradient():
    """Micro-batch streaming's contract holds for a video backbone: 1 row at a time == the whole batch."""
    model = _built("mc3_18", "group")
    batch = _batch([row for row, _ in CONTEXTS[:3]], t_max=12)
    grads = []
    for size in (1, len(CONTEXTS[:3])):
        accumulate(model, batch, sequence_loss, micro_batch_size=size)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().max().item() > 0
    assert (grads[0] - grads[1]).abs().max().item() < 1e-9
    model.zero_grad(set_to_none=True)


def _torchvision_file(tmp_path, arch: str):
    """A torchvision video model's state_dict with random statistics, saved as a user's download is."""
    torch.manual_seed(1)
    source = getattr(tv_video, arch)()
    with torch.no_grad():
        for module in source.modules():
            if isinstance(module, nn.BatchNorm3d):
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
    path = tmp_path / f"{arch}.pth"
    torch.save(source.state_dict(), path)
    return source.state_dict(), path


@pytest.mark.parametrize("arch", VIDEO_ARCHS)
def test_a_torchvision_state_dict_loads_through_weights_to_the_same_parameters(tmp_path, arch):
    """--weights FILE: every tensor but fc equal to the file's, frozen norm, Kinetics statistics, the
    head sized for the run's classes; a flow model's stem gets the TSN average."""
    state, path = _torchvision_file(tmp_path, arch)
    config = Config.from_preset(None, backbone=arch, weights=str(path), run_name="x")
    model = build_model_for(config.model, num_classes=NUM_CLASSES, in_channels=3)
    loaded = model.encoder.net.state_dict()
    compared = [k for k in state if not k.startswith("fc.") and not k.endswith("num_batches_tracked")]
    assert len(compared) == len(loaded) > 50
    for key in compared:
        assert torch.equal(loaded[key], state[key]), key
    assert model.head.weight.shape == (NUM_CLASSES, 512)
    assert isinstance(model.encoder.net.stem[1], FrozenBatchNorm)
    assert torch.allclose(model.normalizer.mean, torch.tensor(KINETICS_MEAN))
    flow = build_model_for(config.model, num_classes=NUM_CLASSES, in_channels=2)
    stem = state["stem.0.weight"]
    assert torch.equal(flow.encoder.net.stem[0].weight, stem.mean(1, keepdim=True).expand(-1, 2, -1, -1, -1))
    # The exported and reloaded model (model_from_state) is the same network, bit for bit.
    again = model_from_state(config.model, model.state_dict(), num_classes=NUM_CLASSES, in_channels=3)
    batch = _batch([[(0, A, 0), (5, N1, 1)]], t_max=8)
    with torch.no_grad():
        assert torch.equal(_logits(model.eval(), batch), _logits(again.eval(), batch))


def test_a_mismatched_file_names_the_file_the_architecture_and_the_key(tmp_path):
    """An r3d_18 file into r2plus1d_18, a file of another kind: ValueError naming file, arch and key."""
    _, path = _torchvision_file(tmp_path, "mc3_18")
    config = Config.from_preset(None, backbone="r2plus1d_18", weights=str(path), run_name="x")
    with pytest.raises(ValueError, match=r"mc3_18\.pth: key 'stem\.0\.weight' has shape .* in r2plus1d_18"):
        build_model_for(config.model, num_classes=NUM_CLASSES, in_channels=3)
    foreign = tmp_path / "foreign.pth"
    torch.save({"fc.weight": torch.zeros(2, 2), "something.else": torch.zeros(3)}, foreign)
    config = Config.from_preset(None, backbone="mc3_18", weights=str(foreign), run_name="x")
    with pytest.raises(
        ValueError, match=r"foreign\.pth: key 'stem\.0\.weight' is missing.*torchvision mc3_18"
    ):
        build_model_for(config.model, num_classes=NUM_CLASSES, in_channels=3)


@pytest.mark.parametrize("arch", ["r2plus1d_18", "small", "factory"])
def test_test_views_score_every_backbone(arch):
    """Multi-view testing: evaluate() with views == the softmax of each view computed by hand, averaged
    (one video backbone stands for the three: views are cut before the model, whatever it is)."""
    if arch == "factory":
        config = Config.from_preset(None, model_factory="model_factory_example:build", run_name="x")
    else:
        config = Config.from_preset(None, backbone=arch, run_name="x")
    torch.manual_seed(0)
    model = build_model_for(config.model, num_classes=NUM_CLASSES, in_channels=3)
    batch = _batch([[(0, A, 0), (5, N1, 2)], [(0, N3, 1)]], t_max=8)
    views = [(0, 0, False), (2, 1, True)]
    result = evaluate(model, [batch], views=views, crop=6, micro_batch_size=4)
    by_hand = 0
    for top, left, flip in views:
        cut = batch["frames"][:, :, top : top + 6, left : left + 6]
        cut = cut.flip(3) if flip else cut
        with torch.no_grad():
            by_hand = by_hand + torch.softmax(_logits(model, {**batch, "frames": cut}), dim=1)
    expected = -torch.log((by_hand / 2)[torch.arange(3), torch.tensor([0, 2, 1])]).sum().item()
    assert result.sequences == 3
    assert abs(result.loss * 3 - expected) < 1e-4


def test_the_model_factory_builds_a_sequence_classifier():
    """--model-factory: called with in_channels when it takes it, out_dim checked, a head on top."""
    config = Config.from_preset(None, model_factory="model_factory_example:build", run_name="x")
    rgb = build_model_for(config.model, num_classes=NUM_CLASSES, in_channels=3)
    flow = build_model_for(config.model, num_classes=NUM_CLASSES, in_channels=2)
    assert isinstance(rgb, SequenceClassifier) and rgb.encoder.conv.in_channels == 3
    assert flow.encoder.conv.in_channels == 2 and rgb.head.in_features == 8
    plain = build_from_factory("model_factory_example:build_without_channels", 3)
    assert plain.out_dim == 4
    model = rgb.double()
    with torch.no_grad():
        alone = _logits(model, _batch([[(0, A, 0)]], t_max=12))[0]
        packed = _logits(model, _batch([CONTEXTS[2][0]], t_max=12, garbage_seed=5))[1]
    assert (packed - alone).abs().max().item() < 1e-9


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_here:build", "cannot import no_such_module_here"),
        ("model_factory_example:absent", "model_factory_example has no absent"),
        ("model_factory_example:NOT_CALLABLE", "is a int, not a function"),
        ("model_factory_example:build_no_out_dim", "has no positive int out_dim"),
    ],
)
def test_a_bad_factory_is_a_value_error_naming_it(spec, message):
    with pytest.raises(ValueError, match=message):
        build_from_factory(spec, 3)
    with pytest.raises(ValueError, match=r"package\.module:function"):
        Config.from_preset(None, model_factory="just_a_module", run_name="x")


def test_the_architecture_example_factory_builds_and_trains(tmp_path, monkeypatch):
    """docs/ARCHITECTURE.md's 20-line --model-factory example, written to a module and used by name."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    section = text[text.index("### Your own videos and your own model") :]
    code = section[section.index("```python\n") + len("```python\n") :]
    code = code[: code.index("```")]
    assert len(code.strip().splitlines()) <= 20
    (tmp_path / "mymodels_example.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = Config.from_preset(None, model_factory="mymodels_example:build", run_name="x")
    model = build_model_for(config.model, num_classes=NUM_CLASSES, in_channels=3)
    loss, count = sequence_loss(model, _batch([CONTEXTS[2][0], CONTEXTS[0][0]], t_max=12))
    loss.backward()
    assert count == 5 and model.encoder.conv.weight.grad.abs().sum().item() > 0


# ------------------------------------------------------------------------------ precision and layout
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_frozen_batchnorm_keeps_the_inputs_precision(device):
    """bf16 in, bf16 out (float32 statistics would promote every activation to float32, and the next
    convolution would cast it back), within bf16's rounding of the float32 result; float64 stays float64."""
    norm = _randomise_frozen(nn.Sequential(FrozenBatchNorm(6))).to(device)[0]
    x = torch.randn(2, 6, 3, 4, 4, device=device)
    exact = norm(x)
    half = norm(x.bfloat16())
    assert exact.dtype == torch.float32 and half.dtype == torch.bfloat16
    eps = torch.finfo(torch.bfloat16).eps
    assert (half.float() - exact).norm() <= 8 * eps * exact.norm()
    assert norm.double()(x.double()).dtype == torch.float64


@CUDA
@pytest.mark.parametrize("arch", ["r3d_18", "resnet18"])
def test_convolutions_read_channels_last_on_cuda_with_the_same_features(arch):
    """On CUDA the encoders hand their first convolution a channels-last input (NDHWC for the video
    ResNets, NHWC for the frame ResNets), the weights untouched, and the features equal (float32, TF32
    off, 1e-4 relative) those of the same network fed the contiguous layout."""
    from raytrain_seq.models import build_resnet

    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    if arch == "r3d_18":
        encoder = VideoBackbone(arch, 3, norm="group").cuda().eval()
        first, x = encoder.net.stem[0], torch.randn(2, 4, 3, 16, 16, device="cuda")
        fmt = torch.channels_last_3d
    else:
        encoder = build_resnet(arch, 3, norm="frozen").cuda().eval()
        first, x = encoder.conv1, torch.randn(3, 3, 32, 32, device="cuda")
        fmt = torch.channels_last
    seen = []
    hook = first.register_forward_hook(lambda _m, inputs, _o: seen.append(inputs[0]))
    try:
        with torch.no_grad():
            ours = encoder(x)
    finally:
        hook.remove()
    assert seen[0].is_contiguous(memory_format=fmt) and first.weight.is_contiguous()
    with torch.no_grad():  # the same network without the layout change
        if arch == "r3d_18":
            plain = encoder.net(x.transpose(1, 2).contiguous())
        else:
            from torchvision.models import ResNet

            plain = ResNet.forward(encoder, x.contiguous())
    assert (ours - plain).norm() <= 1e-4 * plain.norm()
