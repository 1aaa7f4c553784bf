"""The reward plugin contract.

A reward is any object with ``name``, ``description`` and
``async score(request) -> RewardOutput``. The core checks that the reward is a finite
number in [0, 1] (a plugin that returns anything else is an ``Internal`` error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from services.toolgateway.core import ScoreRequest


@dataclass(frozen=True, slots=True)
class RewardOutput:
    """A reward in [0, 1] plus free-form details for logging."""

    reward: float
    details: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Reward(Protocol):
    """A scoring function for finished trajectories."""

    name: str
    description: str

    async def score(self, request: ScoreRequest) -> RewardOutput:
        """Score ``request.final_text`` against ``request.reference``."""
        ...
