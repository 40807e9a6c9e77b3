"""Train AAVG learners on BLoad blocks of whole videos: flags -> Config -> run -> result table.

    ray job submit --working-dir . -- python jobs/ucf101.py --preset demo
    python jobs/ucf101.py --preset smoke --learners 2 --epochs 1
    python jobs/ucf101.py --preset smoke --print-config > smoke.yaml
    python jobs/ucf101.py --config smoke.yaml --epochs 3

The techniques (docs/ARCHITECTURE.md): BLoad packing (``--packing``, ``--t-max``), AAVG averaging (``--k``,
``--validate-every``, ``--max-batch-size``), Revamper refurbishing (``--reuse``) and micro-batch streaming
(``--micro-batch-size``). Thin on purpose: the flags come from the Config tree (``raytrain_seq.cli``:
defaults < ``--preset`` < ``--config FILE`` < flags), the checks from ``raytrain_seq.config`` and the work
from ``raytrain_seq.runtime.driver.run``, so a run starts the same from Python or tests. ``--stream fuse
--fuse RGB_RUN FLOW_RUN`` goes to ``jobs/fuse.py``'s ``run_fuse``. The last line printed is ``summary
written to PATH``.
"""

from __future__ import annotations

import sys

from raytrain_seq import cli
from raytrain_seq.config import Config
from raytrain_seq.outputs.summary import RunSummary

DESCRIPTION = (
    "Train a temporal video classifier with AAVG learners on BLoad blocks of whole videos "
    "(refurbished augmentations, micro-batch streaming) and print the result table."
)


def run(config: Config) -> RunSummary:
    """Train (or, for ``--stream fuse``, fuse two finished runs) and return the run's summary."""
    # Imported here, not at the top: importing this file must not pull in ray or torch.
    if config.data.stream == "fuse":
        from raytrain_seq.runtime.fuse import run_fuse

        return run_fuse(config)
    from raytrain_seq.runtime.driver import run as train

    return train(config)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, build the Config, run the job (or print the config), print the table; the exit code."""
    return cli.main(argv, run, cli.build_parser(prog="ucf101.py", description=DESCRIPTION))


if __name__ == "__main__":
    sys.exit(main())
