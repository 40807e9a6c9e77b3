"""Export a trained run's model: a plain ``state_dict`` file and a small JSON of classes and input spec.

    python -m raytrain_seq.inference.export RUN_DIR --out model.pt

writes ``model.pt`` (the averaged model's ``state_dict``: plain tensors, ``torch.load(...,
weights_only=True)``) and ``model.json`` beside it: the class names, the input the model expects (stream, channels, frame stride or rate, the resize and the
centre crop the run evaluated with, uint8 frames ``[T, H, W, C]``), the architecture (``config.model``)
and where it came from (run folder, checkpoint, round). ``load_exported(path)`` rebuilds the model from
the two files. The newest checkpoint of the run that loads is exported (``checkpoint.load_latest``).

Nothing the user did not name is overwritten: ``--out`` may not end in ``.json`` (the metadata would
replace the weights), and an existing ``NAME.json`` that is not an earlier export's metadata stops the
export. Both files are written under a temporary name and renamed; an unusable ``--out`` is one line
naming it (exit 2).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from raytrain_seq import checkpoint
from raytrain_seq.config import Config, RunSetupError

logger = logging.getLogger(__name__)

__all__ = ["export", "input_spec", "load_exported", "load_run", "main", "model_spec"]


def load_run(run_dir: str | Path) -> tuple[checkpoint.Checkpoint, Config]:
    """The newest loadable checkpoint of ``run_dir`` and the run's Config; RunSetupError naming the folder."""
    folder = Path(run_dir).expanduser()
    found = checkpoint.load_latest(folder) if folder.is_dir() else None
    if found is None or found.state.empty:
        raise RunSetupError(
            f"{folder}: holds no {checkpoint.PREFIX}*/{checkpoint.STATE_FILE} that loads: pass the folder "
            "of a run that finished at least one averaging round"
        )
    if found.config is None:
        raise RunSetupError(f"{found.folder}: the checkpoint keeps no config: it was not written by this job")
    return found, Config.from_dict(found.config)


def model_spec(found: checkpoint.Checkpoint, config: Config) -> dict[str, Any]:
    """``{num_classes, in_channels, class_names}`` the model was built for. A checkpoint written before the
    spec was kept: the class count from the head, the channels from the stream, classes named by index."""
    if found.model_spec is not None:
        return dict(found.model_spec)
    classes = int(found.state.params["head.weight"].shape[0])
    logger.warning("%s keeps no class names (an older checkpoint): classes are named by index", found.folder)
    channels = {"rgb": 3, "flow": 2}[config.data.stream]
    return {"num_classes": classes, "in_channels": channels, "class_names": [str(i) for i in range(classes)]}


def input_spec(config: Config, spec: dict[str, Any]) -> dict[str, Any]:
    """What the model of ``config`` expects: the stream, channels, stride or rate, resize and crop."""
    data = config.data
    return {
        "stream": data.stream,
        "channels": spec["in_channels"],
        "frames": "uint8 [T, H, W, C], RGB (flow: 2 channels, quantised as raytrain_seq.data.flow)",
        "stride": data.stride,
        "fps": data.fps,
        "resize_short_side": data.cache_size,
        "center_crop": data.crop,
        "normalisation": "inside the model (ImageNet or Kinetics mean/std when built with --weights)",
    }


_META_KEYS = frozenset({"class_names", "input", "model", "source"})


def _is_export_meta(path: Path) -> bool:
    """Whether ``path`` holds the metadata of an earlier export (so replacing it loses nothing of the user's)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and set(meta) >= _META_KEYS


def _targets(out: str | Path) -> tuple[Path, Path]:
    """(the weights file, the metadata file) for ``--out``; RunSetupError naming a target it may not write."""
    out = Path(out).expanduser()
    if out.suffix.lower() == ".json":
        raise RunSetupError(
            f"--out {out}: the metadata is written beside the weights as NAME.json, so the weights cannot "
            f"be a .json file: pass e.g. --out {out.with_suffix('.pt')}"
        )
    if out.is_dir():
        raise RunSetupError(
            f"--out {out}: is a folder: pass a file name in it, e.g. --out {out / 'model.pt'}"
        )
    meta = out.with_suffix(".json")
    if meta.exists() and not _is_export_meta(meta):
        raise RunSetupError(
            f"--out {out}: its metadata would replace {meta}, which is not an earlier export's metadata: move "
            "that file away or pick another --out"
        )
    taken = next((parent for parent in out.parents if parent.exists()), None)
    if taken is not None and not taken.is_dir():
        raise RunSetupError(f"--out {out}: {taken} is a file, not a folder: pick another --out")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunSetupError(
            f"--out {out}: cannot make the folder {out.parent} ({exc.strerror or exc}): pick a folder you can "
            "write to"
        ) from exc
    return out, meta


def _write(path: Path, write) -> None:
    """``write(temporary path)``, then rename it to ``path``: a failed write leaves ``path`` as it was."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        write(partial)
        os.replace(partial, path)
    except OSError as exc:
        raise RunSetupError(
            f"--out {path}: cannot write it ({exc.strerror or exc}): pick a folder you can write to, with "
            "free space"
        ) from exc
    finally:
        partial.unlink(missing_ok=True)


def export(run_dir: str | Path, out: str | Path) -> tuple[Path, Path]:
    """Write the model's ``state_dict`` to ``out`` and its spec to ``out`` with suffix ``.json``."""
    out, meta_path = _targets(out)  # before torch and the checkpoint load: a wrong --out costs nothing
    import torch

    found, config = load_run(run_dir)
    spec = model_spec(found, config)
    meta = {
        "class_names": spec["class_names"],
        "num_classes": spec["num_classes"],
        "input": input_spec(config, spec),
        "model": {**config.to_dict()["model"], "init_from": None, "fuse": None},
        "source": {
            "run": str(Path(run_dir).expanduser()),
            "checkpoint": found.folder.name,
            "round": found.round,
        },
    }
    params = dict(found.state.params)

    def save(path: Path) -> None:
        with open(path, "wb") as file:  # opened here: a folder we may not write is an OSError, not torch's
            torch.save(params, file)

    _write(out, save)
    _write(meta_path, lambda path: path.write_text(json.dumps(meta, indent=2)))
    return out, meta_path


def load_exported(path: str | Path):
    """(the model, its spec dict) from the files ``export`` wrote; the model is in eval mode on the CPU.
    RunSetupError naming the file when either is missing or unreadable."""
    import torch

    from raytrain_seq.models.factory import model_from_state

    path = Path(path).expanduser()
    meta_path = path.with_suffix(".json")
    try:
        meta = json.loads(meta_path.read_text())
        params = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises pickle's, OSError, RuntimeError...: each named, re-raised
        raise RunSetupError(
            f"{path}: not an export that loads ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}): pass "
            f"the model.pt that python -m raytrain_seq.inference.export wrote, with its {meta_path.name} beside it"
        ) from exc
    if not isinstance(meta, dict) or not set(meta) >= _META_KEYS:
        raise RunSetupError(f"{meta_path}: not the metadata of an export: export the run again")
    config = Config.from_preset(None, model=meta["model"], run_name="exported")
    model = model_from_state(
        config.model, params, num_classes=meta["num_classes"], in_channels=meta["input"]["channels"]
    )
    return model.eval(), meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raytrain_seq.inference.export",
        description=__doc__.splitlines()[0],
        allow_abbrev=False,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a finished run's folder (STORAGE_PATH/RUN_NAME)")
    parser.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="where the state_dict goes (.pt); the metadata goes beside it as FILE with .json",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        model, meta = export(args.run_dir, args.out)
    except RunSetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {model} and {meta}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
