"""Export a trained run's model: a plain ``state_dict`` file and a small JSON of classes and input spec.

    python -m raytrain_seq.export RUN_DIR --out model.pt

writes ``model.pt`` (``torch.save`` of the averaged model's ``state_dict``: plain tensors, loadable with
``torch.load(..., weights_only=True)`` and no raytrain_seq checkpoint around it) and ``model.json``: the
class names, the input the model expects (stream, channels, frame stride or rate, the resize and the
centre crop the run evaluated with, uint8 frames ``[T, H, W, C]``), the architecture (``config.model``)
and where it came from (run folder, checkpoint, round). ``load_exported(path)`` rebuilds the model from
the two files. The newest checkpoint of the run that loads is exported (``checkpoint.load_latest``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from raytrain_seq import checkpoint
from raytrain_seq.config import Config, RunSetupError

logger = logging.getLogger(__name__)

__all__ = ["export", "load_exported", "load_run", "main", "model_spec"]


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


def _input_spec(config: Config, spec: dict[str, Any]) -> dict[str, Any]:
    data = config.data
    return {
        "stream": data.stream,
        "channels": spec["in_channels"],
        "frames": "uint8 [T, H, W, C], RGB (flow: 2 channels, quantised as raytrain_seq.data.flow)",
        "stride": data.stride,
        "fps": data.fps,
        "resize_short_side": data.cache_size,
        "center_crop": data.crop,
        "normalisation": "inside the model (ImageNet mean/std when built with --weights)",
    }


def export(run_dir: str | Path, out: str | Path) -> tuple[Path, Path]:
    """Write the model's ``state_dict`` to ``out`` and its spec to ``out`` with suffix ``.json``."""
    import torch

    found, config = load_run(run_dir)
    spec = model_spec(found, config)
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(found.state.params), out)
    meta = {
        "class_names": spec["class_names"],
        "num_classes": spec["num_classes"],
        "input": _input_spec(config, spec),
        "model": {**config.to_dict()["model"], "init_from": None, "fuse": None},
        "source": {
            "run": str(Path(run_dir).expanduser()),
            "checkpoint": found.folder.name,
            "round": found.round,
        },
    }
    meta_path = out.with_suffix(".json")
    meta_path.write_text(json.dumps(meta, indent=2))
    return out, meta_path


def load_exported(path: str | Path):
    """(the model, its spec dict) from the files ``export`` wrote; the model is in eval mode on the CPU."""
    import torch

    from raytrain_seq.models.factory import model_from_state

    path = Path(path).expanduser()
    meta = json.loads(path.with_suffix(".json").read_text())
    params = torch.load(path, map_location="cpu", weights_only=True)
    config = Config.from_preset(None, model=meta["model"], run_name="exported")
    model = model_from_state(
        config, params, num_classes=meta["num_classes"], in_channels=meta["input"]["channels"]
    )
    return model.eval(), meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raytrain_seq.export", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a finished run's folder (STORAGE_PATH/RUN_NAME)")
    parser.add_argument("--out", required=True, metavar="FILE", help="where the state_dict goes (.pt)")
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
