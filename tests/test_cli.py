"""Tests for raytrain_seq.cli (flags generated from the Config tree) and the thin jobs using it.

jobs/ucf101.py trains (or hands ``--stream fuse`` to fusion), jobs/fuse.py fuses two runs; both are
checked with stand-in runtime modules, so nothing here starts Ray or imports torch.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from raytrain_seq import cli
from raytrain_seq.config import (
    PRESETS,
    Config,
    DataConfig,
    ModelConfig,
    RunConfig,
    RunSetupError,
    TrainConfig,
)
from raytrain_seq.outputs.summary import RunSummary
from raytrain_seq.parts import Parts

ROOT = Path(__file__).resolve().parents[1]
CONFIG_FILES = sorted((ROOT / "raytrain_seq" / "config").rglob("*.py"))  # the tree's package, every module
JOB_FILE = ROOT / "jobs" / "ucf101.py"
FUSE_FILE = ROOT / "jobs" / "fuse.py"
SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "run": RunConfig}


def _load(path: Path, name: str):
    """jobs/ has no __init__.py: load an entry point by path, as `python jobs/X.py` would."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


job = _load(JOB_FILE, "ucf101_job")
fuse_job = _load(FUSE_FILE, "fuse_job")


def _parse(argv: list[str]) -> Config:
    return cli.parse(argv)[0]


def _fields_except_run_name(config: Config) -> dict:
    d = config.to_dict()
    d["run"].pop("run_name")
    return d


def _docstrings() -> dict[str, str]:
    """``{"data.crop": its docstring}`` read straight from the config package's source (independent of cli)."""
    out = {}
    classes = [node for path in CONFIG_FILES for node in ast.parse(path.read_text()).body]
    for cls in classes:
        if isinstance(cls, ast.ClassDef) and cls.name in {c.__name__ for c in SECTIONS.values()}:
            section = next(s for s, c in SECTIONS.items() if c.__name__ == cls.name)
            for node, doc in zip(cls.body, cls.body[1:], strict=False):
                if isinstance(node, ast.AnnAssign) and node.target.id != "section":
                    out[f"{section}.{node.target.id}"] = doc.value.value.strip()
    return out


# ---- every field reachable -------------------------------------------------------------------------

# field -> (values after the flag, the value it must give, flags the value needs beside it). A bool's
# value picks the switch: True -> --name, False -> --no-name.
LIST_FLAGS = ["--dataset", "list", "--data-root", "/v", "--train-list", "a.txt", "--test-list", "b.txt"]
CLI_VALUES: dict[str, tuple[list[str], object, list[str]]] = {
    "data.dataset": (["ucf101"], "ucf101", ["--data-root", "/v"]),
    "data.data_root": (["/v"], "/v", ["--dataset", "ucf101"]),
    "data.train_list": (
        ["/v/train.txt"],
        "/v/train.txt",
        ["--dataset", "list", "--data-root", "/v", "--test-list", "t"],
    ),
    "data.test_list": (
        ["/v/test.txt"],
        "/v/test.txt",
        ["--dataset", "list", "--data-root", "/v", "--train-list", "t"],
    ),
    "data.val_list": (["/v/val.txt"], "/v/val.txt", [*LIST_FLAGS]),
    "data.class_names": (["/v/classes.txt"], "/v/classes.txt", [*LIST_FLAGS]),
    "data.split": (["2"], 2, []),
    "data.stream": (["flow"], "flow", ["--dataset", "hmdb51", "--data-root", "/v"]),
    "data.num_classes": (["4"], 4, []),
    "data.max_videos": (["50"], 50, []),
    "data.stride": (["2"], 2, []),
    "data.fps": (["12.5"], 12.5, ["--stride", "1"]),
    "data.decoder": (["opencv"], "opencv", ["--dataset", "ucf101", "--data-root", "/v"]),
    "data.t_max": (["40"], 40, []),
    "data.cache_size": (["40"], 40, []),
    "data.crop": (["24"], 24, []),
    "data.packing": (["bload"], "bload", []),
    "data.reuse": (["1"], 1, []),
    "data.val_fraction": (["0.25"], 0.25, []),
    "data.seed": (["7"], 7, []),
    "data.augment_cost": (["0.5"], 0.5, []),
    "data.augment_cost_per_frame": (["0.0004"], 0.0004, []),
    "data.randaugment_ops": (["2"], 2, []),
    "data.randaugment_magnitude": (["12"], 12, []),
    "data.frame_cache_gib": (["2.5"], 2.5, []),
    "data.frame_cache_dir": (["/mnt/local/frames"], "/mnt/local/frames", []),
    "model.backbone": (["resnet18"], "resnet18", []),
    "model.weights": (["/w.pth"], "/w.pth", ["--backbone", "resnet18"]),
    "model.model_factory": (["mymodels.video:build"], "mymodels.video:build", []),
    "model.init_from": (["/runs/rgb"], "/runs/rgb", []),
    "model.fuse": (["/r/rgb", "/r/flow"], ("/r/rgb", "/r/flow"), ["--stream", "fuse"]),
    "model.width": (["8"], 8, []),
    "model.depth": (["2"], 2, []),
    "model.hidden": (["32"], 32, []),
    "model.temporal": (["tcn"], "tcn", []),
    "model.norm": (["batchnorm"], "batchnorm", []),
    "train.learners": (["2:8"], (2, 8), []),
    "train.max_failures": (["-1"], -1, []),
    "train.worker_start_timeout_s": (["5"], 5.0, []),
    "train.poll_interval_s": (["0.25"], 0.25, []),
    "train.averager_max_restarts": (["0"], 0, []),
    "train.feed_max_restarts": (["5"], 5, []),
    "train.keep_freed_memory": ([], False, []),
    "train.adaptive_batch": ([], False, []),
    "train.merge_moments": ([], False, []),
    "train.merge_bn_stats": ([], False, []),
    "train.k": (["5"], 5, []),
    "train.batch_size": (["8"], 8, []),
    "train.max_batch_size": (["64"], 64, []),
    "train.micro_batch_size": (["auto"], "auto", []),
    "train.validate_every": (["2"], 2, []),
    "train.b1": (["0.9"], 0.9, []),
    "train.b2": (["1.5"], 1.5, []),
    "train.batch_growth": (["always"], "always", []),
    "train.batch_rule": (["paper"], "paper", []),
    "train.epochs": (["3"], 3, []),
    "train.steps": (["200"], 200, []),
    "train.lr": (["0.01"], 0.01, []),
    "train.optimizer": (["sgd"], "sgd", []),
    "train.weight_decay": (["1e-4"], 1e-4, []),
    "train.averager_timeout_s": (["30"], 30.0, []),
    "train.averager_probe_s": (["0.25"], 0.25, []),
    "train.averager_shards": (["2"], 2, []),
    "train.averager_channels": ([], True, []),
    "train.checkpoint_every": (["2"], 2, []),
    "train.use_gpu": ([], True, []),
    "train.gpus_per_learner": (["0.5"], 0.5, []),
    "train.validator": (["learners"], "learners", []),
    "train.precision": (["bf16"], "bf16", []),
    "train.lr_schedule": (["cosine"], "cosine", []),
    "train.warmup_steps": (["100"], 100, []),
    "run.storage_path": (["scratch/s"], "scratch/s", []),
    "run.run_name": (["r1"], "r1", []),
    "run.resume": ([], True, ["--run-name", "r1"]),
    "run.tracker": (["none"], "none", []),
    "run.object_store_gb": (["2.5"], 2.5, []),
    "run.keep_checkpoints": (["5"], 5, []),
    "run.verbose": ([], True, []),
    "data.test_views": (["three_crop_flip"], "three_crop_flip", []),
}

# Every flag jobs/ucf101.py took before the CLI was generated: each must keep working.
LEGACY_FLAGS = [
    "--dataset",
    "--data-root",
    "--split",
    "--stream",
    "--num-classes",
    "--max-videos",
    "--stride",
    "--fps",
    "--t-max",
    "--packing",
    "--reuse",
    "--seed",
    "--backbone",
    "--weights",
    "--init-from",
    "--fuse",
    "--temporal",
    "--width",
    "--depth",
    "--hidden",
    "--learners",
    "--max-failures",
    "--worker-start-timeout-s",
    "--averager-timeout-s",
    "--averager-max-restarts",
    "--adaptive-batch",
    "--no-adaptive-batch",
    "--merge-moments",
    "--no-merge-moments",
    "--k",
    "--batch-size",
    "--max-batch-size",
    "--micro-batch-size",
    "--validate-every",
    "--epochs",
    "--lr",
    "--optimizer",
    "--checkpoint-every",
    "--use-gpu",
    "--no-use-gpu",
    "--storage-path",
    "--run-name",
    "--resume",
    "--preset",
    "-v",
    "--verbose",
]


def _spellings(path: str, values: list[str], expected: object) -> tuple[list[str], list[str]]:
    """(the kebab argv, the dotted argv) setting ``path``."""
    section, name = path.split(".")
    kebab, dotted = f"--{name.replace('_', '-')}", f"--{section}.{name}"
    if expected is False:
        kebab, dotted = f"--no-{name.replace('_', '-')}", f"--{section}.no_{name}"
    return [kebab, *values], [dotted, *values]


def test_the_table_covers_every_field():
    """A field added to the Config must come with a CLI value here, so its flag is tested too."""
    every = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    assert set(CLI_VALUES) == every


@pytest.mark.parametrize("path", sorted(CLI_VALUES))
def test_every_field_is_reachable_by_its_dotted_and_kebab_flag(path):
    """--section.field and --field-name set the field to the value (not its default) and agree."""
    values, expected, context = CLI_VALUES[path]
    section, name = path.split(".")
    base = [*context] + ([] if "--run-name" in context or path == "run.run_name" else ["--run-name", "t"])
    kebab, dotted = _spellings(path, values, expected)
    by_kebab, by_dotted = _parse([*base, *kebab]), _parse([*base, *dotted])
    assert getattr(getattr(by_kebab, section), name) == expected
    default = next(f for f in dataclasses.fields(SECTIONS[section]) if f.name == name).default
    assert default != expected, "the flag must change something"
    assert by_dotted == by_kebab


def test_every_legacy_flag_spelling_is_still_accepted():
    """The flags the hand-written parser had all exist, with the same kind (value, switch, pair)."""
    actions = {s: a for a in cli.build_parser()._actions for s in a.option_strings}
    assert set(LEGACY_FLAGS) <= set(actions)
    assert actions["--fuse"].nargs == 2 and actions["--learners"].nargs is None
    assert actions["--resume"].nargs == 0 and actions["--no-use-gpu"] is actions["--use-gpu"]


def test_the_seven_fields_without_a_flag_before_have_one_now():
    """crop, cache_size, val_fraction, augment_cost, weight_decay, b1, b2 reach the config from flags."""
    config = _parse(
        [
            "--crop",
            "24",
            "--cache-size",
            "28",
            "--val-fraction",
            "0.2",
            "--augment-cost",
            "0.01",
            "--weight-decay",
            "0.05",
            "--b1",
            "0.95",
            "--b2",
            "3",
        ]
    )
    assert (config.data.crop, config.data.cache_size) == (24, 28)
    assert (config.data.val_fraction, config.data.augment_cost) == (0.2, 0.01)
    assert (config.train.weight_decay, config.train.b1, config.train.b2) == (0.05, 0.95, 3.0)


def test_switches_and_none_values():
    """--no-X sets False and the last switch wins; "none"/"None" gives None for an optional field."""
    assert _parse(["--no-use-gpu"]).train.use_gpu is False
    assert _parse(["--train.no_use_gpu"]).train.use_gpu is False
    assert _parse(["--no-adaptive-batch", "--adaptive-batch"]).train.adaptive_batch is True
    smoke = _parse(["--preset", "smoke", "--max-videos", "none", "--data.num_classes", "None"])
    assert PRESETS["smoke"]["data"]["max_videos"] is not None
    assert smoke.data.max_videos is None and smoke.data.num_classes == 10  # None -> the synthetic default


def test_a_value_of_the_wrong_type_is_an_argparse_error(capsys):
    """Text where an int is annotated exits 2 with argparse's message naming the flag."""
    with pytest.raises(SystemExit) as info:
        cli.parse(["--epochs", "three"])
    assert info.value.code == 2
    assert "--epochs" in capsys.readouterr().err


def test_a_field_type_without_a_flag_form_fails_when_the_parser_is_built(monkeypatch):
    """A field with a type the walker cannot parse: TypeError naming it, not a flag that never works."""

    @dataclasses.dataclass(kw_only=True)
    class Odd:
        """A section with a list field."""

        sizes: list[int] = dataclasses.field(default_factory=list)
        """Sizes."""

    monkeypatch.setitem(cli.SECTIONS, "odd", Odd)
    with pytest.raises(TypeError, match=r"odd\.sizes: the annotation list\[int\]"):
        cli.build_parser()


# ---- help ------------------------------------------------------------------------------------------


def test_help_of_every_field_is_its_docstring_and_default():
    """Each field flag's help is the field docstring from the config package plus [default X]."""
    docs = _docstrings()
    assert len(docs) == len(CLI_VALUES)
    by_dest = {a.dest: a for a in cli.build_parser()._actions if a.help != argparse.SUPPRESS}
    for path, doc in docs.items():
        section, name = path.split(".")
        help_text = by_dest[path].help.replace("%%", "%")
        default = next(f for f in dataclasses.fields(SECTIONS[section]) if f.name == name).default
        assert help_text == f"{doc} [default {default}]", path


def test_help_lists_groups_and_docstrings(capsys):
    """--help exits 0 and shows every section with its description and every field's docstring."""
    with pytest.raises(SystemExit) as info:
        job.main(["--help"])
    assert info.value.code == 0
    squeezed = re.sub(r"\s+", "", capsys.readouterr().out)  # help wraps lines anywhere
    for section, cls in SECTIONS.items():
        assert f"{section}:" in squeezed
        assert re.sub(r"\s+", "", cls.__doc__.splitlines()[0]) in squeezed
    for doc in _docstrings().values():
        assert re.sub(r"\s+", "", doc) in squeezed
    assert "--data.crop" in squeezed and "[default32]" in squeezed


# ---- precedence: defaults < preset < --config < flags -------------------------------------------------


def _write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data) if path.suffix == ".json" else yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_config_file_beats_the_preset_and_flags_beat_the_file(tmp_path, suffix):
    """Preset, file, flag: epochs from the flag, lr, crop from the file, width from smoke."""
    file = _write(tmp_path / f"c{suffix}", {"train": {"epochs": 7, "lr": 0.02}, "data": {"crop": 12}})
    config = _parse(["--preset", "smoke", "--config", str(file), "--epochs", "5"])
    assert config.train.epochs == 5  # flag over file
    assert (config.train.lr, config.data.crop) == (0.02, 12)  # file over preset (smoke's crop is 16)
    assert config.model.width == PRESETS["smoke"]["model"]["width"]  # preset over default
    assert config.data.cache_size == PRESETS["smoke"]["data"]["cache_size"]
    alone = _parse(["--config", str(file)])  # no preset: the file over the defaults
    assert (alone.train.epochs, alone.model.width) == (7, Config().model.width)


def test_yaml_reads_an_exponent_without_a_dot_as_a_float(tmp_path):
    """lr: 1e-3 is a float (plain YAML 1.1 would make it the string '1e-3' and the config would refuse it)."""
    file = tmp_path / "c.yaml"
    file.write_text("train:\n  lr: 1e-3\n  weight_decay: 5E-4\n  learners: '2:4'\nmodel:\n  width: 8\n")
    config = _parse(["--config", str(file)])
    assert config.train.lr == 1e-3 and config.train.weight_decay == 5e-4
    assert config.train.learners == (2, 4) and config.model.width == 8


@pytest.mark.parametrize(
    "argv",
    [
        ["--preset", "smoke", "--learners", "2:4", "--micro-batch-size", "auto", "--use-gpu", "--lr", "3e-4"],
        ["--stream", "fuse", "--fuse", "/r/rgb", "/r/flow", "--data-root", "/v", "--weight-decay", "1e-05"],
        ["--preset", "ucf101-rgb", "--no-adaptive-batch", "--t-max", "40"],
    ],
)
def test_print_config_round_trips_through_config(argv, fake_trainer, capsys, tmp_path):
    """--print-config prints YAML and exits 0 without running; --config on that file gives the same Config."""
    assert job.main([*argv, "--print-config"]) == 0
    assert fake_trainer == []
    printed = capsys.readouterr().out
    file = tmp_path / "printed.yaml"
    file.write_text(printed)
    expected = _parse(argv)
    again = _parse(["--config", str(file)])
    assert _fields_except_run_name(again) == _fields_except_run_name(expected)
    assert again != Config(run=RunConfig(run_name=again.run.run_name))  # the flags really changed it
    # No --run-name given: the dated name is not printed, so the file makes a new folder each time.
    assert yaml.safe_load(printed)["run"]["run_name"] is None and printed.startswith("# run_name: null")


def test_print_config_then_config_repeats_a_run_in_a_new_folder(capsys, tmp_path, monkeypatch):
    """--print-config > run.yaml, then --config run.yaml twice: two runs (the dated names differ), neither
    stopping on the folder of the other; a name given on the command line is kept in the file."""
    storage = tmp_path / "runs"
    assert job.main(["--preset", "smoke", "--storage-path", str(storage), "--print-config"]) == 0
    file = tmp_path / "run.yaml"
    file.write_text(capsys.readouterr().out)
    stamps = iter(["20260101-000001", "20260101-000002"])

    class Clock:
        @staticmethod
        def now(tz):
            from datetime import datetime

            return datetime.strptime(next(stamps), "%Y%m%d-%H%M%S")

    from raytrain_seq.runtime.connect import check_storage  # the driver's "run folder exists" check

    def runner(config: Config) -> RunSummary:
        check_storage(Parts.of(config).connect).joinpath("marker").write_text("a run wrote here")
        return _Recorder(storage)(config)

    monkeypatch.setattr("raytrain_seq.config.tree.datetime", Clock)
    assert cli.main(["--config", str(file)], runner) == 0
    assert cli.main(["--config", str(file)], runner) == 0
    assert sorted(p.name for p in storage.iterdir()) == [
        "ucf101-synthetic-20260101-000001",
        "ucf101-synthetic-20260101-000002",
    ]
    capsys.readouterr()
    assert job.main(["--run-name", "mine", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["run"]["run_name"] == "mine"


BAD_FILES = [
    ("missing.yaml", None, "cannot read it"),
    ("bad-key.yaml", "train:\n  epoch: 3\n", "'train.epoch' (did you mean 'train.epochs'?)"),
    ("bad-section.json", '{"optim": {}}', "'optim'"),
    ("wrong-section.yaml", "train:\n  crop: 24\n", "'train.crop' (it belongs in 'data': data.crop)"),
    ("binary.yaml", b"\xff\xfe\x00", "cannot read it"),
    ("syntax.yaml", "train: {epochs: 3\n", "not valid YAML"),
    ("syntax.json", '{"train": ', "not valid JSON"),
    ("list.yaml", "- 1\n- 2\n", "expected a mapping of sections"),
    ("flat.yaml", "train: 3\n", "section 'train' must map field names"),
    ("config.toml", "[train]\n", "unknown format '.toml'"),
]


@pytest.mark.parametrize(("name", "text", "problem"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_bad_config_file_exits_2_with_one_line_naming_it(
    name, text, problem, fake_trainer, capsys, tmp_path
):
    """Missing file, unknown key, bad syntax: exit 2, one line `error: --config FILE: <problem>: <fix>`."""
    file = tmp_path / name
    if isinstance(text, bytes):
        file.write_bytes(text)
    elif text is not None:
        file.write_text(text)
    assert job.main(["--config", str(file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --config {file}: ") and err.count("\n") == 1, err
    assert problem in err and "Traceback" not in err
    tail = err[err.index(problem) + len(problem) :]
    assert len(tail.strip(" :;,.()\n")) >= 10, f"no fix after the problem: {err}"
    assert fake_trainer == []


# ---- jobs/ucf101.py --------------------------------------------------------------------------------


class _Recorder:
    """Stand-in runner: records each Config and writes a summary under tmp_path/<run_name>."""

    def __init__(self, root: Path) -> None:
        self.root, self.calls = root, []

    def __call__(self, config: Config) -> RunSummary:
        self.calls.append(config)
        summary = RunSummary(
            dataset=config.data.dataset,
            learners=config.train.learners,
            epochs=config.train.epochs,
            test_accuracy=0.925,
            config=config.to_dict(),
        )
        summary.write(self.root / config.run.run_name)
        return summary


@pytest.fixture
def fake_trainer(monkeypatch, tmp_path):
    """A stand-in raytrain_seq.runtime.driver whose run() records its Config and writes a summary."""
    recorder = _Recorder(tmp_path)
    module = types.ModuleType("raytrain_seq.runtime.driver")
    module.run = recorder
    monkeypatch.setitem(sys.modules, "raytrain_seq.runtime.driver", module)
    return recorder.calls


@pytest.fixture
def fake_fuse(monkeypatch, tmp_path):
    """A stand-in raytrain_seq.runtime.fuse whose run_fuse() records its Config and writes a summary."""
    recorder = _Recorder(tmp_path)
    module = types.ModuleType("raytrain_seq.runtime.fuse")
    module.run_fuse = recorder
    monkeypatch.setitem(sys.modules, "raytrain_seq.runtime.fuse", module)
    return recorder.calls


def test_flags_override_preset_and_absent_flags_keep_it():
    """Given flags beat the preset; every other field keeps the preset value."""
    config = _parse(["--preset", "smoke", "--epochs", "5", "--learners", "3", "--lr", "0.01"])
    assert (config.train.epochs, config.train.learners, config.train.lr) == (5, 3, 0.01)
    assert PRESETS["smoke"]["train"]["epochs"] != 5  # the flag really changed something
    expected = Config.from_preset("smoke", epochs=5, learners=3, lr=0.01)
    assert _fields_except_run_name(config) == _fields_except_run_name(expected)


def test_no_flags_gives_the_defaults_and_preset_alone_gives_the_preset():
    """No flags = Config defaults; --preset alone = the preset, untouched."""
    assert _fields_except_run_name(_parse([])) == _fields_except_run_name(Config())
    smoke = _parse(["--preset", "smoke"])
    assert _fields_except_run_name(smoke) == _fields_except_run_name(Config.from_preset("smoke"))
    assert _fields_except_run_name(smoke) != _fields_except_run_name(Config())


def test_every_flag_is_a_config_field_with_help():
    """Each flag's dest is section.field (or one of the job's own options) and has help."""
    fields = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    actions = [a for a in cli.build_parser()._actions if a.option_strings and a.dest != "help"]
    listed = [a for a in actions if a.help != argparse.SUPPRESS]
    assert sorted(a.dest for a in listed) == sorted(fields | {"preset", "config", "print_config"})
    for action in listed:
        assert action.help and len(action.help) > 10, action.dest
    # The unlisted ones are the dotted spellings, one per field, beside its listed kebab flag.
    hidden = [a for a in actions if a.help == argparse.SUPPRESS]
    assert sorted(a.dest for a in hidden) == sorted(fields)
    assert all(s.startswith(f"--{a.dest.split('.')[0]}.") for a in hidden for s in a.option_strings)


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--batch-size", "0"], "train.batch_size"),
        (["--preset", "smoke", "--max-batch-size", "2"], "train.max_batch_size"),
        (["--dataset", "ucf101"], "data.data_root"),
        (["--dataset", "kinetics"], "data.dataset"),
        (["--learners", "2-8"], "train.learners"),
        (["--stream", "fuse"], "data.stream"),
        (["--k", "0"], "train.k"),
        (["--resume"], "run.run_name"),
        (["--micro-batch-size", "lots"], "train.micro_batch_size"),
        (["--crop", "40"], "data.crop"),
    ],
)
def test_bad_flag_value_exits_2_naming_the_field_before_run(argv, field, fake_trainer, capsys):
    """A value the config rejects: exit 2, `error: <field> ...` on stderr, no traceback, run() not called."""
    assert job.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and field in err and "Traceback" not in err
    assert fake_trainer == []


def test_main_runs_prints_table_and_ends_with_summary_path(fake_trainer, fake_fuse, capsys, tmp_path):
    """main() hands the Config to driver.run, prints the table; the last line names summary.json."""
    argv = ["--preset", "smoke", "--epochs", "3", "--run-name", "t1", "--crop", "14", "--cache-size", "18"]
    assert job.main(argv) == 0
    (config,) = fake_trainer
    assert config.train.epochs == 3 and config.run.run_name == "t1"
    assert (config.data.crop, config.data.cache_size) == (14, 18)
    assert fake_fuse == []
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"summary written to {tmp_path / 't1' / 'summary.json'}"
    assert (tmp_path / "t1" / "summary.json").is_file()
    assert any("92.5 %" in line for line in lines)  # the table of the returned summary


def _finished_runs(root: Path) -> tuple[str, str]:
    """Two run folders that pass the path checks (each holds a checkpoint folder with a state file)."""
    runs = []
    for name in ("rgb", "flow"):
        folder = root / "r" / name / "checkpoint_round_000001"
        folder.mkdir(parents=True)
        (folder / "state.pt").write_bytes(b"")
        runs.append(str(folder.parent))
    return runs[0], runs[1]


def test_stream_fuse_is_handed_to_run_fuse_not_the_trainer(fake_trainer, fake_fuse, capsys, tmp_path):
    """--stream fuse --fuse A B: run_fuse gets the Config, driver.run is never called."""
    rgb, flow = _finished_runs(tmp_path)
    assert job.main(["--stream", "fuse", "--fuse", rgb, flow, "--run-name", "f1"]) == 0
    (config,) = fake_fuse
    assert config.data.stream == "fuse" and config.model.fuse == (rgb, flow)
    assert fake_trainer == []
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(str(tmp_path / "f1" / "summary.json"))


def test_a_run_that_cannot_start_exits_2_with_one_line(monkeypatch, capsys, tmp_path):
    """run() raising RunSetupError (e.g. the run folder exists): exit 2, one `error:` line, no traceback."""

    def run(config: Config) -> RunSummary:
        raise RunSetupError(f"run folder {tmp_path} already exists: pass --resume to continue it")

    module = types.ModuleType("raytrain_seq.runtime.driver")
    module.run = run
    monkeypatch.setitem(sys.modules, "raytrain_seq.runtime.driver", module)
    assert job.main(["--preset", "smoke", "--run-name", "t2"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: run folder") and "--resume" in captured.err
    assert "Traceback" not in captured.err and "summary written" not in captured.out


# ---- jobs/fuse.py ----------------------------------------------------------------------------------


def test_fuse_job_takes_two_run_folders_and_calls_run_fuse(fake_trainer, fake_fuse, capsys, tmp_path):
    """fuse.py RGB FLOW --data-root D --run-name N: stream fuse, model.fuse the pair, run_fuse called."""
    rgb, flow = _finished_runs(tmp_path)
    argv = [rgb, flow, "--dataset", "ucf101", "--data-root", "/v", "--run-name", "f2"]
    assert fuse_job.main(argv) == 0
    (config,) = fake_fuse
    assert (config.data.stream, config.model.fuse) == ("fuse", (rgb, flow))
    assert (config.data.dataset, config.data.data_root, config.run.run_name) == ("ucf101", "/v", "f2")
    assert fake_trainer == []
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"summary written to {tmp_path / 'f2' / 'summary.json'}"
    assert any("92.5 %" in line for line in lines)


def test_fuse_job_errors_exit_2(monkeypatch, fake_fuse, capsys, tmp_path):
    """One run folder: argparse exit 2; a bad value or a RunSetupError from run_fuse: exit 2, one line."""
    with pytest.raises(SystemExit) as info:
        fuse_job.main(["/r/rgb"])
    assert info.value.code == 2 and "FLOW_RUN" in capsys.readouterr().err
    assert fuse_job.main(["/r/rgb", "/r/flow", "--test-views", "five_crop"]) == 2
    assert capsys.readouterr().err.startswith("error: data.test_views")
    with pytest.raises(SystemExit) as info:  # fusion reads no --epochs: the flag is not offered
        fuse_job.main(["/r/rgb", "/r/flow", "--epochs", "3"])
    assert info.value.code == 2 and "unknown flag '--epochs'" in capsys.readouterr().err
    assert fake_fuse == []

    # A run folder that is not there: the path check says so before anything runs.
    assert fuse_job.main(["/r/rgb", "/r/flow"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --fuse /r/rgb: no such run folder") and err.count("\n") == 1
    assert fake_fuse == []

    def run_fuse(config: Config) -> RunSummary:
        raise RunSetupError(f"--fuse: {rgb} holds no finished run: give the folder of a finished RGB run")

    rgb, flow = _finished_runs(tmp_path)
    monkeypatch.setattr(sys.modules["raytrain_seq.runtime.fuse"], "run_fuse", run_fuse)
    assert fuse_job.main([rgb, flow]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --fuse: {rgb}") and err.count("\n") == 1


def test_fuse_job_prints_its_config(fake_fuse, capsys, tmp_path):
    """fuse.py A B --print-config: the fuse config as YAML, which --config reads back; nothing runs."""
    assert fuse_job.main(["/r/rgb", "/r/flow", "--print-config"]) == 0
    assert fake_fuse == []
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["stream"] == "fuse" and printed["model"]["fuse"] == ["/r/rgb", "/r/flow"]


def test_the_trainer_entry_never_imports_fusion_at_the_top():
    """jobs/ucf101.py and jobs/fuse.py import the runtime only inside functions (lazily)."""
    for path in (JOB_FILE, FUSE_FILE):
        top = ast.parse(path.read_text()).body
        imported = {n.module for n in top if isinstance(n, ast.ImportFrom) and n.module} | {
            a.name for n in top if isinstance(n, ast.Import) for a in n.names
        }
        assert not {m for m in imported if m.startswith("raytrain_seq.runtime")}, path


def test_importing_the_jobs_and_printing_the_config_start_nothing():
    """Importing both jobs and running --print-config loads neither ray nor torch and starts no thread."""
    code = (
        "import importlib.util, io, contextlib, sys, threading, json\n"
        "mods = []\n"
        f"for path in ({str(JOB_FILE)!r}, {str(FUSE_FILE)!r}):\n"
        "    spec = importlib.util.spec_from_file_location('j%d' % len(mods), path)\n"
        "    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); mods.append(m)\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    code = mods[0].main(['--preset', 'smoke', '--print-config'])\n"
        "print(json.dumps({'ray': 'ray' in sys.modules, 'torch': 'torch' in sys.modules,\n"
        "                  'threads': threading.active_count(), 'code': code}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "ray": False,
        "torch": False,
        "threads": 1,
        "code": 0,
    }
    assert out.stderr == ""


def test_help_lists_the_user_flags_first_and_the_runtime_knobs_last_in_one_group(capsys):
    """Two tiers: data, model, train and run hold the flags a user sets; every ADVANCED field is in the
    last group, "advanced", and in no other; the dotted spellings are not listed (they work: above)."""
    with pytest.raises(SystemExit):
        job.main(["--help"])
    text = capsys.readouterr().out
    groups = re.split(r"\n(?=[a-z]+:\n)", text)  # "data:\n", "advanced:\n", ...
    titles = [g.split(":", 1)[0] for g in groups[1:]]
    assert titles == ["options", "data", "model", "train", "run", "advanced"]
    advanced = groups[-1]
    for path in cli.ADVANCED:
        flag = f"--{path.split('.')[1].replace('_', '-')}"
        assert flag in advanced, flag
        assert all(flag not in g for g in groups[:-1]), flag
    for flag in ("--precision", "--tracker", "--lr-schedule", "--test-views", "--resume", "--epochs"):
        assert any(flag in g for g in groups[1:-1]), flag  # the flags people reach for first: first tier
    assert "--data.crop CROP" not in text and "--train.poll_interval_s" not in text
    assert every_field_known(cli.ADVANCED)


def every_field_known(paths) -> bool:
    fields = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    return set(paths) <= fields


def test_fuse_help_lists_only_what_fusion_reads(capsys):
    """jobs/fuse.py --help: the two run folders and FUSE_FIELDS' flags, no training flag."""
    with pytest.raises(SystemExit):
        fuse_job.main(["--help"])
    text = capsys.readouterr().out
    listed = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z](?![\w.-])", text))
    offered = {f"--{p.split('.')[1].replace('_', '-')}" for p in cli.FUSE_FIELDS}
    switches = {"--no-use-gpu", "--no-verbose"}
    assert listed - {"--help", "--preset", "--config", "--print-config", "--crop"} == (offered | switches), (
        listed
    )
    assert "RGB_RUN" in text and "FLOW_RUN" in text
    assert every_field_known(cli.FUSE_FIELDS)


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [(["--epoch", "3"], "--epochs"), (["--lr-sched", "cosine"], "--lr-schedule"), (["--crop=8x"], None)],
)
def test_a_flag_is_never_abbreviated_and_an_unknown_one_is_named_with_the_closest(argv, suggestion, capsys):
    """allow_abbrev is off: a prefix of a flag is an unknown flag, refused with the closest real one."""
    with pytest.raises(SystemExit) as info:
        cli.parse(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    if suggestion:
        assert f"unknown flag {argv[0]!r}: did you mean {suggestion}?" in err
    else:
        assert "--crop" in err
