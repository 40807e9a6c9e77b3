"""The data plane of a round, Ray-free: flat payloads, their layouts and the values that travel beside them,
the stores and shard pools that carry and merge them, the learners' flat storage, and the channel
generations that carry a stable group's bytes."""
