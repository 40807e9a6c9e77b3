"""The feed's planner, Ray-free: what to compute and when, which rows each learner reads, the refurbish
cache's bookkeeping, the evaluation splits' plans, the counters behind ``stats()`` and the restart log.
``runtime/feed.py``'s ``BlockFeed`` actor launches the tasks it names and keeps their object refs."""
