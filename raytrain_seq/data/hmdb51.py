"""HMDB51 reader: the official layout and the three 70/30 splits, as a ``VideoCatalog``.

Layout under ``data_root``: ``<class>/<video>.avi`` and ``testTrainMulti_7030_splits/<class>_test_split
{1,2,3}.txt`` with lines ``"<video>.avi <flag>"``: 1 train, 2 test, 0 unused in that split.
Class ids are the class FOLDER names sorted (51 for the real set; any count accepted); a video's label
is its split file's class. Every class folder needs its split file and every split file a folder (a
differently cased split folder is pointed out).
Ids: the rank of a video among ALL lines of the fold's files, sorted by (label, file name): train and
test disjoint, the same for every official fold. Lengths come from the header (``video.probe``), then
``stride``/``fps``.
Errors that stop the job at start (naming file, line and fix): a missing root, split folder or file; a
split file of an unknown class; a malformed line; a flag other than 0/1/2; a video listed twice. A listed
video that is missing, corrupt or empty is skipped with a warning and kept in ``VideoCatalog.skipped``.
"""

from __future__ import annotations

import logging
import os

from raytrain_seq.data.video import VideoCatalog, build_catalog, list_folder, read_lines

logger = logging.getLogger(__name__)

__all__ = ["FLAGS", "FOLDS", "SPLITS", "SPLITS_DIR", "hmdb51_catalog", "hmdb51_classes", "hmdb51_entries"]

SPLITS_DIR = "testTrainMulti_7030_splits"
SPLITS = ("train", "test")
FOLDS = (1, 2, 3)
FLAGS = {"train": 1, "test": 2}  # 0 = unused

_LAYOUT = (
    f"--data-root must hold <class>/<video>.avi and {SPLITS_DIR}/<class>_test_split{{1,2,3}}.txt as "
    "hmdb51_org.rar and test_train_splits.rar unpack"
)


def _split_file_name(class_name: str, fold: int) -> str:
    return f"{class_name}_test_split{fold}.txt"


def hmdb51_classes(data_root: str | os.PathLike[str]) -> tuple[str, ...]:
    """Class names in label order: sorted sub-folders of ``data_root`` (not hidden, not the split folder)."""
    root = os.fspath(data_root)
    if not os.path.isdir(root):
        raise ValueError(f"HMDB51 data root not found: {root}; {_LAYOUT}")
    names = sorted(
        entry.name
        for entry in list_folder(root)
        if entry.is_dir() and entry.name != SPLITS_DIR and not entry.name.startswith(".")
    )
    if not names:
        raise ValueError(f"HMDB51 data root {root} has no class folders; {_LAYOUT}")
    return tuple(names)


def _splits_dir(root: str) -> str:
    path = os.path.join(root, SPLITS_DIR)
    if os.path.isdir(path):
        return path
    near = [e.name for e in list_folder(root) if e.is_dir() and e.name.lower() == SPLITS_DIR.lower()]
    hint = f" (found {near[0]!r}: rename it to {SPLITS_DIR!r})" if near else ""
    raise ValueError(f"HMDB51 split folder not found: {path}{hint}; {_LAYOUT}")


def _parse_split_file(path: str) -> list[tuple[int, str, int]]:
    """``(line, video, flag)`` rows of one class's split file."""
    rows: list[tuple[int, str, int]] = []
    first_line: dict[str, int] = {}
    for lineno, line in read_lines(path, "HMDB51 split file", _LAYOUT):
        fields = line.split()
        if len(fields) != 2 or "/" in fields[0] or "\\" in fields[0]:
            raise ValueError(f"{path}:{lineno}: expected '<video>.avi <0|1|2>', got {line!r}; fix the line")
        video, text = fields
        if text not in ("0", "1", "2"):
            raise ValueError(
                f"{path}:{lineno}: flag {text!r} is out of range (0 = unused, 1 = train, 2 = test); "
                "fix the line"
            )
        if video in first_line:
            raise ValueError(
                f"{path}:{lineno}: {video} is already listed on line {first_line[video]}; once only"
            )
        first_line[video] = lineno
        rows.append((lineno, video, int(text)))
    return rows


def hmdb51_entries(
    data_root: str | os.PathLike[str], fold: int = 1
) -> tuple[tuple[str, ...], dict[str, list[tuple[int, int, str]]]]:
    """Class names and ``{"train": [...], "test": [...]}`` of ``(video_id, label, path)`` for ``fold``.

    Reads and checks every split file of the fold (errors name the file and line) but opens no video,
    so a worker that decodes by id can find paths cheaply. Entries are sorted by id (module docstring).
    """
    if isinstance(fold, bool) or not isinstance(fold, int) or fold not in FOLDS:
        raise ValueError(f"fold must be one of {FOLDS} (the official splits), got {fold!r}")
    root = os.fspath(data_root)
    class_names = hmdb51_classes(root)
    splits = _splits_dir(root)
    suffix = _split_file_name("", fold)  # "_test_split1.txt"
    for entry in sorted(list_folder(splits), key=lambda e: e.name):
        if entry.name.endswith(suffix) and entry.name[: -len(suffix)] not in class_names:
            raise ValueError(
                f"{entry.path}: names class {entry.name[: -len(suffix)]!r}, which has no folder in {root} "
                f"(classes: {', '.join(class_names[:5])}{', ...' if len(class_names) > 5 else ''}); "
                "add the class folder or remove the file"
            )
    rows: list[tuple[int, str, int, str]] = []  # (label, video, flag, path)
    for label, name in enumerate(class_names):
        split_file = os.path.join(splits, _split_file_name(name, fold))
        if not os.path.isfile(split_file):
            raise ValueError(
                f"HMDB51 split file not found: {split_file} (class folder {name!r} needs one); {_LAYOUT}"
            )
        rows += [
            (label, video, flag, os.path.join(root, name, video))
            for _, video, flag in _parse_split_file(split_file)
        ]
    # Ids: rank in (label, file name) order over all lines, flag 0 included. brush_hair/{b.avi 2, a.avi 0}
    # and cartwheel/{c.avi 1} give brush_hair/a -> 0, brush_hair/b -> 1, cartwheel/c -> 2.
    rows.sort()
    entries = {
        side: [(k, label, path) for k, (label, _, flag, path) in enumerate(rows) if flag == FLAGS[side]]
        for side in SPLITS
    }
    return class_names, entries


def hmdb51_catalog(
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
    """The ``split`` (``"train"``/``"test"``) of HMDB51 fold ``fold`` (1, 2 or 3) under ``data_root``.

    ``stride``/``fps`` set ``lengths`` and are recorded on the catalog for ``decode``; ``verify=True``
    counts frames by decoding (slow); ``workers`` threads probe headers, with ``decoder`` (``data.decoders``).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    class_names, entries = hmdb51_entries(data_root, fold)
    if not entries[split]:
        splits = os.path.join(os.fspath(data_root), SPLITS_DIR)
        raise ValueError(
            f"no HMDB51 video has flag {FLAGS[split]} ({split}) in {splits}/*{_split_file_name('', fold)}; "
            "are the files truncated?"
        )
    return build_catalog(
        entries[split],
        class_names=class_names,
        split=split,
        dataset="hmdb51",
        fold=fold,
        stride=stride,
        fps=fps,
        verify=verify,
        workers=workers,
        decoder=decoder,
    )
