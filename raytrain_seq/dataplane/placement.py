"""``ShardPlacement``: the learners' nodes as hints for where the averaging shards go.

Shard i is placed on learner i's node (``ShardPool.place``), so that a learner's slice is merged beside
it; once the nodes of as many learners as there are shards (or of the whole group, when smaller) are
known, the pool starts its shards (``ShardPool.prepare``) while the first round trains. E.g. 2 shards and
a group of 4: the shards start at the second learner's join. Plain Python: the pool is injected.
"""

from __future__ import annotations

from typing import Any

from raytrain_seq.members.ids import LearnerId

__all__ = ["ShardPlacement"]


class ShardPlacement:
    """The known learner nodes of a shard ``pool`` (``dataplane.stores.ShardPool``)."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.nodes: dict[LearnerId, str] = {}

    def place(self, learner: LearnerId, node: str, world_size: int) -> None:
        """``learner`` runs on ``node`` in a group of ``world_size`` (0: not known yet)."""
        self.nodes[learner] = node
        self._pool.place(learner, node)
        if len(self.nodes) >= min(self._pool.count, world_size or 1):
            self._pool.prepare()  # start the shards while the first round trains
