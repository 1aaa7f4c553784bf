"""What a reward reads: a finished trajectory's transcript and its score.

The rollout builds a ``ScoreInput`` when a trajectory ends and the tool gateway's
``Score`` answers a ``ScoreOutput``; rewards (built-in or plugins) see only these.
Importable from ``libra.types`` too.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TranscriptToolCall:
    """A well-formed tool call parsed from an assistant turn."""

    name: str
    arguments_json: str = "{}"


@dataclass(frozen=True, slots=True)
class TranscriptMessage:
    """One message of a finished trajectory as a reward reads it."""

    role: str
    """``system``, ``user``, ``assistant`` or ``tool``."""
    content: str
    tool_calls: tuple[TranscriptToolCall, ...] = ()
    """assistant: the well-formed calls of the turn."""
    name: str = ""
    """tool: the tool that answered (``invalid``: the call never reached a tool)."""
    tool_status: str = ""
    """tool: ``success``, ``failure`` or ``timeout``."""


@dataclass(frozen=True, slots=True)
class ScoreInput:
    """A finished trajectory to score (rollout -> tool gateway ``Score``)."""

    trajectory_id: str
    reward: str
    final_text: str
    reference: str = ""
    messages: tuple[TranscriptMessage, ...] = ()
    metadata_json: str = ""
    """The dataset row's metadata as JSON ("" when none)."""
    num_turns: int = 0
    options_json: str = ""
    """Job-level reward settings (``RewardSpec.options()``) as JSON."""


@dataclass(frozen=True, slots=True)
class ScoreOutput:
    """The reward of a trajectory plus its named parts."""

    reward: float
    components: dict[str, float] = field(default_factory=dict)
