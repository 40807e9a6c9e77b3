"""Everything that imports ray: the parameter-averaging actor, the data pipeline, the learner loop.

Modules here import ray lazily, inside the functions that talk to a cluster, so importing this package
starts nothing and the policy classes (e.g. ``rounds.RoundBook``) are usable and testable without ray.
"""
