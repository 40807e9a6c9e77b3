"""Two-stream fusion: score a finished RGB run and a finished flow run on the test split, fuse them.

    python jobs/fuse.py /shared/runs/ucf101-rgb /shared/runs/ucf101-flow \\
        --dataset ucf101 --data-root ~/data/UCF101 --storage-path /shared/runs --run-name ucf101-fuse

Its own entry, apart from training: nothing trains here, so the trainer never imports fusion. The two
run folders set ``model.fuse`` and ``data.stream`` is "fuse"; the flags are the config fields fusion reads
(``raytrain_seq.cli.FUSE_FIELDS``: ``--data-root``, ``--test-views``, ``--storage-path``, ``--run-name``,
...) plus ``--config FILE`` and ``--print-config``, from the same generated command line
(``raytrain_seq.cli``); a config file written for training is read as it is. The work is
``raytrain_seq.runtime.fuse.run_fuse``; the last line printed is ``summary written to PATH``.
"""

from __future__ import annotations

import argparse
import sys

from raytrain_seq import cli
from raytrain_seq.config import Config
from raytrain_seq.outputs.summary import RunSummary

DESCRIPTION = (
    "Evaluate a finished RGB run and a finished flow run on the test split, fuse their class "
    "probabilities (softmax mean) and print the result table with all three accuracies."
)


class _RunFolder(argparse.Action):
    """A positional run folder, stored in its slot of ``model.fuse`` (const 0 = RGB run, 1 = flow run)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        pair = list(getattr(namespace, "model.fuse", ("", "")))
        pair[self.const] = values
        setattr(namespace, "model.fuse", tuple(pair))


def build_parser() -> argparse.ArgumentParser:
    """The config flags of every job, plus the two run folders as positional arguments."""
    parser = cli.build_parser(
        prog="fuse.py",
        description=DESCRIPTION,
        fields=cli.FUSE_FIELDS,
        usage="%(prog)s RGB_RUN FLOW_RUN [--data-root DIR] [--storage-path DIR] [--FLAG VALUE ...]",
    )
    # The folders fill the dest of --fuse, and the stream is fixed to "fuse" at the flag level (above
    # --config and --preset), so a config file written for training can be reused as is.
    parser.add_argument("RGB_RUN", action=_RunFolder, const=0, help="folder of the finished RGB run")
    parser.add_argument("FLOW_RUN", action=_RunFolder, const=1, help="folder of the finished flow run")
    parser.set_defaults(**{"data.stream": "fuse"})
    return parser


def run(config: Config) -> RunSummary:
    """Fuse the two runs of ``config.model.fuse`` and return the summary."""
    # Imported here, not at the top: importing this file must not pull in ray or torch.
    from raytrain_seq.runtime.fuse import run_fuse

    return run_fuse(config)


def main(argv: list[str] | None = None) -> int:
    """Parse the two run folders and the flags, fuse, print the table; returns the exit code."""
    return cli.main(argv, run, build_parser())


if __name__ == "__main__":
    sys.exit(main())
