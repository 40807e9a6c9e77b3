"""ResNet frame encoders (torchvision's ResNets): sizes and names, ImageNet file loading, frozen/group norm,
TSN init; the blocks are torchvision's, checked against a hand-written reference with our norm layers."""

from __future__ import annotations

import contextlib
import copy
import functools
import re
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raytrain_seq.algorithms.microbatch import BATCHNORM_TYPES
from raytrain_seq.models import (
    FRAME_ENCODERS,
    FrozenBatchNorm2d,
    ResNetEncoder,
    build_frame_encoder,
    build_model,
    cross_modality_init,
    cross_modality_weight,
    load_imagenet_weights,
    sequence_loss,
)
from raytrain_seq.models.resnet import BasicBlock, Bottleneck

ARCHS = ["resnet18", "resnet50", "resnet152"]
# torchvision.models.resnetXX() parameter counts (11,689,512 / 25,557,032 / 60,192,808) minus the fc
# layer (512 * 1000 + 1000 = 513,000 for resnet18, 2048 * 1000 + 1000 = 2,049,000 for 50 and 152).
TORCHVISION_PARAMS = {"resnet18": 11_176_512, "resnet50": 23_508_032, "resnet152": 58_143_808}
LAYOUT = {"resnet18": (2, (2, 2, 2, 2)), "resnet50": (3, (3, 4, 6, 3)), "resnet152": (3, (3, 8, 36, 3))}


@functools.cache
def _meta(arch, in_channels=3, norm="frozen"):
    """The module tree on the meta device: no 60M weights allocated or initialised; shared, never mutated."""
    with _on_meta():
        return ResNetEncoder(arch, in_channels, norm=norm)


@contextlib.contextmanager
def _on_meta():
    # Initialising meta tensors means nothing, yet normal_ on meta imports torch's compiler stack (~2 s).
    with torch.device("meta"), mock.patch.object(nn.init, "kaiming_normal_", lambda tensor, **_: tensor):
        yield


def _randomise_frozen(model):
    """Random statistics and affine in every FrozenBatchNorm2d (ImageNet-like, not the identity default)."""
    for module in model.modules():
        if isinstance(module, FrozenBatchNorm2d):
            n = module.num_features
            module.weight.copy_(torch.rand(n) + 0.5)
            module.bias.copy_(torch.randn(n) * 0.1)
            module.running_mean.copy_(torch.randn(n) * 0.1)
            module.running_var.copy_(torch.rand(n) + 0.5)
    return model


@functools.cache
def _built(arch, in_channels, norm, seed, dtype):
    torch.manual_seed(seed)
    return _randomise_frozen(ResNetEncoder(arch, in_channels, norm=norm).to(dtype))


def _encoder(arch="resnet18", in_channels=3, norm="frozen", seed=0, dtype=torch.float32):
    """A fresh encoder; frozen BN gets random statistics so loading and invariance tests are non-trivial."""
    return copy.deepcopy(_built(arch, in_channels, norm, seed, dtype))  # building costs ~0.3 s, a copy less


def _torchvision_keys(arch):
    """The state_dict keys of torchvision's resnet (fc and num_batches_tracked left out), written from its spec."""
    convs, counts = LAYOUT[arch]
    bn = ("weight", "bias", "running_mean", "running_var")
    keys = ["conv1.weight", *(f"bn1.{s}" for s in bn)]
    for stage, count in enumerate(counts, start=1):
        for block in range(count):
            prefix = f"layer{stage}.{block}"
            for i in range(1, convs + 1):
                keys += [f"{prefix}.conv{i}.weight", *(f"{prefix}.bn{i}.{s}" for s in bn)]
            # A shortcut conv where the shape changes: stride 2 (stages 2-4) or 64 -> 256 (Bottleneck stage 1).
            if block == 0 and (stage > 1 or convs == 3):
                keys += [f"{prefix}.downsample.0.weight", *(f"{prefix}.downsample.1.{s}" for s in bn)]
    return keys


@pytest.mark.parametrize("arch", ARCHS)
def test_parameter_counts_equal_torchvision_without_fc(arch):
    """GroupNorm variant: parameters == torchvision's minus fc; frozen: conv params + frozen affine == the same."""
    group, frozen = _meta(arch, norm="group"), _meta(arch)
    assert sum(p.numel() for p in group.parameters()) == TORCHVISION_PARAMS[arch]
    frozen_params = sum(p.numel() for p in frozen.parameters())
    affine = sum(
        m.weight.numel() + m.bias.numel() for m in frozen.modules() if isinstance(m, FrozenBatchNorm2d)
    )
    assert affine > 0 and frozen_params + affine == TORCHVISION_PARAMS[arch]
    # Frozen BN learns nothing: the only parameters left are the (bias-free) conv weights.
    assert all(p.dim() == 4 for p in frozen.parameters())
    # 6 input channels add 3 more 7x7 input planes to conv1's 64 filters.
    assert sum(p.numel() for p in _meta(arch, 6).parameters()) - frozen_params == 3 * 64 * 7 * 7
    assert frozen.out_dim == (512 if arch == "resnet18" else 2048)


def test_resnet18_count_by_hand():
    """ResNet-18 without fc counted layer by layer from its definition gives 11,176,512."""

    def block(c_in, c_out, shortcut):  # two 3x3 convs, two norms (2 * c_out each), optional 1x1 + norm
        return 9 * c_in * c_out + 9 * c_out * c_out + 4 * c_out + (c_in * c_out + 2 * c_out) * shortcut

    stem = 3 * 64 * 49 + 2 * 64
    stages = [block(64, 64, 0) * 2] + [block(c // 2, c, 1) + block(c, c, 0) for c in (128, 256, 512)]
    assert stem + sum(stages) == TORCHVISION_PARAMS["resnet18"] == 11_176_512


@pytest.mark.parametrize("arch", ARCHS)
def test_state_dict_keys_follow_torchvision_naming(arch):
    """Keys (order included) equal torchvision's minus fc/num_batches_tracked, for frozen norm; spot checks."""
    keys = list(_meta(arch).state_dict())
    expected = _torchvision_keys(arch)
    assert keys == expected
    # torchvision's full state_dicts have 122 / 320 / 932 keys: + fc (2) + one counter per BatchNorm.
    bns = sum(k.endswith("running_var") for k in keys)
    assert len(keys) + bns + 2 == {"resnet18": 122, "resnet50": 320, "resnet152": 932}[arch]
    known = {
        "resnet18": [
            "layer4.1.bn2.running_var",
            "layer2.0.downsample.1.running_mean",
            "layer1.1.conv2.weight",
        ],
        "resnet50": ["layer3.5.conv3.weight", "layer1.0.downsample.0.weight", "layer4.2.bn3.bias"],
        "resnet152": ["layer3.35.conv3.weight", "layer2.7.bn1.running_var", "layer4.0.downsample.1.weight"],
    }[arch]
    assert set(known) <= set(keys)
    assert "fc.weight" not in keys and "layer3.36.conv1.weight" not in keys
    shapes = _meta(arch).state_dict()
    if arch == "resnet152":
        assert tuple(shapes["layer3.35.conv3.weight"].shape) == (1024, 256, 1, 1)
        assert tuple(shapes["layer4.0.conv2.weight"].shape) == (512, 512, 3, 3)
    # GroupNorm keeps the module names but has no running statistics.
    group_keys = list(_meta(arch, norm="group").state_dict())
    assert group_keys == [k for k in expected if "running" not in k]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("norm", ["frozen", "group"])
def test_no_batchnorm_modules(arch, norm):
    """No BatchNorm module anywhere (the micro-batch streamer warns on those); one norm per conv instead."""
    encoder = _meta(arch, norm=norm)
    modules = list(encoder.modules())
    assert not any(isinstance(m, BATCHNORM_TYPES) for m in modules)
    norm_type = FrozenBatchNorm2d if norm == "frozen" else nn.GroupNorm
    convs = sum(isinstance(m, nn.Conv2d) for m in modules)
    assert convs == {"resnet18": 20, "resnet50": 53, "resnet152": 155}[arch]
    assert sum(isinstance(m, norm_type) for m in modules) == convs


def test_frozen_batchnorm_equals_batchnorm_in_eval_mode():
    """FrozenBatchNorm2d loads a BatchNorm2d state_dict (counter dropped) and matches it in eval mode."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8).double()
    bn.train()
    bn(torch.randn(16, 8, 5, 5, dtype=torch.float64) * 3 + 1)  # gives it non-trivial running statistics
    bn.weight.data.uniform_(0.5, 2.0)
    bn.bias.data.normal_()
    frozen = FrozenBatchNorm2d(8).double()
    state = bn.state_dict()
    assert "num_batches_tracked" in state
    frozen.load_state_dict(state)  # strict: includes num_batches_tracked, which must be dropped
    assert "num_batches_tracked" in state  # dropped from the module's copy, not the caller's dict
    copy.deepcopy(FrozenBatchNorm2d(8)).load_state_dict(state)  # a copied module drops it too
    x = torch.randn(3, 8, 4, 4, dtype=torch.float64)
    assert (frozen(x) - bn.eval()(x)).abs().max().item() < 1e-12
    # Not vacuous: the statistics matter (training-mode BN, which uses x's own statistics, differs).
    assert (frozen(x) - bn.train()(x)).abs().max().item() > 1e-3
    assert not list(frozen.parameters())


def test_frozen_batchnorm_is_torchvisions_bit_for_bit():
    """models.norm writes its own FrozenBatchNorm (so the small encoder imports no torchvision): the same
    buffers, keys, repr numbers and bits as torchvision.ops.FrozenBatchNorm2d on a frame batch."""
    from torchvision.ops import FrozenBatchNorm2d as Torchvision

    torch.manual_seed(1)
    theirs, ours = Torchvision(6), FrozenBatchNorm2d(6)
    for name, buffer in theirs.named_buffers():
        buffer.copy_(torch.rand(6) + 0.5 if name == "running_var" else torch.randn(6))
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = torch.randn(4, 6, 5, 5)
    assert torch.equal(ours(x), theirs(x))
    assert not torch.equal(ours(x), x)  # not vacuous: the statistics act
    assert repr(ours).endswith("(6, eps=1e-05)") and repr(theirs).endswith("(6, eps=1e-05)")


def _swap_in_batchnorm(encoder):
    """Replace every FrozenBatchNorm2d by a training-mode nn.BatchNorm2d (the coupling the encoder avoids)."""
    for module in list(encoder.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, FrozenBatchNorm2d):
                setattr(module, name, nn.BatchNorm2d(child.num_features).double().train())
    return encoder


@pytest.mark.parametrize("norm", ["frozen", "group"])
def test_output_of_a_sample_does_not_depend_on_its_batch(norm):
    """Micro-batch invariance (float64, 1e-12): a frame's features alone == in a batch of 3."""
    encoder = _encoder(in_channels=6, norm=norm, dtype=torch.float64).train()
    x = torch.randn(3, 6, 8, 8, dtype=torch.float64)  # 8 -> 4 (conv1) -> 2 (maxpool) -> 1 (layer2)
    with torch.no_grad():
        full = encoder(x)
        alone = torch.cat([encoder(x[i : i + 1]) for i in range(3)])
    assert full.shape == (3, 512)
    assert (full - alone).abs().max().item() < 1e-12
    assert (full[0] - full[1]).abs().max().item() > 1e-6  # the samples really differ
    # Not vacuous: the same network with training-mode BatchNorm gives each sample batch-dependent features.
    coupled = _swap_in_batchnorm(_encoder(in_channels=6, dtype=torch.float64))
    with torch.no_grad():
        diff = (coupled(x)[:2] - coupled(x[:2])).abs().max().item()
    assert diff > 1e-3


def _reference_block(block, x):
    """A residual block by hand with F.conv2d and the norms' own formulas, from the torchvision definition."""

    def norm(module, h):
        if isinstance(module, nn.GroupNorm):
            return F.group_norm(h, module.num_groups, module.weight, module.bias, module.eps)
        scale = module.weight / torch.sqrt(module.running_var + module.eps)
        return (h - module.running_mean[:, None, None]) * scale[:, None, None] + module.bias[:, None, None]

    convs = [block.conv1, block.conv2] + ([block.conv3] if isinstance(block, Bottleneck) else [])
    norms = [block.bn1, block.bn2] + ([block.bn3] if isinstance(block, Bottleneck) else [])
    h = x
    for i, (conv, bn) in enumerate(zip(convs, norms, strict=True)):
        h = norm(bn, F.conv2d(h, conv.weight, stride=conv.stride, padding=conv.padding))
        if i < len(convs) - 1:
            h = torch.relu(h)
    shortcut = x
    if block.downsample is not None:
        conv, bn = block.downsample
        shortcut = norm(bn, F.conv2d(x, conv.weight, stride=conv.stride))
    return torch.relu(h + shortcut)


@pytest.mark.parametrize("norm", ["frozen", "group"])
def test_blocks_match_a_hand_written_reference(norm):
    """BasicBlock (resnet18 layer2.0) and Bottleneck (stride 2 on its 3x3) equal F.conv2d by hand."""
    encoder = _encoder(in_channels=6, norm=norm, dtype=torch.float64)
    x = torch.randn(2, 64, 8, 8, dtype=torch.float64)
    block = encoder.layer2[0]
    out = block(x)
    assert out.shape == (2, 128, 4, 4) and block.downsample is not None
    assert (out - _reference_block(block, x)).abs().max().item() < 1e-12
    torch.manual_seed(0)
    make = FrozenBatchNorm2d if norm == "frozen" else (lambda c: nn.GroupNorm(32, c))
    down = nn.Sequential(nn.Conv2d(64, 128, 1, stride=2, bias=False), make(128))
    bottleneck = _randomise_frozen(Bottleneck(64, 32, 2, down, norm_layer=make).double())
    assert bottleneck.conv2.stride == (2, 2) and bottleneck.conv1.stride == (1, 1)  # v1.5: stride on 3x3
    out = bottleneck(x)
    assert out.shape == (2, 128, 4, 4)
    assert (out - _reference_block(bottleneck, x)).abs().max().item() < 1e-12
    out.sum().backward()  # in-place ReLUs must not break autograd
    assert bottleneck.conv1.weight.grad.abs().sum().item() > 0
    basic = _randomise_frozen(BasicBlock(64, 64, 1, None, norm_layer=make).double())
    assert (basic(x) - _reference_block(basic, x)).abs().max().item() < 1e-12


def _torchvision_like_state(encoder):
    """What a torchvision ImageNet file holds: the encoder's tensors, an fc layer and BN batch counters."""
    state = dict(encoder.state_dict())
    for key in [k for k in state if k.endswith("running_var")]:
        state[key.replace("running_var", "num_batches_tracked")] = torch.tensor(100)
    state["fc.weight"] = torch.zeros(()).expand(1000, encoder.out_dim)
    state["fc.bias"] = torch.zeros(1000)
    return state


@pytest.fixture(scope="module")
def rgb_file(tmp_path_factory):
    """A resnet18 RGB encoder (random BN statistics) and a torchvision-like file of it (one 45 MB save)."""
    source = _encoder()
    path = tmp_path_factory.mktemp("weights") / "resnet18.pth"
    torch.save(_torchvision_like_state(source), path)
    return source, path


def _tiny_file(path, arch="resnet18", edit=None):
    """A file with torchvision's keys and shapes whose tensors are stride-0 views of one value (a few KB)."""
    state = {k: torch.zeros(()).expand(v.shape) for k, v in _meta(arch).state_dict().items()}
    torch.save(edit(state) if edit else state, path)
    return path


def test_weights_round_trip_through_a_file(rgb_file):
    """A state saved from one encoder loads into another (fc and counters skipped): same tensors, same output."""
    source, path = rgb_file
    # The registry route (what --weights would use), with the classifier's small-encoder options ignored.
    target = build_frame_encoder("resnet18", 3, weights=path, width=16, depth=4)
    # Not vacuous: the source's frozen BN is far from a fresh encoder's identity (ones / zeros).
    assert (source.bn1.running_var - 1).abs().min().item() > 0 and source.layer4[1].bn2.bias.abs().max() > 0
    for key, value in source.state_dict().items():
        assert torch.equal(value, target.state_dict()[key]), key
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(source(x), target(x))
    target.bn1.running_var.fill_(1.0)
    skipped = load_imagenet_weights(target, path)  # the plain function, into an existing encoder
    assert torch.equal(target.bn1.running_var, source.bn1.running_var)
    assert {"fc.weight", "fc.bias", "layer4.1.bn2.num_batches_tracked"} <= set(skipped)
    assert len(skipped) == 2 + 20


def test_mismatched_files_raise_naming_the_file_and_key(tmp_path, rgb_file):
    """A missing, extra or wrongly shaped key raises ValueError naming the file and that key."""

    def rename(state):
        state["layer2.1.bn1.running_vax"] = state.pop("layer2.1.bn1.running_var")
        return state

    encoder = _meta("resnet18")  # every check runs before a tensor is copied: no real encoder needed
    path = _tiny_file(tmp_path / "renamed.pth", edit=rename)
    with pytest.raises(ValueError, match=r"renamed\.pth.*'layer2\.1\.bn1\.running_var' is missing"):
        load_imagenet_weights(encoder, path)
    path = _tiny_file(tmp_path / "extra.pth", edit=lambda s: {**s, "layer5.0.conv1.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"extra\.pth.*'layer5\.0\.conv1\.weight' is not in resnet18"):
        load_imagenet_weights(encoder, path)
    path = _tiny_file(
        tmp_path / "wrong.pth", edit=lambda s: {**s, "layer3.0.conv2.weight": torch.zeros(256, 256, 1, 1)}
    )
    with pytest.raises(
        ValueError, match=r"wrong\.pth.*'layer3\.0\.conv2\.weight' has shape \(256, 256, 1, 1\)"
    ):
        load_imagenet_weights(encoder, path)
    # A resnet50 file into resnet18: the first differing key is named (1x1 vs 3x3 in layer1.0.conv1).
    with pytest.raises(ValueError, match=r"'layer1\.0\.conv1\.weight' has shape \(64, 64, 1, 1\)"):
        load_imagenet_weights(encoder, _tiny_file(tmp_path / "r50.pth", arch="resnet50"))
    with pytest.raises(ValueError, match="does not exist"):
        load_imagenet_weights(encoder, tmp_path / "absent.pth")
    (tmp_path / "text.pth").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"text\.pth could not be read"):
        load_imagenet_weights(encoder, tmp_path / "text.pth")
    # ImageNet BatchNorm statistics have nowhere to go in a GroupNorm encoder: a clear error says so.
    with pytest.raises(ValueError, match=r"'bn1\.running_mean' is not in resnet18.*norm='frozen'"):
        load_imagenet_weights(_meta("resnet18", norm="group"), rgb_file[1])


@pytest.mark.parametrize("channels", [6, 4])
def test_imagenet_conv1_is_averaged_and_repeated_for_other_channel_counts(rgb_file, channels):
    """An RGB file into a C-channel encoder: conv1 = mean over RGB repeated C times (no rescale), rest equal."""
    source, path = rgb_file
    dtype = torch.float64 if channels == 6 else torch.float32  # float64 (cached) also checks the cast
    target = _encoder(in_channels=channels, dtype=dtype)
    load_imagenet_weights(target, path)
    rgb = source.conv1.weight.detach()
    assert (rgb[:, 0] - rgb[:, 1]).abs().max().item() > 1e-3  # the RGB filters really differ per channel
    expected = rgb.mean(dim=1, keepdim=True).repeat(1, channels, 1, 1).to(dtype)
    assert torch.equal(target.conv1.weight.detach(), expected)
    for key, value in source.state_dict().items():
        if key != "conv1.weight":
            assert torch.equal(value.to(dtype), target.state_dict()[key]), key
    with torch.no_grad():
        assert target(torch.randn(2, channels, 8, 8, dtype=dtype)).shape == (2, 512)
    with pytest.raises(ValueError, match=f"in_channels={channels + 1}"):
        target(torch.randn(1, channels + 1, 8, 8, dtype=dtype))


@pytest.mark.parametrize("channels", [6, 4])
def test_resnet50_takes_six_and_four_channels(channels):
    """resnet50 maps float [N, 6 or 4, H, W] to [N, 2048] (finite), and rejects other channel counts."""
    torch.manual_seed(0)
    encoder = ResNetEncoder("resnet50", channels)
    with torch.no_grad():
        out = encoder(torch.randn(2, channels, 8, 8))
    assert out.shape == (2, 2048) and bool(out.isfinite().all()) and out.abs().max().item() > 0
    with pytest.raises(ValueError, match=f"resnet50 expects \\[N, {channels}, H, W\\].*in_channels=3"):
        encoder(torch.randn(2, 3, 8, 8))


def test_cross_modality_weight_groups_follow_the_worked_example():
    """groups=2: target 0-1 = mean of source 0-2 (frames), target 2-3 = mean of source 3-5 (differences)."""
    w = torch.randn(5, 6, 3, 3, dtype=torch.float64)
    out = cross_modality_weight(w, 4, groups=2)
    frames, diffs = w[:, :3].mean(1), w[:, 3:].mean(1)
    for c, ref in enumerate([frames, frames, diffs, diffs]):
        assert torch.allclose(out[:, c], ref, rtol=0, atol=1e-15)
    assert (frames - diffs).abs().max().item() > 1e-3  # the two groups really differ
    assert torch.allclose(cross_modality_weight(w, 4)[:, 3], w.mean(1), rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="groups=4 must divide"):
        cross_modality_weight(w, 4, groups=4)


@pytest.mark.parametrize(
    ("backbone", "first_conv"), [("resnet18", "encoder.conv1.weight"), ("small", "encoder.features.0.weight")]
)
def test_cross_modality_init_from_an_rgb_classifier(backbone, first_conv):
    """RGB run -> flow model: first conv = mean over the RGB model's channels repeated, every other key copied."""
    kwargs = {"backbone": backbone, "width": 4, "depth": 2, "hidden": 6}
    torch.manual_seed(0)
    rgb = build_model(5, in_channels=3, **kwargs)  # encoder sees 6 channels: frames + differences
    flow = build_model(5, in_channels=2, **kwargs)  # 4 channels
    state = cross_modality_init(flow.state_dict(), rgb.state_dict())
    source = rgb.state_dict()
    assert source[first_conv].shape[1] == 6 and flow.state_dict()[first_conv].shape[1] == 4
    assert torch.equal(state[first_conv], source[first_conv].mean(1, keepdim=True).repeat(1, 4, 1, 1))
    assert not torch.equal(state[first_conv], flow.state_dict()[first_conv])
    assert list(state) == list(flow.state_dict())
    for key, value in source.items():
        if key != first_conv:
            assert torch.equal(state[key], value), key
    flow.load_state_dict(state)  # strict: the result is a complete flow state
    grouped = cross_modality_init(flow.state_dict(), source, key=first_conv, groups=2)[first_conv]
    assert torch.equal(grouped[:, 2:], source[first_conv][:, 3:].mean(1, keepdim=True).repeat(1, 2, 1, 1))
    other = {**flow.state_dict(), "head.weight": torch.zeros(7, 12)}  # a 7-class flow model's head
    with pytest.raises(ValueError, match=re.escape("'head.weight' has shape (5, 12)")):
        cross_modality_init(other, source)
    with pytest.raises(ValueError, match=r"'nope\.weight' is not in target_state"):
        cross_modality_init(flow.state_dict(), source, key="nope.weight")
    with pytest.raises(ValueError, match=r"source \(RGB\) state lacks key 'head\.bias'"):
        cross_modality_init(flow.state_dict(), {k: v for k, v in source.items() if k != "head.bias"})


def test_resnet18_classifier_end_to_end_on_a_block_batch():
    """build_model(backbone="resnet18") gives reset-exact logits per sequence and gradients to conv weights."""
    torch.manual_seed(0)
    model = build_model(4, backbone="resnet18", width=16, depth=4, hidden=6)
    g = torch.Generator().manual_seed(1)
    frames = torch.randint(0, 256, (2, 6, 8, 8, 3), dtype=torch.uint8, generator=g)
    batch = {
        "frames": frames,
        "starts": torch.tensor([[0, 2], [0, -1]]),
        "lengths": torch.tensor([[2, 4], [5, -1]]),
        "labels": torch.tensor([[1, 3], [0, -1]]),
        "num_sequences": torch.tensor([2, 1]),
    }
    logits = model(batch["frames"], batch["starts"], batch["lengths"], batch["num_sequences"])
    assert logits.shape == (3, 4)
    # Sequence (0, 1) alone, at offset 0 of its own row, gives the same logits (reset-exact, no BN coupling).
    alone = model(frames[:1, 2:6], torch.tensor([[0]]), torch.tensor([[4]]), torch.tensor([1]))
    assert (alone[0] - logits[1]).abs().max().item() < 1e-5  # float32 rounding only
    loss_sum, count = sequence_loss(model, batch)
    loss_sum.backward()
    assert count == 3
    assert model.encoder.conv1.weight.grad.abs().sum().item() > 0
    assert model.encoder.layer4[1].conv2.weight.grad.abs().sum().item() > 0


def test_registry_entries_and_option_checks():
    """FRAME_ENCODERS has the three ResNets; unknown options, norms and names raise with the choices."""
    assert {"small", "resnet18", "resnet50", "resnet152"} <= set(FRAME_ENCODERS)
    with pytest.raises(TypeError, match="nrom"):
        build_frame_encoder("resnet18", 3, nrom="group")
    with pytest.raises(ValueError, match="'frozen', 'group', 'batch'"):
        build_frame_encoder("resnet18", 3, norm="BatchNorm")
    with pytest.raises(ValueError, match="resnet152"):
        build_frame_encoder("resnet34", 3)
    with pytest.raises(ValueError, match="in_channels"):
        ResNetEncoder("resnet18", 0)
    with _on_meta():
        assert isinstance(build_frame_encoder("resnet18", 2, norm="group", depth=3).bn1, nn.GroupNorm)


def test_build_model_for_with_weights_tiles_rgb_averages_flow_and_freezes_norm(rgb_file):
    """--weights: frozen BN loaded; RGB conv1 = the ImageNet filters tiled over [frames, diffs], ImageNet
    mean/std for RGB frames; a flow model gets TSN's average; every other encoder tensor is the file's."""
    from raytrain_seq.config import Config
    from raytrain_seq.models import IMAGENET_MEAN, IMAGENET_STD
    from raytrain_seq.models.factory import build_model_for

    source, path = rgb_file
    config = Config.from_preset(None, backbone="resnet18", weights=str(path), hidden=6, run_name="x")
    rgb = build_model_for(config.model, num_classes=4, in_channels=3)
    flow = build_model_for(config.model, num_classes=4, in_channels=2)
    conv = source.conv1.weight.detach()
    assert (conv[:, 0] - conv[:, 1]).abs().max().item() > 1e-3  # colour filters really differ per channel
    assert isinstance(rgb.encoder.bn1, FrozenBatchNorm2d) and rgb.encoder.norm == "frozen"
    assert torch.equal(rgb.encoder.conv1.weight, torch.cat([conv, conv], dim=1))
    assert torch.equal(flow.encoder.conv1.weight, conv.mean(1, keepdim=True).expand(-1, 4, -1, -1))
    for key, value in source.state_dict().items():
        if key != "conv1.weight":
            assert torch.equal(rgb.encoder.state_dict()[key], value), key
    assert torch.allclose(rgb.normalizer.mean, torch.tensor(IMAGENET_MEAN))
    assert torch.allclose(rgb.normalizer.std, torch.tensor(IMAGENET_STD))
    assert torch.allclose(flow.normalizer.mean, torch.full((2,), 0.5))  # flow keeps x / 255 - 0.5
    scratch = build_model_for(
        Config.from_preset(None, backbone="resnet18", run_name="x").model, num_classes=4, in_channels=3
    )
    assert isinstance(scratch.encoder.bn1, nn.GroupNorm)  # without weights: GroupNorm, trainable from scratch
