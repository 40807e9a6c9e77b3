"""Dashboard metrics of the learners: Ray's ``ray.util.metrics``, one time series per learner.

Ray exports these through its Prometheus endpoint; the Ray dashboard's Metrics tab (with Grafana) and
any Prometheus scrape of the head node show them as ``ray_raytrain_seq_<name>`` tagged
``learner=<rank>``. Gauges hold the latest value; counters add up. Creating a metric costs a round trip
to the metrics agent, so a learner makes them once and updates them every step.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_GAUGES = {
    "frames_per_second": "useful (non-padding) frames per second of compute on this learner",
    "loss": "mean training loss of the latest mini-batch",
    "val_accuracy": "validation accuracy of the latest validated averaged model on this learner's share",
    "batch_size": "mini-batch size in blocks (AAVG grows it when validation stalls)",
}
_COUNTERS = {
    "averaging_seconds": "seconds spent in averaging rounds (waiting for peers included)",
    "data_wait_seconds": "seconds the learner waited for block rows from the pipeline",
    "frames": "useful frames trained on",
}


class LearnerMetrics:
    """``set(name, value)`` for gauges, ``add(name, amount)`` for counters, tagged with the learner."""

    def __init__(self, learner: int | str) -> None:
        from ray.util.metrics import Counter, Gauge

        tags = ("learner",)
        self._tags = {"learner": str(learner)}
        self._gauges = {
            name: Gauge(f"raytrain_seq_{name}", description=text, tag_keys=tags)
            for name, text in _GAUGES.items()
        }
        self._counters = {
            name: Counter(f"raytrain_seq_{name}", description=text, tag_keys=tags)
            for name, text in _COUNTERS.items()
        }

    def set(self, name: str, value: float) -> None:
        self._gauges[name].set(float(value), tags=self._tags)

    def add(self, name: str, amount: float) -> None:
        if amount > 0:
            self._counters[name].inc(float(amount), tags=self._tags)
