"""The external agent's pieces around one episode (pure): the channel it talks over,
its errors, the state an episode keeps on this instance between its turn and its
program's next call, and the "tool results" a call becomes (see external_agent.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from libra import episodes as ep
from libra import types as t
from libra.errors import LibraError
from services.rollout.agent import ToolTurnResult
from services.rollout.episode_stream import TurnStream

# The outcome of every turn of an external agent: its reply goes out, the program's next
# call comes back (a turn is never final here: only the program ends an episode).
REPLY = "reply to the agent program"
# The causal signal of the first call and of a close (not a tool the program ran).
EPISODE_START, EPISODE_CLOSE, USER_TURN = "episode_start", "episode_close", "user"
# reward_components key of a reward the program gave at close (no scoring then).
AGENT_REWARD = "agent"


class EpisodeChannel(Protocol):
    """The rollout's side of the Redis lists between endpoint and rollout
    (episode_channel.py)."""

    async def offer(self, offer: ep.EpisodeOffer, ttl_s: float) -> bool: ...

    async def next_call(self, episode_id: str, timeout_s: float,
                        is_left: Callable[[], bool] = ...) -> ep.EpisodeCall | None: ...

    async def give_back(self, episode_id: str, call: ep.EpisodeCall, ttl_s: float) -> None: ...

    async def reply(self, episode_id: str, reply: ep.EpisodeReply, ttl_s: float) -> None: ...

    async def aborted(self, episode_ids: list[str]) -> dict[str, list[int]]: ...

    async def count(self, job_id: str, name: str) -> None: ...


class EpisodeEnded(LibraError):
    """The episode ended without a close (timed out, unreadable call): the trajectory
    fails with this message as its reason."""


class EpisodeLeft(LibraError):
    """This instance no longer holds the episode's trajectory (its lease was lost, or
    the job ended): the wait ends, and a call taken meanwhile went back to the list."""


@dataclass
class PendingCall:
    """What the last call asked for, applied by ``apply_tool_results``."""

    ids: list[int] = field(default_factory=list)
    is_whole: bool = False
    is_split: bool = False
    close: ep.EpisodeCall | None = None


@dataclass
class EpisodeTurn:
    """One episode between its turn and its next call (this instance only)."""

    turn_start: int = 0
    call_index: int = 0
    """The call this turn answers (its reply echoes it); 0 on an instance the episode
    moved to between the call and its reply (the endpoint then takes the reply as the
    answer to the call it waits for)."""
    reply: ep.EpisodeReply | None = None
    max_tokens: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    pending: PendingCall | None = None
    stream: TurnStream | None = None
    """The call asked for ``stream``: its turn's text goes out as it is sampled."""
    client_gone: bool = False
    """The call's client went away while its turn was sampled: the engine row was
    stopped, and the turn is taken back when the abort is read (no reply goes out)."""
    call_start: tuple[int, int] | None = None
    """Tokens and tool states before the last call's new messages were appended: an
    aborted call takes them back too (the program sends them again)."""
    has_left: bool = False
    """Dropped here (``ExternalAgent.drop``): a wait on this episode ends. The state of
    a copy placed here again is another object."""


def needs_resync(traj: t.Trajectory, call: ep.EpisodeCall) -> bool:
    """True when a call that extends the conversation does not extend the tokens held
    here: the trajectory was re-placed from an older state (a lease lapse, a restart),
    so the call must come again whole."""
    if call.is_whole:
        return False
    if not traj.token_ids:
        return True
    return bool(call.num_context_tokens) and call.num_context_tokens != len(traj.token_ids)


def keep_as_segment(traj: t.Trajectory) -> None:
    """Keep the sequence so far as a segment trained on its own (the program rewrote its
    history, or the call came again whole), unless nothing in it was sampled (a prompt
    only: a retried first call, or a split whose turn was aborted)."""
    if any(traj.loss_mask):
        traj.segments.append(t.Segment(traj.token_ids, traj.num_prompt_tokens, traj.loss_mask,
                                       traj.logprobs, traj.token_versions))


def tool_type(message: dict[str, Any]) -> str:
    """The causal signal of a new message: the tool's name, or ``user``."""
    if message.get("role") == "tool":
        return str(message.get("name") or "tool")
    return USER_TURN


def tool_result(kind: str, num_tokens: int) -> ToolTurnResult:
    """A call as the "tool return" the scheduler decides on (``kind``: its signal)."""
    state = t.ToolReturnState(kind, t.SizeThresholds().classify(num_tokens),
                              t.ToolStatus.SUCCESS)
    return ToolTurnResult(kind, t.ToolResult(t.ToolStatus.SUCCESS, "", "", num_tokens, 0,
                                             state))
