"""The run folder's checkpoints: layout, schedule, save, and "load the newest checkpoint that loads".

Layout: ``RUN_DIR/checkpoint_round_NNNNNN/`` (six digits: names sort by round) with ``state.pt``
(``{"format": 2, "state": AveragedState.to_dict(), "history": {...}, "config": Config.to_dict()}`` of plain
values, ``torch.load(weights_only=True)``), ``position.json`` (readable without torch) and
``validation.json`` (the validation history up to that round).
Schedule (``is_due``): round r when ``r % every == 0``, but the final round. Rank 0 ``put``s each folder
into the run folder. Every reader (learner seed, averager, ``--resume``, fusion, ``--init-from``, export,
predict) goes through ``load``/``load_latest``.
Retention (``retain``): the newest ``keep``, the best by validation accuracy, any round newer than the last scored.
Contract: ``load_latest`` returns the newest checkpoint that loads, skipping a corrupt one with a
warning; files are written under a temporary name and renamed; a failed write raises ``CheckpointError``
naming the folder, older checkpoints untouched; format-1 checkpoints still load. torch is imported by
``save`` and ``load`` only; ``load(..., defer_tensors=True)`` (a restarted averager's) needs none.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import pickle
import shutil
import threading
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raytrain_seq.rounds.state import AveragedState

logger = logging.getLogger(__name__)

__all__ = [
    "EVENTS_FILE",
    "POSITION_FILE",
    "PREFIX",
    "STATE_FILE",
    "VALIDATION_FILE",
    "Checkpoint",
    "CheckpointError",
    "DeferredTensors",
    "candidates",
    "check_writable",
    "folder_name",
    "is_due",
    "kept",
    "load",
    "load_latest",
    "put",
    "retain",
    "save",
    "stopped_error",
]

PREFIX = "checkpoint_round_"
STATE_FILE = "state.pt"
POSITION_FILE = "position.json"
VALIDATION_FILE = "validation.json"  # {"scores": [[round, accuracy], ...]}: the retention's scores
EVENTS_FILE = "events.jsonl"  # the run folder's membership and recovery log (rounds.events)
# Ray Train 2.60's list of the checkpoints handed to ray.train.report, in the run folder (see ``retain``).
_RAY_TRAIN_SNAPSHOT = "checkpoint_manager_snapshot.json"
FORMAT = 2
# Keys of the first format's averager snapshot that are history, not state.
_HISTORY_KEYS = ("validation_due", "dropped_log", "batch_size_history", "validation_history", "loss_history")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names the folder and the fix."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """One loaded checkpoint folder."""

    folder: Path
    state: AveragedState
    history: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    position: dict[str, Any] | None = None
    model_spec: dict[str, Any] | None = None
    """What the model was built for: ``num_classes``, ``in_channels``, ``class_names`` (None: not kept)."""

    @property
    def round(self) -> int:
        return self.state.round


def folder_name(round: int) -> str:
    """``checkpoint_round_000012`` for round 12."""
    return f"{PREFIX}{round:06d}"


def is_due(round: int, *, every: int, final: bool = False) -> bool:
    """Whether round ``round`` is a checkpoint: every ``every`` rounds (0 = never), not the final one.

    E.g. every=5: rounds 5, 10, 15 ...; the final round is checkpointed by the end of the run instead.
    """
    return bool(every) and round % every == 0 and not final


def save(
    folder: str | Path,
    *,
    state: AveragedState,
    history: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    position: Mapping[str, Any] | None = None,
    model_spec: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``state.pt`` and ``position.json`` into ``folder`` (created); returns the folder."""
    import torch

    folder = Path(folder)
    payload = {"format": FORMAT, "state": state.to_dict(), "history": dict(history or {})}
    payload["config"] = None if config is None else dict(config)
    payload["model_spec"] = None if model_spec is None else dict(model_spec)
    where = {**(position or state.position or {}), "round": state.round}
    scores = [
        [int(v["round"]), float(v["accuracy"])]
        for v in payload["history"].get("validation_history", ())
        if v.get("accuracy") is not None
    ]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write(folder / STATE_FILE, lambda path: torch.save(payload, path))
        _write(folder / POSITION_FILE, lambda path: path.write_text(json.dumps(where)))
        _write(folder / VALIDATION_FILE, lambda path: path.write_text(json.dumps({"scores": scores})))
    except OSError as exc:
        raise CheckpointError(
            f"cannot write checkpoint {folder} ({exc.strerror or exc}): free space on, or fix the "
            "permissions of, the storage path; the previous checkpoints are untouched"
        ) from exc
    return folder


def put(folder: str | Path, run_dir: str | Path, round: int, *, keep: int | None = None) -> Path:
    """Copy a checkpoint folder made by ``save`` into ``run_dir`` as ``folder_name(round)``; returns it.

    Copied under a hidden name first and renamed, so no reader ever sees half a folder. A folder that
    cannot be written raises ``CheckpointError`` naming it, and the previous checkpoints are untouched.
    ``keep``: then ``retain(run_dir, keep)``, the run's older checkpoints pruned."""
    target = Path(run_dir) / folder_name(round)
    check_writable(target)
    partial = target.with_name(f".{target.name}.partial")
    try:
        shutil.copytree(folder, partial, dirs_exist_ok=True)  # a crashed attempt's leftover is overwritten
        old = target.with_name(f".{target.name}.removing")
        if target.is_dir():  # the same round again (a resume redoes a round whose folder did not load)
            os.replace(target, old)
        os.replace(partial, target)
        shutil.rmtree(old, ignore_errors=True)  # only tidying: the new folder is in place
    except OSError as exc:
        # Only tidying: on full storage it may fail too, and the error raised below is the one that says why.
        shutil.rmtree(partial, ignore_errors=True)
        raise CheckpointError(
            f"cannot write checkpoint {target} ({exc.strerror or exc}): free space on, or fix the "
            "permissions of, the storage path; the run stops here and the previous checkpoints stay "
            "loadable (--resume continues from the newest)"
        ) from exc
    if keep is not None:
        retain(run_dir, keep)
    return target


def kept(rounds: list[int], keep: int, scores: Mapping[int, float]) -> set[int]:
    """The checkpoint rounds to keep: the newest ``keep``, the best scored one (the earliest of equals),
    and every round newer than the last scored one (its score may still come).

    E.g. rounds [1..6], keep 2, scores {1: .5, 2: .7, 3: .6, 4: .65, 5: .62} -> {6, 5, 2}.
    """
    newest = sorted(rounds, reverse=True)
    keep_set = set(newest[:keep])
    scored = [r for r in rounds if r in scores]
    if scored:
        keep_set.add(max(scored, key=lambda r: (scores[r], -r)))
        keep_set.update(r for r in rounds if r > max(scores))
    else:
        keep_set.update(rounds)  # nothing scored yet: nothing is known to be worse
    return keep_set


def retain(run_dir: str | Path, keep: int) -> list[Path]:
    """Remove the run's checkpoint folders that ``kept`` does not keep; returns the removed ones.

    Scores: the newest checkpoint's ``validation.json`` (the whole validation history up to it). A folder
    is renamed to a hidden name before it is deleted, so no reader ever loads half of one; a folder that
    cannot be removed is left with a warning (retention never stops a run). Example, keep=2, rounds 1..6
    checkpointed, rounds 1..5 scored 0.50 0.70 0.60 0.65 0.62: rounds 6 and 5 (newest), 2 (best) stay.
    """
    folders = candidates(run_dir)
    if len(folders) <= keep:
        return []
    if (Path(run_dir) / _RAY_TRAIN_SNAPSHOT).is_file():
        # A run begun before the learners put their checkpoints themselves: Ray Train listed its folders
        # and would refuse to resume the run once one of them is gone. Such a run keeps all of them.
        logger.debug(
            "%s: Ray Train lists its checkpoints (%s): none is removed", run_dir, _RAY_TRAIN_SNAPSHOT
        )
        return []
    scores: dict[int, float] = {}
    try:
        raw = json.loads((folders[0] / VALIDATION_FILE).read_text())
        scores = {int(r): float(a) for r, a in raw["scores"]}
    except (OSError, ValueError, KeyError, TypeError):
        logger.debug("%s has no readable %s: keeping the newest %d only", folders[0], VALIDATION_FILE, keep)
    by_round = {_round(p): p for p in folders}
    keep_rounds = kept(list(by_round), keep, scores)
    removed = []
    for round_, folder in sorted(by_round.items()):
        if round_ in keep_rounds:
            continue
        doomed = folder.with_name(f".{folder.name}.removing")
        try:
            os.replace(folder, doomed)
            shutil.rmtree(doomed)
        except OSError as exc:
            logger.warning("cannot remove old checkpoint %s (%s): it stays", folder, exc.strerror or exc)
            continue
        removed.append(folder)
    if removed:
        best = max((r for r in keep_rounds if r in scores), key=lambda r: scores[r], default=None)
        logger.info(
            "removed %d old checkpoint(s) from %s; kept rounds %s (best: %s)",
            len(removed), run_dir, sorted(keep_rounds), best,
        )  # fmt: skip
    return removed


def _round(folder: Path) -> int:
    """The round of a checkpoint folder: ``checkpoint_round_000012`` -> 12."""
    return int(folder.name[len(PREFIX) :])


def check_writable(folder: str | Path) -> None:
    """Raise CheckpointError naming ``folder`` and the fix when a checkpoint cannot be written there.

    Probes what ``put``'s copy into the run folder needs: the folder is (or can be made) a directory
    and takes a file. A folder the probe made is removed again, so the copy finds things as they were.
    """
    folder = Path(folder)
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write_probe"
        probe.write_bytes(b"")
        probe.unlink()
        if made:
            folder.rmdir()
    except OSError as exc:
        raise CheckpointError(
            f"cannot write checkpoint {folder} ({exc.strerror or exc}): free space on, or fix the "
            "permissions of, the storage path (a file in the place of the folder counts too); the run "
            "stops here and the previous checkpoints stay loadable (--resume continues from the newest)"
        ) from exc


def stopped_error(run_dir: str | Path, message: str | None = None) -> CheckpointError:
    """The error of a run whose learners stopped because a checkpoint could not be written: rank 0's
    ``message`` (its ``LearnerStop``) when it gave one, else one naming the run folder."""
    if message:
        return CheckpointError(message)
    return CheckpointError(
        f"the learners stopped before the end of the run without a final checkpoint in {run_dir}: a "
        "checkpoint could not be written there; free space on, or fix the permissions of, the storage "
        "path, then continue with --resume (the previous checkpoints stay loadable)"
    )


def _write(path: Path, write) -> None:
    """Write through a temporary name and rename: a crash never leaves a half file at ``path``."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def load(folder: str | Path, *, defer_tensors: bool = False) -> Checkpoint:
    """The checkpoint in ``folder``; CheckpointError naming it when it is missing or does not load.

    defer_tensors: the state's ``params`` and ``optimizer_state`` are ``DeferredTensors`` (their keys
    now, their tensors on first use), the rest read without torch; a file that holds tensors elsewhere,
    or that the reader without torch does not know, loads whole.
    """
    from raytrain_seq.rounds.state import AveragedState

    folder = Path(folder)
    path = folder / STATE_FILE
    raw = _skimmed(path) if defer_tensors else None
    if raw is None:
        raw = _torch_load(path)
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"{path} holds a {type(raw).__name__}, not a checkpoint dict")
    try:
        if "averager" in raw:  # the first format: one averager snapshot dict
            snapshot = dict(raw["averager"])
            history = {key: snapshot.pop(key) for key in _HISTORY_KEYS if key in snapshot}
            state = AveragedState.from_dict({**snapshot, "source": "checkpoint"})
        else:
            state = AveragedState.from_dict({**raw["state"], "source": "checkpoint"})
            history = dict(raw.get("history") or {})
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a raytrain_seq checkpoint ({exc})") from exc
    position = None
    if (folder / POSITION_FILE).is_file():
        position = json.loads((folder / POSITION_FILE).read_text())
    config, spec = raw.get("config"), raw.get("model_spec")
    return Checkpoint(
        folder=folder,
        state=state,
        history=history,
        config=dict(config) if isinstance(config, Mapping) else None,
        position=position,
        model_spec=dict(spec) if isinstance(spec, Mapping) else None,
    )


def _torch_load(path: Path) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path.parent} holds no {STATE_FILE}: is it a checkpoint folder?") from exc
    except Exception as exc:  # a truncated or corrupt file raises one of several unpickling errors
        raise CheckpointError(f"{path} does not load ({type(exc).__name__}: {exc})") from exc


class DeferredTensors(Mapping):
    """A loaded checkpoint's ``params`` or ``optimizer_state`` whose tensors are read from its file when
    first used (``load(..., defer_tensors=True)``); its keys are known at once. Both of a file share one
    read (thread-safe), by whichever thread asks first. Pickles as the plain dict."""

    def __init__(self, file: _TensorFile, field: str, keys: tuple[Any, ...]) -> None:
        self._file, self._field, self._keys = file, field, keys

    def load(self) -> dict[Any, Any]:
        """The tensors (read now unless read already; CheckpointError when the file no longer loads)."""
        return self._file.read()[self._field]

    @property
    def loaded(self) -> bool:
        return self._file.loaded

    def __getitem__(self, key: Any) -> Any:
        return self.load()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return dict, (self.load(),)

    def __repr__(self) -> str:
        return f"DeferredTensors({self._file.path}, {self._field!r}, {len(self._keys)} keys)"


class _TensorFile:
    """One ``state.pt`` whose ``state`` entry is read once, by whichever thread asks first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._state: Mapping[str, Any] | None = None

    @property
    def loaded(self) -> bool:
        return self._state is not None

    def read(self) -> Mapping[str, Any]:
        with self._lock:
            if self._state is None:
                self._state = _torch_load(self.path)["state"]
            return self._state


class _Tensor:
    """Where a tensor was in a file read without torch (``_Skim``)."""


class _Skim(pickle.Unpickler):
    """A ``torch.save`` file's pickle read without torch: plain values as they are, a tensor as a
    ``_Tensor`` marker; any other class is refused (as ``weights_only`` refuses it)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module in ("builtins", "__builtin__") and name in ("set", "frozenset", "complex"):
            return {"set": set, "frozenset": frozenset, "complex": complex}[name]
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda *args: _Tensor()
        if module == "torch" and name.endswith("Storage"):
            return None  # a storage's type, an argument of the tensor's marker
        raise pickle.UnpicklingError(f"{module}.{name} is neither a plain value nor a tensor")

    def persistent_load(self, pid: Any) -> None:
        return None  # a storage: its bytes stay in the file


def _skimmed(path: Path) -> dict[str, Any] | None:
    """The checkpoint dict of ``path`` with ``DeferredTensors`` for the state's tensors, read without
    torch; None when that cannot be done (not a zip, a class ``_Skim`` refuses, tensors elsewhere)."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
            with archive.open(name) as data:
                raw = _Skim(data).load()
    except (OSError, zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, EOFError, ValueError) as exc:
        logger.debug("%s is read whole (%r)", path, exc)
        return None
    state = raw.get("state") if isinstance(raw, dict) else None
    if not isinstance(state, dict) or not isinstance(state.get("params"), Mapping):
        return None  # the first format, or not a checkpoint: the eager load says which
    tensors = {key: state.get(key) for key in ("params", "optimizer_state")}
    if _holds_tensors({**raw, "state": {k: v for k, v in state.items() if k not in tensors}}):
        return None
    file = _TensorFile(path)
    for key, value in tensors.items():
        if value is not None:
            state[key] = DeferredTensors(file, key, tuple(value))
    return raw


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, _Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensors(v) for v in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_holds_tensors(v) for v in value)
    return False


def candidates(run_dir: str | Path) -> list[Path]:
    """The run's checkpoint folders that hold a state file, newest first."""
    found = [
        p
        for p in Path(run_dir).glob(f"{PREFIX}*")
        if p.name[len(PREFIX) :].isdigit() and (p / STATE_FILE).is_file()
    ]
    return sorted(found, reverse=True)


def load_latest(run_dir: str | Path, *, defer_tensors: bool = False) -> Checkpoint | None:
    """The newest checkpoint of ``run_dir`` that loads (None: there is none); broken ones are skipped
    with a warning naming each, so a checkpoint cut short by a crash falls back to the one before.
    defer_tensors: as ``load``'s (a file cut short in its tensors then fails where they are used)."""
    for folder in candidates(run_dir):
        try:
            return load(folder, defer_tensors=defer_tensors)
        except CheckpointError as exc:
            logger.warning("checkpoint %s skipped: %s; trying the one before", folder.name, exc)
    return None
