"""The agent loop of one trajectory, turn by turn, token in / token out (pure).

A turn: the engine samples model tokens (loss mask 1, log-prob and policy version per
token); the turn text is parsed into an action; a tool call's output is appended as
non-trainable tokens (mask 0, version -1); an answer ends the trajectory.

Partial rollout: a turn interrupted by a weight update (``finish_reason == "aborted"``)
is kept with :func:`apply_partial` (its tokens carry the old version) and resumed on the
new weights with the rest of the turn's token budget; only the completed turn is parsed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from libra import types as t
from libra.jobspec import JobSpec
from libra.tasks.arith import Action, ActionKind, format_tool_output, parse_action
from services.rollout.engine_types import GenerationRequest, GenerationResult

TOOL_ARG_NAME = "expression"


class Tokenizer(Protocol):
    """What the agent loop needs from a tokenizer."""

    stop_token_ids: list[int]
    max_context_tokens: int

    def encode_prompt(self, text: str) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


@dataclass
class TurnOutcome:
    """What to do after a turn: call a tool, or finish (with an answer or not)."""

    action: Action
    finished: bool
    final_answer: str | None = None


def start(traj: t.Trajectory, tokenizer: Tokenizer) -> None:
    """Tokenize the prompt of a fresh trajectory (a handed-over one keeps its tokens)."""
    if traj.token_ids:
        return
    ids = tokenizer.encode_prompt(traj.prompt_text)
    traj.token_ids = list(ids)
    traj.num_prompt_tokens = len(ids)
    traj.loss_mask = [0] * len(ids)
    traj.logprobs = [0.0] * len(ids)
    traj.token_versions = [-1] * len(ids)


def next_request(traj: t.Trajectory, spec: JobSpec, tokenizer: Tokenizer,
                 seed: int | None, num_turn_tokens: int = 0) -> GenerationRequest | None:
    """The engine request for the next turn (or the rest of an interrupted one, which
    already sampled ``num_turn_tokens``), or None when nothing more fits."""
    room = tokenizer.max_context_tokens - len(traj.token_ids)
    max_new = min(spec.task.max_new_tokens_per_turn - num_turn_tokens, room)
    if max_new <= 0:
        return None
    return GenerationRequest(prompt_token_ids=list(traj.token_ids), max_new_tokens=max_new,
                             temperature=spec.algorithm.temperature,
                             top_p=spec.algorithm.top_p,
                             stop_token_ids=tokenizer.stop_token_ids, seed=seed)


def apply_partial(traj: t.Trajectory, result: GenerationResult) -> None:
    """Append the tokens of an interrupted turn (not a turn yet: nothing is parsed)."""
    traj.token_ids.extend(result.token_ids)
    traj.loss_mask.extend([1] * len(result.token_ids))
    traj.logprobs.extend(result.logprobs)
    traj.token_versions.extend([result.policy_version] * len(result.token_ids))


def apply_generation(traj: t.Trajectory, result: GenerationResult, spec: JobSpec,
                     tokenizer: Tokenizer, turn_prefix: list[int] | None = None) -> TurnOutcome:
    """Append the end of a sampled turn and decide what the whole turn asks for.

    ``turn_prefix`` holds the tokens this turn produced before an interruption (already
    appended by :func:`apply_partial`).
    """
    apply_partial(traj, result)
    traj.num_turns += 1
    action = parse_action(tokenizer.decode(list(turn_prefix or []) + result.token_ids))
    if action.kind is ActionKind.ANSWER:
        return TurnOutcome(action, finished=True, final_answer=action.argument)
    if action.kind is ActionKind.MALFORMED or traj.num_turns >= spec.task.max_turns:
        return TurnOutcome(action, finished=True)
    return TurnOutcome(action, finished=False)


def apply_tool_result(traj: t.Trajectory, result: t.ToolResult, tokenizer: Tokenizer) -> None:
    """Append the tool output as context the model reads but is not trained on."""
    text = format_tool_output(result.ok, result.output if result.ok else result.error)
    ids = tokenizer.encode(text)
    room = tokenizer.max_context_tokens - len(traj.token_ids)
    ids = ids[:max(room, 0)]
    traj.token_ids.extend(ids)
    traj.loss_mask.extend([0] * len(ids))
    traj.logprobs.extend([0.0] * len(ids))
    traj.token_versions.extend([-1] * len(ids))
    traj.tool_states.append(result.state)
    traj.tool_return_positions.append(traj.num_generated_tokens)


def tool_args(action: Action) -> dict[str, str]:
    return {TOOL_ARG_NAME: action.argument}
