"""Bad input, as users give it, in one table: each ends in exit 2 (or a video skipped and listed) with a
message naming the input, before anything expensive starts; nothing hangs.

Every entry point a user runs is driven in this process with its real argument parsing: the training job
(``jobs/ucf101.py``), the fusion job (``jobs/fuse.py``), the packing CLI, ``data.check``, ``export`` and
``predict``. The runtime modules are replaced by stand-ins that fail the test if called, so a case that
got past the checks would say so instead of starting Ray. A watchdog fails any case that takes a minute.
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import sys
import types
from pathlib import Path

import pytest
from video_fixtures import make_mini_ucf101, plant_corrupt

from raytrain_seq import packing
from raytrain_seq import predict as predict_cli
from raytrain_seq.data import check as data_check
from raytrain_seq.export import main as export_main

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_job", ROOT / "jobs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


JOBS = {"job": _load("ucf101").main, "fuse": _load("fuse").main}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Files the cases point at: a mini UCF101, broken copies of its lists, length lists, config files,
    run folders with and without a (corrupt) checkpoint, a corrupt and an empty video file."""
    root = tmp_path_factory.mktemp("bad")
    ds = make_mini_ucf101(root / "ucf")
    w = {"root": root, "ucf": str(ds.root), "video": ds.path(ds.test[1][0])}

    def broken_lists(name: str, edit) -> str:
        copy = root / name
        (copy / "UCF-101").mkdir(parents=True)
        shutil.copytree(ds.root / "ucfTrainTestlist", copy / "ucfTrainTestlist")
        edit(copy / "ucfTrainTestlist")
        return str(copy)

    w["no_classind"] = broken_lists("no_classind", lambda d: (d / "classInd.txt").unlink())
    w["unknown_class"] = broken_lists(
        "unknown_class", lambda d: (d / "trainlist01.txt").write_text("Juggling/v_Juggling_g01_c01.avi 1\n")
    )
    w["bad_label"] = broken_lists(
        "bad_label",
        lambda d: (d / "trainlist01.txt").write_text("Archery/v_Archery_g03_c01.avi 7\n"),
    )
    w["bad_index"] = broken_lists(
        "bad_index", lambda d: (d / "classInd.txt").write_text("1 Archery\n3 Other\n")
    )
    for name, text in {
        "negative.txt": "12\n-3\n",
        "words.txt": "12\nlong\n",
        "lengths.txt": "12\n40\n7\n",
        "bad.yaml": "train: {epochs: [3\n",
        "unknown.yaml": "train: {epoch: 3}\n",
        "notes.txt": "train: {}\n",
        "section.json": '{"train": 3}',
        "wrong_section.yaml": "data: {epochs: 3}\n",
    }.items():
        (root / name).write_text(text)
    (root / "binary.bin").write_bytes(bytes(range(256)))
    (root / "empty_run" / "checkpoint_round_000001").mkdir(parents=True)
    corrupt = root / "corrupt_run" / "checkpoint_round_000001"
    corrupt.mkdir(parents=True)
    (corrupt / "state.pt").write_bytes(b"PK\x03\x04 half a zip")
    w["corrupt_video"] = str(root / "corrupt.avi")
    shutil.copy(w["video"], w["corrupt_video"])
    plant_corrupt(w["corrupt_video"])
    (root / "empty.avi").write_bytes(b"")
    return w


def _p(path: str) -> str:
    return f"{{root}}/{path}"


# (entry, argv with {root}/{ucf}/... placeholders, expected exit code, text the message must contain)
CASES = [
    # flags
    ("job", ["--batch-size", "0"], 2, "train.batch_size"),
    ("job", ["--preset", "smoke", "--max-batch-size", "2"], 2, "train.max_batch_size"),
    ("job", ["--dataset", "kinetics"], 2, "data.dataset"),
    ("job", ["--learners", "2-8"], 2, "train.learners"),
    ("job", ["--k", "0"], 2, "train.k"),
    ("job", ["--micro-batch-size", "lots"], 2, "micro_batch_size"),
    ("job", ["--split", "4"], 2, "data.split"),
    ("job", ["--crop", "64"], 2, "data.crop"),
    ("job", ["--stride", "0"], 2, "data.stride"),
    ("job", ["--val-fraction", "1.5"], 2, "data.val_fraction"),
    ("job", ["--optimizer", "lamb"], 2, "train.optimizer"),
    ("job", ["--packing", "random"], 2, "data.packing"),
    ("job", ["--stream", "flow"], 2, "data.stream"),
    ("job", ["--weights", "w.pth"], 2, "model.weights"),  # ImageNet weights on the small CNN
    ("job", ["--epochs", "lots"], 2, "--epochs"),  # argparse's own message names the flag
    # config files
    ("job", ["--config", _p("missing.yaml")], 2, "missing.yaml"),
    ("job", ["--config", _p("bad.yaml")], 2, "bad.yaml: not valid YAML"),
    ("job", ["--config", _p("unknown.yaml")], 2, "train.epoch"),
    ("job", ["--config", _p("notes.txt")], 2, "notes.txt: unknown format"),
    ("job", ["--config", _p("section.json")], 2, "section 'train'"),
    ("job", ["--config", _p("wrong_section.yaml")], 2, "it belongs in 'train'"),
    ("job", ["--config", _p("binary.bin")], 2, "binary.bin"),
    # data roots and split files
    ("job", ["--dataset", "ucf101", "--data-root", _p("nowhere")], 2, "nowhere: no such folder"),
    ("job", ["--dataset", "ucf101", "--data-root", "{no_classind}"], 2, "classInd.txt"),
    ("job", ["--dataset", "ucf101", "--data-root", "{unknown_class}"], 2, "trainlist01.txt:1"),
    ("job", ["--dataset", "ucf101", "--data-root", "{bad_label}"], 2, "trainlist01.txt:1"),
    ("job", ["--dataset", "ucf101", "--data-root", "{bad_index}"], 2, "classInd.txt"),
    ("check", ["--dataset", "ucf101", "--data-root", "{unknown_class}"], 2, "trainlist01.txt:1"),
    # length lists
    ("pack", [_p("negative.txt")], 2, "negative.txt:2"),
    ("pack", [_p("words.txt")], 2, "words.txt:2"),
    ("pack", [_p("absent.txt")], 2, "absent.txt"),
    ("pack", [_p("lengths.txt"), "--t-max", "20"], 2, "t_max"),
    ("pack", [_p("lengths.txt"), "--strategy", "random"], 2, "random"),
    # checkpoint folders and files
    (
        "job",
        ["--preset", "smoke", "--init-from", _p("empty_run")],
        2,
        "empty_run: holds no checkpoint_round_",
    ),
    (
        "job",
        ["--preset", "smoke", "--resume", "--storage-path", "{root}", "--run-name", "empty_run"],
        2,
        "--resume",
    ),
    ("job", ["--preset", "smoke", "--resume", "--storage-path", "{root}", "--run-name", "never"], 2, "never"),
    ("job", ["--backbone", "resnet18", "--weights", _p("none.pth")], 2, "none.pth: no readable file"),
    ("fuse", [_p("empty_run"), _p("nowhere")], 2, "empty_run: holds no checkpoint_round_"),
    ("fuse", [_p("empty_run")], 2, "FLOW_RUN"),  # one folder only: argparse
    ("export", [_p("corrupt_run"), "--out", _p("x.pt")], 2, "corrupt_run"),
    ("export", [_p("nowhere"), "--out", _p("x.pt")], 2, "nowhere"),
    ("predict", [_p("corrupt_run"), "{video}"], 2, "corrupt_run"),
    # video files: skipped and listed (exit 1 of the tools that report them), never fatal
    ("predict", ["{run}", "{corrupt_video}"], 1, "corrupt.avi"),
    ("predict", ["{run}", _p("empty.avi")], 1, "empty.avi"),
]


@pytest.fixture
def no_runtime(monkeypatch):
    """Stand-ins for the runtime: any case that reaches one fails (it would have started Ray)."""
    for name, attr in (("raytrain_seq.runtime.driver", "run"), ("raytrain_seq.runtime.fuse", "run_fuse")):
        module = types.ModuleType(name)

        def reached(config, _name=name):
            raise AssertionError(f"{_name} was reached: the bad input was not caught before Ray")

        setattr(module, attr, reached)
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture(scope="module")
def trained_run(world):
    """A run folder whose checkpoint loads (predict needs one to reach the videos)."""
    import torch

    from raytrain_seq import checkpoint
    from raytrain_seq.config import Config
    from raytrain_seq.elastic.state import AveragedState
    from raytrain_seq.models.factory import build_model_for

    config = Config.from_preset("mini-video", dataset="ucf101", data_root=world["ucf"], run_name="trained")
    torch.manual_seed(0)
    model = build_model_for(config, num_classes=3, in_channels=3)
    state = AveragedState(round=1, params=model.state_dict(), batch_size=4)
    spec = {"num_classes": 3, "in_channels": 3, "class_names": ["a", "b", "c"]}
    folder = world["root"] / "trained"
    checkpoint.save(folder / checkpoint.folder_name(1), state=state, config=config.to_dict(), model_spec=spec)
    return str(folder)


def _watchdog(seconds: int):
    def fail(*_):
        raise TimeoutError(f"a bad input took over {seconds} s: something waits instead of failing")

    signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)


@pytest.mark.parametrize(
    ("entry", "argv", "code", "message"), CASES, ids=[f"{c[0]}:{' '.join(c[1])}" for c in CASES]
)
def test_bad_input_is_refused_naming_it(entry, argv, code, message, world, trained_run, no_runtime, capsys):
    """Exit 2 (1 where a tool lists a video it skipped), one `error:` line per problem naming the input."""
    places = {**world, "root": str(world["root"]), "run": trained_run}
    argv = [arg.format(**places) for arg in argv]
    runner = {
        "job": JOBS["job"],
        "fuse": JOBS["fuse"],
        "pack": packing.main,
        "check": data_check.main,
        "export": export_main,
        "predict": predict_cli.main,
    }[entry]
    _watchdog(60)
    try:
        try:
            got = runner(argv)
        except SystemExit as exit:  # argparse refuses a flag it cannot read
            got = exit.code
    finally:
        signal.alarm(0)
    captured = capsys.readouterr()
    assert got == code, captured.err
    errors = [line for line in captured.err.splitlines() if line.startswith("error:") or ": error:" in line]
    assert errors and any(message in line for line in errors), captured.err
    assert "Traceback" not in captured.err
    assert len(CASES) >= 30
