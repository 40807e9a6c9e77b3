"""What a run prints (runtime/logs.py): Ray's and Ray Train's chatter off by default, back with verbose.

Without a cluster: each knob is checked against the Ray 2.60 code it acts on (the loggers' names, the
files their records come from), so a Ray upgrade that moves them fails here rather than bringing the
spam back silently. A whole run's log is in docs/LOG.md (issue 42).
"""

from __future__ import annotations

import logging

import pytest

from raytrain_seq.runtime import logs


def _record(name: str, level: int, pathname: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, pathname, 1, "a message", None, None)


def test_the_placement_group_cleaner_logger_is_the_one_ray_uses_and_the_hook_raises_it():
    """The name the setup hook raises is the cleaner module's logger; after the hook its warnings
    ("Failed to query Ray Train Controller actor state") are dropped and its errors kept."""
    from ray.train.v2._internal.execution.controller import placement_group_cleaner

    assert placement_group_cleaner.logger.name == logs.PG_CLEANER_LOGGER
    logger = logging.getLogger(logs.PG_CLEANER_LOGGER)
    before = logger.level
    try:
        logs.quiet_ray_helpers()
        assert not logger.isEnabledFor(logging.WARNING) and logger.isEnabledFor(logging.ERROR)
    finally:
        logger.setLevel(before)


def test_the_learner_filter_drops_rays_info_lines_and_keeps_the_jobs_and_rays_warnings():
    """ "Reporting training result" comes from a logger Ray Train names by its file path (no "ray."
    prefix): the filter goes by the file, so it drops that and the storage module's "Checkpoint
    successfully created", and keeps the job's own INFO lines and every warning."""
    from ray.train.v2._internal.execution import context, storage

    assert context.logger.name == context.__file__  # why a logger-name rule would not reach it
    quiet = logs._RayInfo()
    assert not quiet.filter(_record(context.logger.name, logging.INFO, context.__file__))
    assert not quiet.filter(_record(storage.logger.name, logging.INFO, storage.__file__))
    assert quiet.filter(_record(storage.logger.name, logging.WARNING, storage.__file__))
    assert quiet.filter(_record("raytrain_seq.runtime.learner", logging.INFO, logs.__file__))


@pytest.mark.parametrize(("verbose", "level"), [(False, "WARNING"), (True, "INFO")])
def test_ray_train_logs_its_own_info_lines_only_when_verbose(verbose, level):
    assert logs.train_logging(verbose).log_level == level


def test_quiet_learner_filters_the_root_handlers_unless_verbose():
    root = logging.getLogger()
    handler = logging.StreamHandler()
    root.addHandler(handler)
    try:
        logs.quiet_learner(True)
        assert handler.filters == []
        logs.quiet_learner(False)
        assert [type(f).__name__ for f in handler.filters] == ["_RayInfo"]
    finally:
        root.removeHandler(handler)


def test_quiet_driver_raises_the_ray_logger_unless_verbose():
    ray_logger = logging.getLogger("ray")
    before = ray_logger.level
    try:
        ray_logger.setLevel(logging.INFO)
        logs.quiet_driver(True)
        assert ray_logger.level == logging.INFO
        logs.quiet_driver(False)
        assert ray_logger.level == logging.WARNING
    finally:
        ray_logger.setLevel(before)
