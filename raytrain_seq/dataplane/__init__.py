"""The data plane of a round, Ray-free: flat payloads and their layouts, the sharded merge, the learners'
flat storage, and the channel generations that carry a stable group's bytes."""
