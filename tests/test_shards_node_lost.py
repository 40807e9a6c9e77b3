"""``RayShards.node_lost``: the shards on a lost learner's node are replaced at once, and a call already
sent to one of them is made again on its replacement.

Ray restarts an actor whose node died only once it has declared the node dead, and a call to it waits that
long; the averager, told by the driver that a learner's process died, does not wait for that. On a
two-raylet local cluster: shard 1 beside the worker node's learner, the node killed, then ``node_lost``.
"""

from __future__ import annotations

import asyncio

import pytest

from raytrain_seq.runtime.shards import RayShards

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture
def two_nodes():
    """A head (the driver's node) and a worker node; yields (cluster, head id, worker node)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        yield cluster, cluster.head_node.node_id, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_shards_on_a_lost_node_are_replaced_and_a_call_in_flight_goes_to_the_new_one(two_nodes):
    cluster, head, worker = two_nodes
    pool = RayShards(2)
    pool.place(0, head)
    pool.place(1, worker.node_id)
    pool.prepare()
    old = list(pool.handles())
    assert [node for _, node in asyncio.run(pool.targets())] == [head, worker.node_id]
    cluster.remove_node(worker, allow_graceful=False)

    async def lose_while_asking() -> list[str]:
        # The node's worker processes exit once they see their raylet gone; Ray declares the node dead
        # only after missed health checks, many seconds later.
        await asyncio.sleep(2.0)
        asking = asyncio.ensure_future(pool.targets())  # shard 1's call goes to the dead node
        await asyncio.sleep(1.0)
        assert not asking.done(), f"the dead node's shard answered: the test kills nothing ({asking})"
        assert pool.node_lost(worker.node_id) == [1]
        return [node for _, node in await asyncio.wait_for(asking, 60)]

    assert asyncio.run(lose_while_asking()) == [head, head]  # the replacement runs on a live node
    # Answered before Ray declared the node dead: the call did not wait for Ray's restart of the shard.
    assert [n["Alive"] for n in ray.nodes() if n["NodeID"] == worker.node_id] == [True]
    assert pool.handles()[0] is old[0] and pool.handles()[1] is not old[1]
    with pytest.raises(ray.exceptions.ActorDiedError):  # the old shard is ended for good
        ray.get(old[1].node.remote(), timeout=30)
    assert pool.node_lost(worker.node_id) == []  # nothing placed there any more
