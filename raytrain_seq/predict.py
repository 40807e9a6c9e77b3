"""Classify video files with a trained run: the top-5 classes of each, through the run's own transforms.

    python -m raytrain_seq.predict RUN_DIR VIDEO [VIDEO ...]

Each video is decoded with PyAV at the run's stride (or frame rate), resized to its cache size (short
side), centre-cropped to its crop, as the run's evaluation does (``data.sources``: the RGB frames, or for
a flow run the optical flow of each kept frame and the source frame after it), and given to the run's
final averaged model as one whole sequence. Prints, per video, its top-5 classes with their softmax
probabilities. A file that cannot be decoded is reported on stderr and the others go on; the exit code
is 1 if any failed, 2 if the run folder is unusable.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

from raytrain_seq.config import RunSetupError
from raytrain_seq.export import load_run, model_spec

logger = logging.getLogger(__name__)

__all__ = ["Predictor", "main"]


class Predictor:
    """A run's final model and transforms; ``top(path, k)`` -> [(class name, probability), ...]."""

    def __init__(self, run_dir: str | Path) -> None:
        from raytrain_seq.models.factory import model_from_state

        found, self.config = load_run(run_dir)
        spec = model_spec(found, self.config)
        self.class_names = list(spec["class_names"])
        self.model = model_from_state(
            self.config, found.state.params, num_classes=spec["num_classes"], in_channels=spec["in_channels"]
        ).eval()
        if self.config.data.dataset == "synthetic":
            logger.warning("%s trained on the synthetic set: its classes are not real actions", run_dir)

    def frames(self, path: str | Path) -> np.ndarray:
        """uint8 ``[T, crop, crop, C]`` of ``path`` as the run's evaluation sees it (VideoError if unreadable)."""
        from raytrain_seq.augment import center_crop, resize_video
        from raytrain_seq.data.video import decode, decode_pairs

        data = self.config.data
        if data.stream == "flow":
            from raytrain_seq.data.flow import flow_window, pair_flow

            # The run's evaluation: the flow of the whole frames, then the centred window (flow once).
            first, second, last = decode_pairs(path, stride=data.stride, fps=data.fps, size=data.cache_size)
            frames = flow_window(pair_flow(first, second, last=last), data.cache_size)
        else:
            frames = resize_video(
                decode(path, stride=data.stride, fps=data.fps, size=data.cache_size), data.cache_size
            )
        return center_crop(frames, data.crop)

    def probabilities(self, frames: np.ndarray) -> np.ndarray:
        """Softmax over the classes for one sequence of frames (one block row holding one sequence)."""
        import torch

        from raytrain_seq.models import predict

        t = frames.shape[0]
        batch = {
            "frames": torch.from_numpy(np.ascontiguousarray(frames[None])),
            "starts": torch.tensor([[0]]),
            "lengths": torch.tensor([[t]]),
            "labels": torch.tensor([[0]]),  # unused: predict returns the logits we read
            "num_sequences": torch.tensor([1]),
        }
        logits, _ = predict(self.model, batch)
        return torch.softmax(logits.float(), dim=1)[0].numpy()

    def top(self, path: str | Path, k: int = 5) -> list[tuple[str, float]]:
        p = self.probabilities(self.frames(path))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m raytrain_seq.predict", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a finished run's folder (STORAGE_PATH/RUN_NAME)")
    parser.add_argument("videos", nargs="+", metavar="VIDEO", help="video files to classify")
    parser.add_argument(
        "--top", type=_at_least_one, default=5, metavar="K", help="classes to print per video [default 5]"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        predictor = Predictor(args.run_dir)
    except RunSetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from raytrain_seq.data.video import VideoError

    failed = 0
    for video in args.videos:
        try:
            ranked = predictor.top(video, args.top)
        except VideoError as err:
            # Not the catalog's advice (delete it from the split lists): this file was given on its own.
            print(
                f"error: {err.path}: {err.reason}: pass a video file that PyAV can decode (re-encode it, e.g. "
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
