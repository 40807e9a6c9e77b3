"""An in-process ParameterAverager for the tests: the settings a test changes, the rest their defaults."""

from __future__ import annotations

from typing import Any

from raytrain_seq.rounds.settings import AveragerSettings
from raytrain_seq.runtime.averager import ParameterAverager


def local_averager(
    world_size: int,
    *,
    run_dir: Any = None,
    shard_pool: Any = None,
    validator: Any = None,
    actor_id: Any = None,
    **settings: Any,
) -> ParameterAverager:
    """``ParameterAverager(AveragerSettings(world_size=..., **settings), ...)``, wired as the test says."""
    return ParameterAverager(
        AveragerSettings(world_size=world_size, **settings),
        run_dir=run_dir,
        shard_pool=shard_pool,
        validator=validator,
        actor_id=actor_id,
    )
