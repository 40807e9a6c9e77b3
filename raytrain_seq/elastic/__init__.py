"""Ray-free elastic training: rounds, epoch positions, re-splitting, block-row assembly, state types."""
