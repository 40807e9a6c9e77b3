"""Train AAVG learners on BLoad blocks of whole videos: flags -> Config -> run -> result table.

    ray job submit --working-dir . -- python jobs/ucf101.py --preset demo
    python jobs/ucf101.py --preset smoke --learners 2 --epochs 1

The techniques (DESIGN.md): BLoad block packing (Iftekhar, Ruschel et al.; ``--packing``, ``--t-max``),
AAVG model averaging (Cong et al.; ``--k``, ``--validate-every``, ``--max-batch-size``), Revamper data
refurbishing (Lee et al.; ``--reuse``) and micro-batch streaming (Piao, Synn et al.;
``--micro-batch-size``). This file is thin on purpose: every check lives in ``raytrain_seq.config`` and all
the work in ``raytrain_seq.runtime.driver.run``, so the same run can be started from Python or tests.
Flags given on the command line override the preset; absent flags keep the preset's (or default) values.
The last line printed is ``summary written to PATH``.
"""

from __future__ import annotations

import argparse
import logging
import sys

from raytrain_seq.config import (
    BACKBONES,
    DATASETS,
    OPTIMIZERS,
    PACKINGS,
    PRESETS,
    TEMPORALS,
    Config,
    RunConfig,
)
from raytrain_seq.summary import format_table

logger = logging.getLogger(__name__)

_NOT_FLAGS = ("preset", "verbose")


def _micro_batch_size(text: str) -> int | str:
    """``--micro-batch-size``: an int, or the word "auto" (the config checks the range)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'auto', got {text!r}") from None


def _names(choices: tuple[str, ...]) -> str:
    return ", ".join(choices)


def build_parser() -> argparse.ArgumentParser:
    """The job's flags, grouped; every field flag defaults to absent so the preset can fill it."""
    d = Config(run=RunConfig(run_name="defaults"))  # the defaults, for the help text only
    parser = argparse.ArgumentParser(
        prog="ucf101.py",
        description=(
            "Train a temporal video classifier with AAVG learners on BLoad blocks of whole videos "
            "(refurbished augmentations, micro-batch streaming) and print the result table."
        ),
        # Absent flags stay absent from the namespace, so the preset (or default) value is kept.
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="start from a named configuration; flags given here override it",
    )
    parser.add_argument("-v", "--verbose", action="store_true", default=False, help="log at DEBUG level")

    data = parser.add_argument_group("data", "which videos, how they are strided, refurbished and packed")
    data.add_argument(
        "--dataset", metavar="NAME", help=f"video source: {_names(DATASETS)} [default {d.data.dataset}]"
    )
    data.add_argument(
        "--data-root",
        metavar="DIR",
        help="folder the official UCF101 / HMDB51 archives were extracted to (see README, 'Real video')",
    )
    data.add_argument(
        "--split",
        type=int,
        metavar="N",
        help=f"official train/test split: 1, 2 or 3 [default {d.data.split}]",
    )
    data.add_argument(
        "--stream",
        metavar="NAME",
        help=f"rgb, flow (optical flow) or fuse (evaluate --fuse RGB_RUN FLOW_RUN) [default {d.data.stream}]",
    )
    data.add_argument(
        "--num-classes",
        type=int,
        metavar="N",
        help="train on the first N classes [default: all of the dataset's, 10 for synthetic]",
    )
    data.add_argument(
        "--max-videos", type=int, metavar="N", help="train on at most N videos [default: all of them]"
    )
    data.add_argument(
        "--stride", type=int, metavar="S", help=f"keep every S-th frame [default {d.data.stride}]"
    )
    data.add_argument(
        "--fps",
        type=float,
        metavar="F",
        help="resample real videos to F frames/s instead of striding (with --stride 1) [default: stride]",
    )
    data.add_argument(
        "--t-max",
        type=int,
        metavar="T",
        help="block length in strided frames [default: the longest strided video]",
    )
    data.add_argument(
        "--packing",
        metavar="STRATEGY",
        help=f"block packing: {_names(PACKINGS)} [default {d.data.packing}]",
    )
    data.add_argument(
        "--reuse",
        type=int,
        metavar="R",
        help=f"refurbish: reuse each cached partial augmentation R epochs (1 = recompute all) "
        f"[default {d.data.reuse}]",
    )
    data.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help=f"root seed of split, packing and augmentation [default {d.data.seed}]",
    )

    model = parser.add_argument_group("model", "the per-frame CNN and the temporal module")
    model.add_argument(
        "--backbone", metavar="NAME", help=f"frame encoder: {_names(BACKBONES)} [default {d.model.backbone}]"
    )
    model.add_argument(
        "--weights", metavar="FILE", help="local ImageNet weights (torchvision layout) for a resnet backbone"
    )
    model.add_argument(
        "--init-from",
        metavar="RUN_DIR",
        help="start from that run's final model (RGB run -> flow model: cross-modality initialisation)",
    )
    model.add_argument(
        "--fuse",
        nargs=2,
        metavar=("RGB_RUN", "FLOW_RUN"),
        help="with --stream fuse: evaluate both runs' models on the test split and fuse their softmax",
    )
    model.add_argument(
        "--temporal",
        metavar="NAME",
        help=f"temporal module: {_names(TEMPORALS)} [default {d.model.temporal}]",
    )
    model.add_argument(
        "--width", type=int, metavar="C", help=f"channels of the first CNN stage [default {d.model.width}]"
    )
    model.add_argument(
        "--depth", type=int, metavar="N", help=f"stride-2 CNN stages [default {d.model.depth}]"
    )
    model.add_argument(
        "--hidden",
        type=int,
        metavar="H",
        help=f"hidden size of the temporal module [default {d.model.hidden}]",
    )

    train = parser.add_argument_group("AAVG training", "learners, averaging rounds, adaptive batch size")
    train.add_argument(
        "--learners",
        metavar="P|MIN:MAX",
        help=f"AAVG learners (Ray Train workers), or an elastic range like 2:8 [default {d.train.learners}]",
    )
    train.add_argument(
        "--max-failures",
        type=int,
        metavar="N",
        help=f"learner-group restarts allowed after failures; -1 = no limit [default {d.train.max_failures}]",
    )
    train.add_argument(
        "--worker-start-timeout-s",
        type=float,
        metavar="S",
        help=f"seconds to wait for a (re)started learner group [default {d.train.worker_start_timeout_s}]",
    )
    train.add_argument(
        "--resize-interval-s",
        type=float,
        metavar="S",
        help=f"seconds between checks for room to add learners [default {d.train.resize_interval_s}]",
    )
    train.add_argument(
        "--averager-timeout-s",
        type=float,
        metavar="S",
        help=f"seconds a round waits for a learner before dropping it [default {d.train.averager_timeout_s}]",
    )
    train.add_argument(
        "--averager-max-restarts",
        type=int,
        metavar="N",
        help=f"restarts of the averaging actor; -1 = no limit [default {d.train.averager_max_restarts}]",
    )
    train.add_argument(
        "--adaptive-batch",
        action=argparse.BooleanOptionalAction,
        help="grow the batch size when validation stalls (AAVG) [default: on]",
    )
    train.add_argument(
        "--merge-moments",
        action=argparse.BooleanOptionalAction,
        help="average Adam moments with the weights at each round (AAVG) [default: on]",
    )
    train.add_argument(
        "--k",
        type=int,
        metavar="K",
        help=f"local steps between averaging rounds; -1 = once per epoch [default {d.train.k}]",
    )
    train.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help=f"initial blocks per mini-batch; AAVG may grow it [default {d.train.batch_size}]",
    )
    train.add_argument(
        "--max-batch-size",
        type=int,
        metavar="B",
        help=f"cap of the adaptive batch size [default {d.train.max_batch_size}]",
    )
    train.add_argument(
        "--micro-batch-size",
        type=_micro_batch_size,
        metavar="N|auto",
        help=f"blocks streamed to the device at once, or 'auto' to find the largest that fits "
        f"[default {d.train.micro_batch_size}]",
    )
    train.add_argument(
        "--validate-every",
        type=int,
        metavar="M",
        help=f"validate (and maybe grow the batch) every M rounds [default {d.train.validate_every}]",
    )
    train.add_argument(
        "--epochs", type=int, metavar="N", help=f"passes over the data [default {d.train.epochs}]"
    )
    train.add_argument("--lr", type=float, metavar="LR", help=f"learning rate [default {d.train.lr}]")
    train.add_argument(
        "--optimizer", metavar="NAME", help=f"optimizer: {_names(OPTIMIZERS)} [default {d.train.optimizer}]"
    )
    train.add_argument(
        "--checkpoint-every",
        type=int,
        metavar="N",
        help=f"save a checkpoint every N averaging rounds [default {d.train.checkpoint_every}]",
    )
    train.add_argument(
        "--use-gpu",
        action=argparse.BooleanOptionalAction,
        help="train on GPUs (--no-use-gpu: CPU only) [default: when the cluster has GPUs]",
    )

    run = parser.add_argument_group("run", "where results go, and resuming")
    run.add_argument(
        "--storage-path",
        metavar="DIR",
        help=f"parent folder of all runs [default {d.run.storage_path}]",
    )
    run.add_argument(
        "--run-name",
        metavar="NAME",
        help="folder of this run under the storage path [default: ucf101-<dataset>-<UTC timestamp>]",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run --run-name from its latest checkpoint",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    """The preset (if any) with every flag given on the command line applied; ValueError if invalid."""
    overrides = {key: value for key, value in vars(args).items() if key not in _NOT_FLAGS}
    return Config.from_preset(getattr(args, "preset", None), **overrides)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, build the Config, run the training job, print the table; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = config_from_args(args)
    except ValueError as err:
        # A bad value is the user's to fix: one line naming the field, no traceback (argparse style).
        print(f"error: {err}", file=sys.stderr)
        return 2
    logger.info("run %s -> %s", config.run.run_name, config.run_dir())

    # Imported here, not at the top: importing this file must not pull in ray or torch.
    from raytrain_seq.config import RunSetupError
    from raytrain_seq.runtime.driver import run

    try:
        summary = run(config)
    except RunSetupError as err:
        # Nothing has trained yet (run folder, cluster size, resume point): one line with the fix.
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_table(summary))
    print(f"summary written to {summary.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
