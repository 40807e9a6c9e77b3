"""``RunConfig``, the ``run`` section of the run's config tree (``raytrain_seq.config``): where the run writes
its checkpoints and summary, whether it resumes, and how it reports; checked at construction.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from raytrain_seq.checks import choice, is_number, optional_int_at_least
from raytrain_seq.config.choices import TRACKERS

__all__ = ["RunConfig"]


@dataclass(kw_only=True)
class RunConfig:
    """Where the run writes checkpoints, summary.json and curves.png, and whether it resumes."""

    section: ClassVar[str] = "run"

    storage_path: str = "~/raytrain_seq_runs"
    """Parent folder of all runs ("~" is expanded by Config.run_dir())."""
    run_name: str | None = None
    """Folder of this run under storage_path; None: the driver names it "ucf101-<dataset>-<UTC timestamp>" as it starts."""
    resume: bool = False
    """Continue the run named run_name from its latest checkpoint."""
    tracker: str = "tensorboard"
    """Live tracking of losses, accuracies, batch size and times: "tensorboard", "mlflow" or "none"."""
    object_store_gb: float | None = None
    """Object store of a Ray cluster this run starts itself, in GB, preallocated; None = Ray's default."""
    keep_checkpoints: int | None = 2
    """Checkpoint folders kept: the newest this many plus the best by validation accuracy; None = all."""
    verbose: bool = False
    """Print Ray's own progress lines and the job's debug lines too (False: the job's lines)."""

    def __post_init__(self) -> None:
        if isinstance(self.storage_path, os.PathLike):
            self.storage_path = os.fspath(self.storage_path)
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field, its value and the fix."""
        if not isinstance(self.storage_path, str) or not self.storage_path.strip():
            raise ValueError(
                f"run.storage_path must be a non-empty path, got {self.storage_path!r}: "
                "use e.g. ~/raytrain_seq_runs"
            )
        if self.run_name is not None and (
            not isinstance(self.run_name, str)
            or not self.run_name.strip()
            or self.run_name in (".", "..")
            or "/" in self.run_name
            or os.sep in self.run_name
        ):
            raise ValueError(
                f"run.run_name must be a plain folder name (no '/'), got {self.run_name!r}: "
                "use e.g. my-run, or None for an automatic timestamped name"
            )
        if not isinstance(self.resume, bool):
            raise ValueError(
                f"run.resume must be True or False, got {self.resume!r}: pass True to continue run.run_name"
            )
        choice("run.tracker", self.tracker, TRACKERS)
        optional_int_at_least(
            "run.keep_checkpoints", self.keep_checkpoints, 1, "keep e.g. the newest 2 (the best is kept too)"
        )
        if not isinstance(self.verbose, bool):
            raise ValueError(
                f"run.verbose must be True or False, got {self.verbose!r}: pass --verbose or leave it out"
            )
        if self.object_store_gb is not None and (
            not is_number(self.object_store_gb) or self.object_store_gb < 0.1
        ):
            raise ValueError(
                f"run.object_store_gb must be a number of GB >= 0.1 or None, got {self.object_store_gb!r}: "
                "size it for the averaging round (about 2 x learners x the model's weights and moments) "
                "plus the refurbishing cache, e.g. 4"
            )
