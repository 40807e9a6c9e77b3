"""Everything that imports ray: the parameter-averaging actor and its shards, the feed actor and its tasks,
the learners, the evaluator and the driver that starts them. Modules here import ray lazily, inside the
functions that talk to a cluster, so importing this package starts nothing, and the policies they run
(``rounds``, ``feed``, ``dataplane``) are tested without ray.
"""
