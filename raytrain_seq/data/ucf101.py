"""UCF101 reader: the official layout and the three train/test splits, as a ``VideoCatalog``.

Layout under ``data_root``: ``UCF-101/<Class>/v_<Class>_gXX_cYY.avi`` and ``ucfTrainTestlist/`` with
``classInd.txt`` ("1 ApplyEyeMakeup", 1-based), ``trainlist0{1,2,3}.txt`` (path and label) and
``testlist0{1,2,3}.txt`` (path).
A label is ALWAYS classInd's index of the class folder, minus one; a list's label is only checked against
it (else the job stops with file and line), so another class order never shifts labels silently. The
folder, not the file name, names the class (``HandstandPushups`` holds ``v_HandStandPushups_*``).
Ids: the rank of a video in the fold's train and test lists together, sorted by (label, file name):
disjoint, ascending, and the same for every official fold. Lengths come from the header
(``video.probe``), then ``stride``/``fps`` (``video.output_length``).
Errors that stop the job at start (naming file, line and fix): a missing root, folder or list; a
malformed line; an unknown class; a label out of range or disagreeing; a video listed twice. A listed
video that is missing, corrupt or empty is skipped with a warning and kept in ``VideoCatalog.skipped``.
"""

from __future__ import annotations

import logging
import os

from raytrain_seq.data.video import VideoCatalog, build_catalog, read_lines

logger = logging.getLogger(__name__)

__all__ = [
    "FOLDS", "LISTS_DIR", "SPLITS", "VIDEOS_DIR", "read_class_index", "ucf101_catalog", "ucf101_entries",
]  # fmt: skip

VIDEOS_DIR = "UCF-101"
LISTS_DIR = "ucfTrainTestlist"
SPLITS = ("train", "test")
FOLDS = (1, 2, 3)

_LAYOUT = (
    f"--data-root must hold {VIDEOS_DIR}/<Class>/*.avi and {LISTS_DIR}/ (classInd.txt, trainlist0N.txt, "
    "testlist0N.txt) as UCF101.rar and UCF101TrainTestSplits-RecognitionTask.zip unpack"
)


def read_class_index(path: str) -> tuple[str, ...]:
    """Class names in label order from classInd.txt (``"<index> <name>"``, indices exactly 1..N)."""
    names: dict[int, tuple[str, int]] = {}
    seen: dict[str, int] = {}
    for lineno, line in read_lines(path, "UCF101 class index", _LAYOUT):
        fields = line.split()
        if len(fields) != 2 or not fields[0].isdigit():
            raise ValueError(f"{path}:{lineno}: expected '<index> <ClassName>', got {line!r}; fix the line")
        index, name = int(fields[0]), fields[1]
        if index in names:
            raise ValueError(
                f"{path}:{lineno}: index {index} already used on line {names[index][1]}; each index once"
            )
        if name in seen:
            raise ValueError(
                f"{path}:{lineno}: class {name!r} already listed on line {seen[name]}; once only"
            )
        names[index] = (name, lineno)
        seen[name] = lineno
    if not names:
        raise ValueError(f"{path}: no '<index> <ClassName>' lines; is this classInd.txt?")
    if sorted(names) != list(range(1, len(names) + 1)):
        gap = min(set(range(1, len(names) + 1)) - set(names))
        raise ValueError(
            f"{path}: indices must be exactly 1..{len(names)}, but {gap} is missing "
            f"(highest is {max(names)} on line {names[max(names)][1]}); fix the numbering"
        )
    return tuple(names[i][0] for i in range(1, len(names) + 1))


def _parse_list(
    path: str, class_names: tuple[str, ...], *, label_required: bool
) -> list[tuple[int, str, int]]:
    """``(line, "<Class>/<file>", label)`` of a train or test list; every label checked against classInd."""
    index = {name: k for k, name in enumerate(class_names)}
    shape = "'<Class>/<video>.avi <label>'" if label_required else "'<Class>/<video>.avi'"
    rows: list[tuple[int, str, int]] = []
    first_line: dict[str, int] = {}
    for lineno, line in read_lines(path, "UCF101 split file", _LAYOUT):
        fields = line.split()
        if len(fields) not in ((2,) if label_required else (1, 2)):
            raise ValueError(f"{path}:{lineno}: expected {shape}, got {line!r}; fix the line")
        rel = fields[0].replace("\\", "/")
        parts = rel.split("/")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"{path}:{lineno}: expected {shape} (class folder / file), got {line!r}")
        folder = parts[0]
        if folder not in index:
            raise ValueError(
                f"{path}:{lineno}: class {folder!r} is not in classInd.txt ({len(class_names)} classes); "
                "fix the line or use the classInd.txt that came with these lists"
            )
        label = index[folder]
        if len(fields) == 2:
            _check_label(path, lineno, fields[1], folder, label, class_names)
        if rel in first_line:
            raise ValueError(f"{path}:{lineno}: {rel} is already listed on line {first_line[rel]}; once only")
        first_line[rel] = lineno
        rows.append((lineno, rel, label))
    return rows


def _check_label(path: str, lineno: int, text: str, folder: str, label: int, names: tuple[str, ...]) -> None:
    try:
        given = int(text)
    except ValueError:
        raise ValueError(f"{path}:{lineno}: label {text!r} is not an integer; fix the line") from None
    if not 1 <= given <= len(names):
        raise ValueError(
            f"{path}:{lineno}: label {given} is out of range 1..{len(names)} (classInd.txt has "
            f"{len(names)} classes); fix the line or use the matching classInd.txt"
        )
    if given != label + 1:
        raise ValueError(
            f"{path}:{lineno}: label {given} is {names[given - 1]!r} in classInd.txt but the folder is "
            f"{folder!r} (index {label + 1}); fix the line or classInd.txt "
            "(labels are never shifted silently)"
        )


def ucf101_entries(
    data_root: str | os.PathLike[str], fold: int = 1
) -> tuple[tuple[str, ...], dict[str, list[tuple[int, int, str]]]]:
    """Class names and ``{"train": [...], "test": [...]}`` of ``(video_id, label, path)`` for ``fold``.

    Reads and checks classInd.txt and both list files (every error names the file and line) but opens
    no video, so it is cheap (milliseconds for the real lists): a worker that decodes by id uses it to
    find paths. Entries are sorted by id; see the module docstring for the ids.
    """
    if isinstance(fold, bool) or not isinstance(fold, int) or fold not in FOLDS:
        raise ValueError(f"fold must be one of {FOLDS} (the official splits), got {fold!r}")
    root = os.fspath(data_root)
    if not os.path.isdir(root):
        raise ValueError(f"UCF101 data root not found: {root}; {_LAYOUT}")
    videos = os.path.join(root, VIDEOS_DIR)
    if not os.path.isdir(videos):
        raise ValueError(f"UCF101 video folder not found: {videos}; {_LAYOUT}")
    lists = os.path.join(root, LISTS_DIR)
    class_names = read_class_index(os.path.join(lists, "classInd.txt"))
    train_file = os.path.join(lists, f"trainlist0{fold}.txt")
    test_file = os.path.join(lists, f"testlist0{fold}.txt")
    train = _parse_list(train_file, class_names, label_required=True)
    test = _parse_list(test_file, class_names, label_required=False)
    train_line = {rel: lineno for lineno, rel, _ in train}
    for lineno, rel, _ in test:
        if rel in train_line:
            raise ValueError(
                f"{test_file}:{lineno}: {rel} is also a training video ({train_file}:{train_line[rel]}); "
                "a video belongs to one side of a split"
            )
    # Ids: rank in (label, file name) order over both lists. Lists {B/v_B_1, A/v_A_2, A/v_A_1} with
    # classInd A=1, B=2 give A/v_A_1 -> 0, A/v_A_2 -> 1, B/v_B_1 -> 2.
    everything = sorted(((label, rel.split("/")[1], rel) for _, rel, label in train + test))
    rank = {rel: k for k, (_, _, rel) in enumerate(everything)}
    entries = {
        side: sorted((rank[rel], label, os.path.join(videos, *rel.split("/"))) for _, rel, label in rows)
        for side, rows in (("train", train), ("test", test))
    }
    return class_names, entries


def ucf101_catalog(
    data_root: str | os.PathLike[str],
    split: str = "train",
    fold: int = 1,
    *,
    stride: int = 1,
    fps: float | None = None,
    verify: bool = False,
    workers: int = 4,
    decoder: str = "auto",
) -> VideoCatalog:
    """The ``split`` (``"train"``/``"test"``) of UCF101 fold ``fold`` (1, 2 or 3) under ``data_root``.

    Both lists of the fold are read (ids span both, and a video in both is an error). ``stride``/``fps``
    set ``lengths`` and are recorded on the catalog for ``decode``; ``verify=True`` counts frames by
    decoding (slow); ``workers`` threads probe headers, with ``decoder`` (``data.decoders``).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    class_names, entries = ucf101_entries(data_root, fold)
    if not entries[split]:
        name = f"trainlist0{fold}.txt" if split == "train" else f"testlist0{fold}.txt"
        path = os.path.join(os.fspath(data_root), LISTS_DIR, name)
        raise ValueError(f"{path}: lists no video; is it truncated?")
    return build_catalog(
        entries[split],
        class_names=class_names,
        split=split,
        dataset="ucf101",
        fold=fold,
        stride=stride,
        fps=fps,
        verify=verify,
        workers=workers,
        decoder=decoder,
    )
