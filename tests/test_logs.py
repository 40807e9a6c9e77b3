"""What a run prints (runtime/logs.py): Ray's chatter off by default, back with verbose.

Without a cluster: each knob is checked against the Ray code it acts on (the files its records come
from), so a Ray upgrade that moves them fails here rather than bringing the spam back silently. A whole
run's log is in docs/LOG.md (issue 42).
"""

from __future__ import annotations

import logging

from raytrain_seq.runtime import logs


def _record(name: str, level: int, pathname: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, pathname, 1, "a message", None, None)


def test_the_learner_filter_drops_rays_info_lines_and_keeps_the_jobs_and_rays_warnings():
    """The filter goes by the file a record comes from (some Ray loggers are named by their file path,
    with no "ray." prefix): it drops Ray's INFO lines and keeps the job's own INFO lines and every warning."""
    from ray._private import worker

    quiet = logs._RayInfo()
    assert not quiet.filter(_record(worker.__file__, logging.INFO, worker.__file__))
    assert not quiet.filter(_record("ray", logging.INFO, worker.__file__))
    assert quiet.filter(_record("ray", logging.WARNING, worker.__file__))
    assert quiet.filter(_record("raytrain_seq.runtime.learner", logging.INFO, logs.__file__))


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
