"""The reward plugin contract.

A reward is any object with ``name``, ``description`` and
``async score(request) -> RewardOutput``. The request (:class:`ScoreRequest`, here
so rewards need not import the core that runs them) carries the
whole trajectory: ``final_text``, ``reference``, ``messages`` (the prompt, every
assistant turn with its parsed tool calls, every tool return, in order: ``libra.types.
TranscriptMessage``), the row's ``metadata``, ``num_turns``, and the job's reward
``options``. Older rewards that read only ``final_text`` and ``reference`` keep working.

The core enforces the contract (:func:`check_output`): the score is a finite number in
[0, 1], and so is every named component. A reward that raises, runs past the job's
``reward.timeout_s`` or breaks the contract fails that trajectory with the reason; the
job fails after ``reward.max_failures`` such trajectories (docs/plugins.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from libra.types import TranscriptMessage


@dataclass(frozen=True, slots=True)
class ScoreRequest:
    """A finished trajectory to score (the whole of it: see rewards/base.py)."""

    trajectory_id: str
    reward: str
    final_text: str
    reference: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    messages: tuple[TranscriptMessage, ...] = ()
    """The prompt, each assistant turn (with its parsed calls), each tool return."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The dataset row's metadata (task.metadata_field)."""
    num_turns: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    """The job's reward settings (``RewardSpec.options()``: components, llm_judge,
    timeout_s)."""


@dataclass(frozen=True, slots=True)
class RewardOutput:
    """A reward in [0, 1], its named parts (each in [0, 1]), and free-form details."""

    reward: float
    details: dict[str, Any] = field(default_factory=dict)
    components: dict[str, float] = field(default_factory=dict)
    """Named parts of the score (e.g. ``{"final_answer": 1.0}``), recorded on the
    trajectory and averaged per step in the trainer's step record."""


class RewardContractError(ValueError):
    """A reward returned something other than a finite score in [0, 1]."""


def _is_score(value: Any, max_reward: float = 1.0) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and 0.0 <= value <= max_reward)


def check_output(name: str, out: Any, max_reward: float = 1.0) -> RewardOutput:
    """Check what reward ``name`` returned (``max_reward``: a composite's weight sum).

    Raises:
        RewardContractError: Not a ``RewardOutput``, or the score is not a finite number in
            [0, max_reward] or a component not one in [0, 1] (the message names the reward
            and the value).
    """
    if not isinstance(out, RewardOutput):
        raise RewardContractError(f"reward {name!r} returned {type(out).__name__}, "
                                  "not a RewardOutput")
    if not _is_score(out.reward, max_reward):
        raise RewardContractError(f"reward {name!r} returned {out.reward!r}, not a finite "
                                  f"number in [0, {max_reward:g}]")
    for key, value in out.components.items():
        if not _is_score(value):
            raise RewardContractError(f"reward {name!r} component {key!r} is {value!r}, not "
                                      "a finite number in [0, 1]")
    return out


@runtime_checkable
class Reward(Protocol):
    """A scoring function for finished trajectories."""

    name: str
    description: str

    async def score(self, request: ScoreRequest) -> RewardOutput:
        """Score ``request.final_text`` against ``request.reference``."""
        ...
