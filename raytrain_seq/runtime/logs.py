"""What a run prints: the job's own lines, warnings and errors; Ray's and Ray Train's chatter only with
``run.verbose`` (``--verbose``).

Ray 2.60 prints, besides the job's lines (the driver's, and those the learners' rank 0 logs):

* per checkpoint round, from the learner that reports: Ray Train's INFO "Checkpoint successfully created"
  (logger ``ray.train...storage``) and, from every learner, "Reporting training result" (a logger that
  Ray Train names by its file path, so neither ``ray`` nor ``ray.train`` governs it);
* from Ray Train's controller: INFO lines on each start of the worker group (``ray.train...``);
* in a Ray this job starts itself (no dashboard, so no State API): Ray Train's detached
  ``PlacementGroupCleaner`` fails to query the controller's state at every check and WARNs about it
  each time ("Failed to query Ray Train Controller actor state"), dozens of times a run; it is a false
  alarm here (the controller is alive; the cleaner only cleans up after a controller that died);
* the driver's own Ray INFO lines (``ray`` logger: "Started a local Ray instance").

The knobs, all public: Ray Train's ``RunConfig(logging_config=LoggingConfig(log_level=...))`` sets the
console level of the ``ray.train`` loggers in its controller and workers (``train_logging``); a filter on
the learner's console handlers drops the INFO records of Ray's own files (``quiet_learner``); the driver
raises the ``ray`` logger to WARNING (``quiet_driver``); the cleaner, a process of its own, gets its
logger raised to ERROR by a ``worker_process_setup_hook`` of the Ray this job starts (``setup_hook``,
``connect.connect``). With ``run.verbose`` none of this happens and Ray prints as it always does.
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
