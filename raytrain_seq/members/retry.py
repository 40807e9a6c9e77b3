"""The members' retry schedule for calls to an averager (or a feed) that is dead and restarting.

``Backoff`` is a frozen value: bounded exponential delays within a total budget. It sleeps nothing
itself; the caller (``rounds.client``, ``runtime.learner_feed``) waits each delay between its tries and
gives up, with its own typed error, once the delays run out.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Bounded exponential backoff: waits base, 2*base, 4*base ... capped at cap_s, within budget_s.

    ``delays()`` with base 0.5, cap 4, budget 10 gives [0.5, 1, 2, 4] (next would pass 10 s in all).
    """

    base_s: float = 0.5
    cap_s: float = 8.0
    budget_s: float = 120.0

    def __post_init__(self) -> None:
        # A base of 0 would never use the budget up: delays() would not return.
        if not self.base_s > 0 or not self.cap_s >= self.base_s or not self.budget_s >= 0:
            raise ValueError(
                f"Backoff(base_s={self.base_s}, cap_s={self.cap_s}, budget_s={self.budget_s}): need "
                "base_s > 0, cap_s >= base_s and budget_s >= 0, e.g. Backoff(0.25, 1.0, 120.0)"
            )

    def delays(self) -> list[float]:
        out, total, delay = [], 0.0, self.base_s
        while total + delay <= self.budget_s:
            out.append(delay)
            total += delay
            delay = min(delay * 2, self.cap_s)
        return out
