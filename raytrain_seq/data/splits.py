"""Which videos a run trains on, validates on and keeps: the validation hold-out and the max_videos subset.

``holdout`` holds whole groups of a dataset's training videos out for validation, about ``fraction`` of
each class (``clip_group`` names a clip's group: UCF101's ``_gNN_``, else the file alone), so that no
group sits on both sides; ``balanced_subset`` keeps at most ``max_videos`` videos dealt round-robin over
the classes; ``catalog_subset`` cuts a catalog to the chosen positions. Every choice is seeded by the
run's seed and the class, never by a process: each worker and a resume choose the same videos.
"""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

__all__ = ["SPLITS", "balanced_subset", "catalog_subset", "clip_group", "holdout"]

SPLITS = ("train", "val", "test")
_VAL_SALT = 0x56414C44  # "VALD": the validation hold-out of class c
_SUBSET_SALT = 0x53554253  # "SUBS": the max_videos subset of class c
_GROUP = re.compile(r"_g(\d+)_c\d+\.[^.]+$")  # UCF101: v_<Class>_g08_c01.avi -> group "08"


def holdout(labels: np.ndarray, groups: list[str], fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of the validation videos: whole groups, about ``fraction`` of each class.

    Per class c, its groups in a seeded random order are taken until they hold at least
    ``max(1, round(fraction * n_c))`` videos, never every group (the class keeps a training video; a
    class with one group gives none). Example: a class of 8 videos in groups g1..g4 (2 each), fraction
    0.1: target max(1, round(0.8)) = 1, so the first group of the order (2 videos) is held out.
    """
    labels = np.asarray(labels)
    keys = np.asarray(groups, dtype=object)
    mask = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        names = sorted(set(keys[members].tolist()))
        if len(names) < 2:
            continue
        order = np.random.default_rng([seed, _VAL_SALT, int(label)]).permutation(len(names))
        target, taken = max(1, round(fraction * len(members))), 0
        for j in order[:-1]:
            if taken >= target:
                break
            chosen = members[keys[members] == names[j]]
            mask[chosen] = True
            taken += len(chosen)
    return mask


def balanced_subset(labels: np.ndarray, limit: int | None, seed: int) -> np.ndarray:
    """Sorted positions of at most ``limit`` videos, dealt round-robin over the classes.

    Each class's videos are put in a seeded random order; round r takes the r-th video of every class
    that still has one (classes ascending). Labels [0, 0, 0, 1, 2, 2] with limit 4: round 0 takes one
    video of classes 0, 1, 2, round 1 the second of class 0: classes 0, 0, 1, 2.
    """
    labels = np.asarray(labels)
    if limit is None or limit >= len(labels):
        return np.arange(len(labels))
    queues = [
        members[np.random.default_rng([seed, _SUBSET_SALT, int(label)]).permutation(len(members))]
        for label in np.unique(labels)
        for members in [np.flatnonzero(labels == label)]
    ]
    picks = [int(q[r]) for r in range(max(len(q) for q in queues)) for q in queues if r < len(q)]
    return np.sort(np.asarray(picks[:limit], dtype=np.int64))


def catalog_subset(catalog, positions: np.ndarray, split: str):
    """``catalog`` cut to the videos at ``positions`` (ids, labels, lengths, frames, paths), as ``split``."""
    return dataclasses.replace(
        catalog,
        ids=catalog.ids[positions],
        labels=catalog.labels[positions],
        lengths=catalog.lengths[positions],
        frames=None if catalog.frames is None else catalog.frames[positions],
        paths=tuple(catalog.paths[int(k)] for k in positions),
        split=split,
    )


def clip_group(path: str) -> str:
    """UCF101's group of a clip (``v_X_g08_c01.avi`` -> ``"08"``); any other file is its own group."""
    name = os.path.basename(path)
    match = _GROUP.search(name)
    return match.group(1) if match else name
