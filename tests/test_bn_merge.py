"""model.norm="batchnorm": BatchNorm that trains, its running statistics through a real averaging round.

Every other model of the job freezes BatchNorm or uses GroupNorm, so Algorithm 2's merge of (mean, var)
pairs (``train.merge_bn_stats``) meets a real model only here and in ``bench/bn_merge.py``: the option
builds on each backbone family, the statistics move when a step trains, they travel to the averager
with the weights, and both learners come back holding the law-of-total-variance merge (or the plain mean
with the merge off), checked against a reference computed by hand in float64.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from averager_fixtures import local_averager
from conftest import InProcess
from packed_rows import packed_batch, sequence
from test_flat_storage import RecordingPuts

from raytrain_seq import config as config_module
from raytrain_seq.config import Config
from raytrain_seq.models.factory import MODEL_NORMS, build_model_for
from raytrain_seq.models.norm import FrozenBatchNorm, GroupNorm
from raytrain_seq.rounds.client import AveragerClient
from raytrain_seq.rounds.position import EpochPosition
from raytrain_seq.rounds.sync import LocalRounds
from raytrain_seq.training.step import InnerStep

BN = torch.nn.modules.batchnorm._BatchNorm


def _norms(model: torch.nn.Module) -> dict[str, int]:
    kinds = {"batch": BN, "frozen": FrozenBatchNorm, "group": GroupNorm}
    return {name: sum(isinstance(m, kind) for m in model.modules()) for name, kind in kinds.items()}


def test_the_config_and_the_factory_name_the_same_norms():
    assert config_module.NORMS == MODEL_NORMS == ("auto", "batchnorm")
    from raytrain_seq.models.frame_encoder import SmallFrameEncoder

    with pytest.raises(ValueError, match="'group' or 'batch'"):
        SmallFrameEncoder(3, norm="frozen")  # the small encoder has no frozen statistics to hold


@pytest.mark.parametrize("backbone", ["small", "resnet18", "r3d_18"])
def test_batchnorm_builds_trainable_batchnorm_on_each_backbone_family_and_auto_keeps_none(backbone):
    """Per-frame small and ResNet encoders and a torchvision video ResNet: "batchnorm" puts trainable
    BatchNorm (affine parameters, running statistics) where "auto" has GroupNorm only."""
    model = build_model_for(
        Config.from_preset(None, backbone=backbone, norm="batchnorm").model, num_classes=4, in_channels=3
    )
    found = _norms(model)
    assert found["batch"] > 0 and found["frozen"] == 0 and found["group"] == 0, found
    bn = next(m for m in model.modules() if isinstance(m, BN))
    assert bn.track_running_stats and bn.weight.requires_grad
    assert any(p is bn.weight for p in model.parameters())
    auto = _norms(
        build_model_for(Config.from_preset(None, backbone=backbone).model, num_classes=4, in_channels=3)
    )
    assert auto["batch"] == 0 and auto["frozen"] == 0 and auto["group"] > 0, auto


def test_an_init_from_run_must_agree_on_the_norm(tmp_path):
    """model.norm fixes the state's keys (trained BatchNorm keeps num_batches_tracked), so a source run
    of the other norm is refused like one of other sizes, naming the flag that fits."""
    from types import SimpleNamespace

    from raytrain_seq.models import factory

    source = SimpleNamespace(
        folder=tmp_path / "checkpoint_000001", config={"model": {"norm": "batchnorm"}},
        state=SimpleNamespace(params={}),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"model\.norm=.batchnorm.*--norm batchnorm"):
        factory._check_architecture(Config.from_preset("demo").model, source, 3)
    factory._check_architecture(
        Config.from_preset("demo", norm="batchnorm").model, source, 3
    )  # agrees: no error


def _batch(seed: int, shift: int) -> dict[str, torch.Tensor]:
    """Two block rows of three sequences at 16 x 16; ``shift`` brightens the frames (learners that see
    different data end with different running means)."""
    seqs = [(sequence(seed * 10 + i, n, hw=16).int() + shift).clamp(0, 255).to(torch.uint8) for i, n in
            enumerate((3, 4, 6))]  # fmt: skip
    rows = [[(0, seqs[0], 0), (3, seqs[1], 1)], [(0, seqs[2], 2)]]
    return packed_batch(rows, 7, max_sequences=2, hw=16)


def _learner(seed: int, shift: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The run's model (seeded like a learner: every learner starts from the same weights) after two
    steps of the job's inner step on its own data."""
    torch.manual_seed(0)
    model = build_model_for(Config.from_preset("demo", norm="batchnorm").model, num_classes=3, in_channels=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = InnerStep(model, optimizer, micro_batch_size=2)
    for k in range(2):
        step(_batch(seed + k, shift))
    return model, optimizer


def _stats(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "running_" in k or "batches" in k}


def test_a_training_step_moves_the_running_statistics():
    torch.manual_seed(0)
    model = build_model_for(Config.from_preset("demo", norm="batchnorm").model, num_classes=3, in_channels=3)
    before = _stats(model)
    step = InnerStep(model, torch.optim.Adam(model.parameters(), lr=1e-3), micro_batch_size=2)
    step(_batch(0, 0))
    after = _stats(model)
    assert set(before) == set(after) and len(after) == 9  # demo: depth 3 -> 3 BatchNorms x 3 buffers
    for key in after:
        if key.endswith("num_batches_tracked"):
            assert int(after[key]) == 1  # one micro-batch of two rows
        else:
            assert not torch.equal(before[key], after[key]), key


def _round(merge: bool) -> tuple[list[dict], list[dict]]:
    """Two learners' BN statistics before one real round (LocalRounds -> an in-process averager with 2
    shards -> back) and after it."""
    averager = local_averager(2, timeout_s=30.0, shards=2, merge_bn_stats=merge)
    transport = InProcess(averager)
    learners, before = [], []
    for j in range(2):
        model, optimizer = _learner(seed=j, shift=60 * j)
        before.append(_stats(model))
        client = AveragerClient(transport, learner=j, world_size=2, incarnation=f"i{j}", round_timeout_s=30.0,
                                store=RecordingPuts())  # fmt: skip
        client.join()
        learners.append((model, LocalRounds(client, model, optimizer, k=1, merge_bn_stats=merge)))
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda pair: pair[1].sync(stats={}, position=EpochPosition(0)), learners))
    finally:
        transport.close()
    return before, [_stats(model) for model, _ in learners]


@pytest.mark.parametrize("merge", [True, False])
def test_a_round_brings_both_learners_the_merged_statistics_computed_by_hand(merge):
    """Algorithm 2 (lines 1, 3, 6) on the real model: m = (m0 + m1) / 2 and, merged, v = (v0 + v1) / 2 +
    ((m0 - m)^2 + (m1 - m)^2) / 2 (the variance of the two learners' data together), else the plain
    mean (v0 + v1) / 2; num_batches_tracked is learner 0's (a counter, not an estimate)."""
    before, after = _round(merge)
    assert after[0].keys() == after[1].keys() == before[0].keys()
    gaps = []
    for key in after[0]:
        assert torch.equal(after[0][key], after[1][key]), key  # both learners hold the same values
        if key.endswith("num_batches_tracked"):
            assert torch.equal(after[0][key], before[0][key])
            continue
        if key.endswith("running_var"):
            m0, m1 = (b[key.replace("running_var", "running_mean")].double() for b in before)
            v0, v1 = (b[key].double() for b in before)
            m = (m0 + m1) / 2
            between = ((m0 - m) ** 2 + (m1 - m) ** 2) / 2
            expected = (v0 + v1) / 2 + (between if merge else 0)
            gaps.append(float((between / ((v0 + v1) / 2)).max()))
        else:
            expected = (before[0][key].double() + before[1][key].double()) / 2
        torch.testing.assert_close(after[0][key].double(), expected, rtol=1e-6, atol=1e-7)
    # The learners saw data of different brightness: the merge adds a between-learner term the plain
    # mean lacks, well above float32's resolution (were it 0, the merge would be a no-op). It is small
    # (about 4e-4 of the variance here after two steps at BatchNorm's momentum 0.1): bench/bn_merge.py
    # measures its size at the end of real runs.
    assert max(gaps) > 1e-5, gaps
