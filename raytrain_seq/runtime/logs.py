"""What a run prints: the job's own lines, warnings and errors; Ray's and Ray Train's chatter only with
``run.verbose`` (``--verbose``).

Off by default: Ray Train's per-round INFO lines ("Checkpoint successfully created", and "Reporting
training result", whose logger is named by its file path), its controller's INFO lines at each start of
the worker group, the driver's own Ray INFO lines, and the false alarm of Ray Train's detached
``PlacementGroupCleaner`` in a Ray this job starts itself (no dashboard, so no State API: it WARNs at
every check that it cannot query the controller). The knobs, all public: ``RunConfig(logging_config=
LoggingConfig(log_level=...))`` (``train_logging``); a filter on the learner's console handlers for the
INFO records of Ray's own files (``quiet_learner``); the ``ray`` logger at WARNING in the driver
(``quiet_driver``); the cleaner's logger raised to ERROR by a ``worker_process_setup_hook``
(``setup_hook``, ``connect.connect``). With ``run.verbose`` none of this happens.
"""

from __future__ import annotations

import logging
import os

__all__ = ["PG_CLEANER_LOGGER", "quiet_driver", "quiet_learner", "quiet_ray_helpers", "train_logging"]

# The logger of Ray Train's PlacementGroupCleaner (a detached actor), by its module name in Ray 2.60.
PG_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"


def train_logging(verbose: bool):
    """Ray Train's ``LoggingConfig``: its own INFO lines (group starts, checkpoints) only when verbose."""
    from ray.train import LoggingConfig

    return LoggingConfig(log_level="INFO" if verbose else "WARNING")


def quiet_driver(verbose: bool) -> None:
    """The driver's ``ray`` logger at WARNING unless verbose (Ray sets it to INFO when it is imported)."""
    if not verbose:
        logging.getLogger("ray").setLevel(logging.WARNING)


class _RayInfo(logging.Filter):
    """Drops the records below WARNING that Ray's own files log (whatever their logger's name)."""

    def __init__(self) -> None:
        super().__init__()
        import ray

        self.folder = os.path.dirname(os.path.abspath(ray.__file__)) + os.sep

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.pathname.startswith(self.folder)


def quiet_learner(verbose: bool) -> None:
    """In a learner process (after Ray Train set up its logging): Ray's INFO lines off its console."""
    if verbose:
        return
    quiet = _RayInfo()
    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet)


def quiet_ray_helpers() -> None:
    """``worker_process_setup_hook`` of a Ray this job starts: the placement-group cleaner's false alarms
    (module docstring) off; its errors still print."""
    logging.getLogger(PG_CLEANER_LOGGER).setLevel(logging.ERROR)
