"""A lost learner costs no wait on Ray's failure detection: ``RayShards.node_lost`` replaces the shards on
its node at once (a call already sent to one is made again on its replacement), and ``forget`` ends a
merge's wait for its slices.

Ray restarts an actor whose node died only once it has declared the node dead, and a call to it waits that
long; the averager, told by the driver that a learner's process died, does not wait for that. On a
two-raylet local cluster: shard 1 beside the worker node's learner, the node killed, then ``node_lost``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from raytrain_seq.dataplane.payload import FlatPayload
from raytrain_seq.runtime.shards import RayShards, ShardNames

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


@pytest.mark.parametrize("named", [False, True], ids=["owned", "named"])
def test_shards_on_a_lost_node_are_replaced_and_a_call_in_flight_goes_to_the_new_one(two_nodes, named):
    """Named (``ShardNames``, as a run's averager makes them): a second pool of the names, as a restarted
    control plane makes it, knows no placement, takes the shards back and learns their nodes from them;
    its replacement goes by the next name."""
    cluster, head, worker = two_nodes
    names = ShardNames.of("plane-losing-a-node", "shards-test") if named else None
    if named:

        @ray.remote(num_cpus=0)
        class Owner:  # the control plane the named shards serve: while it lives, they do
            def ping(self) -> bool:
                return True

        owner = Owner.options(name=names.owner, namespace=names.namespace).remote()
        ray.get(owner.ping.remote(), timeout=60)
    pool = RayShards(2, names=names)
    pool.place(0, head)
    pool.place(1, worker.node_id)
    pool.prepare()
    old = list(pool.handles())
    assert [node for _, node in asyncio.run(pool.targets())] == [head, worker.node_id]
    if named:
        pool = RayShards(2, names=names)
        assert pool.handles() == old
        asyncio.run(pool.targets())  # their node() calls, sent when they were taken back, are answered
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
    assert pool.handles()[0] == old[0] and pool.handles()[1] != old[1]
    with pytest.raises(ray.exceptions.ActorDiedError):  # the old shard is ended for good
        ray.get(old[1].node.remote(), timeout=30)
    assert pool.node_lost(worker.node_id) == []  # nothing placed there any more
    if named:  # the old name is released once Ray has ended the old actor
        deadline = time.monotonic() + 30
        while names.alive() != {0: 0, 1: 1} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert names.alive() == {0: 0, 1: 1}


def test_a_merge_stops_waiting_for_the_slices_of_a_learner_forgotten_beside_it(two_nodes):
    """A merge waits up to its timeout for a slice that never comes (here: a call that does not return);
    ``forget`` of that slice, run beside the merge, ends the wait at once with the slice named unreadable,
    and a merge of another round still waits for it."""
    pool = RayShards(1)
    pool.prepare()
    [shard] = pool.handles()

    @ray.remote(num_cpus=0)
    class Never:
        def slice(self) -> None:
            import time

            time.sleep(120)

    never = Never.remote()
    part = never.slice.remote()  # a slice its learner never delivers
    merged, load = shard.merge.options(num_returns=2).remote(7, [part], [1.0], 1, 60.0, False)
    assert ray.wait([load], timeout=1.0)[1], "the merge did not wait: nothing to forget"
    pool.forget(7, FlatPayload(None, (part,)))
    assert ray.get(load, timeout=20)["unreadable"] == [0] and ray.get(merged) is None
    # Another round's merge is not affected: it waits for the slice until its timeout ends it.
    _, other = shard.merge.options(num_returns=2).remote(8, [part], [1.0], 1, 1.0, False)
    load = ray.get(other, timeout=20)
    assert load["unreadable"] == [0] and load["seconds"] >= 0.9
