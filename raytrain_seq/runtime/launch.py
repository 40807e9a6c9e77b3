"""What the driver hands every learner it launches: one frozen value instead of a dict of names.

``LearnerLaunch`` crosses the process boundary with each learner actor's constructor (``runtime.fleet``),
and is all a learner needs to find the run's other processes: the named feed and averager actors in
``namespace``, whether the run is fresh (the first group's rank 0 then starts the feed's epoch 0), and
whether an evaluator scores validation (the learners then do not). The learners' own settings
(``parts.LearnerSettings``, built by ``Parts.of`` from the ``Config`` the driver checked) travel beside
it with the learner's slot; the whole tree never does.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LearnerLaunch"]


@dataclass(frozen=True, kw_only=True)
class LearnerLaunch:
    """The names and switches of one run's learners (the module docstring)."""

    averager: str
    """The averager actor's name."""
    feed: str
    """The feed actor's name."""
    namespace: str
    """The Ray namespace both actors live in."""
    fresh: bool
    """No checkpoint to resume from: the first group's rank 0 starts the feed's epoch 0 as soon as it runs."""
    evaluator: bool = False
    """An evaluator validates on the averager's thread; the learners do not score validation shares."""
    torch_threads: int = 1
    """Intra-op threads of each learner's torch (one logical CPU a learner)."""

    def __post_init__(self) -> None:
        for field in ("averager", "feed", "namespace"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise ValueError(
                    f"LearnerLaunch.{field} must be a non-empty actor name, got {getattr(self, field)!r}"
                )
        if (
            isinstance(self.torch_threads, bool)
            or not isinstance(self.torch_threads, int)
            or self.torch_threads < 1
        ):
            raise ValueError(f"LearnerLaunch.torch_threads must be an int >= 1, got {self.torch_threads!r}")
