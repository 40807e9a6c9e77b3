"""Classify video files with a trained model: the top-5 classes of each, through the run's own transforms.

    python -m raytrain_seq.inference.predict RUN_DIR_OR_MODEL_PT VIDEO [VIDEO ...] [--test-views ten_crop] [--device cpu]

The model is a finished run's final averaged model (its folder) or an export (``model.pt`` and
``model.json``, ``raytrain_seq.inference.export``); a ``--model-factory`` module must be importable here. Each
video is decoded at the run's stride (or frame rate), resized to its cache
size (short side) and cut to its crop as the run's evaluation does (``data.sources``: the RGB frames, or
for a flow run the optical flow of each kept frame and the source frame after it), and given to the
model as one whole sequence. ``--test-views`` scores several crops (``augment.test_views``: the centre,
its mirror, three or ten crops) and averages their softmax, as the run's test split does. The model
runs on the GPU when there is one (``--device cpu`` to stay off it). Prints, per video, its top-5
classes with their probabilities. A file that cannot be decoded is reported on stderr and the others go
on; the exit code is 1 if any failed, 2 if the run folder or export is unusable.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_seq.algorithms.augment import TEST_VIEWS
from raytrain_seq.config import RunSetupError
from raytrain_seq.data.decoders import DECODERS
from raytrain_seq.inference.export import input_spec, load_exported, load_run, model_spec

logger = logging.getLogger(__name__)

__all__ = ["Predictor", "main"]


def _device(name: str | None):
    import torch

    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RunSetupError("--device cuda: torch sees no GPU here: pass --device cpu (or auto)")
    return torch.device(name)


def _decoder(name: str) -> str:
    from raytrain_seq.data.decoders import resolve

    try:
        return resolve(name)
    except (ImportError, ValueError) as exc:
        raise RunSetupError(str(exc)) from exc


class Predictor:
    """A trained model and its input transforms; ``top(path, k)`` -> [(class name, probability), ...].

    ``source``: a run folder or an exported ``model.pt``. ``device``: "auto" (the GPU when there is
    one), "cpu" or "cuda". ``test_views``: the views each video is scored on (``augment.TEST_VIEWS``).
    ``decoder``: the video decoder (``data.decoders``; "auto", the fastest installed).
    ``config`` is the run's Config for a run folder, None for an export.
    """

    def __init__(
        self,
        source: str | Path,
        *,
        device: str | None = "auto",
        test_views: str = "center",
        decoder: str = "auto",
    ) -> None:
        from raytrain_seq.models.factory import model_from_state

        if test_views not in TEST_VIEWS:
            raise RunSetupError(f"--test-views {test_views!r}: choose one of {', '.join(TEST_VIEWS)}")
        self.test_views, self.device = test_views, _device(device)
        self.decoder = _decoder(decoder)
        path = Path(source).expanduser()
        self.config = None
        if path.is_file():
            model, meta = load_exported(path)
            self.class_names, self.input = list(meta["class_names"]), dict(meta["input"])
        else:
            found, self.config = load_run(path)
            spec = model_spec(found, self.config)
            self.class_names, self.input = list(spec["class_names"]), input_spec(self.config, spec)
            model = model_from_state(
                self.config.model,
                found.state.params,
                num_classes=spec["num_classes"],
                in_channels=spec["in_channels"],
            )
            if self.config.data.dataset == "synthetic":
                logger.warning("%s trained on the synthetic set: its classes are not real actions", source)
        self.model = model.to(self.device).eval()

    def uncropped(self, path: str | Path) -> np.ndarray:
        """uint8 ``[T, size, size, C]`` of ``path`` before the crop (VideoError if unreadable): the frames
        the run's evaluation caches, decoded, resized and centred at the cache size."""
        from raytrain_seq.algorithms.augment import resize_video
        from raytrain_seq.data.video import decode, decode_pairs

        spec: dict[str, Any] = self.input
        stride, fps, size = spec["stride"], spec["fps"], spec["resize_short_side"]
        if spec["stream"] == "flow":
            from raytrain_seq.data.flow import flow_window, pair_flow

            # The run's evaluation: the flow of the whole frames, then the centred window (flow once).
            first, second, last = decode_pairs(path, stride=stride, fps=fps, size=size, decoder=self.decoder)
            return flow_window(pair_flow(first, second, last=last), size)
        return resize_video(decode(path, stride=stride, fps=fps, size=size, decoder=self.decoder), size)

    def frames(self, path: str | Path) -> np.ndarray:
        """uint8 ``[T, crop, crop, C]`` of ``path`` as the run's evaluation sees it (the centre view)."""
        from raytrain_seq.algorithms.augment import center_crop

        return center_crop(self.uncropped(path), self.input["center_crop"])

    def probabilities(self, frames: np.ndarray) -> np.ndarray:
        """Softmax over the classes for one sequence of cropped frames (one block row, one sequence)."""
        return self._scores(frames, None)

    def _scores(self, frames: np.ndarray, views: list[tuple[int, int, bool]] | None) -> np.ndarray:
        """The softmax of cropped ``frames`` (``views`` None), or the mean softmax of the ``views`` cut
        from uncropped ones (``evaluation.view_probabilities``, the test split's multi-view scoring)."""
        import torch

        from raytrain_seq.models import predict
        from raytrain_seq.training.evaluation import view_probabilities

        t = frames.shape[0]
        batch = {
            "frames": torch.from_numpy(np.ascontiguousarray(frames[None])),
            "starts": torch.tensor([[0]]),
            "lengths": torch.tensor([[t]]),
            "labels": torch.tensor([[0]]),  # unused: predict returns the logits we read
            "num_sequences": torch.tensor([1]),
        }
        if views is None:
            logits, _ = predict(self.model, batch)
            return torch.softmax(logits.float(), dim=1)[0].cpu().numpy()
        crop, flow = self.input["center_crop"], self.input["stream"] == "flow"
        with torch.no_grad():
            probs, _ = view_probabilities(self.model, batch, views, crop=crop, flow=flow)
        return probs[0].cpu().numpy()

    def top(self, path: str | Path, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` most probable classes of the video file ``path`` under ``test_views``."""
        from raytrain_seq.algorithms.augment import test_views

        if self.test_views == "center":
            p = self.probabilities(self.frames(path))
        else:
            views = test_views(self.test_views, self.input["resize_short_side"], self.input["center_crop"])
            p = self._scores(self.uncropped(path), views)
        order = np.argsort(-p)[:k]
        return [(self.class_names[i], float(p[i])) for i in order]


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1 (the classes printed per video), got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m raytrain_seq.inference.predict",
        description=__doc__.splitlines()[0],
        allow_abbrev=False,
    )
    parser.add_argument(
        "run_dir", metavar="RUN_DIR|MODEL_PT", help="a finished run's folder, or an exported model.pt"
    )
    parser.add_argument("videos", nargs="+", metavar="VIDEO", help="video files to classify")
    parser.add_argument(
        "--top", type=_at_least_one, default=5, metavar="K", help="classes to print per video [default 5]"
    )
    parser.add_argument(
        "--test-views", default="center", choices=TEST_VIEWS, help="views averaged per video [default center]"
    )
    parser.add_argument(
        "--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: the GPU when there is one"
    )
    parser.add_argument(
        "--decoder", default="auto", choices=DECODERS, help="video decoder (auto: the fastest installed)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        predictor = Predictor(
            args.run_dir, device=args.device, test_views=args.test_views, decoder=args.decoder
        )
    except ValueError as err:  # RunSetupError, or a model factory that does not import here
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    from raytrain_seq.data.video import VideoError

    failed = 0
    for video in args.videos:
        try:
            ranked = predictor.top(video, args.top)
        except VideoError as err:
            # Not the catalog's advice (delete it from the split lists): this file was given on its own.
            print(
                f"error: {err.path}: {err.reason}: pass a video file that {predictor.decoder} can decode (re-encode it, e.g. "
                "ffmpeg -i IN -c:v mpeg4 -q:v 2 OUT.avi); the other videos go on",
                file=sys.stderr,
            )
            failed += 1
            continue
        print(video)
        for name, probability in ranked:
            print(f"  {probability:6.1%}  {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
