"""What a run prints: the job's own lines, warnings and errors; Ray's chatter only with ``run.verbose``
(``--verbose``).

Off by default: the driver's own Ray INFO lines and Ray's INFO lines in the learner actors. The knobs,
all public: the ``ray`` logger at WARNING in the driver (``quiet_driver``); a filter on the learner's
console handlers for the INFO records of Ray's own files (``quiet_learner``). With ``run.verbose`` none
of this happens.
"""

from __future__ import annotations

import logging
import os

__all__ = ["quiet_driver", "quiet_learner"]


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
    """In a learner actor (after its logging is set up): Ray's INFO lines off its console."""
    if verbose:
        return
    quiet = _RayInfo()
    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet)
