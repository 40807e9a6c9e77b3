"""The averaging rounds protocol, Ray-free: the round book, the states and replies it hands out, the
learners' client and sync loop, the run history, and where an epoch stands (its position)."""
