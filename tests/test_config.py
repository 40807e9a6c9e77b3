"""Tests for raytrain_seq.config, the run's dataclass tree (its command line: tests/test_cli.py)."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from raytrain_seq.config import PRESETS, Config, DataConfig, ModelConfig, RunConfig, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIG_FILES = sorted((ROOT / "raytrain_seq" / "config").rglob("*.py"))  # the tree's package, every module
SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "run": RunConfig}


# Fields whose rule depends on another field: that field's value for both the bad and the good case.
CONTEXT = {
    "data.fps": {"stride": 1},
    "data.data_root": {"dataset": "ucf101"},
    "model.depth": {"width": 16},
    "train.warmup_steps": {"steps": 100},
}


def _build(path: str, value):
    """Config with the single field ``path`` ("train.batch_size") set to ``value`` (plus its CONTEXT)."""
    section, name = path.split(".")
    return Config.from_dict({section: {**CONTEXT.get(path, {}), name: value}})


# (field, a bad value, a good value nearby): the good value proves the rule is what rejects the bad one.
BAD_VALUES = [
    ("data.dataset", "imagenet", "synthetic"),
    ("data.dataset", "UCF101", "synthetic"),
    ("data.data_root", "", "/videos"),
    ("data.data_root", 3, "/videos"),
    ("data.split", 4, 3),
    ("data.split", "1", 1),
    ("data.stream", "depth", "rgb"),
    ("data.decoder", "ffmpeg", "opencv"),
    ("data.decoder", None, "auto"),
    ("data.fps", 0, 25.0),
    ("data.fps", -5.0, 12.5),
    ("data.fps", "25", 25),
    ("data.num_classes", 1, 2),
    ("data.num_classes", 2.0, 2),
    ("data.num_classes", True, 2),
    ("data.num_classes", "10", 10),
    ("data.num_classes", 133, 132),  # the synthetic set has 132 classes
    ("data.max_videos", 0, 10),
    ("data.max_videos", 9, 10),  # fewer videos than the 10 default classes
    ("data.max_videos", 12.5, 12),
    ("data.stride", 0, 1),
    ("data.stride", 2.0, 2),
    ("data.stride", 2**64, 8),  # past any video: the strided lengths would overflow int64
    ("data.t_max", 0, 1),
    ("data.t_max", "auto", None),
    ("data.cache_size", 0, 36),
    ("data.crop", 0, 1),
    ("data.crop", 37, 36),  # larger than the default cache_size 36
    ("data.packing", "ffd", "bload"),
    ("data.packing", "OPTIMAL", "optimal"),
    ("data.reuse", 0, 1),
    ("data.reuse", 1.5, 2),
    ("data.val_fraction", 0, 0.01),
    ("data.val_fraction", 1.0, 0.99),
    ("data.val_fraction", -0.1, 0.1),
    ("data.val_fraction", math.nan, 0.1),
    ("data.val_fraction", "0.1", 0.1),
    ("data.seed", -1, 0),
    ("data.seed", 1.0, 1),
    ("data.augment_cost", -0.5, 0.5),
    ("data.augment_cost", math.inf, 0.5),
    ("data.augment_cost_per_frame", -1e-3, 4e-4),
    ("data.randaugment_ops", -1, 2),
    ("data.randaugment_ops", 1.5, 2),
    ("data.randaugment_magnitude", 31, 9),
    ("data.randaugment_magnitude", -1, 9),
    ("data.frame_cache_gib", -1, 16),
    ("data.frame_cache_gib", math.nan, 0),
    ("data.frame_cache_gib", 2.0**41, 16),
    ("data.frame_cache_dir", "", "/mnt/local/frames"),
    ("data.train_list", "", None),
    ("data.train_list", "train.txt", None),  # a list file without --dataset list
    ("data.test_list", "  ", None),
    ("data.val_list", 3, None),
    ("data.class_names", "", None),
    ("model.backbone", "resnet34", "resnet50"),
    ("model.backbone", "ResNet18", "small"),
    ("model.weights", "", None),
    ("model.model_factory", "mymodels", None),
    ("model.model_factory", "my-models:build", None),
    ("model.init_from", "  ", "/runs/rgb"),
    ("model.fuse", ("only-one",), None),
    ("model.fuse", ("a", ""), None),
    ("model.width", 0, 1),
    ("model.depth", 0, 1),
    ("model.depth", 12, 5),  # 16 channels doubled per stage: about 6e9 parameters
    ("model.width", 100_000, 64),
    ("model.hidden", -4, 4),
    ("model.hidden", 100_000, 512),
    ("model.temporal", "lstm", "tcn"),
    ("model.norm", "batch", "batchnorm"),
    ("train.learners", 0, 1),
    ("train.learners", "2-8", 3),
    ("train.learners", "8:2", 8),
    ("train.learners", (0, 2), (1, 2)),
    ("train.max_failures", -2, -1),
    ("train.max_failures", 1.0, 1),
    ("train.worker_start_timeout_s", 0, 1.0),
    ("train.poll_interval_s", 0.0, 1.0),
    ("train.averager_max_restarts", -3, 0),
    ("train.feed_max_restarts", -2, 1),
    ("train.keep_freed_memory", 1, False),
    ("train.adaptive_batch", "no", False),
    ("train.merge_moments", 0, True),
    ("train.merge_bn_stats", "yes", False),
    ("train.averager_channels", 1, False),
    ("train.k", 0, 1),
    ("train.k", -2, -1),
    ("train.k", 1.5, 2),
    ("train.batch_size", 0, 1),
    ("train.batch_size", True, 1),
    ("train.max_batch_size", 3, 4),  # below the default batch_size 4
    ("train.micro_batch_size", 0, 1),
    ("train.micro_batch_size", "max", "auto"),
    ("train.micro_batch_size", 2.0, 2),
    ("train.validate_every", 0, 1),
    ("train.b1", 0, 0.5),
    ("train.b2", 0.5, 1),
    ("train.batch_growth", "epochs", "always"),
    ("train.batch_rule", "strict", "paper"),
    ("train.epochs", 0, 1),
    ("train.steps", 0, 100),
    ("train.steps", 2.5, 3),
    ("train.lr", 0, 1e-5),
    ("train.lr", -1e-3, 1e-3),
    ("train.lr", math.nan, 1e-3),
    ("train.lr", math.inf, 1e-3),
    ("train.optimizer", "rmsprop", "sgd"),
    ("train.optimizer", "Adam", "adamw"),
    ("train.weight_decay", -1e-4, 0),
    ("train.averager_timeout_s", 0, 0.5),
    ("train.averager_probe_s", -1, 0.5),
    ("train.averager_shards", 0, 2),
    ("train.checkpoint_every", 0, 1),
    ("train.use_gpu", "yes", True),
    ("train.use_gpu", 1, False),
    ("train.gpus_per_learner", 0, 0.5),
    ("train.gpus_per_learner", 2, 1),
    ("train.gpus_per_learner", 1.5, 0.25),
    ("train.validator", "rank0", "learners"),
    ("run.storage_path", "", "scratch/runs"),
    ("run.storage_path", "   ", "runs"),
    ("run.run_name", "a/b", "a-b"),
    ("run.run_name", "", "x"),
    ("run.run_name", "..", "..x"),
    ("run.resume", "yes", False),
    ("run.tracker", "wandb", "none"),
    ("run.object_store_gb", 0.05, 0.5),
    ("run.object_store_gb", "4", 4),
    ("run.object_store_gb", math.inf, 8.0),
    ("run.object_store_gb", True, None),
    ("data.test_views", "five_crop", "ten_crop"),
    ("train.precision", "fp8", "bf16"),
    ("train.lr_schedule", "step", "cosine"),
    ("train.warmup_steps", -1, 10),
    ("train.warmup_steps", 100, 99),  # not below train.steps=100: the warm-up would never end
    ("run.keep_checkpoints", 0, 1),
    ("run.keep_checkpoints", 2.0, None),
    ("run.verbose", "yes", True),
]


@pytest.mark.parametrize(("path", "bad", "good"), BAD_VALUES, ids=[f"{p}={b!r}" for p, b, _ in BAD_VALUES])
def test_every_invalid_value_raises_naming_field_value_and_fix(path, bad, good):
    """A bad value raises ValueError naming the field (section.name), the value, and a fix after it."""
    section, name = path.split(".")
    assert getattr(_build(path, good), section).__dict__[name] == good  # the neighbour is accepted
    with pytest.raises(ValueError) as info:
        _build(path, bad)
    message = str(info.value)
    assert path in message, message
    assert repr(bad) in message, message
    tail = message[message.index(repr(bad)) + len(repr(bad)) :]
    assert len(tail.strip(" :;,.()")) >= 10, f"no fix after the value: {message}"


def test_every_field_has_a_rule_in_the_table():
    """The table above covers every field, so a field added later must come with its rule."""
    covered = {p for p, _, _ in BAD_VALUES}
    every = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    assert every - covered == set()


def test_real_video_datasets_need_a_data_root_and_flow_needs_real_video():
    """ucf101/hmdb51 without data_root name data.data_root and --data-root; flow on synthetic is refused."""
    for name in ("ucf101", "hmdb51"):
        with pytest.raises(ValueError, match=r"data\.data_root.*--data-root"):
            Config.from_dict({"data": {"dataset": name}})
        config = Config.from_dict({"data": {"dataset": name, "data_root": "/v", "stream": "flow"}})
        assert config.data.num_classes is None  # None = every class of the dataset, read by the feed
    assert Config().data.num_classes == 10  # the synthetic set's default
    with pytest.raises(ValueError, match=r"data\.stream='flow' needs real video"):
        Config.from_dict({"data": {"stream": "flow"}})


def test_learners_count_or_elastic_range_round_trips():
    """learners: 2 stays 2, "2:8" and [2, 8] become (2, 8), "3:3" -> 3; min/max follow; JSON round trip."""
    cases = {2: (2, 2, 2), "4": (4, 4, 4), "2:8": ((2, 8), 2, 8), (1, 2): ((1, 2), 1, 2), "3:3": (3, 3, 3)}
    for value, (stored, low, high) in cases.items():
        train = Config.from_dict({"train": {"learners": value}}).train
        assert (train.learners, train.min_learners, train.max_learners) == (stored, low, high), value
    config = Config.from_dict({"train": {"learners": "2:8"}})
    again = Config.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again.train.learners == (2, 8) and again == config


def test_fuse_stream_and_fuse_runs_come_together():
    """stream='fuse' needs model.fuse and model.fuse needs stream='fuse'; the pair survives JSON."""
    with pytest.raises(ValueError, match="--fuse RGB_RUN FLOW_RUN"):
        Config.from_dict({"data": {"stream": "fuse"}})
    with pytest.raises(ValueError, match="--stream fuse"):
        Config.from_dict({"model": {"fuse": ["a", "b"]}})
    config = Config.from_dict({"data": {"stream": "fuse"}, "model": {"fuse": ["/r/rgb", "/r/flow"]}})
    assert config.model.fuse == ("/r/rgb", "/r/flow")
    assert Config.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_resume_needs_a_run_name():
    """resume=True without run_name raises naming run.run_name; with a name it is accepted."""
    with pytest.raises(ValueError, match=r"run\.run_name"):
        Config(run=RunConfig(resume=True))
    assert Config(run=RunConfig(resume=True, run_name="r1")).run.run_name == "r1"


def test_sections_must_have_their_types():
    """Config(data={...}) raises TypeError pointing at from_dict instead of failing later."""
    with pytest.raises(TypeError, match="from_dict"):
        Config(data={"stride": 2})


def test_validate_rechecks_after_in_place_change():
    """validate() catches a field changed after construction."""
    config = Config()
    config.validate()
    config.train.epochs = 0
    with pytest.raises(ValueError, match=r"train\.epochs"):
        config.validate()


def test_config_module_has_no_asserts_and_every_field_a_docstring():
    """No module of the config package asserts (python -O), and each field has a one-line docstring on the
    next line."""
    trees = [ast.parse(path.read_text()) for path in CONFIG_FILES]
    assert len(trees) > 1, "the config package's modules were not found"
    assert not [n for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    classes = {n.name: n for tree in trees for n in tree.body if isinstance(n, ast.ClassDef)}
    checked = 0
    for name in ("Config", *(cls.__name__ for cls in SECTIONS.values())):
        body = classes[name].body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign) and "ClassVar" not in ast.unparse(node.annotation):
                doc = body[i + 1]
                assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), node.target.id
                assert isinstance(doc.value.value, str) and "\n" not in doc.value.value.strip()
                checked += 1
    assert checked == 4 + sum(len(dataclasses.fields(cls)) for cls in SECTIONS.values())


def test_to_dict_from_dict_round_trip_through_json():
    """to_dict is plain JSON; from_dict(json) rebuilds an equal Config, non-default values included."""
    config = Config.from_preset(
        "demo", micro_batch_size="auto", t_max=40, use_gpu=False, optimizer="adamw", run_name="rt"
    )
    d = config.to_dict()
    assert set(d) == set(SECTIONS)
    text = json.dumps(d)
    back = Config.from_dict(json.loads(text))
    assert back == config and back.to_dict() == d
    assert back != Config.from_preset("demo", run_name="rt")  # the overrides really changed it
    assert back.train.micro_batch_size == "auto" and back.data.t_max == 40


def test_from_dict_rejects_unknown_keys_by_name():
    """Unknown section or field keys raise ValueError naming them (with a close match when there is one)."""
    with pytest.raises(ValueError, match=r"'train\.epoch'.*did you mean 'epochs'"):
        Config.from_dict({"train": {"epoch": 3}})
    with pytest.raises(ValueError, match="'optim'"):
        Config.from_dict({"optim": {}})
    with pytest.raises(ValueError, match="'epoch'"):
        Config.from_preset(None, epoch=3)


def test_missing_keys_take_defaults():
    """from_dict({}) equals the defaults (a checkpoint from an older version still loads)."""
    assert Config.from_dict({"run": {"run_name": "x"}}) == Config(run=RunConfig(run_name="x"))


def test_presets_exist_validate_and_apply_their_values():
    """smoke and demo build, carry every value listed in PRESETS, use >= 2 learners; smoke is smaller."""
    assert set(PRESETS) >= {"smoke", "demo"}
    built = {}
    for name, overrides in PRESETS.items():
        config = Config.from_preset(name)
        for section, values in overrides.items():
            for key, value in values.items():
                assert getattr(getattr(config, section), key) == value, (name, section, key)
        built[name] = config
    smoke, demo = built["smoke"], built["demo"]
    assert smoke.train.learners >= 2 and demo.train.learners >= 2
    assert smoke.train.epochs < demo.train.epochs and smoke.data.crop < demo.data.crop
    assert smoke.data.max_videos is not None and smoke.data.max_videos <= 200
    assert smoke.data.crop <= smoke.data.cache_size
    with pytest.raises(ValueError, match="unknown preset 'large'"):
        Config.from_preset("large")


def test_from_preset_overrides_flat_or_by_section():
    """Overrides by field name or by section dict land in the right section and beat the preset."""
    a = Config.from_preset("smoke", epochs=5, run_name="x")
    b = Config.from_preset("smoke", train={"epochs": 5}, run={"run_name": "x"})
    assert a == b and a.train.epochs == 5 != PRESETS["smoke"]["train"]["epochs"]
    assert a.model.width == PRESETS["smoke"]["model"]["width"]


def test_run_name_is_chosen_by_the_driver_stable_and_run_dir_expands_home(monkeypatch, tmp_path):
    """A Config names no folder itself (no clock in a constructor); named() gives one without a name the
    dated ucf101-<dataset>-<UTC stamp>, once: it survives to_dict/from_dict, a named config is kept as it
    is, and run_dir expands ~ (and refuses an unnamed config, naming the fix)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Config().run.run_name is None
    with pytest.raises(ValueError, match=r"run\.run_name is not set"):
        Config().run_dir()
    config = Config().named()
    assert re.fullmatch(r"ucf101-synthetic-\d{8}-\d{6}", config.run.run_name)
    assert config.named() is config and Config(run=RunConfig(run_name="mine")).named().run.run_name == "mine"
    assert Config.from_dict(config.to_dict()).run.run_name == config.run.run_name
    assert config.run_dir() == tmp_path / "raytrain_seq_runs" / config.run.run_name
    assert "~" not in str(config.run_dir())


def test_fps_and_a_stride_both_picking_frames_is_refused():
    """data.fps with a stride other than 1 raises naming both fields; with stride 1 it is accepted."""
    with pytest.raises(ValueError, match=r"data\.fps=25.0 and data\.stride=8"):
        Config.from_dict({"data": {"fps": 25.0}})
    assert Config.from_dict({"data": {"fps": 25.0, "stride": 1}}).data.fps == 25.0


def test_batch_growth_choices_are_the_rules():
    """train.batch_growth takes exactly the values batchsize.batch_may_grow knows (config imports no torch,
    so it keeps its own copy of the tuple); the default grows B only under train.steps."""
    from raytrain_seq.algorithms.batchsize import BATCH_GROWTH
    from raytrain_seq.config import BATCH_GROWTH as CONFIG_BATCH_GROWTH

    assert CONFIG_BATCH_GROWTH == BATCH_GROWTH
    assert Config().train.batch_growth == "steps"


def test_decoder_choices_are_the_decoders_backends():
    """data.decoder takes exactly the names data/decoders.py knows (data/ imports config/, so the config
    package keeps its own copy of the tuple)."""
    from raytrain_seq.config import DECODERS as CONFIG_DECODERS
    from raytrain_seq.data.decoders import DECODERS

    assert CONFIG_DECODERS == DECODERS
    assert Config().data.decoder == "auto"


def test_batch_rule_puts_the_papers_numbers_one_flag_away():
    """train.batch_rule "paper" is AAVG's test with the paper's b1 = 1, b2 = 2, B up to 576; the default is
    noise-aware (b1 none); an older config that set only b1 keeps the paper's test it meant; a margin
    beside the noise-aware rule is refused naming the fix; the choices are batchsize.BATCH_RULES."""
    from raytrain_seq.algorithms.batchsize import BATCH_RULES
    from raytrain_seq.config import BATCH_RULES as CONFIG_BATCH_RULES

    assert CONFIG_BATCH_RULES == BATCH_RULES
    default = Config().train
    assert (default.batch_rule, default.b1) == ("noise-aware", None)
    paper = Config.from_dict({"train": {"batch_rule": "paper"}}).train
    assert (paper.batch_rule, paper.b1, paper.b2, paper.max_batch_size) == ("paper", 1.0, 2, 576)
    assert Config.from_dict({"train": {"b1": 0.9}}).train.batch_rule == "paper"  # as before the field
    assert Config.from_dict({"train": {"batch_rule": "paper", "b1": 0.95}}).train.b1 == 0.95
    with pytest.raises(ValueError, match=r"train\.b1=1\.0 .*--batch-rule paper"):
        Config.from_dict({"train": {"batch_rule": "noise-aware", "b1": 1.0}})
    with pytest.raises(ValueError, match=r"train\.batch_rule"):
        Config.from_dict({"train": {"batch_rule": "strict"}})
    again = Config.from_dict(Config.from_dict({"train": {"batch_rule": "paper"}}).to_dict()).train
    assert (again.batch_rule, again.b1) == ("paper", 1.0)
