"""Agent episodes: the records the OpenAI-compatible endpoint (coordinator) and the
external agent (rollout) exchange through Redis, and their one codec (pure).

An episode IS a trajectory of a job whose ``task.agent`` is ``external``: the scheduler
admits and places it like any other; the rollout that holds it offers it to agent
programs (:class:`EpisodeOffer`), then treats every chat-completion call of the program
as the "tool return" of the previous turn (:class:`EpisodeCall`) and answers each call
with its sampled turn (:class:`EpisodeReply`). The endpoint keeps the conversation as the
program sees it (:class:`EpisodeState`). Keys: libra/redis_keys.py (``episode_*``).

Every record is a frozen dataclass; :func:`encode` / :func:`decode` are the only way
they become bytes (JSON, field names as written here), so a field added later with a
default still decodes an older record.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, TypeVar

# EpisodeCall.kind: a completion request, the episode's close (reward or scoring), or
# the abort of a call whose client went away (its sampled turn is discarded).
CALL, CLOSE, ABORT = "call", "close", "abort"
CALL_KINDS = (CALL, CLOSE, ABORT)
# EpisodeReply.error_code for a conversation longer than the model's context.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
INVALID_REQUEST = "invalid_request_error"
# EpisodeReply.error_code of a call that extends tokens the rollout does not hold (its
# trajectory was re-placed from an older state): the endpoint sends it again whole.
RESYNC = "resync"


@dataclass(frozen=True, slots=True)
class EpisodeOffer:
    """An admitted external-agent trajectory waiting for an agent program (rollout ->
    endpoint, on the job's offer list)."""

    episode_id: str
    """The trajectory id."""
    job_id: str
    prompt_id: str
    group_id: str
    prompt_text: str
    prompt_messages_json: str = ""
    """The dataset row's chat messages (JSON list), when it has them."""
    metadata_json: str = ""
    max_context_tokens: int = 0
    offered_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class EpisodeCall:
    """One request of the agent program (endpoint -> rollout, on the episode's call list).

    ``kind == "call"``: ``messages_json`` holds the new messages after the previous
    reply (they extend the tokens already sampled), or, with ``is_whole``, the whole
    conversation (the first call; or ``is_split``: the program rewrote history).
    ``call_index`` counts the episode's calls from 1; the reply echoes it.
    """

    kind: str
    call_index: int
    messages_json: str = "[]"
    tools_json: str = "[]"
    is_whole: bool = False
    is_split: bool = False
    max_tokens: int = 0
    """0: the job's ``task.max_new_tokens_per_turn``; else the smaller of the two."""
    has_reward: bool = False
    reward: float = 0.0
    stop: tuple[str, ...] = ()
    """The call's stop strings (besides the template's): the turn ends at one."""
    seed: int | None = None
    """The call's sampling seed (None: the engine's RNG)."""
    stream: bool = False
    """Send the turn's text as it is sampled (delta replies before the final one)."""
    num_context_tokens: int = 0
    """For a call that extends: the tokens the previous reply left in the sequence (its
    prompt + completion tokens). A rollout holding another count (re-placed from an
    older state) answers ``RESYNC``. 0: no check (whole calls)."""


@dataclass(frozen=True, slots=True)
class ToolCallOut:
    """One tool call of a sampled turn, as the OpenAI API names it."""

    call_id: str
    name: str
    arguments_json: str


@dataclass(frozen=True, slots=True)
class EpisodeReply:
    """The rollout's answer to one call (rollout -> endpoint, on the reply list):
    the sampled turn, or an error the endpoint returns as a 400."""

    call_index: int
    """The call answered; 0 when the episode moved between the call and its turn."""
    content: str = ""
    tool_calls: tuple[ToolCallOut, ...] = ()
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    policy_version: int = -1
    error_code: str = ""
    error_message: str = ""
    is_delta: bool = False
    """A streamed piece of the turn's text (``content``), sent while it is sampled; the
    final reply (``is_delta`` False) follows with the whole turn."""


@dataclass(frozen=True, slots=True)
class EpisodeState:
    """The endpoint's view of one episode (the conversation as the program saw it)."""

    episode_id: str
    job_id: str
    model: str
    key_sha256: str
    idle_timeout_s: float
    prompt_text: str = ""
    messages_json: str = "[]"
    """Every message so far, ending with the last reply as returned (canonical form)."""
    tools_json: str = "[]"
    num_calls: int = 0
    num_splits: int = 0
    num_context_tokens: int = 0
    """The sequence's tokens after the last reply (see EpisodeCall)."""
    is_closed: bool = False
    created_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class EpisodeGrant:
    """What ``POST /v1/episodes`` answers: the episode and its credentials."""

    episode_id: str
    job_id: str
    api_key: str
    model: str
    prompt_text: str
    prompt_messages_json: str = ""
    idle_timeout_s: float = 0.0


Record = TypeVar("Record")


def encode(record: Any) -> str:
    """A record as JSON (its dataclass fields)."""
    return json.dumps(dataclasses.asdict(record), separators=(",", ":"))


def decode(cls: type[Record], data: str | bytes) -> Record:
    """A record from :func:`encode`'s JSON (unknown fields ignored).

    Raises:
        ValueError: ``data`` is not a JSON object of ``cls``'s fields.
    """
    raw = json.loads(data)
    if not isinstance(raw, dict):
        raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(raw).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in raw.items() if k in names}
    if cls is EpisodeReply:
        values["tool_calls"] = tuple(ToolCallOut(**c) for c in values.get("tool_calls", ()))
    if cls is EpisodeCall:
        values["stop"] = tuple(values.get("stop", ()))
    return cls(**values)
