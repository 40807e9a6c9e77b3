"""Annotation-list reader (MMAction2's ``VideoDataset`` format): your own videos, as ``VideoCatalog`` entries.

A list has one video per line, ``relative/path.ext label`` (the path under ``--data-root``, spaces allowed;
the label an int from 0); blank and ``#`` lines are skipped; any container the decoder reads works.
``--train-list`` and ``--test-list`` are required; ``--val-list`` optional (else the validation split is
held out of the training list); ``--class-names`` names the labels, one per line. A list path is taken as
given when it exists, else under ``--data-root``.
Ids: the rank of a video among ALL lines of the lists, sorted by (label, path): disjoint splits, stable
while the lists are. Lengths come from the header (``video.probe``; no frame count: counted by decoding).
Errors that stop the job at start (naming file, line and fix, as the official readers do): a missing root
or list; a malformed line; a label out of range; a video listed twice, in one list or two; an empty list.
A listed video that is missing, corrupt or empty is skipped with one warning and listed in
``VideoCatalog.skipped`` (``build_catalog``), so the run's ``videos.skipped`` names it.
"""

from __future__ import annotations

import logging
import os

from raytrain_seq.data.video import read_lines

logger = logging.getLogger(__name__)

__all__ = ["LIST_SIDES", "list_entries", "read_class_names", "resolve_list"]

LIST_SIDES = ("train", "val", "test")
_FORMAT = "one 'relative/path.ext label' per line, label an int from 0 ('#' starts a comment line)"


def resolve_list(path: str, data_root: str) -> str:
    """The absolute path of a list file: ``path`` as given when it exists, else under ``data_root``."""
    given = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(given) or os.path.isabs(os.path.expanduser(path)):
        return given
    return os.path.abspath(os.path.join(os.path.expanduser(data_root), path))


def _content(path: str, what: str) -> list[tuple[int, str]]:
    """The non-blank, non-comment lines of ``path`` as ``(line number, text)``."""
    return [(n, line) for n, line in read_lines(path, what, _FORMAT) if not line.startswith("#")]


def read_class_names(path: str) -> tuple[str, ...]:
    """Class names in label order, one per line; ValueError naming the file and line of a duplicate."""
    names: dict[str, int] = {}
    for lineno, name in _content(path, "class-names file"):
        if name in names:
            raise ValueError(
                f"{path}:{lineno}: class {name!r} is already on line {names[name]}; name each once"
            )
        names[name] = lineno
    if len(names) < 2:
        raise ValueError(f"{path}: names {len(names)} classes; a classifier needs at least 2, one per line")
    return tuple(names)


def _parse(path: str, classes: int | None) -> list[tuple[int, str, int]]:
    """``(line, relative path, label)`` of one list; ValueError at a malformed line, label or duplicate."""
    rows: list[tuple[int, str, int]] = []
    first: dict[str, int] = {}
    for lineno, line in _content(path, "annotation list"):
        fields = line.rsplit(maxsplit=1)
        if len(fields) != 2:
            raise ValueError(
                f"{path}:{lineno}: expected 'relative/path.ext label', got {line!r}; add the label"
            )
        rel, text = fields[0].strip().replace("\\", "/"), fields[1]
        try:
            label = int(text)
        except ValueError:
            raise ValueError(
                f"{path}:{lineno}: label {text!r} is not an integer; write 'relative/path.ext label' with "
                "the label an int from 0"
            ) from None
        if label < 0 or (classes is not None and label >= classes):
            bound = f"0..{classes - 1} (the class-names file has {classes} classes)" if classes else ">= 0"
            raise ValueError(f"{path}:{lineno}: label {label} is out of range {bound}; fix the line")
        if rel in first:
            raise ValueError(f"{path}:{lineno}: {rel} is already listed on line {first[rel]}; once only")
        first[rel] = lineno
        rows.append((lineno, rel, label))
    if not rows:
        raise ValueError(f"{path}: lists no video; {_FORMAT}")
    return rows


def _no_video_in_two_lists(parsed: dict[str, tuple[str, list[tuple[int, str, int]]]]) -> None:
    seen: dict[str, tuple[str, int]] = {}
    for path, rows in parsed.values():
        for lineno, rel, _ in rows:
            if rel in seen and seen[rel][0] != path:
                raise ValueError(
                    f"{path}:{lineno}: {rel} is also listed in {seen[rel][0]}:{seen[rel][1]}; a video belongs "
                    "to one split only"
                )
            seen.setdefault(rel, (path, lineno))


def list_entries(
    data_root: str | os.PathLike[str],
    lists: dict[str, str | None],
    class_names: str | None = None,
) -> tuple[tuple[str, ...], dict[str, list[tuple[int, int, str]]]]:
    """Class names and ``{side: [(video_id, label, path), ...]}`` for the given ``lists`` (side -> file;
    "train" and "test" needed, "val" optional), sorted by id. Reads and checks every list (errors name the
    file and line) but opens no video, so it is cheap."""
    root = os.fspath(data_root)
    if not os.path.isdir(os.path.expanduser(root)):
        raise ValueError(
            f"--data-root {root}: no such folder: pass the folder the lists' paths are relative to"
        )
    for side in ("train", "test"):
        if not lists.get(side):
            raise ValueError(f"the {side} list is needed: pass --{side}-list FILE ({_FORMAT})")
    names = read_class_names(resolve_list(class_names, root)) if class_names else None
    files = {side: resolve_list(f, root) for side, f in lists.items() if f}
    parsed = {
        side: (path, _parse(path, None if names is None else len(names))) for side, path in files.items()
    }
    _no_video_in_two_lists(parsed)
    if names is None:
        top = max(label for _, rows in parsed.values() for _, _, label in rows)
        names = tuple(str(label) for label in range(top + 1))
    # Ids: rank in (label, path) order over every list. {b.mp4 1, a.mp4 1, c.mp4 0} -> c 0, a 1, b 2.
    everything = sorted((label, rel) for _, rows in parsed.values() for _, rel, label in rows)
    rank = {rel: k for k, (_, rel) in enumerate(everything)}
    base = os.path.abspath(os.path.expanduser(root))
    entries = {
        side: sorted((rank[rel], label, _video_path(base, rel)) for _, rel, label in rows)
        for side, (_, rows) in parsed.items()
    }
    return names, entries


def _video_path(base: str, rel: str) -> str:
    """``rel`` under ``base`` ("a/b.mp4" -> base/a/b.mp4); an absolute path stays as it is."""
    return rel if os.path.isabs(rel) else os.path.join(base, *rel.split("/"))
