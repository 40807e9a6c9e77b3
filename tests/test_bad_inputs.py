"""Bad input, as users give it, in one table: each ends in exit 2 (or a video skipped and listed) with a
message naming the input, before anything expensive starts; nothing hangs, nothing prints a traceback.

Every entry point a user runs is driven in this process with its real argument parsing: the training job
(``jobs/ucf101.py``), the fusion job (``jobs/fuse.py``), the packing CLI, ``data.check``, ``export`` and
``predict``. The runtime modules are replaced by stand-ins that fail the test if called, so a case that
got past the checks would say so instead of starting Ray. A watchdog fails any case that takes a minute.

The rows of issue 42 (a table of 16 inputs that used to end in a traceback, a silent acceptance or a
message after Ray started) are marked ``# 42.N``; row 11 (``--use-gpu`` on a box without GPUs) belongs
to the GPU-count check of the runtime (issue 40). Unreadable files and folders: the tests run as root
here, where a mode of 000 does not stop a read, so the ``locked`` fixture makes ``open`` and
``os.scandir`` refuse the paths under a ``locked`` folder with the error the OS gives (EACCES), besides
taking their permissions away.
"""

from __future__ import annotations

import builtins
import errno
import importlib.util
import os
import shutil
import signal
import sys
import types
from pathlib import Path

import pytest
from video_fixtures import make_mini_hmdb51, make_mini_ucf101, plant_corrupt

from raytrain_seq.algorithms import packing
from raytrain_seq.data import check as data_check
from raytrain_seq.inference import predict as predict_cli
from raytrain_seq.inference.export import main as export_main

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
    # 42.1: a split file and a video folder (HMDB51's root, which the reader lists) the job may not read.
    w["locked_lists"] = broken_lists("locked_lists", lambda d: (d / "trainlist01.txt").chmod(0))
    w["locked_hmdb"] = str(make_mini_hmdb51(root / "hmdb").root)
    Path(w["locked_hmdb"]).chmod(0)
    lists = root / "lists"  # issue 41: annotation lists (no video is opened before they are checked)
    lists.mkdir()
    for name, text in {
        "malformed.txt": "# path label\na.mp4\n",
        "range.txt": "a.mp4 5\n",
        "dup.txt": "a.mp4 0\nb.mp4 1\na.mp4 1\n",
        "test.txt": "c.mp4 0\n",
        "classes.txt": "jump\nrun\n",
    }.items():
        (lists / name).write_text(text)
    w["lists"] = str(lists)
    for name, text in {
        "negative.txt": "12\n-3\n",
        "words.txt": "12\nlong\n",
        "lengths.txt": "12\n40\n7\n",
        "bad.yaml": "train: {epochs: [3\n",
        "unknown.yaml": "train: {epoch: 3}\n",
        "notes.txt": "train: {}\n",
        "section.json": '{"train": 3}',
        "wrong_section.yaml": "data: {epochs: 3}\n",
        "huge.txt": "12\n99999999999999999999999\n",  # 42.4
        "twice.yaml": "train: {epochs: 3}\ndata: {crop: 16}\ntrain: {lr: 0.01}\n",  # 42.14
        "twice.json": '{"train": {"epochs": 3, "epochs": 4}}',
        "flat.yaml": "epochs: 3\nlr: 0.01\n",  # 42.16: MMAction-style, no sections
        "garbage.pth": "not a tensor file at all\n",  # 42.9
        "text.avi": "this is a text file with a video's name\n",  # 42.15
    }.items():
        (root / name).write_text(text)
    (root / "a_folder").mkdir()
    (root / "read_only").mkdir(mode=0o555)  # 42.2
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


def _list(train: str) -> list[str]:
    """The flags of --dataset list with the training list ``train`` of the world's broken lists."""
    return ["--dataset", "list", "--data-root", "{lists}", "--train-list", train, "--test-list", "test.txt"]


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
    ("predict", ["{run}", _p("empty.avi")], 1, "empty.avi", "split lists"),  # 42.15
    ("predict", ["{run}", _p("text.avi")], 1, "text.avi", "split lists"),  # 42.15
    # issue 42's table
    ("job", ["--dataset", "ucf101", "--data-root", "{locked_lists}"], 2, "trainlist01.txt: cannot read it"),
    ("check", ["--dataset", "ucf101", "--data-root", "{locked_lists}"], 2, "trainlist01.txt: cannot read it"),
    ("job", ["--dataset", "hmdb51", "--data-root", "{locked_hmdb}"], 2, "hmdb: cannot read it"),  # 42.1
    ("check", ["--dataset", "hmdb51", "--data-root", "{locked_hmdb}"], 2, "hmdb: cannot read it"),
    ("export", ["{run}", "--out", _p("a_folder")], 2, "a_folder: is a folder"),  # 42.2
    (
        "export",
        ["{run}", "--out", _p("lengths.txt/model.pt")],
        2,
        "lengths.txt is a file, not a folder",
    ),  # 42.2
    ("export", ["{run}", "--out", _p("read_only/model.pt")], 2, "model.pt: cannot write it (Permission"),
    ("export", ["{run}", "--out", _p("m.json")], 2, "cannot be a .json file"),  # 42.3
    ("export", ["{run}", "--out", _p("section.pt")], 2, "section.json, which is not an earlier export"),
    ("pack", [_p("huge.txt")], 2, "huge.txt:2: length 99999999999999999999999"),  # 42.4
    ("predict", ["{run}", "{video}", "--top", "0"], 2, "--top"),  # 42.5
    ("predict", ["{run}", "{video}", "--top", "-1"], 2, "--top"),  # 42.5
    ("job", ["--preset", "smoke", "--t-max", "3"], 2, "data.t_max=3"),  # 42.6
    ("job", ["--num-classes", "200"], 2, "data.num_classes=200"),  # 42.7
    ("job", ["--dataset", "ucf101", "--data-root", "{ucf}", "--num-classes", "500"], 2, "--num-classes 500"),
    ("job", ["--backbone", "resnet18", "--weights", _p("garbage.pth")], 2, "garbage.pth"),  # 42.9
    ("job", ["--backbone", "resnet18", "--weights", "{foreign_weights}"], 2, "foreign.pth: key"),  # 42.9
    ("job", ["--backbone", "mc3_18", "--weights", "{foreign_weights}"], 2, "torchvision mc3_18"),  # 41
    ("job", ["--model-factory", "no_such_module_here:build"], 2, "cannot import no_such_module_here"),
    ("job", ["--model-factory", "mymodels"], 2, "package.module:function"),
    ("job", ["--model-factory", "m:f", "--backbone", "r3d_18", "--weights", "w.pth"], 2, "drop --weights"),
    ("job", ["--dataset", "list", "--data-root", "{root}"], 2, "--train-list FILE"),
    ("job", ["--train-list", "train.txt"], 2, "--dataset list"),
    ("job", [*_list("malformed.txt")], 2, "malformed.txt:2: expected 'relative/path.ext label'"),
    ("check", [*_list("malformed.txt")], 2, "malformed.txt:2: expected 'relative/path.ext label'"),
    ("job", [*_list("range.txt"), "--class-names", "classes.txt"], 2, "range.txt:1: label 5 is out of range"),
    ("job", [*_list("dup.txt")], 2, "dup.txt:3: a.mp4 is already listed on line 1"),
    ("check", [*_list("dup.txt")], 2, "dup.txt:3: a.mp4 is already listed on line 1"),
    (  # 42.10: the trained run has width 8
        "job",
        [
            "--preset",
            "mini-video",
            "--dataset",
            "ucf101",
            "--data-root",
            "{ucf}",
            "--init-from",
            "{run}",
            "--width",
            "16",
        ],
        2,
        "model.width=8",
    ),
    ("job", ["--depth", "12"], 2, "model.depth=12"),  # 42.12
    ("job", ["--epoch", "3"], 2, "did you mean --epochs?"),  # 42.13
    ("job", ["--lr-sched", "cosine"], 2, "did you mean --lr-schedule?"),  # 42.13
    ("job", ["--config", _p("twice.yaml")], 2, "key 'train' is given twice"),  # 42.14
    ("job", ["--config", _p("twice.json")], 2, "key 'epochs' is given twice"),  # 42.14
    ("job", ["--data-root", "{ucf}"], 2, "data.dataset='synthetic'"),  # 42.14
    ("job", ["--preset", "smoke", "--warmup-steps", "1000000000"], 2, "train.warmup_steps=1000000000"),
    (
        "job",
        ["--warmup-steps", "1e9"],
        2,
        "write it as 1000000000",
    ),  # 42.14: argparse's message names the flag
    ("job", ["--config", _p("flat.yaml")], 2, "'epochs' (it belongs in 'train'"),  # 42.16
    ("fuse", ["{run}", "{run}", "--epochs", "3"], 2, "unknown flag '--epochs'"),  # fusion reads no epochs
]


def _denied(path) -> bool:
    """What the OS answers a user who is not root: a file or folder without a read bit, or one under a
    folder without its search bit, is refused."""
    target = Path(os.fspath(path)).absolute()
    try:
        if target.exists() and not target.stat().st_mode & 0o444:
            return True
        return any(not parent.stat().st_mode & 0o111 for parent in target.parents if parent.exists())
    except OSError:
        return False


@pytest.fixture
def locked(monkeypatch):
    """``open`` and ``os.scandir`` refuse what the permissions refuse, as for a user who is not root: a
    read as ``_denied`` says, a write into a folder without a write bit."""
    real_open, real_scandir = builtins.open, os.scandir

    def refuse(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, str | os.PathLike):
            folder = Path(os.fspath(file)).absolute().parent
            writes = any(c in mode for c in "wax+")
            if _denied(file) or (writes and folder.exists() and not folder.stat().st_mode & 0o222):
                refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def scandir(path="."):
        if isinstance(path, str | os.PathLike) and _denied(path):
            refuse(path)
        return real_scandir(path)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "scandir", scandir)


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
    from raytrain_seq.models.factory import build_model_for
    from raytrain_seq.rounds.state import AveragedState

    config = Config.from_preset("mini-video", dataset="ucf101", data_root=world["ucf"], run_name="trained")
    torch.manual_seed(0)
    model = build_model_for(config.model, num_classes=3, in_channels=3)
    state = AveragedState(round=1, params=model.state_dict(), batch_size=4)
    spec = {"num_classes": 3, "in_channels": 3, "class_names": ["a", "b", "c"]}
    folder = world["root"] / "trained"
    checkpoint.save(folder / checkpoint.folder_name(1), state=state, config=config.to_dict(), model_spec=spec)
    # 42.9: a real tensor file whose keys are no resnet's.
    torch.save(
        {"fc.weight": torch.zeros(2, 2), "something.else": torch.zeros(3)}, world["root"] / "foreign.pth"
    )
    return str(folder)


def _watchdog(seconds: int):
    def fail(*_):
        raise TimeoutError(f"a bad input took over {seconds} s: something waits instead of failing")

    signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)


@pytest.mark.parametrize(
    ("entry", "argv", "code", "message", "absent"),
    [(*c, None) if len(c) == 4 else c for c in CASES],
    ids=[f"{c[0]}:{' '.join(c[1])}" for c in CASES],
)
def test_bad_input_is_refused_naming_it(
    entry, argv, code, message, absent, world, trained_run, no_runtime, locked, capsys
):
    """Exit 2 (1 where a tool lists a video it skipped), one `error:` line per problem naming the input
    (and not ``absent``: advice that does not fit this entry point); never a traceback."""
    places = {**world, "root": str(world["root"]), "run": trained_run}
    places["foreign_weights"] = str(world["root"] / "foreign.pth")
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
    assert absent is None or absent not in captured.err, captured.err
    assert len(CASES) >= 70
